/* cpu/broadcast.c: binary ops with NumPy broadcasting and sums over chosen
 * dims (kernels.def; shapes.h: fr_bcast_shape, fr_reduce_shape). */
#include <math.h>

#include "../tensor/broadcast_math.h"
#include "../tensor/kernels.h"

/* Rows are the output's last dim; each row's start in a and b comes from
 * its index over the leading dims. */
fr_status fr_cpu_bcast_binary(float *out, const float *a, const float *b, fr_binary_op op,
                              const fr_bcast_shape *s) {
    int last = s->ndim - 1;
    long long w = s->ndim ? s->shape[last] : 1, rows = 1;
    for (int d = 0; d < last; d++)
        rows *= s->shape[d];
    long long sa = s->ndim ? s->stride_a[last] : 0, sb = s->ndim ? s->stride_b[last] : 0;
#pragma omp parallel for if (rows * w > 32768) schedule(static)
    for (long long r = 0; r < rows; r++) {
        long long oa = 0, ob = 0, rest = r;
        for (int d = last - 1; d >= 0; d--) {
            long long i = rest % s->shape[d];
            rest /= s->shape[d];
            oa += i * s->stride_a[d];
            ob += i * s->stride_b[d];
        }
        float *o = out + r * w;   // (w)
        for (long long j = 0; j < w; j++)
            o[j] = fr_binary_apply(op, a[oa + j * sa], b ? b[ob + j * sb] : 0.0f);
    }
    return FR_OK;
}

/* One output element at a time: its kept coordinates give a base offset in
 * x, then every combination of the reduced ones is added (or compared, for
 * the maximum) in order. */
static void reduce(float *out, const float *x, float scale, bool max, const fr_reduce_shape *s) {
    long long stride[FR_BCAST_DIMS], n_out = 1, n_red = 1, st = 1;
    for (int d = s->ndim - 1; d >= 0; d--) {
        stride[d] = st;
        st *= s->shape[d];
        if (s->reduce[d])
            n_red *= s->shape[d];
        else
            n_out *= s->shape[d];
    }
#pragma omp parallel for if (n_out * n_red > 32768) schedule(static)
    for (long long o = 0; o < n_out; o++) {
        long long base = 0, rest = o;
        for (int d = s->ndim - 1; d >= 0; d--)
            if (!s->reduce[d]) {
                base += (rest % s->shape[d]) * stride[d];
                rest /= s->shape[d];
            }
        double acc = 0.0;
        float mx = -INFINITY;
        for (long long r = 0; r < n_red; r++) {
            long long off = base, rr = r;
            for (int d = s->ndim - 1; d >= 0; d--)
                if (s->reduce[d]) {
                    off += (rr % s->shape[d]) * stride[d];
                    rr /= s->shape[d];
                }
            if (max)
                mx = fr_max_nan(mx, x[off]);
            else
                acc += x[off];
        }
        out[o] = max ? mx : (float)(acc * scale);
    }
}

fr_status fr_cpu_reduce_sum(float *out, const float *x, float scale, const fr_reduce_shape *s) {
    reduce(out, x, scale, false, s);
    return FR_OK;
}

fr_status fr_cpu_reduce_max(float *out, const float *x, const fr_reduce_shape *s) {
    reduce(out, x, 1.0f, true, s);
    return FR_OK;
}
