/* test_mixed.c: half-precision activations (docs/MIXED_PRECISION.md).
 *
 *  - Every op family with f16 and with bf16 operands against the same op in
 *    f32 on the same (half-representable) values. The kernels compute in f32
 *    either way, so a half result may differ from the f32 one only by its
 *    final rounding, plus f32 summation-order noise where an op is split
 *    into blocks: |half - f32| <= ulp * |f32| + 1e-5 * max |f32|, with ulp
 *    2^-10 for f16 and 2^-7 for bf16 (one unit in the last place: the
 *    rounding is half of it). Copies (concat, ReLU, max pool) are exact. The
 *    shapes are chosen so that the staged ops run in several blocks with a
 *    remainder.
 *  - BN statistics from half input are bit-identical to f32's on the same
 *    values when the batch is one block, and within f32 round-off when it is
 *    staged in blocks (their statistics combined); no f32 copy of the
 *    whole input is made.
 *  - A sum over 10^6 f16 values of 1000 is exactly 1e9 (f32 accumulation; an
 *    f16 accumulator would overflow at 65504).
 *  - Dtype plumbing: autocast makes conv / linear outputs half from f32
 *    weights, which keep f32 gradients; activation gradients follow the
 *    activations; fr_cast is differentiable; errors.
 *  - ResNet-20 (batch 16): loss and gradients in bf16 and f16 (with loss
 *    scaling) within stated tolerances of f32; every memory strategy in half
 *    gives the same step as plain in half; DenseNet's efficient strategy
 *    likewise.
 *  - The ledger: ResNet-56 at batch 64 keeps at most 0.52x the saved bytes
 *    in bf16 that it keeps in f32, under each strategy.
 *  - CUDA half against CPU half (skipped without a GPU). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/amp.h"
#include "models/densenet.h"
#include "models/resnet.h"
#include "testlib.h"

static const fr_dtype halves[] = {FR_F16, FR_BF16};

/* Random f32 values already representable in dt. */
static fr_tensor *rand_in(fr_device dev, fr_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *t = fr_t_rand(dev, ndim, shape, seed);
    fr_t_round_to(t, dt);
    return t;
}
#define RAND_IN(dt, seed, ...) rand_in(FR_CPU, dt, FR_NDIM(__VA_ARGS__), FR_SHAPE(__VA_ARGS__), seed)

/* got (any float dtype) against ref (f32): within `ulps` units of dt's last
 * place of each value, plus 1e-5 of the largest |ref|; ulps 0 means exact. */
static void check_near(const fr_tensor *got, const fr_tensor *ref, fr_dtype dt, double ulps,
                       const char *what) {
    CHECK(got && ref && fr_numel(got) == fr_numel(ref));
    if (!got || !ref || fr_numel(got) != fr_numel(ref))
        return;
    size_t n = (size_t)fr_numel(ref);
    float *g = malloc(n * sizeof *g), *r = malloc(n * sizeof *r);
    fr_tensor *wide = fr_to_dtype(got, FR_F32, FR_TAG_TRANSIENT); /* exact */
    CHECK_OK(fr_read_f32(wide, g, n));
    CHECK_OK(fr_read_f32(ref, r, n));
    fr_release(wide);
    double big = 0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs(r[i]));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        /* below f16's normal range the spacing is fixed: 2^-24 */
        double floor = dt == FR_F16 ? 0x1p-24 : 0;
        double tol = ulps > 0 ? ulps * (fr_t_half_ulp(dt) * fabs(r[i]) + floor) + 1e-5 * big : 0;
        if (!(fabs((double)g[i] - r[i]) <= tol) && bad++ == 0)
            first = i;
    }
    fr_t_report_off(what, dt, bad, n, first, g, r);
    free(g);
    free(r);
}

/* ---- elementwise, activations, dropout ---- */

