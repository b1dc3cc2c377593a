/* amp.cu: the gradient checks of dynamic loss scaling on the GPU, with the
 * same results as cpu/amp.c. */
#include "internal.h"

/* Each block counts its elements' inf / NaN in an integer, reduces in a
 * fixed tree, and adds its total to the one counter with a single atomic.
 * The counter holds whole numbers, so float addition of them is exact (below
 * 2^24) in any order: the result does not depend on scheduling. Blocks that
 * found nothing skip the atomic, so the clean case costs no contention. */
__global__ void nonfinite_count_kernel(float *count, const float *x, size_t n) {
    __shared__ unsigned int sh[FR_CUDA_THREADS];
    unsigned int found = 0;
    FR_CUDA_FOR(i, n) found += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    unsigned int total = fr_block_sum<unsigned int, FR_CUDA_THREADS>(found, sh);
    if (threadIdx.x == 0 && total)
        atomicAdd(count, (float)total);
}

__global__ void unscale_kernel(float *y, float inv_scale, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = __fmul_rn(y[i], inv_scale);
}

extern "C" fr_status fr_cuda_nonfinite_count(float *count, const float *x, size_t n) {
    FR_CUDA_RUN_1D(nonfinite_count_kernel, n, count, x, n);
}

extern "C" fr_status fr_cuda_unscale(float *y, float inv_scale, size_t n) {
    FR_CUDA_RUN_1D(unscale_kernel, n, y, inv_scale, n);
}
