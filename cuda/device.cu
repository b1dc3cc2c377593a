/* device.cu: device discovery, copies, events, synchronisation, pinned host
 * memory and the shared cuBLAS and cuDNN handles. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* ---- discovery ---- */

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int device_count;

static void count_devices(void) {
    int n = 0;
    /* No driver, a driver older than the runtime, or no device all come back
     * as errors here; each simply means "no GPU" to frugal. The error is
     * cleared so it does not resurface in a later check. */
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    device_count = n;
}

extern "C" int fr_cuda_device_count(void) {
    pthread_once(&count_once, count_devices);
    return device_count;
}

/* ---- what the core's loader checks (tensor/cuda_backend.c) ---- */

extern "C" const int fr_cuda_backend_abi = FR_CUDA_BACKEND_ABI;

/* Every kernel's name and parameter list, as the core computes it. */
#define FR_KERNEL(name, params) #name #params "\n"
extern "C" const char fr_cuda_backend_kernels[] =
#include "../tensor/kernels.def"
    "";
#undef FR_KERNEL

extern "C" int fr_cuda_backend_probe(char *why, size_t len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        snprintf(why, len, "the driver reports no GPU (CUDA_VISIBLE_DEVICES?)");
    return n;
}

/* The device a process uses is per thread in CUDA (cudaSetDevice), while
 * frugal's handles and caching allocator are per process: one process, one
 * GPU. So the device chosen here is remembered, and every entry point that
 * another thread may call first (the loader thread allocates, pins, copies
 * and waits on events) binds its thread to it once. Before any choice (one
 * GPU, no data parallelism) nothing is bound: device 0, CUDA's default. */
static int selected_device = -1;
static __thread int bound_device = -1;

cudaError_t fr_cuda_bind_thread(void) {
    int want = __atomic_load_n(&selected_device, __ATOMIC_ACQUIRE);
    if (want < 0 || bound_device == want)
        return cudaSuccess;
    cudaError_t e = cudaSetDevice(want);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return e;
    }
    bound_device = want;
    return cudaSuccess;
}

extern "C" fr_status fr_cuda_select_device(int local_rank, int *chosen) {
    int n = fr_cuda_device_count();
    if (n <= 0)
        return fr_error(FR_ERR_DEVICE, "cuda: no GPU for local rank %d", local_rank);
    int dev = (local_rank < 0 ? 0 : local_rank) % n;
    FR_CUDA_CHECK(cudaSetDevice(dev));
    bound_device = dev;
    __atomic_store_n(&selected_device, dev, __ATOMIC_RELEASE);
    *chosen = dev;
    return FR_OK;
}

/* ---- copies and synchronisation ---- */

/* A device-to-device copy on the one stream, also when the two ranges
 * overlap (cudaMemcpyAsync leaves that undefined; fr_cuda_memcpy promises
 * memmove's result like the CPU side). Overlapping ranges `shift` bytes
 * apart are copied in pieces of `shift` bytes, from the end that is not
 * overwritten first: each piece's source and destination are disjoint, and
 * the stream runs the pieces in order, so a piece only overwrites source
 * bytes an earlier piece has already copied. When that would take more
 * than 64 pieces, the bytes go through a scratch block instead. */
#define MAX_SHIFT_PIECES 64

static fr_status copy_d2d(void *dst, const void *src, size_t nbytes) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    if (d == s)
        return FR_OK;
    size_t shift = d < s ? (size_t)(s - d) : (size_t)(d - s);
    if (shift >= nbytes) {
        FR_CUDA_CHECK(cudaMemcpyAsync(d, s, nbytes, cudaMemcpyDeviceToDevice, 0));
        return FR_OK;
    }
    if ((nbytes + shift - 1) / shift <= MAX_SHIFT_PIECES) {
        for (size_t done = 0; done < nbytes; done += shift) {
            size_t len = nbytes - done < shift ? nbytes - done : shift;
            /* forwards when moving down, backwards when moving up */
            size_t at = d < s ? done : nbytes - done - len;
            FR_CUDA_CHECK(cudaMemcpyAsync(d + at, s + at, len, cudaMemcpyDeviceToDevice, 0));
        }
        return FR_OK;
    }
    /* Freed right after the second copy is enqueued: the allocator's blocks
     * are reused only by work enqueued later on the same stream. */
    void *tmp = fr_mem_alloc(FR_CUDA, nbytes, FR_TAG_WORKSPACE);
    if (!tmp)
        return fr_last_status();
    cudaError_t e = cudaMemcpyAsync(tmp, s, nbytes, cudaMemcpyDeviceToDevice, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d, tmp, nbytes, cudaMemcpyDeviceToDevice, 0);
    fr_mem_free(FR_CUDA, tmp, nbytes, FR_TAG_WORKSPACE);
    FR_CUDA_CHECK(e);
    return FR_OK;
}

