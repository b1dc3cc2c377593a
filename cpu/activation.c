/* cpu/activation.c: ReLU and leaky ReLU kernels on the host.
 *
 * Backward reads the output y rather than the input: y > 0 exactly when
 * x > 0 (for leaky ReLU because the slope is positive), so an inplace forward
 * that overwrote x loses nothing the gradient needs. Every loop reads element
 * i before writing element i, which makes y == x and dx == dy safe. */
#include "../tensor/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_ACT_PAR_MIN 32768

fr_status fr_cpu_relu_fwd(float *y, const float *x, size_t n) {
#pragma omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return FR_OK;
}

fr_status fr_cpu_relu_bwd(float *dx, const float *dy, const float *y, size_t n) {
    /* PyTorch's gradient at x == 0 is 0; y == 0 there, so the test y > 0
     * gives the same. */
#pragma omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    return FR_OK;
}

fr_status fr_cpu_leaky_relu_fwd(float *y, const float *x, float slope, size_t n) {
#pragma omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : x[i] * slope;
    return FR_OK;
}

fr_status fr_cpu_leaky_relu_bwd(float *dx, const float *dy, const float *y, float slope, size_t n) {
#pragma omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : dy[i] * slope;
    return FR_OK;
}
