/* cpu/abn.c: the InPlace-ABN kernels on the host (see kernels.def). */
#include <math.h>

#include "../tensor/activation.h"
#include "../tensor/kernels.h"
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
