/* amp.h: dynamic loss scaling for mixed-precision training.
 *
 * f16 holds values down to 2^-24; small gradients fall below that and become
 * 0. Multiplying the loss by a large scale S before backward lifts every
 * gradient by S (the chain rule is linear), and dividing the f32 gradients
 * by S before the optimizer step gives back the true values. Too large an S
 * overflows: some gradient becomes inf or NaN. The scaler then skips that
 * step and halves S; after a run of clean steps it doubles S again, so S
 * stays near the largest value that does not overflow. The policy is
 * PyTorch's GradScaler's with its defaults:
 *   - initial scale 2^16;
 *   - any inf / NaN among the (unscaled) gradients: the optimizer step is
 *     SKIPPED (parameters and optimizer state untouched), scale *= 0.5, the
 *     growth tracker restarts at 0 and `skipped` counts one more;
 *   - else the step runs, and after `growth_interval` (2000) consecutive
 *     clean steps scale *= 2 (only if the result is finite) and the tracker
 *     restarts at 0.
 * The check costs one host read per step: every gradient is unscaled and
 * counted into one device-side counter (fr_nonfinite_count_), read once.
 *
 *     fr_loss_scaler sc;
 *     FR_TRY(fr_loss_scaler_init(&sc, FR_F16));
 *     for (step...) {
 *         fr_tensor *loss = ..., *scaled = fr_loss_scaler_scale(&sc, loss);
 *         FR_TRY(fr_backward(scaled));
 *         bool stepped;
 *         FR_TRY(fr_loss_scaler_step(&sc, opt, NULL, &stepped));
 *         fr_optim_zero_grad(opt);
 *     }
 *
 * To clip gradients, call fr_loss_scaler_unscale between backward and step:
 * the gradients are then true values, and step does not unscale twice.
 *
 * bf16 has f32's exponent range, so its gradients do not underflow the way
 * f16's do, and f32 needs no scaling at all: for FR_BF16 and FR_F32 the
 * scale is fixed at 1 and never grows or backs off, and a step is skipped
 * only when a gradient really is inf or NaN (which would otherwise poison
 * the weights); `skipped` counts those steps too.
 *
 * Lower bound: the policy has none, as in PyTorch; a run that overflows on
 * ~165 consecutive steps drives the scale to 0, and every later step is
 * skipped (training has diverged long before). The scaler holds no memory
 * between calls (its counters are scratch of each step), so it needs no
 * free. */
#ifndef FR_AMP_H
#define FR_AMP_H

#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FR_LOSS_SCALE_INIT 65536.0f
#define FR_LOSS_SCALE_GROWTH_INTERVAL 2000

typedef struct {
    fr_dtype dtype;          /* the reduced precision trained in */
    bool dynamic;            /* true for f16: the scale grows and backs off */
    float scale;             /* what the loss is multiplied by */
    float growth_factor;     /* 2 */
    float backoff_factor;    /* 0.5 */
    int growth_interval;     /* clean steps before growth; 2000, settable after init */
    int growth_tracker;      /* consecutive clean steps since the scale last changed */
    int64_t skipped;         /* optimizer steps skipped for inf / NaN gradients */
    /* Within one step: whether the gradients were unscaled already, and
     * whether that found an inf / NaN. */
    bool unscaled;
    bool found_nonfinite;
} fr_loss_scaler;

/* Defaults for training in `dtype`: FR_F16 dynamic from 2^16; FR_BF16 or
 * FR_F32 fixed at 1. FR_ERR_DTYPE for any other dtype. */
fr_status fr_loss_scaler_init(fr_loss_scaler *s, fr_dtype dtype);

/* loss * scale, differentiable (fr_scale): backward from it gives scaled
 * gradients. A new reference, or NULL with an error. */
fr_tensor *fr_loss_scaler_scale(const fr_loss_scaler *s, fr_tensor *loss);

/* Divides every parameter's gradient (f32) by the scale in place and checks
 * them all for inf / NaN (one host read per device holding gradients). At
 * most once per step: a second call before fr_loss_scaler_step is an error
 * (it would divide twice). FR_ERR_ARG when no parameter has a gradient; after
 * any error some gradients may be divided and others not: drop them
 * (fr_optim_zero_grad) rather than step. */
fr_status fr_loss_scaler_unscale(fr_loss_scaler *s, fr_params *params);

/* Unscales (unless fr_loss_scaler_unscale ran this step), then steps the
 * optimizer when every gradient is finite or skips the step when not, and
 * updates the scale (see the policy above). `params` is the optimizer's
 * registry or NULL (meaning it); *stepped (may be NULL) says whether the
 * optimizer stepped. An error from the optimizer leaves the scale as it
 * was. */
fr_status fr_loss_scaler_step(fr_loss_scaler *s, fr_optim *opt, fr_params *params, bool *stepped);

/* What a checkpoint keeps (PyTorch's GradScaler state_dict holds the same
 * scale and growth tracker). */
typedef struct {
    float scale;
    int growth_tracker;
    int64_t skipped;
} fr_loss_scaler_state;

fr_loss_scaler_state fr_loss_scaler_get_state(const fr_loss_scaler *s);
/* FR_ERR_ARG (naming the field) for a scale that is not finite and > 0, a
 * scale other than 1 for a fixed scaler, a tracker outside [0,
 * growth_interval), or skipped < 0; the scaler is unchanged then. */
fr_status fr_loss_scaler_set_state(fr_loss_scaler *s, fr_loss_scaler_state st);

#ifdef __cplusplus
}
#endif
#endif
