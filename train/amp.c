/* amp.c: dynamic loss scaling; see amp.h. The arithmetic on gradients is in
 * tensor/ops_amp.c (kernels in cpu/amp.c and cuda/amp.cu). */
#include "amp.h"

#include <math.h>
#include <stdio.h>

#include "../autograd/functions.h"
#include "../tensor/ops.h"

fr_status fr_loss_scaler_init(fr_loss_scaler *s, fr_dtype dtype) {
    if (!s)
        return fr_error(FR_ERR_ARG, "loss scaler init: scaler is NULL");
    if (!fr_dtype_is_float(dtype))
        return fr_error(FR_ERR_DTYPE, "loss scaler init: dtype %s, expected f16, bf16 or f32",
                        fr_dtype_name(dtype));
    bool dynamic = dtype == FR_F16;
    *s = (fr_loss_scaler){
        .dtype = dtype,
        .dynamic = dynamic,
        .scale = dynamic ? FR_LOSS_SCALE_INIT : 1.0f,
        .growth_factor = 2.0f,
        .backoff_factor = 0.5f,
        .growth_interval = FR_LOSS_SCALE_GROWTH_INTERVAL,
    };
    return FR_OK;
}

fr_tensor *fr_loss_scaler_scale(const fr_loss_scaler *s, fr_tensor *loss) {
    if (!s) {
        fr_error(FR_ERR_ARG, "loss scaler scale: scaler is NULL");
        return NULL;
    }
    return fr_scale(loss, s->scale);
}

/* Settings a caller may have changed after init. */
static fr_status check_settings(const char *op, const fr_loss_scaler *s) {
    if (s->growth_interval < 1)
        return fr_error(FR_ERR_ARG, "%s: growth_interval %d, expected >= 1", op, s->growth_interval);
    if (!(s->growth_factor > 1.0f) || !isfinite(s->growth_factor))
        return fr_error(FR_ERR_ARG, "%s: growth_factor %g, expected finite and > 1", op,
                        (double)s->growth_factor);
    if (!(s->backoff_factor > 0.0f && s->backoff_factor < 1.0f))
        return fr_error(FR_ERR_ARG, "%s: backoff_factor %g, expected in (0, 1)", op,
                        (double)s->backoff_factor);
    return FR_OK;
}

/* Unscales one gradient and adds its inf / NaN count to its device's
 * counter (created zeroed on first use). Unscaling first and counting after
 * also catches a finite gradient that dividing by a scale below 1 pushed to
 * inf. */
static fr_status unscale_one(fr_tensor **count, fr_tensor *g, float inv_scale) {
    fr_device dev = fr_device_of(g);
    if (!count[dev] && !(count[dev] = fr_zeros(dev, FR_F32, 1, FR_SHAPE(1), FR_TAG_WORKSPACE)))
        return fr_last_status();
    if (inv_scale != 1.0f)
        FR_TRY(fr_unscale_(g, inv_scale));
    return fr_nonfinite_count_(count[dev], g);
}

fr_status fr_loss_scaler_unscale(fr_loss_scaler *s, fr_params *params) {
    const char *op = "loss scaler unscale";
    if (!s || !params)
        return fr_error(FR_ERR_ARG, "%s: %s is NULL", op, !s ? "scaler" : "params");
    if (s->unscaled)
        return fr_error(FR_ERR_ARG, "%s: the gradients were unscaled already since the last step",
                        op);
    /* As PyTorch: the reciprocal in double, rounded once to f32 (exact for
     * the powers of two the policy produces). */
    float inv_scale = (float)(1.0 / (double)s->scale);
    fr_tensor *count[FR_DEVICE_COUNT] = {NULL};
    fr_status st = FR_OK;
    int with_grad = 0;
    for (int i = 0; st == FR_OK && i < params->count; i++) {
        fr_param *e = &params->items[i];
        if (e->kind != FR_PARAMETER || !e->tensor->grad)
            continue;
        with_grad++;
        st = unscale_one(count, e->tensor->grad, inv_scale);
        if (st != FR_OK) {
            char cause[256];
            snprintf(cause, sizeof cause, "%s", fr_last_error());
            st = fr_error(st, "%s, gradient of %s: %s", op, e->name, cause);
        }
    }
    if (st == FR_OK && with_grad == 0)
        st = fr_error(FR_ERR_ARG, "%s: no parameter has a gradient (run backward on the scaled "
                                  "loss first)", op);
    /* The one host read of the step (one per device holding gradients). */
    bool found = false;
    for (int d = 0; d < FR_DEVICE_COUNT; d++) {
        float n = 0.0f;
        if (st == FR_OK && count[d] && (st = fr_read_f32(count[d], &n, 1)) == FR_OK)
            found |= n != 0.0f;
        fr_release(count[d]);
    }
    if (st != FR_OK)
        return st;
    s->unscaled = true;
    s->found_nonfinite = found;
    return FR_OK;
}