static void test_elementwise_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        const int64_t n = 600001; /* three blocks and a remainder */
        fr_tensor *a = RAND_IN(dt, 1, n), *b = RAND_IN(dt, 2, n);
        fr_tensor *ha = fr_t_as(a, dt), *hb = fr_t_as(b, dt);
        fr_tensor *ref = fr_t_empty_as(a, FR_F32), *got = fr_t_empty_as(a, dt);

        CHECK_OK(fr_add_out(ref, a, b));
        CHECK_OK(fr_add_out(got, ha, hb));
        check_near(got, ref, dt, 1, "add");
        CHECK_OK(fr_mul_out(ref, a, b));
        CHECK_OK(fr_mul_out(got, ha, hb));
        check_near(got, ref, dt, 1, "mul");
        CHECK_OK(fr_scale_out(ref, a, 0.37f));
        CHECK_OK(fr_scale_out(got, ha, 0.37f));
        check_near(got, ref, dt, 1, "scale");
        /* inplace: the output is an input */
        CHECK_OK(fr_copy_(ref, a));
        CHECK_OK(fr_copy_(got, ha));
        CHECK_OK(fr_axpy_(ref, -2.0f, b));
        CHECK_OK(fr_axpy_(got, -2.0f, hb));
        check_near(got, ref, dt, 1, "axpy (accumulates)");
        CHECK_OK(fr_add_out(ha, ha, hb));
        CHECK_OK(fr_add_out(ref, a, b));
        check_near(ha, ref, dt, 1, "add inplace");

        /* mixed operands: f32 + half into half */
        CHECK_OK(fr_add_out(got, a, hb));
        check_near(got, ref, dt, 1, "add f32 + half");

        CHECK_OK(fr_relu_forward(ref, a));
        CHECK_OK(fr_copy_(ha, a));
        CHECK_OK(fr_relu_forward(ha, ha));
        check_near(ha, ref, dt, 0, "relu inplace (exact)");
        fr_tensor *dref = fr_t_empty_as(a, FR_F32), *dgot = fr_t_empty_as(a, dt);
        CHECK_OK(fr_relu_backward(dref, b, ref));
        CHECK_OK(fr_relu_backward(dgot, hb, ha));
        check_near(dgot, dref, dt, 0, "relu backward (exact)");
        CHECK_OK(fr_leaky_relu_forward(ref, a, 0.1f));
        CHECK_OK(fr_copy_(ha, a));
        CHECK_OK(fr_leaky_relu_forward(got, ha, 0.1f));
        check_near(got, ref, dt, 1, "leaky_relu");
        CHECK_OK(fr_leaky_relu_backward(dref, b, ref, 0.1f));
        CHECK_OK(fr_leaky_relu_backward(dgot, hb, got, 0.1f));
        check_near(dgot, dref, dt, 1, "leaky_relu backward");

        /* dropout draws the whole tensor's mask block by block */
        CHECK_OK(fr_dropout_forward(ref, a, 0.3f, 99));
        CHECK_OK(fr_dropout_forward(got, ha, 0.3f, 99));
        check_near(got, ref, dt, 1, "dropout");
        CHECK_OK(fr_dropout_backward(dref, b, 0.3f, 99));
        CHECK_OK(fr_dropout_backward(dgot, hb, 0.3f, 99));
        check_near(dgot, dref, dt, 1, "dropout backward");

        fr_tensor *all[] = {a, b, ha, hb, ref, got, dref, dgot};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

/* 10^6 f16 values of 1000 sum to 1e9 exactly, far past f16's 65504. */
static void test_sum_of_million_halves_directly(void) {
    fr_tensor *x = fr_empty(FR_CPU, FR_F16, 1, FR_SHAPE(1000000), FR_TAG_TRANSIENT);
    fr_tensor *s = fr_empty(FR_CPU, FR_F32, 0, NULL, FR_TAG_TRANSIENT);
    CHECK_OK(fr_fill_(x, 1000.0f));
    CHECK_OK(fr_sum_out(s, x));
    CHECK(fr_item(s) == 1e9f);
    fr_tensor *m = fr_mean(x); /* the autograd form, f32 out */
    CHECK_NOTNULL(m);
    CHECK(m && m->dtype == FR_F32 && fr_item(m) == 1000.0f);
    fr_release(m);
    fr_release(s);
    fr_release(x);
}

/* ---- convolution, linear ---- */

static void test_conv_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        fr_conv_params p = {.stride = 1, .pad = 1};
        /* 40 images of 16x32x32 f32 = 2.5 MiB: blocks of 16 images, and 8 */
        fr_tensor *x = RAND_IN(dt, 3, 40, 16, 32, 32), *w = RAND_IN(dt, 4, 8, 16, 3, 3);
        fr_tensor *b = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 5);
        fr_tensor *dy = RAND_IN(dt, 6, 40, 8, 32, 32);
        fr_tensor *hx = fr_t_as(x, dt), *hw = fr_t_as(w, dt), *hdy = fr_t_as(dy, dt);
        fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(40, 8, 32, 32), FR_TAG_TRANSIENT);
        fr_tensor *hy = fr_t_empty_as(y, dt);
        CHECK_OK(fr_conv2d_forward(y, x, w, b, p));
        CHECK_OK(fr_conv2d_forward(hy, hx, hw, b, p));
        check_near(hy, y, dt, 1, "conv2d forward");

        fr_tensor *dx = fr_t_empty_as(x, FR_F32), *hdx = fr_t_empty_as(x, dt);
        fr_tensor *dw = fr_t_empty_as(w, FR_F32), *hdw = fr_t_empty_as(w, FR_F32);
        fr_tensor *db = fr_t_empty_as(b, FR_F32), *hdb = fr_t_empty_as(b, FR_F32);
        CHECK_OK(fr_conv2d_backward(dx, dw, db, dy, x, w, p));
        CHECK_OK(fr_conv2d_backward(hdx, hdw, hdb, hdy, hx, hw, p));
        check_near(hdx, dx, dt, 1, "conv2d dx");
        /* f32 gradients of f32 weights: only the blocks' summation order differs */
        CHECK(fr_t_allclose_t(hdw, dw, 1e-4, 1e-5, "conv2d dw (f32, from half x and dy)"));
        CHECK(fr_t_allclose_t(hdb, db, 1e-4, 1e-5, "conv2d db"));
        /* a half dw is refused: parameter gradients are f32 */
        fr_tensor *bad = fr_t_empty_as(w, dt);
        CHECK_ERR(fr_conv2d_backward(NULL, bad, NULL, hdy, hx, hw, p), FR_ERR_DTYPE, "dw");
        fr_tensor *all[] = {x, w, b, dy, hx, hw, hdy, y, hy, dx, hdx, dw, hdw, db, hdb, bad};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

