/* batchnorm.cu: batch-norm kernels on the GPU. x is (N, C, HW); every
 * per-channel buffer is (C).
 *
 * The per-channel reductions (statistics, backward sums) run one block per
 * channel, each thread striding over the channel's N*HW values and the block
 * adding the partial sums in a fixed tree: deterministic, no atomics.
 * Statistics are two-pass in float: first the mean, then the mean of squared
 * deviations from it, which cannot cancel catastrophically the way
 * E[x^2] - E[x]^2 does when |mean| >> std.
 *
 * One block per channel keeps a layer of 16 channels on 16 of an H200's 132
 * multiprocessors. Splitting a channel over several blocks needs a scratch
 * buffer (in the ledger's workspace) and a second launch per pass, and
 * changes the summation order; it waits for a GPU measurement of what these
 * kernels cost in a step (scripts/device-check.sh's bench section). */
#include "internal.h"
#include "../tensor/activation.h"

#define BN_THREADS 512

/* Walks channel ch's N*HW values: i = first, first + step, ... below
 * N*HW, `at` the index in x of the i-th one, (i / HW) * C*HW + ch*HW + i %
 * HW. A 64-bit division and remainder per element cost more than the load;
 * here they are taken once per thread, and each step adds the step's
 * quotient and remainder, carrying into the next image. The values and
 * their order are those of the direct formula, so the sums are unchanged.
 *   for (bn_walk w(threadIdx.x, BN_THREADS, ch, c, hw); w.i < count; w.next()) x[w.at] */
struct bn_walk {
    size_t i, at, j, step, hw, jump, r, carry;
    __device__ bn_walk(size_t first, size_t step_, int ch, int c, int hw_)
        : i(first), step(step_), hw(hw_ > 0 ? (size_t)hw_ : 1) {
        /* hw_ == 0 means no values (count 0): any hw avoids dividing by 0 */
        j = first % hw;
        at = (first / hw * (size_t)c + (size_t)ch) * hw + j;
        r = step % hw;
        jump = step / hw * (size_t)c * hw + r;
        carry = ((size_t)c - 1) * hw; /* j wrapped: one image on, hw back */
    }
    __device__ void next() {
        i += step;
        at += jump;
        j += r;
        if (j >= hw) {
            j -= hw;
            at += carry;
        }
    }
};

/* The channel of element i of an (N, C, HW) tensor: 32-bit arithmetic when
 * the tensor allows it (`small`, the same for the whole launch), which is
 * several times cheaper on the GPU than 64-bit division. */
__device__ __forceinline__ size_t bn_channel(size_t i, size_t hw, int c, bool small) {
    if (small)
        return ((unsigned)i / (unsigned)hw) % (unsigned)c;
    return (i / hw) % (size_t)c;
}

__global__ void batch_norm_stats_kernel(float *mean, float *var, const float *x, int n, int c, int hw) {
    __shared__ float sh[BN_THREADS];
    int ch = blockIdx.x;
    size_t count = (size_t)n * (size_t)hw;
    float acc = 0.0f;
    for (bn_walk w(threadIdx.x, BN_THREADS, ch, c, hw); w.i < count; w.next())
        acc += x[w.at];
    float m = count ? fr_block_sum<float, BN_THREADS>(acc, sh) / (float)count : 0.0f;
    acc = 0.0f;
    for (bn_walk w(threadIdx.x, BN_THREADS, ch, c, hw); w.i < count; w.next()) {
        float d = x[w.at] - m;
        acc += d * d;
    }
    float v = count ? fr_block_sum<float, BN_THREADS>(acc, sh) / (float)count : 0.0f;
    if (threadIdx.x == 0) {
        mean[ch] = m;
        var[ch] = v;
    }
}

