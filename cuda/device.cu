/* device.cu: device discovery, copies, synchronisation, pinned host memory
 * and the shared cuBLAS handle. */
#include <pthread.h>

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

/* ---- copies and synchronisation ---- */

extern "C" fr_status fr_cuda_memcpy(void *dst, const void *src, size_t nbytes, fr_copy_kind kind) {
    if (nbytes == 0)
        return FR_OK;
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
        FR_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, 0));
        return FR_OK;
    }
    return fr_error(FR_ERR_ARG, "cuda memcpy: unknown copy kind %d", (int)kind);
}

extern "C" fr_status fr_cuda_synchronize(void) {
    FR_CUDA_CHECK(cudaDeviceSynchronize());
    return FR_OK;
}

/* ---- pinned host memory ---- */

extern "C" void *fr_cuda_host_alloc(size_t nbytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, nbytes ? nbytes : 1);
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

/* ---- cuBLAS ---- */

/* cuBLAS is given its scratch from frugal's caching allocator instead of
 * allocating its own behind our back, so it shows in the reserved bytes. 4 MiB
 * is what NVIDIA suggests for FP32 GEMM on pre-Hopper parts and is ample for
 * SGEMM on Hopper too. */
#define BLAS_WORKSPACE ((size_t)4 << 20)

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
        ws = fr_cuda_alloc(BLAS_WORKSPACE, &block);
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
