/* test_conv.c: 2-d convolution against PyTorch (tests/fixtures/gen_conv.py:
 * y, dx, dw, db for every kernel path: 3x3 pad 1, stride 2 with and without
 * padding, 1x1 stride 1 and 2, a non-square kernel, 5x5 with one image),
 * large shapes against a double-precision reference (several bands per
 * image, fewer images than threads), finite differences, gradients asked for
 * one at a time, what the node saves, the version check, and bad
 * arguments. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* float32 sums of up to 72 (forward, dx) or 512 (dw, db) products of values
 * in [-1, 1) against PyTorch's own float32 order of summation */
#define ATOL 1e-4
#define RTOL 1e-4

typedef struct {
    const char *name;
    int stride, pad;
    bool bias;
} conv_case;

/* the same table as gen_conv.py */
static const conv_case cases[] = {
    {"s1p1", 1, 1, true},  {"s2p1", 2, 1, false}, {"s2p0", 2, 0, true},
    {"pw", 1, 0, true},    {"pw_s2", 2, 0, false}, {"rect", 1, 0, true},
    {"k5p2", 1, 2, true},  {"cifar", 1, 1, false},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- against PyTorch ---- */

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("conv");
    for (int i = 0; f && i < N_CASES; i++) {
        const conv_case *c = &cases[i];
        fr_tensor *x = fr_t_fixture_case(f, c->name, "x"), *w = fr_t_fixture_case(f, c->name, "w"), *dy = fr_t_fixture_case(f, c->name, "dy");
        fr_tensor *b = c->bias ? fr_t_fixture_case(f, c->name, "b") : NULL;
        if (x && w && dy && (b || !c->bias)) {
            fr_set_requires_grad(x, true);
            fr_set_requires_grad(w, true);
            if (b)
                fr_set_requires_grad(b, true);
            fr_tensor *y = fr_conv2d(x, w, b, (fr_conv_params){.stride = c->stride, .pad = c->pad});
            CHECK_NOTNULL(y);
            if (y) {
                fr_t_fixture_expect(f, c->name, "y", y, ATOL, RTOL);
                CHECK_OK(fr_backward_with(y, dy));
                fr_t_fixture_expect(f, c->name, "dx", x->grad, ATOL, RTOL);
                fr_t_fixture_expect(f, c->name, "dw", w->grad, ATOL, RTOL);
                if (b)
                    fr_t_fixture_expect(f, c->name, "db", b->grad, ATOL, RTOL);
            }
            fr_release(y);
        }
        fr_release(b);
        fr_release(dy);
        fr_release(w);
        fr_release(x);
    }
    fr_st_close(f);
}

/* The tensor-level op: each gradient alone, into outputs holding NaN (every
 * element must be overwritten, none accumulated). */
static void test_ops_each_gradient_alone(void) {
    fr_st_file *f = fr_t_fixture("conv");
    const char *name = "s2p0"; /* the last input row is reached by no window */
    fr_conv_params p = {.stride = 2, .pad = 0};
    fr_tensor *x = fr_t_fixture_case(f, name, "x"), *w = fr_t_fixture_case(f, name, "w"), *b = fr_t_fixture_case(f, name, "b");
    fr_tensor *dy = fr_t_fixture_case(f, name, "dy");
    if (x && w && b && dy) {
        fr_tensor *y = fr_empty_like(dy, FR_TAG_TRANSIENT);
        fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT), *dw = fr_empty_like(w, FR_TAG_TRANSIENT);
        fr_tensor *db = fr_empty_like(b, FR_TAG_TRANSIENT);
        fr_tensor *outs[4] = {y, dx, dw, db};
        for (int i = 0; i < 4; i++)
            CHECK_OK(fr_fill_(outs[i], NAN));
        CHECK_OK(fr_conv2d_forward(y, x, w, b, p));
        fr_t_fixture_expect(f, name, "y", y, ATOL, RTOL);
        CHECK_OK(fr_conv2d_backward(dx, NULL, NULL, dy, NULL, w, p)); /* x not needed for dx */
        fr_t_fixture_expect(f, name, "dx", dx, ATOL, RTOL);
        CHECK_OK(fr_conv2d_backward(NULL, dw, NULL, dy, x, NULL, p));
        fr_t_fixture_expect(f, name, "dw", dw, ATOL, RTOL);
        CHECK_OK(fr_conv2d_backward(NULL, NULL, db, dy, NULL, NULL, p));
        fr_t_fixture_expect(f, name, "db", db, ATOL, RTOL);
        /* twice: bwd_weight overwrites dw, it does not accumulate */
        CHECK_OK(fr_conv2d_backward(NULL, dw, NULL, dy, x, NULL, p));
        fr_t_fixture_expect(f, name, "dw", dw, ATOL, RTOL);
        for (int i = 0; i < 4; i++)
            fr_release(outs[i]);
    }
    fr_release(dy);
    fr_release(b);
    fr_release(w);
    fr_release(x);
    fr_st_close(f);
}

