/* schedule.h: learning-rate schedules, queried per step.
 *
 *     fr_schedule sched;
 *     FR_TRY(fr_schedule_cosine(&sched, 0.1, total_steps, 0.0));
 *     FR_TRY(fr_schedule_warmup(&sched, 500, 0.1));   // optional, any kind
 *     ... opt->lr = fr_schedule_lr(&sched, step); ...
 *
 * A schedule is a pure function of the step (0-based, the step about to be
 * taken), so resuming from a checkpoint needs only the step count.
 *
 * Kinds, as torch.optim.lr_scheduler after `step` calls of scheduler.step():
 *  - constant: base_lr at every step.
 *  - step: base_lr * gamma^(number of milestones <= step) (MultiStepLR;
 *    milestones are absolute steps, strictly increasing).
 *  - cosine: eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T)) / 2 with
 *    t = step - warmup_steps and T = total_steps - warmup_steps
 *    (CosineAnnealingLR over the steps after the warm-up), held at eta_min
 *    from total_steps on (PyTorch's would rise again).
 * Linear warm-up (combinable with any kind): for step < warmup_steps the lr
 * is base_lr * (f + (1 - f) * step / warmup_steps), f the start factor; from
 * warmup_steps on, the kind above. In PyTorch terms: SequentialLR of
 * LinearLR(start_factor = f, total_iters = warmup_steps) and the kind's
 * scheduler (MultiStepLR with milestones shifted by warmup_steps), switching
 * at warmup_steps. */
#ifndef FR_SCHEDULE_H
#define FR_SCHEDULE_H

#include "../tensor/fr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FR_SCHED_CONSTANT = 0,
    FR_SCHED_STEP,
    FR_SCHED_COSINE,
    FR_SCHED_KIND_COUNT
} fr_schedule_kind;

#define FR_SCHED_MAX_MILESTONES 16

typedef struct {
    fr_schedule_kind kind;
    double base_lr;
    int n_milestones;                                /* step */
    int64_t milestones[FR_SCHED_MAX_MILESTONES];
    double gamma;
    int64_t total_steps;                             /* cosine */
    double eta_min;
    int64_t warmup_steps;                            /* 0: none */
    double warmup_start_factor;
} fr_schedule;

/* Each sets *s (outputs first) or returns FR_ERR_ARG naming the bad value. */
fr_status fr_schedule_constant(fr_schedule *s, double base_lr);
fr_status fr_schedule_step(fr_schedule *s, double base_lr, const int64_t *milestones, int n_milestones,
                           double gamma);
fr_status fr_schedule_cosine(fr_schedule *s, double base_lr, int64_t total_steps, double eta_min);
/* Adds a linear warm-up from start_factor * base_lr (start_factor in (0, 1]).
 * For cosine, warmup_steps must be below total_steps. */
fr_status fr_schedule_warmup(fr_schedule *s, int64_t warmup_steps, double start_factor);

/* The learning rate for `step` (>= 0; negative steps give the step-0 lr). */
double fr_schedule_lr(const fr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
