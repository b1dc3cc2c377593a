/* test_cuda.c: the CUDA backend against the CPU one. Every op of
 * tensor/ops.h (and so every kernel of kernels.def) runs on the same random
 * inputs on both devices, forward and backward; a small network runs through
 * autograd on both (loss, every gradient and the BN running statistics must
 * agree). The caching allocator has its own program, test_cuda_alloc.c, and
 * so does convolution on its two CUDA backends, test_cuda_conv.c.
 *
 * Tolerances are |cuda - cpu| <= atol + rtol * |cpu|, stated per check:
 * exact (0) where both sides do the same rounded operations in the same
 * order (copies, comparisons, one add or multiply, pooling, casts, the
 * InPlace-ABN helpers, the optimizer updates); ~1e-6 where the GPU may fuse a
 * multiply-add; 1e-5..1e-4 where sums run in another order (GEMM,
 * convolution, batch-norm statistics in float, exp/log in float).
 *
 * The loader's CUDA batches are test_cuda_loader.c's. Convolutions here (the network) run on cuDNN, or on im2col
 * when the environment says FR_CUDNN=0.
 *
 * Without a GPU (or in a CUDA=0 build) every test but the first two skips. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* x * scale + shift on the host, as a pair (for inputs outside [-1, 1)). */
static fr_t_pair pr_affine(fr_t_pair p, float scale, float shift) {
    size_t n = (size_t)fr_numel(p.c);
    float *h = malloc(n * sizeof *h);
    fr_read_f32(p.c, h, n);
    for (size_t i = 0; i < n; i++)
        h[i] = h[i] * scale + shift;
    fr_t_pair q = fr_t_pair_of(fr_from_host(FR_CPU, FR_F32, p.c->ndim, p.c->shape, FR_TAG_DATA, h));
    free(h);
    fr_t_pair_free(&p);
    return q;
}

static fr_t_pair pr_labels(int n, int k, uint32_t seed) {
    int32_t *h = malloc((size_t)n * sizeof *h);
    uint32_t s = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = (int32_t)((s >> 8) % (uint32_t)k);
    }
    fr_t_pair p = fr_t_pair_of(fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, h));
    free(h);
    return p;
}

/* ---- without a GPU ---- */

static void test_no_device_fails(void) {
    if (fr_t_have_cuda())
        SKIP("a CUDA device is present");
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(4), FR_TAG_TRANSIENT)),
              FR_ERR_DEVICE, "cuda");
    fr_tensor *c = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_t_status_of(fr_to_device(c, FR_CUDA, FR_TAG_TRANSIENT)), FR_ERR_DEVICE, "cuda");
    fr_release(c);
}

/* Without a usable GPU the loader says why (no driver, no device, no
 * backend file, a build without CUDA), and a CUDA tensor's error says it too. */
static void test_unavailable_reason(void) {
    const char *why = fr_cuda_unavailable_reason();
    if (fr_t_have_cuda()) {
        CHECK(why[0] == '\0');
        return;
    }
    CHECK(strlen(why) > 10);
    printf("     CUDA unavailable: %s\n", why);
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(4), FR_TAG_TRANSIENT)),
              FR_ERR_DEVICE, why);
    /* the device API is harmless without a backend */
    size_t reserved = 1, mallocs = 1;
    fr_cuda_cache_stats(&reserved, &mallocs);
    CHECK(reserved == 0 && mallocs == 0);
    CHECK(!fr_cuda_cudnn_enabled());
    CHECK(fr_cuda_memcpy(NULL, NULL, 4, FR_COPY_H2D) == FR_ERR_DEVICE);
}

/* ---- elementwise and sum ---- */

static void elementwise_case(int64_t n, uint32_t seed) {
    fr_t_pair a = PR_RAND(seed, n), b = PR_RAND(seed + 1, n), out = PR_EMPTY(n);
    CHECK_OK(fr_add_out(out.c, a.c, b.c));
    CHECK_OK(fr_add_out(out.g, a.g, b.g));
    fr_t_pair_check(out, 0, 0, "add");
    CHECK_OK(fr_mul_out(out.c, a.c, b.c));
    CHECK_OK(fr_mul_out(out.g, a.g, b.g));
    fr_t_pair_check(out, 0, 0, "mul");
    CHECK_OK(fr_scale_out(out.c, a.c, -1.75f));
    CHECK_OK(fr_scale_out(out.g, a.g, -1.75f));
    fr_t_pair_check(out, 0, 0, "scale");
    /* inplace: out aliases an input */
    CHECK_OK(fr_add_out(out.c, out.c, b.c));
    CHECK_OK(fr_add_out(out.g, out.g, b.g));
    fr_t_pair_check(out, 0, 0, "add inplace");
    CHECK_OK(fr_scale_out(out.c, out.c, 0.5f));
    CHECK_OK(fr_scale_out(out.g, out.g, 0.5f));
    fr_t_pair_check(out, 0, 0, "scale inplace");
    /* the GPU may fuse alpha * x + y into one rounding */
    CHECK_OK(fr_axpy_(out.c, 0.3f, a.c));
    CHECK_OK(fr_axpy_(out.g, 0.3f, a.g));
    fr_t_pair_check(out, 1e-6, 1e-6, "axpy");

    fr_t_pair s = PR_EMPTY(1);
    CHECK_OK(fr_sum_out(s.c, a.c));
    CHECK_OK(fr_sum_out(s.g, a.g));
    fr_t_pair_check(s, 1e-5, 1e-6, "sum"); /* both accumulate in double */
    CHECK_OK(fr_fill_from_out(out.c, s.c, 0.25f));
    CHECK_OK(fr_fill_from_out(out.g, s.g, 0.25f));
    fr_t_pair_check(out, 1e-5, 1e-6, "fill_from");
    CHECK_OK(fr_fill_(out.c, 3.5f));
    CHECK_OK(fr_fill_(out.g, 3.5f));
    fr_t_pair_check(out, 0, 0, "fill");
    fr_t_pair_free(&a);
    fr_t_pair_free(&b);
    fr_t_pair_free(&out);
    fr_t_pair_free(&s);
}

