/* broadcast.cu: binary ops with NumPy broadcasting and sums over chosen
 * dims on the GPU (kernels.def; cpu/broadcast.c is the twin). The shape
 * records are passed by value. One thread per output element; the reduce
 * adds in the CPU's order, in double. */
#include "internal.h"
#include "../tensor/broadcast_math.h"

__global__ void bcast_binary_kernel(float *out, const float *a, const float *b, fr_binary_op op,
                                    fr_bcast_shape s, size_t n) {
    FR_CUDA_FOR(i, n) {
        long long rest = (long long)i, oa = 0, ob = 0;
        for (int d = s.ndim - 1; d >= 0; d--) {
            long long k = rest % s.shape[d];
            rest /= s.shape[d];
            oa += k * s.stride_a[d];
            ob += k * s.stride_b[d];
        }
        out[i] = fr_binary_apply(op, a[oa], b ? b[ob] : 0.0f);
    }
}

extern "C" fr_status fr_cuda_bcast_binary(float *out, const float *a, const float *b,
                                          fr_binary_op op, const fr_bcast_shape *s) {
    size_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= (size_t)s->shape[d];
    FR_CUDA_RUN_1D(bcast_binary_kernel, n, out, a, b, op, *s, n);
}

__global__ void reduce_kernel(float *out, const float *x, const float *w, float scale, bool max,
                              fr_reduce_shape s, size_t n_out, long long n_red) {
    long long stride[FR_BCAST_DIMS], st = 1;
    for (int d = s.ndim - 1; d >= 0; d--) {
        stride[d] = st;
        st *= s.shape[d];
    }
    FR_CUDA_FOR(o, n_out) {
        long long base = 0, rest = (long long)o;
        for (int d = s.ndim - 1; d >= 0; d--)
            if (!s.reduce[d]) {
                base += (rest % s.shape[d]) * stride[d];
                rest /= s.shape[d];
            }
        double acc = 0.0;
        float mx = -INFINITY;
        for (long long r = 0; r < n_red; r++) {
            long long off = base, rr = r;
            for (int d = s.ndim - 1; d >= 0; d--)
                if (s.reduce[d]) {
                    off += (rr % s.shape[d]) * stride[d];
                    rr /= s.shape[d];
                }
            if (max)
                mx = fr_max_nan(mx, x[off]);
            else
                acc += w ? __fmul_rn(x[off], w[off]) : x[off]; /* the host's f32 product */
        }
        out[o] = max ? mx : (float)(acc * scale);
    }
}

/* the sizes of the output and of each reduction */
static void reduce_counts(const fr_reduce_shape *s, size_t *n_out, long long *n_red) {
    *n_out = 1;
    *n_red = 1;
    for (int d = 0; d < s->ndim; d++) {
        if (s->reduce[d])
            *n_red *= s->shape[d];
        else
            *n_out *= (size_t)s->shape[d];
    }
}

extern "C" fr_status fr_cuda_reduce_max(float *out, const float *x, const fr_reduce_shape *s) {
    size_t n_out;
    long long n_red;
    reduce_counts(s, &n_out, &n_red);
    FR_CUDA_RUN_1D(reduce_kernel, n_out, out, x, (const float *)NULL, 1.0f, true, *s, n_out, n_red);
}

extern "C" fr_status fr_cuda_reduce_sum(float *out, const float *x, const float *w, float scale,
                                        const fr_reduce_shape *s) {
    size_t n_out;
    long long n_red;
    reduce_counts(s, &n_out, &n_red);
    FR_CUDA_RUN_1D(reduce_kernel, n_out, out, x, w, scale, false, *s, n_out, n_red);
}
