/* optim.h: SGD, Adam and AdamW over a parameter registry, with PyTorch's
 * semantics (torch.optim.SGD / Adam / AdamW, single-tensor path): the same
 * formulas, the same first-step rule for the momentum buffer, the same bias
 * correction, the same rounding of scalars to f32.
 *
 *     fr_optim *opt = fr_sgd_new(model->params, (fr_sgd_options){
 *         .lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
 *     for (step...) {
 *         opt->lr = fr_schedule_lr(&sched, step);      // schedule.h
 *         ... forward, loss, fr_backward(loss) ...
 *         FR_TRY(fr_optim_step(opt));
 *         fr_optim_zero_grad(opt);
 *     }
 *     fr_optim_free(opt);
 *
 * Only FR_PARAMETER entries with a gradient are updated; a parameter without
 * one (it did not take part in the loss) is skipped and its state left alone,
 * as PyTorch does. State (momentum buffer; Adam's exp_avg and exp_avg_sq) is
 * created on the first step that updates a parameter, on its device, tagged
 * FR_TAG_OPTIM, so fr_mem_report shows it. The optimizer borrows the
 * registry: make it after fr_params_to_device (state lives with the
 * parameters) and free it before the model.
 *
 * Gradient accumulation over k micro-batches: run forward and backward k
 * times without zeroing (gradients add up in .grad), then step once and zero.
 * To match one large batch, scale each micro-batch's loss by 1/k before
 * backward (fr_scale(loss, 1.0f / k)), since the loss is a mean over its own
 * micro-batch. Caveat: BatchNorm normalises with each micro-batch's own
 * statistics and updates the running statistics k times per step, so the
 * result equals a k-times larger batch only for networks without BN. */
#ifndef FR_OPTIM_H
#define FR_OPTIM_H

#include "../nn/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FR_OPTIM_SGD = 0, FR_OPTIM_ADAM, FR_OPTIM_ADAMW, FR_OPTIM_KIND_COUNT } fr_optim_kind;

/* Hyperparameters are doubles, as in PyTorch's Python code. For SGD, fields
 * left zero are PyTorch's defaults (no momentum, dampening or decay); for
 * Adam start from fr_adam_defaults (betas and eps are not zero). */
typedef struct {
    double lr;
    double momentum;
    double dampening;
    double weight_decay;   /* L2: added to the gradient */
    bool nesterov;         /* needs momentum > 0 and dampening 0 */
} fr_sgd_options;

typedef struct {
    double lr;
    double beta1, beta2;   /* PyTorch: 0.9, 0.999 */
    double eps;            /* PyTorch: 1e-8 */
    double weight_decay;   /* Adam: L2 in the gradient; AdamW: decoupled */
} fr_adam_options;

/* PyTorch's Adam defaults with the given lr and weight decay. */
fr_adam_options fr_adam_defaults(double lr, double weight_decay);

typedef struct fr_optim {
    fr_optim_kind kind;
    double lr;              /* used by the next step; schedules set it */
    fr_sgd_options sgd;     /* when kind == FR_OPTIM_SGD */
    fr_adam_options adam;   /* when Adam or AdamW */
    fr_params *params;      /* borrowed */
    /* Per registry entry (index as in params->items), NULL until created:
     * SGD: state[0] momentum_buffer. Adam: state[0] exp_avg, state[1]
     * exp_avg_sq. steps: updates done to that entry (Adam's t). */
    int n;
    fr_tensor **state[2];
    int64_t *steps;
} fr_optim;

/* NULL with FR_ERR_ARG (naming the option) for values PyTorch rejects:
 * lr < 0, momentum < 0, weight_decay < 0, nesterov without momentum or with
 * dampening, betas outside [0, 1), eps < 0. */
fr_optim *fr_sgd_new(fr_params *params, fr_sgd_options o);
fr_optim *fr_adam_new(fr_params *params, fr_adam_options o);
fr_optim *fr_adamw_new(fr_params *params, fr_adam_options o);
/* Frees the state. NULL-safe. */
void fr_optim_free(fr_optim *opt);

/* One update of every parameter that has a gradient, with opt->lr. The
 * registry must not have grown since fr_*_new. */
fr_status fr_optim_step(fr_optim *opt);
/* Frees every parameter's gradient (fr_params_zero_grad). */
void fr_optim_zero_grad(fr_optim *opt);
/* Bytes of optimizer state now held. */
size_t fr_optim_state_bytes(const fr_optim *opt);
/* PyTorch's name of state slot i ("momentum_buffer", "exp_avg",
 * "exp_avg_sq"), or NULL when the optimizer keeps no such state (SGD without
 * momentum keeps none). */
const char *fr_optim_state_name(const fr_optim *opt, int slot);

#ifdef __cplusplus
}
#endif
#endif
