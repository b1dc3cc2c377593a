/* cpu/abn.c: the InPlace-ABN kernels on the host (see kernels.def). */
#include <math.h>

#include "../tensor/activation.h"
#include "../tensor/kernels.h"
#include "../tensor/memory.h"
#include "layout.h"
#include "simd.h"

fr_status fr_cpu_abn_gamma(float *gamma_eff, const float *gamma, float eps, int c) {
    for (int i = 0; i < c; i++)
        gamma_eff[i] = fabsf(gamma[i]) + eps;
    return FR_OK;
}

/* d|gamma|/dgamma is +1 at 0, and NaN at a NaN gamma (as PyTorch's abs
 * backward: dy * sgn(NaN) = NaN), so a corrupt gamma is not hidden. */
fr_status fr_cpu_abn_gamma_grad(float *dgamma, const float *dgamma_eff, const float *gamma, int c) {
    for (int i = 0; i < c; i++)
        dgamma[i] = gamma[i] >= 0.0f ? dgamma_eff[i] : gamma[i] < 0.0f ? -dgamma_eff[i] : gamma[i];
    return FR_OK;
}

/* One plane of abn_invert, a branch-free `omp simd` loop per residual case
 * (FR_SELECT_BLEND, cpu/simd.h, makes the select a blend). The output is
 * leaky ReLU's (slope 1: the identity) inverted by fr_act_inv
 * (tensor/activation.h). */
__attribute__((target_clones("avx2", "default"))) FR_SELECT_BLEND static void invert_plane(
    float *xh, const float *y, const float *r, float inv_g, float b, float slope, int hw) {
    if (r) {
#pragma omp simd
        for (int p = 0; p < hw; p++) {
            float z = fr_act_inv(FR_ACT_LEAKY_RELU, y[p], slope);
            z -= r[p];
            xh[p] = (z - b) * inv_g;
        }
    } else {
#pragma omp simd
        for (int p = 0; p < hw; p++) {
            float z = fr_act_inv(FR_ACT_LEAKY_RELU, y[p], slope);
            xh[p] = (z - b) * inv_g;
        }
    }
}

fr_status fr_cpu_abn_invert(float *xhat, const float *y, const float *gamma_eff, const float *beta,
                            const float *residual, float slope, int n, int c, int hw) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) {
            size_t base = ((size_t)i * (size_t)c + (size_t)ch) * (size_t)hw;
            invert_plane(xhat + base, y + base, residual ? residual + base : NULL,
                         1.0f / gamma_eff[ch], beta[ch], slope, hw);
        }
    return FR_OK;
}

/* One pixel's channels of fr_cpu_abn_invert_nhwc: per-channel constants
 * read along the channel, as the NCHW kernel reads them per plane. */
FR_BN_VEC static void invert_pixels(float *xh, const float *y, const float *r,
                                    const float *restrict inv_g, const float *restrict b,
                                    float slope, size_t p0, size_t p1, int c) {
    for (size_t p = p0; p < p1; p++) {
        size_t o = p * (size_t)c;
        if (r) {
#pragma omp simd
            for (int ch = 0; ch < c; ch++) {
                float z = fr_act_inv(FR_ACT_LEAKY_RELU, y[o + ch], slope) - r[o + ch];
                xh[o + ch] = (z - b[ch]) * inv_g[ch];
            }
        } else {
#pragma omp simd
            for (int ch = 0; ch < c; ch++) {
                float z = fr_act_inv(FR_ACT_LEAKY_RELU, y[o + ch], slope);
                xh[o + ch] = (z - b[ch]) * inv_g[ch];
            }
        }
    }
}

/* layout.h: abn_invert's formula element by element, so the bits are the
 * NCHW kernel's (1 / gamma_eff rounded once per channel in both). */
fr_status fr_cpu_abn_invert_nhwc(float *xhat, const float *y, const float *gamma_eff,
                                 const float *beta, const float *residual, float slope, size_t px,
                                 int c) {
    size_t bytes = (size_t)(c ? c : 1) * sizeof(float);
    float *inv_g = fr_mem_alloc(FR_CPU, bytes, FR_TAG_WORKSPACE);
    if (!inv_g)
        return fr_last_status();
    for (int ch = 0; ch < c; ch++)
        inv_g[ch] = 1.0f / gamma_eff[ch];
    /* pixel blocks of about 16 KiB of y each */
    size_t per = (size_t)4096 / (size_t)(c ? c : 1) + 1;
    size_t blocks = (px + per - 1) / per;
#pragma omp parallel for if (px * (size_t)c > 65536) schedule(static)
    for (size_t i = 0; i < blocks; i++) {
        size_t p0 = i * per, p1 = p0 + per < px ? p0 + per : px;
        invert_pixels(xhat, y, residual, inv_g, beta, slope, p0, p1, c);
    }
    fr_mem_free(FR_CPU, inv_g, bytes, FR_TAG_WORKSPACE);
    return FR_OK;
}