static void test_linear_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        /* 5000 x 100 rows: two blocks of rows */
        fr_tensor *x = RAND_IN(dt, 7, 5000, 100), *w = RAND_IN(dt, 8, 30, 100);
        fr_tensor *b = fr_t_rand(FR_CPU, 1, FR_SHAPE(30), 9), *dy = RAND_IN(dt, 10, 5000, 30);
        fr_tensor *hx = fr_t_as(x, dt), *hdy = fr_t_as(dy, dt);
        fr_tensor *y = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(5000, 30), FR_TAG_TRANSIENT);
        fr_tensor *hy = fr_t_empty_as(y, dt);
        CHECK_OK(fr_linear_forward(y, x, w, b));
        CHECK_OK(fr_linear_forward(hy, hx, w, b));
        check_near(hy, y, dt, 1, "linear forward");
        fr_tensor *dx = fr_t_empty_as(x, FR_F32), *hdx = fr_t_empty_as(x, dt);
        fr_tensor *dw = fr_t_empty_as(w, FR_F32), *hdw = fr_t_empty_as(w, FR_F32);
        fr_tensor *db = fr_t_empty_as(b, FR_F32), *hdb = fr_t_empty_as(b, FR_F32);
        CHECK_OK(fr_linear_backward(dx, dw, db, dy, x, w));
        CHECK_OK(fr_linear_backward(hdx, hdw, hdb, hdy, hx, w));
        check_near(hdx, dx, dt, 1, "linear dx");
        CHECK(fr_t_allclose_t(hdw, dw, 1e-3, 1e-5, "linear dw (f32)"));
        CHECK(fr_t_allclose_t(hdb, db, 1e-3, 1e-5, "linear db (f32)"));
        fr_tensor *all[] = {x, w, b, dy, hx, hdy, y, hy, dx, hdx, dw, hdw, db, hdb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

/* ---- batch norm, pooling, concat, loss ---- */

static void test_batchnorm_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        /* an offset mean, which a naive f16 sum would lose */
        fr_tensor *x = RAND_IN(dt, 11, 32, 8, 16, 16), *hx = NULL;
        fr_tensor *shift = fr_empty(FR_CPU, FR_F32, 4, x->shape, FR_TAG_TRANSIENT);
        CHECK_OK(fr_fill_(shift, 40.0f));
        CHECK_OK(fr_add_out(x, x, shift));
        fr_t_round_to(x, dt);
        hx = fr_t_as(x, dt);
        fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 12), *bt = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 13);
        fr_tensor *st[8];
        for (int i = 0; i < 8; i++)
            st[i] = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(8), FR_TAG_TRANSIENT);
        fr_tensor *y = fr_t_empty_as(x, FR_F32), *hy = fr_t_empty_as(x, dt);
        CHECK_OK(fr_batch_norm_train_forward(y, st[0], st[1], x, g, bt, st[2], st[3], 0.1f, 1e-5f));
        CHECK_OK(fr_batch_norm_train_forward(hy, st[4], st[5], hx, g, bt, st[6], st[7], 0.1f, 1e-5f));
        const char *names[4] = {"mean", "invstd", "running_mean", "running_var"};
        for (int i = 0; i < 4; i++)
            CHECK(fr_t_allclose_t(st[4 + i], st[i], 0, 0, names[i])); /* bit-identical */
        check_near(hy, y, dt, 1, "batch_norm y");
        fr_tensor *dy = RAND_IN(dt, 14, 32, 8, 16, 16), *hdy = fr_t_as(dy, dt);
        fr_tensor *dx = fr_t_empty_as(x, FR_F32), *hdx = fr_t_empty_as(x, dt);
        fr_tensor *dg = fr_t_empty_as(g, FR_F32), *hdg = fr_t_empty_as(g, FR_F32);
        fr_tensor *dbt = fr_t_empty_as(g, FR_F32), *hdbt = fr_t_empty_as(g, FR_F32);
        CHECK_OK(fr_batch_norm_backward(dx, dg, dbt, dy, x, st[0], st[1], g));
        CHECK_OK(fr_batch_norm_backward(hdx, hdg, hdbt, hdy, hx, st[4], st[5], g));
        check_near(hdx, dx, dt, 1, "batch_norm dx");
        CHECK(fr_t_allclose_t(hdg, dg, 0, 0, "batch_norm dgamma (same values, f32)"));
        CHECK(fr_t_allclose_t(hdbt, dbt, 0, 0, "batch_norm dbeta"));
        /* eval mode, inplace */
        CHECK_OK(fr_batch_norm_eval_forward(y, x, g, bt, st[2], st[3], 1e-5f));
        CHECK_OK(fr_batch_norm_eval_forward(hx, hx, g, bt, st[6], st[7], 1e-5f));
        check_near(hx, y, dt, 1, "batch_norm eval inplace");
        fr_tensor *all[] = {x, hx, shift, g, bt, y, hy, dy, hdy, dx, hdx, dg, hdg, dbt, hdbt};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
        for (int i = 0; i < 8; i++)
            fr_release(st[i]);
    }
}