extern "C" fr_status fr_cuda_memcpy(void *dst, const void *src, size_t nbytes, fr_copy_kind kind) {
    if (nbytes == 0)
        return FR_OK;
    FR_CUDA_CHECK(fr_cuda_bind_thread());
    switch (kind) {
    case FR_COPY_H2D:
        /* Synchronous, so the caller may reuse or free the host buffer as soon
         * as this returns, whether it is pageable or pinned. */
        FR_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
        return FR_OK;
    case FR_COPY_D2H:
        /* Waits for the kernels that produce src: the one host sync. */
        FR_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
        return FR_OK;
    case FR_COPY_D2D:
        /* Ordered on the one stream like a kernel; the host does not wait. */
        return copy_d2d(dst, src, nbytes);
    }
    return fr_error(FR_ERR_ARG, "cuda memcpy: unknown copy kind %d", (int)kind);
}

extern "C" fr_status fr_cuda_memcpy_async(void *dst, const void *src, size_t nbytes,
                                          fr_copy_kind kind) {
    if (nbytes == 0)
        return FR_OK;
    FR_CUDA_CHECK(fr_cuda_bind_thread());
    cudaMemcpyKind k;
    switch (kind) {
    case FR_COPY_H2D:
        k = cudaMemcpyHostToDevice;
        break;
    case FR_COPY_D2H:
        k = cudaMemcpyDeviceToHost;
        break;
    case FR_COPY_D2D:
        return copy_d2d(dst, src, nbytes);
    default:
        return fr_error(FR_ERR_ARG, "cuda memcpy async: unknown copy kind %d", (int)kind);
    }
    FR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, 0));
    return FR_OK;
}

extern "C" fr_status fr_cuda_synchronize(void) {
    FR_CUDA_CHECK(fr_cuda_bind_thread());
    FR_CUDA_CHECK(cudaDeviceSynchronize());
    return FR_OK;
}

/* ---- pinned host memory ---- */

extern "C" void *fr_cuda_host_alloc(size_t nbytes) {
    void *p = NULL;
    cudaError_t e = fr_cuda_bind_thread();
    if (e == cudaSuccess)
        e = cudaMallocHost(&p, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fr_error(FR_ERR_OOM, "cuda host alloc: cannot pin %zu bytes: %s", nbytes,
                 cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

extern "C" void fr_cuda_host_free(void *ptr) {
    if (!ptr)
        return;
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess) {
        /* Nothing can be returned from here; the message is kept for whoever
         * looks, and the runtime's error is cleared. */
        (void)cudaGetLastError();
        fr_error(FR_ERR_CUDA, "cuda host free: %s", cudaGetErrorString(e));
    }
}

/* ---- events ---- */

struct fr_cuda_event {
    cudaEvent_t ev;
};

extern "C" fr_cuda_event *fr_cuda_event_new(void) {
    fr_cuda_event *e = (fr_cuda_event *)calloc(1, sizeof *e);
    if (!e) {
        fr_error(FR_ERR_OOM, "cuda event: out of host memory");
        return NULL;
    }
    /* No timing (cheaper to record); blocking sync, so a thread that waits
     * (the loader's) sleeps instead of taking a core from the CPU kernels. */
    cudaError_t err = fr_cuda_bind_thread();
    if (err == cudaSuccess)
        err = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming | cudaEventBlockingSync);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        fr_error(FR_ERR_CUDA, "cuda event: cudaEventCreateWithFlags: %s", cudaGetErrorString(err));
        free(e);
        return NULL;
    }
    return e;
}

extern "C" fr_status fr_cuda_event_record(fr_cuda_event *e) {
    FR_CUDA_CHECK(fr_cuda_bind_thread());
    FR_CUDA_CHECK(cudaEventRecord(e->ev, 0));
    return FR_OK;
}

