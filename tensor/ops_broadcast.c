/* ops_broadcast.c: checked binary ops with NumPy broadcasting, sums over
 * chosen dims, and expanding a tensor to a broadcast shape (see ops.h).
 * f32 only: the mixed-precision staging of ops_elementwise.c walks flat
 * blocks, which a broadcast does not have. */
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

fr_status fr_broadcast_shape(const char *op, const fr_tensor *a, const fr_tensor *b, int *ndim,
                             int64_t *shape) {
    FR_TRY(fr_check_defined(op, "a", a));
    FR_TRY(fr_check_defined(op, "b", b));
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int k = 1; k <= nd; k++) {
        int64_t sa = k <= a->ndim ? a->shape[a->ndim - k] : 1;
        int64_t sb = k <= b->ndim ? b->shape[b->ndim - k] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char ba[64], bb[64];
            return fr_error(FR_ERR_SHAPE,
                            "%s: a %s and b %s do not broadcast (dim %d from the end: %lld vs %lld)",
                            op, fr_shape_str(a, ba, sizeof ba), fr_shape_str(b, bb, sizeof bb), k,
                            (long long)sa, (long long)sb);
        }
        shape[nd - k] = sa == 1 ? sb : sa;
    }
    *ndim = nd;
    return FR_OK;
}

/* t's strides against an output of nd dims, right-aligned, 0 where t has
 * size 1 (or no such dim). t is contiguous. */
static void bcast_strides(long long *stride, const fr_tensor *t, int nd) {
    long long st = 1;
    for (int k = 1; k <= nd; k++) {
        int d = t->ndim - k;
        int64_t size = d >= 0 ? t->shape[d] : 1;
        stride[nd - k] = size == 1 ? 0 : st;
        st *= size;
    }
}

fr_status fr_bcast_binary_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b,
                              fr_binary_op op) {
    static const char *names[FR_BINARY_COUNT] = {"add", "sub", "mul", "div", "expand", "eq"};
    _Static_assert(FR_BINARY_COUNT == 6, "one name per fr_binary_op");
    if ((unsigned)op >= FR_BINARY_COUNT)
        return fr_error(FR_ERR_ARG, "broadcast: unknown op %d", (int)op);
    const char *name = names[op];
    const fr_tensor *bb = op == FR_BINARY_FIRST ? a : b;
    FR_TRY(fr_check_f32c(name, "out", out));
    FR_TRY(fr_check_f32c(name, "a", a));
    FR_TRY(fr_check_f32c(name, "b", bb));
    FR_TRY(fr_check_same_device(name, "out", out, "a", a));
    FR_TRY(fr_check_same_device(name, "a", a, "b", bb));
    int nd;
    int64_t shape[FR_MAX_DIMS];
    FR_TRY(fr_broadcast_shape(name, a, op == FR_BINARY_FIRST ? out : bb, &nd, shape));
    FR_TRY(fr_check_shape(name, "out", out, nd, shape));
    fr_bcast_shape s = {.ndim = nd};
    for (int d = 0; d < nd; d++)
        s.shape[d] = shape[d];
    bcast_strides(s.stride_a, a, nd);
    bcast_strides(s.stride_b, bb, nd);
    return FR_CALL_KERNEL(fr_device_of(out), bcast_binary, fr_data_f32(out), fr_data_f32(a),
                          op == FR_BINARY_FIRST ? NULL : fr_data_f32(bb), op, &s);
}

/* The record of x reduced to out's shape, after checking both. */
static fr_status reduce_shape(const char *op, const fr_tensor *out, const fr_tensor *x,
                              fr_reduce_shape *s) {
    FR_TRY(fr_check_f32c(op, "out", out));
    FR_TRY(fr_check_f32c(op, "x", x));
    FR_TRY(fr_check_same_device(op, "out", out, "x", x));
    char bo[64], bx[64];
    if (out->ndim > x->ndim)
        return fr_error(FR_ERR_SHAPE, "%s: out %s has more dims than x %s", op,
                        fr_shape_str(out, bo, sizeof bo), fr_shape_str(x, bx, sizeof bx));
    *s = (fr_reduce_shape){.ndim = x->ndim};
    for (int d = 0; d < x->ndim; d++) {
        int od = d - (x->ndim - out->ndim);
        int64_t os = od >= 0 ? out->shape[od] : 1;
        if (os != x->shape[d] && os != 1)
            return fr_error(FR_ERR_SHAPE, "%s: out %s is not x %s with dims of size 1", op,
                            fr_shape_str(out, bo, sizeof bo), fr_shape_str(x, bx, sizeof bx));
        s->shape[d] = x->shape[d];
        s->reduce[d] = os == 1 && x->shape[d] != 1;
    }
    return FR_OK;
}

fr_status fr_reduce_sum_out(fr_tensor *out, const fr_tensor *x, float scale) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_sum", out, x, &s));
    return FR_CALL_KERNEL(fr_device_of(out), reduce_sum, fr_data_f32(out), fr_data_f32(x), NULL,
                          scale, &s);
}

fr_status fr_reduce_sum_prod_out(fr_tensor *out, const fr_tensor *x, const fr_tensor *w,
                                 float scale) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_sum_prod", out, x, &s));
    FR_TRY(fr_check_f32c("reduce_sum_prod", "w", w));
    FR_TRY(fr_check_same_device("reduce_sum_prod", "x", x, "w", w));
    FR_TRY(fr_check_shape("reduce_sum_prod", "w", w, x->ndim, x->shape));
    return FR_CALL_KERNEL(fr_device_of(out), reduce_sum, fr_data_f32(out), fr_data_f32(x),
                          fr_data_f32(w), scale, &s);
}

fr_status fr_reduce_max_out(fr_tensor *out, const fr_tensor *x) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_max", out, x, &s));
    if (fr_numel(x) == 0)
        return fr_error(FR_ERR_SHAPE, "reduce_max: x is empty (a maximum of nothing)");
    return FR_CALL_KERNEL(fr_device_of(out), reduce_max, fr_data_f32(out), fr_data_f32(x), &s);
}
