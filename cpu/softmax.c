/* cpu/softmax.c: softmax and log-softmax over the middle dim of (outer,
 * dim, inner), forward and backward (kernels.def). Sums in double, the
 * maximum subtracted first so exp never overflows. */
#include <math.h>

#include "../tensor/kernels.h"

fr_status fr_cpu_softmax_forward(float *y, const float *x, long long outer, int dim,
                                 long long inner, bool log_out) {
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < outer * inner; r++) {
        long long o = r / inner, in = r % inner;
        const float *xr = x + o * dim * inner + in;   // dim values, stride inner
        float *yr = y + o * dim * inner + in;
        float mx = -INFINITY;
        for (int k = 0; k < dim; k++)
            mx = fmaxf(mx, xr[k * inner]);
        double sum = 0.0;
        for (int k = 0; k < dim; k++)
            sum += exp((double)xr[k * inner] - mx);
        double lse = log(sum);
        for (int k = 0; k < dim; k++) {
            double z = (double)xr[k * inner] - mx;
            yr[k * inner] = (float)(log_out ? z - lse : exp(z) / sum);
        }
    }
    return FR_OK;
}

fr_status fr_cpu_softmax_backward(float *dx, const float *dy, const float *y, long long outer,
                                  int dim, long long inner, bool log_out) {
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < outer * inner; r++) {
        long long off = (r / inner) * dim * inner + r % inner;
        const float *dyr = dy + off, *yr = y + off;
        float *dxr = dx + off;
        double dot = 0.0;   // softmax: sum dy * y; log-softmax: sum dy
        for (int k = 0; k < dim; k++)
            dot += log_out ? (double)dyr[k * inner] : (double)dyr[k * inner] * yr[k * inner];
        for (int k = 0; k < dim; k++) {
            double g = dyr[k * inner], v = yr[k * inner];
            dxr[k * inner] = (float)(log_out ? g - exp(v) * dot : v * (g - dot));
        }
    }
    return FR_OK;
}
