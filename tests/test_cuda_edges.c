/* test_cuda_edges.c: what a first GPU run must catch and the other CUDA
 * tests do not reach: kernels over more than 65535 x 256 elements (the
 * capped grid's loop takes a second pass) and over 2^31 elements when the
 * device has the memory (64-bit indices); convolutions on buffers that are
 * not 16-byte aligned (views at an odd offset: cuDNN is skipped for them,
 * im2col must still agree with the CPU); one convolution shape at several
 * batch sizes (one cuDNN plan for all); device-to-device copies between
 * overlapping ranges (memmove's result); and whole training steps of a
 * ResNet-8 (forward, cross-entropy, backward, SGD with momentum) on the GPU
 * against the same steps on the CPU.
 *
 * Tolerances as in test_cuda.c: exact where both sides round the same
 * operations; 1e-4 absolute plus relative where sums run in another order.
 *
 * Without a GPU (or in a CUDA=0 build) every test skips. */
#include <stdlib.h>
#include <string.h>

#include "train/optim.h"
#include "models/resnet.h"
#include "testlib.h"

/* ---- beyond the capped grid ---- */

/* 65535 blocks x 256 threads = 16,776,960: 20M elements need a second pass
 * of the grid-stride loop. Elementwise ops exact, the sum close. */
static void test_kernels_past_capped_grid(void) {
    NEED_CUDA();
    const int64_t n = 20000000;
    fr_t_pair x = PR_RAND(31, n), y = PR_RAND(32, n);
    fr_t_pair z = PR_EMPTY(n);
    CHECK_OK(fr_add_out(z.c, x.c, y.c));
    CHECK_OK(fr_add_out(z.g, x.g, y.g));
    fr_t_pair_check(z, 0, 0, "add, 20M");
    CHECK_OK(fr_relu_forward(z.c, x.c));
    CHECK_OK(fr_relu_forward(z.g, x.g));
    fr_t_pair_check(z, 0, 0, "relu, 20M");
    CHECK_OK(fr_scale_out(z.c, x.c, 0.5f));
    CHECK_OK(fr_scale_out(z.g, x.g, 0.5f));
    fr_t_pair_check(z, 0, 0, "scale, 20M");
    fr_t_pair s = PR_EMPTY(1);
    CHECK_OK(fr_sum_out(s.c, x.c));
    CHECK_OK(fr_sum_out(s.g, x.g));
    fr_t_pair_check(s, 1e-2, 1e-4, "sum, 20M");
    fr_tensor *h = fr_to_dtype(x.g, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *hc = fr_to_dtype(x.c, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *hh = h ? fr_to_device(h, FR_CPU, FR_TAG_TRANSIENT) : NULL;
    CHECK_NOTNULL(hh);
    if (hh && hc)
        CHECK(memcmp(fr_data(hh), fr_data(hc), (size_t)n * 2) == 0);
    fr_release(hh);
    fr_release(hc);
    fr_release(h);
    fr_t_pair *all[] = {&x, &y, &z, &s};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

/* 2^31 + 4099 elements (8 GiB of f32): fill, relu and scale reach the last
 * ones (a 32-bit index would wrap and write elsewhere). Skipped when the
 * device cannot hold two such tensors. */
static void test_kernels_past_2_31(void) {
    NEED_CUDA();
    const int64_t n = ((int64_t)1 << 31) + 4099;
    fr_tensor *x = fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(n), FR_TAG_TRANSIENT);
    fr_tensor *y = x ? fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(n), FR_TAG_TRANSIENT) : NULL;
    if (!y) {
        fr_release(x);
        fr_clear_error();
        SKIP("the device cannot hold 2 x 8 GiB");
    }
    CHECK_OK(fr_fill_(y, 7.0f));
    CHECK_OK(fr_fill_(x, -3.0f));
    CHECK_OK(fr_relu_forward(y, x)); /* every y becomes 0 */
    CHECK_OK(fr_scale_out(x, x, -2.0f)); /* every x becomes 6 */
    const int64_t tail = 8192, starts[] = {0, ((int64_t)1 << 31) - 4096, n - tail};
    float *h = malloc((size_t)tail * sizeof *h);
    for (int k = 0; k < 3; k++) {
        fr_tensor *xv = fr_narrow(x, 0, starts[k], tail), *yv = fr_narrow(y, 0, starts[k], tail);
        int bad = 0;
        if (xv && fr_read_f32(xv, h, (size_t)tail) == FR_OK)
            for (int64_t i = 0; i < tail; i++)
                bad += h[i] != 6.0f;
        else
            bad++;
        if (yv && fr_read_f32(yv, h, (size_t)tail) == FR_OK)
            for (int64_t i = 0; i < tail; i++)
                bad += h[i] != 0.0f;
        else
            bad++;
        if (bad) {
            fprintf(stderr, "    %d wrong values in [%lld, %lld)\n", bad, (long long)starts[k],
                    (long long)(starts[k] + tail));
            fr_t_failed_now = 1;
        }
        fr_release(xv);
        fr_release(yv);
    }
    free(h);
    fr_release(y);
    fr_release(x);
    fr_mem_empty_cache();
}

/* ---- misaligned convolution buffers ---- */

/* src's values in a CUDA view that starts one float into its storage: its
 * data pointer is 4-byte but not 16-byte aligned. */
static fr_tensor *misaligned_copy(const fr_tensor *src) {
    int64_t n = fr_numel(src);
    fr_tensor *flat = fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(n + 1), FR_TAG_DATA);
    fr_tensor *part = flat ? fr_narrow(flat, 0, 1, n) : NULL;
    fr_tensor *v = part ? fr_view(part, src->ndim, src->shape) : NULL;
    fr_release(part);
    fr_release(flat);
    if (v && fr_copy_(v, src) != FR_OK) {
        fr_release(v);
        return NULL;
    }
    return v;
}

