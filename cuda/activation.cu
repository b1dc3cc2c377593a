/* activation.cu: ReLU and leaky ReLU on the GPU, the same arithmetic as
 * cpu/activation.c (NaN and -0 as PyTorch: relu keeps them, backward passes
 * dy where y is NaN). Backward reads the output y (y > 0 exactly when
 * x > 0), so an inplace forward loses nothing the gradient needs. Each thread
 * reads element i before writing it: y may be x, dx may be dy. */
#include "internal.h"

__global__ void relu_forward_kernel(float *y, const float *x, size_t n) {
    FR_CUDA_FOR(i, n) {
        float v = x[i];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

__global__ void relu_backward_kernel(float *dx, const float *dy, const float *y, size_t n) {
    FR_CUDA_FOR(i, n) dx[i] = y[i] <= 0.0f ? 0.0f : dy[i];
}

__global__ void leaky_relu_forward_kernel(float *y, const float *x, float slope, size_t n) {
    FR_CUDA_FOR(i, n) {
        float v = x[i];
        y[i] = v > 0.0f ? v : v * slope;
    }
}

__global__ void leaky_relu_backward_kernel(float *dx, const float *dy, const float *y, float slope,
                                      size_t n) {
    FR_CUDA_FOR(i, n) {
        float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : g * slope;
    }
}

extern "C" fr_status fr_cuda_relu_forward(float *y, const float *x, size_t n) {
    FR_CUDA_RUN_1D(relu_forward_kernel, n, y, x, n);
}

extern "C" fr_status fr_cuda_relu_backward(float *dx, const float *dy, const float *y, size_t n) {
    FR_CUDA_RUN_1D(relu_backward_kernel, n, dx, dy, y, n);
}

extern "C" fr_status fr_cuda_leaky_relu_forward(float *y, const float *x, float slope, size_t n) {
    FR_CUDA_RUN_1D(leaky_relu_forward_kernel, n, y, x, slope, n);
}

extern "C" fr_status fr_cuda_leaky_relu_backward(float *dx, const float *dy, const float *y, float slope,
                                            size_t n) {
    FR_CUDA_RUN_1D(leaky_relu_backward_kernel, n, dx, dy, y, slope, n);
}
