/* cpu/abn.c: the InPlace-ABN kernels on the host (see kernels.def). */
#include <math.h>

#include "../tensor/kernels.h"

fr_status fr_cpu_abn_gamma(float *gamma_eff, const float *gamma, float eps, int c) {
    for (int i = 0; i < c; i++)
        gamma_eff[i] = fabsf(gamma[i]) + eps;
    return FR_OK;
}

fr_status fr_cpu_abn_gamma_grad(float *dgamma, const float *dgamma_eff, const float *gamma, int c) {
    for (int i = 0; i < c; i++)
        dgamma[i] = gamma[i] >= 0.0f ? dgamma_eff[i] : -dgamma_eff[i];
    return FR_OK;
}

fr_status fr_cpu_abn_invert(float *xhat, const float *y, const float *gamma_eff, const float *beta,
                            const float *residual, float slope, int n, int c, int hw) {
    float inv_slope = 1.0f / slope;
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) {
            size_t base = ((size_t)i * (size_t)c + (size_t)ch) * (size_t)hw;
            float inv_g = 1.0f / gamma_eff[ch], b = beta[ch];
            for (int p = 0; p < hw; p++) {
                float v = y[base + p];
                float z = v >= 0.0f ? v : v * inv_slope;
                if (residual)
                    z -= residual[base + p];
                xhat[base + p] = (z - b) * inv_g;
            }
        }
    return FR_OK;
}