/* ---- large shapes against a reference written out here ---- */

static void ref_conv(double *y, double *dx, double *dw, const float *x, const float *w,
                     const float *dy, const fr_conv_shape *s) {
    memset(dx, 0, sizeof *dx * (size_t)s->n * s->c * s->h * s->w);
    memset(dw, 0, sizeof *dw * (size_t)s->k * s->c * s->r * s->s);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int oh = 0; oh < s->oh; oh++)
                for (int ow = 0; ow < s->ow; ow++) {
                    size_t yi = (((size_t)n * s->k + k) * s->oh + oh) * s->ow + ow;
                    double acc = 0.0;
                    for (int c = 0; c < s->c; c++)
                        for (int r = 0; r < s->r; r++)
                            for (int q = 0; q < s->s; q++) {
                                int ih = oh * s->stride - s->pad + r, iw = ow * s->stride - s->pad + q;
                                if (ih < 0 || iw < 0 || ih >= s->h || iw >= s->w)
                                    continue;
                                size_t xi = (((size_t)n * s->c + c) * s->h + ih) * s->w + iw;
                                size_t wi = (((size_t)k * s->c + c) * s->r + r) * s->s + q;
                                acc += (double)x[xi] * w[wi];
                                dx[xi] += (double)dy[yi] * w[wi];
                                dw[wi] += (double)dy[yi] * x[xi];
                            }
                    y[yi] = acc;
                }
}

static void check_vs_ref(const double *want, const fr_tensor *got, double atol, const char *what) {
    size_t n = (size_t)fr_numel(got);
    float *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)want[i];
    fr_t_allclose(got, w, n, atol, 1e-4, what);
    free(w);
}

static void large_case(int n, int c, int h, int w, int k, int r, int stride, int pad) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, h, w), 21);
    fr_tensor *wt = fr_t_rand(FR_CPU, 4, FR_SHAPE(k, c, r, r), 22);
    fr_conv_params p = {.stride = stride, .pad = pad};
    fr_conv_shape s;
    CHECK_OK(fr_conv2d_shape(x, wt, p, &s));
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, k, s.oh, s.ow), 23);
    fr_tensor *y = fr_empty_like(dy, FR_TAG_TRANSIENT), *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_tensor *dw = fr_empty_like(wt, FR_TAG_TRANSIENT);
    fr_mem_reset_peak();
    CHECK_OK(fr_conv2d_forward(y, x, wt, NULL, p));
    CHECK_OK(fr_conv2d_backward(dx, dw, NULL, dy, x, wt, p));
    /* the column buffers stay bounded (and are all freed: the runner checks) */
    CHECK(fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE) > 0);
    CHECK(fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE) <= (size_t)64 << 20);
    size_t ny = (size_t)fr_numel(y), nx = (size_t)fr_numel(x), nw = (size_t)fr_numel(wt);
    double *ry = malloc(ny * sizeof *ry), *rdx = malloc(nx * sizeof *rdx), *rdw = malloc(nw * sizeof *rdw);
    ref_conv(ry, rdx, rdw, fr_data_f32(x), fr_data_f32(wt), fr_data_f32(dy), &s);
    /* sums of c*r*r (forward, dx) and n*oh*ow (dw, up to 5184) products */
    check_vs_ref(ry, y, 1e-4, "large y");
    check_vs_ref(rdx, dx, 1e-4, "large dx");
    check_vs_ref(rdw, dw, 1e-3, "large dw");
    free(ry);
    free(rdx);
    free(rdw);
    fr_release(dw);
    fr_release(dx);
    fr_release(y);
    fr_release(dy);
    fr_release(wt);
    fr_release(x);
}