/* A batch staged in several blocks: the blocks' statistics are combined
 * (Chan et al.'s pairwise update) and backward sums the blocks' dgamma /
 * dbeta before dx. Against f32's one-call kernels on the same values: the
 * statistics within f32 round-off (rtol 1e-6 mean, 1e-5 invstd), the rest as
 * the other ops. */
static void test_batchnorm_half_in_blocks(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        /* 40 samples of 16 x 32 x 32: blocks of 16, 16 and 8; mean about 40 */
        fr_tensor *x = RAND_IN(dt, 31, 40, 16, 32, 32);
        fr_tensor *shift = fr_t_empty_as(x, FR_F32);
        CHECK_OK(fr_fill_(shift, 40.0f));
        CHECK_OK(fr_add_out(x, x, shift));
        fr_t_round_to(x, dt);
        fr_tensor *hx = fr_t_as(x, dt);
        fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(16), 32), *bt = fr_t_rand(FR_CPU, 1, FR_SHAPE(16), 33);
        fr_tensor *st[4];
        for (int i = 0; i < 4; i++)
            st[i] = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(16), FR_TAG_TRANSIENT);
        fr_tensor *y = fr_t_empty_as(x, FR_F32), *hy = fr_t_empty_as(x, dt);
        CHECK_OK(fr_batch_norm_train_forward(y, st[0], st[1], x, g, bt, NULL, NULL, 0.1f, 1e-5f));
        CHECK_OK(fr_batch_norm_train_forward(hy, st[2], st[3], hx, g, bt, NULL, NULL, 0.1f, 1e-5f));
        CHECK(fr_t_allclose_t(st[2], st[0], 0, 1e-6, "blocked mean"));
        CHECK(fr_t_allclose_t(st[3], st[1], 0, 1e-5, "blocked invstd"));
        check_near(hy, y, dt, 1, "blocked batch_norm y");
        fr_tensor *dy = RAND_IN(dt, 34, 40, 16, 32, 32), *hdy = fr_t_as(dy, dt);
        fr_tensor *dx = fr_t_empty_as(x, FR_F32), *hdx = fr_t_empty_as(x, dt);
        fr_tensor *dg = fr_t_empty_as(g, FR_F32), *hdg = fr_t_empty_as(g, FR_F32);
        fr_tensor *db = fr_t_empty_as(g, FR_F32), *hdb = fr_t_empty_as(g, FR_F32);
        CHECK_OK(fr_batch_norm_backward(dx, dg, db, dy, x, st[0], st[1], g));
        CHECK_OK(fr_batch_norm_backward(hdx, hdg, hdb, hdy, hx, st[0], st[1], g));
        CHECK(fr_t_allclose_t(hdg, dg, 1e-3, 1e-5, "blocked dgamma"));
        CHECK(fr_t_allclose_t(hdb, db, 1e-3, 1e-5, "blocked dbeta"));
        check_near(hdx, dx, dt, 2, "blocked batch_norm dx");
        /* no f32 copy of a whole operand: the scratch is three 1 MiB blocks
         * (dy, x, dx) and a few per-channel sums, where staging whole
         * would take 3 x 2.5 MiB */
        fr_mem_reset_peak();
        size_t before = fr_mem_current(FR_CPU, FR_TAG_WORKSPACE);
        CHECK_OK(fr_batch_norm_backward(hdx, hdg, hdb, hdy, hx, st[0], st[1], g));
        size_t scratch = fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE) - before;
        if (scratch > (3u << 20) + 4096) {
            fprintf(stderr, "    backward scratch %zu bytes\n", scratch);
            fr_t_failed_now = 1;
        }
        fr_tensor *all[] = {x, shift, hx, g, bt, y, hy, dy, hdy, dx, hdx, dg, hdg, db, hdb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
        for (int i = 0; i < 4; i++)
            fr_release(st[i]);
    }
}

