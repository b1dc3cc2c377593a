/* ops_softmax.c: checked softmax and log-softmax over one dim (see ops.h).
 * Operands may be f32, f16 or bf16, each its own: blocks of whole rows'
 * groups (outer index) are staged to f32 (staging.h), so a row's sums stay
 * f32 and only the stored values are rounded. One outer index is a block
 * at least: softmax over dim 0 of a big half tensor stages it whole. */
#include "kernels.h"
#include "ops.h"
#include "staging.h"

typedef struct {
    int size;
    long long inner;
    bool log_out;
} softmax_args;

static fr_status forward_block(fr_device dev, float *out, const float *const *in, size_t count,
                               size_t first, const void *args) {
    (void)first;
    const softmax_args *a = args;
    return FR_CALL_KERNEL(dev, softmax_forward, out, in[0], (long long)count, a->size, a->inner,
                          a->log_out);
}

static fr_status backward_block(fr_device dev, float *out, const float *const *in, size_t count,
                                size_t first, const void *args) {
    (void)first;
    const softmax_args *a = args;
    return FR_CALL_KERNEL(dev, softmax_backward, out, in[0], in[1], (long long)count, a->size,
                          a->inner, a->log_out);
}

/* (outer, size, inner) around dim of x, after checking y like x */
static fr_status split(const char *op, const fr_tensor *y, const fr_tensor *x, int dim,
                       long long *outer, int *size, long long *inner) {
    FR_TRY(fr_check_floatc(op, "x", x));
    FR_TRY(fr_check_floatc(op, "y", y));
    FR_TRY(fr_check_same_shape(op, "y", y, "x", x));
    FR_TRY(fr_check_same_device(op, "y", y, "x", x));
    if (dim < 0 || dim >= x->ndim)
        return fr_error(FR_ERR_ARG, "%s: dim %d out of range for %d dims", op, dim, x->ndim);
    *outer = *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= x->shape[d];
    for (int d = dim + 1; d < x->ndim; d++)
        *inner *= x->shape[d];
    *size = (int)x->shape[dim];
    return FR_OK;
}

fr_status fr_softmax_forward(fr_tensor *y, const fr_tensor *x, int dim, bool log_out) {
    const char *op = log_out ? "log_softmax" : "softmax";
    long long outer, inner;
    int size;
    FR_TRY(split(op, y, x, dim, &outer, &size, &inner));
    softmax_args a = {size, inner, log_out};
    return fr_stage_run_units(y, (size_t)(size * inner), false, &x, NULL, 1, (size_t)outer,
                              forward_block, &a);
}

fr_status fr_softmax_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y, int dim,
                              bool log_out) {
    const char *op = log_out ? "log_softmax_backward" : "softmax_backward";
    long long outer, inner;
    int size;
    FR_TRY(split(op, dy, y, dim, &outer, &size, &inner));
    FR_TRY(fr_check_floatc(op, "dx", dx));
    FR_TRY(fr_check_same_shape(op, "dx", dx, "y", y));
    softmax_args a = {size, inner, log_out};
    return fr_stage_run_units(dx, (size_t)(size * inner), false, (const fr_tensor *[]){dy, y}, NULL,
                              2, (size_t)outer, backward_block, &a);
}
