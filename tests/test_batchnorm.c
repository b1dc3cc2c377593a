/* test_batchnorm.c: batch norm in training and eval mode against PyTorch
 * (tests/fixtures/gen_batchnorm.py: output, dx, dgamma, dbeta, updated
 * running statistics, eval output and gradients; 4-d and (N, C) inputs and
 * one with |mean| >> std), finite differences, what the nodes save, the
 * running-statistics version check, and bad arguments. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define MOMENTUM 0.1f
#define EPS 1e-5f
/* float32 normalisation against PyTorch's: a few ulp of values ~1, sums over
 * up to 100 elements for the gradients */
#define ATOL 1e-5
#define RTOL 1e-4

typedef struct {
    fr_tensor *x, *gamma, *beta, *rm, *rv, *dy;
} bn_case;

static bool load_case(fr_st_file *f, const char *prefix, bn_case *c) {
    c->x = fr_t_fixture_case(f, prefix, "x");
    c->gamma = fr_t_fixture_case(f, prefix, "gamma");
    c->beta = fr_t_fixture_case(f, prefix, "beta");
    c->rm = fr_t_fixture_case(f, prefix, "rm0");
    c->rv = fr_t_fixture_case(f, prefix, "rv0");
    c->dy = fr_t_fixture_case(f, prefix, "dy");
    if (!c->x || !c->gamma || !c->beta || !c->rm || !c->rv || !c->dy)
        return false;
    fr_set_requires_grad(c->x, true);
    fr_set_requires_grad(c->gamma, true);
    fr_set_requires_grad(c->beta, true);
    return true;
}

static void free_case(bn_case *c) {
    fr_release(c->x);
    fr_release(c->gamma);
    fr_release(c->beta);
    fr_release(c->rm);
    fr_release(c->rv);
    fr_release(c->dy);
}

static void zero_grads(bn_case *c) {
    fr_zero_grad(c->x);
    fr_zero_grad(c->gamma);
    fr_zero_grad(c->beta);
}

/* ---- against PyTorch ---- */

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("batchnorm");
    const char *cases[] = {"nchw", "nc", "offset"};
    for (int k = 0; k < 3; k++) {
        bn_case c;
        if (!load_case(f, cases[k], &c)) {
            free_case(&c);
            continue;
        }
        /* one training step */
        fr_tensor *y = fr_batch_norm(c.x, c.gamma, c.beta, c.rm, c.rv, true, MOMENTUM, EPS);
        CHECK_NOTNULL(y);
        if (y) {
            fr_t_fixture_expect(f, cases[k], "y", y, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "rm1", c.rm, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "rv1", c.rv, ATOL, RTOL);
            CHECK_OK(fr_backward_with(y, c.dy));
            fr_t_fixture_expect(f, cases[k], "dx", c.x->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "dgamma", c.gamma->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "dbeta", c.beta->grad, ATOL, RTOL);
            /* backward did not touch the running statistics again */
            fr_t_fixture_expect(f, cases[k], "rm1", c.rm, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "rv1", c.rv, ATOL, RTOL);
        }
        fr_release(y);
        /* eval with the updated statistics */
        zero_grads(&c);
        y = fr_batch_norm(c.x, c.gamma, c.beta, c.rm, c.rv, false, MOMENTUM, EPS);
        CHECK_NOTNULL(y);
        if (y) {
            fr_t_fixture_expect(f, cases[k], "eval_y", y, ATOL, RTOL);
            CHECK_OK(fr_backward_with(y, c.dy));
            fr_t_fixture_expect(f, cases[k], "eval_dx", c.x->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "eval_dgamma", c.gamma->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "eval_dbeta", c.beta->grad, ATOL, RTOL);
            fr_t_fixture_expect(f, cases[k], "rm1", c.rm, ATOL, RTOL);
        }
        fr_release(y);
        free_case(&c);
    }
    fr_st_close(f);
}