static void test_conv_misaligned(void) {
    NEED_CUDA();
    bool cudnn = fr_cuda_cudnn_enabled();
    fr_conv_params p = {1, 1};
    for (int backend = 0; backend < (cudnn ? 2 : 1); backend++) {
        fr_cuda_set_cudnn(cudnn && backend == 0);
        fr_t_pair x = PR_RAND(41, 3, 5, 9, 9), w = PR_RAND(42, 6, 5, 3, 3), b = PR_RAND(43, 6);
        fr_t_pair dy = PR_RAND(44, 3, 6, 9, 9);
        fr_tensor *xg = misaligned_copy(x.c), *wg = misaligned_copy(w.c), *dyg = misaligned_copy(dy.c);
        fr_tensor *yc = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(3, 6, 9, 9), FR_TAG_TRANSIENT);
        fr_tensor *dxc = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(3, 5, 9, 9), FR_TAG_TRANSIENT);
        fr_tensor *dwc = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(6, 5, 3, 3), FR_TAG_TRANSIENT);
        fr_tensor *yg = yc ? misaligned_copy(yc) : NULL, *dxg = dxc ? misaligned_copy(dxc) : NULL;
        fr_tensor *dwg = dwc ? misaligned_copy(dwc) : NULL;
        CHECK(xg && wg && dyg && yg && dxg && dwg);
        if (xg && wg && dyg && yg && dxg && dwg) {
            CHECK(((uintptr_t)fr_data(xg) & 15) != 0);
            CHECK_OK(fr_conv2d_forward(yc, x.c, w.c, b.c, p));
            CHECK_OK(fr_conv2d_forward(yg, xg, wg, b.g, p));
            CHECK(fr_t_allclose_t(yg, yc, 1e-4, 1e-4, "misaligned conv y"));
            CHECK_OK(fr_conv2d_backward(dxc, dwc, NULL, dy.c, x.c, w.c, p));
            CHECK_OK(fr_conv2d_backward(dxg, dwg, NULL, dyg, xg, wg, p));
            CHECK(fr_t_allclose_t(dxg, dxc, 1e-4, 1e-4, "misaligned conv dx"));
            CHECK(fr_t_allclose_t(dwg, dwc, 1e-4, 1e-4, "misaligned conv dw"));
        }
        fr_tensor *all[] = {xg, wg, dyg, yc, dxc, dwc, yg, dxg, dwg};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_release(all[i]);
        fr_t_pair_free(&x);
        fr_t_pair_free(&w);
        fr_t_pair_free(&b);
        fr_t_pair_free(&dy);
    }
    fr_cuda_set_cudnn(cudnn);
}