static void test_pool_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        fr_tensor *x = RAND_IN(dt, 15, 40, 16, 32, 32), *hx = fr_t_as(x, dt);
        fr_pool_params p = {.kernel = 2, .stride = 2, .pad = 0};
        fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(40, 16, 16, 16), FR_TAG_TRANSIENT);
        fr_tensor *hy = fr_t_empty_as(y, dt), *dy = RAND_IN(dt, 16, 40, 16, 16, 16), *hdy = fr_t_as(dy, dt);
        fr_tensor *dx = fr_t_empty_as(x, FR_F32), *hdx = fr_t_empty_as(x, dt);
        CHECK_OK(fr_max_pool2d_forward(y, x, p));
        CHECK_OK(fr_max_pool2d_forward(hy, hx, p));
        check_near(hy, y, dt, 0, "max_pool2d (exact)");
        CHECK_OK(fr_max_pool2d_backward(dx, dy, x, p));
        CHECK_OK(fr_max_pool2d_backward(hdx, hdy, hx, p));
        check_near(hdx, dx, dt, 0, "max_pool2d backward (exact)");
        CHECK_OK(fr_avg_pool2d_forward(y, x, p));
        CHECK_OK(fr_avg_pool2d_forward(hy, hx, p));
        check_near(hy, y, dt, 1, "avg_pool2d");
        CHECK_OK(fr_avg_pool2d_backward(dx, dy, p));
        CHECK_OK(fr_avg_pool2d_backward(hdx, hdy, p));
        check_near(hdx, dx, dt, 1, "avg_pool2d backward");
        fr_tensor *gy = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(40, 16), FR_TAG_TRANSIENT);
        fr_tensor *hgy = fr_t_empty_as(gy, dt);
        CHECK_OK(fr_global_avg_pool_forward(gy, x));
        CHECK_OK(fr_global_avg_pool_forward(hgy, hx));
        check_near(hgy, gy, dt, 1, "global_avg_pool");
        CHECK_OK(fr_global_avg_pool_backward(dx, gy));
        CHECK_OK(fr_global_avg_pool_backward(hdx, hgy));
        check_near(hdx, dx, dt, 2, "global_avg_pool backward");
        fr_tensor *all[] = {x, hx, y, hy, dy, hdy, dx, hdx, gy, hgy};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

static void test_concat_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        fr_tensor *a = RAND_IN(dt, 17, 4, 3, 5, 5), *b = RAND_IN(dt, 18, 4, 2, 5, 5);
        fr_tensor *ha = fr_t_as(a, dt), *hb = fr_t_as(b, dt);
        fr_tensor *in[2] = {a, b}, *hin[2] = {ha, hb};
        fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(4, 5, 5, 5), FR_TAG_TRANSIENT);
        fr_tensor *hy = fr_t_empty_as(y, dt);
        CHECK_OK(fr_concat_forward(y, in, 2));
        CHECK_OK(fr_concat_forward(hy, hin, 2));
        check_near(hy, y, dt, 0, "concat (a copy: exact)");
        fr_tensor *hda = fr_t_empty_as(a, dt), *hdb = fr_t_empty_as(b, dt), *hd[2] = {hda, hdb};
        CHECK_OK(fr_concat_backward(hd, 2, hy));
        check_near(hda, a, dt, 0, "concat backward [0]");
        check_near(hdb, b, dt, 0, "concat backward [1]");
        fr_tensor *mixed[2] = {ha, b};
        CHECK_ERR(fr_concat_forward(hy, mixed, 2), FR_ERR_DTYPE, "does not convert");
        fr_tensor *all[] = {a, b, ha, hb, y, hy, hda, hdb};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

