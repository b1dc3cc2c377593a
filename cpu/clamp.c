/* cpu/clamp.c: clamp forward and backward (kernels.def). */
#include "../tensor/kernels.h"

fr_status fr_cpu_clamp_forward(float *y, const float *x, float lo, float hi, size_t n) {
#pragma omp parallel for if (n > 32768) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
    return FR_OK;
}

/* The bounds themselves pass the gradient, as PyTorch's clamp does. */
fr_status fr_cpu_clamp_backward(float *dx, const float *dy, const float *x, float lo, float hi,
                                size_t n) {
#pragma omp parallel for if (n > 32768) schedule(static)
    for (size_t i = 0; i < n; i++)
        dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
    return FR_OK;
}
