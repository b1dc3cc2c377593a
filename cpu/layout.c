/* cpu/layout.c: channels-last (NHWC) activations on the CPU (layout.h): the
 * NCHW <-> NHWC transposes, and batch norm + residual + activation with one
 * vector over a pixel's channels where cpu/batchnorm.c runs one over a
 * channel's plane. These are the kernels a channels-last layout between
 * ops needs beside the convolution's nhwc entry (conv.h); measured against
 * the NCHW kernels by bench/bench_conv_layout.c (docs/ARCHITECTURE.md, "CPU
 * convolution and GEMM", layout between ops). */
#include "layout.h"

#include "../tensor/memory.h"
#include "simd.h"

/* Transposes run in tiles of this many pixels x channels, so both sides
 * stay in cache lines the tile reuses. */
#define TILE 16

/* dst (cols, rows) from src (rows, cols). */
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += TILE)
        for (int c0 = 0; c0 < cols; c0 += TILE) {
            int r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int r = r0; r < r1; r++)
                for (int cc = c0; cc < c1; cc++)
                    dst[(size_t)cc * (size_t)rows + (size_t)r] = src[(size_t)r * (size_t)cols + (size_t)cc];
        }
}

void fr_cpu_nchw_to_nhwc(float *dst, const float *src, int n, int c, int hw) {
    size_t img = (size_t)c * (size_t)hw;
#pragma omp parallel for if ((size_t)n * img > FR_BN_PAR_MIN && n > 1) schedule(static)
    for (int i = 0; i < n; i++) /* image i: (C, HW) -> (HW, C) */
        transpose(dst + (size_t)i * img, src + (size_t)i * img, c, hw);
}

void fr_cpu_nhwc_to_nchw(float *dst, const float *src, int n, int c, int hw) {
    size_t img = (size_t)c * (size_t)hw;
#pragma omp parallel for if ((size_t)n * img > FR_BN_PAR_MIN && n > 1) schedule(static)
    for (int i = 0; i < n; i++) /* image i: (HW, C) -> (C, HW) */
        transpose(dst + (size_t)i * img, src + (size_t)i * img, hw, c);
}

/* ---- batch norm: the pixels in FR_CPU_LAYOUT_GROUPS fixed groups ---- */

static size_t group_start(size_t px, int groups, int g) {
    return (size_t)((unsigned long long)px * (unsigned long long)g / (unsigned long long)groups);
}

static int groups_of(size_t px) {
    return px < FR_CPU_LAYOUT_GROUPS ? (px ? (int)px : 1) : FR_CPU_LAYOUT_GROUPS;
}

/* Double sums of a group's pixels, one vector over the channels (FR_BN_VEC,
 * cpu/simd.h: a channel's sum runs over the pixels in order in every copy,
 * so the copies give the same bits). */

FR_BN_VEC static void group_stats(double *restrict s, double *restrict ss,
                                   const float *restrict x, const double *restrict shift,
                                   size_t p0, size_t p1, int c) {
    for (int ch = 0; ch < c; ch++)
        s[ch] = ss[ch] = 0.0;
    for (size_t p = p0; p < p1; p++) {
        const float *restrict xp = x + p * (size_t)c;
#pragma omp simd
        for (int ch = 0; ch < c; ch++) {
            double d = (double)xp[ch] - shift[ch];
            s[ch] += d;
            ss[ch] += d * d;
        }
    }
}

/* Workspace for the groups' partial sums: 2 x groups x c doubles, and the
 * c-long per-channel constants after them (`extra` arrays of c doubles). */
static double *sums_alloc(int groups, int c, int extra, size_t *bytes) {
    *bytes = ((size_t)2 * (size_t)groups + (size_t)extra) * (size_t)c * sizeof(double);
    if (!*bytes) /* c == 0: one double, so the block is real and freed alike */
        *bytes = sizeof(double);
    return fr_mem_alloc(FR_CPU, *bytes, FR_TAG_WORKSPACE);
}