/* The tensor-level ops: y written over x, and parameter gradients alone. */
static void test_ops_inplace_and_param_grads_only(void) {
    fr_st_file *f = fr_t_fixture("batchnorm");
    bn_case c;
    if (load_case(f, "nchw", &c)) {
        fr_tensor *x = fr_empty_like(c.x, FR_TAG_TRANSIENT);
        fr_tensor *mean = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_TRANSIENT);
        fr_tensor *invstd = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_TRANSIENT);
        fr_tensor *dgamma = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_TRANSIENT);
        fr_tensor *dbeta = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_TRANSIENT);
        CHECK_OK(fr_copy_(x, c.x));
        uint64_t v = c.rm->storage->version;
        CHECK_OK(fr_batch_norm_train_forward(x, mean, invstd, x, c.gamma, c.beta, c.rm, c.rv,
                                            MOMENTUM, EPS));
        fr_t_fixture_expect(f, "nchw", "y", x, ATOL, RTOL);
        fr_t_fixture_expect(f, "nchw", "rm1", c.rm, ATOL, RTOL);
        fr_t_fixture_expect(f, "nchw", "rv1", c.rv, ATOL, RTOL);
        CHECK(c.rm->storage->version == v + 1); /* an inplace write, recorded */
        CHECK_OK(fr_batch_norm_backward(NULL, dgamma, dbeta, c.dy, c.x, mean, invstd, c.gamma));
        fr_t_fixture_expect(f, "nchw", "dgamma", dgamma, ATOL, RTOL);
        fr_t_fixture_expect(f, "nchw", "dbeta", dbeta, ATOL, RTOL);
        /* replaying with the kept statistics gives the same output */
        fr_tensor *y2 = fr_empty_like(c.x, FR_TAG_TRANSIENT);
        CHECK_OK(fr_batch_norm_apply(y2, c.x, mean, invstd, c.gamma, c.beta));
        fr_t_allclose_t(y2, x, 0, 0, "apply == train forward");
        fr_release(y2);
        fr_release(dbeta);
        fr_release(dgamma);
        fr_release(invstd);
        fr_release(mean);
        fr_release(x);
    }
    free_case(&c);
    fr_st_close(f);
}

/* A size past the kernels' OpenMP threshold, against a double-precision
 * reference of the training formulas written out here. */
static void test_large_matches_reference(void) {
    enum { N = 16, C = 4, HW = 32 * 32 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, 32, 32), 50);
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, 32, 32), 51);
    fr_tensor *gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 52);
    fr_tensor *beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 53);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT), *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_tensor *mean = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    fr_tensor *invstd = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    fr_tensor *dgamma = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    fr_tensor *dbeta = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    CHECK_OK(fr_batch_norm_train_forward(y, mean, invstd, x, gamma, beta, NULL, NULL, MOMENTUM, EPS));
    CHECK_OK(fr_batch_norm_backward(dx, dgamma, dbeta, dy, x, mean, invstd, gamma));
    const float *xv = fr_data_f32(x), *dyv = fr_data_f32(dy), *g = fr_data_f32(gamma),
                *b = fr_data_f32(beta);
    float *want_y = malloc(sizeof(float) * N * C * HW), *want_dx = malloc(sizeof(float) * N * C * HW);
    float want_dg[C], want_db[C];
    for (int c = 0; c < C; c++) {
        double m = 0, v = 0, sdy = 0, sdyxh = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++)
                m += xv[(i * C + c) * HW + j];
        m /= N * HW;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++)
                v += (xv[(i * C + c) * HW + j] - m) * (xv[(i * C + c) * HW + j] - m);
        double is = 1.0 / sqrt(v / (N * HW) + EPS);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++) {
                int k = (i * C + c) * HW + j;
                want_y[k] = (float)((xv[k] - m) * is * g[c] + b[c]);
                sdy += dyv[k];
                sdyxh += dyv[k] * (xv[k] - m) * is;
            }
        want_dg[c] = (float)sdyxh;
        want_db[c] = (float)sdy;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < HW; j++) {
                int k = (i * C + c) * HW + j;
                double xh = (xv[k] - m) * is;
                want_dx[k] = (float)(g[c] * is * (dyv[k] - sdy / (N * HW) - xh * sdyxh / (N * HW)));
            }
    }
    fr_t_allclose(y, want_y, N * C * HW, 1e-5, 1e-5, "large y");
    fr_t_allclose(dx, want_dx, N * C * HW, 1e-6, 1e-4, "large dx");
    fr_t_allclose(dgamma, want_dg, C, 1e-4, 1e-5, "large dgamma");
    fr_t_allclose(dbeta, want_db, C, 1e-4, 1e-5, "large dbeta");
    free(want_dx);
    free(want_y);
    fr_release(dbeta);
    fr_release(dgamma);
    fr_release(invstd);
    fr_release(mean);
    fr_release(dx);
    fr_release(y);
    fr_release(beta);
    fr_release(gamma);
    fr_release(dy);
    fr_release(x);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *x, *gamma, *beta, *rm, *rv;
    bool training;
} grad_case;

