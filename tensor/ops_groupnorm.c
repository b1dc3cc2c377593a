/* ops_groupnorm.c: checked group normalisation + activation (see ops.h). */
#include <stdio.h>

#include "kernels.h"
#include "ops.h"

/* The shape record of x for `groups` groups, or an error naming the op,
 * groups and x's shape. */
static fr_status gn_shape(const char *op, const fr_tensor *x, int groups, fr_gn_shape *s) {
    FR_TRY(fr_check_f32c(op, "x", x));
    char buf[64];
    if (x->ndim < 2)
        return fr_error(FR_ERR_SHAPE, "%s: x %s needs a batch and a channel dim", op,
                        fr_shape_str(x, buf, sizeof buf));
    int64_t hw = 1;
    for (int d = 2; d < x->ndim; d++)
        hw *= x->shape[d];
    int64_t c = x->shape[1];
    if (groups < 1 || c % groups != 0)
        return fr_error(FR_ERR_SHAPE, "%s: groups %d does not divide the %lld channels of x %s", op,
                        groups, (long long)c, fr_shape_str(x, buf, sizeof buf));
    *s = (fr_gn_shape){.n = (int)x->shape[0], .c = (int)c, .hw = (int)hw, .groups = groups};
    return FR_OK;
}

static fr_status check_stats(const char *op, const fr_tensor *x, const fr_gn_shape *s,
                             const fr_tensor *mean, const fr_tensor *invstd) {
    FR_TRY(fr_check_f32c(op, "mean", mean));
    FR_TRY(fr_check_f32c(op, "invstd", invstd));
    FR_TRY(fr_check_shape(op, "mean", mean, 2, FR_SHAPE(s->n, s->groups)));
    FR_TRY(fr_check_shape(op, "invstd", invstd, 2, FR_SHAPE(s->n, s->groups)));
    FR_TRY(fr_check_same_device(op, "mean", mean, "x", x));
    return fr_check_same_device(op, "invstd", invstd, "x", x);
}

static fr_status check_affine(const char *op, const fr_tensor *x, const fr_gn_shape *s,
                              const fr_tensor *gamma, const fr_tensor *beta) {
    FR_TRY(fr_check_f32c(op, "weight", gamma));
    FR_TRY(fr_check_f32c(op, "bias", beta));
    FR_TRY(fr_check_shape(op, "weight", gamma, 1, FR_SHAPE(s->c)));
    FR_TRY(fr_check_shape(op, "bias", beta, 1, FR_SHAPE(s->c)));
    FR_TRY(fr_check_same_device(op, "weight", gamma, "x", x));
    return fr_check_same_device(op, "bias", beta, "x", x);
}

fr_status fr_group_norm_stats(fr_tensor *mean, fr_tensor *invstd, const fr_tensor *x, int groups,
                              float eps) {
    fr_gn_shape s;
    FR_TRY(gn_shape("group_norm", x, groups, &s));
    FR_TRY(check_stats("group_norm", x, &s, mean, invstd));
    if (!(eps > 0))
        return fr_error(FR_ERR_ARG, "group_norm: eps %g must be > 0", (double)eps);
    return FR_CALL_KERNEL(fr_device_of(x), group_norm_stats, fr_data_f32(mean), fr_data_f32(invstd),
                          fr_data_f32(x), eps, &s);
}

fr_status fr_group_norm_act_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *mean,
                                    const fr_tensor *invstd, const fr_tensor *gamma,
                                    const fr_tensor *beta, int groups, fr_act act, float slope) {
    const char *op = "group_norm";
    fr_gn_shape s;
    FR_TRY(fr_act_check(op, act, slope));
    FR_TRY(gn_shape(op, x, groups, &s));
    FR_TRY(check_stats(op, x, &s, mean, invstd));
    FR_TRY(check_affine(op, x, &s, gamma, beta));
    FR_TRY(fr_check_f32c(op, "y", y));
    FR_TRY(fr_check_same_shape(op, "y", y, "x", x));
    FR_TRY(fr_check_same_device(op, "y", y, "x", x));
    return FR_CALL_KERNEL(fr_device_of(x), group_norm_act_forward, fr_data_f32(y), fr_data_f32(x),
                          fr_data_f32(mean), fr_data_f32(invstd), fr_data_f32(gamma),
                          fr_data_f32(beta), act, slope, &s);
}

fr_status fr_group_norm_act_backward(fr_tensor *dx, fr_tensor *dgamma, fr_tensor *dbeta,
                                     const fr_tensor *dy, const fr_tensor *x, const fr_tensor *mean,
                                     const fr_tensor *invstd, const fr_tensor *gamma,
                                     const fr_tensor *beta, int groups, fr_act act, float slope) {
    const char *op = "group_norm_backward";
    fr_gn_shape s;
    FR_TRY(fr_act_check(op, act, slope));
    FR_TRY(gn_shape(op, x, groups, &s));
    FR_TRY(check_stats(op, x, &s, mean, invstd));
    FR_TRY(check_affine(op, x, &s, gamma, beta));
    FR_TRY(check_affine(op, x, &s, dgamma, dbeta));
    FR_TRY(fr_check_f32c(op, "dy", dy));
    FR_TRY(fr_check_same_shape(op, "dy", dy, "x", x));
    FR_TRY(fr_check_same_device(op, "dy", dy, "x", x));
    if (dx) {
        FR_TRY(fr_check_f32c(op, "dx", dx));
        FR_TRY(fr_check_same_shape(op, "dx", dx, "x", x));
        FR_TRY(fr_check_same_device(op, "dx", dx, "x", x));
    }
    return FR_CALL_KERNEL(fr_device_of(x), group_norm_act_backward, dx ? fr_data_f32(dx) : NULL,
                          fr_data_f32(dgamma), fr_data_f32(dbeta), fr_data_f32(dy), fr_data_f32(x),
                          fr_data_f32(mean), fr_data_f32(invstd), fr_data_f32(gamma),
                          fr_data_f32(beta), act, slope, &s);
}