static void test_elementwise(void) {
    NEED_CUDA();
    elementwise_case(1, 1);
    elementwise_case(1000, 2);
    elementwise_case(100003, 3);     /* several blocks, a ragged end */
    elementwise_case(1 << 20, 4);    /* more blocks than the sum's first pass has */
}

static void test_sum_of_zeros_and_ones(void) {
    NEED_CUDA();
    fr_tensor *x = fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(300001), FR_TAG_TRANSIENT);
    fr_tensor *s = fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(1), FR_TAG_TRANSIENT);
    CHECK_OK(fr_fill_(x, 1.0f));
    CHECK_OK(fr_sum_out(s, x));
    CHECK(fr_item(s) == 300001.0f); /* exact: integers in double */
    fr_release(x);
    fr_release(s);
}

/* ---- activations (exact: comparisons and one multiply) ---- */

static void test_activation(void) {
    NEED_CUDA();
    fr_t_pair x = PR_RAND(10, 3, 1001), dy = PR_RAND(11, 3, 1001), y = PR_EMPTY(3, 1001),
         dx = PR_EMPTY(3, 1001);
    CHECK_OK(fr_relu_forward(y.c, x.c));
    CHECK_OK(fr_relu_forward(y.g, x.g));
    fr_t_pair_check(y, 0, 0, "relu");
    CHECK_OK(fr_relu_backward(dx.c, dy.c, y.c));
    CHECK_OK(fr_relu_backward(dx.g, dy.g, y.g));
    fr_t_pair_check(dx, 0, 0, "relu backward");
    CHECK_OK(fr_leaky_relu_forward(y.c, x.c, 0.1f));
    CHECK_OK(fr_leaky_relu_forward(y.g, x.g, 0.1f));
    fr_t_pair_check(y, 0, 0, "leaky relu");
    CHECK_OK(fr_leaky_relu_backward(dx.c, dy.c, y.c, 0.1f));
    CHECK_OK(fr_leaky_relu_backward(dx.g, dy.g, y.g, 0.1f));
    fr_t_pair_check(dx, 0, 0, "leaky relu backward");
    /* inplace: y is x, dx is dy */
    CHECK_OK(fr_relu_forward(x.c, x.c));
    CHECK_OK(fr_relu_forward(x.g, x.g));
    fr_t_pair_check(x, 0, 0, "relu inplace");
    CHECK_OK(fr_leaky_relu_backward(dy.c, dy.c, x.c, 0.2f));
    CHECK_OK(fr_leaky_relu_backward(dy.g, dy.g, x.g, 0.2f));
    fr_t_pair_check(dy, 0, 0, "leaky relu backward inplace");
    /* every activation of FR_ACT_LIST: the same formulas
     * (tensor/activation.h), the GPU's libm within a few ulps */
    for (int a = 0; a < FR_ACT_COUNT; a++) {
        float p = a == FR_ACT_LEAKY_RELU || a == FR_ACT_ELU ? 0.3f : 0.0f;
        const fr_t_pair *s = fr_act_needs_input((fr_act)a) ? &x : &y;
        CHECK_OK(fr_act_forward(y.c, x.c, (fr_act)a, p));
        CHECK_OK(fr_act_forward(y.g, x.g, (fr_act)a, p));
        fr_t_pair_check(y, 1e-6, 1e-5, fr_act_name((fr_act)a));
        CHECK_OK(fr_act_backward(dx.c, dy.c, s->c, (fr_act)a, p));
        CHECK_OK(fr_act_backward(dx.g, dy.g, s->g, (fr_act)a, p));
        fr_t_pair_check(dx, 1e-6, 1e-5, fr_act_name((fr_act)a));
    }
    fr_t_pair_free(&x);
    fr_t_pair_free(&dy);
    fr_t_pair_free(&y);
    fr_t_pair_free(&dx);
}

