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
 * FR_ERR_OOM, whose message ends with the ledger's CUDA report (what frugal
 * holds, by tag). One stream (the legacy default stream) carries all work.
 *
 * Convolution runs in cuDNN when a handle can be created and cuDNN supports
 * the shape, else as im2col + cuBLAS (cuda/conv.cu). The environment
 * variable FR_CUDNN=0 starts the process with cuDNN off, so the two paths
 * can be compared; fr_cuda_set_cudnn switches at run time. */
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
typedef struct fr_cuda_event fr_cuda_event; /* see fr_cuda_event_new */

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
/* Page-locked host memory for the loader's async copies. Not counted by the
 * ledger (it is host memory the driver pins, not a tensor's bytes). */
void *fr_cuda_host_alloc(size_t nbytes);
void fr_cuda_host_free(void *ptr);
/* A copy enqueued on the one stream; the host does not wait, and kernels
 * enqueued later run after it. The host side should be pinned
 * (fr_cuda_host_alloc), else the driver copies synchronously. A host source
 * must not change, and a host destination must not be read, until the copy
 * has run: record an event after it and wait for that event first. */
fr_status fr_cuda_memcpy_async(void *dst, const void *src, size_t nbytes, fr_copy_kind kind);

/* A marker in the stream: recorded after some work, waited on by the host
 * (any thread) until that work, and everything enqueued before it, has run.
 * Waiting on an event never recorded returns at once. The waiting thread
 * sleeps rather than spins. NULL with an error when it cannot be created. */
fr_cuda_event *fr_cuda_event_new(void);
fr_status fr_cuda_event_record(fr_cuda_event *e);
fr_status fr_cuda_event_wait(fr_cuda_event *e);
void fr_cuda_event_free(fr_cuda_event *e);

/* Convolution backend switch (see the top of this file). */
void fr_cuda_set_cudnn(bool enabled);
bool fr_cuda_cudnn_enabled(void);
/* The most scratch one convolution may take: cuDNN picks among algorithms
 * needing at most this much, and im2col's column buffer stays under it (and
 * under 32 MiB) except that it always holds one image's columns. Default
 * 256 MiB. Changing it makes cuDNN choose its algorithms again. */
void fr_cuda_set_workspace_budget(size_t bytes);
size_t fr_cuda_workspace_budget(void);
/* Convolution calls (all three directions) run by cuDNN and by im2col since
 * the start of the process. */
void fr_cuda_conv_counts(size_t *cudnn_calls, size_t *im2col_calls);

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
static inline fr_status fr_cuda_memcpy_async(void *dst, const void *src, size_t nbytes,
                                             fr_copy_kind kind) {
    (void)dst;
    (void)src;
    (void)nbytes;
    (void)kind;
    return fr_no_cuda("cuda memcpy async");
}

static inline fr_cuda_event *fr_cuda_event_new(void) {
    fr_no_cuda("cuda event");
    return NULL;
}
static inline fr_status fr_cuda_event_record(fr_cuda_event *e) {
    (void)e;
    return fr_no_cuda("cuda event record");
}
static inline fr_status fr_cuda_event_wait(fr_cuda_event *e) {
    (void)e;
    return FR_OK;
}
static inline void fr_cuda_event_free(fr_cuda_event *e) { (void)e; }

static inline void fr_cuda_set_cudnn(bool enabled) { (void)enabled; }
static inline bool fr_cuda_cudnn_enabled(void) { return false; }
static inline void fr_cuda_set_workspace_budget(size_t bytes) { (void)bytes; }
static inline size_t fr_cuda_workspace_budget(void) { return 0; }
static inline void fr_cuda_conv_counts(size_t *cudnn_calls, size_t *im2col_calls) {
    *cudnn_calls = 0;
    *im2col_calls = 0;
}

#endif

#ifdef __cplusplus
}
#endif
#endif
