/* test_nan.c: NaN and inf propagate through every op as in PyTorch 1.13, on
 * the CPU and (when a device is present) on CUDA, and a model with one NaN
 * weight or buffer computes NaN logits instead of a plausible answer.
 *
 * The expected values are PyTorch 1.13's (torch.nn.functional on the CPU):
 *   relu([nan, -1, -0, 0, 2, inf, -inf])       = [nan, 0, -0, 0, 2, inf, 0]
 *   its gradient for dy = 2                    = [2, 0, 0, 0, 2, 2, 0]
 *     (threshold_backward: y <= 0 ? 0 : dy, so dy passes where y is NaN)
 *   relu([1, -1, 0]) backward with dy = nan    = [nan, 0, 0]
 *   leaky_relu(x, 0.1) = [nan, -0.1, -0, 0, 2, inf, -inf], gradient for
 *     dy = 1: [0.1, 0.1, 0.1, 0.1, 1, 1, 0.1]
 *   max_pool2d(2) of [[1, nan], [nan, 0]]      = nan, the gradient to the
 *     last NaN of the window (index 2); a window with an inf gives inf
 *   batch_norm (training) with one NaN in channel 0: channel 0 of the output,
 *     of the input gradient, its running mean / var and its weight gradient
 *     are NaN; channel 1 and the bias gradient stay finite
 *   batch_norm + relu with weight[0] = nan: channel 0 output and input
 *     gradient NaN, channel 1 finite, the weight gradient finite (relu's
 *     backward passes dy where its output is NaN)
 *   dropout of NaN (training): NaN everywhere (input * mask * scale)
 * (reproduced with /usr/bin/python3 and torch 1.13.0 on 2026-12-01). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/resnet.h"
#include "testlib.h"

static const float NaN = NAN, Inf = INFINITY;

/* A tensor on `dev` holding `v` (shape given), requiring grad when `leaf`. */
static fr_tensor *make(fr_device dev, int ndim, const int64_t *shape, const float *v, bool leaf) {
    fr_tensor *c = fr_empty(FR_CPU, FR_F32, ndim, shape, FR_TAG_TRANSIENT);
    if (!c)
        return NULL;
    memcpy(fr_data_f32(c), v, (size_t)fr_numel(c) * sizeof *v);
    fr_tensor *t = dev == FR_CPU ? fr_retain(c) : fr_to_device(c, dev, FR_TAG_TRANSIENT);
    fr_release(c);
    if (t && leaf)
        fr_set_requires_grad(t, true);
    return t;
}

/* The values of t, read to the host (malloc'd), or NULL. */
static float *host(const fr_tensor *t) {
    if (!t)
        return NULL;
    size_t n = (size_t)fr_numel(t);
    float *h = malloc(n * sizeof *h);
    if (h && fr_read_f32(t, h, n) != FR_OK) {
        free(h);
        h = NULL;
    }
    return h;
}

/* got must equal want exactly: NaN where want is NaN, the same sign of zero. */
static void expect_exact(const fr_tensor *got, const float *want, size_t n, const char *what) {
    float *h = host(got);
    CHECK(h != NULL);
    for (size_t i = 0; h && i < n; i++) {
        bool ok = isnan(want[i]) ? isnan(h[i]) : h[i] == want[i] && signbit(h[i]) == signbit(want[i]);
        if (!ok) {
            fprintf(stderr, "    %s[%zu] = %g, PyTorch gives %g\n", what, i, (double)h[i], (double)want[i]);
            fr_t_failed_now = 1;
        }
    }
    free(h);
}

/* Every value of channel `ch` of t (N, C, ...) is NaN (nan_wanted) or
 * finite (!nan_wanted). */
static void expect_channel(const fr_tensor *t, int ch, bool nan_wanted, const char *what) {
    float *h = host(t);
    CHECK(h != NULL);
    int64_t n = t->shape[0], c = t->ndim > 1 ? t->shape[1] : t->shape[0];
    int64_t inner = t->ndim > 1 ? fr_numel(t) / (n * c) : 1;
    if (t->ndim == 1)
        n = 1;
    for (int64_t i = 0; h && i < n; i++)
        for (int64_t j = 0; j < inner; j++) {
            float v = h[(i * c + ch) * inner + j];
            if (nan_wanted ? !isnan(v) : !isfinite(v)) {
                fprintf(stderr, "    %s: channel %d holds %g, wanted %s\n", what, ch, (double)v,
                        nan_wanted ? "NaN" : "finite");
                fr_t_failed_now = 1;
                free(h);
                return;
            }
        }
    free(h);
}

static fr_device devices[2] = {FR_CPU, FR_CUDA};
static int n_devices(void) {
    return fr_t_have_cuda() ? 2 : 1;
}