/* the pointwise losses (tensor/loss_math.h) and their gradients */
static void test_pointwise_losses(void) {
    NEED_CUDA();
    fr_t_pair p = PR_RAND(20, 33, 17), t = PR_RAND(21, 33, 17), dp = PR_EMPTY(33, 17);
    fr_t_pair l = PR_EMPTY(1), dl = PR_RAND(22, 1);
    for (int k = 0; k < FR_LOSS_COUNT; k++) {
        CHECK_OK(fr_pointwise_loss_forward(l.c, p.c, t.c, (fr_pointwise_loss)k, 0.5f));
        CHECK_OK(fr_pointwise_loss_forward(l.g, p.g, t.g, (fr_pointwise_loss)k, 0.5f));
        fr_t_pair_check(l, 1e-6, 1e-5, "pointwise loss");
        CHECK_OK(fr_pointwise_loss_backward(dp.c, dl.c, p.c, t.c, (fr_pointwise_loss)k, 0.5f));
        CHECK_OK(fr_pointwise_loss_backward(dp.g, dl.g, p.g, t.g, (fr_pointwise_loss)k, 0.5f));
        fr_t_pair_check(dp, 1e-6, 1e-5, "pointwise loss backward");
    }
    fr_t_pair *all[] = {&p, &t, &dp, &l, &dl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

/* ---- GEMM: every transpose pair, alpha and beta; sums of up to K
 * products in another order: 1e-5 relative ---- */

static void gemm_case(int m, int n, int k, bool ta, bool tb, uint32_t seed) {
    fr_t_pair a = ta ? PR_RAND(seed, k, m) : PR_RAND(seed, m, k);
    fr_t_pair b = tb ? PR_RAND(seed + 1, n, k) : PR_RAND(seed + 1, k, n);
    fr_t_pair c = PR_RAND(seed + 2, m, n);
    CHECK_OK(fr_gemm_out(c.c, a.c, b.c, ta, tb, 0.5f, 0.25f));
    CHECK_OK(fr_gemm_out(c.g, a.g, b.g, ta, tb, 0.5f, 0.25f));
    char what[64];
    snprintf(what, sizeof what, "gemm %dx%dx%d ta=%d tb=%d", m, n, k, ta, tb);
    fr_t_pair_check(c, 1e-5 * k, 1e-5, what);
    CHECK_OK(fr_gemm_out(c.c, a.c, b.c, ta, tb, 1.0f, 0.0f));
    CHECK_OK(fr_gemm_out(c.g, a.g, b.g, ta, tb, 1.0f, 0.0f));
    fr_t_pair_check(c, 1e-5 * k, 1e-5, what);
    fr_t_pair_free(&a);
    fr_t_pair_free(&b);
    fr_t_pair_free(&c);
}

static void test_gemm(void) {
    NEED_CUDA();
    static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {64, 33, 17}, {37, 130, 300}};
    uint32_t seed = 20;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 0; t < 4; t++, seed += 3)
            gemm_case(shapes[i][0], shapes[i][1], shapes[i][2], t & 1, t >> 1, seed);
}

