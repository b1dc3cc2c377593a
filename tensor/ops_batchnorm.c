/* ops_batchnorm.c: checked batch norm (see ops.h). x is (N, C, H, W) or
 * (N, C); the kernels see it as (N, C, HW) with HW = 1 for the 2-d form.
 *
 * x, y, dy and dx may be f32, f16 or bf16; gamma, beta, the statistics and
 * the parameter gradients are f32, and all arithmetic is f32 (statistics
 * accumulate in double on the CPU). A half operand is staged whole
 * (staging.h): the statistics and the backward's sums run over the whole
 * batch, which the kernels do in one call. That costs one transient f32
 * copy of the layer's input while the op runs; per-block statistics would
 * remove it and are not written yet. */
#include <limits.h>
#include <math.h>

#include "ops.h"
#include "staging.h"

typedef struct {
    int n, c, hw;
} bn_dims;

static fr_status check_x(const char *op, const char *arg, const fr_tensor *x, bn_dims *d) {
    char buf[96];
    FR_TRY(fr_check_floatc(op, arg, x));
    if (x->ndim != 2 && x->ndim != 4)
        return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected (N, C, H, W) or (N, C)", op,
                        arg, fr_shape_str(x, buf, sizeof buf));
    int64_t hw = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
    if (x->shape[0] * x->shape[1] > INT_MAX || hw > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the batch-norm kernels", op, arg,
                        fr_shape_str(x, buf, sizeof buf));
    d->n = (int)x->shape[0];
    d->c = (int)x->shape[1];
    d->hw = (int)hw;
    return FR_OK;
}

/* A per-channel tensor: f32, contiguous, shape (C), on x's device. */
static fr_status check_channel(const char *op, const char *arg, const fr_tensor *t,
                               const fr_tensor *x, int c) {
    FR_TRY(fr_check_f32c(op, arg, t));
    FR_TRY(fr_check_shape(op, arg, t, 1, FR_SHAPE(c)));
    return fr_check_same_device(op, arg, t, "x", x);
}

/* Another tensor with x's shape and device (y, dy, dx). */
static fr_status check_like_x(const char *op, const char *arg, const fr_tensor *t,
                              const fr_tensor *x) {
    FR_TRY(fr_check_floatc(op, arg, t));
    FR_TRY(fr_check_same_shape(op, arg, t, "x", x));
    return fr_check_same_device(op, arg, t, "x", x);
}

static fr_status check_eps(const char *op, float eps) {
    if (!(eps >= 0.0f) || isinf(eps))
        return fr_error(FR_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, (double)eps);
    return FR_OK;
}

fr_status fr_batchnorm_invstd(fr_tensor *invstd, const fr_tensor *var, float eps) {
    FR_TRY(check_eps("batchnorm_invstd", eps));
    FR_TRY(fr_check_f32c("batchnorm_invstd", "invstd", invstd));
    FR_TRY(fr_check_f32c("batchnorm_invstd", "var", var));
    FR_TRY(fr_check_ndim("batchnorm_invstd", "var", var, 1));
    FR_TRY(fr_check_same_shape("batchnorm_invstd", "invstd", invstd, "var", var));
    FR_TRY(fr_check_same_device("batchnorm_invstd", "invstd", invstd, "var", var));
    return FR_CALL_KERNEL(fr_device_of(var), bn_invstd, fr_data_f32(invstd), fr_data_f32(var), eps,
                          (int)var->shape[0]);
}

fr_status fr_batchnorm_train_forward(fr_tensor *y, fr_tensor *mean, fr_tensor *invstd,
                                     const fr_tensor *x, const fr_tensor *gamma, const fr_tensor *beta,
                                     fr_tensor *running_mean, fr_tensor *running_var,
                                     float momentum, float eps) {
    const char *op = "batch_norm";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_channel(op, "mean", mean, x, d.c));
    FR_TRY(check_channel(op, "invstd", invstd, x, d.c));
    FR_TRY(check_channel(op, "gamma", gamma, x, d.c));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(check_eps(op, eps));
    if ((running_mean == NULL) != (running_var == NULL))
        return fr_error(FR_ERR_ARG, "%s: give both running_mean and running_var, or neither", op);
    if (running_mean) {
        FR_TRY(check_channel(op, "running_mean", running_mean, x, d.c));
        FR_TRY(check_channel(op, "running_var", running_var, x, d.c));
        if (!(momentum >= 0.0f && momentum <= 1.0f))
            return fr_error(FR_ERR_ARG, "%s: momentum must be in [0, 1], got %g", op,
                            (double)momentum);
    }
    int64_t count = (int64_t)d.n * d.hw;
    if (count < 2) {
        char buf[96];
        return fr_error(FR_ERR_SHAPE,
                        "%s: training needs more than one value per channel, x has shape %s",
                        op, fr_shape_str(x, buf, sizeof buf));
    }
    fr_device dev = fr_device_of(x);
    size_t var_bytes = (size_t)d.c * sizeof(float), n = (size_t)fr_numel(x);
    fr_stage sx, sy;
    FR_TRY(fr_stage_in(&sx, x, 0, n));
    float *var = fr_mem_alloc(dev, var_bytes, FR_TAG_WORKSPACE); // (C)
    if (!var) {
        fr_stage_free(&sx);
        return fr_last_status();
    }
    fr_status st = FR_CALL_KERNEL(dev, bn_stats, fr_data_f32(mean), var, sx.p, d.n, d.c, d.hw);
    if (st == FR_OK)
        st = FR_CALL_KERNEL(dev, bn_invstd, fr_data_f32(invstd), var, eps, d.c);
    if (st == FR_OK && running_mean) {
        st = FR_CALL_KERNEL(dev, bn_update_running, fr_data_f32(running_mean),
                            fr_data_f32(running_var), fr_data_f32(mean), var, momentum,
                            count > INT_MAX ? INT_MAX : (int)count, d.c);
        if (st == FR_OK) {
            fr_bump_version(running_mean, "batch_norm (running stats)");
            fr_bump_version(running_var, "batch_norm (running stats)");
        }
    }
    fr_mem_free(dev, var, var_bytes, FR_TAG_WORKSPACE);
    /* Statistics come first, so y may be x. */
    if (st == FR_OK)
        st = fr_stage_out(&sy, y, 0, n, false, x, &sx);
    if (st == FR_OK)
        st = fr_stage_commit(&sy, y, 0, n,
                             FR_CALL_KERNEL(dev, bn_apply, sy.p, sx.p, fr_data_f32(mean),
                                            fr_data_f32(invstd), fr_data_f32(gamma),
                                            fr_data_f32(beta), d.n, d.c, d.hw));
    fr_stage_free(&sx);
    return st;
}