static fr_tensor *bn_loss(void *ctx) {
    const grad_case *g = ctx;
    /* training without running statistics: the many evaluations of a
     * gradcheck must not drift them */
    fr_tensor *y = fr_batch_norm(g->x, g->gamma, g->beta, g->training ? NULL : g->rm,
                                 g->training ? NULL : g->rv, g->training, MOMENTUM, EPS);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 77) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    const int64_t shapes[2][4] = {{3, 2, 3, 3}, {6, 3, 0, 0}};
    const int ndims[2] = {4, 2};
    for (int s = 0; s < 2; s++) {
        for (int training = 0; training < 2; training++) {
            int64_t c = shapes[s][1];
            grad_case g = {fr_t_rand(FR_CPU, ndims[s], shapes[s], 11), NULL, NULL, NULL, NULL,
                           training == 1};
            g.gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(c), 12);
            g.beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(c), 13);
            g.rm = fr_t_rand(FR_CPU, 1, FR_SHAPE(c), 14);
            g.rv = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(c), FR_TAG_PARAM);
            CHECK_OK(fr_fill_(g.rv, 0.7f));
            fr_tensor *wrt[3] = {g.x, g.gamma, g.beta};
            for (int i = 0; i < 3; i++)
                fr_set_requires_grad(wrt[i], true);
            fr_tensor *l = bn_loss(&g);
            CHECK_NOTNULL(l);
            if (l) {
                CHECK_OK(fr_backward(l));
                /* float32 loss, eps 1e-2 on a smooth function of values ~1 */
                CHECK(fr_t_gradcheck(bn_loss, &g, wrt, 3, 1e-2, 2e-3, 5e-3, 60));
            }
            fr_release(l);
            for (int i = 0; i < 3; i++)
                fr_release(wrt[i]);
            fr_release(g.rm);
            fr_release(g.rv);
        }
    }
}

/* ---- what the nodes keep ---- */

