/* kernels.h: declarations of the CPU kernels (fr_cpu_*) from kernels.def, the
 * shape records they take, and FR_CALL_KERNEL, the one place that picks a
 * backend. tensor/ops_*.c check tensors and call kernels; kernels trust their
 * arguments. */
#ifndef FR_KERNELS_H
#define FR_KERNELS_H

#include "fr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n, c, h, w;   /* input (N,C,H,W) */
    int k, r, s;      /* weight (K,C,R,S) */
    int oh, ow;       /* output (N,K,OH,OW) */
    int stride, pad;  /* same along both axes */
} fr_conv_shape;

typedef struct {
    int n, c, h, w;    /* input */
    int oh, ow;        /* output */
    int kernel, stride, pad;
} fr_pool_shape;

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

#define FR_KERNEL(name, params) fr_status fr_cpu_##name params;
#include "kernels.def"
#undef FR_KERNEL

/* fr_cpu_gemm on the calling thread only, with row strides (lda, ldb, ldc)
 * for sub-blocks: for CPU kernels that parallelise over their own work items
 * (cpu_conv.c runs one per image per thread). */
fr_status fr_cpu_gemm_serial(float *c, int ldc, const float *a, int lda, const float *b, int ldb,
                             int m, int n, int k, bool trans_a, bool trans_b, float alpha,
                             float beta);

#ifdef __cplusplus
}
#endif

#include "../cuda/fr_cuda.h"

/* FR_CALL_KERNEL(dev, name, args...) runs fr_cpu_<name> or fr_cuda_<name>. In
 * a build without CUDA no tensor can live on FR_CUDA, so that branch only
 * reports the missing backend. */
#ifdef FR_WITH_CUDA
#define FR_CALL_KERNEL(dev, name, ...) \
    ((dev) == FR_CUDA ? fr_cuda_##name(__VA_ARGS__) : fr_cpu_##name(__VA_ARGS__))
#else
#define FR_CALL_KERNEL(dev, name, ...) \
    ((dev) == FR_CUDA ? fr_no_cuda(#name) : fr_cpu_##name(__VA_ARGS__))
#endif

#endif