/* linear: GEMM plus bias_add forward, bias_grad backward */
static void test_linear(void) {
    NEED_CUDA();
    fr_t_pair x = PR_RAND(40, 8, 20), w = PR_RAND(41, 12, 20), b = PR_RAND(42, 12), dy = PR_RAND(43, 8, 12);
    fr_t_pair y = PR_EMPTY(8, 12), dx = PR_EMPTY(8, 20), dw = PR_EMPTY(12, 20), db = PR_EMPTY(12);
    CHECK_OK(fr_linear_forward(y.c, x.c, w.c, b.c));
    CHECK_OK(fr_linear_forward(y.g, x.g, w.g, b.g));
    fr_t_pair_check(y, 1e-5, 1e-5, "linear");
    CHECK_OK(fr_linear_backward(dx.c, dw.c, db.c, dy.c, x.c, w.c));
    CHECK_OK(fr_linear_backward(dx.g, dw.g, db.g, dy.g, x.g, w.g));
    fr_t_pair_check(dx, 1e-5, 1e-5, "linear dx");
    fr_t_pair_check(dw, 1e-5, 1e-5, "linear dw");
    fr_t_pair_check(db, 1e-6, 1e-6, "linear db");
    fr_t_pair *all[] = {&x, &w, &b, &dy, &y, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

/* ---- batch norm: float reductions on the GPU, double on the CPU ---- */

static void bn_case_run(fr_t_pair x, uint32_t seed, const char *what) {
    int c = (int)x.c->shape[1];
    fr_t_pair gamma = PR_RAND(seed, c), beta = PR_RAND(seed + 1, c), rm = PR_RAND(seed + 2, c);
    fr_t_pair rv = pr_affine(PR_RAND(seed + 3, c), 0.25f, 1.0f); /* positive */
    fr_t_pair y = fr_t_pair_empty(x.c->ndim, x.c->shape), dx = fr_t_pair_empty(x.c->ndim, x.c->shape);
    fr_t_pair dy = fr_t_pair_rand(x.c->ndim, x.c->shape, seed + 4);
    fr_t_pair mean = PR_EMPTY(c), invstd = PR_EMPTY(c), dgamma = PR_EMPTY(c), dbeta = PR_EMPTY(c);
    CHECK_OK(fr_batch_norm_train_forward(y.c, mean.c, invstd.c, x.c, gamma.c, beta.c, rm.c, rv.c,
                                        0.1f, 1e-5f));
    CHECK_OK(fr_batch_norm_train_forward(y.g, mean.g, invstd.g, x.g, gamma.g, beta.g, rm.g, rv.g,
                                        0.1f, 1e-5f));
    fr_t_pair_check(mean, 1e-5, 1e-5, what);
    fr_t_pair_check(invstd, 1e-5, 1e-4, "bn invstd");
    fr_t_pair_check(y, 1e-4, 1e-4, "bn y");
    fr_t_pair_check(rm, 1e-5, 1e-5, "bn running mean");
    fr_t_pair_check(rv, 1e-5, 1e-4, "bn running var");
    CHECK_OK(fr_batch_norm_backward(dx.c, dgamma.c, dbeta.c, dy.c, x.c, mean.c, invstd.c, gamma.c));
    CHECK_OK(fr_batch_norm_backward(dx.g, dgamma.g, dbeta.g, dy.g, x.g, mean.g, invstd.g, gamma.g));
    fr_t_pair_check(dx, 1e-4, 1e-4, "bn dx");
    fr_t_pair_check(dgamma, 1e-4, 1e-4, "bn dgamma");
    fr_t_pair_check(dbeta, 1e-4, 1e-5, "bn dbeta");
    CHECK_OK(fr_batch_norm_backward(NULL, dgamma.c, dbeta.c, dy.c, x.c, mean.c, invstd.c, gamma.c));
    CHECK_OK(fr_batch_norm_backward(NULL, dgamma.g, dbeta.g, dy.g, x.g, mean.g, invstd.g, gamma.g));
    fr_t_pair_check(dgamma, 1e-4, 1e-4, "bn dgamma (no dx)");
    CHECK_OK(fr_batch_norm_eval_forward(y.c, x.c, gamma.c, beta.c, rm.c, rv.c, 1e-5f));
    CHECK_OK(fr_batch_norm_eval_forward(y.g, x.g, gamma.g, beta.g, rm.g, rv.g, 1e-5f));
    fr_t_pair_check(y, 1e-4, 1e-4, "bn eval y");
    CHECK_OK(fr_batch_norm_invstd(invstd.c, rv.c, 1e-3f));
    CHECK_OK(fr_batch_norm_invstd(invstd.g, rv.g, 1e-3f));
    fr_t_pair_check(invstd, 1e-6, 1e-6, "bn invstd of running var");
    CHECK_OK(fr_batch_norm_apply(y.c, x.c, rm.c, invstd.c, gamma.c, beta.c));
    CHECK_OK(fr_batch_norm_apply(y.g, x.g, rm.g, invstd.g, gamma.g, beta.g));
    fr_t_pair_check(y, 1e-4, 1e-4, "bn apply");
    /* y may be x */
    CHECK_OK(fr_batch_norm_apply(x.c, x.c, rm.c, invstd.c, gamma.c, beta.c));
    CHECK_OK(fr_batch_norm_apply(x.g, x.g, rm.g, invstd.g, gamma.g, beta.g));
    fr_t_pair_check(x, 1e-4, 1e-4, "bn apply inplace");
    fr_t_pair *all[] = {&x, &gamma, &beta, &rm, &rv, &y, &dx, &dy, &mean, &invstd, &dgamma, &dbeta};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_batchnorm(void) {
    NEED_CUDA();
    bn_case_run(PR_RAND(300, 4, 3, 5, 5), 310, "bn mean nchw");
    bn_case_run(PR_RAND(320, 16, 6), 330, "bn mean (N, C)");
    bn_case_run(PR_RAND(340, 32, 2, 20, 20), 350, "bn mean, 12800 per channel");
    /* |mean| >> std: the two-pass variance must not cancel */
    bn_case_run(pr_affine(PR_RAND(360, 8, 3, 6, 6), 1.0f, 100.0f), 370, "bn mean offset");
}

/* ---- pooling ---- */

static void pool_case(int n, int c, int h, int w, fr_pool_params p, uint32_t seed, bool ties) {
    fr_t_pair x = PR_RAND(seed, n, c, h, w);
    if (ties) /* every window full of equal values: the first one must win */
        x = pr_affine(x, 0.0f, 0.5f);
    fr_pool_shape s;
    CHECK_OK(fr_pool2d_shape(x.c, p, &s));
    fr_t_pair y = PR_EMPTY(n, c, s.oh, s.ow), dy = PR_RAND(seed + 1, n, c, s.oh, s.ow);
    fr_t_pair dx = PR_EMPTY(n, c, h, w);
    char what[80];
    snprintf(what, sizeof what, "maxpool k%d s%d p%d%s", p.kernel, p.stride, p.pad,
             ties ? " ties" : "");
    CHECK_OK(fr_max_pool2d_forward(y.c, x.c, p));
    CHECK_OK(fr_max_pool2d_forward(y.g, x.g, p));
    fr_t_pair_check(y, 0, 0, what);
    CHECK_OK(fr_max_pool2d_backward(dx.c, dy.c, x.c, p));
    CHECK_OK(fr_max_pool2d_backward(dx.g, dy.g, x.g, p));
    fr_t_pair_check(dx, 0, 0, "maxpool dx"); /* same adds in the same order */
    CHECK_OK(fr_avg_pool2d_forward(y.c, x.c, p));
    CHECK_OK(fr_avg_pool2d_forward(y.g, x.g, p));
    fr_t_pair_check(y, 0, 0, "avgpool");
    CHECK_OK(fr_avg_pool2d_backward(dx.c, dy.c, p));
    CHECK_OK(fr_avg_pool2d_backward(dx.g, dy.g, p));
    fr_t_pair_check(dx, 0, 0, "avgpool dx");
    fr_t_pair *all[] = {&x, &y, &dy, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_pool(void) {
    NEED_CUDA();
    pool_case(2, 3, 9, 9, (fr_pool_params){3, 2, 1}, 400, false);
    pool_case(2, 3, 8, 8, (fr_pool_params){2, 2, 0}, 410, false);
    pool_case(1, 4, 7, 6, (fr_pool_params){3, 1, 1}, 420, false);
    pool_case(2, 2, 9, 9, (fr_pool_params){3, 2, 1}, 430, true);
    pool_case(1, 2, 6, 6, (fr_pool_params){3, 1, 1}, 440, true);
}

static void test_global_avg_pool(void) {
    NEED_CUDA();
    static const int hws[][2] = {{1, 1}, {8, 8}, {17, 19}};
    for (int i = 0; i < 3; i++) {
        int h = hws[i][0], w = hws[i][1];
        fr_t_pair x = PR_RAND(500 + i, 3, 5, h, w), y = PR_EMPTY(3, 5), dy = PR_RAND(510 + i, 3, 5);
        fr_t_pair dx = PR_EMPTY(3, 5, h, w);
        CHECK_OK(fr_global_avg_pool_forward(y.c, x.c));
        CHECK_OK(fr_global_avg_pool_forward(y.g, x.g));
        fr_t_pair_check(y, 1e-7, 1e-6, "global avgpool"); /* double sums, other order */
        CHECK_OK(fr_global_avg_pool_backward(dx.c, dy.c));
        CHECK_OK(fr_global_avg_pool_backward(dx.g, dy.g));
        fr_t_pair_check(dx, 0, 0, "global avgpool dx");
        fr_t_pair_free(&x);
        fr_t_pair_free(&y);
        fr_t_pair_free(&dy);
        fr_t_pair_free(&dx);
    }
}

/* ---- concat (copies: exact) ---- */

static void test_concat(void) {
    NEED_CUDA();
    fr_t_pair a = PR_RAND(600, 2, 3, 4, 5), b = PR_RAND(601, 2, 5, 4, 5), c = PR_RAND(602, 2, 1, 4, 5);
    fr_t_pair out = PR_EMPTY(2, 9, 4, 5), dout = PR_RAND(603, 2, 9, 4, 5);
    fr_t_pair da = PR_EMPTY(2, 3, 4, 5), db = PR_EMPTY(2, 5, 4, 5), dc = PR_EMPTY(2, 1, 4, 5);
    fr_tensor *in_c[] = {a.c, b.c, c.c}, *in_g[] = {a.g, b.g, c.g};
    CHECK_OK(fr_concat_forward(out.c, in_c, 3));
    CHECK_OK(fr_concat_forward(out.g, in_g, 3));
    fr_t_pair_check(out, 0, 0, "concat");
    fr_tensor *d_c[] = {da.c, db.c, dc.c}, *d_g[] = {da.g, db.g, dc.g};
    CHECK_OK(fr_concat_backward(d_c, 3, dout.c));
    CHECK_OK(fr_concat_backward(d_g, 3, dout.g));
    fr_t_pair_check(da, 0, 0, "concat da");
    fr_t_pair_check(db, 0, 0, "concat db");
    fr_t_pair_check(dc, 0, 0, "concat dc");
    fr_t_pair *all[] = {&a, &b, &c, &out, &dout, &da, &db, &dc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

/* ---- cross-entropy: float exp/log on the GPU, double on the CPU ---- */

static void ce_case(int n, int k, float scale, float shift, uint32_t seed) {
    fr_t_pair logits = pr_affine(PR_RAND(seed, n, k), scale, shift), labels = pr_labels(n, k, seed);
    fr_t_pair loss = PR_EMPTY(1), dloss = pr_affine(PR_RAND(seed + 1, 1), 0.0f, 0.7f);
    fr_t_pair dl = PR_EMPTY(n, k);
    CHECK_OK(fr_cross_entropy_forward(loss.c, logits.c, labels.c));
    CHECK_OK(fr_cross_entropy_forward(loss.g, logits.g, labels.g));
    char what[64];
    snprintf(what, sizeof what, "cross entropy %dx%d x%g%+g", n, k, scale, shift);
    fr_t_pair_check(loss, 1e-5, 1e-5, what);
    CHECK_OK(fr_cross_entropy_backward(dl.c, dloss.c, logits.c, labels.c));
    CHECK_OK(fr_cross_entropy_backward(dl.g, dloss.g, logits.g, labels.g));
    fr_t_pair_check(dl, 1e-6, 1e-5, "cross entropy dlogits");
    fr_t_pair *all[] = {&logits, &labels, &loss, &dloss, &dl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_cross_entropy(void) {
    NEED_CUDA();
    ce_case(7, 10, 3.0f, 0.0f, 700);
    ce_case(3, 1000, 5.0f, 0.0f, 710); /* a row wider than the block */
    ce_case(300, 4, 1.0f, 0.0f, 720);  /* more rows than the mean's block */
    ce_case(5, 10, 20.0f, 80.0f, 730); /* large logits: stable log-sum-exp */
}

/* A label out of range cannot raise from a kernel: the op either refuses it
 * or the loss is NaN (documented in cuda/loss.cu), never a plausible value. */
static void test_cross_entropy_bad_label(void) {
    NEED_CUDA();
    int32_t bad[2] = {1, 10};
    fr_tensor *logits = fr_t_rand(FR_CUDA, 2, FR_SHAPE(2, 10), 740);
    fr_tensor *labels = fr_from_host(FR_CUDA, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, bad);
    fr_tensor *loss = fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(1), FR_TAG_TRANSIENT);
    fr_status st = fr_cross_entropy_forward(loss, logits, labels);
    CHECK(st != FR_OK || isnan(fr_item(loss)));
    fr_release(logits);
    fr_release(labels);
    fr_release(loss);
}

/* ---- casts: every dtype pair, the same bytes on both devices ---- */

static void test_cast(void) {
    NEED_CUDA();
    enum { N = 40 };
    float v[N] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.5f, -2.5f, 3.5f, 254.6f, 255.0f,
                  255.5f, 300.0f, -7.9f, 65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f,
                  3e9f, -3e9f, 2147483520.0f, -2147483648.0f, 1e-8f, 6e-8f, 3e-5f,
                  1.00048828125f, 1.00146484375f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                  16777217.0f, 123.456f, -0.1f};
    v[32] = INFINITY;
    v[33] = -INFINITY;
    v[34] = NAN;
    v[35] = -NAN;
    v[36] = 1.17549435e-38f;
    v[37] = 3.4e38f;
    v[38] = 0.33333334f;
    v[39] = 77.0f;
    fr_tensor *f32 = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(N), FR_TAG_DATA, v);
    for (int s = 0; s < FR_DTYPE_COUNT; s++) {
        fr_tensor *src_c = fr_to_dtype(f32, (fr_dtype)s, FR_TAG_DATA);
        fr_tensor *src_g = src_c ? fr_to_device(src_c, FR_CUDA, FR_TAG_DATA) : NULL;
        for (int d = 0; d < FR_DTYPE_COUNT; d++) {
            fr_tensor *want = src_c ? fr_to_dtype(src_c, (fr_dtype)d, FR_TAG_DATA) : NULL;
            fr_tensor *got_g = src_g ? fr_to_dtype(src_g, (fr_dtype)d, FR_TAG_DATA) : NULL;
            fr_tensor *got = got_g ? fr_to_device(got_g, FR_CPU, FR_TAG_DATA) : NULL;
            CHECK_NOTNULL(want);
            CHECK_NOTNULL(got);
            if (want && got && memcmp(fr_data(want), fr_data(got), fr_nbytes(want)) != 0) {
                fprintf(stderr, "    cast %s -> %s differs\n", fr_dtype_name((fr_dtype)s),
                        fr_dtype_name((fr_dtype)d));
                fr_t_failed_now = 1;
            }
            fr_release(want);
            fr_release(got_g);
            fr_release(got);
        }
        fr_release(src_c);
        fr_release(src_g);
    }
    fr_release(f32);
}

/* ---- InPlace-ABN helpers and optimizer updates: every operation rounded
 * separately on both devices, so the results are identical ---- */

static void test_abn_kernels(void) {
    NEED_CUDA();
    fr_t_pair gamma = PR_RAND(800, 6), geff = PR_EMPTY(6), dgeff = PR_RAND(801, 6), dgamma = PR_EMPTY(6);
    fr_t_pair beta = PR_RAND(802, 6), y = PR_RAND(803, 3, 6, 4, 5), res = PR_RAND(804, 3, 6, 4, 5);
    fr_t_pair xhat = PR_EMPTY(3, 6, 4, 5);
    CHECK_OK(fr_abn_gamma_forward(geff.c, gamma.c, 1e-3f));
    CHECK_OK(fr_abn_gamma_forward(geff.g, gamma.g, 1e-3f));
    fr_t_pair_check(geff, 0, 0, "abn gamma");
    CHECK_OK(fr_abn_gamma_backward(dgamma.c, dgeff.c, gamma.c));
    CHECK_OK(fr_abn_gamma_backward(dgamma.g, dgeff.g, gamma.g));
    fr_t_pair_check(dgamma, 0, 0, "abn gamma grad");
    for (int k = 0; k < 4; k++) {
        float slope = k & 1 ? 1.0f : 0.01f;
        const fr_tensor *rc = k & 2 ? res.c : NULL, *rg = k & 2 ? res.g : NULL;
        CHECK_OK(fr_abn_invert_out(xhat.c, y.c, geff.c, beta.c, rc, slope));
        CHECK_OK(fr_abn_invert_out(xhat.g, y.g, geff.g, beta.g, rg, slope));
        fr_t_pair_check(xhat, 0, 0, k & 2 ? "abn invert (residual)" : "abn invert");
    }
    fr_t_pair *all[] = {&gamma, &geff, &dgeff, &dgamma, &beta, &y, &res, &xhat};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_optimizer_updates(void) {
    NEED_CUDA();
    fr_t_pair w = PR_RAND(900, 1000), g = PR_RAND(901, 1000), buf = PR_RAND(902, 1000);
    for (int step = 0; step < 3; step++) {
        CHECK_OK(fr_sgd_update_(w.c, buf.c, g.c, 0.1, 0.9, 0.1, 5e-4, step == 2, step == 0));
        CHECK_OK(fr_sgd_update_(w.g, buf.g, g.g, 0.1, 0.9, 0.1, 5e-4, step == 2, step == 0));
        fr_t_pair_check(w, 0, 0, "sgd w");
        fr_t_pair_check(buf, 0, 0, "sgd momentum buffer");
    }
    CHECK_OK(fr_sgd_update_(w.c, NULL, g.c, 0.05, 0.0, 0.0, 0.0, false, false));
    CHECK_OK(fr_sgd_update_(w.g, NULL, g.g, 0.05, 0.0, 0.0, 0.0, false, false));
    fr_t_pair_check(w, 0, 0, "sgd w, no momentum");
    fr_t_pair m = PR_RAND(903, 1000), v = pr_affine(PR_RAND(904, 1000), 0.5f, 0.5f);
    for (int t = 1; t <= 4; t++) {
        bool decoupled = t > 2;
        CHECK_OK(fr_adam_update_(w.c, m.c, v.c, g.c, 1e-3, 0.9, 0.999, 1e-8, 1e-2, decoupled, t));
        CHECK_OK(fr_adam_update_(w.g, m.g, v.g, g.g, 1e-3, 0.9, 0.999, 1e-8, 1e-2, decoupled, t));
        fr_t_pair_check(w, 0, 0, decoupled ? "adamw w" : "adam w");
        fr_t_pair_check(m, 0, 0, "adam m");
        fr_t_pair_check(v, 0, 0, "adam v");
    }
    fr_t_pair *all[] = {&w, &g, &buf, &m, &v};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

/* ---- a small network through autograd on both devices ---- */

enum { X, W1, B1, G1, BE1, RM1, RV1, W2, WL, BL, G2, NET_PARAMS };
enum { NET_N = 4, NET_CLASSES = 5 };

typedef struct {
    fr_tensor *t[NET_PARAMS]; /* the leaves and the BN running statistics */
    fr_tensor *labels;
} net;

/* Returns the loss (a new reference), or NULL. Every intermediate is released
 * here; the tape keeps what backward needs. */
static fr_tensor *net_forward(net *nt) {
    fr_tensor **t = nt->t;
    fr_conv_params same = {.stride = 1, .pad = 1}, point = {.stride = 1, .pad = 0};
    fr_tensor *h1 = fr_conv2d(t[X], t[W1], t[B1], same);                                // (4,6,8,8)
    fr_tensor *h2 = h1 ? fr_batch_norm(h1, t[G1], t[BE1], t[RM1], t[RV1], true, 0.1f, 1e-5f) : NULL;
    fr_tensor *h3 = h2 ? fr_relu(h2) : NULL;
    fr_tensor *h4 = h3 ? fr_max_pool2d(h3, (fr_pool_params){2, 2, 0}) : NULL;            // (4,6,4,4)
    fr_tensor *h5a = h4 ? fr_conv2d(h4, t[W2], NULL, point) : NULL;                     // (4,4,4,4)
    fr_tensor *h5b = h4 ? fr_avg_pool2d(h4, (fr_pool_params){3, 1, 1}) : NULL;           // (4,6,4,4)
    fr_tensor *parts[] = {h5a, h5b};
    fr_tensor *h6 = h5a && h5b ? fr_concat(parts, 2) : NULL;                            // (4,10,4,4)
    fr_tensor *h7 = h6 ? fr_leaky_relu(h6, 0.1f) : NULL;
    fr_tensor *h7b = h7 ? fr_scale(h7, 2.0f) : NULL;
    fr_tensor *h7c = h7b ? fr_add(h7b, h7) : NULL;
    fr_tensor *h8 = h7c ? fr_global_avg_pool(h7c) : NULL;                                // (4,10)
    fr_tensor *h9 = h8 ? fr_linear(h8, t[WL], t[BL]) : NULL;                             // (4,5)
    fr_tensor *h10 = h9 ? fr_mul(h9, t[G2]) : NULL;
    fr_tensor *loss = h10 ? fr_cross_entropy(h10, nt->labels) : NULL;
    CHECK_NOTNULL(loss);
    fr_tensor *inter[] = {h1, h2, h3, h4, h5a, h5b, h6, h7, h7b, h7c, h8, h9, h10};
    for (size_t i = 0; i < sizeof inter / sizeof *inter; i++)
        fr_release(inter[i]);
    return loss;
}

static bool is_running_stat(int i) { return i == RM1 || i == RV1; }

static void test_autograd_network(void) {
    NEED_CUDA();
    static const int64_t shapes[NET_PARAMS][4] = {
        [X] = {NET_N, 3, 8, 8}, [W1] = {6, 3, 3, 3}, [B1] = {6}, [G1] = {6}, [BE1] = {6},
        [RM1] = {6}, [RV1] = {6}, [W2] = {4, 6, 1, 1}, [WL] = {NET_CLASSES, 10},
        [BL] = {NET_CLASSES}, [G2] = {NET_N, NET_CLASSES}};
    static const int ndims[NET_PARAMS] = {[X] = 4, [W1] = 4, [B1] = 1, [G1] = 1, [BE1] = 1,
                                          [RM1] = 1, [RV1] = 1, [W2] = 4, [WL] = 2, [BL] = 1,
                                          [G2] = 2};
    static const char *names[NET_PARAMS] = {
        [X] = "x.grad", [W1] = "w1.grad", [B1] = "b1.grad", [G1] = "gamma.grad",
        [BE1] = "beta.grad", [RM1] = "running_mean", [RV1] = "running_var", [W2] = "w2.grad",
        [WL] = "wl.grad", [BL] = "bl.grad", [G2] = "g2.grad"};
    net cpu, gpu;
    for (int i = 0; i < NET_PARAMS; i++) {
        fr_t_pair p = fr_t_pair_rand(ndims[i], shapes[i], 1000 + (uint32_t)i);
        if (i == RV1) /* the running variance starts positive */
            p = pr_affine(p, 0.25f, 1.0f);
        cpu.t[i] = p.c;
        gpu.t[i] = p.g;
        if (!is_running_stat(i) && p.c && p.g) {
            fr_set_requires_grad(p.c, true);
            fr_set_requires_grad(p.g, true);
        }
    }
    fr_t_pair labels = pr_labels(NET_N, NET_CLASSES, 1100);
    cpu.labels = labels.c;
    gpu.labels = labels.g;
    fr_tensor *loss_c = net_forward(&cpu), *loss_g = net_forward(&gpu);
    if (loss_c && loss_g) {
        /* sums in another order through ~10 layers: 1e-5 on the loss */
        CHECK_CLOSE(fr_item(loss_g), fr_item(loss_c), 1e-5 + 1e-5 * fabs(fr_item(loss_c)));
        CHECK_OK(fr_backward(loss_c));
        CHECK_OK(fr_backward(loss_g));
        for (int i = 0; i < NET_PARAMS; i++) {
            fr_tensor *c = cpu.t[i], *g = gpu.t[i];
            if (!c || !g)
                continue;
            if (is_running_stat(i)) {
                fr_t_allclose_t(g, c, 1e-5, 1e-4, names[i]);
                continue;
            }
            CHECK(c->grad && g->grad);
            if (c->grad && g->grad) /* BN backward amplifies the forward's rounding */
                fr_t_allclose_t(g->grad, c->grad, 1e-5, 1e-3, names[i]);
        }
    }
    fr_tape_clear();
    fr_release(loss_c);
    fr_release(loss_g);
    for (int i = 0; i < NET_PARAMS; i++) {
        fr_release(cpu.t[i]);
        fr_release(gpu.t[i]);
    }
    fr_t_pair_free(&labels);
}

/* fused BN + activation in both memory modes (recompute with a residual;
 * InPlace-ABN writing over its input), through autograd on both devices */
static void bn_act_case(fr_bnact_mode mode, fr_act act, float slope, bool residual, uint32_t seed) {
    fr_t_pair x0 = PR_RAND(seed, 4, 5, 6, 6), gamma = PR_RAND(seed + 1, 5), beta = PR_RAND(seed + 2, 5);
    fr_t_pair rm = PR_RAND(seed + 3, 5), rv = pr_affine(PR_RAND(seed + 4, 5), 0.25f, 1.0f);
    fr_t_pair res = residual ? PR_RAND(seed + 5, 4, 5, 6, 6) : (fr_t_pair){NULL, NULL};
    fr_tensor *leaves[] = {x0.c, x0.g, gamma.c, gamma.g, beta.c, beta.g};
    for (int i = 0; i < 6; i++)
        if (leaves[i])
            fr_set_requires_grad(leaves[i], true);
    fr_tensor *loss[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        bool g = d == 1;
        fr_bn_state bn = {g ? gamma.g : gamma.c, g ? beta.g : beta.c, g ? rm.g : rm.c,
                          g ? rv.g : rv.c, 0.1f, 1e-3f, true};
        /* a non-leaf input, so InPlace-ABN may overwrite it */
        fr_tensor *x = fr_scale(g ? x0.g : x0.c, 1.0f);
        fr_tensor *y = x ? fr_bn_act(x, g ? res.g : res.c, &bn, act, slope, mode) : NULL;
        loss[d] = y ? fr_t_weighted_sum(y, seed + 6) : NULL;
        CHECK_NOTNULL(loss[d]);
        if (loss[d])
            CHECK_OK(fr_backward(loss[d]));
        fr_release(x);
        fr_release(y);
    }
    if (loss[0] && loss[1])
        CHECK_CLOSE(fr_item(loss[1]), fr_item(loss[0]), 1e-4 + 1e-5 * fabs(fr_item(loss[0])));
    const char *what = mode == FR_BNACT_INPLACE_ABN ? "inplace_abn" : "bn_act recompute";
    fr_t_pair grads[] = {{x0.c->grad, x0.g->grad}, {gamma.c->grad, gamma.g->grad},
                    {beta.c->grad, beta.g->grad}};
    for (int i = 0; i < 3; i++) {
        CHECK(grads[i].c && grads[i].g);
        if (grads[i].c && grads[i].g)
            fr_t_allclose_t(grads[i].g, grads[i].c, 1e-5, 1e-3, what);
    }
    fr_t_pair_check(rm, 1e-5, 1e-4, "bn_act running mean");
    fr_t_pair_check(rv, 1e-5, 1e-4, "bn_act running var");
    fr_tape_clear();
    fr_release(loss[0]);
    fr_release(loss[1]);
    fr_t_pair *all[] = {&x0, &gamma, &beta, &rm, &rv, &res};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_bn_act(void) {
    NEED_CUDA();
    bn_act_case(FR_BNACT_RECOMPUTE, FR_ACT_RELU, 0.0f, true, 1200);
    bn_act_case(FR_BNACT_RECOMPUTE, FR_ACT_RELU, 0.0f, false, 1210);
    bn_act_case(FR_BNACT_INPLACE_ABN, FR_ACT_LEAKY_RELU, 0.01f, false, 1220);
    bn_act_case(FR_BNACT_INPLACE_ABN, FR_ACT_IDENTITY, 1.0f, true, 1230);
    /* every activation under recompute, without a residual (the kernel
     * rebuilds the pre-activation) and with one */
    for (int a = 0; a < FR_ACT_COUNT; a++) {
        float p = a == FR_ACT_LEAKY_RELU || a == FR_ACT_ELU ? 0.3f : 0.0f;
        bn_act_case(FR_BNACT_RECOMPUTE_X, (fr_act)a, p, false, 1240 + (uint32_t)a);
        bn_act_case(FR_BNACT_RECOMPUTE, (fr_act)a, p, true, 1270 + (uint32_t)a);
    }
}

int main(void) {
    RUN(test_no_device_fails);
    RUN(test_unavailable_reason);
    RUN(test_elementwise);
    RUN(test_sum_of_zeros_and_ones);
    RUN(test_activation);
    RUN(test_pointwise_losses);
    RUN(test_gemm);
    RUN(test_linear);
    RUN(test_batchnorm);
    RUN(test_pool);
    RUN(test_global_avg_pool);
    RUN(test_concat);
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_bad_label);
    RUN(test_cast);
    RUN(test_abn_kernels);
    RUN(test_optimizer_updates);
    RUN(test_autograd_network);
    RUN(test_bn_act);
    return TEST_SUMMARY();
}
