/* test_linear.c: GEMM in all four transpose combinations (with alpha, beta,
 * an empty inner dimension, and sizes on both sides of the threading
 * threshold) against a double-precision reference; the linear layer and
 * matmul against PyTorch (tests/fixtures/gen_linear.py); finite differences;
 * what is saved; bad arguments. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* float32 sums of up to 10 products of values in [-1, 1) */
#define ATOL 1e-5
#define RTOL 1e-5

/* ---- GEMM ---- */

static void gemm_case(int m, int n, int k, bool ta, bool tb, float alpha, float beta) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, ta ? FR_SHAPE(k, m) : FR_SHAPE(m, k), 1);
    fr_tensor *b = fr_t_rand(FR_CPU, 2, tb ? FR_SHAPE(n, k) : FR_SHAPE(k, n), 2);
    fr_tensor *c = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, n), 3);
    const float *pa = fr_data_f32(a), *pb = fr_data_f32(b), *pc = fr_data_f32(c);
    float *want = malloc(((size_t)m * n + 1) * sizeof *want);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0.0;
            for (int p = 0; p < k; p++)
                acc += (double)(ta ? pa[(size_t)p * m + i] : pa[(size_t)i * k + p]) *
                       (tb ? pb[(size_t)j * k + p] : pb[(size_t)p * n + j]);
            want[(size_t)i * n + j] = (float)(alpha * acc + (beta != 0.0f ? beta * pc[(size_t)i * n + j] : 0.0));
        }
    if (beta == 0.0f) /* beta 0 must ignore what c held, even NaN */
        CHECK_OK(fr_fill_(c, NAN));
    char what[96];
    snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d", m, n, k, ta, tb);
    CHECK_OK(fr_gemm_out(c, a, b, ta, tb, alpha, beta));
    /* k products of values in [-1, 1): float32 accumulation error */
    fr_t_allclose(c, want, (size_t)m * n, 1e-6 * (k + 1), 1e-5, what);
    free(want);
    fr_release(c);
    fr_release(b);
    fr_release(a);
}

static void test_gemm_all_transposes(void) {
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        gemm_case(5, 7, 3, ta, tb, 1.0f, 0.0f);       /* tiny */
        gemm_case(1, 1, 1, ta, tb, 1.0f, 0.0f);
        gemm_case(13, 17, 29, ta, tb, 0.5f, 1.0f);    /* accumulate into c */
        gemm_case(6, 9, 4, ta, tb, -2.0f, 0.25f);     /* scale c */
        gemm_case(70, 90, 50, ta, tb, 1.0f, 0.0f);    /* split across threads along N */
        gemm_case(130, 37, 64, ta, tb, 1.0f, 1.0f);   /* split along M */
        gemm_case(33, 300, 260, ta, tb, 1.0f, 0.0f);  /* deeper than one packed panel */
    }
}

static void test_gemm_empty_inner_dimension(void) {
    /* k == 0: the product is zero, so c = beta * c */
    gemm_case(4, 5, 0, false, false, 1.0f, 0.5f);
    gemm_case(4, 5, 0, true, true, 1.0f, 0.0f);
}

static void test_gemm_bad_arguments(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 3), 1), *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 5), 2);
    fr_tensor *c = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(4, 5), FR_TAG_TRANSIENT);
    fr_tensor *a3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(1, 4, 3), 3);
    CHECK_ERR(fr_gemm_out(c, a, b, false, false, 1, 0), FR_ERR_SHAPE,
              "op(a) is (4, 3) from a (4, 3), op(b) is (4, 5) from b (4, 5)");
    CHECK_ERR(fr_gemm_out(c, a, b, true, false, 1, 0), FR_ERR_SHAPE, "a (4, 3) transposed");
    CHECK_ERR(fr_gemm_out(c, a3, b, false, false, 1, 0), FR_ERR_SHAPE, "a has shape (1, 4, 3), expected 2");
    fr_release(a3);
    fr_release(c);
    fr_release(b);
    fr_release(a);
}

/* ---- linear and matmul against PyTorch ---- */

static const struct {
    const char *name;
    bool bias;
} lin_cases[] = {{"bias", true}, {"nobias", false}, {"single", true}};

