/* gemm.cu: row-major SGEMM through cuBLAS, and the per-channel bias kernels.
 *
 * cuBLAS is column-major. A row-major (r, c) matrix with leading dimension c
 * is, read column-major, its transpose (c, r) with the same leading
 * dimension. So the row-major product C = op(A) op(B) is computed as the
 * column-major C^T = op(B)^T op(A)^T: swap the operands and M with N, keep
 * each operand's transpose flag. Leading dimensions are the row lengths of the
 * stored row-major matrices: A is stored (M,K), or (K,M) when trans_a; B is
 * (K,N), or (N,K) when trans_b; C is (M,N). */
#include "internal.h"

fr_status fr_cuda_gemm_rm(float *c, long long stride_c, const float *a, long long stride_a,
                          const float *b, long long stride_b, int m, int n, int k, bool trans_a,
                          bool trans_b, float alpha, float beta, int batch) {
    if (m <= 0 || n <= 0 || batch <= 0)
        return FR_OK;
    if (k <= 0) {
        /* The product is empty and cuBLAS rejects a zero leading dimension:
         * C = beta * C, where beta == 0 overwrites (no NaN from garbage). */
        size_t count = (size_t)m * (size_t)n;
        for (int i = 0; i < batch; i++) {
            float *ci = c + (size_t)i * (size_t)stride_c;
            if (beta == 0.0f)
                FR_TRY(fr_cuda_fill(ci, 0.0f, count));
            else if (beta != 1.0f)
                FR_TRY(fr_cuda_scale(ci, ci, beta, count));
        }
        return FR_OK;
    }
    cublasHandle_t h;
    FR_TRY(fr_cuda_blas(&h));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n;
    if (batch == 1)
        FR_CUBLAS_CHECK(cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    else
        FR_CUBLAS_CHECK(cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, stride_b,
                                                  a, lda, stride_a, &beta, c, ldc, stride_c, batch));
    return FR_OK;
}

extern "C" fr_status fr_cuda_gemm(float *c, const float *a, const float *b, int m, int n, int k,
                                  bool trans_a, bool trans_b, float alpha, float beta) {
    return fr_cuda_gemm_rm(c, 0, a, 0, b, 0, m, n, k, trans_a, trans_b, alpha, beta, 1);
}

/* ---- bias: y (N, C, HW) += b (C); db (C) = sum over N and HW of dy ---- */

__global__ void bias_add_kernel(float *y, const float *b, int c, size_t hw, size_t total) {
    FR_CUDA_FOR(i, total) y[i] += b[(i / hw) % (size_t)c];
}

#define BIAS_THREADS 256

/* One block per channel; double accumulation like the CPU kernel (N*HW terms,
 * 65536 for a CIFAR batch), reduced in a fixed order. */
__global__ void bias_grad_kernel(float *db, const float *dy, int n, int c, int hw) {
    __shared__ double sh[BIAS_THREADS];
    int ch = blockIdx.x;
    size_t count = (size_t)n * (size_t)hw;
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < count; i += BIAS_THREADS) {
        size_t img = i / (size_t)hw, j = i % (size_t)hw;
        acc += (double)dy[(img * (size_t)c + (size_t)ch) * (size_t)hw + j];
    }
    double total = fr_block_sum<double, BIAS_THREADS>(acc, sh);
    if (threadIdx.x == 0)
        db[ch] = (float)total;
}

extern "C" fr_status fr_cuda_bias_add(float *y, const float *b, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    FR_CUDA_RUN_1D(bias_add_kernel, total, y, b, c, (size_t)hw, total);
}

extern "C" fr_status fr_cuda_bias_grad(float *db, const float *dy, int n, int c, int hw) {
    if (c <= 0)
        return FR_OK;
    bias_grad_kernel<<<c, BIAS_THREADS>>>(db, dy, n, c, hw);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}
