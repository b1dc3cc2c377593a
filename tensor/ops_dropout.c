/* ops_dropout.c: checked dropout (see ops.h). */
#include "ops.h"

static fr_status check(const char *op, const char *out_name, const fr_tensor *out,
                       const char *in_name, const fr_tensor *in, float p) {
    FR_TRY(fr_check_f32c(op, out_name, out));
    FR_TRY(fr_check_f32c(op, in_name, in));
    FR_TRY(fr_check_same_shape(op, out_name, out, in_name, in));
    FR_TRY(fr_check_same_device(op, out_name, out, in_name, in));
    if (!(p >= 0.0f && p < 1.0f))
        return fr_error(FR_ERR_ARG, "%s: p must be in [0, 1), got %g", op, (double)p);
    return FR_OK;
}

fr_status fr_dropout_forward(fr_tensor *y, const fr_tensor *x, float p, uint64_t seed) {
    FR_TRY(check("dropout", "y", y, "x", x, p));
    return FR_CALL_KERNEL(fr_device_of(x), dropout_fwd, fr_data_f32(y), fr_data_f32(x), p, seed,
                          (size_t)fr_numel(x));
}

fr_status fr_dropout_backward(fr_tensor *dx, const fr_tensor *dy, float p, uint64_t seed) {
    FR_TRY(check("dropout backward", "dx", dx, "dy", dy, p));
    return FR_CALL_KERNEL(fr_device_of(dy), dropout_bwd, fr_data_f32(dx), fr_data_f32(dy), p, seed,
                          (size_t)fr_numel(dy));
}