/* The policy of amp.h, after a step that found (or not) an inf / NaN. */
static void update_scale(fr_loss_scaler *s, bool found) {
    if (!s->dynamic)
        return;
    if (found) {
        s->scale *= s->backoff_factor;
        s->growth_tracker = 0;
        return;
    }
    if (++s->growth_tracker < s->growth_interval)
        return;
    float grown = s->scale * s->growth_factor;
    if (isfinite(grown))
        s->scale = grown;
    s->growth_tracker = 0;
}

fr_status fr_loss_scaler_step(fr_loss_scaler *s, fr_optim *opt, fr_params *params, bool *stepped) {
    const char *op = "loss scaler step";
    if (stepped)
        *stepped = false;
    if (!s || !opt)
        return fr_error(FR_ERR_ARG, "%s: %s is NULL", op, !s ? "scaler" : "optimizer");
    if (params && params != opt->params)
        return fr_error(FR_ERR_ARG, "%s: params is not the optimizer's registry (pass NULL or the "
                                    "registry the optimizer was made with)", op);
    FR_TRY(check_settings(op, s));
    if (!s->unscaled)
        FR_TRY(fr_loss_scaler_unscale(s, opt->params));
    bool found = s->found_nonfinite;
    s->unscaled = false;
    s->found_nonfinite = false;
    if (found) {
        s->skipped++;
    } else {
        FR_TRY(fr_optim_step(opt));
        if (stepped)
            *stepped = true;
    }
    update_scale(s, found);
    return FR_OK;
}

fr_loss_scaler_state fr_loss_scaler_get_state(const fr_loss_scaler *s) {
    return (fr_loss_scaler_state){
        .scale = s->scale, .growth_tracker = s->growth_tracker, .skipped = s->skipped};
}

fr_status fr_loss_scaler_set_state(fr_loss_scaler *s, fr_loss_scaler_state st) {
    const char *op = "loss scaler set state";
    if (!s)
        return fr_error(FR_ERR_ARG, "%s: scaler is NULL", op);
    if (!isfinite(st.scale) || !(st.scale > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: scale %g, expected finite and > 0", op, (double)st.scale);
    if (!s->dynamic && st.scale != 1.0f)
        return fr_error(FR_ERR_ARG, "%s: scale %g for a %s scaler, whose scale is fixed at 1", op,
                        (double)st.scale, fr_dtype_name(s->dtype));
    if (st.growth_tracker < 0 || st.growth_tracker >= s->growth_interval)
        return fr_error(FR_ERR_ARG, "%s: growth_tracker %d, expected in [0, %d)", op,
                        st.growth_tracker, s->growth_interval);
    if (st.skipped < 0)
        return fr_error(FR_ERR_ARG, "%s: skipped %lld, expected >= 0", op, (long long)st.skipped);
    s->scale = st.scale;
    s->growth_tracker = st.growth_tracker;
    s->skipped = st.skipped;
    s->unscaled = false;
    s->found_nonfinite = false;
    return FR_OK;
}
