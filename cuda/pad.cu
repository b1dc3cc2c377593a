/* pad.cu: zero and reflect padding on the GPU (kernels.def; cpu/pad.c is
 * the twin, tensor/pad_math.h the shared index rules). Backward gathers,
 * one thread per input element. */
#include "internal.h"
#include "../tensor/pad_math.h"

__global__ void pad2d_forward_kernel(float *y, const float *x, fr_pad_shape s, size_t n) {
    int oh = s.top + s.h + s.bottom, ow = s.left + s.w + s.right;
    FR_CUDA_FOR(i, n) {
        long long p = (long long)i / ((long long)oh * ow);
        int r = (int)((long long)i / ow % oh), c = (int)((long long)i % ow);
        int sr = fr_pad_source(r, s.h, s.top, s.mode), sc = fr_pad_source(c, s.w, s.left, s.mode);
        y[i] = sr < 0 || sc < 0 ? 0.0f : x[(p * s.h + sr) * s.w + sc];
    }
}

__global__ void pad2d_backward_kernel(float *dx, const float *dy, fr_pad_shape s, size_t n) {
    int oh = s.top + s.h + s.bottom, ow = s.left + s.w + s.right;
    FR_CUDA_FOR(e, n) {
        long long p = (long long)e / ((long long)s.h * s.w);
        int i = (int)((long long)e / s.w % s.h), j = (int)((long long)e % s.w);
        int rows[3], cols[3];
        int nr = fr_pad_readers(i, s.h, s.top, s.bottom, s.mode, rows);
        int nc = fr_pad_readers(j, s.w, s.left, s.right, s.mode, cols);
        float g = 0.0f;
        for (int a = 0; a < nr; a++)
            for (int b = 0; b < nc; b++)
                g += dy[(p * oh + rows[a]) * ow + cols[b]];
        dx[e] = g;
    }
}

extern "C" fr_status fr_cuda_pad2d_forward(float *y, const float *x, const fr_pad_shape *s) {
    size_t n = (size_t)s->planes * (size_t)(s->top + s->h + s->bottom) *
               (size_t)(s->left + s->w + s->right);
    FR_CUDA_RUN_1D(pad2d_forward_kernel, n, y, x, *s, n);
}

extern "C" fr_status fr_cuda_pad2d_backward(float *dx, const float *dy, const fr_pad_shape *s) {
    size_t n = (size_t)s->planes * (size_t)s->h * (size_t)s->w;
    FR_CUDA_RUN_1D(pad2d_backward_kernel, n, dx, dy, *s, n);
}
