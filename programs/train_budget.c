/* train_budget.c: what `train --memory-budget` adds to the training loop
 * (issue 22): choosing the batch (--batch auto), holding the first step to
 * the plan, and what an out-of-memory error says would have fitted. */
#include "cli_impl.h"

#include <string.h>

/* ---- --batch auto ---- */

fr_status fr_cli_batch_auto(fr_model *m, const fr_optim *opt, const fr_dataset *ds, int world, size_t budget,
                            bool allow_compress, int *batch) {
    if (world > 1)
        return fr_error(FR_ERR_ARG, "--batch auto runs on one process (each would measure its own): give "
                        "--batch N with %d processes", world);
    /* recompute+checkpoint's row gives the planner's search its start */
    fr_strategy lean = {.recompute = true, .checkpoint = -1};
    int most = ds->n < 65536 ? (int)ds->n : 65536;
    fr_fit_options fo = {.optim_bytes = fr_plan_optim_bytes(opt), .strategies = &lean, .n_strategies = 1,
                         .extra_per_image = 4 * (size_t)(ds->c * ds->h * ds->w * 4 + 4), .max_batch = most,
                         .planner = true,
                         .plan = {.allow_abn = m->cfg.strategy.abn, .allow_compress = allow_compress}};
    fr_fit_report fit;
    fr_mem_set_phase("choosing the batch", 0);
    FR_TRY(fr_fit(m, FR_SHAPE(most < 32 ? most : 32, ds->c, ds->h, ds->w), budget, &fo, &fit));
    fr_fit_row w = fit.rows[1];
    fr_fit_report_free(&fit);
    char b[3][32];
    fr_mem_format_bytes(budget, b[0], sizeof b[0]);
    if (w.status != FR_OK || w.batch < 1)
        return fr_error(FR_ERR_ARG, "--batch auto: no batch fits --memory-budget %s%s%s", b[0],
                        w.error[0] ? ": " : "", w.error);
    *batch = w.batch;
    fr_mem_set_phase("setting up", 0);
    printf("batch auto: %d, the largest batch whose step the planner fits in %s in one micro-batch "
           "(measured peak %s; batch %d: %s)\n", w.batch, b[0], fr_mem_format_bytes(w.peak, b[1], sizeof b[1]),
           w.batch + 1, !w.next_measured ? "more images than the training set has"
                        : w.peak_next ? fr_mem_format_bytes(w.peak_next, b[2], sizeof b[2])
                                      : "no layout fits");
    return FR_OK;
}

/* ---- the first step against the plan ---- */

fr_status fr_cli_plan_check_step(fr_memory_plan *plan, const char *model, int64_t step) {
    fr_mem_stats ms;
    fr_mem_get_stats(plan->device, &ms);
    if (ms.total_peak <= plan->budget)
        return FR_OK;
    int most = 0; /* the tag holding the most at the peak */
    for (int t = 1; t < FR_TAG_COUNT; t++)
        if (ms.at_peak[t] > ms.at_peak[most])
            most = t;
    /* the plan's own figures did not hold: the least known to work now is this step's peak */
    if ((double)ms.total_peak > plan->min_budget)
        plan->min_budget = (double)ms.total_peak;
    return fr_error(FR_ERR_OOM, "%s: the memory plan did not hold during training step %lld: it peaked at %zu "
                    "bytes (the most of them, %zu, for %s), past the --memory-budget of %zu (predicted "
                    "%.0f, verified %.0f)", model, (long long)step, ms.total_peak, ms.at_peak[most],
                    fr_mem_tag_name((fr_mem_tag)most), plan->budget, plan->predicted_peak, plan->verified_peak);
}

/* ---- out of memory: what would have fitted ---- */

fr_status fr_cli_oom_hint(const fr_memory_plan *plan, size_t memory_limit, size_t memory_budget) {
    char why[1024], b[32];
    snprintf(why, sizeof why, "%s", fr_last_error());
    const char *phase = fr_mem_phase();
    if (!phase || (strcmp(phase, "training") && strcmp(phase, "evaluation")))
        return FR_ERR_OOM; /* loading data or planning: a budget does not change that */
    if (plan->min_budget > 0)
        return fr_error(FR_ERR_OOM, "%s; the least budget known to hold batch %d is %s "
                        "(--memory-budget; --memory-limit at least that plus the data set's bytes)",
                        why, plan->batch, fr_mem_format_bytes((size_t)plan->min_budget, b, sizeof b));
    if (memory_limit && !memory_budget)
        return fr_error(FR_ERR_OOM, "%s; --memory-budget %s plans a step that fits (and names the "
                        "smallest budget that works)", why, fr_mem_format_bytes(memory_limit, b, sizeof b));
    return FR_ERR_OOM;
}
