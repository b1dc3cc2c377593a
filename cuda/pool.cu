/* pool.cu: max, average and global average pooling on the GPU. x (N,C,H,W),
 * y (N,C,OH,OW).
 *
 * Forward: one thread per output. Backward: one thread per INPUT element,
 * gathering from the output windows that contain it in increasing (oh, ow)
 * order, which is the order in which the CPU kernel scatters into it: no
 * atomics, deterministic, and the same float sums as the CPU. Max-pool picks
 * the first maximum of a window (a NaN counts as a maximum, as in PyTorch),
 * and its backward finds that argmax again from x, so no index tensor is
 * kept. Windows are clipped to the input, so padding never wins a max;
 * average pooling divides by the full window (padding counted, PyTorch's
 * default; with floor-mode sizes no window reaches past the padded border). */
#include "internal.h"

/* The clipped window of output position o along one axis: [*a, *b). */
__device__ inline void window(int o, int size, int kernel, int stride, int pad, int *a, int *b) {
    int start = o * stride - pad;
    *a = start < 0 ? 0 : start;
    *b = start + kernel > size ? size : start + kernel;
}

/* The flat (ih * W + iw) index of the window's maximum in the (H, W) plane
 * xp: the first maximum in row-major order, a NaN counting as a maximum
 * (the CPU kernel's and PyTorch's rule). */
__device__ inline int window_argmax(const float *xp, fr_pool_shape s, int oh, int ow) {
    int h0, h1, w0, w1;
    window(oh, s.h, s.kernel, s.stride, s.pad, &h0, &h1);
    window(ow, s.w, s.kernel, s.stride, s.pad, &w0, &w1);
    int best_at = h0 * s.w + w0;
    float best = -INFINITY;
    for (int ih = h0; ih < h1; ih++)
        for (int iw = w0; iw < w1; iw++) {
            float v = xp[ih * s.w + iw];
            if (v > best || isnan(v)) {
                best = v;
                best_at = ih * s.w + iw;
            }
        }
    return best_at;
}

/* The range [lo, hi) of output positions along one axis whose windows contain
 * input position i: o*stride - pad <= i < o*stride - pad + kernel. */
__device__ inline void windows_of(int i, int stride, int pad, int kernel, int out, int *lo, int *hi) {
    int a = i + pad - kernel + 1; /* smallest o*stride allowed */
    *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    int b = (i + pad) / stride + 1; /* i + pad >= 0 always */
    *hi = b < out ? b : out;
}

__global__ void max_pool2d_forward_kernel(float *y, const float *x, fr_pool_shape s, size_t total) {
    size_t ohw = (size_t)s.oh * s.ow, hw = (size_t)s.h * s.w;
    FR_CUDA_FOR(i, total) {
        size_t plane = i / ohw, o = i % ohw;
        int oh = (int)(o / (size_t)s.ow), ow = (int)(o % (size_t)s.ow);
        const float *xp = x + plane * hw;
        y[i] = xp[window_argmax(xp, s, oh, ow)];
    }
}

__global__ void max_pool2d_backward_kernel(float *dx, const float *dy, const float *x, fr_pool_shape s,
                                   size_t total) {
    size_t ohw = (size_t)s.oh * s.ow, hw = (size_t)s.h * s.w;
    FR_CUDA_FOR(i, total) {
        size_t plane = i / hw;
        int at = (int)(i % hw), ih = at / s.w, iw = at % s.w;
        const float *xp = x + plane * hw;
        const float *dyp = dy + plane * ohw;
        int oh0, oh1, ow0, ow1;
        windows_of(ih, s.stride, s.pad, s.kernel, s.oh, &oh0, &oh1);
        windows_of(iw, s.stride, s.pad, s.kernel, s.ow, &ow0, &ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh < oh1; oh++)
            for (int ow = ow0; ow < ow1; ow++)
                if (window_argmax(xp, s, oh, ow) == at)
                    acc += dyp[oh * s.ow + ow];
        dx[i] = acc;
    }
}

/* Sums in the CPU kernel's order and divides like it, so both agree
 * exactly. */
__global__ void avg_pool2d_forward_kernel(float *y, const float *x, fr_pool_shape s, size_t total) {
    size_t ohw = (size_t)s.oh * s.ow, hw = (size_t)s.h * s.w;
    float area = (float)(s.kernel * s.kernel);
    FR_CUDA_FOR(i, total) {
        size_t plane = i / ohw, o = i % ohw;
        int oh = (int)(o / (size_t)s.ow), ow = (int)(o % (size_t)s.ow);
        const float *xp = x + plane * hw;
        int h0, h1, w0, w1;
        window(oh, s.h, s.kernel, s.stride, s.pad, &h0, &h1);
        window(ow, s.w, s.kernel, s.stride, s.pad, &w0, &w1);
        float acc = 0.0f;
        for (int ih = h0; ih < h1; ih++)
            for (int iw = w0; iw < w1; iw++)
                acc += xp[ih * s.w + iw];
        y[i] = acc / area;
    }
}

__global__ void avg_pool2d_backward_kernel(float *dx, const float *dy, fr_pool_shape s, size_t total) {
    size_t ohw = (size_t)s.oh * s.ow, hw = (size_t)s.h * s.w;
    float area = (float)(s.kernel * s.kernel);
    FR_CUDA_FOR(i, total) {
        size_t plane = i / hw;
        int at = (int)(i % hw), ih = at / s.w, iw = at % s.w;
        const float *dyp = dy + plane * ohw;
        int oh0, oh1, ow0, ow1;
        windows_of(ih, s.stride, s.pad, s.kernel, s.oh, &oh0, &oh1);
        windows_of(iw, s.stride, s.pad, s.kernel, s.ow, &ow0, &ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh < oh1; oh++)
            for (int ow = ow0; ow < ow1; ow++)
                acc += dyp[oh * s.ow + ow] / area;
        dx[i] = acc;
    }
}