extern "C" fr_status fr_cuda_batch_norm_stats(float *mean, float *var, const float *x, int n, int c, int hw) {
    if (c <= 0)
        return FR_OK;
    batch_norm_stats_kernel<<<c, BN_THREADS>>>(mean, var, x, n, c, hw);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

/* ---- per-channel scalars; computed in double like the CPU kernels ---- */

__global__ void batch_norm_invstd_kernel(float *invstd, const float *var, float eps, int c) {
    FR_CUDA_FOR(ch, c) invstd[ch] = (float)(1.0 / sqrt((double)var[ch] + (double)eps));
}

extern "C" fr_status fr_cuda_batch_norm_invstd(float *invstd, const float *var, float eps, int c) {
    if (c <= 0)
        return FR_OK;
    batch_norm_invstd_kernel<<<fr_cuda_grid((size_t)c), FR_CUDA_THREADS>>>(invstd, var, eps, c);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

/* PyTorch keeps the unbiased variance in its running estimate although it
 * normalises the batch with the biased one. */
__global__ void batch_norm_update_running_kernel(float *running_mean, float *running_var,
                                         const float *mean, const float *var, double momentum,
                                         double bessel, int c) {
    FR_CUDA_FOR(ch, c) {
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean[ch]);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * var[ch] * bessel);
    }
}

