/* ops_elementwise.c: checked elementwise ops and reductions (see ops.h). */
#include "ops.h"

static fr_status check_binary(const char *op, const fr_tensor *out, const fr_tensor *a,
                              const fr_tensor *b) {
    FR_TRY(fr_check_f32c(op, "out", out));
    FR_TRY(fr_check_f32c(op, "a", a));
    FR_TRY(fr_check_f32c(op, "b", b));
    FR_TRY(fr_check_same_shape(op, "a", a, "b", b));
    FR_TRY(fr_check_same_shape(op, "out", out, "a", a));
    FR_TRY(fr_check_same_device(op, "out", out, "a", a));
    return fr_check_same_device(op, "a", a, "b", b);
}

fr_status fr_add_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b) {
    FR_TRY(check_binary("add", out, a, b));
    return FR_CALL_KERNEL(fr_device_of(out), add, fr_data_f32(out), fr_data_f32(a), fr_data_f32(b),
                          (size_t)fr_numel(out));
}

fr_status fr_mul_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b) {
    FR_TRY(check_binary("mul", out, a, b));
    return FR_CALL_KERNEL(fr_device_of(out), mul, fr_data_f32(out), fr_data_f32(a), fr_data_f32(b),
                          (size_t)fr_numel(out));
}

fr_status fr_scale_out(fr_tensor *out, const fr_tensor *x, float alpha) {
    FR_TRY(fr_check_f32c("scale", "out", out));
    FR_TRY(fr_check_f32c("scale", "x", x));
    FR_TRY(fr_check_same_shape("scale", "out", out, "x", x));
    FR_TRY(fr_check_same_device("scale", "out", out, "x", x));
    return FR_CALL_KERNEL(fr_device_of(out), scale, fr_data_f32(out), fr_data_f32(x), alpha,
                          (size_t)fr_numel(out));
}

fr_status fr_axpy_(fr_tensor *y, float alpha, const fr_tensor *x) {
    FR_TRY(fr_check_f32c("axpy", "y", y));
    FR_TRY(fr_check_f32c("axpy", "x", x));
    FR_TRY(fr_check_same_shape("axpy", "y", y, "x", x));
    FR_TRY(fr_check_same_device("axpy", "y", y, "x", x));
    return FR_CALL_KERNEL(fr_device_of(y), axpy, fr_data_f32(y), alpha, fr_data_f32(x),
                          (size_t)fr_numel(y));
}

fr_status fr_sum_out(fr_tensor *out, const fr_tensor *x) {
    FR_TRY(fr_check_f32c("sum", "out", out));
    FR_TRY(fr_check_f32c("sum", "x", x));
    FR_TRY(fr_check_same_device("sum", "out", out, "x", x));
    if (fr_numel(out) != 1)
        return fr_error(FR_ERR_SHAPE, "sum: out must have one element, has %lld",
                        (long long)fr_numel(out));
    return FR_CALL_KERNEL(fr_device_of(out), sum, fr_data_f32(out), fr_data_f32(x),
                          (size_t)fr_numel(x));
}

fr_status fr_fill_from_out(fr_tensor *y, const fr_tensor *src, float scale) {
    FR_TRY(fr_check_f32c("fill_from", "y", y));
    FR_TRY(fr_check_f32c("fill_from", "src", src));
    FR_TRY(fr_check_same_device("fill_from", "y", y, "src", src));
    if (fr_numel(src) < 1)
        return fr_error(FR_ERR_SHAPE, "fill_from: src is empty");
    return FR_CALL_KERNEL(fr_device_of(y), fill_from, fr_data_f32(y), fr_data_f32(src), scale,
                          (size_t)fr_numel(y));
}