extern "C" fr_status fr_cuda_max_pool2d_forward(float *y, const float *x, const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->oh * s->ow;
    FR_CUDA_RUN_1D(max_pool2d_forward_kernel, total, y, x, *s, total);
}

extern "C" fr_status fr_cuda_max_pool2d_backward(float *dx, const float *dy, const float *x,
                                         const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->h * s->w;
    FR_CUDA_RUN_1D(max_pool2d_backward_kernel, total, dx, dy, x, *s, total);
}

extern "C" fr_status fr_cuda_avg_pool2d_forward(float *y, const float *x, const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->oh * s->ow;
    FR_CUDA_RUN_1D(avg_pool2d_forward_kernel, total, y, x, *s, total);
}

extern "C" fr_status fr_cuda_avg_pool2d_backward(float *dx, const float *dy, const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->h * s->w;
    FR_CUDA_RUN_1D(avg_pool2d_backward_kernel, total, dx, dy, *s, total);
}

/* ---- global average: y(NC) = mean of x(NC, HW), one block per row ---- */

#define GAP_THREADS 128

/* In double, like the CPU kernel. */
__global__ void global_avg_pool_forward_kernel(float *y, const float *x, int hw) {
    __shared__ double sh[GAP_THREADS];
    const float *row = x + (size_t)blockIdx.x * (size_t)hw;
    double acc = 0.0;
    for (int j = (int)threadIdx.x; j < hw; j += GAP_THREADS)
        acc += (double)row[j];
    double total = fr_block_sum<double, GAP_THREADS>(acc, sh);
    if (threadIdx.x == 0)
        y[blockIdx.x] = hw > 0 ? (float)(total / hw) : 0.0f;
}

__global__ void global_avg_pool_backward_kernel(float *dx, const float *dy, size_t hw, size_t total) {
    FR_CUDA_FOR(i, total) dx[i] = dy[i / hw] / (float)hw;
}

extern "C" fr_status fr_cuda_global_avg_pool_forward(float *y, const float *x, int nc, int hw) {
    if (nc <= 0)
        return FR_OK;
    global_avg_pool_forward_kernel<<<nc, GAP_THREADS>>>(y, x, hw);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_global_avg_pool_backward(float *dx, const float *dy, int nc, int hw) {
    size_t total = (size_t)nc * (size_t)hw;
    FR_CUDA_RUN_1D(global_avg_pool_backward_kernel, total, dx, dy, (size_t)hw, total);
}

/* ---- adaptive average pooling (cpu/pool.c has the windows) ---- */

__device__ inline int adaptive_start(int o, int in, int out) { return (int)((long long)o * in / out); }
__device__ inline int adaptive_end(int o, int in, int out) {
    return (int)(((long long)(o + 1) * in + out - 1) / out);
}

__global__ void adaptive_avg_pool2d_forward_kernel(float *y, const float *x, fr_pool_shape s,
                                                   size_t total) {
    FR_CUDA_FOR(i, total) {
        int ow = (int)(i % (size_t)s.ow), oh = (int)(i / (size_t)s.ow % (size_t)s.oh);
        const float *xp = x + i / ((size_t)s.oh * s.ow) * (size_t)s.h * s.w; // (H, W)
        int h0 = adaptive_start(oh, s.h, s.oh), h1 = adaptive_end(oh, s.h, s.oh);
        int w0 = adaptive_start(ow, s.w, s.ow), w1 = adaptive_end(ow, s.w, s.ow);
        float sum = 0.0f;
        for (int ih = h0; ih < h1; ih++)
            for (int iw = w0; iw < w1; iw++)
                sum += xp[(size_t)ih * s.w + iw];
        y[i] = sum / (float)((h1 - h0) * (w1 - w0));
    }
}

/* One thread per input, gathering from the windows that hold it in (oh,
 * ow) order, as the CPU kernel scatters. */
__global__ void adaptive_avg_pool2d_backward_kernel(float *dx, const float *dy, fr_pool_shape s,
                                                    size_t total) {
    FR_CUDA_FOR(i, total) {
        int iw = (int)(i % (size_t)s.w), ih = (int)(i / (size_t)s.w % (size_t)s.h);
        const float *g = dy + i / ((size_t)s.h * s.w) * (size_t)s.oh * s.ow; // (OH, OW)
        float acc = 0.0f;
        for (int oh = 0; oh < s.oh; oh++) {
            int h0 = adaptive_start(oh, s.h, s.oh), h1 = adaptive_end(oh, s.h, s.oh);
            if (ih < h0 || ih >= h1)
                continue;
            for (int ow = 0; ow < s.ow; ow++) {
                int w0 = adaptive_start(ow, s.w, s.ow), w1 = adaptive_end(ow, s.w, s.ow);
                if (iw >= w0 && iw < w1)
                    acc += g[(size_t)oh * s.ow + ow] / (float)((h1 - h0) * (w1 - w0));
            }
        }
        dx[i] = acc;
    }
}

extern "C" fr_status fr_cuda_adaptive_avg_pool2d_forward(float *y, const float *x,
                                                         const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->oh * s->ow;
    FR_CUDA_RUN_1D(adaptive_avg_pool2d_forward_kernel, total, y, x, *s, total);
}

extern "C" fr_status fr_cuda_adaptive_avg_pool2d_backward(float *dx, const float *dy,
                                                          const fr_pool_shape *s) {
    size_t total = (size_t)s->n * s->c * s->h * s->w;
    FR_CUDA_RUN_1D(adaptive_avg_pool2d_backward_kernel, total, dx, dy, *s, total);
}