static void test_large_vs_reference(void) {
    /* one image whose column matrix (144 x 5184 floats, 3 MiB) is cut into
     * bands, which are also split across threads */
    large_case(1, 16, 72, 72, 8, 3, 1, 1);
    /* CIFAR's stride-2 transition with more images than threads */
    large_case(5, 16, 32, 32, 32, 3, 2, 1);
    /* pointwise, several images */
    large_case(3, 24, 20, 20, 16, 1, 1, 0);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *x, *w, *b;
    fr_conv_params p;
} grad_case;

static fr_tensor *conv_loss(void *ctx) {
    const grad_case *g = ctx;
    fr_tensor *y = fr_conv2d(g->x, g->w, g->b, g->p);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 31) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    const struct {
        int64_t x[4], w[4];
        fr_conv_params p;
        bool bias;
    } gc[] = {
        {{2, 2, 5, 4}, {3, 2, 3, 3}, {1, 1, 1, 1}, true},
        {{2, 3, 7, 7}, {2, 3, 3, 3}, {2, 0, 1, 1}, false},
        {{2, 4, 3, 3}, {3, 4, 1, 1}, {1, 0, 1, 1}, true},
        {{1, 2, 6, 5}, {2, 2, 2, 3}, {2, 1, 1, 1}, true},
        /* grouped, depthwise (stride 2), dilated */
        {{2, 4, 6, 5}, {6, 2, 3, 3}, {1, 1, 2, 1}, true},
        {{2, 3, 6, 6}, {3, 1, 3, 3}, {2, 1, 3, 1}, false},
        {{2, 2, 7, 6}, {3, 2, 3, 3}, {1, 2, 1, 2}, true},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        grad_case g = {fr_t_rand(FR_CPU, 4, gc[i].x, 41), fr_t_rand(FR_CPU, 4, gc[i].w, 42),
                       gc[i].bias ? fr_t_rand(FR_CPU, 1, FR_SHAPE(gc[i].w[0]), 43) : NULL, gc[i].p};
        fr_tensor *wrt[3] = {g.x, g.w, g.b};
        int n_wrt = g.b ? 3 : 2;
        for (int j = 0; j < n_wrt; j++)
            fr_set_requires_grad(wrt[j], true);
        fr_tensor *l = conv_loss(&g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* the loss is linear in each input: central differences are exact
             * but for float32 rounding of a sum of ~100 terms */
            CHECK(fr_t_gradcheck(conv_loss, &g, wrt, n_wrt, 1e-2, 2e-3, 5e-3, 60));
        }
        fr_release(l);
        fr_release(g.b);
        fr_release(g.w);
        fr_release(g.x);
    }
}

/* ---- what is saved and which gradients are made ---- */

static void test_saves_only_what_is_needed(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 51);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 3, 3), 52);
    fr_conv_params p = {.stride = 1, .pad = 1};
    /* a first layer: the batch needs no gradient; dw needs x, nothing needs w */
    fr_set_requires_grad(w, true);
    fr_tensor *y = fr_conv2d(x, w, NULL, p);
    CHECK_NOTNULL(y);
    CHECK(x->storage->saved_count == 1);
    CHECK(w->storage->saved_count == 0);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 3) : NULL;
    CHECK_OK(fr_backward(l));
    CHECK(w->grad != NULL && x->grad == NULL);
    CHECK(x->storage->saved_count == 0); /* released by backward */
    fr_release(l);
    fr_release(y);
    fr_zero_grad(w);
    /* frozen weights: only dx, so only w is held */
    fr_set_requires_grad(w, false);
    fr_set_requires_grad(x, true);
    y = fr_conv2d(x, w, NULL, p);
    CHECK(x->storage->saved_count == 0);
    CHECK(w->storage->saved_count == 1);
    l = y ? fr_t_weighted_sum(y, 3) : NULL;
    CHECK_OK(fr_backward(l));
    CHECK(x->grad != NULL && w->grad == NULL);
    fr_release(l);
    fr_release(y);
    /* no grad: nothing recorded, nothing saved */
    fr_no_grad_enter();
    y = fr_conv2d(x, w, NULL, p);
    fr_no_grad_exit();
    CHECK(y && !fr_has_grad_fn(y) && fr_tape_size() == 0 && x->storage->saved_count == 0);
    fr_release(y);
    fr_release(w);
    fr_release(x);
}

