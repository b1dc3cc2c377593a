/* check.h: the one family of GPU check macros (docs/ARCHITECTURE.md, "Errors").
 *
 * Each is a statement for a function returning fr_status: when the call
 * fails it records FR_ERR_CUDA with "<file>:<line>: <call>: <error string>"
 * and returns that status from the enclosing function. The runtime's sticky
 * "last error" is cleared on the way out, so one failure is not reported a
 * second time by an unrelated launch check later. Only .cu files include
 * this header. */
#ifndef FR_CUDA_CHECK_H
#define FR_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "../tensor/fr_base.h"

#define FR_CUDA_CHECK(call)                                                              \
    do {                                                                                 \
        cudaError_t fr_cuda_err_ = (call);                                               \
        if (fr_cuda_err_ != cudaSuccess) {                                               \
            (void)cudaGetLastError();                                                    \
            return fr_error(FR_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                            cudaGetErrorString(fr_cuda_err_));                           \
        }                                                                                \
    } while (0)

#define FR_CUBLAS_CHECK(call)                                                            \
    do {                                                                                 \
        cublasStatus_t fr_cublas_st_ = (call);                                           \
        if (fr_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                    \
            (void)cudaGetLastError();                                                    \
            return fr_error(FR_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                            cublasGetStatusString(fr_cublas_st_));                       \
        }                                                                                \
    } while (0)

#define FR_CUDNN_CHECK(call)                                                             \
    do {                                                                                 \
        cudnnStatus_t fr_cudnn_st_ = (call);                                             \
        if (fr_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                                      \
            (void)cudaGetLastError();                                                    \
            return fr_error(FR_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                            cudnnGetErrorString(fr_cudnn_st_));                          \
        }                                                                                \
    } while (0)

/* After every kernel launch: a bad configuration is reported here; a fault
 * inside the kernel surfaces at the next synchronising call. */
#define FR_CUDA_LAUNCH_CHECK() FR_CUDA_CHECK(cudaGetLastError())

#endif
