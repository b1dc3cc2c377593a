/* ops_activation.c: checked ReLU and leaky ReLU (see ops.h). y may be x and
 * dx may be dy: the kernels read each element before writing it. Operands
 * may be f32, f16 or bf16 (staged in blocks, staging.h); ReLU is exact in
 * any of them. */
#include "ops.h"
#include "staging.h"

static fr_status check_backward(const char *op, const fr_tensor *dx, const fr_tensor *dy,
                                const fr_tensor *y) {
    FR_TRY(fr_check_float_pair(op, "dx", dx, "dy", dy));
    return fr_check_float_pair(op, "dy", dy, "y", y);
}

static fr_status check_slope(const char *op, float slope) {
    /* Backward recovers the sign of x from y, which needs slope > 0. */
    if (!(slope > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: slope must be > 0 (got %g); use relu for slope 0", op,
                        (double)slope);
    return FR_OK;
}

static fr_status relu_forward_block(fr_device dev, float *y, const float *const *in, size_t n,
                                size_t off, const void *args) {
    (void)off, (void)args;
    return FR_CALL_KERNEL(dev, relu_forward, y, in[0], n);
}

static fr_status relu_backward_block(fr_device dev, float *dx, const float *const *in, size_t n,
                                size_t off, const void *args) {
    (void)off, (void)args;
    return FR_CALL_KERNEL(dev, relu_backward, dx, in[0], in[1], n);
}

static fr_status leaky_fwd_block(fr_device dev, float *y, const float *const *in, size_t n,
                                 size_t off, const void *slope) {
    (void)off;
    return FR_CALL_KERNEL(dev, leaky_relu_forward, y, in[0], *(const float *)slope, n);
}

static fr_status leaky_bwd_block(fr_device dev, float *dx, const float *const *in, size_t n,
                                 size_t off, const void *slope) {
    (void)off;
    return FR_CALL_KERNEL(dev, leaky_relu_backward, dx, in[0], in[1], *(const float *)slope, n);
}

fr_status fr_relu_forward(fr_tensor *y, const fr_tensor *x) {
    FR_TRY(fr_check_float_pair("relu", "y", y, "x", x));
    return fr_stage_run(y, false, &x, 1, (size_t)fr_numel(y), relu_forward_block, NULL);
}

fr_status fr_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y) {
    FR_TRY(check_backward("relu_backward", dx, dy, y));
    return fr_stage_run(dx, false, (const fr_tensor *[]){dy, y}, 2, (size_t)fr_numel(dx),
                        relu_backward_block, NULL);
}

fr_status fr_leaky_relu_forward(fr_tensor *y, const fr_tensor *x, float slope) {
    FR_TRY(check_slope("leaky_relu", slope));
    FR_TRY(fr_check_float_pair("leaky_relu", "y", y, "x", x));
    return fr_stage_run(y, false, &x, 1, (size_t)fr_numel(y), leaky_fwd_block, &slope);
}

fr_status fr_leaky_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y,
                                 float slope) {
    FR_TRY(check_slope("leaky_relu_backward", slope));
    FR_TRY(check_backward("leaky_relu_backward", dx, dy, y));
    return fr_stage_run(dx, false, (const fr_tensor *[]){dy, y}, 2, (size_t)fr_numel(dx),
                        leaky_bwd_block, &slope);
}
