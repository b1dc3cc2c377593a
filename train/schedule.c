/* schedule.c: learning-rate schedules; see schedule.h. */
#include "schedule.h"

#include <math.h>
#include <string.h>

static fr_status check_lr(const char *op, double base_lr) {
    if (!(base_lr >= 0))
        return fr_error(FR_ERR_ARG, "schedule %s: base_lr %g must be >= 0", op, base_lr);
    return FR_OK;
}

fr_status fr_schedule_constant(fr_schedule *s, double base_lr) {
    FR_TRY(check_lr("constant", base_lr));
    *s = (fr_schedule){.kind = FR_SCHED_CONSTANT, .base_lr = base_lr};
    return FR_OK;
}

fr_status fr_schedule_step(fr_schedule *s, double base_lr, const int64_t *milestones, int n_milestones,
                           double gamma) {
    FR_TRY(check_lr("step", base_lr));
    if (n_milestones < 0 || n_milestones > FR_SCHED_MAX_MILESTONES || (n_milestones && !milestones))
        return fr_error(FR_ERR_ARG, "schedule step: %d milestones (0 to %d allowed)", n_milestones,
                        FR_SCHED_MAX_MILESTONES);
    for (int i = 0; i < n_milestones; i++)
        if (milestones[i] < 0 || (i && milestones[i] <= milestones[i - 1]))
            return fr_error(FR_ERR_ARG, "schedule step: milestones must be >= 0 and strictly "
                                        "increasing; milestone %d is %lld",
                            i, (long long)milestones[i]);
    if (!(gamma >= 0))
        return fr_error(FR_ERR_ARG, "schedule step: gamma %g must be >= 0", gamma);
    *s = (fr_schedule){.kind = FR_SCHED_STEP, .base_lr = base_lr, .n_milestones = n_milestones,
                       .gamma = gamma};
    if (n_milestones)
        memcpy(s->milestones, milestones, (size_t)n_milestones * sizeof *milestones);
    return FR_OK;
}

fr_status fr_schedule_cosine(fr_schedule *s, double base_lr, int64_t total_steps, double eta_min) {
    FR_TRY(check_lr("cosine", base_lr));
    if (total_steps < 1)
        return fr_error(FR_ERR_ARG, "schedule cosine: total_steps %lld must be >= 1",
                        (long long)total_steps);
    if (!(eta_min >= 0))
        return fr_error(FR_ERR_ARG, "schedule cosine: eta_min %g must be >= 0", eta_min);
    *s = (fr_schedule){.kind = FR_SCHED_COSINE, .base_lr = base_lr, .total_steps = total_steps,
                       .eta_min = eta_min};
    return FR_OK;
}

fr_status fr_schedule_warmup(fr_schedule *s, int64_t warmup_steps, double start_factor) {
    if (warmup_steps < 0)
        return fr_error(FR_ERR_ARG, "schedule warmup: warmup_steps %lld must be >= 0",
                        (long long)warmup_steps);
    if (!(start_factor > 0 && start_factor <= 1))
        return fr_error(FR_ERR_ARG, "schedule warmup: start_factor %g must be in (0, 1]", start_factor);
    if (s->kind == FR_SCHED_COSINE && warmup_steps >= s->total_steps)
        return fr_error(FR_ERR_ARG, "schedule warmup: %lld warm-up steps leave no cosine phase "
                                    "(total_steps %lld)",
                        (long long)warmup_steps, (long long)s->total_steps);
    s->warmup_steps = warmup_steps;
    s->warmup_start_factor = start_factor;
    return FR_OK;
}

double fr_schedule_lr(const fr_schedule *s, int64_t step) {
    if (step < 0)
        step = 0;
    if (step < s->warmup_steps) {
        double f = s->warmup_start_factor;
        return s->base_lr * (f + (1.0 - f) * (double)step / (double)s->warmup_steps);
    }
    switch (s->kind) {
    case FR_SCHED_STEP: {
        int passed = 0;
        while (passed < s->n_milestones && s->milestones[passed] <= step)
            passed++;
        return s->base_lr * pow(s->gamma, passed);
    }
    case FR_SCHED_COSINE: {
        int64_t t = step - s->warmup_steps, T = s->total_steps - s->warmup_steps;
        if (t >= T)
            return s->eta_min;
        return s->eta_min + (s->base_lr - s->eta_min) * (1.0 + cos(M_PI * (double)t / (double)T)) / 2.0;
    }
    case FR_SCHED_CONSTANT:
    default:
        return s->base_lr;
    }
}
