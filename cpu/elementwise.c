/* cpu/elementwise.c: elementwise and reduction kernels on the host. The
 * elementwise loops are `omp ... simd`: -O2 leaves them scalar (it does not
 * version a loop for aliasing), and the tape's gradient sums (fr_axpy_) were
 * 2.8% of a one-thread ResNet-56 step (docs/ARCHITECTURE.md, "CPU
 * convolution and GEMM"; bench/RESULTS.md has the profile). Each
 * element's arithmetic is the same, so are the bits; the sum keeps its
 * scalar order. */
#include "../tensor/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_PAR_MIN 32768

fr_status fr_cpu_fill(float *y, float value, size_t n) {
#pragma omp parallel for simd if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = value;
    return FR_OK;
}

fr_status fr_cpu_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return FR_OK;
}

fr_status fr_cpu_mul(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
    return FR_OK;
}

fr_status fr_cpu_scale(float *y, const float *x, float alpha, size_t n) {
#pragma omp parallel for simd if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = alpha * x[i];
    return FR_OK;
}

fr_status fr_cpu_axpy(float *y, float alpha, const float *x, size_t n) {
#pragma omp parallel for simd if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return FR_OK;
}

fr_status fr_cpu_fill_from(float *y, const float *src, float scale, size_t n) {
    return fr_cpu_fill(y, scale * src[0], n);
}

fr_status fr_cpu_sum(float *out, const float *x, size_t n) {
    /* double accumulation: a float running sum loses digits after ~10^7
     * terms, and losses/means are compared against PyTorch to 1e-6. */
    double total = 0.0;
#pragma omp parallel for if (n > FR_PAR_MIN) reduction(+ : total) schedule(static)
    for (size_t i = 0; i < n; i++)
        total += x[i];
    out[0] = (float)total;
    return FR_OK;
}
