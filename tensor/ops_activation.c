/* ops_activation.c: checked ReLU and leaky ReLU (see ops.h). y may be x and
 * dx may be dy: the kernels read each element before writing it. */
#include "ops.h"

static fr_status check_pair(const char *op, const char *out_name, const fr_tensor *out,
                            const char *in_name, const fr_tensor *in) {
    FR_TRY(fr_check_f32c(op, out_name, out));
    FR_TRY(fr_check_f32c(op, in_name, in));
    FR_TRY(fr_check_same_shape(op, out_name, out, in_name, in));
    return fr_check_same_device(op, out_name, out, in_name, in);
}

static fr_status check_backward(const char *op, const fr_tensor *dx, const fr_tensor *dy,
                                const fr_tensor *y) {
    FR_TRY(check_pair(op, "dx", dx, "dy", dy));
    return check_pair(op, "dy", dy, "y", y);
}

static fr_status check_slope(const char *op, float slope) {
    /* Backward recovers the sign of x from y, which needs slope > 0. */
    if (!(slope > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: slope must be > 0 (got %g); use relu for slope 0", op,
                        (double)slope);
    return FR_OK;
}

fr_status fr_relu_forward(fr_tensor *y, const fr_tensor *x) {
    FR_TRY(check_pair("relu", "y", y, "x", x));
    return FR_CALL_KERNEL(fr_device_of(y), relu_fwd, fr_data_f32(y), fr_data_f32(x),
                          (size_t)fr_numel(y));
}

fr_status fr_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y) {
    FR_TRY(check_backward("relu_backward", dx, dy, y));
    return FR_CALL_KERNEL(fr_device_of(dx), relu_bwd, fr_data_f32(dx), fr_data_f32(dy),
                          fr_data_f32(y), (size_t)fr_numel(dx));
}

fr_status fr_leaky_relu_forward(fr_tensor *y, const fr_tensor *x, float slope) {
    FR_TRY(check_slope("leaky_relu", slope));
    FR_TRY(check_pair("leaky_relu", "y", y, "x", x));
    return FR_CALL_KERNEL(fr_device_of(y), leaky_relu_fwd, fr_data_f32(y), fr_data_f32(x), slope,
                          (size_t)fr_numel(y));
}

fr_status fr_leaky_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y,
                                 float slope) {
    FR_TRY(check_slope("leaky_relu_backward", slope));
    FR_TRY(check_backward("leaky_relu_backward", dx, dy, y));
    return FR_CALL_KERNEL(fr_device_of(dx), leaky_relu_bwd, fr_data_f32(dx), fr_data_f32(dy),
                          fr_data_f32(y), slope, (size_t)fr_numel(dx));
}
