/* clamp.cu: clamp forward and backward on the GPU (kernels.def;
 * cpu/clamp.c is the twin). */
#include "internal.h"

__global__ void clamp_forward_kernel(float *y, const float *x, float lo, float hi, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}

__global__ void clamp_backward_kernel(float *dx, const float *dy, const float *x, float lo,
                                      float hi, size_t n) {
    FR_CUDA_FOR(i, n) dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
}

extern "C" fr_status fr_cuda_clamp_forward(float *y, const float *x, float lo, float hi, size_t n) {
    FR_CUDA_RUN_1D(clamp_forward_kernel, n, y, x, lo, hi, n);
}

extern "C" fr_status fr_cuda_clamp_backward(float *dx, const float *dy, const float *x, float lo,
                                            float hi, size_t n) {
    FR_CUDA_RUN_1D(clamp_backward_kernel, n, dx, dy, x, lo, hi, n);
}
