/* cpu/broadcast.c: binary ops with NumPy broadcasting and sums over chosen
 * dims (kernels.def; shapes.h: fr_bcast_shape, fr_reduce_shape).
 *
 * Both first fold the shape record down to the fewest dims that walk the
 * same memory: a squeeze-excitation's (N, C, H, W) times (N, C, 1, 1) is
 * rows of H * W elements, each times one scalar, and its sum over H and W
 * is one contiguous run per output. Per-element index arithmetic over four
 * dims made these two kernels 26% of a one-thread training step of the
 * MobileNet example (perf, bench/RESULTS.md, issue 21). Folding changes no
 * value: the binary ops are elementwise, and a sum still adds each output's
 * elements in the order of the unfolded loop (row-major over the reduced
 * dims), in double, as cuda/broadcast.cu does. */
#include <math.h>
#include <string.h>

#include "../tensor/broadcast_math.h"
#include "../tensor/kernels.h"
#include "simd.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_BCAST_PAR_MIN 32768

/* s without its dims of size 1, each dim merged into the next when both
 * operands walk on across the pair as across one dim */
static fr_bcast_shape fold_bcast(const fr_bcast_shape *s) {
    fr_bcast_shape f = {.ndim = 0};
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] == 1)
            continue;
        int k = f.ndim - 1;
        if (k >= 0 && f.stride_a[k] == s->stride_a[d] * s->shape[d] &&
            f.stride_b[k] == s->stride_b[d] * s->shape[d]) {
            f.shape[k] *= s->shape[d];
            f.stride_a[k] = s->stride_a[d];
            f.stride_b[k] = s->stride_b[d];
            continue;
        }
        f.shape[f.ndim] = s->shape[d];
        f.stride_a[f.ndim] = s->stride_a[d];
        f.stride_b[f.ndim] = s->stride_b[d];
        f.ndim++;
    }
    return f;
}

/* One row of w outputs. The strides of a contiguous operand's last folded
 * dim are 1 or 0, so the common cases get loops of their own with constant
 * strides, which the compiler vectorises (a stride-0 operand is one load);
 * op's switch is outside them. */
#define FR_BCAST_LOOP_(SA, SB, EXPR)                                           \
    {                                                                          \
        _Pragma("omp simd") for (long long j = 0; j < w; j++) {                \
            float u = a[j * (SA)], v = b[j * (SB)];                            \
            o[j] = (EXPR);                                                     \
        }                                                                      \
    }
#define FR_BCAST_ROW_(EXPR)                                                    \
    do {                                                                       \
        if (sa == 1 && sb == 1)                                                \
            FR_BCAST_LOOP_(1, 1, EXPR)                                         \
        else if (sa == 1 && sb == 0)                                           \
            FR_BCAST_LOOP_(1, 0, EXPR)                                         \
        else if (sa == 0 && sb == 1)                                           \
            FR_BCAST_LOOP_(0, 1, EXPR)                                         \
        else if (sa == 0 && sb == 0)                                           \
            FR_BCAST_LOOP_(0, 0, EXPR)                                         \
        else                                                                   \
            FR_BCAST_LOOP_(sa, sb, EXPR)                                       \
    } while (0)

FR_SELECT_BLEND static void bcast_row(float *o, const float *a, const float *b, long long w,
                                      long long sa, long long sb, fr_binary_op op) {
    static const float zero = 0.0f;
    if (!b) { /* FR_BINARY_FIRST: b is not read */
        b = &zero;
        sb = 0;
    }
    switch (op) {
    case FR_BINARY_ADD: FR_BCAST_ROW_(u + v); break;
    case FR_BINARY_SUB: FR_BCAST_ROW_(u - v); break;
    case FR_BINARY_MUL: FR_BCAST_ROW_(u * v); break;
    case FR_BINARY_DIV: FR_BCAST_ROW_(u / v); break;
    case FR_BINARY_EQ: FR_BCAST_ROW_(u == v ? 1.0f : 0.0f); break;
    default: FR_BCAST_ROW_(((void)v, u)); break;
    }
}
#undef FR_BCAST_ROW_
#undef FR_BCAST_LOOP_