static void test_relu_nan(void) {
    static const float x[] = {NaN, -1, -0.0f, 0, 2, Inf, -Inf};
    static const float y_want[] = {NaN, 0, -0.0f, 0, 2, Inf, 0}, dx_want[] = {2, 0, 0, 0, 2, 2, 0};
    static const float two[] = {2, 2, 2, 2, 2, 2, 2};
    for (int d = 0; d < n_devices(); d++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            fr_tensor *a = make(devices[d], 1, FR_SHAPE(7), x, true);
            fr_tensor *dy = make(devices[d], 1, FR_SHAPE(7), two, false);
            /* inplace: relu_ over a copy, so the leaf gets the gradient */
            fr_tensor *b = inplace ? fr_scale(a, 1.0f) : NULL;
            fr_tensor *y = inplace ? fr_relu_(b) : fr_relu(a);
            CHECK_NOTNULL(y);
            if (y) {
                expect_exact(y, y_want, 7, inplace ? "relu_ y" : "relu y");
                CHECK_OK(fr_backward_with(y, dy));
                expect_exact(a->grad, dx_want, 7, inplace ? "relu_ dx" : "relu dx");
            }
            fr_release(y);
            fr_release(b);
            fr_release(dy);
            fr_release(a);
        }
        /* a NaN gradient passes where the input was positive */
        static const float x2[] = {1, -1, 0}, nan3[] = {NaN, NaN, NaN}, want2[] = {NaN, 0, 0};
        fr_tensor *a = make(devices[d], 1, FR_SHAPE(3), x2, true);
        fr_tensor *dy = make(devices[d], 1, FR_SHAPE(3), nan3, false);
        fr_tensor *y = fr_relu(a);
        if (y && fr_backward_with(y, dy) == FR_OK)
            expect_exact(a->grad, want2, 3, "relu dx for dy = nan");
        else
            CHECK(!"relu backward");
        fr_release(y);
        fr_release(dy);
        fr_release(a);
    }
}

static void test_leaky_relu_nan(void) {
    static const float x[] = {NaN, -1, -0.0f, 0, 2, Inf, -Inf};
    static const float y_want[] = {NaN, -0.1f, -0.0f, 0, 2, Inf, -Inf};
    static const float dx_want[] = {0.1f, 0.1f, 0.1f, 0.1f, 1, 1, 0.1f}, one[] = {1, 1, 1, 1, 1, 1, 1};
    for (int d = 0; d < n_devices(); d++) {
        fr_tensor *a = make(devices[d], 1, FR_SHAPE(7), x, true);
        fr_tensor *dy = make(devices[d], 1, FR_SHAPE(7), one, false);
        fr_tensor *y = fr_leaky_relu(a, 0.1f);
        CHECK_NOTNULL(y);
        if (y) {
            expect_exact(y, y_want, 7, "leaky_relu y");
            CHECK_OK(fr_backward_with(y, dy));
            expect_exact(a->grad, dx_want, 7, "leaky_relu dx");
        }
        fr_release(y);
        fr_release(dy);
        fr_release(a);
    }
}

static void test_max_pool_nan(void) {
    /* (1, 1, 2, 4): windows {1, nan, nan, 0} and {3, inf, -inf, -inf} */
    static const float x[] = {1, NaN, 3, Inf, NaN, 0, -Inf, -Inf};
    static const float y_want[] = {NaN, Inf}, dy[] = {1, 1}, dx_want[] = {0, 0, 0, 1, 1, 0, 0, 0};
    for (int d = 0; d < n_devices(); d++) {
        fr_tensor *a = make(devices[d], 4, FR_SHAPE(1, 1, 2, 4), x, true);
        fr_tensor *g = make(devices[d], 4, FR_SHAPE(1, 1, 1, 2), dy, false);
        fr_tensor *y = fr_max_pool2d(a, (fr_pool_params){.kernel = 2, .stride = 2});
        CHECK_NOTNULL(y);
        if (y) {
            expect_exact(y, y_want, 2, "max_pool2d y");
            CHECK_OK(fr_backward_with(y, g));
            expect_exact(a->grad, dx_want, 8, "max_pool2d dx");
        }
        fr_release(y);
        fr_release(g);
        fr_release(a);
    }
}

/* (2, 2, 2, 2) values, with `poison` at element 0 (channel 0). */
static void bn_input(float *v, float poison) {
    fr_t_fill_rand(v, 16, 7);
    v[0] = poison;
}

