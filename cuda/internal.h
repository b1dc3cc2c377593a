/* internal.h: what the cuda/ *.cu files share and nobody else sees: the
 * cuBLAS and cuDNN handles, a row-major GEMM, the cuDNN convolutions, launch
 * shapes and a deterministic block reduction. Only .cu files include this
 * header. */
#ifndef FR_CUDA_INTERNAL_H
#define FR_CUDA_INTERNAL_H

#include "fr_cuda.h"
#include "../tensor/memory.h"
#include "check.h"

/* Binds the calling thread to the GPU fr_cuda_select_device chose (once per
 * thread; nothing before a choice). Entry points another thread may call
 * first (allocation, copies, events, pinned memory) call it: the device is
 * per thread in CUDA, frugal's handles and cache per process (device.cu). */
cudaError_t fr_cuda_bind_thread(void);

/* The process-wide cuBLAS handle, created on first use (thread-safe). cuBLAS
 * forbids two threads using one handle at the same time; in frugal only the
 * training thread runs GEMMs (the loader thread only allocates and copies). */
fr_status fr_cuda_blas(cublasHandle_t *out);

/* The process-wide cuDNN handle, on the legacy default stream, created on
 * first use. FR_ERR_CUDA when cuDNN cannot be initialised; the failure is
 * remembered, so later calls fail at once (callers then use their fallback).
 * Same one-thread-at-a-time rule as cuBLAS. */
fr_status fr_cuda_cudnn(cudnnHandle_t *out);

/* Convolutions through cuDNN (conv_cudnn.cu), arguments as in kernels.def.
 * *ran = false with FR_OK means cuDNN is off, unavailable, or cannot do this
 * shape within the workspace budget: the caller runs im2col instead. Every
 * call is counted for fr_cuda_conv_counts either way. */
fr_status fr_cudnn_conv2d_forward(float *y, const float *x, const float *w, const fr_conv_shape *s,
                              bool *ran);
fr_status fr_cudnn_conv2d_backward_data(float *dx, const float *dy, const float *w,
                                   const fr_conv_shape *s, bool *ran);
fr_status fr_cudnn_conv2d_backward_weight(float *dw, const float *dy, const float *x,
                                     const fr_conv_shape *s, bool *ran);

/* Row-major, strided-batched: for b < batch,
 *   C_b(M,N) = alpha * op(A_b) op(B_b) + beta * C_b
 * with X_b = X + b * stride_x (a stride of 0 shares one matrix across the
 * batch). op(A) is (M,K), A stored (K,M) when trans_a; likewise B. */
fr_status fr_cuda_gemm_rm(float *c, long long stride_c, const float *a, long long stride_a,
                          const float *b, long long stride_b, int m, int n, int k, bool trans_a,
                          bool trans_b, float alpha, float beta, int batch);

/* Launch shape for n independent elements handled by a grid-stride loop: the
 * grid is capped, the loop covers the rest. Callers return early when n == 0
 * (a grid of 0 blocks is a launch error). */
#define FR_CUDA_THREADS 256
#define FR_CUDA_MAX_BLOCKS 65535u
static inline unsigned fr_cuda_grid(size_t n) {
    size_t blocks = (n + FR_CUDA_THREADS - 1) / FR_CUDA_THREADS;
    return blocks > FR_CUDA_MAX_BLOCKS ? FR_CUDA_MAX_BLOCKS : (unsigned)blocks;
}

/* for (size_t i = <this thread's first>; i < n; i += <threads in the grid>) */
/* The body of a launcher of an elementwise kernel over n items: nothing to
 * do for n == 0 (a zero-block grid is a launch error), else one grid-stride
 * launch, checked. Returns from the enclosing function. */
#define FR_CUDA_RUN_1D(kernel, n, ...)                                 \
    do {                                                               \
        if ((n) == 0)                                                  \
            return FR_OK;                                              \
        kernel<<<fr_cuda_grid(n), FR_CUDA_THREADS>>>(__VA_ARGS__);     \
        FR_CUDA_LAUNCH_CHECK();                                        \
        return FR_OK;                                                  \
    } while (0)

#define FR_CUDA_FOR(i, n)                                                           \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); \
         i += (size_t)gridDim.x * blockDim.x)

#ifdef __CUDACC__
/* Sum of v over the block, returned to every thread. THREADS must equal
 * blockDim.x and be a power of two; sh holds THREADS values. The tree adds in
 * a fixed order, so the result does not depend on scheduling (runs are
 * bit-for-bit repeatable). Every thread of the block must call it. */
template <typename T, int THREADS>
__device__ inline T fr_block_sum(T v, T *sh) {
    static_assert((THREADS & (THREADS - 1)) == 0, "THREADS must be a power of two");
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            sh[threadIdx.x] += sh[threadIdx.x + half];
        __syncthreads();
    }
    T total = sh[0];
    __syncthreads(); /* sh may be reused by the caller right away */
    return total;
}

/* Maximum over the block, same rules as fr_block_sum. */
template <int THREADS>
__device__ inline float fr_block_max(float v, float *sh) {
    static_assert((THREADS & (THREADS - 1)) == 0, "THREADS must be a power of two");
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + half]);
        __syncthreads();
    }
    float m = sh[0];
    __syncthreads();
    return m;
}
#endif

#endif
