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

#define FR_KERNEL(name, params) fr_status fr_cpu_##name params;
#include "kernels.def"
#undef FR_KERNEL

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
