/* loss.cu: fused log-softmax + NLL (cross-entropy), mean over the batch, on
 * the GPU. logits (N, K), labels (N) i32.
 *
 * Each row is one block: its maximum, then sum(exp(x - max)) (every exponent
 * <= 0, so no overflow), log-sum-exp = max + log(sum). The row losses go to
 * a workspace and one block adds them in a fixed order (in double, like the
 * CPU), so the mean is deterministic.
 *
 * Labels out of [0, K): the CPU kernel reports FR_ERR_ARG, but a kernel
 * cannot raise an error without a host round trip. Checking would cost a
 * device-to-host copy per step, so instead such a row gets a NaN loss (and
 * NaN gradients in backward): the batch's loss is NaN, which the caller sees
 * (and mixed-precision training treats as an overflow). No clamping: a wrong
 * label never yields a plausible-looking number. */
#include <math.h>

#include "internal.h"
#include "../tensor/loss_math.h"

#define CE_THREADS 256

/* max and sum(exp(x - max)) of a row of k logits; every thread gets both. */
__device__ inline void row_stats(const float *row, int k, float *sh, float *mx, float *se) {
    float m = -INFINITY;
    for (int j = (int)threadIdx.x; j < k; j += CE_THREADS)
        m = fmaxf(m, row[j]);
    m = fr_block_max<CE_THREADS>(m, sh);
    float s = 0.0f;
    for (int j = (int)threadIdx.x; j < k; j += CE_THREADS)
        s += expf(row[j] - m);
    *se = fr_block_sum<float, CE_THREADS>(s, sh);
    *mx = m;
}

__global__ void ce_rows_kernel(float *row_loss, const float *logits, const int32_t *labels, int k) {
    __shared__ float sh[CE_THREADS];
    const float *row = logits + (size_t)blockIdx.x * (size_t)k;
    float mx, se;
    row_stats(row, k, sh, &mx, &se);
    if (threadIdx.x == 0) {
        int32_t label = labels[blockIdx.x];
        /* (max - x[label]) first: both are logits of one row, so the
         * difference is small and nearly exact before log(se) joins it. */
        row_loss[blockIdx.x] = label >= 0 && label < k ? (mx - row[label]) + logf(se) : NAN;
    }
}

__global__ void ce_mean_kernel(float *loss, const float *row_loss, int n) {
    __shared__ double sh[CE_THREADS];
    double acc = 0.0;
    for (int i = (int)threadIdx.x; i < n; i += CE_THREADS)
        acc += (double)row_loss[i];
    double total = fr_block_sum<double, CE_THREADS>(acc, sh);
    if (threadIdx.x == 0)
        loss[0] = (float)(total / n);
}

/* dlogits = (softmax - onehot) * dloss[0] / N, row by row. */
__global__ void ce_bwd_kernel(float *dlogits, const float *dloss, const float *logits,
                              const int32_t *labels, int n, int k) {
    __shared__ float sh[CE_THREADS];
    size_t base = (size_t)blockIdx.x * (size_t)k;
    const float *row = logits + base;
    float mx, se;
    row_stats(row, k, sh, &mx, &se);
    int32_t label = labels[blockIdx.x];
    bool valid = label >= 0 && label < k;
    float g = dloss[0] / (float)n;
    for (int j = (int)threadIdx.x; j < k; j += CE_THREADS) {
        float p = expf(row[j] - mx) / se;
        dlogits[base + j] = valid ? (p - (j == label ? 1.0f : 0.0f)) * g : NAN;
    }
}

static fr_status launch_fwd(float *loss, float *row_loss, const float *logits,
                            const int32_t *labels, int n, int k) {
    ce_rows_kernel<<<n, CE_THREADS>>>(row_loss, logits, labels, k);
    FR_CUDA_LAUNCH_CHECK();
    ce_mean_kernel<<<1, CE_THREADS>>>(loss, row_loss, n);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_cross_entropy_forward(float *loss, const float *logits,
                                               const int32_t *labels, int n, int k) {
    if (n <= 0) /* the CPU kernel's convention for an empty batch */
        return fr_cuda_fill(loss, 0.0f, 1);
    size_t ws_bytes = (size_t)n * sizeof(float);
    float *row_loss = (float *)fr_mem_alloc(FR_CUDA, ws_bytes, FR_TAG_WORKSPACE); // (N)
    if (!row_loss)
        return fr_last_status();
    fr_status st = launch_fwd(loss, row_loss, logits, labels, n, k);
    fr_mem_free(FR_CUDA, row_loss, ws_bytes, FR_TAG_WORKSPACE);
    return st;
}

extern "C" fr_status fr_cuda_cross_entropy_backward(float *dlogits, const float *dloss,
                                               const float *logits, const int32_t *labels, int n,
                                               int k) {
    if (n <= 0 || k <= 0)
        return FR_OK;
    ce_bwd_kernel<<<n, CE_THREADS>>>(dlogits, dloss, logits, labels, n, k);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

/* ---- the pointwise losses (tensor/loss_math.h, shared with the CPU) ---- */

__global__ void pointwise_loss_forward_kernel(float *l, const float *pred, const float *target,
                                              fr_pointwise_loss kind, float beta, size_t n) {
    FR_CUDA_FOR(i, n) l[i] = fr_loss_value(kind, pred[i], target[i], beta);
}

__global__ void pointwise_loss_backward_kernel(float *dpred, const float *dloss, const float *pred,
                                               const float *target, fr_pointwise_loss kind,
                                               float beta, float scale, size_t n) {
    FR_CUDA_FOR(i, n) dpred[i] = fr_loss_grad(kind, pred[i], target[i], beta) * (dloss[0] * scale);
}

extern "C" fr_status fr_cuda_pointwise_loss_forward(float *l, const float *pred, const float *target,
                                                    fr_pointwise_loss kind, float beta, size_t n) {
    FR_CUDA_RUN_1D(pointwise_loss_forward_kernel, n, l, pred, target, kind, beta, n);
}

extern "C" fr_status fr_cuda_pointwise_loss_backward(float *dpred, const float *dloss,
                                                     const float *pred, const float *target,
                                                     fr_pointwise_loss kind, float beta,
                                                     float scale, size_t n) {
    FR_CUDA_RUN_1D(pointwise_loss_backward_kernel, n, dpred, dloss, pred, target, kind, beta, scale,
                   n);
}
