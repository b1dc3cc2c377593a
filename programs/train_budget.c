/* train_budget.c: what `train --memory-budget` adds to the training loop
 * (issue 22): choosing the batch (--batch auto), holding the first step to
 * the plan, and what an out-of-memory error says would have fitted. */
#include "cli_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- --batch auto ---- */

/* The least of the processes' batches on every process (each measured
 * alone; a rank whose search failed sends -1): the loaders shard one global
 * batch, so all must take the same share, and the least fits everywhere. */
static fr_status agree_batch(fr_dist *dist, fr_status local, int *batch) {
    int world = fr_dist_world(dist), rank = fr_dist_rank(dist);
    char why[1024];
    snprintf(why, sizeof why, "%s", local == FR_OK ? "" : fr_last_error());
    double *v = calloc((size_t)world, sizeof *v);
    if (!v)
        return fr_error(FR_ERR_OOM, "--batch auto: out of memory for %d processes' batches", world);
    v[rank] = local == FR_OK ? *batch : -1;
    fr_status s = fr_dist_sum(dist, v, world);
    int least = INT32_MAX, failed = -1;
    for (int k = 0; k < world && s == FR_OK; k++) {
        if (v[k] < 1) {
            if (failed < 0)
                failed = k;
        } else if (v[k] < least) {
            least = (int)v[k];
        }
    }
    free(v);
    if (s != FR_OK)
        return s;
    if (local != FR_OK)
        return fr_error(local, "%s", why);
    if (failed >= 0)
        return fr_error(FR_ERR_ARG, "--batch auto: process %d of %d found no batch that fits (its message "
                        "is on its output)", failed, world);
    *batch = least;
    return FR_OK;
}

fr_status fr_cli_batch_auto(fr_model *m, const fr_optim *opt, const fr_dataset *ds, fr_dist *dist, size_t budget,
                            bool allow_compress, int *batch) {
    int world = dist ? fr_dist_world(dist) : 1, rank = dist ? fr_dist_rank(dist) : 0;
    fr_device dev = fr_device_of(m->params->items[0].tensor);
    size_t now = fr_mem_total_current(dev), params = fr_mem_current(dev, FR_TAG_PARAM);
    /* held beside the step: the data sets (what is in use beyond the
     * parameters now), the optimizer state, and per image the loaders'
     * batches (each loader's ready one and two in the making) */
    fr_plan_options po = {.allow_abn = m->cfg.strategy.abn, .allow_compress = allow_compress,
                          .optim_bytes = fr_plan_optim_bytes(opt), .extra_bytes = now > params ? now - params : 0};
    /* each process trains on its shard of every batch: this is its share */
    int64_t shard = ds->n / world;
    int most = shard < 65536 ? (int)shard : 65536;
    fr_fit_batch_result w = {0};
    double t0 = fr_cli_now();
    fr_mem_set_phase("choosing the batch", 0);
    char b[3][32];
    fr_mem_format_bytes(budget, b[0], sizeof b[0]);
    fr_status s = most < 1 ? fr_error(FR_ERR_ARG, "--batch auto: %lld training images cannot be shared by %d "
                                      "processes", (long long)ds->n, world)
                           : fr_fit_batch(m, FR_SHAPE(1, ds->c, ds->h, ds->w), budget, &po,
                                          4 * (size_t)(ds->c * ds->h * ds->w * 4 + 4), most, &w);
    if (s == FR_OK && w.batch < 1)
        s = fr_error(FR_ERR_ARG, "--batch auto: no batch fits --memory-budget %s%s%s", b[0], w.why[0] ? ": " : "",
                     w.why);
    int mine = w.batch;
    if (dist)
        FR_TRY(agree_batch(dist, s, &mine));
    else
        FR_TRY(s);
    *batch = mine * world;
    fr_mem_set_phase("setting up", 0);
    if (rank != 0)
        return FR_OK;
    char next[96];
    if (!w.next)
        snprintf(next, sizeof next, "%s", w.batch >= most ? "more images than the training set has" : "not tried");
    else
        snprintf(next, sizeof next, "batch %d %s %s", w.next, w.next_estimated ? "needs about" : "needs",
                 w.next_need > 0 ? fr_mem_format_bytes((size_t)w.next_need, b[2], sizeof b[2]) : "more");
    printf("batch auto: %d, the largest batch whose step the planner fits in %s in one micro-batch "
           "(verified peak %s; %s; %d plans, %.1f s)\n", w.batch, b[0],
           fr_mem_format_bytes((size_t)w.peak, b[1], sizeof b[1]), next, w.plans, fr_cli_now() - t0);
    if (world > 1)
        printf("batch auto: %d images a process (the least any of the %d processes found), %d a step\n", mine,
               world, *batch);
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
