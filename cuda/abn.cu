/* abn.cu: the InPlace-ABN kernels on the GPU (kernels.def), the same
 * arithmetic as cpu/abn.c. */
#include "internal.h"
#include "../tensor/activation.h"

__global__ void abn_gamma_kernel(float *gamma_eff, const float *gamma, float eps, int c) {
    FR_CUDA_FOR(i, c) gamma_eff[i] = fabsf(gamma[i]) + eps;
}

/* d|gamma|/dgamma is taken as +1 at 0 and NaN at NaN, like the CPU kernel. */
__global__ void abn_gamma_grad_kernel(float *dgamma, const float *dgamma_eff, const float *gamma,
                                      int c) {
    FR_CUDA_FOR(i, c) {
        float g = gamma[i];
        dgamma[i] = g >= 0.0f ? dgamma_eff[i] : g < 0.0f ? -dgamma_eff[i] : g;
    }
}

/* z = y >= 0 ? y : y * (1 / slope); xhat = (z - residual - beta) / gamma_eff, with
 * both divisions done as multiplications by a reciprocal and every operation
 * rounded separately, as on the CPU. Each thread reads y[i] before writing
 * xhat[i], so xhat may be y. */
__global__ void abn_invert_kernel(float *xhat, const float *y, const float *gamma_eff,
                                  const float *beta, const float *residual, float slope,
                                  int c, size_t hw, size_t total) {
    FR_CUDA_FOR(i, total) {
        size_t ch = (i / hw) % (size_t)c;
        float v = y[i];
        /* fr_act_inv (tensor/activation.h); the select keeps the product
         * from fusing with the subtraction below */
        float z = fr_act_inv(FR_ACT_LEAKY_RELU, v, slope);
        if (residual)
            z -= residual[i];
        xhat[i] = (z - beta[ch]) * (1.0f / gamma_eff[ch]);
    }
}

extern "C" fr_status fr_cuda_abn_gamma(float *gamma_eff, const float *gamma, float eps, int c) {
    if (c <= 0)
        return FR_OK;
    abn_gamma_kernel<<<fr_cuda_grid((size_t)c), FR_CUDA_THREADS>>>(gamma_eff, gamma, eps, c);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_abn_gamma_grad(float *dgamma, const float *dgamma_eff,
                                            const float *gamma, int c) {
    if (c <= 0)
        return FR_OK;
    abn_gamma_grad_kernel<<<fr_cuda_grid((size_t)c), FR_CUDA_THREADS>>>(dgamma, dgamma_eff, gamma, c);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}

extern "C" fr_status fr_cuda_abn_invert(float *xhat, const float *y, const float *gamma_eff,
                                        const float *beta, const float *residual, float slope,
                                        int n, int c, int hw) {
    size_t total = (size_t)n * (size_t)c * (size_t)hw;
    FR_CUDA_RUN_1D(abn_invert_kernel, total, xhat, y, gamma_eff, beta, residual,
                                                                slope, c, (size_t)hw, total);
}