static void test_linear_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("linear");
    for (size_t i = 0; f && i < sizeof lin_cases / sizeof lin_cases[0]; i++) {
        const char *name = lin_cases[i].name;
        fr_tensor *x = fr_t_fixture_case(f, name, "x"), *w = fr_t_fixture_case(f, name, "w"), *dy = fr_t_fixture_case(f, name, "dy");
        fr_tensor *b = lin_cases[i].bias ? fr_t_fixture_case(f, name, "b") : NULL;
        if (x && w && dy) {
            fr_set_requires_grad(x, true);
            fr_set_requires_grad(w, true);
            if (b)
                fr_set_requires_grad(b, true);
            fr_tensor *y = fr_linear(x, w, b);
            CHECK_NOTNULL(y);
            if (y) {
                fr_t_fixture_expect(f, name, "y", y, ATOL, RTOL);
                CHECK_OK(fr_backward_with(y, dy));
                fr_t_fixture_expect(f, name, "dx", x->grad, ATOL, RTOL);
                fr_t_fixture_expect(f, name, "dw", w->grad, ATOL, RTOL);
                if (b)
                    fr_t_fixture_expect(f, name, "db", b->grad, ATOL, RTOL);
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

static void test_matmul_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("linear");
    fr_tensor *a = fr_t_fixture_case(f, "mm", "a"), *b = fr_t_fixture_case(f, "mm", "b"), *dy = fr_t_fixture_case(f, "mm", "dy");
    if (a && b && dy) {
        fr_set_requires_grad(a, true);
        fr_set_requires_grad(b, true);
        fr_tensor *y = fr_matmul(a, b);
        CHECK_NOTNULL(y);
        if (y) {
            fr_t_fixture_expect(f, "mm", "y", y, ATOL, RTOL);
            CHECK_OK(fr_backward_with(y, dy));
            fr_t_fixture_expect(f, "mm", "da", a->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, "mm", "db", b->grad, ATOL, RTOL);
        }
        fr_release(y);
    }
    fr_release(dy);
    fr_release(b);
    fr_release(a);
    fr_st_close(f);
}

/* The tensor-level backward, each gradient alone into NaN-filled outputs. */
static void test_linear_ops_each_gradient_alone(void) {
    fr_st_file *f = fr_t_fixture("linear");
    fr_tensor *x = fr_t_fixture_case(f, "bias", "x"), *w = fr_t_fixture_case(f, "bias", "w"), *dy = fr_t_fixture_case(f, "bias", "dy");
    fr_tensor *b = fr_t_fixture_case(f, "bias", "b");
    if (x && w && dy && b) {
        fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT), *dw = fr_empty_like(w, FR_TAG_TRANSIENT);
        fr_tensor *db = fr_empty_like(b, FR_TAG_TRANSIENT);
        CHECK_OK(fr_fill_(dx, NAN));
        CHECK_OK(fr_fill_(dw, NAN));
        CHECK_OK(fr_fill_(db, NAN));
        CHECK_OK(fr_linear_backward(dx, NULL, NULL, dy, NULL, w));
        fr_t_fixture_expect(f, "bias", "dx", dx, ATOL, RTOL);
        CHECK_OK(fr_linear_backward(NULL, dw, NULL, dy, x, NULL));
        fr_t_fixture_expect(f, "bias", "dw", dw, ATOL, RTOL);
        CHECK_OK(fr_linear_backward(NULL, NULL, db, dy, NULL, NULL));
        fr_t_fixture_expect(f, "bias", "db", db, ATOL, RTOL);
        fr_release(db);
        fr_release(dw);
        fr_release(dx);
    }
    fr_release(b);
    fr_release(dy);
    fr_release(w);
    fr_release(x);
    fr_st_close(f);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *a, *b, *bias;
    bool linear;
} grad_case;

static fr_tensor *mm_loss(void *ctx) {
    const grad_case *g = ctx;
    fr_tensor *y = g->linear ? fr_linear(g->a, g->b, g->bias) : fr_matmul(g->a, g->b);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 9) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    grad_case cases[2] = {
        {fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 6), 11), fr_t_rand(FR_CPU, 2, FR_SHAPE(5, 6), 12),
         fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 13), true},
        {fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 7), 14), fr_t_rand(FR_CPU, 2, FR_SHAPE(7, 2), 15), NULL,
         false},
    };
    for (int i = 0; i < 2; i++) {
        grad_case *g = &cases[i];
        fr_tensor *wrt[3] = {g->a, g->b, g->bias};
        int n_wrt = g->bias ? 3 : 2;
        for (int j = 0; j < n_wrt; j++)
            fr_set_requires_grad(wrt[j], true);
        fr_tensor *l = mm_loss(g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* linear in each input: exact up to float32 rounding */
            CHECK(fr_t_gradcheck(mm_loss, g, wrt, n_wrt, 1e-2, 1e-3, 5e-3, 50));
        }
        fr_release(l);
        fr_release(g->bias);
        fr_release(g->b);
        fr_release(g->a);
    }
}

static void test_saves_only_what_is_needed(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 1), *w = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 4), 2);
    fr_set_requires_grad(w, true);
    fr_tensor *y = fr_linear(x, w, NULL);
    CHECK(y && x->storage->saved_count == 1 && w->storage->saved_count == 0);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 1) : NULL;
    CHECK_OK(fr_backward(l));
    CHECK(w->grad && !x->grad && x->storage->saved_count == 0);
    fr_release(l);
    fr_release(y);
    fr_release(w);
    fr_release(x);
}

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 1), *w = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 5), 2);
    fr_tensor *w4 = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 4), 3), *b3 = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 4);
    fr_tensor *xi = fr_zeros(FR_CPU, FR_I32, 2, FR_SHAPE(3, 4), FR_TAG_DATA);
    fr_tensor *x3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(1, 3, 4), 5);
    CHECK_ERR(fr_t_status_of(fr_linear(x, w, NULL)), FR_ERR_SHAPE,
              "linear: x (3, 4) has 4 input features but w (2, 5) expects 5");
    CHECK_ERR(fr_t_status_of(fr_linear(x, w4, b3)), FR_ERR_SHAPE, "b has shape (3,), expected (2)");
    CHECK_ERR(fr_t_status_of(fr_linear(xi, w4, NULL)), FR_ERR_DTYPE, "x must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_linear(x3, w4, NULL)), FR_ERR_SHAPE, "x has shape (1, 3, 4), expected 2");
    CHECK_ERR(fr_t_status_of(fr_matmul(x, x)), FR_ERR_SHAPE, "matmul: a (3, 4) and b (3, 4) do not chain");
    fr_release(x3);
    fr_release(xi);
    fr_release(b3);
    fr_release(w4);
    fr_release(w);
    fr_release(x);
}

int main(void) {
    RUN(test_gemm_all_transposes);
    RUN(test_gemm_empty_inner_dimension);
    RUN(test_gemm_bad_arguments);
    RUN(test_linear_matches_torch);
    RUN(test_matmul_matches_torch);
    RUN(test_linear_ops_each_gradient_alone);
    RUN(test_gradcheck);
    RUN(test_saves_only_what_is_needed);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
