/* groupnorm_math.h: group normalisation's per-element arithmetic and one
 * group's statistics, shared by cpu/groupnorm.c and cuda/groupnorm.cu so
 * both compute the same bits (the GPU spells each rounding, so no FMA is
 * contracted). Internal: not installed. */
#ifndef FR_GROUPNORM_MATH_H
#define FR_GROUPNORM_MATH_H

#include "activation.h"

#ifdef __CUDA_ARCH__
#define FR_GN_MUL(a, b) __fmul_rn(a, b)
#define FR_GN_ADD(a, b) __fadd_rn(a, b)
#define FR_GN_SUB(a, b) __fsub_rn(a, b)
#else
#define FR_GN_MUL(a, b) ((a) * (b))
#define FR_GN_ADD(a, b) ((a) + (b))
#define FR_GN_SUB(a, b) ((a) - (b))
#endif

/* the pre-activation x * a + b, a = invstd * gamma, b = beta - mean * a
 * (PyTorch's GroupNorm order) */
FR_ACT_FN float fr_gn_pre(float x, float mean, float invstd, float gamma, float beta) {
    float a = FR_GN_MUL(invstd, gamma);
    return FR_GN_ADD(FR_GN_MUL(x, a), FR_GN_SUB(beta, FR_GN_MUL(mean, a)));
}

/* (x - mean) * invstd */
FR_ACT_FN float fr_gn_xhat(float x, float mean, float invstd) {
    return FR_GN_MUL(FR_GN_SUB(x, mean), invstd);
}

/* dy * act'(pre), reading the activation's output or input as the plain
 * kernel does */
FR_ACT_FN float fr_gn_act_grad(fr_act act, float dy, float pre, float slope) {
    float s = fr_act_needs_of(act) == FR_ACT_NEEDS_OUTPUT ? fr_act_fwd(act, pre, slope) : pre;
    return fr_act_grad(act, dy, s, slope);
}

/* biased mean and 1 / sqrt(var + eps) of len values, two passes in double */
FR_ACT_FN void fr_gn_group_stats(float *mean, float *invstd, const float *x, long long len,
                                 float eps) {
    double sum = 0.0;
    for (long long i = 0; i < len; i++)
        sum += x[i];
    double mu = sum / (double)len, var = 0.0;
    for (long long i = 0; i < len; i++) {
        double d = x[i] - mu;
        var += d * d;
    }
    var /= (double)len;
    *mean = (float)mu;
    *invstd = (float)(1.0 / sqrt(var + eps));
}

/* dbeta = sum g and dgamma = sum g xhat of channel ch over every sample
 * and pixel (double), g = dy * act'(pre) */
FR_ACT_FN void fr_gn_channel_grads(float *dgamma, float *dbeta, const float *dy, const float *x,
                                   const float *mean, const float *invstd, const float *gamma,
                                   const float *beta, fr_act act, float slope, int ch, int n, int c,
                                   int hw, int groups) {
    int cpg = c / groups;
    double sg = 0.0, sgx = 0.0;
    for (int s = 0; s < n; s++) {
        long long ng = (long long)s * groups + ch / cpg, off = ((long long)s * c + ch) * hw;
        for (int i = 0; i < hw; i++) {
            float g = fr_gn_act_grad(act, dy[off + i],
                                     fr_gn_pre(x[off + i], mean[ng], invstd[ng], gamma[ch], beta[ch]), slope);
            sg += g;
            sgx += (double)g * fr_gn_xhat(x[off + i], mean[ng], invstd[ng]);
        }
    }
    *dbeta = (float)sg;
    *dgamma = (float)sgx;
}

/* dx of one sample's group: its cpg channels from channel c0, at x, dy, dx
 * (each cpg * hw values); dx = invstd (gamma g - mean(gamma g) - xhat
 * mean(gamma g xhat)), the means in double */
FR_ACT_FN void fr_gn_group_dx(float *dx, const float *dy, const float *x, float mean, float invstd,
                              const float *gamma, const float *beta, fr_act act, float slope,
                              int cpg, int hw) {
    long long len = (long long)cpg * hw;
    double m1 = 0.0, m2 = 0.0;
    for (int k = 0; k < cpg; k++)
        for (int i = 0; i < hw; i++) {
            long long e = (long long)k * hw + i;
            float g = FR_GN_MUL(fr_gn_act_grad(act, dy[e], fr_gn_pre(x[e], mean, invstd, gamma[k], beta[k]),
                                               slope), gamma[k]);
            m1 += g;
            m2 += (double)g * fr_gn_xhat(x[e], mean, invstd);
        }
    m1 /= (double)len;
    m2 /= (double)len;
    for (int k = 0; k < cpg; k++)
        for (int i = 0; i < hw; i++) {
            long long e = (long long)k * hw + i;
            float g = FR_GN_MUL(fr_gn_act_grad(act, dy[e], fr_gn_pre(x[e], mean, invstd, gamma[k], beta[k]),
                                               slope), gamma[k]);
            double xhat = fr_gn_xhat(x[e], mean, invstd);
            dx[e] = (float)(invstd * (g - m1 - xhat * m2));
        }
}

#endif
