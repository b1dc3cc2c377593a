/* cpu/batchnorm.c: batch-norm kernels on the host. x is (N, C, HW); every
 * per-channel buffer is (C). Channel ch of sample i is the contiguous run
 * x[(i * C + ch) * HW ...], so a thread owning a channel strides over N.
 * The elementwise loops are `omp simd` (-O2 leaves them scalar); so are the
 * per-channel sums (double lanes, in an order fixed by the machine, the same
 * for every kernel that sums: chunk_sums), never split across threads. */
#include <math.h>

#include "../tensor/activation.h"
#include "../tensor/kernels.h"
#include "simd.h"

/* The loops over a plane or a chunk are FR_BN_VEC functions (cpu/simd.h):
 * built for AVX-512F, AVX2 and the baseline. No FMA in any copy (-std=c11
 * forbids contraction), so each rounds as the separate elementwise kernels
 * do; a sum along a plane takes the copy's lane order, the same for every
 * kernel on one machine. */

FR_BN_VEC static void plane_stats(const float *p, int hw, double shift, double *s_out,
                                  double *ss_out) {
    double s = *s_out, ss = *ss_out;
#pragma omp simd reduction(+ : s, ss)
    for (int j = 0; j < hw; j++) {
        double d = (double)p[j] - shift;
        s += d;
        ss += d * d;
    }
    *s_out = s;
    *ss_out = ss;
}

/* dx = k * (g - mdy - xhat * mdyxh) over one run: batch norm's dx from the
 * gradient g at its output and the batch sums (kernels.def). */
FR_BN_VEC static void plane_dx(float *dxp, const float *gp, const float *xp, int len, double mu,
                               double is, double k, double mdy, double mdyxh) {
#pragma omp simd
    for (int j = 0; j < len; j++) {
        double xh = ((double)xp[j] - mu) * is;
        dxp[j] = (float)(k * ((double)gp[j] - mdy - xh * mdyxh));
    }
}

static inline const float *plane(const float *x, int i, int ch, int c, int hw) {
    return x + ((size_t)i * (size_t)c + (size_t)ch) * (size_t)hw;
}

fr_status fr_cpu_batch_norm_stats(float *mean, float *var, const float *x, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
#pragma omp parallel for if (total > FR_BN_PAR_MIN && c > 1) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        /* Sums of x - shift with the shift a value from the channel: the
         * one-pass variance then does not cancel catastrophically when
         * |mean| >> std, and double keeps ~10^8-element channels exact
         * enough. */
        double shift = n > 0 && hw > 0 ? plane(x, 0, ch, c, hw)[0] : 0.0;
        double s = 0.0, ss = 0.0;
        for (int i = 0; i < n; i++)
            plane_stats(plane(x, i, ch, c, hw), hw, shift, &s, &ss);
        double count = (double)n * (double)hw;
        double m = count > 0 ? s / count : 0.0;
        double v = count > 0 ? ss / count - m * m : 0.0;
        mean[ch] = (float)(shift + m);
        var[ch] = (float)(v < 0.0 ? 0.0 : v); /* rounding's negatives, not a NaN, become 0 */
    }
    return FR_OK;
}

/* Backward's sums over one plane: sdy += g, sdyxh += g * xhat, in chunks
 * of FR_BN_CHUNK values, each chunk an `omp simd` reduction (its order is
 * the build's vector width, fixed for a binary, never the thread count:
 * threads own whole channels). batch_norm_backward and bn_act_backward both
 * sum through here, so they agree bit for bit. */
#define FR_BN_CHUNK 512

FR_BN_VEC static void chunk_sums(const float *g, const float *xp, int len, double mu, double is,
                             double *sdy, double *sdyxh) {
    double a = *sdy, b = *sdyxh;
#pragma omp simd reduction(+ : a, b)
    for (int j = 0; j < len; j++) {
        double gd = g[j];
        a += gd;
        b += gd * (((double)xp[j] - mu) * is);
    }
    *sdy = a;
    *sdyxh = b;
}

fr_status fr_cpu_batch_norm_invstd(float *invstd, const float *var, float eps, int c) {
    for (int ch = 0; ch < c; ch++)
        invstd[ch] = (float)(1.0 / sqrt((double)var[ch] + (double)eps));
    return FR_OK;
}

fr_status fr_cpu_batch_norm_update_running(float *running_mean, float *running_var, const float *mean,
                                   const float *var, float momentum, int count, int c) {
    /* PyTorch keeps the unbiased variance in its running estimate although
     * it normalises the batch with the biased one. */
    double bessel = count > 1 ? (double)count / (double)(count - 1) : 1.0;
    double m = momentum;
    for (int ch = 0; ch < c; ch++) {
        running_mean[ch] = (float)((1.0 - m) * running_mean[ch] + m * mean[ch]);
        running_var[ch] = (float)((1.0 - m) * running_var[ch] + m * var[ch] * bessel);
    }
    return FR_OK;
}

