/* plan_print.c: a memory plan in words, a measured step beside it, and the
 * plan's small helpers (freeing it, the optimizer state it counts); see
 * planner.h. */
#include "planner.h"

#include <stdlib.h>
#include <string.h>

static double mib(double b) { return b / (1024.0 * 1024.0); }

static const char *group_kind(const fr_plan_unit *u) {
    return u->barrier ? "dense module" : u->checkpointed ? "checkpointed" : "kept";
}

void fr_plan_print(const fr_memory_plan *plan, FILE *out) {
    char b[4][32];
    fprintf(out, "memory plan: budget %s; batch %d", fr_mem_format_bytes(plan->budget, b[0], sizeof b[0]),
            plan->batch);
    if (plan->accum > 1)
        fprintf(out, " as %d micro-batches of %d", plan->accum, plan->micro_batch);
    fprintf(out, ", %s, %s\n", fr_dtype_name(plan->precision), fr_device_name(plan->device));
    fprintf(out, "  %-28s %-26s %10s  %s\n", "step", "strategy", "kept MiB", "group");
    int group = 0;
    for (int u = 0; u < plan->n_units; u++) {
        const fr_plan_unit *pu = &plan->units[u];
        char strat[48];
        fr_strategy s = pu->strategy;
        bool inner = s.checkpoint != 0;
        s.checkpoint = 0;
        fr_strategy_format(s, strat, sizeof strat);
        if (inner)
            snprintf(strat + strlen(strat), sizeof strat - strlen(strat), " (children ckpt)");
        if (pu->segment_start)
            group++;
        fprintf(out, "  %-28.28s %-26s %10.2f  %s %d%s\n", pu->name, strat, mib(pu->kept_bytes),
                group_kind(pu), group, pu->segment_start ? ", starts here" : "");
    }
    fprintf(out, "  predicted peak %s (plain at batch %d: %s; leanest layout: %s)\n",
            fr_mem_format_bytes((size_t)plan->predicted_peak, b[1], sizeof b[1]), plan->batch,
            plan->plain_peak > 0 ? fr_mem_format_bytes((size_t)plan->plain_peak, b[2], sizeof b[2])
                                 : "over the budget, not measured",
            fr_mem_format_bytes((size_t)plan->leanest_peak, b[3], sizeof b[3]));
    double over = plan->plain_ms > 0 ? 100.0 * (plan->predicted_ms - plan->plain_ms) / plan->plain_ms : 0;
    if (plan->verified_peak > 0)
        fprintf(out, "  verified peak %s in a whole trial step (%+.1f%% on the prediction)%s\n",
                fr_mem_format_bytes((size_t)plan->verified_peak, b[1], sizeof b[1]),
                100.0 * (plan->verified_peak - plan->predicted_peak) / plan->predicted_peak,
                plan->verify_rounds > 1 ? "; planned again for less after a layout's step passed the "
                                          "budget" : "");
    fprintf(out, "  predicted step %.1f ms (plain %.1f ms): %+.1f%% time; chosen: %s\n",
            plan->predicted_ms, plan->plain_ms, over, plan->chosen);
    if (plan->chen_ms >= 0)
        fprintf(out, "  at this micro-batch: dynamic programme %.1f ms, fastest Chen split that fits "
                "%.1f ms\n", plan->dp_ms, plan->chen_ms);
    else
        fprintf(out, "  at this micro-batch: dynamic programme %.1f ms; no Chen split fits\n", plan->dp_ms);
    if (plan->bn_caveat)
        fprintf(out, "  note: batch norm normalises each micro-batch of %d with its own statistics, "
                "so training differs from batches of %d (docs/TRAINING.md)\n",
                plan->micro_batch, plan->batch);
}

void fr_plan_print_measured(const fr_memory_plan *plan, size_t measured_peak, size_t not_yet, FILE *out) {
    char a[32], b[32], c[32], d[32];
    double predicted = plan->predicted_peak - (double)not_yet;
    double err = predicted > 0 ? 100.0 * ((double)measured_peak - predicted) / predicted : 0;
    fprintf(out, "memory plan: measured peak %s, predicted %s (%+.1f%%)", fr_mem_format_bytes(measured_peak, a, sizeof a),
            fr_mem_format_bytes((size_t)predicted, b, sizeof b), err);
    if (not_yet)
        fprintf(out, " for a step without the %s of optimizer state it creates at its end",
                fr_mem_format_bytes(not_yet, c, sizeof c));
    fprintf(out, "; budget %s%s\n", fr_mem_format_bytes(plan->budget, d, sizeof d),
            measured_peak > plan->budget ? ": EXCEEDED" : "");
}

size_t fr_plan_optim_bytes(const fr_optim *opt) {
    if (!opt)
        return 0;
    size_t trainable = 0;
    for (int i = 0; i < opt->params->count; i++)
        if (opt->params->items[i].kind == FR_PARAMETER)
            trainable += fr_nbytes(opt->params->items[i].tensor);
    if (opt->kind == FR_OPTIM_SGD)
        return opt->sgd.momentum != 0 ? trainable : 0;
    return 2 * trainable;
}

void fr_memory_plan_free(fr_memory_plan *plan) {
    if (!plan)
        return;
    free(plan->units);
    free(plan->points);
    *plan = (fr_memory_plan){0};
}
