/* cpu/softmax.c: softmax and log-softmax over the middle dim of (outer,
 * dim, inner), forward and backward (kernels.def); one row per iteration,
 * the row arithmetic tensor/softmax_math.h's (shared with the CUDA twin). */
#include "../tensor/kernels.h"
#include "../tensor/softmax_math.h"

fr_status fr_cpu_softmax_forward(float *y, const float *x, long long outer, int dim,
                                 long long inner, bool log_out) {
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < outer * inner; r++) {
        long long off = (r / inner) * dim * inner + r % inner;
        fr_softmax_row(y + off, x + off, dim, inner, log_out);
    }
    return FR_OK;
}

fr_status fr_cpu_softmax_backward(float *dx, const float *dy, const float *y, long long outer,
                                  int dim, long long inner, bool log_out) {
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < outer * inner; r++) {
        long long off = (r / inner) * dim * inner + r % inner;
        fr_softmax_row_backward(dx + off, dy + off, y + off, dim, inner, log_out);
    }
    return FR_OK;
}
