/* softmax.cu: softmax and log-softmax over the middle dim of (outer, dim,
 * inner) on the GPU (kernels.def; cpu/softmax.c is the twin,
 * tensor/softmax_math.h the shared row arithmetic: one thread per row,
 * sums in double). */
#include "internal.h"
#include "../tensor/softmax_math.h"

__global__ void softmax_forward_kernel(float *y, const float *x, long long inner, int dim,
                                       bool log_out, size_t rows) {
    FR_CUDA_FOR(r, rows) {
        long long off = ((long long)r / inner) * dim * inner + (long long)r % inner;
        fr_softmax_row(y + off, x + off, dim, inner, log_out);
    }
}

__global__ void softmax_backward_kernel(float *dx, const float *dy, const float *y, long long inner,
                                        int dim, bool log_out, size_t rows) {
    FR_CUDA_FOR(r, rows) {
        long long off = ((long long)r / inner) * dim * inner + (long long)r % inner;
        fr_softmax_row_backward(dx + off, dy + off, y + off, dim, inner, log_out);
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
