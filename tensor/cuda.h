/* cuda.h: the GPU as a program sees it, whatever the build.
 *
 * These are real functions of the core library in every build. The CUDA
 * kernels live in a separate shared object, libfrugal_cuda.so, that the core
 * opens with dlopen() the first time anything asks for the GPU
 * (tensor/cuda_backend.c), so one build runs on machines with and without
 * CUDA and a CPU program never maps cuDNN, cuBLAS or the CUDA runtime. When
 * the backend cannot be used, fr_cuda_device_count() is 0,
 * fr_cuda_unavailable_reason() says why (no NVIDIA driver, no device, the
 * backend file missing or not loadable, a build without CUDA), and creating
 * a CUDA tensor fails with FR_ERR_DEVICE and that reason.
 *
 * The backend is looked for, in order, at $FR_CUDA_BACKEND (a path), beside
 * the library or program that holds the core (and in ../lib from there), and
 * through the dynamic loader's search path (LD_LIBRARY_PATH, the core's
 * RUNPATH). FR_CUDA=0 in the environment keeps it closed.
 *
 * Memory: the backend's allocator caches (size-binned blocks, splitting,
 * reuse) within the CPU cache's bound (tensor/cache_policy.h: reserved
 * within 115% of the ledger's peak, a --memory-limit capping it); freed
 * blocks otherwise stay reserved until fr_cuda_empty_cache(). One stream
 * (the legacy default stream) carries all work. Convolution runs in cuDNN
 * when it can, else as im2col + cuBLAS; FR_CUDNN=0 in the environment starts
 * the process with cuDNN off, fr_cuda_set_cudnn switches at run time.
 *
 * Without a usable backend the calls below are harmless: counts are 0,
 * setters do nothing, copies and events fail with FR_ERR_DEVICE. */
#ifndef FR_CUDA_API_H
#define FR_CUDA_API_H

#include "fr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FR_COPY_H2D, FR_COPY_D2H, FR_COPY_D2D } fr_copy_kind;
typedef struct fr_cuda_event fr_cuda_event; /* see fr_cuda_event_new */

/* Number of usable GPUs (0 when there is no driver, device or backend). The
 * first call opens the backend. */
int fr_cuda_device_count(void);
/* Why fr_cuda_device_count() is 0, in one sentence ("" when a GPU is
 * usable). The pointer stays valid for the life of the process. */
const char *fr_cuda_unavailable_reason(void);

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

#ifdef __cplusplus
}
#endif
#endif