static void test_batch_norm_nan(void) {
    float xv[16];
    bn_input(xv, NaN);
    static const float ones[] = {1, 1}, zeros[] = {0, 0};
    for (int d = 0; d < n_devices(); d++) {
        fr_device dev = devices[d];
        fr_tensor *x = make(dev, 4, FR_SHAPE(2, 2, 2, 2), xv, true);
        fr_tensor *gamma = make(dev, 1, FR_SHAPE(2), ones, true), *beta = make(dev, 1, FR_SHAPE(2), zeros, true);
        fr_tensor *rm = make(dev, 1, FR_SHAPE(2), zeros, false), *rv = make(dev, 1, FR_SHAPE(2), ones, false);
        fr_tensor *y = fr_batch_norm(x, gamma, beta, rm, rv, true, 0.1f, 1e-5f);
        fr_tensor *loss = y ? fr_t_weighted_sum(y, 3) : NULL;
        CHECK_NOTNULL(loss);
        if (loss) {
            expect_channel(y, 0, true, "batch_norm y");
            expect_channel(y, 1, false, "batch_norm y");
            CHECK_OK(fr_backward(loss));
            expect_channel(x->grad, 0, true, "batch_norm dx");
            expect_channel(x->grad, 1, false, "batch_norm dx");
            expect_channel(gamma->grad, 0, true, "batch_norm dgamma");
            expect_channel(gamma->grad, 1, false, "batch_norm dgamma");
            expect_channel(beta->grad, 0, false, "batch_norm dbeta");
            expect_channel(rm, 0, true, "running_mean");
            expect_channel(rv, 0, true, "running_var");
            expect_channel(rv, 1, false, "running_var");
        }
        /* eval with a NaN running mean: its channel is NaN, the other not */
        fr_no_grad_enter();
        fr_tensor *e = fr_batch_norm(x, gamma, beta, rm, rv, false, 0.1f, 1e-5f);
        fr_no_grad_exit();
        CHECK_NOTNULL(e);
        if (e) {
            expect_channel(e, 0, true, "eval batch_norm y");
            expect_channel(e, 1, false, "eval batch_norm y");
        }
        fr_release(e);
        fr_release(loss);
        fr_release(y);
        fr_tensor *all[] = {x, gamma, beta, rm, rv};
        for (int i = 0; i < 5; i++)
            fr_release(all[i]);
    }
}

/* Fused BN + act with a NaN in gamma[0] against the separate ops: the same
 * values bit for bit (NaN where one gives NaN), and the NaN reaches the
 * output, the input gradient and gamma's gradient (ReLU: BN then relu; ABN:
 * BN with |gamma| + eps then leaky ReLU, whose gamma gradient is NaN). */
static void bn_act_case(fr_device dev, fr_bnact_mode mode, fr_act act, float slope) {
    float xv[16];
    bn_input(xv, 0.5f);
    static const float g0[] = {NaN, 1.5f}, b0[] = {0.1f, -0.2f}, zeros[] = {0, 0}, ones[] = {1, 1};
    const char *what = mode == FR_BNACT_INPLACE_ABN ? "abn" : "bn_relu";
    fr_tensor *x = make(dev, 4, FR_SHAPE(2, 2, 2, 2), xv, true);
    fr_tensor *gamma = make(dev, 1, FR_SHAPE(2), g0, true), *beta = make(dev, 1, FR_SHAPE(2), b0, true);
    fr_tensor *rm = make(dev, 1, FR_SHAPE(2), zeros, false), *rv = make(dev, 1, FR_SHAPE(2), ones, false);
    fr_bn_state bn = {gamma, beta, rm, rv, 0.1f, 1e-5f, true};
    fr_tensor *xin = fr_scale(x, 1.0f); /* ABN overwrites its input: not the leaf */
    fr_tensor *y = xin ? fr_bn_act(xin, NULL, &bn, act, slope, mode) : NULL;
    fr_tensor *loss = y ? fr_t_weighted_sum(y, 5) : NULL;
    CHECK_NOTNULL(loss);
    if (loss) {
        expect_channel(y, 0, true, what);
        expect_channel(y, 1, false, what);
        float *fused = host(y);
        CHECK_OK(fr_backward(loss));
        expect_channel(x->grad, 0, true, what);
        expect_channel(x->grad, 1, false, what);
        /* relu: dgamma = sum(dy * relu'(y) * xhat) with dy passing where y
         * is NaN, finite (PyTorch's too); abn: d|gamma| at a NaN gamma is
         * NaN here (PyTorch's abs backward gives 0 there; either way the
         * NaN gamma stays NaN) */
        expect_channel(gamma->grad, 0, mode == FR_BNACT_INPLACE_ABN, what);
        expect_channel(gamma->grad, 1, false, what);
        /* the unfused chain, on the same input, gives the same output */
        fr_tensor *rm2 = make(dev, 1, FR_SHAPE(2), zeros, false), *rv2 = make(dev, 1, FR_SHAPE(2), ones, false);
        fr_tensor *scale = mode == FR_BNACT_INPLACE_ABN ? fr_abn_scale(gamma, 1e-5f) : fr_retain(gamma);
        fr_tensor *z = scale ? fr_batch_norm(x, scale, beta, rm2, rv2, true, 0.1f, 1e-5f) : NULL;
        fr_tensor *u = !z ? NULL : act == FR_ACT_RELU ? fr_relu(z) : fr_leaky_relu(z, slope);
        float *plain = host(u);
        CHECK(fused && plain);
        for (int i = 0; fused && plain && i < 16; i++)
            if (isnan(fused[i]) != isnan(plain[i]) || (!isnan(fused[i]) && fused[i] != plain[i])) {
                fprintf(stderr, "    %s: fused %g, separate ops %g at %d\n", what, (double)fused[i],
                        (double)plain[i], i);
                fr_t_failed_now = 1;
                break;
            }
        free(fused);
        free(plain);
        fr_tape_clear();
        fr_release(u);
        fr_release(z);
        fr_release(scale);
        fr_release(rm2);
        fr_release(rv2);
    }
    fr_release(loss);
    fr_release(y);
    fr_release(xin);
    fr_tensor *all[] = {x, gamma, beta, rm, rv};
    for (int i = 0; i < 5; i++)
        fr_release(all[i]);
}

