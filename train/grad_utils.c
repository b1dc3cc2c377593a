/* grad_utils.c: training utilities over a parameter registry: gradient
 * clipping by total norm and the no-weight-decay group (train/optim.h). */
#include <math.h>
#include <stdlib.h>

#include "../autograd/autograd.h"
#include "../tensor/ops.h"
#include "optim.h"

bool fr_param_is_norm_or_bias(const fr_param *e, void *ctx) {
    (void)ctx;
    return e->tensor->ndim <= 1;
}

fr_status fr_optim_exclude_from_decay(fr_optim *opt, fr_param_pred pred, void *ctx, int *count) {
    if (!opt)
        return fr_error(FR_ERR_ARG, "exclude_from_decay: optimizer is NULL");
    if (!opt->no_decay && !(opt->no_decay = calloc(opt->n ? (size_t)opt->n : 1, sizeof(bool))))
        return fr_error(FR_ERR_OOM, "exclude_from_decay: out of memory");
    int hits = 0;
    for (int i = 0; i < opt->n; i++) {
        const fr_param *e = &opt->params->items[i];
        opt->no_decay[i] = e->kind == FR_PARAMETER && (pred ? pred(e, ctx) : fr_param_is_norm_or_bias(e, NULL));
        hits += opt->no_decay[i];
    }
    if (count)
        *count = hits;
    return FR_OK;
}

/* sum of g*g as f32 (the device's reduction), through a scratch tensor */
static fr_status sum_squares(const fr_tensor *g, float *out) {
    fr_tensor *sq = fr_empty_like(g, FR_TAG_WORKSPACE);
    fr_tensor *s = sq ? fr_empty(fr_device_of(g), FR_F32, 0, NULL, FR_TAG_WORKSPACE) : NULL;
    fr_status st = s ? fr_mul_out(sq, g, g) : fr_last_status();
    if (st == FR_OK)
        st = fr_sum_out(s, sq);
    if (st == FR_OK)
        *out = fr_item(s);
    fr_release(s);
    fr_release(sq);
    return st;
}

fr_status fr_clip_grad_norm(fr_params *p, double max_norm, double *total_norm) {
    if (!p)
        return fr_error(FR_ERR_ARG, "clip_grad_norm: params is NULL");
    if (!(max_norm > 0))
        return fr_error(FR_ERR_ARG, "clip_grad_norm: max_norm %g must be > 0", max_norm);
    /* PyTorch: the norm of the stacked per-tensor norms, each an f32 */
    double acc = 0.0;
    for (fr_param *e = NULL; (e = fr_params_next(p, e, FR_PARAMETER));) {
        if (!e->tensor->grad)
            continue;
        float ss;
        FR_TRY(sum_squares(e->tensor->grad, &ss));
        float norm = sqrtf(ss);
        acc += (double)norm * norm;
    }
    float total = (float)sqrt(acc);
    if (total_norm)
        *total_norm = total;
    float coef = (float)(max_norm / ((double)total + 1e-6));
    if (coef >= 1.0f)
        return FR_OK;
    for (fr_param *e = NULL; (e = fr_params_next(p, e, FR_PARAMETER));)
        if (e->tensor->grad)
            FR_TRY(fr_scale_out(e->tensor->grad, e->tensor->grad, coef));
    return FR_OK;
}