/* One shape at batches 8, 3 and 8 again (a last, smaller batch, then the
 * next epoch): cuDNN keeps one plan for the shape, re-pointed at each
 * batch, and takes every call; every result agrees with the CPU. */
static void test_conv_batches_share_a_plan(void) {
    NEED_CUDA();
    if (!fr_cuda_cudnn_enabled())
        SKIP("cuDNN is off (FR_CUDNN=0)");
    fr_conv_params p = {1, 1};
    const int batches[] = {8, 3, 8};
    for (int i = 0; i < 3; i++) {
        int n = batches[i];
        fr_t_pair x = PR_RAND(70 + (uint32_t)i, n, 6, 10, 10), w = PR_RAND(80, 7, 6, 3, 3);
        fr_t_pair dy = PR_RAND(90 + (uint32_t)i, n, 7, 10, 10);
        fr_t_pair y = PR_EMPTY(n, 7, 10, 10), dx = PR_EMPTY(n, 6, 10, 10), dw = PR_EMPTY(7, 6, 3, 3);
        size_t dnn0, col0, dnn1, col1;
        fr_cuda_conv_counts(&dnn0, &col0);
        CHECK_OK(fr_conv2d_forward(y.c, x.c, w.c, NULL, p));
        CHECK_OK(fr_conv2d_forward(y.g, x.g, w.g, NULL, p));
        CHECK_OK(fr_conv2d_backward(dx.c, dw.c, NULL, dy.c, x.c, w.c, p));
        CHECK_OK(fr_conv2d_backward(dx.g, dw.g, NULL, dy.g, x.g, w.g, p));
        fr_cuda_conv_counts(&dnn1, &col1);
        CHECK(dnn1 == dnn0 + 3 && col1 == col0);
        fr_t_pair_check(y, 1e-4, 1e-4, "conv y, batch changes");
        fr_t_pair_check(dx, 1e-4, 1e-4, "conv dx, batch changes");
        fr_t_pair_check(dw, 1e-4, 1e-4, "conv dw, batch changes");
        fr_t_pair *all[] = {&x, &w, &dy, &y, &dx, &dw};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            fr_t_pair_free(all[k]);
    }
}

/* ---- overlapping device-to-device copies ---- */

/* Shifts of 4 bytes (many pieces: through scratch), of a quarter (four
 * pieces), up and down, against memmove on the host. */
