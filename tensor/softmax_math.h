/* softmax_math.h: softmax and log-softmax of one row (dim values, `inner`
 * apart), forward and backward, shared by cpu/softmax.c and
 * cuda/softmax.cu (one row per thread on both). Sums in double, the maximum
 * subtracted first so exp never overflows. Internal: not installed. */
#ifndef FR_SOFTMAX_MATH_H
#define FR_SOFTMAX_MATH_H

#include <math.h>
#include <stdbool.h>

#ifdef __CUDACC__
#define FR_SOFTMAX_FN __host__ __device__ static inline
#else
#define FR_SOFTMAX_FN static inline
#endif

FR_SOFTMAX_FN void fr_softmax_row(float *y, const float *x, int dim, long long inner, bool log_out) {
    float mx = -INFINITY;
    for (int k = 0; k < dim; k++)
        mx = fmaxf(mx, x[k * inner]);
    double sum = 0.0;
    for (int k = 0; k < dim; k++)
        sum += exp((double)x[k * inner] - mx);
    double lse = log(sum);
    for (int k = 0; k < dim; k++) {
        double z = (double)x[k * inner] - mx;
        y[k * inner] = (float)(log_out ? z - lse : exp(z) / sum);
    }
}

/* softmax: dx = y (dy - sum dy y); log-softmax: dx = dy - exp(y) sum dy */
FR_SOFTMAX_FN void fr_softmax_row_backward(float *dx, const float *dy, const float *y, int dim,
                                           long long inner, bool log_out) {
    double dot = 0.0;
    for (int k = 0; k < dim; k++)
        dot += log_out ? (double)dy[k * inner] : (double)dy[k * inner] * y[k * inner];
    for (int k = 0; k < dim; k++) {
        double g = dy[k * inner], v = y[k * inner];
        dx[k * inner] = (float)(log_out ? g - exp(v) * dot : v * (g - dot));
    }
}

#endif