static void test_saved_tensors(void) {
    int64_t shape[4] = {4, 3, 5, 5};
    fr_tensor *x = fr_t_rand(FR_CPU, 4, shape, 20);
    fr_tensor *gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 21);
    fr_tensor *beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 22);
    fr_tensor *rm = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_PARAM);
    fr_tensor *rv = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_PARAM);
    fr_fill_(rv, 1.0f);
    fr_set_requires_grad(x, true);
    fr_set_requires_grad(gamma, true);
    fr_set_requires_grad(beta, true);

    /* training: x, mean, invstd, gamma */
    fr_tensor *y = fr_batch_norm(x, gamma, beta, rm, rv, true, MOMENTUM, EPS);
    CHECK(y && y->grad_fn && y->grad_fn->n_saved == 4);
    CHECK(y && y->grad_fn && y->grad_fn->saved[0].held == x);
    fr_release(y);
    fr_tape_clear();

    /* eval with gamma frozen: x is not needed (dx = dy gamma invstd) */
    fr_set_requires_grad(gamma, false);
    y = fr_batch_norm(x, gamma, beta, rm, rv, false, MOMENTUM, EPS);
    CHECK(y && y->grad_fn && y->grad_fn->n_saved == 3);
    for (int i = 0; y && y->grad_fn && i < y->grad_fn->n_saved; i++)
        CHECK(y->grad_fn->saved[i].held != x);
    /* and backward still gives dx and dbeta */
    fr_tensor *l = y ? fr_t_weighted_sum(y, 5) : NULL;
    CHECK_OK(l ? fr_backward(l) : fr_last_status());
    CHECK(x->grad && beta->grad && !gamma->grad);
    if (beta->grad) {
        fr_tensor *r = fr_t_rand(FR_CPU, 4, shape, 5);
        float want[3] = {0, 0, 0};
        const float *rv_ = fr_data_f32(r);
        for (int i = 0; i < 4 * 3 * 25; i++)
            want[(i / 25) % 3] += rv_[i];
        fr_t_allclose(beta->grad, want, 3, 1e-5, 1e-5, "eval dbeta = sum dy");
        fr_release(r);
    }
    fr_release(l);
    fr_release(y);

    /* no_grad: nothing recorded, running statistics updated once */
    fr_no_grad_enter();
    fr_fill_(rm, 1.0f);
    y = fr_batch_norm(x, gamma, beta, rm, rv, true, 0.5f, EPS);
    fr_no_grad_exit();
    CHECK(y && !y->grad_fn && fr_tape_size() == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    /* rm = 0.5 * 1 + 0.5 * batch mean: compute the batch mean of channel 0 */
    double m0 = 0;
    const float *xv = fr_data_f32(x);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 25; j++)
            m0 += xv[i * 75 + j];
    m0 /= 100;
    CHECK_CLOSE(fr_data_f32(rm)[0], 0.5 + 0.5 * m0, 1e-6);
    fr_release(y);

    fr_release(rv);
    fr_release(rm);
    fr_release(beta);
    fr_release(gamma);
    fr_release(x);
}

/* An eval-mode node keeps the running mean; a training step that updates it
 * before that node's backward must be caught, not used. */
static void test_running_stats_changed_before_eval_backward(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(5, 2), 30);
    fr_tensor *gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(2), 31);
    fr_tensor *beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(2), 32);
    fr_tensor *rm = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(2), FR_TAG_PARAM);
    fr_tensor *rv = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(2), FR_TAG_PARAM);
    fr_fill_(rv, 1.0f);
    fr_set_requires_grad(x, true);
    fr_tensor *y = fr_batch_norm(x, gamma, beta, rm, rv, false, MOMENTUM, EPS);
    fr_tensor *y2 = fr_batch_norm(x, gamma, beta, rm, rv, true, MOMENTUM, EPS);
    CHECK(y && y2);
    if (y) {
        CHECK_ERR(fr_backward_with(y, y), FR_ERR_VERSION, "backward of batch_norm (eval)");
        CHECK(strstr(fr_last_error(), "running stats") != NULL);
        CHECK(x->grad == NULL);
    }
    CHECK(fr_tape_size() == 1); /* y2's graph: that backward did not reach it */
    fr_tape_clear();
    fr_release(y2);
    fr_release(y);
    fr_release(rv);
    fr_release(rm);
    fr_release(beta);
    fr_release(gamma);
    fr_release(x);
}