extern "C" fr_status fr_cuda_batch_norm_update_running(float *running_mean, float *running_var,
                                               const float *mean, const float *var, float momentum,
                                               int count, int c) {
    if (c <= 0)
        return FR_OK;
    double bessel = count > 1 ? (double)count / (double)(count - 1) : 1.0;
    batch_norm_update_running_kernel<<<fr_cuda_grid((size_t)c), FR_CUDA_THREADS>>>(
        running_mean, running_var, mean, var, (double)momentum, bessel, c);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

/* ---- normalise, add the residual, activate: y = act((x - mean) *
 * (invstd * gamma) + beta [+ residual]), each step rounded as the separate
 * kernels round it. Each thread reads x[i] and residual[i] before writing
 * y[i], so y may be either. ---- */

/* The activation (tensor/activation.h, the plain kernel's formulas). */
__device__ __forceinline__ float bn_act_value(float v, fr_act act, float slope) {
    return fr_act_fwd(act, v, slope);
}

/* dy * act'(x) from the kept output, or from the recomputed pre-activation
 * `pre` (activated first when the gradient reads the output; an activation
 * that needs its input always reads pre). */
__device__ __forceinline__ float bn_act_grad(float g, const float *act_out, size_t at, float pre,
                                             fr_act act, float slope) {
    if (act == FR_ACT_IDENTITY)
        return g;
    float s;
    if (fr_act_needs_of(act) == FR_ACT_NEEDS_INPUT)
        s = pre;
    else if (act_out)
        s = act_out[at];
    else
        s = fr_act_fwd(act, pre, slope);
    return fr_act_grad(act, g, s, slope);
}

__global__ void bn_act_forward_kernel(float *y, const float *x, const float *residual,
                                      const float *mean, const float *invstd, const float *gamma,
                                      const float *beta, fr_act act, float slope, int c, size_t hw,
                                      size_t total) {
    FR_CUDA_FOR(i, total) {
        size_t ch = bn_channel(i, hw, c, total <= UINT32_MAX);
        float sc = invstd[ch] * gamma[ch];
        float v = __fadd_rn(__fmul_rn(x[i] - mean[ch], sc), beta[ch]);
        if (residual)
            v = v + residual[i];
        y[i] = bn_act_value(v, act, slope);
    }
}

extern "C" fr_status fr_cuda_bn_act_forward(float *y, const float *x, const float *residual,
                                            const float *mean, const float *invstd,
                                            const float *gamma, const float *beta, fr_act act,
                                            float slope, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    FR_CUDA_RUN_1D(bn_act_forward_kernel, total, y, x, residual, mean, invstd, gamma, beta, act,
                   slope, c, (size_t)hw, total);
}

/* ---- backward (training mode). With xhat = (x - mean) * invstd and M =
 * N*HW values per channel:
 *   dbeta  = sum dy,   dgamma = sum dy * xhat,
 *   dx     = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M),
 * the two means being what the batch statistics contribute. One block per
 * channel: the sums first, then (after the block has agreed on them) dx. Each
 * element of dx is written by the thread that read dy and x there, after the
 * sums are complete, so dx may alias dy or x. ---- */

/* The fused backward (kernels.def: bn_act_backward): the above over g = dy *
 * act'(s), s the kept output or the pre-activation recomputed in the
 * forward's rounding (batch_norm_backward is its identity case). g goes to dz when wanted; dx is
 * computed from g again (recomputed, not re-read, where dz is not kept). */
__global__ void bn_act_backward_kernel(float *dx, float *dz, float *dgamma, float *dbeta,
                                       const float *dy, const float *act_out, const float *x,
                                       const float *mean, const float *invstd, const float *gamma,
                                       const float *beta, fr_act act, float slope, int n, int c,
                                       int hw) {
    __shared__ float sh[BN_THREADS];
    int ch = blockIdx.x;
    size_t count = (size_t)n * (size_t)hw;
    float mu = mean[ch], is = invstd[ch], sc = invstd[ch] * gamma[ch];
    float b = beta ? beta[ch] : 0.0f;
    float acc_dy = 0.0f, acc_dyxh = 0.0f;
    for (bn_walk w(threadIdx.x, BN_THREADS, ch, c, hw); w.i < count; w.next()) {
        size_t at = w.at;
        float pre = __fadd_rn(__fmul_rn(x[at] - mu, sc), b);
        float g = bn_act_grad(dy[at], act_out, at, pre, act, slope);
        if (dz)
            dz[at] = g;
        acc_dy += g;
        acc_dyxh += g * ((x[at] - mu) * is);
    }
    float sdy = fr_block_sum<float, BN_THREADS>(acc_dy, sh);
    float sdyxh = fr_block_sum<float, BN_THREADS>(acc_dyxh, sh);
    if (threadIdx.x == 0) {
        dbeta[ch] = sdy;
        dgamma[ch] = sdyxh;
    }
    if (!dx || count == 0)
        return;
    float mdy = sdy / (float)count, mdyxh = sdyxh / (float)count, k = gamma[ch] * is;
    for (bn_walk w(threadIdx.x, BN_THREADS, ch, c, hw); w.i < count; w.next()) {
        size_t at = w.at;
        float g;
        if (dz) {
            g = dz[at];
        } else {
            float pre = __fadd_rn(__fmul_rn(x[at] - mu, sc), b);
            g = bn_act_grad(dy[at], act_out, at, pre, act, slope);
        }
        float xh = (x[at] - mu) * is;
        dx[at] = k * (g - mdy - xh * mdyxh);
    }
}

extern "C" fr_status fr_cuda_bn_act_backward(float *dx, float *dz, float *dgamma, float *dbeta,
                                             const float *dy, const float *act_out, const float *x,
                                             const float *mean, const float *invstd,
                                             const float *gamma, const float *beta, fr_act act,
                                             float slope, int n, int c, int hw) {
    if (c <= 0)
        return FR_OK;
    bn_act_backward_kernel<<<c, BN_THREADS>>>(dx, dz, dgamma, dbeta, dy, act_out, x, mean, invstd,
                                              gamma, beta, act, slope, n, c, hw);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

/* bn_act_backward with the identity: the sums and dx from dy itself. */
extern "C" fr_status fr_cuda_batch_norm_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                    const float *x, const float *mean, const float *invstd,
                                    const float *gamma, int n, int c, int hw) {
    return fr_cuda_bn_act_backward(dx, NULL, dgamma, dbeta, dy, NULL, x, mean, invstd, gamma, NULL,
                                   FR_ACT_IDENTITY, 0.0f, n, c, hw);
}

/* dx from batch sums already reduced over all `count` values per channel
 * (the blocked form of bn_act_backward_kernel's second half; kernels.def). */
__global__ void batch_norm_backward_data_kernel(float *dx, const float *dy, const float *x, const float *mean,
                                   const float *invstd, const float *gamma, const float *dgamma,
                                   const float *dbeta, float inv_count, int c, size_t hw,
                                   size_t total) {
    FR_CUDA_FOR(i, total) {
        size_t ch = bn_channel(i, hw, c, total <= UINT32_MAX);
        float is = invstd[ch];
        float xh = (x[i] - mean[ch]) * is;
        dx[i] = gamma[ch] * is * (dy[i] - dbeta[ch] * inv_count - xh * (dgamma[ch] * inv_count));
    }
}

extern "C" fr_status fr_cuda_batch_norm_backward_data(float *dx, const float *dy, const float *x,
                                         const float *mean, const float *invstd,
                                         const float *gamma, const float *dgamma,
                                         const float *dbeta, double count, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    float inv_count = count > 0 ? (float)(1.0 / count) : 0.0f;
    FR_CUDA_RUN_1D(batch_norm_backward_data_kernel, total, dx, dy, x, mean, invstd, gamma, dgamma, dbeta,
                   inv_count, c, (size_t)hw, total);
}
