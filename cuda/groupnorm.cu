/* groupnorm.cu: group normalisation fused with an activation on the GPU
 * (kernels.def; cpu/groupnorm.c is the twin, tensor/groupnorm_math.h the
 * shared arithmetic, so both give the same bits). A reference, not tuned:
 * one thread per (sample, group) for the statistics and dx, one per
 * channel for dgamma and dbeta. */
#include "internal.h"
#include "../tensor/groupnorm_math.h"

__global__ void gn_stats_kernel(float *mean, float *invstd, const float *x, float eps, fr_gn_shape s,
                                size_t groups_total) {
    long long len = (long long)(s.c / s.groups) * s.hw;
    FR_CUDA_FOR(ng, groups_total) fr_gn_group_stats(&mean[ng], &invstd[ng], x + (long long)ng * len, len, eps);
}

__global__ void gn_forward_kernel(float *y, const float *x, const float *mean, const float *invstd,
                                  const float *gamma, const float *beta, fr_act act, float slope,
                                  fr_gn_shape s, size_t n) {
    int cpg = s.c / s.groups;
    FR_CUDA_FOR(e, n) {
        long long nc = (long long)e / s.hw;
        int ch = (int)(nc % s.c);
        long long ng = nc / s.c * s.groups + ch / cpg;
        y[e] = fr_act_fwd(act, fr_gn_pre(x[e], mean[ng], invstd[ng], gamma[ch], beta[ch]), slope);
    }
}

__global__ void gn_param_grad_kernel(float *dgamma, float *dbeta, const float *dy, const float *x,
                                     const float *mean, const float *invstd, const float *gamma,
                                     const float *beta, fr_act act, float slope, fr_gn_shape s) {
    FR_CUDA_FOR(ch, (size_t)s.c)
    fr_gn_channel_grads(&dgamma[ch], &dbeta[ch], dy, x, mean, invstd, gamma, beta, act, slope, (int)ch,
                        s.n, s.c, s.hw, s.groups);
}

__global__ void gn_dx_kernel(float *dx, const float *dy, const float *x, const float *mean,
                             const float *invstd, const float *gamma, const float *beta, fr_act act,
                             float slope, fr_gn_shape s, size_t groups_total) {
    int cpg = s.c / s.groups;
    long long len = (long long)cpg * s.hw;
    FR_CUDA_FOR(ng, groups_total) {
        int c0 = (int)(ng % s.groups) * cpg;
        long long base = (long long)ng * len;
        fr_gn_group_dx(dx + base, dy + base, x + base, mean[ng], invstd[ng], gamma + c0, beta + c0, act,
                       slope, cpg, s.hw);
    }
}

extern "C" fr_status fr_cuda_group_norm_stats(float *mean, float *invstd, const float *x, float eps,
                                              const fr_gn_shape *s) {
    size_t groups = (size_t)s->n * (size_t)s->groups;
    FR_CUDA_RUN_1D(gn_stats_kernel, groups, mean, invstd, x, eps, *s, groups);
}

extern "C" fr_status fr_cuda_group_norm_act_forward(float *y, const float *x, const float *mean,
                                                    const float *invstd, const float *gamma,
                                                    const float *beta, fr_act act, float slope,
                                                    const fr_gn_shape *s) {
    size_t n = (size_t)s->n * (size_t)s->c * (size_t)s->hw;
    FR_CUDA_RUN_1D(gn_forward_kernel, n, y, x, mean, invstd, gamma, beta, act, slope, *s, n);
}

extern "C" fr_status fr_cuda_group_norm_act_backward(float *dx, float *dgamma, float *dbeta,
                                                     const float *dy, const float *x,
                                                     const float *mean, const float *invstd,
                                                     const float *gamma, const float *beta,
                                                     fr_act act, float slope, const fr_gn_shape *s) {
    if (s->c == 0 || s->n == 0)
        return FR_OK;
    gn_param_grad_kernel<<<fr_cuda_grid((size_t)s->c), FR_CUDA_THREADS>>>(
        dgamma, dbeta, dy, x, mean, invstd, gamma, beta, act, slope, *s);
    FR_CUDA_LAUNCH_CHECK();
    if (!dx)
        return FR_OK;
    size_t groups = (size_t)s->n * (size_t)s->groups;
    FR_CUDA_RUN_1D(gn_dx_kernel, groups, dx, dy, x, mean, invstd, gamma, beta, act, slope, *s, groups);
}