static void test_overlapping_d2d_copies(void) {
    NEED_CUDA();
    enum { N = 1 << 20 };
    float *h = malloc(N * sizeof *h), *want = malloc(N * sizeof *h), *got = malloc(N * sizeof *h);
    fr_t_fill_rand(h, N, 51);
    float *d = fr_mem_alloc(FR_CUDA, N * sizeof *h, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(d);
    const size_t shifts[] = {1, N / 4, N / 3};
    for (int k = 0; d && k < 3; k++)
        for (int up = 0; up < 2; up++) {
            size_t sh = shifts[k], len = N - sh;
            float *dst = up ? d + sh : d, *src = up ? d : d + sh;
            memcpy(want, h, N * sizeof *h);
            memmove(up ? want + sh : want, up ? want : want + sh, len * sizeof *h);
            CHECK_OK(fr_cuda_memcpy(d, h, N * sizeof *h, FR_COPY_H2D));
            CHECK_OK(fr_cuda_memcpy(dst, src, len * sizeof *h, FR_COPY_D2D));
            CHECK_OK(fr_cuda_memcpy(got, d, N * sizeof *h, FR_COPY_D2H));
            if (memcmp(got, want, N * sizeof *h) != 0) {
                fprintf(stderr, "    overlapping copy, shift %zu %s: wrong\n", sh, up ? "up" : "down");
                fr_t_failed_now = 1;
            }
        }
    fr_mem_free(FR_CUDA, d, N * sizeof *h, FR_TAG_TRANSIENT);
    free(got);
    free(want);
    free(h);
}

/* ---- training steps against the CPU ---- */

/* The same ResNet-8 (same seed), the same batch of 8 16x16 images, three
 * SGD steps with momentum and weight decay on each device: every loss and,
 * at the end, every parameter and running statistic agree. */
static void test_training_steps_match_cpu(void) {
    NEED_CUDA();
    fr_model *m[2] = {fr_resnet_create("resnet8", 3, 10, 7), fr_resnet_create("resnet8", 3, 10, 7)};
    CHECK(m[0] && m[1]);
    if (!m[0] || !m[1]) {
        fr_model_free(m[0]);
        fr_model_free(m[1]);
        return;
    }
    CHECK_OK(fr_params_to_device(m[1]->params, FR_CUDA));
    fr_t_pair x = PR_RAND(61, 8, 3, 16, 16);
    int32_t lab[8] = {0, 1, 2, 3, 4, 5, 6, 9};
    fr_tensor *yc = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA, lab);
    fr_tensor *yg = fr_from_host(FR_CUDA, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA, lab);
    fr_tensor *xs[2] = {x.c, x.g}, *ys[2] = {yc, yg};
    fr_optim *opt[2];
    for (int d = 0; d < 2; d++)
        opt[d] = fr_sgd_new(m[d]->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9,
                                                            .weight_decay = 5e-4});
    for (int step = 0; step < 3 && opt[0] && opt[1]; step++) {
        float loss[2] = {0, 0};
        for (int d = 0; d < 2; d++) {
            fr_tensor *logits = fr_model_forward(m[d], xs[d], true);
            fr_tensor *l = logits ? fr_cross_entropy(logits, ys[d]) : NULL;
            fr_release(logits);
            CHECK_NOTNULL(l);
            if (!l)
                continue;
            CHECK_OK(fr_backward(l));
            CHECK_OK(fr_optim_step(opt[d]));
            fr_optim_zero_grad(opt[d]);
            loss[d] = fr_item(l);
            fr_release(l);
        }
        CHECK_CLOSE(loss[1], loss[0], 1e-4 + 1e-4 * fabs(loss[0]));
    }
    for (int i = 0; i < m[0]->params->count; i++) {
        const fr_tensor *c = m[0]->params->items[i].tensor, *g = m[1]->params->items[i].tensor;
        if (c->dtype != FR_F32)
            continue;
        CHECK(fr_t_allclose_t(g, c, 1e-4, 1e-3, m[0]->params->items[i].name));
    }
    fr_tape_clear();
    for (int d = 0; d < 2; d++) {
        fr_optim_free(opt[d]);
        fr_model_free(m[d]);
    }
    fr_release(yc);
    fr_release(yg);
    fr_t_pair_free(&x);
}

int main(void) {
    RUN(test_kernels_past_capped_grid);
    RUN(test_kernels_past_2_31);
    RUN(test_conv_misaligned);
    RUN(test_conv_batches_share_a_plan);
    RUN(test_overlapping_d2d_copies);
    RUN(test_training_steps_match_cpu);
    return TEST_SUMMARY();
}