/* One plane of bn_act_forward: the loop written once per activation and
 * residual case, so that each stays a branch-free `omp simd` loop where the
 * activation has a vector form (FR_BN_VEC carries FR_SELECT_BLEND,
 * cpu/simd.h, so leaky ReLU's select is a blend: it was a scalar loop with
 * a branch per element, 10% of an abn step). The steps round as the
 * separate kernels do: v = (x - mu) * sc + b, then v + r, then
 * fr_act_fwd (tensor/activation.h), the plain kernel's formula. */
#define FR_BN_ACT_PLANE(A)                                                       \
    do {                                                                         \
        if (rp) {                                                                \
            _Pragma("omp simd") for (int j = 0; j < hw; j++) {                   \
                float v = (xp[j] - mu) * sc + b;                                 \
                v = v + rp[j];                                                   \
                yp[j] = fr_act_fwd_##A(v, slope);                                 \
            }                                                                    \
        } else {                                                                 \
            _Pragma("omp simd") for (int j = 0; j < hw; j++) {                   \
                float v = (xp[j] - mu) * sc + b;                                 \
                yp[j] = fr_act_fwd_##A(v, slope);                                 \
            }                                                                    \
        }                                                                        \
    } while (0)

FR_BN_VEC static void plane_forward(float *yp, const float *xp, const float *rp, float mu, float sc,
                                    float b, fr_act act, float slope, int hw) {
    switch (act) {
#define FR_BN_ACT_CASE_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                        \
        FR_BN_ACT_PLANE(NAME);        \
        break;
        FR_ACT_LIST(FR_BN_ACT_CASE_)
#undef FR_BN_ACT_CASE_
    default:
        break; /* checked by the caller (ops_batchnorm.c) */
    }
}

fr_status fr_cpu_bn_act_forward(float *y, const float *x, const float *residual, const float *mean,
                                const float *invstd, const float *gamma, const float *beta,
                                fr_act act, float slope, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    int planes = n * c;
#pragma omp parallel for if (total > FR_BN_PAR_MIN && planes > 1) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        int ch = pl % c;
        float sc = invstd[ch] * gamma[ch];
        float mu = mean[ch], b = beta[ch];
        const float *xp = x + (size_t)pl * (size_t)hw;
        const float *rp = residual ? residual + (size_t)pl * (size_t)hw : NULL;
        plane_forward(y + (size_t)pl * (size_t)hw, xp, rp, mu, sc, b, act, slope, hw);
    }
    return FR_OK;
}

/* g = dy * act'(s) over one chunk with fr_act_grad, the plain backward
 * kernel's formula, so the bits are its own (branch-free where the
 * activation has a vector form: the signs of real activations are
 * unpredictable). s is act_out for an activation whose gradient needs only
 * its output, else the forward's pre-activation (x - mu) * sc + b in its
 * rounding, passed through fr_act_fwd when the output is what the gradient
 * reads. */
#define FR_BN_GRAD_CHUNK(A, NEEDS)                                               \
    do {                                                                         \
        if (act_out && (NEEDS) == FR_ACT_NEEDS_OUTPUT) {                         \
            _Pragma("omp simd") for (int j = 0; j < len; j++)                    \
                g[j] = fr_act_grad_##A(dy[j], act_out[j], slope);                 \
        } else {                                                                 \
            _Pragma("omp simd") for (int j = 0; j < len; j++) {                  \
                float pre = (xp[j] - mu) * sc + b;                               \
                float s = (NEEDS) == FR_ACT_NEEDS_OUTPUT ? fr_act_fwd_##A(pre, slope) \
                                                         : pre;                  \
                g[j] = fr_act_grad_##A(dy[j], s, slope);                          \
            }                                                                    \
        }                                                                        \
    } while (0)

FR_BN_VEC static void chunk_grad(float *g, const float *dy, const float *act_out, const float *xp,
                             float mu, float sc, float b, fr_act act, float slope, int len) {
    switch (act) {
#define FR_BN_GRAD_CASE_(NAME, name, needs, inv)      \
    case FR_ACT_##NAME:                               \
        FR_BN_GRAD_CHUNK(NAME, needs);       \
        break;
        FR_ACT_LIST(FR_BN_GRAD_CASE_)
#undef FR_BN_GRAD_CASE_
    default:
        break; /* checked by the caller (ops_batchnorm.c) */
    }
}

/* dx over one run of a ReLU or leaky ReLU whose g = dy * act'(pre) is
 * rebuilt from dy and x (pre = (x - mu) * sc + b in the forward's
 * rounding, as chunk_grad rebuilds it), then plane_dx's formula: the same
 * bits as writing g in the first pass and reading it back here, with two
 * fewer streams over memory (g is not stored and loaded again). */
#define FR_BN_DX_REGEN(A)                                                                   \
    do {                                                                                    \
        _Pragma("omp simd") for (int j = 0; j < len; j++) {                                 \
            float pre = (xp[j] - mu_f) * sc + b;                                            \
            float g = fr_act_grad_##A(dy[j], fr_act_fwd_##A(pre, slope), slope);            \
            double xh = ((double)xp[j] - mu) * is;                                          \
            dxp[j] = (float)(k * ((double)g - mdy - xh * mdyxh));                           \
        }                                                                                   \
    } while (0)