static void test_bn_act_nan(void) {
    for (int d = 0; d < n_devices(); d++) {
        bn_act_case(devices[d], FR_BNACT_RECOMPUTE, FR_ACT_RELU, 0.0f);
        bn_act_case(devices[d], FR_BNACT_KEEP, FR_ACT_RELU, 0.0f);
        bn_act_case(devices[d], FR_BNACT_INPLACE_ABN, FR_ACT_LEAKY_RELU, FR_ABN_SLOPE);
    }
}

static void test_dropout_nan(void) {
    float v[64];
    for (int i = 0; i < 64; i++)
        v[i] = NaN;
    for (int d = 0; d < n_devices(); d++) {
        fr_tensor *x = make(devices[d], 1, FR_SHAPE(64), v, false);
        fr_tensor *y = fr_dropout(x, 0.5f, true);
        CHECK_NOTNULL(y);
        if (y)
            expect_exact(y, v, 64, "dropout of NaN"); /* dropped ones too: NaN * 0 */
        fr_release(y);
        fr_release(x);
    }
}

/* One NaN in a conv weight or a BN buffer: every logit of the eval pass is
 * NaN (a PyTorch copy of the network gives all-NaN logits), and the scan
 * names the tensor. */
static void test_model_with_one_nan(void) {
    const char *names[] = {"layer1.0.conv1.weight", "bn1.running_var"};
    for (int k = 0; k < 2; k++) {
        fr_model *m = fr_resnet_create("resnet8", 3, 10, 1);
        CHECK_NOTNULL(m);
        if (!m)
            return;
        int at = fr_params_find(m->params, names[k]), found = -2;
        CHECK(at >= 0);
        CHECK_OK(fr_params_find_nonfinite(m->params, &found));
        CHECK(found == -1); /* a fresh model is finite */
        fr_data_f32(m->params->items[at].tensor)[5 % fr_numel(m->params->items[at].tensor)] = NaN;
        fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 9);
        fr_no_grad_enter();
        fr_tensor *logits = fr_model_forward(m, x, false);
        fr_no_grad_exit();
        float *h = host(logits);
        CHECK(h != NULL);
        for (int i = 0; h && i < 20; i++)
            if (!isnan(h[i])) {
                fprintf(stderr, "    NaN in %s: logit %d is %g, PyTorch gives NaN\n", names[k], i, (double)h[i]);
                fr_t_failed_now = 1;
                break;
            }
        free(h);
        CHECK_OK(fr_params_find_nonfinite(m->params, &found));
        CHECK(found == at);
        char why[512];
        CHECK(strstr(fr_nonfinite_culprit(m, why, sizeof why), names[k]) != NULL);
        CHECK(strstr(why, k == 0 ? "parameter '" : "buffer '") != NULL);
        fr_release(logits);
        fr_release(x);
        fr_model_free(m);
    }
    /* a finite model: the culprit is the input or an overflow */
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 1);
    char why[512];
    CHECK(m && strstr(fr_nonfinite_culprit(m, why, sizeof why), "every parameter and buffer is finite"));
    fr_model_free(m);
}

int main(void) {
    RUN(test_relu_nan);
    RUN(test_leaky_relu_nan);
    RUN(test_max_pool_nan);
    RUN(test_batch_norm_nan);
    RUN(test_bn_act_nan);
    RUN(test_dropout_nan);
    RUN(test_model_with_one_nan);
    return TEST_SUMMARY();
}