extern "C" fr_status fr_cuda_event_wait(fr_cuda_event *e) {
    FR_CUDA_CHECK(cudaEventSynchronize(e->ev));
    return FR_OK;
}

extern "C" void fr_cuda_event_free(fr_cuda_event *e) {
    if (!e)
        return;
    if (cudaEventDestroy(e->ev) != cudaSuccess)
        (void)cudaGetLastError(); /* nothing to report to: the event is gone either way */
    free(e);
}

/* ---- cuBLAS ---- */

/* cuBLAS is given its scratch from frugal's caching allocator instead of
 * allocating its own behind our back, so it shows in the reserved bytes.
 * The sizes are what cuBLAS's documentation recommends (cublasSetWorkspace):
 * 32 MiB on Hopper (compute capability 9) and later, 4 MiB before; less can
 * make cuBLAS pick slower kernels. */
#define BLAS_WORKSPACE ((size_t)4 << 20)
#define BLAS_WORKSPACE_HOPPER ((size_t)32 << 20)

static size_t blas_workspace_bytes(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* the handle's own calls report a broken device */
        return BLAS_WORKSPACE;
    }
    return major >= 9 ? BLAS_WORKSPACE_HOPPER : BLAS_WORKSPACE;
}

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t blas_handle;

/* With blas_lock held. */
static fr_status create_blas_handle(cublasHandle_t *out) {
    cublasHandle_t h = NULL;
    FR_CUBLAS_CHECK(cublasCreate(&h));
    /* Plain FP32 arithmetic, never TF32: results must match the CPU path
     * (and PyTorch, whose matmul default has no TF32 either). */
    fr_status st = FR_OK;
    cublasStatus_t bs = cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(h, 0);
    size_t block = 0;
    void *ws = NULL;
    if (bs == CUBLAS_STATUS_SUCCESS) {
        ws = fr_cuda_alloc(blas_workspace_bytes(), FR_CACHE_NO_LEDGER, 0, &block);
        if (!ws)
            st = fr_last_status();
        else
            bs = cublasSetWorkspace(h, ws, block);
    }
    if (bs != CUBLAS_STATUS_SUCCESS)
        st = fr_error(FR_ERR_CUDA, "%s:%d: configuring the cuBLAS handle: %s", __FILE__,
                      __LINE__, cublasGetStatusString(bs));
    if (st != FR_OK) {
        (void)cublasDestroy(h);
        fr_cuda_free(ws);
        return st;
    }
    *out = h;
    return FR_OK;
}

fr_status fr_cuda_blas(cublasHandle_t *out) {
    pthread_mutex_lock(&blas_lock);
    fr_status st = FR_OK;
    if (!blas_handle)
        st = create_blas_handle(&blas_handle);
    *out = blas_handle;
    pthread_mutex_unlock(&blas_lock);
    return st;
}

/* ---- cuDNN ---- */

static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t dnn_handle;
static bool dnn_failed;

/* With dnn_lock held. */
static fr_status create_dnn_handle(cudnnHandle_t *out) {
    cudnnHandle_t h = NULL;
    FR_CUDNN_CHECK(cudnnCreate(&h));
    cudnnStatus_t st = cudnnSetStream(h, 0);
    if (st != CUDNN_STATUS_SUCCESS) {
        (void)cudnnDestroy(h); /* the error worth reporting is the one below */
        return fr_error(FR_ERR_CUDA, "%s:%d: cudnnSetStream(h, 0): %s", __FILE__, __LINE__,
                        cudnnGetErrorString(st));
    }
    *out = h;
    return FR_OK;
}

fr_status fr_cuda_cudnn(cudnnHandle_t *out) {
    pthread_mutex_lock(&dnn_lock);
    fr_status st = FR_OK;
    if (dnn_failed)
        st = fr_error(FR_ERR_CUDA, "cudnn: the handle could not be created earlier");
    else if (!dnn_handle && (st = create_dnn_handle(&dnn_handle)) != FR_OK)
        dnn_failed = true; /* a library or driver problem: do not retry per call */
    *out = dnn_handle;
    pthread_mutex_unlock(&dnn_lock);
    return st;
}
