/* softmax.cu: softmax and log-softmax over the middle dim of (outer, dim,
 * inner) on the GPU (kernels.def; cpu/softmax.c is the twin, with the same
 * order of operations: one thread per row, sums in double). */
#include "internal.h"

__global__ void softmax_forward_kernel(float *y, const float *x, long long inner, int dim,
                                       bool log_out, size_t rows) {
    FR_CUDA_FOR(r, rows) {
        long long off = ((long long)r / inner) * dim * inner + (long long)r % inner;
        const float *xr = x + off;
        float *yr = y + off;
        float mx = -INFINITY;
        for (int k = 0; k < dim; k++)
            mx = fmaxf(mx, xr[k * inner]);
        double sum = 0.0;
        for (int k = 0; k < dim; k++)
            sum += exp((double)xr[k * inner] - mx);
        double lse = log(sum);
        for (int k = 0; k < dim; k++) {
            double z = (double)xr[k * inner] - mx;
            yr[k * inner] = (float)(log_out ? z - lse : exp(z) / sum);
        }
    }
}

__global__ void softmax_backward_kernel(float *dx, const float *dy, const float *y, long long inner,
                                        int dim, bool log_out, size_t rows) {
    FR_CUDA_FOR(r, rows) {
        long long off = ((long long)r / inner) * dim * inner + (long long)r % inner;
        double dot = 0.0;
        for (int k = 0; k < dim; k++)
            dot += log_out ? (double)dy[off + k * inner] : (double)dy[off + k * inner] * y[off + k * inner];
        for (int k = 0; k < dim; k++) {
            double g = dy[off + k * inner], v = y[off + k * inner];
            dx[off + k * inner] = (float)(log_out ? g - exp(v) * dot : v * (g - dot));
        }
    }
}

extern "C" fr_status fr_cuda_softmax_forward(float *y, const float *x, long long outer, int dim,
                                             long long inner, bool log_out) {
    size_t rows = (size_t)(outer * inner);
    FR_CUDA_RUN_1D(softmax_forward_kernel, rows, y, x, inner, dim, log_out, rows);
}

extern "C" fr_status fr_cuda_softmax_backward(float *dx, const float *dy, const float *y,
                                              long long outer, int dim, long long inner,
                                              bool log_out) {
    size_t rows = (size_t)(outer * inner);
    FR_CUDA_RUN_1D(softmax_backward_kernel, rows, dx, dy, y, inner, dim, log_out, rows);
}