/* Rows are the folded output's last dim; each row's start in a and b comes
 * from its index over the leading dims. */
fr_status fr_cpu_bcast_binary(float *out, const float *a, const float *b, fr_binary_op op,
                              const fr_bcast_shape *shape) {
    const fr_bcast_shape s = fold_bcast(shape);
    int last = s.ndim - 1;
    long long w = s.ndim ? s.shape[last] : 1, rows = 1;
    for (int d = 0; d < last; d++)
        rows *= s.shape[d];
    long long sa = s.ndim ? s.stride_a[last] : 0, sb = s.ndim ? s.stride_b[last] : 0;
#pragma omp parallel for if (rows * w > FR_BCAST_PAR_MIN) schedule(static)
    for (long long r = 0; r < rows; r++) {
        long long oa = 0, ob = 0, rest = r;
        for (int d = last - 1; d >= 0; d--) {
            long long i = rest % s.shape[d];
            rest /= s.shape[d];
            oa += i * s.stride_a[d];
            ob += i * s.stride_b[d];
        }
        bcast_row(out + r * w, a + oa, b ? b + ob : NULL, w, sa, sb, op);
    }
    return FR_OK;
}

/* s without its dims of size 1, runs of reduced or of kept dims merged
 * (x is contiguous, so each run is one dim of their product) */
static fr_reduce_shape fold_reduce(const fr_reduce_shape *s) {
    fr_reduce_shape f = {.ndim = 0};
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] == 1)
            continue;
        if (f.ndim && f.reduce[f.ndim - 1] == s->reduce[d]) {
            f.shape[f.ndim - 1] *= s->shape[d];
            continue;
        }
        f.shape[f.ndim] = s->shape[d];
        f.reduce[f.ndim] = s->reduce[d];
        f.ndim++;
    }
    return f;
}

/* the offset in x of index i over the dims that `which` marks as reduced
 * (want true) or kept (want false), row-major over those dims */
static long long offset_of(long long i, const fr_reduce_shape *s, const long long *stride,
                           bool want) {
    long long off = 0;
    for (int d = s->ndim - 1; d >= 0; d--)
        if (s->reduce[d] == want) {
            off += (i % s->shape[d]) * stride[d];
            i /= s->shape[d];
        }
    return off;
}

/* term i of a sum: x's element, or its f32 product with w's (kernels.def) */
static inline float term(const float *x, const float *w, long long i) {
    return w ? x[i] * w[i] : x[i];
}

/* The last folded dim reduced: each output adds runs of `run` contiguous
 * elements, one run per combination of the other reduced dims, in order.
 * Four outputs at a time when they are neighbours in x (no other reduced
 * dim), so four addition chains overlap; each keeps its own order. */
static void reduce_runs(float *out, const float *x, const float *w, float scale, bool max,
                        const fr_reduce_shape *s, const long long *stride, long long n_out,
                        long long n_red) {
    long long run = s->shape[s->ndim - 1], runs = n_red / run;
    if (runs == 1 && !max) {
        long long quads = n_out / 4;
#pragma omp parallel for if (n_out * n_red > FR_BCAST_PAR_MIN) schedule(static)
        for (long long q = 0; q < quads; q++) {
            long long at = q * 4 * run;
            double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
            for (long long j = at; j < at + run; j++) {
                a0 += term(x, w, j);
                a1 += term(x, w, run + j);
                a2 += term(x, w, 2 * run + j);
                a3 += term(x, w, 3 * run + j);
            }
            out[4 * q] = (float)(a0 * scale);
            out[4 * q + 1] = (float)(a1 * scale);
            out[4 * q + 2] = (float)(a2 * scale);
            out[4 * q + 3] = (float)(a3 * scale);
        }
        for (long long o = quads * 4; o < n_out; o++) {
            double acc = 0.0;
            for (long long j = o * run; j < (o + 1) * run; j++)
                acc += term(x, w, j);
            out[o] = (float)(acc * scale);
        }
        return;
    }
#pragma omp parallel for if (n_out * n_red > FR_BCAST_PAR_MIN) schedule(static)
    for (long long o = 0; o < n_out; o++) {
        long long base = offset_of(o, s, stride, false);
        double acc = 0.0;
        float mx = -INFINITY;
        for (long long r = 0; r < runs; r++) {
            long long at = base + offset_of(r * run, s, stride, true);
            const float *p = x + at;
            if (max)
                for (long long j = 0; j < run; j++)
                    mx = fr_max_nan(mx, p[j]);
            else
                for (long long j = 0; j < run; j++)
                    acc += term(x, w, at + j);
        }
        out[o] = max ? mx : (float)(acc * scale);
    }
}