static void test_modified_input_fails_backward(void) {
    fr_tensor *x0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, 2, 5, 5), 61);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 3, 3), 62);
    fr_set_requires_grad(w, true);
    fr_set_requires_grad(x0, true);
    fr_tensor *h = fr_scale(x0, 2.0f);
    fr_tensor *y = h ? fr_conv2d(h, w, NULL, (fr_conv_params){.stride = 1, .pad = 1}) : NULL;
    fr_tensor *h2 = y ? fr_relu_(h) : NULL; /* overwrites what conv2d saved */
    CHECK_NOTNULL(h2);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 4) : NULL;
    if (l)
        CHECK_ERR(fr_backward(l), FR_ERR_VERSION, "backward of conv2d");
    fr_tape_clear();
    fr_release(l);
    fr_release(h2);
    fr_release(y);
    fr_release(h);
    fr_release(w);
    fr_release(x0);
}

/* ---- bad arguments ---- */

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 71);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 3, 3), 72);
    fr_tensor *w5 = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 5, 3, 3), 73);
    fr_tensor *wbig = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 9, 9), 74);
    fr_tensor *x3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(3, 8, 8), 75);
    fr_tensor *xi = fr_zeros(FR_CPU, FR_I32, 4, FR_SHAPE(2, 3, 8, 8), FR_TAG_DATA);
    fr_tensor *b5 = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 76);
    fr_conv_params p = {.stride = 1, .pad = 1};
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w5, NULL, p)), FR_ERR_SHAPE,
              "x (2, 3, 8, 8) has 3 channels but w (4, 5, 3, 3) expects 5");
    CHECK_ERR(fr_t_status_of(fr_conv2d(xi, w, NULL, p)), FR_ERR_DTYPE, "x must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x3, w, NULL, p)), FR_ERR_SHAPE,
              "conv2d: x has shape (3, 8, 8), expected 4 dimensions");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, wbig, NULL, (fr_conv_params){.stride = 1, .pad = 0})), FR_ERR_SHAPE,
              "does not fit the input");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w, NULL, (fr_conv_params){.stride = 0, .pad = 1})), FR_ERR_ARG,
              "stride must be >= 1");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w, b5, p)), FR_ERR_SHAPE, "b has shape (5,), expected (4)");
    fr_clear_error(); /* none pending: the NULL itself is the error (docs/ARCHITECTURE.md, "Errors") */
    CHECK_ERR(fr_t_status_of(fr_conv2d(NULL, w, NULL, p)), FR_ERR_ARG, "conv2d: x is NULL");
    /* the tensor-level ops check their outputs too */
    fr_tensor *ybad = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 4, 7, 7), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv2d_forward(ybad, x, w, NULL, p), FR_ERR_SHAPE,
              "y has shape (2, 4, 7, 7), expected (2, 4, 8, 8)");
    fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv2d_backward(dx, NULL, NULL, ybad, NULL, w, p), FR_ERR_SHAPE,
              "dy has shape (2, 4, 7, 7), expected (2, 4, 8, 8)");
    CHECK_ERR(fr_conv2d_backward(NULL, dx, NULL, ybad, x, w, p), FR_ERR_SHAPE, "dy has shape");
    fr_release(dx);
    fr_release(ybad);
    fr_release(b5);
    fr_release(xi);
    fr_release(x3);
    fr_release(wbig);
    fr_release(w5);
    fr_release(w);
    fr_release(x);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_ops_each_gradient_alone);
    RUN(test_large_vs_reference);
    RUN(test_gradcheck);
    RUN(test_saves_only_what_is_needed);
    RUN(test_modified_input_fails_backward);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
