/* test_cuda_conv.c: convolution (grouped, dilated, transposed too) and
 * upsampling / adaptive pooling on the GPU against the CPU kernels, on both
 * CUDA backends: cuDNN (conv_cudnn.cu) and im2col + cuBLAS (conv.cu). Each
 * test runs cuDNN first, then im2col, and restores the setting; when the
 * environment says FR_CUDNN=0 only im2col runs (scripts/device-check.sh runs
 * this program both ways). Also: which backend took a call, the plan cache
 * (a second call of a shape needs no cudaMalloc), the workspace budget, and
 * a memory limit.
 *
 * Forward and dx sum C*R*S products, dw sums N*OH*OW: 1e-4 absolute plus
 * 1e-4 relative (|cuda - cpu| <= atol + rtol * |cpu|), for any algorithm
 * cuDNN may pick (TF32 is off: the descriptors ask for FMA math).
 *
 * Without a GPU (or in a CUDA=0 build) every test skips. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* ---- convolution: forward, dx, dw, db on several geometries; sums of
 * C*R*S (forward, dx) or N*OH*OW (dw) products: 1e-4 ---- */

typedef struct {
    int n, c, h, w, k, r, stride, pad;
    bool bias;
} conv_case;

static void run_conv(conv_case cc, uint32_t seed) {
    fr_conv_params p = {.stride = cc.stride, .pad = cc.pad};
    fr_t_pair x = PR_RAND(seed, cc.n, cc.c, cc.h, cc.w), w = PR_RAND(seed + 1, cc.k, cc.c, cc.r, cc.r);
    fr_t_pair b = cc.bias ? PR_RAND(seed + 2, cc.k) : (fr_t_pair){NULL, NULL};
    fr_conv_shape s;
    CHECK_OK(fr_conv2d_shape(x.c, w.c, p, &s));
    fr_t_pair y = PR_EMPTY(cc.n, cc.k, s.oh, s.ow), dy = PR_RAND(seed + 3, cc.n, cc.k, s.oh, s.ow);
    fr_t_pair dx = PR_EMPTY(cc.n, cc.c, cc.h, cc.w), dw = PR_EMPTY(cc.k, cc.c, cc.r, cc.r);
    fr_t_pair db = cc.bias ? PR_EMPTY(cc.k) : (fr_t_pair){NULL, NULL};
    char what[96];
    snprintf(what, sizeof what, "conv n%d c%d %dx%d k%d r%d s%d p%d", cc.n, cc.c, cc.h, cc.w, cc.k,
             cc.r, cc.stride, cc.pad);
    CHECK_OK(fr_conv2d_forward(y.c, x.c, w.c, b.c, p));
    CHECK_OK(fr_conv2d_forward(y.g, x.g, w.g, b.g, p));
    fr_t_pair_check(y, 1e-4, 1e-4, what);
    CHECK_OK(fr_conv2d_backward(dx.c, dw.c, db.c, dy.c, x.c, w.c, p));
    CHECK_OK(fr_conv2d_backward(dx.g, dw.g, db.g, dy.g, x.g, w.g, p));
    fr_t_pair_check(dx, 1e-4, 1e-4, "conv dx");
    fr_t_pair_check(dw, 1e-4, 1e-4, "conv dw");
    if (cc.bias)
        fr_t_pair_check(db, 1e-5, 1e-5, "conv db");
    fr_t_pair *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static const conv_case conv_cases[] = {
    {2, 3, 9, 9, 4, 3, 1, 1, true},   /* 3x3 same */
    {3, 5, 8, 7, 6, 3, 2, 1, false},  /* stride 2, odd width */
    {2, 4, 6, 6, 5, 1, 1, 0, true},   /* pointwise: no column matrix */
    {2, 4, 7, 7, 3, 1, 2, 0, false},  /* 1x1 stride 2 (projection shortcut) */
    {2, 3, 10, 10, 4, 5, 1, 2, true}, /* 5x5 */
    {1, 2, 5, 5, 3, 3, 3, 0, false},  /* stride 3, pixels no window reads */
    {4, 16, 8, 8, 8, 3, 1, 1, false}, /* wider channels */
};

/* The backends to try: cuDNN then im2col, or im2col alone when FR_CUDNN=0
 * turned cuDNN off for the process. Each test restores the setting. */
static int conv_backends(bool *cudnn_first) {
    *cudnn_first = fr_cuda_cudnn_enabled();
    return *cudnn_first ? 2 : 1;
}
static const char *backend_name(void) { return fr_cuda_cudnn_enabled() ? "cudnn" : "im2col"; }

static void test_conv(void) {
    NEED_CUDA();
    bool cudnn;
    int backends = conv_backends(&cudnn);
    for (int b = 0; b < backends; b++) {
        fr_cuda_set_cudnn(cudnn && b == 0);
        for (size_t i = 0; i < sizeof conv_cases / sizeof *conv_cases; i++)
            run_conv(conv_cases[i], 100 + 10 * (uint32_t)i);
    }
    fr_cuda_set_cudnn(cudnn);
}

/* Which backend ran: a plain 3x3 convolution (all three directions) goes to
 * cuDNN when it is on, to im2col when it is off; a second run of the same
 * shape reuses the cached plan (no cudaMalloc, no workspace left over, the
 * peak within the budget). */
static void test_conv_backend_choice(void) {
    NEED_CUDA();
    bool cudnn;
    int backends = conv_backends(&cudnn);
    conv_case cc = {4, 16, 8, 8, 8, 3, 1, 1, false};
    for (int b = 0; b < backends; b++) {
        bool on = cudnn && b == 0;
        fr_cuda_set_cudnn(on);
        size_t dnn0, col0, dnn1, col1, dnn2, col2;
        fr_cuda_conv_counts(&dnn0, &col0);
        run_conv(cc, 1500);
        fr_cuda_conv_counts(&dnn1, &col1);
        if (on)
            CHECK(dnn1 == dnn0 + 3 && col1 == col0); /* cuDNN took fwd, data and filter */
        else
            CHECK(dnn1 == dnn0 && col1 == col0 + 3);
        fr_mem_stats before, after;
        fr_mem_get_stats(FR_CUDA, &before);
        fr_mem_reset_peak();
        run_conv(cc, 1510);
        fr_mem_get_stats(FR_CUDA, &after);
        fr_cuda_conv_counts(&dnn2, &col2);
        CHECK(dnn2 - dnn1 == dnn1 - dnn0 && col2 - col1 == col1 - col0);
        CHECK(after.device_mallocs == before.device_mallocs);
        CHECK(after.current[FR_TAG_WORKSPACE] == 0);
        if (after.peak[FR_TAG_WORKSPACE] > fr_cuda_workspace_budget()) {
            fprintf(stderr, "    %s: workspace peak %zu over the budget\n", backend_name(),
                    after.peak[FR_TAG_WORKSPACE]);
            fr_t_failed_now = 1;
        }
    }
    fr_cuda_set_cudnn(cudnn);
}

/* A workspace budget of 256 KiB: each backend stays under it (im2col's one
 * image of columns is 160 KiB here) and the results do not change. The
 * default budget is restored, which makes cuDNN choose its algorithms again. */
static void test_conv_workspace_budget(void) {
    NEED_CUDA();
    bool cudnn;
    int backends = conv_backends(&cudnn);
    size_t old = fr_cuda_workspace_budget(), small = (size_t)256 << 10;
    CHECK(old == (size_t)256 << 20); /* the documented default */
    fr_cuda_set_workspace_budget(small);
    CHECK(fr_cuda_workspace_budget() == small);
    conv_case cc = {8, 16, 16, 16, 16, 3, 1, 1, false};
    for (int b = 0; b < backends; b++) {
        fr_cuda_set_cudnn(cudnn && b == 0);
        fr_mem_reset_peak();
        run_conv(cc, 1600);
        size_t peak = fr_mem_peak(FR_CUDA, FR_TAG_WORKSPACE);
        if (peak > small) {
            fprintf(stderr, "    %s: workspace peak %zu over a budget of %zu\n", backend_name(),
                    peak, small);
            fr_t_failed_now = 1;
        }
    }
    fr_cuda_set_workspace_budget(old);
    fr_cuda_set_cudnn(cudnn);
}

/* A memory limit that leaves room for ~2 images of column matrix: im2col's
 * workspace shrinks chunk by chunk, cuDNN picks an algorithm needing less
 * (or hands over to im2col), and the results stay the same. Each backend
 * gets its own geometry (channel counts), so cuDNN meets this shape for the
 * first time under the limit. */
static void conv_under_limit(bool cudnn, int ch) {
    fr_cuda_set_cudnn(cudnn);
    fr_conv_params p = {.stride = 1, .pad = 1};
    fr_t_pair x = PR_RAND(200, 8, ch, 16, 16), w = PR_RAND(201, ch, ch, 3, 3);
    fr_t_pair dy = PR_RAND(202, 8, ch, 16, 16), y = PR_EMPTY(8, ch, 16, 16);
    fr_t_pair dx = PR_EMPTY(8, ch, 16, 16), dw = PR_EMPTY(ch, ch, 3, 3);
    CHECK_OK(fr_conv2d_forward(y.c, x.c, w.c, NULL, p));
    CHECK_OK(fr_conv2d_backward(dx.c, dw.c, NULL, dy.c, x.c, w.c, p));
    size_t per_image = (size_t)(ch * 9 + ch) * 16 * 16 * sizeof(float); /* bwd_weight's, the largest */
    fr_mem_reset_peak();
    fr_mem_set_limit(FR_CUDA, fr_mem_total_current(FR_CUDA) + 2 * per_image + 1024);
    CHECK_OK(fr_conv2d_forward(y.g, x.g, w.g, NULL, p));
    CHECK_OK(fr_conv2d_backward(dx.g, dw.g, NULL, dy.g, x.g, w.g, p));
    fr_mem_set_limit(FR_CUDA, 0);
    CHECK(fr_mem_current(FR_CUDA, FR_TAG_WORKSPACE) == 0);
    if (!cudnn) /* im2col always needs columns; cuDNN may need none */
        CHECK(fr_mem_peak(FR_CUDA, FR_TAG_WORKSPACE) > 0);
    CHECK(fr_mem_peak(FR_CUDA, FR_TAG_WORKSPACE) <= 2 * per_image + 1024);
    fr_t_pair_check(y, 1e-4, 1e-4, cudnn ? "conv y (cudnn, limit)" : "conv y (chunked)");
    fr_t_pair_check(dx, 1e-4, 1e-4, cudnn ? "conv dx (cudnn, limit)" : "conv dx (chunked)");
    fr_t_pair_check(dw, 1e-4, 1e-4, cudnn ? "conv dw (cudnn, limit)" : "conv dw (chunked)");
    fr_t_pair *all[] = {&x, &w, &dy, &y, &dx, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_conv_under_memory_limit(void) {
    NEED_CUDA();
    bool cudnn;
    int backends = conv_backends(&cudnn);
    conv_under_limit(false, 8);
    if (backends == 2)
        conv_under_limit(true, 12);
    fr_cuda_set_cudnn(cudnn);
}

/* ---- grouped, dilated and transposed convolutions, upsampling and
 * adaptive pooling: the same pairs. A grouped shape runs on cuDNN only
 * (conv.cu refuses it), so the im2col backend takes the ungrouped ones. ---- */

typedef struct {
    int n, c, h, w, k, r, stride, pad, output_pad, groups, dilation;
    bool transposed;
} ext_case;

static void run_ext(ext_case e, uint32_t seed) {
    fr_conv_params p = {.stride = e.stride, .pad = e.pad, .groups = e.groups, .dilation = e.dilation};
    fr_conv_transpose_params tp = {.stride = e.stride, .pad = e.pad, .output_pad = e.output_pad,
                                   .groups = e.groups, .dilation = e.dilation};
    int g = e.groups ? e.groups : 1;
    fr_t_pair x = PR_RAND(seed, e.n, e.c, e.h, e.w);
    fr_t_pair w = e.transposed ? PR_RAND(seed + 1, e.c, e.k / g, e.r, e.r)
                               : PR_RAND(seed + 1, e.k, e.c / g, e.r, e.r);
    fr_t_pair b = PR_RAND(seed + 2, e.k);
    fr_conv_shape s;
    int oh, ow;
    if (e.transposed) {
        CHECK_OK(fr_conv_transpose2d_shape(x.c, w.c, tp, &s));
        oh = s.h, ow = s.w;
    } else {
        CHECK_OK(fr_conv2d_shape(x.c, w.c, p, &s));
        oh = s.oh, ow = s.ow;
    }
    fr_t_pair y = PR_EMPTY(e.n, e.k, oh, ow), dy = PR_RAND(seed + 3, e.n, e.k, oh, ow);
    fr_t_pair dx = PR_EMPTY(e.n, e.c, e.h, e.w);
    fr_t_pair dw = e.transposed ? PR_EMPTY(e.c, e.k / g, e.r, e.r) : PR_EMPTY(e.k, e.c / g, e.r, e.r);
    fr_t_pair db = PR_EMPTY(e.k);
    if (e.transposed) {
        CHECK_OK(fr_conv_transpose2d_forward(y.c, x.c, w.c, b.c, tp));
        CHECK_OK(fr_conv_transpose2d_forward(y.g, x.g, w.g, b.g, tp));
        CHECK_OK(fr_conv_transpose2d_backward(dx.c, dw.c, db.c, dy.c, x.c, w.c, tp));
        CHECK_OK(fr_conv_transpose2d_backward(dx.g, dw.g, db.g, dy.g, x.g, w.g, tp));
    } else {
        CHECK_OK(fr_conv2d_forward(y.c, x.c, w.c, b.c, p));
        CHECK_OK(fr_conv2d_forward(y.g, x.g, w.g, b.g, p));
        CHECK_OK(fr_conv2d_backward(dx.c, dw.c, db.c, dy.c, x.c, w.c, p));
        CHECK_OK(fr_conv2d_backward(dx.g, dw.g, db.g, dy.g, x.g, w.g, p));
    }
    fr_t_pair_check(y, 1e-4, 1e-4, e.transposed ? "conv_transpose y" : "grouped/dilated conv y");
    fr_t_pair_check(dx, 1e-4, 1e-4, "dx");
    fr_t_pair_check(dw, 1e-4, 1e-4, "dw");
    fr_t_pair_check(db, 1e-5, 1e-5, "db");
    fr_t_pair *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

static void test_conv_grouped_dilated_transposed(void) {
    NEED_CUDA();
    static const ext_case cases[] = {
        {2, 8, 9, 9, 8, 3, 1, 1, 0, 8, 1, false},  /* depthwise */
        {2, 6, 9, 8, 6, 3, 2, 1, 0, 6, 1, false},  /* depthwise stride 2 */
        {2, 4, 8, 8, 6, 3, 1, 1, 0, 2, 1, false},  /* two groups */
        {2, 3, 9, 9, 4, 3, 1, 2, 0, 1, 2, false},  /* dilated */
        {2, 8, 4, 4, 4, 4, 2, 1, 0, 1, 1, true},   /* DCGAN 4x4/2 */
        {2, 3, 5, 4, 2, 3, 2, 1, 1, 1, 1, true},   /* output_pad */
        {2, 4, 5, 5, 6, 3, 1, 1, 0, 2, 1, true},   /* grouped transposed */
    };
    bool cudnn;
    int backends = conv_backends(&cudnn);
    for (int bk = 0; bk < backends; bk++) {
        fr_cuda_set_cudnn(cudnn && bk == 0);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            if (fr_cuda_cudnn_enabled() || cases[i].groups <= 1)
                run_ext(cases[i], 300 + 10 * (uint32_t)i);
    }
    fr_cuda_set_cudnn(cudnn);
}

static void test_upsample_and_adaptive_pool(void) {
    NEED_CUDA();
    for (int mode = 0; mode < 3; mode++) {
        fr_upsample_opts o = {.scale = mode == 0 ? 3 : 2,
                              .mode = mode ? FR_UPSAMPLE_BILINEAR : FR_UPSAMPLE_NEAREST,
                              .align_corners = mode == 2};
        fr_t_pair x = PR_RAND(400 + (uint32_t)mode, 2, 3, 5, 4), dx = PR_EMPTY(2, 3, 5, 4);
        fr_t_pair y = PR_EMPTY(2, 3, 5 * o.scale, 4 * o.scale);
        fr_t_pair dy = PR_RAND(410 + (uint32_t)mode, 2, 3, 5 * o.scale, 4 * o.scale);
        CHECK_OK(fr_upsample_forward(y.c, x.c, o));
        CHECK_OK(fr_upsample_forward(y.g, x.g, o));
        CHECK_OK(fr_upsample_backward(dx.c, dy.c, o));
        CHECK_OK(fr_upsample_backward(dx.g, dy.g, o));
        /* the same products in the same order (nvcc may fuse some into FMAs) */
        fr_t_pair_check(y, 1e-5, 1e-5, "upsample y");
        fr_t_pair_check(dx, 1e-5, 1e-5, "upsample dx");
        fr_t_pair *all[] = {&x, &dx, &y, &dy};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            fr_t_pair_free(all[i]);
    }
    fr_t_pair x = PR_RAND(420, 2, 3, 7, 6), dx = PR_EMPTY(2, 3, 7, 6);
    fr_t_pair y = PR_EMPTY(2, 3, 3, 4), dy = PR_RAND(421, 2, 3, 3, 4);
    CHECK_OK(fr_adaptive_avg_pool2d_forward(y.c, x.c));
    CHECK_OK(fr_adaptive_avg_pool2d_forward(y.g, x.g));
    CHECK_OK(fr_adaptive_avg_pool2d_backward(dx.c, dy.c));
    CHECK_OK(fr_adaptive_avg_pool2d_backward(dx.g, dy.g));
    fr_t_pair_check(y, 1e-5, 1e-5, "adaptive_avg_pool2d y");
    fr_t_pair_check(dx, 1e-5, 1e-5, "adaptive_avg_pool2d dx");
    fr_t_pair *all[] = {&x, &dx, &y, &dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_t_pair_free(all[i]);
}

int main(void) {
    RUN(test_conv);
    RUN(test_conv_backend_choice);
    RUN(test_conv_workspace_budget);
    RUN(test_conv_under_memory_limit);
    RUN(test_conv_grouped_dilated_transposed);
    RUN(test_upsample_and_adaptive_pool);
    return TEST_SUMMARY();
}