static void test_cross_entropy_half(void) {
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        fr_tensor *z = RAND_IN(dt, 19, 64, 10), *hz = fr_t_as(z, dt);
        int32_t lab[64];
        for (int i = 0; i < 64; i++)
            lab[i] = (i * 7) % 10;
        fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(64), FR_TAG_DATA, lab);
        fr_tensor *l = fr_empty(FR_CPU, FR_F32, 0, NULL, FR_TAG_TRANSIENT), *hl = fr_t_empty_as(l, FR_F32);
        CHECK_OK(fr_cross_entropy_forward(l, z, labels));
        CHECK_OK(fr_cross_entropy_forward(hl, hz, labels));
        CHECK(fr_item(hl) == fr_item(l)); /* same values, f32 log-sum-exp */
        fr_tensor *one = fr_empty(FR_CPU, FR_F32, 0, NULL, FR_TAG_TRANSIENT);
        CHECK_OK(fr_fill_(one, 1.0f));
        fr_tensor *dz = fr_t_empty_as(z, FR_F32), *hdz = fr_t_empty_as(z, dt);
        CHECK_OK(fr_cross_entropy_backward(dz, one, z, labels));
        CHECK_OK(fr_cross_entropy_backward(hdz, one, hz, labels));
        check_near(hdz, dz, dt, 1, "cross_entropy dlogits");
        fr_tensor *all[] = {z, hz, labels, l, hl, one, dz, hdz};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

/* ---- dtype plumbing ---- */

static void test_autocast_dtypes(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 20);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 3, 3), 21);
    fr_tensor *lw = fr_t_rand(FR_CPU, 2, FR_SHAPE(5, 4), 22);
    fr_set_requires_grad(x, true);
    fr_set_requires_grad(w, true);
    fr_set_requires_grad(lw, true);
    CHECK(fr_autocast_dtype() == FR_F32);
    CHECK_OK(fr_autocast_enter(FR_BF16));
    fr_tensor *y = fr_conv2d(x, w, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    CHECK(y && y->dtype == FR_BF16);
    fr_tensor *r = y ? fr_relu(y) : NULL;
    CHECK(r && r->dtype == FR_BF16);
    fr_tensor *g = r ? fr_global_avg_pool(r) : NULL;
    CHECK(g && g->dtype == FR_BF16);
    CHECK_OK(fr_autocast_enter(FR_F32)); /* nested: off */
    fr_tensor *f = fr_conv2d(x, w, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    CHECK(f && f->dtype == FR_F32);
    fr_autocast_exit();
    fr_tensor *z = g ? fr_linear(g, lw, NULL) : NULL;
    CHECK(z && z->dtype == FR_BF16);
    fr_autocast_exit();
    CHECK(fr_autocast_dtype() == FR_F32);
    fr_tensor *zf = z ? fr_cast(z, FR_F32) : NULL;
    CHECK(zf && zf->dtype == FR_F32);
    fr_tensor *loss = zf ? fr_sum(zf) : NULL;
    CHECK_OK(fr_backward(loss));
    /* master weights get f32 gradients; the f32 input gets an f32 gradient */
    CHECK(w->grad && w->grad->dtype == FR_F32);
    CHECK(lw->grad && lw->grad->dtype == FR_F32);
    CHECK(x->grad && x->grad->dtype == FR_F32);
    CHECK(w->dtype == FR_F32 && lw->dtype == FR_F32);
    CHECK(fr_tape_size() == 1); /* f's conv: a graph of its own, still pending */
    fr_tape_clear();
    CHECK_ERR(fr_autocast_enter(FR_I32), FR_ERR_DTYPE, "f32, f16 or bf16");
    fr_tensor *labels = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA);
    CHECK(!fr_cast(labels, FR_F32));
    fr_tensor *all[] = {x, w, lw, y, r, g, f, z, zf, loss, labels};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

/* ---- models ---- */

static fr_tensor *batch(int n, int c, int hw, uint32_t seed, fr_tensor **labels) {
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)((i * 3 + seed) % 10);
    *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, lab);
    free(lab);
    return fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, hw, hw), seed);
}

/* The tolerances: the relative error of the loss; of the output layer's
 * gradients (fc.*); and of all parameter gradients as one vector. At random
 * initialisation the gradients of early layers come out of long chains of
 * BN backward passes whose mean subtractions cancel most of each term, so
 * their relative error grows with depth. PyTorch's own CPU autocast shows
 * the same profile on this model and batch shape (bench/torch_autocast_error.py:
 * bf16 conv1 36%, layer3.2 14%, fc 0.7%); frugal measured bf16 37% / 15% /
 * 0.7%, f16 14% / 5.5% / 0.1%, loss 1.1e-4 / 3.3e-5. The bounds below are
 * those figures with headroom; a wrong gradient anywhere (a dtype mix-up,
 * a missed block) lands far outside them. */
typedef struct {
    fr_dtype dt;
    double loss_tol, fc_tol, all_tol;
} half_tols;

static const half_tols resnet20_tols[] = {{FR_BF16, 1e-3, 0.02, 0.45}, {FR_F16, 2e-4, 0.005, 0.2}};