fr_status fr_cpu_batch_norm_stats_nhwc(float *mean, float *var, const float *x, size_t px, int c) {
    int groups = groups_of(px);
    size_t bytes;
    double *ws = sums_alloc(groups, c, 1, &bytes);
    if (!ws)
        return fr_last_status();
    double *shift = ws + (size_t)2 * (size_t)groups * (size_t)c;
    /* the shift is the channel's first value, as the NCHW kernel's */
    for (int ch = 0; ch < c; ch++)
        shift[ch] = px ? x[ch] : 0.0;
#pragma omp parallel for if (px * (size_t)c > FR_BN_PAR_MIN) schedule(static)
    for (int g = 0; g < groups; g++)
        group_stats(ws + (size_t)2 * (size_t)g * (size_t)c, ws + ((size_t)2 * (size_t)g + 1) * (size_t)c,
                    x, shift, group_start(px, groups, g), group_start(px, groups, g + 1), c);
    double count = (double)px;
    for (int ch = 0; ch < c; ch++) {
        double s = 0.0, ss = 0.0;
        for (int g = 0; g < groups; g++) { /* in group order */
            s += ws[(size_t)2 * (size_t)g * (size_t)c + (size_t)ch];
            ss += ws[((size_t)2 * (size_t)g + 1) * (size_t)c + (size_t)ch];
        }
        double m = count > 0 ? s / count : 0.0, v = count > 0 ? ss / count - m * m : 0.0;
        mean[ch] = (float)(shift[ch] + m);
        var[ch] = (float)(v < 0.0 ? 0.0 : v);
    }
    fr_mem_free(FR_CPU, ws, bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}

/* One pixel of bn_act_forward: cpu/batchnorm.c's steps and rounding,
 * v = (x - mu) * sc + b, then v + r, then fr_act_fwd. */
#define PIXEL_FORWARD(A)                                                         \
    do {                                                                         \
        if (rp) {                                                                \
            _Pragma("omp simd") for (int ch = 0; ch < c; ch++) {                 \
                float v = (xp[ch] - mu[ch]) * sc[ch] + b[ch];                    \
                v = v + rp[ch];                                                  \
                yp[ch] = fr_act_fwd_##A(v, slope);                               \
            }                                                                    \
        } else {                                                                 \
            _Pragma("omp simd") for (int ch = 0; ch < c; ch++) {                 \
                float v = (xp[ch] - mu[ch]) * sc[ch] + b[ch];                    \
                yp[ch] = fr_act_fwd_##A(v, slope);                               \
            }                                                                    \
        }                                                                        \
    } while (0)

FR_BN_VEC static void pixels_forward(float *y, const float *x, const float *residual,
                                      const float *restrict mu, const float *restrict sc,
                                      const float *restrict b, fr_act act, float slope, size_t p0,
                                      size_t p1, int c) {
    for (size_t p = p0; p < p1; p++) {
        size_t o = p * (size_t)c;
        float *yp = y + o;
        const float *xp = x + o, *rp = residual ? residual + o : NULL;
        switch (act) {
#define LAYOUT_FWD_CASE_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                          \
        PIXEL_FORWARD(NAME);                     \
        break;
            FR_ACT_LIST(LAYOUT_FWD_CASE_)
#undef LAYOUT_FWD_CASE_
        default:
            break; /* checked by the caller */
        }
    }
}

/* Per-channel float constants of the forward: mu, sc = invstd * gamma, b. */
static float *channel_consts(const float *mean, const float *invstd, const float *gamma,
                             const float *beta, int c, size_t *bytes) {
    *bytes = (size_t)3 * (size_t)(c ? c : 1) * sizeof(float);
    float *k = fr_mem_alloc(FR_CPU, *bytes, FR_TAG_WORKSPACE);
    if (!k)
        return NULL;
    for (int ch = 0; ch < c; ch++) {
        k[ch] = mean[ch];
        k[c + ch] = invstd[ch] * gamma[ch];
        k[2 * c + ch] = beta ? beta[ch] : 0.0f;
    }
    return k;
}

fr_status fr_cpu_bn_act_forward_nhwc(float *y, const float *x, const float *residual,
                                     const float *mean, const float *invstd, const float *gamma,
                                     const float *beta, fr_act act, float slope, size_t px, int c) {
    if ((unsigned)act >= FR_ACT_COUNT)
        return fr_error(FR_ERR_ARG, "bn_act (nhwc): unknown activation %d", (int)act);
    size_t bytes;
    float *k = channel_consts(mean, invstd, gamma, beta, c, &bytes);
    if (!k)
        return fr_last_status();
    int groups = groups_of(px);
#pragma omp parallel for if (px * (size_t)c > FR_BN_PAR_MIN) schedule(static)
    for (int g = 0; g < groups; g++)
        pixels_forward(y, x, residual, k, k + c, k + 2 * c, act, slope, group_start(px, groups, g),
                       group_start(px, groups, g + 1), c);
    fr_mem_free(FR_CPU, k, bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}

/* g = dy * act'(s) over one pixel, cpu/batchnorm.c's formula (s = act_out
 * where the activation's gradient reads its output and it was kept, else
 * the pre-activation in the forward's rounding). */
#define PIXEL_GRAD(A, NEEDS)                                                     \
    do {                                                                         \
        if (ao && (NEEDS) == FR_ACT_NEEDS_OUTPUT) {                              \
            _Pragma("omp simd") for (int ch = 0; ch < c; ch++)                   \
                gp[ch] = fr_act_grad_##A(dyp[ch], ao[ch], slope);                 \
        } else {                                                                 \
            _Pragma("omp simd") for (int ch = 0; ch < c; ch++) {                 \
                float pre = (xp[ch] - mu[ch]) * sc[ch] + b[ch];                  \
                float s = (NEEDS) == FR_ACT_NEEDS_OUTPUT ? fr_act_fwd_##A(pre, slope) \
                                                         : pre;                  \
                gp[ch] = fr_act_grad_##A(dyp[ch], s, slope);                      \
            }                                                                    \
        }                                                                        \
    } while (0)

/* Pass 1 over a group: g where it is kept (gout; NULL: g is dy itself),
 * and the group's sums of g and g * xhat. */
FR_BN_VEC static void group_grad_sums(float *gout, double *restrict a, double *restrict bsum,
                                       const float *dy, const float *act_out, const float *x,
                                       const float *restrict mu, const float *restrict sc,
                                       const float *restrict b, const double *restrict mud,
                                       const double *restrict is, fr_act act, float slope,
                                       size_t p0, size_t p1, int c) {
    for (int ch = 0; ch < c; ch++)
        a[ch] = bsum[ch] = 0.0;
    for (size_t p = p0; p < p1; p++) {
        size_t o = p * (size_t)c;
        const float *dyp = dy + o, *xp = x + o, *ao = act_out ? act_out + o : NULL;
        const float *g = dyp;
        if (gout) {
            float *gp = gout + o;
            switch (act) {
#define LAYOUT_GRAD_CASE_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                           \
        PIXEL_GRAD(NAME, needs);                  \
        break;
                FR_ACT_LIST(LAYOUT_GRAD_CASE_)
#undef LAYOUT_GRAD_CASE_
            default:
                break;
            }
            g = gp;
        }
#pragma omp simd
        for (int ch = 0; ch < c; ch++) {
            double gd = g[ch];
            a[ch] += gd;
            bsum[ch] += gd * (((double)xp[ch] - mud[ch]) * is[ch]);
        }
    }
}

/* Pass 2: dx = k * (g - mdy - xhat * mdyxh), cpu/batchnorm.c's formula. */
FR_BN_VEC static void group_dx(float *dx, const float *g, const float *x,
                                const double *restrict mud, const double *restrict is,
                                const double *restrict k, const double *restrict mdy,
                                const double *restrict mdyxh, size_t p0, size_t p1, int c) {
    for (size_t p = p0; p < p1; p++) {
        size_t o = p * (size_t)c;
#pragma omp simd
        for (int ch = 0; ch < c; ch++) {
            double xh = ((double)x[o + ch] - mud[ch]) * is[ch];
            dx[o + ch] = (float)(k[ch] * ((double)g[o + ch] - mdy[ch] - xh * mdyxh[ch]));
        }
    }
}

fr_status fr_cpu_bn_act_backward_nhwc(float *dx, float *dz, float *dgamma, float *dbeta,
                                      const float *dy, const float *act_out, const float *x,
                                      const float *mean, const float *invstd, const float *gamma,
                                      const float *beta, fr_act act, float slope, size_t px, int c) {
    if ((unsigned)act >= FR_ACT_COUNT)
        return fr_error(FR_ERR_ARG, "bn_act backward (nhwc): unknown activation %d", (int)act);
    int groups = groups_of(px);
    size_t bytes, kbytes;
    /* after the groups' sums: mu, invstd, k, mdy, mdyxh in double */
    double *ws = sums_alloc(groups, c, 5, &bytes);
    float *kf = ws ? channel_consts(mean, invstd, gamma, beta, c, &kbytes) : NULL;
    if (!kf) {
        if (ws)
            fr_mem_free(FR_CPU, ws, bytes, FR_TAG_WORKSPACE);
        return fr_last_status();
    }
    double *mud = ws + (size_t)2 * (size_t)groups * (size_t)c, *is = mud + c, *k = is + c;
    double *mdy = k + c, *mdyxh = mdy + c;
    for (int ch = 0; ch < c; ch++) {
        mud[ch] = mean[ch];
        is[ch] = invstd[ch];
        k[ch] = (double)gamma[ch] * is[ch];
    }
    /* g is kept where it is read again: dz when wanted, else dx (the second
     * pass overwrites it); the identity without dz reads dy itself */
    bool g_is_dy = act == FR_ACT_IDENTITY && !dz;
    float *gout = dz ? dz : g_is_dy ? NULL : dx;
    float *local = NULL;
    size_t local_bytes = px * (size_t)c * sizeof(float);
    local_bytes = local_bytes ? local_bytes : 4; /* an empty batch: a real block, freed alike */
    if (!g_is_dy && !gout) { /* neither dz nor dx: g has nowhere to go */
        if (!(local = fr_mem_alloc(FR_CPU, local_bytes, FR_TAG_WORKSPACE))) {
            fr_mem_free(FR_CPU, kf, kbytes, FR_TAG_WORKSPACE);
            fr_mem_free(FR_CPU, ws, bytes, FR_TAG_WORKSPACE);
            return fr_last_status();
        }
        gout = local;
    }
#pragma omp parallel for if (px * (size_t)c > FR_BN_PAR_MIN) schedule(static)
    for (int g = 0; g < groups; g++)
        group_grad_sums(gout, ws + (size_t)2 * (size_t)g * (size_t)c,
                        ws + ((size_t)2 * (size_t)g + 1) * (size_t)c, dy, act_out, x, kf, kf + c,
                        kf + 2 * c, mud, is, act, slope, group_start(px, groups, g),
                        group_start(px, groups, g + 1), c);
    double count = (double)px;
    for (int ch = 0; ch < c; ch++) {
        double sdy = 0.0, sdyxh = 0.0;
        for (int g = 0; g < groups; g++) { /* in group order */
            sdy += ws[(size_t)2 * (size_t)g * (size_t)c + (size_t)ch];
            sdyxh += ws[((size_t)2 * (size_t)g + 1) * (size_t)c + (size_t)ch];
        }
        dbeta[ch] = (float)sdy;
        dgamma[ch] = (float)sdyxh;
        mdy[ch] = sdy / count;
        mdyxh[ch] = sdyxh / count;
    }
    if (dx) {
        const float *gsrc = g_is_dy ? dy : gout;
#pragma omp parallel for if (px * (size_t)c > FR_BN_PAR_MIN) schedule(static)
        for (int g = 0; g < groups; g++)
            group_dx(dx, gsrc, x, mud, is, k, mdy, mdyxh, group_start(px, groups, g),
                     group_start(px, groups, g + 1), c);
    }
    if (local)
        fr_mem_free(FR_CPU, local, local_bytes, FR_TAG_WORKSPACE);
    fr_mem_free(FR_CPU, kf, kbytes, FR_TAG_WORKSPACE);
    fr_mem_free(FR_CPU, ws, bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}
