/* fr_cuda.h: the CUDA backend as the rest of frugal sees it.
 *
 * Built only when nvcc is found (FR_WITH_CUDA defined). Without it, the device
 * management functions below are inline stubs that report "built without
 * CUDA", and no kernel is ever reached (FR_CALL_KERNEL in kernels.h). With it,
 * a machine without a GPU still runs: fr_cuda_device_count() returns 0 and
 * every CUDA tensor creation fails with FR_ERR_DEVICE.
 *
 * Memory: fr_cuda_alloc is a caching allocator (size-binned blocks, splitting,
 * reuse). Freed blocks stay reserved until fr_cuda_empty_cache(); on
 * cudaMalloc failure it empties the cache and retries once before reporting
 * FR_ERR_OOM. One stream (the legacy default stream) carries all work. */
#ifndef FR_CUDA_H
#define FR_CUDA_H

#include "../tensor/fr_base.h"
#ifdef FR_WITH_CUDA
/* The kernel declarations below use kernels.h's shape records; kernels.h
 * includes this header after defining them, and the guards make either
 * include order work. */
#include "../tensor/kernels.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FR_COPY_H2D, FR_COPY_D2H, FR_COPY_D2D } fr_copy_kind;

/* Reports that this build has no CUDA backend; returns FR_ERR_DEVICE. */
static inline fr_status fr_no_cuda(const char *what) {
    return fr_error(FR_ERR_DEVICE, "%s: frugal was built without CUDA (CUDA=0 or no nvcc)", what);
}

#ifdef FR_WITH_CUDA

/* Number of usable GPUs (0 when there is no driver or device). */
int fr_cuda_device_count(void);
/* Caching allocator. *block_bytes receives the size of the block actually
 * held (>= nbytes). NULL + FR_ERR_OOM on failure. */
void *fr_cuda_alloc(size_t nbytes, size_t *block_bytes);
void fr_cuda_free(void *ptr);
void fr_cuda_empty_cache(void);
/* Bytes held from the driver, and cudaMalloc calls since start. */
void fr_cuda_cache_stats(size_t *reserved, size_t *device_mallocs);
fr_status fr_cuda_memcpy(void *dst, const void *src, size_t nbytes, fr_copy_kind kind);
fr_status fr_cuda_synchronize(void);
/* Page-locked host memory for the loader's async copies. */
void *fr_cuda_host_alloc(size_t nbytes);
void fr_cuda_host_free(void *ptr);

#define FR_KERNEL(name, params) fr_status fr_cuda_##name params;
#include "../tensor/kernels.def"
#undef FR_KERNEL

#else /* no CUDA in this build: stubs */

static inline int fr_cuda_device_count(void) { return 0; }
static inline void *fr_cuda_alloc(size_t nbytes, size_t *block_bytes) {
    (void)nbytes;
    (void)block_bytes;
    fr_no_cuda("cuda alloc");
    return NULL;
}
static inline void fr_cuda_free(void *ptr) { (void)ptr; }
static inline void fr_cuda_empty_cache(void) {}
static inline void fr_cuda_cache_stats(size_t *reserved, size_t *device_mallocs) {
    *reserved = 0;
    *device_mallocs = 0;
}
static inline fr_status fr_cuda_memcpy(void *dst, const void *src, size_t nbytes,
                                       fr_copy_kind kind) {
    (void)dst;
    (void)src;
    (void)nbytes;
    (void)kind;
    return fr_no_cuda("cuda memcpy");
}
static inline fr_status fr_cuda_synchronize(void) { return FR_OK; }
static inline void *fr_cuda_host_alloc(size_t nbytes) {
    (void)nbytes;
    return NULL;
}
static inline void fr_cuda_host_free(void *ptr) { (void)ptr; }

#endif

#ifdef __cplusplus
}
#endif
#endif