/* ---- bad arguments ---- */

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 2, 2), 40);
    fr_tensor *x3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(2, 3, 4), 40);
    fr_tensor *one = fr_t_rand(FR_CPU, 2, FR_SHAPE(1, 3), 40);
    fr_tensor *xi = fr_zeros(FR_CPU, FR_I32, 4, FR_SHAPE(2, 3, 2, 2), FR_TAG_DATA);
    fr_tensor *c3 = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 41);
    fr_tensor *c4 = fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 41);
    fr_tensor *m = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_PARAM);
    fr_tensor *v = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(3), FR_TAG_PARAM);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);

    CHECK_ERR(fr_t_status_of(fr_batch_norm(x3, c3, c3, m, v, true, MOMENTUM, EPS)), FR_ERR_SHAPE,
              "x has shape (2, 3, 4), expected (N, C, H, W) or (N, C)");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c4, c3, m, v, true, MOMENTUM, EPS)), FR_ERR_SHAPE,
              "gamma has shape (4,), expected (3)");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, c4, m, v, false, MOMENTUM, EPS)), FR_ERR_SHAPE,
              "beta has shape (4,), expected (3)");
    fr_clear_error(); /* none pending: the NULL itself is the error (docs/ARCHITECTURE.md, "Errors") */
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, NULL, c3, m, v, true, MOMENTUM, EPS)), FR_ERR_ARG,
              "batch_norm: gamma is NULL");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, NULL, m, v, true, MOMENTUM, EPS)), FR_ERR_ARG,
              "beta is NULL");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, c3, NULL, v, false, MOMENTUM, EPS)), FR_ERR_ARG,
              "running_mean is NULL");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, c3, m, NULL, true, MOMENTUM, EPS)), FR_ERR_ARG,
              "running_mean and running_var, or neither");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(one, c3, c3, m, v, true, MOMENTUM, EPS)), FR_ERR_SHAPE,
              "more than one value per channel");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(xi, c3, c3, m, v, true, MOMENTUM, EPS)), FR_ERR_DTYPE,
              "x must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, c3, m, v, true, 1.5f, EPS)), FR_ERR_ARG,
              "momentum must be in [0, 1]");
    CHECK_ERR(fr_t_status_of(fr_batch_norm(x, c3, c3, m, v, false, MOMENTUM, -1.0f)), FR_ERR_ARG,
              "eps must be finite and >= 0");
    /* nothing was written to the running statistics by a refused call */
    CHECK(fr_data_f32(m)[0] == 0.0f && fr_data_f32(v)[0] == 0.0f);
    /* eval with (1, C) is fine: no batch statistics needed */
    fr_fill_(v, 1.0f);
    fr_tensor *ok = fr_batch_norm(one, c3, c3, m, v, false, MOMENTUM, EPS);
    CHECK_NOTNULL(ok);
    fr_release(ok);
    CHECK_ERR(fr_batch_norm_apply(y, x3, m, v, c3, c3), FR_ERR_SHAPE, "batch_norm_apply: x has shape");
    CHECK_ERR(fr_batch_norm_backward(y, c3, c4, y, x, m, v, c3), FR_ERR_SHAPE,
              "batch_norm_backward: dbeta has shape (4,)");
    CHECK_ERR(fr_batch_norm_eval_forward(one, x, c3, c3, m, v, EPS), FR_ERR_SHAPE,
              "y (1, 3) and x (2, 3, 2, 2) must have the same shape");
    CHECK_ERR(fr_batch_norm_invstd(c4, v, EPS), FR_ERR_SHAPE, "must have the same shape");
    CHECK(fr_tape_size() == 0);

    fr_release(y);
    fr_release(v);
    fr_release(m);
    fr_release(c4);
    fr_release(c3);
    fr_release(xi);
    fr_release(one);
    fr_release(x3);
    fr_release(x);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_ops_inplace_and_param_grads_only);
    RUN(test_large_matches_reference);
    RUN(test_gradcheck);
    RUN(test_saved_tensors);
    RUN(test_running_stats_changed_before_eval_backward);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
