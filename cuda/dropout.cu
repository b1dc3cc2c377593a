/* dropout.cu: dropout kernels on the GPU, drawing the same counter-based
 * mask as cpu/dropout.c (fr_dropout_uniform in kernels.h). */
#include "internal.h"

__global__ void dropout_kernel(float *y, const float *x, float p, float scale, uint64_t seed,
                               size_t n) {
    FR_CUDA_FOR(i, n) y[i] = x[i] * (fr_dropout_uniform(seed, i) >= p ? scale : 0.0f); /* NaN * 0 = NaN */
}

extern "C" fr_status fr_cuda_dropout_forward(float *y, const float *x, float p, uint64_t seed, size_t n) {
    FR_CUDA_RUN_1D(dropout_kernel, n, y, x, p, 1.0f / (1.0f - p), seed, n);
}

extern "C" fr_status fr_cuda_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, size_t n) {
    return fr_cuda_dropout_forward(dx, dy, p, seed, n);
}