/* The last folded dim kept: `width` neighbouring outputs read neighbouring
 * elements for each combination of the reduced dims, so a block of them is
 * accumulated together, each output still in the reduced dims' order. */
#define FR_REDUCE_BLOCK 256
FR_SELECT_BLEND static void reduce_columns(float *out, const float *x, const float *w, float scale,
                                           bool max,
                                           const fr_reduce_shape *s, const long long *stride,
                                           long long n_out, long long n_red) {
    long long width = s->shape[s->ndim - 1], rows = n_out / width;
    long long blocks = (width + FR_REDUCE_BLOCK - 1) / FR_REDUCE_BLOCK;
#pragma omp parallel for if (n_out * n_red > FR_BCAST_PAR_MIN) schedule(static)
    for (long long t = 0; t < rows * blocks; t++) {
        long long row = t / blocks, k0 = (t % blocks) * FR_REDUCE_BLOCK;
        long long kn = width - k0 < FR_REDUCE_BLOCK ? width - k0 : FR_REDUCE_BLOCK;
        long long base = offset_of(row * width, s, stride, false) + k0;
        double acc[FR_REDUCE_BLOCK];
        float mx[FR_REDUCE_BLOCK];
        for (long long k = 0; k < kn; k++) {
            acc[k] = 0.0;
            mx[k] = -INFINITY;
        }
        for (long long r = 0; r < n_red; r++) {
            long long at = base + offset_of(r, s, stride, true);
            const float *p = x + at, *v = w ? w + at : NULL;
            if (max) {
                for (long long k = 0; k < kn; k++)
                    mx[k] = fr_max_nan(mx[k], p[k]);
            } else if (v) {
#pragma omp simd
                for (long long k = 0; k < kn; k++)
                    acc[k] += p[k] * v[k];
            } else {
#pragma omp simd
                for (long long k = 0; k < kn; k++)
                    acc[k] += p[k];
            }
        }
        float *o = out + row * width + k0;
        for (long long k = 0; k < kn; k++)
            o[k] = max ? mx[k] : (float)(acc[k] * scale);
    }
}

static void reduce(float *out, const float *x, const float *w, float scale, bool max,
                   const fr_reduce_shape *shape) {
    const fr_reduce_shape s = fold_reduce(shape);
    long long stride[FR_BCAST_DIMS], n_out = 1, n_red = 1, st = 1;
    for (int d = s.ndim - 1; d >= 0; d--) {
        stride[d] = st;
        st *= s.shape[d];
        if (s.reduce[d])
            n_red *= s.shape[d];
        else
            n_out *= s.shape[d];
    }
    if (n_red == 0) { /* an empty sum or maximum */
        for (long long o = 0; o < n_out; o++)
            out[o] = max ? -INFINITY : 0.0f;
    } else if (n_red == 1 || s.ndim == 0) { /* nothing reduced: a copy, scaled */
        for (long long o = 0; o < n_out; o++)
            out[o] = max ? x[o] : (float)((double)term(x, w, o) * scale);
    } else if (s.reduce[s.ndim - 1]) {
        reduce_runs(out, x, w, scale, max, &s, stride, n_out, n_red);
    } else {
        reduce_columns(out, x, w, scale, max, &s, stride, n_out, n_red);
    }
}

fr_status fr_cpu_reduce_sum(float *out, const float *x, const float *w, float scale,
                            const fr_reduce_shape *s) {
    reduce(out, x, w, scale, false, s);
    return FR_OK;
}

fr_status fr_cpu_reduce_max(float *out, const float *x, const fr_reduce_shape *s) {
    reduce(out, x, NULL, 1.0f, true, s);
    return FR_OK;
}
