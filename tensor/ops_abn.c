/* ops_abn.c: checked InPlace-ABN helper ops (see ops.h). The per-channel
 * tensors are f32; y, xhat and residual may be f16 / bf16 (staged a block of
 * images at a time). */
#include <limits.h>

#include "ops.h"
#include "staging.h"
#include "../cpu/layout.h"

static fr_status check_channels(const char *op, const char *a_name, const fr_tensor *a,
                                const char *b_name, const fr_tensor *b) {
    FR_TRY(fr_check_f32c(op, a_name, a));
    FR_TRY(fr_check_f32c(op, b_name, b));
    FR_TRY(fr_check_ndim(op, b_name, b, 1));
    FR_TRY(fr_check_same_shape(op, a_name, a, b_name, b));
    return fr_check_same_device(op, a_name, a, b_name, b);
}

fr_status fr_abn_gamma_forward(fr_tensor *gamma_eff, const fr_tensor *gamma, float eps) {
    FR_TRY(check_channels("abn_gamma", "gamma_eff", gamma_eff, "gamma", gamma));
    if (!(eps > 0.0f))
        return fr_error(FR_ERR_ARG, "abn_gamma: eps must be > 0 so the scale can be inverted, got %g",
                        (double)eps);
    return FR_CALL_KERNEL(fr_device_of(gamma), abn_gamma, fr_data_f32(gamma_eff), fr_data_f32(gamma),
                          eps, (int)gamma->shape[0]);
}

fr_status fr_abn_gamma_backward(fr_tensor *dgamma, const fr_tensor *dgamma_eff, const fr_tensor *gamma) {
    FR_TRY(check_channels("abn_gamma_grad", "dgamma", dgamma, "gamma", gamma));
    FR_TRY(check_channels("abn_gamma_grad", "dgamma_eff", dgamma_eff, "gamma", gamma));
    return FR_CALL_KERNEL(fr_device_of(gamma), abn_gamma_grad, fr_data_f32(dgamma),
                          fr_data_f32(dgamma_eff), fr_data_f32(gamma), (int)gamma->shape[0]);
}

typedef struct {
    const float *gamma_eff, *beta;
    float slope;
    int c, hw;
} invert_args;

static fr_status invert_block(fr_device dev, float *xhat, const float *const *in, size_t count,
                              size_t first, const void *args) {
    (void)first;
    const invert_args *a = args;
    return FR_CALL_KERNEL(dev, abn_invert, xhat, in[0], a->gamma_eff, a->beta, in[1], a->slope,
                          (int)count, a->c, a->hw);
}

/* An operand in y's layout: contiguous, or (a model's channels-last mode,
 * nn/model.h) channels last, f32 on the CPU, as every operand then is. */
static fr_status check_layout(const char *op, const char *name, const fr_tensor *t, bool nhwc) {
    if (!nhwc)
        return fr_check_floatc(op, name, t);
    /* FR_ERR_SHAPE, as the batch-norm ops' layout checks: the planner takes
     * FR_ERR_ARG from an abn trial as "this step cannot take abn" and would
     * hide a layout mix-up behind a plan without it */
    if (!fr_is_channels_last(t))
        return fr_error(FR_ERR_SHAPE, "%s: %s is not channels last as y is (one layout for all)",
                        op, name);
    if (fr_device_of(t) != FR_CPU)
        return fr_error(FR_ERR_ARG, "%s: a channels-last %s is taken on the CPU only", op, name);
    return FR_OK;
}

fr_status fr_abn_invert_out(fr_tensor *xhat, const fr_tensor *y, const fr_tensor *gamma_eff,
                            const fr_tensor *beta, const fr_tensor *residual, float slope) {
    const char *op = "abn_invert";
    char buf[96];
    bool nhwc = fr_is_channels_last(y);
    FR_TRY(check_layout(op, "y", y, nhwc));
    FR_TRY(check_layout(op, "xhat", xhat, nhwc));
    if (residual)
        FR_TRY(check_layout(op, "residual", residual, nhwc));
    if (y->ndim != 2 && y->ndim != 4)
        return fr_error(FR_ERR_SHAPE, "%s: y has shape %s, expected (N, C, H, W) or (N, C)", op,
                        fr_shape_str(y, buf, sizeof buf));
    int64_t hw = y->ndim == 4 ? y->shape[2] * y->shape[3] : 1;
    if (y->shape[0] * y->shape[1] > INT_MAX || hw > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: y %s is too large", op, fr_shape_str(y, buf, sizeof buf));
    FR_TRY(fr_check_same_shape(op, "xhat", xhat, "y", y));
    FR_TRY(fr_check_same_device(op, "xhat", xhat, "y", y));
    FR_TRY(check_channels(op, "beta", beta, "gamma_eff", gamma_eff));
    FR_TRY(fr_check_shape(op, "gamma_eff", gamma_eff, 1, FR_SHAPE(y->shape[1])));
    FR_TRY(fr_check_same_device(op, "gamma_eff", gamma_eff, "y", y));
    if (residual) {
        FR_TRY(fr_check_same_shape(op, "residual", residual, "y", y));
        FR_TRY(fr_check_same_device(op, "residual", residual, "y", y));
    }
    if (!(slope > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: slope must be > 0 to invert the activation, got %g", op,
                        (double)slope);
    if (nhwc)
        return fr_cpu_abn_invert_nhwc(fr_data_f32(xhat), fr_data_f32(y), fr_data_f32(gamma_eff),
                                      fr_data_f32(beta), residual ? fr_data_f32(residual) : NULL,
                                      slope, (size_t)y->shape[0] * (size_t)hw, (int)y->shape[1]);
    invert_args a = {fr_data_f32(gamma_eff), fr_data_f32(beta), slope, (int)y->shape[1], (int)hw};
    return fr_stage_run_units(xhat, (size_t)y->shape[1] * (size_t)hw, false,
                              (const fr_tensor *[]){y, residual}, NULL, residual ? 2 : 1,
                              (size_t)y->shape[0], invert_block, &a);
}
