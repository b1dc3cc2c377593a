/* test_pool.c: max, average and global average pooling against PyTorch
 * (tests/fixtures/gen_pool.py: y and dx for several kernel / stride / pad
 * combinations, and an input full of ties), finite differences, what the
 * nodes save, and bad arguments. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* pooling adds at most 9 values: a few float32 ulp */
#define ATOL 1e-6
#define RTOL 1e-5

typedef enum { MAX, AVG, GLOBAL } kind;

/* the same table as gen_pool.py */
static const struct {
    const char *name;
    kind k;
    fr_pool_params p;
} cases[] = {
    {"max_k2s2", MAX, {2, 2, 0}},   {"max_k3s2p1", MAX, {3, 2, 1}}, {"max_k3s1p1", MAX, {3, 1, 1}},
    {"max_ties", MAX, {2, 1, 0}},   {"avg_k2s2", AVG, {2, 2, 0}},   {"avg_k3s1p1", AVG, {3, 1, 1}},
    {"avg_k3s2p1", AVG, {3, 2, 1}}, {"global", GLOBAL, {0, 0, 0}},
};

static fr_tensor *run(kind k, fr_tensor *x, fr_pool_params p) {
    return k == MAX ? fr_max_pool2d(x, p) : k == AVG ? fr_avg_pool2d(x, p) : fr_global_avg_pool(x);
}

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("pool");
    for (size_t i = 0; f && i < sizeof cases / sizeof cases[0]; i++) {
        fr_tensor *x = fr_t_fixture_case(f, cases[i].name, "x"), *dy = fr_t_fixture_case(f, cases[i].name, "dy");
        if (x && dy) {
            fr_set_requires_grad(x, true);
            fr_tensor *y = run(cases[i].k, x, cases[i].p);
            CHECK_NOTNULL(y);
            if (y) {
                fr_t_fixture_expect(f, cases[i].name, "y", y, ATOL, RTOL);
                CHECK_OK(fr_backward_with(y, dy));
                fr_t_fixture_expect(f, cases[i].name, "dx", x->grad, ATOL, RTOL);
            }
            fr_release(y);
        }
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* A size past the kernels' OpenMP threshold: global pooling and its
 * backward against values computed here. */
static void test_global_large(void) {
    enum { N = 8, C = 64, HW = 8 * 8 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, 8, 8), 5);
    fr_tensor *y = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(N, C), FR_TAG_TRANSIENT);
    fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    float *want = malloc(N * C * sizeof *want), *want_dx = malloc(N * C * HW * sizeof *want_dx);
    const float *px = fr_data_f32(x);
    for (int i = 0; i < N * C; i++) {
        double s = 0;
        for (int j = 0; j < HW; j++)
            s += px[i * HW + j];
        want[i] = (float)(s / HW);
        for (int j = 0; j < HW; j++)
            want_dx[i * HW + j] = want[i] / HW;
    }
    CHECK_OK(fr_global_avg_pool_forward(y, x));
    fr_t_allclose(y, want, N * C, 1e-6, 1e-6, "global y");
    CHECK_OK(fr_global_avg_pool_backward(dx, y)); /* dy = y */
    fr_t_allclose(dx, want_dx, N * C * HW, 1e-7, 1e-6, "global dx");
    free(want_dx);
    free(want);
    fr_release(dx);
    fr_release(y);
    fr_release(x);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *x;
    kind k;
    fr_pool_params p;
} grad_case;

static fr_tensor *pool_loss(void *ctx) {
    const grad_case *g = ctx;
    fr_tensor *y = run(g->k, g->x, g->p);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 17) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    const grad_case gc[] = {
        {NULL, MAX, {3, 2, 1}}, {NULL, MAX, {2, 2, 0}}, {NULL, AVG, {3, 1, 1}},
        {NULL, AVG, {2, 2, 0}}, {NULL, GLOBAL, {0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        grad_case g = gc[i];
        /* Max pooling is only piecewise smooth: distinct values 0.02 apart
         * (a shuffled ramp) keep every argmax stable under a 1e-3 step. */
        enum { N = 2, C = 2, H = 5, W = 6, NUM = N * C * H * W };
        float v[NUM];
        for (int j = 0; j < NUM; j++)
            v[j] = -1.2f + 0.02f * (float)((j * 37) % NUM);
        g.x = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(N, C, H, W), FR_TAG_DATA, v);
        fr_set_requires_grad(g.x, true);
        fr_tensor *l = pool_loss(&g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            CHECK(fr_t_gradcheck(pool_loss, &g, &g.x, 1, 1e-3, 1e-3, 5e-3, 120));
        }
        fr_release(l);
        fr_release(g.x);
    }
}

/* Max pooling keeps x (its argmax is found again in backward); average and
 * global pooling keep nothing. */
static void test_saved(void) {
    fr_tensor *x0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, 2, 4, 4), 3);
    fr_set_requires_grad(x0, true);
    fr_tensor *x = fr_scale(x0, 1.0f); /* a transient activation */
    fr_tensor *m = fr_max_pool2d(x, (fr_pool_params){2, 2, 0});
    CHECK(m && x->storage->saved_count == 1);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) >= fr_nbytes(x));
    fr_tensor *a = fr_avg_pool2d(x, (fr_pool_params){2, 2, 0});
    fr_tensor *g = fr_global_avg_pool(x);
    CHECK(a && g && x->storage->saved_count == 1);
    fr_tape_clear();
    CHECK(x->storage->saved_count == 0);
    fr_release(g);
    fr_release(a);
    fr_release(m);
    fr_release(x);
    fr_release(x0);
}

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 1);
    fr_tensor *x3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(3, 6, 6), 2);
    fr_tensor *xi = fr_zeros(FR_CPU, FR_I32, 4, FR_SHAPE(2, 3, 6, 6), FR_TAG_DATA);
    CHECK_ERR(fr_t_status_of(fr_max_pool2d(x, (fr_pool_params){2, 2, 2})), FR_ERR_ARG,
              "pad 2 is more than half the kernel 2");
    CHECK_ERR(fr_t_status_of(fr_max_pool2d(x, (fr_pool_params){0, 1, 0})), FR_ERR_ARG,
              "need kernel >= 1");
    CHECK_ERR(fr_t_status_of(fr_avg_pool2d(x, (fr_pool_params){7, 1, 0})), FR_ERR_SHAPE,
              "kernel 7 is larger than x (2, 3, 6, 6)");
    CHECK_ERR(fr_t_status_of(fr_max_pool2d(x3, (fr_pool_params){2, 2, 0})), FR_ERR_SHAPE,
              "max_pool2d: x has shape (3, 6, 6), expected 4 dimensions");
    CHECK_ERR(fr_t_status_of(fr_global_avg_pool(x3)), FR_ERR_SHAPE, "expected 4 dimensions");
    CHECK_ERR(fr_t_status_of(fr_avg_pool2d(xi, (fr_pool_params){2, 2, 0})), FR_ERR_DTYPE,
              "avg_pool2d: x must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_global_avg_pool(xi)), FR_ERR_DTYPE, "x must be f32, f16 or bf16, got i32");
    fr_tensor *ybad = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 3, 4, 4), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_max_pool2d_forward(ybad, x, (fr_pool_params){2, 2, 0}), FR_ERR_SHAPE,
              "y has shape (2, 3, 4, 4), expected (2, 3, 3, 3)");
    fr_release(ybad);
    fr_release(xi);
    fr_release(x3);
    fr_release(x);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_global_large);
    RUN(test_gradcheck);
    RUN(test_saved);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