FR_BN_VEC static void plane_dx_regen(float *dxp, const float *dy, const float *xp, int len,
                                     float mu_f, float sc, float b, fr_act act, float slope,
                                     double mu, double is, double k, double mdy, double mdyxh) {
    if (act == FR_ACT_RELU)
        FR_BN_DX_REGEN(RELU);
    else
        FR_BN_DX_REGEN(LEAKY_RELU);
}

fr_status fr_cpu_bn_act_backward(float *dx, float *dz, float *dgamma, float *dbeta, const float *dy,
                                 const float *act_out, const float *x, const float *mean,
                                 const float *invstd, const float *gamma, const float *beta,
                                 fr_act act, float slope, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
#pragma omp parallel for if (total > FR_BN_PAR_MIN && c > 1) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        double mu = mean[ch], is = invstd[ch];
        /* the forward's pre-activation, in its rounding, when no output is
         * kept to read the sign from */
        float mu_f = mean[ch], sc = invstd[ch] * gamma[ch], b = beta ? beta[ch] : 0.0f;
        /* g is written where it will be read again: dz when wanted, else dx
         * (overwritten by the second pass); the identity without dz reads
         * dy itself (batch_norm_backward) */
        bool g_is_dy = act == FR_ACT_IDENTITY && !dz;
        /* ReLU and leaky ReLU rebuilt from x (no output kept, no dz): g
         * stays in `local` for the sums and the second pass rebuilds it
         * (plane_dx_regen) rather than reading it back from dx */
        bool regen = !dz && !act_out && (act == FR_ACT_RELU || act == FR_ACT_LEAKY_RELU);
        float *gout = dz ? dz : g_is_dy || regen ? NULL : dx;
        double sdy = 0.0, sdyxh = 0.0;
        float local[FR_BN_CHUNK];
        for (int i = 0; i < n; i++) {
            size_t at = ((size_t)i * (size_t)c + (size_t)ch) * (size_t)hw;
            for (int j0 = 0; j0 < hw; j0 += FR_BN_CHUNK) {
                int len = hw - j0 < FR_BN_CHUNK ? hw - j0 : FR_BN_CHUNK;
                size_t o = at + (size_t)j0;
                const float *g = dy + o;
                if (!g_is_dy) {
                    float *w = gout ? gout + o : local;
                    chunk_grad(w, dy + o, act_out ? act_out + o : NULL, x + o, mu_f, sc, b, act,
                               slope, len);
                    g = w;
                }
                chunk_sums(g, x + o, len, mu, is, &sdy, &sdyxh);
            }
        }
        dbeta[ch] = (float)sdy;
        dgamma[ch] = (float)sdyxh;
        if (!dx)
            continue;
        /* With xhat = (x - mean) * invstd and M = N*HW values per channel:
         * dx = gamma * invstd * (g - mean(g) - xhat * mean(g * xhat)),
         * the mean and variance terms being what the batch statistics
         * contribute. */
        double count = (double)n * (double)hw;
        double mdy = sdy / count, mdyxh = sdyxh / count, k = (double)gamma[ch] * is;
        const float *gsrc = g_is_dy ? dy : gout;
        for (int i = 0; i < n; i++) {
            size_t at = ((size_t)i * (size_t)c + (size_t)ch) * (size_t)hw;
            if (regen)
                plane_dx_regen(dx + at, dy + at, x + at, hw, mu_f, sc, b, act, slope, mu, is, k,
                               mdy, mdyxh);
            else
                plane_dx(dx + at, gsrc + at, x + at, hw, mu, is, k, mdy, mdyxh);
        }
    }
    return FR_OK;
}

/* bn_act_backward with the identity: dx and the sums from dy itself. */
fr_status fr_cpu_batch_norm_backward(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                        const float *mean, const float *invstd, const float *gamma, int n, int c,
                        int hw) {
    return fr_cpu_bn_act_backward(dx, NULL, dgamma, dbeta, dy, NULL, x, mean, invstd, gamma, NULL,
                                  FR_ACT_IDENTITY, 0.0f, n, c, hw);
}

fr_status fr_cpu_batch_norm_backward_data(float *dx, const float *dy, const float *x, const float *mean,
                             const float *invstd, const float *gamma, const float *dgamma,
                             const float *dbeta, double count, int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    int planes = n * c;
#pragma omp parallel for if (total > FR_BN_PAR_MIN && planes > 1) schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        int ch = pl % c;
        double mu = mean[ch], is = invstd[ch], k = (double)gamma[ch] * is;
        double mdy = dbeta[ch] / count, mdyxh = dgamma[ch] / count;
        size_t at = (size_t)pl * (size_t)hw;
        plane_dx(dx + at, dy + at, x + at, hw, mu, is, k, mdy, mdyxh);
    }
    return FR_OK;
}
