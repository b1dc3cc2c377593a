/* ops_elementwise.c: checked elementwise ops and reductions (see ops.h).
 * Operands may be f32, f16 or bf16 (each its own); the kernels compute in
 * f32 on staged blocks (staging.h) and round the result once. */
#include "ops.h"
#include "staging.h"

/* Mixed layouts are refused; a channels-last trio runs flat
 * (fr_check_float_pair). */
static fr_status check_binary(const char *op, const fr_tensor *out, const fr_tensor *a,
                              const fr_tensor *b) {
    FR_TRY(fr_check_float_pair(op, "out", out, "a", a));
    return fr_check_float_pair(op, "a", a, "b", b);
}

static fr_status add_block(fr_device dev, float *out, const float *const *in, size_t n, size_t off,
                           const void *args) {
    (void)off, (void)args;
    return FR_CALL_KERNEL(dev, add, out, in[0], in[1], n);
}

static fr_status mul_block(fr_device dev, float *out, const float *const *in, size_t n, size_t off,
                           const void *args) {
    (void)off, (void)args;
    return FR_CALL_KERNEL(dev, mul, out, in[0], in[1], n);
}

static fr_status scale_block(fr_device dev, float *out, const float *const *in, size_t n, size_t off,
                             const void *args) {
    (void)off;
    return FR_CALL_KERNEL(dev, scale, out, in[0], *(const float *)args, n);
}

static fr_status axpy_block(fr_device dev, float *out, const float *const *in, size_t n, size_t off,
                            const void *args) {
    (void)off;
    return FR_CALL_KERNEL(dev, axpy, out, *(const float *)args, in[0], n);
}

fr_status fr_add_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b) {
    FR_TRY(check_binary("add", out, a, b));
    return fr_stage_run(out, false, (const fr_tensor *[]){a, b}, 2, (size_t)fr_numel(out), add_block,
                        NULL);
}

fr_status fr_mul_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b) {
    FR_TRY(check_binary("mul", out, a, b));
    return fr_stage_run(out, false, (const fr_tensor *[]){a, b}, 2, (size_t)fr_numel(out), mul_block,
                        NULL);
}

fr_status fr_scale_out(fr_tensor *out, const fr_tensor *x, float alpha) {
    FR_TRY(fr_check_float_pair("scale", "out", out, "x", x));
    return fr_stage_run(out, false, &x, 1, (size_t)fr_numel(out), scale_block, &alpha);
}

fr_status fr_axpy_(fr_tensor *y, float alpha, const fr_tensor *x) {
    FR_TRY(fr_check_float_pair("axpy", "y", y, "x", x));
    return fr_stage_run(y, true, &x, 1, (size_t)fr_numel(y), axpy_block, &alpha);
}

static fr_status sum_block(fr_device dev, float *out, const float *const *in, size_t n, size_t off,
                           const void *args) {
    (void)off, (void)args;
    return FR_CALL_KERNEL(dev, sum, out, in[0], n);
}

/* out (f32, one element) = the sum of x. Half x is summed block by block,
 * each block's sum (double on the CPU) added to out in f32. */
fr_status fr_sum_out(fr_tensor *out, const fr_tensor *x) {
    FR_TRY(fr_check_f32c("sum", "out", out));
    FR_TRY(fr_check_floatc("sum", "x", x));
    FR_TRY(fr_check_same_device("sum", "out", out, "x", x));
    if (fr_numel(out) != 1)
        return fr_error(FR_ERR_SHAPE, "sum: out must have one element, has %lld",
                        (long long)fr_numel(out));
    size_t n = (size_t)fr_numel(x);
    return fr_stage_reduce_units(fr_device_of(out), fr_data_f32(out), 1, &x, 1, 1, n, sum_block, NULL);
}

static fr_status fill_from_block(fr_device dev, float *out, const float *const *in, size_t n,
                                 size_t off, const void *args) {
    (void)in, (void)off;
    const struct {
        const float *src;
        float scale;
    } *a = args;
    return FR_CALL_KERNEL(dev, fill_from, out, a->src, a->scale, n);
}

fr_status fr_fill_from_out(fr_tensor *y, const fr_tensor *src, float scale) {
    FR_TRY(fr_check_floatc("fill_from", "y", y));
    FR_TRY(fr_check_f32c("fill_from", "src", src));
    FR_TRY(fr_check_same_device("fill_from", "y", y, "src", src));
    if (fr_numel(src) < 1)
        return fr_error(FR_ERR_SHAPE, "fill_from: src is empty");
    struct {
        const float *src;
        float scale;
    } args = {fr_data_f32(src), scale};
    return fr_stage_run(y, false, NULL, 0, (size_t)fr_numel(y), fill_from_block, &args);
}
