/* elementwise.cu: fill, add, mul, scale, axpy, fill_from and sum on the GPU.
 * Each thread reads element i before writing element i, so an output may
 * alias an input. */
#include "internal.h"

__global__ void fill_kernel(float *y, float value, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = value;
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    FR_CUDA_FOR(i, n) out[i] = a[i] + b[i];
}

__global__ void mul_kernel(float *out, const float *a, const float *b, size_t n) {
    FR_CUDA_FOR(i, n) out[i] = a[i] * b[i];
}

__global__ void scale_kernel(float *y, const float *x, float alpha, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = alpha * x[i];
}

__global__ void axpy_kernel(float *y, float alpha, const float *x, size_t n) {
    FR_CUDA_FOR(i, n) y[i] += alpha * x[i];
}

/* src lives on the device, so a backward of sum or mean needs no host round
 * trip to learn its incoming gradient. */
__global__ void fill_from_kernel(float *y, const float *src, float scale, size_t n) {
    float v = scale * src[0];
    FR_CUDA_FOR(i, n) y[i] = v;
}

extern "C" fr_status fr_cuda_fill(float *y, float value, size_t n) {
    FR_CUDA_RUN_1D(fill_kernel, n, y, value, n);
}

extern "C" fr_status fr_cuda_add(float *out, const float *a, const float *b, size_t n) {
    FR_CUDA_RUN_1D(add_kernel, n, out, a, b, n);
}

extern "C" fr_status fr_cuda_mul(float *out, const float *a, const float *b, size_t n) {
    FR_CUDA_RUN_1D(mul_kernel, n, out, a, b, n);
}

extern "C" fr_status fr_cuda_scale(float *y, const float *x, float alpha, size_t n) {
    FR_CUDA_RUN_1D(scale_kernel, n, y, x, alpha, n);
}

extern "C" fr_status fr_cuda_axpy(float *y, float alpha, const float *x, size_t n) {
    FR_CUDA_RUN_1D(axpy_kernel, n, y, alpha, x, n);
}

extern "C" fr_status fr_cuda_fill_from(float *y, const float *src, float scale, size_t n) {
    FR_CUDA_RUN_1D(fill_from_kernel, n, y, src, scale, n);
}

/* ---- sum: two passes, both deterministic. Pass 1: a grid whose size
 * depends only on n; each block sums a fixed set of elements (grid-stride)
 * and reduces them in a fixed tree into partial[block]. Pass 2: one block
 * reduces the partials the same way. Accumulation is in double, like the CPU
 * kernel, so the two agree to float rounding. ---- */

#define SUM_THREADS 256
#define SUM_MAX_BLOCKS 1024

__global__ void sum_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double sh[SUM_THREADS];
    double acc = 0.0;
    FR_CUDA_FOR(i, n) acc += (double)x[i];
    double total = fr_block_sum<double, SUM_THREADS>(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = total;
}

__global__ void sum_final_kernel(float *out, const double *partial, int count) {
    __shared__ double sh[SUM_THREADS];
    double acc = 0.0;
    for (int i = (int)threadIdx.x; i < count; i += SUM_THREADS)
        acc += partial[i];
    double total = fr_block_sum<double, SUM_THREADS>(acc, sh);
    if (threadIdx.x == 0)
        out[0] = (float)total;
}

static fr_status launch_sum(float *out, double *partial, int blocks, const float *x, size_t n) {
    sum_partial_kernel<<<blocks, SUM_THREADS>>>(partial, x, n);
    FR_CUDA_LAUNCH_CHECK();
    sum_final_kernel<<<1, SUM_THREADS>>>(out, partial, blocks);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_sum(float *out, const float *x, size_t n) {
    if (n == 0)
        return fr_cuda_fill(out, 0.0f, 1);
    size_t want = (n + SUM_THREADS - 1) / SUM_THREADS;
    int blocks = want > SUM_MAX_BLOCKS ? SUM_MAX_BLOCKS : (int)want;
    size_t ws_bytes = (size_t)blocks * sizeof(double);
    double *partial = (double *)fr_mem_alloc(FR_CUDA, ws_bytes, FR_TAG_WORKSPACE); // (blocks)
    if (!partial)
        return fr_last_status();
    fr_status st = launch_sum(out, partial, blocks, x, n);
    /* Freeing before the kernels have run is fine: the block is only handed
     * out again to work enqueued after them on the same stream. */
    fr_mem_free(FR_CUDA, partial, ws_bytes, FR_TAG_WORKSPACE);
    return st;
}
