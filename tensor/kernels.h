/* kernels.h: declarations of the CPU kernels (fr_cpu_*) from kernels.def,
 * the table of the CUDA ones, and FR_CALL_KERNEL, the one place that picks a
 * backend. tensor/ops_*.c check tensors and call kernels; kernels trust their
 * arguments. Internal: not installed (the shape records are in shapes.h). */
#ifndef FR_KERNELS_H
#define FR_KERNELS_H

#include "fr_base.h"
#include "rng.h"
#include "shapes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adam's per-step scalars, rounded to f32 from the double values PyTorch's
 * Python side holds (tensor/ops_optim.c computes them once for both
 * backends). */
typedef struct {
    float beta1, one_minus_beta1;   /* m = beta1 * m + (1 - beta1) * g */
    float beta2, one_minus_beta2;   /* v = beta2 * v + (1 - beta2) * g * g */
    float eps;
    float l2;          /* Adam: g += l2 * w first (0 for AdamW) */
    float decay;       /* AdamW: w *= decay = 1 - lr * wd first (1 for Adam) */
    float step_size;   /* lr / (1 - beta1^t) */
    float bc2_sqrt;    /* sqrt(1 - beta2^t) */
} fr_adam_scalars;

/* Dropout's counter-based uniform in [0, 1) for element i of stream `seed`
 * (element i of the SplitMix64 stream `seed`, tensor/rng.h; 24 bits). Shared by the
 * CPU and CUDA kernels, which is what makes their masks identical. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float fr_dropout_uniform(uint64_t seed, uint64_t i) {
    return (float)(fr_rng_at(seed, i) >> 40) * (1.0f / 16777216.0f);
}

/* Stochastic rounding's uniform in [0, 1) for element j (< 2^32) of group
 * stream `key` (kernels.def: compress_pack): MurmurHash3's 32-bit
 * finaliser, 24 bits. 32-bit arithmetic, so the CPU's loop over a group
 * vectorises (AVX2 and AVX-512 have 32-bit lane multiplies; a 64-bit
 * counter made packing 3x slower than the copy it replaces). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float fr_compress_uniform(uint32_t key, uint32_t j) {
    uint32_t h = key ^ (j * 0x9E3779B9u);
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return (float)(int32_t)(h >> 8) * (1.0f / 16777216.0f);
}

/* The key of group g of a tensor packed under `seed` (tensor/rng.h's
 * stream), so every group of every packed tensor draws its own stream. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline uint32_t fr_compress_key(uint64_t seed, uint64_t g) {
    return (uint32_t)(fr_rng_at(seed, g) >> 32);
}

/* The stream whose element j is element off + j of stream `seed`:
 * fr_dropout_uniform(fr_dropout_seed_at(seed, off), j) ==
 * fr_dropout_uniform(seed, off + j), so a tensor can be masked block by block
 * (staged half tensors) with the mask of the whole. */
static inline uint64_t fr_dropout_seed_at(uint64_t seed, uint64_t off) {
    return seed + off * FR_RNG_GOLDEN;
}

#define FR_KERNEL(name, params) fr_status fr_cpu_##name params;
#include "kernels.def"
#undef FR_KERNEL

/* fr_cpu_gemm on the calling thread only, with row strides (lda,
 * ldb, ldc) for sub-blocks: for CPU kernels that parallelise over their own
 * work items (cpu/conv_im2col.c runs one per image per thread). */
fr_status fr_cpu_gemm_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                             int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                             float beta);

/* The CUDA kernels, one function pointer per line of kernels.def, filled
 * by name (fr_cuda_<name>) from libfrugal_cuda.so when it is opened
 * (tensor/cuda_backend.c). NULL while no backend is open: then no tensor
 * can live on FR_CUDA. */
typedef struct {
#define FR_KERNEL(name, params) fr_status(*name) params;
#include "kernels.def"
#undef FR_KERNEL
} fr_cuda_kernel_table;
extern const fr_cuda_kernel_table *fr_cuda_kernels;

/* FR_ERR_DEVICE naming the kernel and why no CUDA backend is usable. */
fr_status fr_no_cuda(const char *what);

#ifdef __cplusplus
}
#endif

/* FR_CALL_KERNEL(dev, name, args...) runs fr_cpu_<name>, or the backend's
 * fr_cuda_<name> through the table. */
#define FR_CALL_KERNEL(dev, name, ...)                                                   \
    ((dev) == FR_CUDA ? (fr_cuda_kernels ? fr_cuda_kernels->name(__VA_ARGS__) : fr_no_cuda(#name)) \
                      : fr_cpu_##name(__VA_ARGS__))

#endif
