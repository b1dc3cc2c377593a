/* ops_softmax.c: checked softmax and log-softmax over one dim (see ops.h). */
#include "kernels.h"
#include "ops.h"

/* (outer, size, inner) around dim of x, after checking y like x */
static fr_status split(const char *op, const fr_tensor *y, const fr_tensor *x, int dim,
                       long long *outer, int *size, long long *inner) {
    FR_TRY(fr_check_f32c(op, "x", x));
    FR_TRY(fr_check_f32c(op, "y", y));
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
    return FR_CALL_KERNEL(fr_device_of(x), softmax_forward, fr_data_f32(y), fr_data_f32(x), outer,
                          size, inner, log_out);
}

fr_status fr_softmax_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y, int dim,
                              bool log_out) {
    const char *op = log_out ? "log_softmax_backward" : "softmax_backward";
    long long outer, inner;
    int size;
    FR_TRY(split(op, dy, y, dim, &outer, &size, &inner));
    FR_TRY(fr_check_f32c(op, "dx", dx));
    FR_TRY(fr_check_same_shape(op, "dx", dx, "y", y));
    return FR_CALL_KERNEL(fr_device_of(y), softmax_backward, fr_data_f32(dx), fr_data_f32(dy),
                          fr_data_f32(y), outer, size, inner, log_out);
}