static void check_tols(const fr_model *m, const fr_t_step *ref, const fr_t_step *got,
                       const half_tols *t, const char *what) {
    double lerr = isnan(got->loss) ? 0 : fabs(got->loss - ref->loss) / fabs(ref->loss);
    double fc = fr_t_grad_rel_error(m, ref, got, "fc."), all = fr_t_grad_rel_error(m, ref, got, "");
    if (!(lerr <= t->loss_tol && fc <= t->fc_tol && all <= t->all_tol)) {
        fprintf(stderr, "    %s %s: loss rel err %.3g (tol %.3g), fc grads %.3g (tol %.3g), "
                        "all grads %.3g (tol %.3g)\n",
                what, fr_dtype_name(t->dt), lerr, t->loss_tol, fc, t->fc_tol, all, t->all_tol);
        fr_t_failed_now = 1;
    }
}

static void test_resnet20_half_vs_f32(void) {
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 7);
    fr_tensor *labels, *x = batch(16, 3, 32, 3, &labels);
    float **init = fr_t_snapshot_save(m);
    fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
    for (int c = 0; c < 2; c++) {
        m->cfg.precision = resnet20_tols[c].dt;
        fr_t_step got = fr_t_model_step(m, "plain", init, x, labels);
        check_tols(m, &ref, &got, &resnet20_tols[c], "resnet20");
        /* activations in 2 bytes; only the per-channel BN statistics stay f32 */
        CHECK(got.peak_saved * 2 >= ref.peak_saved && got.peak_saved <= 0.501 * ref.peak_saved);
        /* the other strategies in the same precision give the same step */
        const char *others[] = {"checkpoint:1", "recompute", "checkpoint", "recompute+checkpoint:2"};
        for (int s = 0; s < 4; s++) {
            fr_t_step o = fr_t_model_step(m, others[s], init, x, labels);
            fr_t_compare_steps(m, &got, &o, -1, others[s]);
            CHECK(s == 0 ? o.peak_saved <= got.peak_saved : o.peak_saved < got.peak_saved);
            fr_t_step_free(&o, m->params->count);
        }
        fr_t_step_free(&got, m->params->count);
    }
    m->cfg.precision = FR_F32;
    fr_t_step_free(&ref, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* f16 with the loss scaled by 2^16, as training runs it: the unscaled
 * gradients against f32's, and an inf input skips the step. */
static void test_resnet20_f16_with_loss_scaling(void) {
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 7);
    fr_tensor *labels, *x = batch(16, 3, 32, 3, &labels);
    float **init = fr_t_snapshot_save(m);
    fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
    m->cfg.precision = FR_F16;
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, FR_F16));
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    fr_tensor *scaled = loss ? fr_loss_scaler_scale(&sc, loss) : NULL;
    CHECK_OK(fr_backward(scaled));
    CHECK_OK(fr_loss_scaler_unscale(&sc, m->params));
    CHECK(!sc.found_nonfinite);
    fr_t_step got = {.values = calloc((size_t)m->params->count, sizeof(float *)), .loss = NAN};
    for (int i = 0; i < m->params->count; i++) {
        const fr_tensor *g = m->params->items[i].tensor->grad;
        if (m->params->items[i].kind == FR_PARAMETER && g) {
            got.values[i] = malloc(fr_nbytes(g));
            CHECK_OK(fr_read_f32(g, got.values[i], (size_t)fr_numel(g)));
        }
    }
    check_tols(m, &ref, &got, &resnet20_tols[1], "resnet20 loss-scaled");
    fr_params_zero_grad(m->params);
    fr_tensor *all[] = {logits, loss, scaled};
    for (size_t i = 0; i < 3; i++)
        fr_release(all[i]);
    fr_t_step_free(&got, m->params->count);
    fr_t_step_free(&ref, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

static void test_densenet_half_efficient_matches_plain(void) {
    fr_model *m = fr_densenet_create("densenet-bc-40-k8", 8, 3, 10, 1);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *labels, *x = batch(4, 3, 16, 5, &labels);
    float **init = fr_t_snapshot_save(m);
    fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
    m->cfg.precision = FR_BF16;
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    fr_t_step eff = fr_t_model_step(m, "efficient", init, x, labels);
    fr_t_compare_steps(m, &plain, &eff, -1, "densenet bf16 efficient vs plain");
    fprintf(stderr, "    densenet-bc-40-k8 b4: saved f32 %zu, bf16 %zu (efficient %zu); loss %.6f vs %.6f\n",
            ref.peak_saved, plain.peak_saved, eff.peak_saved, plain.loss, ref.loss);
    CHECK(plain.peak_saved * 2 >= ref.peak_saved && plain.peak_saved <= 0.52 * ref.peak_saved);
    CHECK(eff.peak_saved < plain.peak_saved);
    CHECK(fabs(plain.loss - ref.loss) <= 3e-3 * fabs(ref.loss));
    fr_t_step_free(&ref, m->params->count);
    fr_t_step_free(&plain, m->params->count);
    fr_t_step_free(&eff, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* The ledger target: saved-for-backward bytes of ResNet-56 at batch
 * 64 (32x32x3) in bf16 at most 0.52x those in f32, under each strategy.
 * Under the sanitizers the batch is 8: ten ResNet-56 steps at batch 64 can
 * pass the runner's 600 s on a loaded machine there, and every saved
 * tensor's size is proportional to the batch, so the ratio is the same
 * check (the plain build runs the batch). */
#if defined(__SANITIZE_ADDRESS__)
enum { RESNET56_BATCH = 8 };
#else
enum { RESNET56_BATCH = 64 };
#endif
static void test_resnet56_bf16_saved_bytes(void) {
    fr_model *m = fr_resnet_create("resnet56", 3, 10, 1);
    fr_tensor *labels, *x = batch(RESNET56_BATCH, 3, 32, 9, &labels);
    /* checkpoint with a fixed step count: the automatic split minimises the
     * total peak (nn/seg_split.h), which holds f32 master weights and
     * workspaces besides what is saved, so at a small batch it may cut bf16
     * differently from f32 (at b8 under the sanitizers it did: 0.59x); the
     * ratio of saved bytes is a question about the same layout. */
    const char *strategies[] = {"plain", "recompute", "abn", "checkpoint:3", "abn+checkpoint:3"};
    for (int s = 0; s < 5; s++) {
        size_t saved[2];
        for (int p = 0; p < 2; p++) {
            m->cfg.precision = p ? FR_BF16 : FR_F32;
            fr_t_step r = fr_t_model_step(m, strategies[s], NULL, x, labels);
            saved[p] = r.peak_saved;
            fr_t_step_free(&r, m->params->count);
        }
        double ratio = (double)saved[1] / (double)saved[0];
        fprintf(stderr, "    resnet56 b%d %-16s saved f32 %9zu  bf16 %9zu  ratio %.4f\n", RESNET56_BATCH,
                strategies[s], saved[0], saved[1], ratio);
        CHECK(saved[0] > 0 && ratio <= 0.52);
    }
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* ---- CUDA half against CPU half ---- */

static void test_cuda_half_matches_cpu(void) {
    NEED_CUDA();
    for (int d = 0; d < 2; d++) {
        fr_dtype dt = halves[d];
        fr_tensor *x = RAND_IN(dt, 23, 8, 4, 8, 8), *w = RAND_IN(dt, 24, 6, 4, 3, 3);
        fr_tensor *hx = fr_t_as(x, dt), *gx = fr_to_device(hx, FR_CUDA, FR_TAG_TRANSIENT);
        fr_tensor *gw = fr_to_device(w, FR_CUDA, FR_TAG_TRANSIENT);
        fr_tensor *y[2];
        fr_tensor *xs[2] = {hx, gx}, *ws[2] = {w, gw};
        for (int dev = 0; dev < 2; dev++) {
            CHECK_OK(fr_autocast_enter(dt));
            fr_tensor *c = fr_conv2d(xs[dev], ws[dev], NULL, (fr_conv_params){.stride = 1, .pad = 1});
            fr_tensor *r = c ? fr_relu(c) : NULL;
            y[dev] = r ? fr_global_avg_pool(r) : NULL;
            fr_autocast_exit();
            CHECK(y[dev] && y[dev]->dtype == dt);
            fr_release(c);
            fr_release(r);
        }
        fr_tensor *back = y[1] ? fr_to_device(y[1], FR_CPU, FR_TAG_TRANSIENT) : NULL;
        fr_tensor *ref = y[0] ? fr_to_dtype(y[0], FR_F32, FR_TAG_TRANSIENT) : NULL;
        check_near(back, ref, dt, 1, "cuda conv+relu+pool in half");
        fr_tensor *all[] = {x, w, hx, gx, gw, y[0], y[1], back, ref};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
    }
}

int main(void) {
    RUN(test_elementwise_half);
    RUN(test_sum_of_million_halves_directly);
    RUN(test_conv_half);
    RUN(test_linear_half);
    RUN(test_batchnorm_half);
    RUN(test_batchnorm_half_in_blocks);
    RUN(test_pool_half);
    RUN(test_concat_half);
    RUN(test_cross_entropy_half);
    RUN(test_autocast_dtypes);
    RUN(test_resnet20_half_vs_f32);
    RUN(test_resnet20_f16_with_loss_scaling);
    RUN(test_densenet_half_efficient_matches_plain);
    RUN(test_resnet56_bf16_saved_bytes);
    RUN(test_cuda_half_matches_cpu);
    return TEST_SUMMARY();
}