/* y = (x - mean) * invstd * gamma + beta through staged x and y (y may be x). */
static fr_status apply_staged(fr_tensor *y, const fr_tensor *x, const float *mean,
                              const float *invstd, const fr_tensor *gamma, const fr_tensor *beta,
                              const bn_dims *d) {
    size_t n = (size_t)fr_numel(x);
    fr_stage sx, sy;
    FR_TRY(fr_stage_in(&sx, x, 0, n));
    fr_status st = fr_stage_out(&sy, y, 0, n, false, x, &sx);
    if (st == FR_OK)
        st = fr_stage_commit(&sy, y, 0, n,
                             FR_CALL_KERNEL(fr_device_of(x), bn_apply, sy.p, sx.p, mean, invstd,
                                            fr_data_f32(gamma), fr_data_f32(beta), d->n, d->c,
                                            d->hw));
    fr_stage_free(&sx);
    return st;
}

fr_status fr_batchnorm_eval_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *gamma,
                                    const fr_tensor *beta, const fr_tensor *running_mean,
                                    const fr_tensor *running_var, float eps) {
    const char *op = "batch_norm (eval)";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_channel(op, "gamma", gamma, x, d.c));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    FR_TRY(check_channel(op, "running_mean", running_mean, x, d.c));
    FR_TRY(check_channel(op, "running_var", running_var, x, d.c));
    FR_TRY(check_eps(op, eps));
    fr_device dev = fr_device_of(x);
    size_t bytes = (size_t)d.c * sizeof(float);
    float *invstd = fr_mem_alloc(dev, bytes, FR_TAG_WORKSPACE); // (C)
    if (!invstd)
        return fr_last_status();
    fr_status st = FR_CALL_KERNEL(dev, bn_invstd, invstd, fr_data_f32(running_var), eps, d.c);
    if (st == FR_OK)
        st = apply_staged(y, x, fr_data_f32(running_mean), invstd, gamma, beta, &d);
    fr_mem_free(dev, invstd, bytes, FR_TAG_WORKSPACE);
    return st;
}

fr_status fr_batchnorm_apply(fr_tensor *y, const fr_tensor *x, const fr_tensor *mean,
                             const fr_tensor *invstd, const fr_tensor *gamma, const fr_tensor *beta) {
    const char *op = "batchnorm_apply";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "y", y, x));
    FR_TRY(check_channel(op, "mean", mean, x, d.c));
    FR_TRY(check_channel(op, "invstd", invstd, x, d.c));
    FR_TRY(check_channel(op, "gamma", gamma, x, d.c));
    FR_TRY(check_channel(op, "beta", beta, x, d.c));
    return apply_staged(y, x, fr_data_f32(mean), fr_data_f32(invstd), gamma, beta, &d);
}

fr_status fr_batchnorm_backward(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta,
                                const fr_tensor *dy, const fr_tensor *x, const fr_tensor *mean,
                                const fr_tensor *invstd, const fr_tensor *gamma) {
    const char *op = "batchnorm_backward";
    bn_dims d;
    FR_TRY(check_x(op, "x", x, &d));
    FR_TRY(check_like_x(op, "dy", dy, x));
    if (dx)
        FR_TRY(check_like_x(op, "dx", dx, x));
    FR_TRY(check_channel(op, "dgamma", dgamma, x, d.c));
    FR_TRY(check_channel(op, "dbeta", dbeta, x, d.c));
    FR_TRY(check_channel(op, "mean", mean, x, d.c));
    FR_TRY(check_channel(op, "invstd", invstd, x, d.c));
    FR_TRY(check_channel(op, "gamma", gamma, x, d.c));
    size_t n = (size_t)fr_numel(x);
    fr_stage sdy, sx, sdx = {0};
    FR_TRY(fr_stage_in(&sdy, dy, 0, n));
    fr_status st = fr_stage_in(&sx, x, 0, n);
    if (st == FR_OK && dx)
        st = fr_stage_out(&sdx, dx, 0, n, false, NULL, NULL);
    if (st == FR_OK) {
        st = FR_CALL_KERNEL(fr_device_of(x), bn_bwd, dx ? sdx.p : NULL, fr_data_f32(dgamma),
                            fr_data_f32(dbeta), sdy.p, sx.p, fr_data_f32(mean),
                            fr_data_f32(invstd), fr_data_f32(gamma), d.n, d.c, d.hw);
        if (dx)
            st = fr_stage_commit(&sdx, dx, 0, n, st);
    }
    fr_stage_free(&sx);
    fr_stage_free(&sdy);
    return st;
}
