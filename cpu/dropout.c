/* cpu/dropout.c: dropout kernels on the host (see kernels.def). A dropped
 * element is x * 0, as in PyTorch (input * mask * scale): a NaN or an inf
 * stays NaN instead of becoming 0. */
#include "../tensor/kernels.h"

fr_status fr_cpu_dropout_forward(float *y, const float *x, float p, uint64_t seed, size_t n) {
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > 32768) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * (fr_dropout_uniform(seed, i) >= p ? scale : 0.0f);
    return FR_OK;
}

fr_status fr_cpu_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, size_t n) {
    return fr_cpu_dropout_forward(dx, dy, p, seed, n);
}
