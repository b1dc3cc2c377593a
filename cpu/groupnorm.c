/* cpu/groupnorm.c: group normalisation fused with an activation, forward
 * and backward (kernels.def; the arithmetic is tensor/groupnorm_math.h's,
 * shared with the CUDA twin). oneDNN 2.6, the CPU library here, has no
 * group-normalisation primitive (its layer normalisation normalises the
 * last dim only, with per-element affine), so these are frugal's own. The
 * backward recomputes the pre-activation from x with the forward's exact
 * arithmetic, so it needs no saved output. */
#include "../tensor/groupnorm_math.h"
#include "../tensor/kernels.h"

fr_status fr_cpu_group_norm_stats(float *mean, float *invstd, const float *x, float eps,
                                  const fr_gn_shape *s) {
    long long len = (long long)(s->c / s->groups) * s->hw;
#pragma omp parallel for schedule(static)
    for (int ng = 0; ng < s->n * s->groups; ng++)
        fr_gn_group_stats(&mean[ng], &invstd[ng], x + (long long)ng * len, len, eps);
    return FR_OK;
}

fr_status fr_cpu_group_norm_act_forward(float *y, const float *x, const float *mean,
                                        const float *invstd, const float *gamma, const float *beta,
                                        fr_act act, float slope, const fr_gn_shape *s) {
    int cpg = s->c / s->groups;
#pragma omp parallel for schedule(static)
    for (long long nc = 0; nc < (long long)s->n * s->c; nc++) {
        int ch = (int)(nc % s->c);
        long long ng = nc / s->c * s->groups + ch / cpg;
        const float *xp = x + nc * s->hw;   // (HW)
        float *yp = y + nc * s->hw;
        for (int i = 0; i < s->hw; i++)
            yp[i] = fr_act_fwd(act, fr_gn_pre(xp[i], mean[ng], invstd[ng], gamma[ch], beta[ch]), slope);
    }
    return FR_OK;
}

fr_status fr_cpu_group_norm_act_backward(float *dx, float *dgamma, float *dbeta, const float *dy,
                                         const float *x, const float *mean, const float *invstd,
                                         const float *gamma, const float *beta, fr_act act,
                                         float slope, const fr_gn_shape *s) {
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < s->c; ch++)
        fr_gn_channel_grads(&dgamma[ch], &dbeta[ch], dy, x, mean, invstd, gamma, beta, act, slope, ch,
                            s->n, s->c, s->hw, s->groups);
    if (!dx)
        return FR_OK;
    int cpg = s->c / s->groups;
    long long len = (long long)cpg * s->hw;
#pragma omp parallel for schedule(static)
    for (int ng = 0; ng < s->n * s->groups; ng++) {
        int c0 = ng % s->groups * cpg;
        long long base = (long long)ng * len;   // (C/G, HW) of one sample
        fr_gn_group_dx(dx + base, dy + base, x + base, mean[ng], invstd[ng], gamma + c0, beta + c0, act,
                       slope, cpg, s->hw);
    }
    return FR_OK;
}
