/* planner.h: give a byte budget, get the fastest training step that fits.
 *
 *     fr_memory_plan plan;
 *     FR_TRY(fr_plan_memory(m, FR_SHAPE(64, 3, 32, 32), 512 << 20, NULL, &plan));
 *     fr_plan_print(&plan, stdout);
 *     FR_TRY(fr_plan_apply(m, &plan));          // m->cfg.strategy and the layout
 *     fr_train_step(m, opt, NULL, x, y, plan.accum, &loss, NULL, NULL);
 *     fr_memory_plan_free(&plan);
 *
 * How (docs/ARCHITECTURE.md, "The memory planner"):
 *  1. A per-block profile (planner/profile.c): every step of the root sequence
 *     (the units nn/segments.c cuts into checkpoint segments: a block, a
 *     dense module, a run of layers) is run once per function-preserving
 *     strategy (plain, recompute; abn only with allow_abn; a dense module also with its own
 *     children checkpointed; each also under compress:8/4/2 only with
 *     allow_compress) at the given batch, image size, precision and
 *     device: forward with grad, backward, and forward under no_grad, each
 *     read from the ledger (bytes kept, transient peak) and the clock.
 *     Profiles are cached in the model per input shape, precision, device
 *     and option set.
 *  2. A layout: the sequence is cut into groups, each either kept (its
 *     activations held for backward) or checkpointed (only its input held,
 *     replayed in backward), each under one strategy. The choice is a
 *     dynamic programme over the steps (rotor, Beaumont et al. 2019, for
 *     one level of checkpoints, with a strategy per group) whose states are
 *     exact Pareto fronts of (bytes held, predicted time): it returns the
 *     least predicted time whose simulated peak fits the budget. Chen et
 *     al.'s split (nn/seg_split.h) and sqrt(N) segments under each uniform
 *     strategy are simulated with the same profile, as a comparison and a
 *     fallback (the plan records both times).
 *  3. Layouts are chosen for the budget less 1/128 of it, room for what a
 *     trial step is not (a training step's loss and update) and for the
 *     allocator's rounding, which a memory limit on reserved bytes counts;
 *     every smallest budget the planner names includes that room.
 *     When even the leanest layout does not fit, the batch is split into
 *     micro-batches (fr_train_step's accumulation; batch norm then sees
 *     smaller batches: plan.bn_caveat). A budget below what fits at batch 1
 *     is FR_ERR_ARG naming the smallest budget that works.
 *  4. The chosen layout is verified: one whole trial step of it (forward
 *     through the whole root, the sum of the logits, backward, under the
 *     trials' rules and cap) is measured, its statics counted as the
 *     prediction counts them (plan.verified_peak). The prediction composes
 *     steps measured alone and can miss how they interact (exact on the
 *     tested chains and models since the recipe-input trials; a
 *     checkpointed group inside a flat chain under compress still missed
 *     by up to 3.5%), so a step over the budget makes the
 *     planner plan again for the budget lowered by the miss (4 rounds at
 *     most); when none holds, FR_ERR_ARG names the model, the budget and
 *     the least a measured layout needed (when the cap stopped every
 *     round, the last layout is measured once more under the caller's
 *     limit alone to find it), which plan->min_budget keeps too.
 *
 * The peak is predicted for a step in which the batch, the parameters, the
 * optimizer state (options.optim_bytes) and the gradients stay allocated,
 * as fr_train_step runs it. fr_plan_memory runs trial steps: it resets the
 * ledger's peaks, leaves parameters, BN statistics, the random stream and
 * any .grad as they were, and needs no tensor of the caller's. The trials
 * stay within the budget (plus what the caller holds beyond the step's
 * static bytes): one that would pass it is stopped and its strategy left
 * out for that step (planner/profile.h), so planning never needs more than
 * the plan (docs/ARCHITECTURE.md, "The memory planner"). */
#ifndef FR_PLANNER_H
#define FR_PLANNER_H

#include <stdio.h>

#include "../nn/model.h"
#include "../train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    bool allow_abn;       /* InPlace-ABN may be chosen: it changes the function (model.h) */
    bool allow_compress;  /* compress:8/4/2 may be chosen per block: it changes the
                             gradients (model.h); profiled 4x as many ways; f32 models
                             only (under f16/bf16 it is left out) */
    int max_accum;        /* most micro-batches to split into [the batch size] */
    size_t optim_bytes;   /* optimizer state held during a step: fr_plan_optim_bytes */
    size_t extra_bytes;   /* anything else held during a step (a batch being prefetched) */
} fr_plan_options;

/* Bytes the optimizer's state will take once it exists (SGD with momentum:
 * one buffer per trainable parameter; Adam: two). */
size_t fr_plan_optim_bytes(const fr_optim *opt);

/* One step of the root sequence in a plan. */
typedef struct {
    char name[64];        /* its first module ("layer1.0"; "conv1+bn1" for a run of layers) */
    fr_strategy strategy; /* inplace / recompute / abn; checkpoint: a dense module's own children */
    bool checkpointed;    /* inside a checkpointed segment */
    bool segment_start;   /* a group (kept or checkpointed) starts here */
    bool barrier;         /* a dense module: never inside an outer segment */
    double kept_bytes;    /* what its forward holds for backward under its strategy */
} fr_plan_unit;

/* A point of the predicted memory curve over one step. */
typedef struct {
    double ms;            /* predicted time since the step began */
    double bytes;         /* predicted total bytes in use */
} fr_plan_point;

typedef struct {
    size_t budget;
    int batch, accum, micro_batch; /* micro_batch = ceil(batch / accum) */
    bool bn_caveat;       /* accum > 1: BN statistics over micro-batches */
    fr_strategy base;     /* m->cfg.strategy under the plan (also for other shapes) */
    int n_units;
    fr_plan_unit *units;  /* owned */
    double predicted_peak;     /* bytes, the whole step (accum micro-batches) */
    double verified_peak;      /* measured in a whole trial step of the layout, the statics
                                * counted as the prediction counts them: <= budget */
    int verify_rounds;         /* whole trial steps run: 1, more when a layout passed the budget
                                * and the planner planned again for less */
    double plain_peak;         /* predicted for plain at the whole batch (0: its trials
                                * passed the budget, so it was not measured) */
    double static_bytes;       /* parameters, batch, optimizer state */
    double leanest_peak;       /* the least any layout needs at micro_batch */
    double min_budget;         /* the least any layout needs in the smallest micro-batches
                                * (0: not known: even those trials passed the memory
                                * limit); also set when fr_plan_memory fails because the
                                * budget is below it */
    double predicted_ms, plain_ms; /* predicted step time; plain at the whole batch */
    double dp_ms, chen_ms;     /* at this micro-batch: the dynamic programme's choice and the
                                * fastest Chen split that fits (< 0: none fits) */
    double dp_peak, chen_peak;
    char chosen[32];      /* "dynamic programme", "chen", ... */
    int n_points;
    fr_plan_point *points; /* owned: the predicted curve of one micro-batch */
    int64_t shape[4];     /* the micro-batch input the layout is keyed on */
    fr_dtype precision;
    fr_device device;
    fr_plan_options options;
} fr_memory_plan;

/* Plans a training step of m on inputs of `shape` (N, C, H, W) under
 * m->cfg.precision, on the device of m's parameters, within `budget`
 * bytes. opts may be NULL. On success *plan is filled (free it with
 * fr_memory_plan_free); FR_ERR_ARG when no layout fits even at batch 1
 * (naming the smallest budget that works), when the model is not built with
 * nn/build.h, or for a bad shape, or when no layout's whole trial step
 * holds the budget (step 4 above). */
fr_status fr_plan_memory(fr_model *m, const int64_t *shape, size_t budget,
                         const fr_plan_options *opts, fr_memory_plan *plan);

/* Installs the plan: m->cfg.strategy = plan->base and the layout for
 * plan->shape. Train with accum = plan->accum. Another input shape (or a
 * changed m->cfg.strategy) runs without the layout, under the base
 * strategy (automatic checkpoint segments). */
fr_status fr_plan_apply(fr_model *m, const fr_memory_plan *plan);

/* Removes an installed layout (m->cfg.strategy is left as it is). */
void fr_plan_remove(fr_model *m);

/* The predicted peak of a layout given unit by unit (strategies[i],
 * checkpointed[i], segment_start[i]) from the cached profile of `plan`'s
 * configuration: what the tests use to compare layouts. */
fr_status fr_plan_predict(fr_model *m, const fr_memory_plan *plan, const fr_plan_unit *units,
                          double *peak, double *ms);

/* The plan, unit by unit, and its predictions. */
void fr_plan_print(const fr_memory_plan *plan, FILE *out);
/* A measured step's peak beside the prediction; `not_yet`: bytes of the
 * prediction the measured step did not hold yet (the optimizer state, which
 * a first step creates at its end), compared without them. */
void fr_plan_print_measured(const fr_memory_plan *plan, size_t measured_peak, size_t not_yet, FILE *out);

void fr_memory_plan_free(fr_memory_plan *plan); /* NULL-safe */

/* The largest batch <= shape[0] for an evaluation pass (eval mode, no_grad)
 * of m on inputs of `shape` whose predicted peak, with `held` bytes in use
 * beside it, fits `budget` (planner/fit.c): two measured forwards, at `probe`
 * images (a batch known to fit, such as the plan's micro-batch) and half of
 * it, give the bytes as a + b * batch. At least 1; *predicted (may be NULL)
 * gets the predicted peak at the chosen batch. Resets the ledger's peaks. */
fr_status fr_fit_eval_batch(fr_model *m, const int64_t *shape, int probe, size_t budget, size_t held,
                            int *batch, double *predicted);

/* ---- will it fit? (planner/fit.c) ----
 *
 *     fr_fit_report fit;
 *     fr_fit_options fo = {.optim_bytes = fr_plan_optim_bytes(opt), .planner = true};
 *     FR_TRY(fr_fit(m, FR_SHAPE(64, 3, 32, 32), 40 << 20, &fo, &fit));
 *     fr_fit_print(&fit, stdout);       // largest batch per strategy, budget for 64
 *     fr_fit_report_free(&fit);
 *
 * Every figure is a measured training step (fr_train_step without an
 * optimizer, twice at each batch, the peak read from the ledger) with the
 * optimizer state the real step will hold allocated beside it: so a step
 * at a row's batch fits the budget and one at batch + 1 does not, exactly
 * in ledger bytes. */
typedef struct {
    size_t optim_bytes;       /* optimizer state a step holds that does not exist yet
                               * (fr_plan_optim_bytes before the first step) */
    size_t extra_per_image;   /* bytes per image held beside the step (a loader's
                               * prefetched batches) */
    int max_batch;            /* the largest batch tried [8 x the asked batch, at least 64] */
    const fr_strategy *strategies; /* the rows; NULL: plain, recompute, abn, checkpoint,
                               * recompute+checkpoint, abn+checkpoint */
    int n_strategies;
    bool planner;             /* a last row: the planner's layout in one micro-batch */
    fr_plan_options plan;     /* for that row (allow_abn, allow_compress, extra_bytes) */
} fr_fit_options;

typedef struct {
    char name[64];            /* the strategy, or "planner" */
    fr_strategy strategy;
    bool planned;             /* the planner's row */
    fr_status status;         /* FR_OK, or the error of a strategy the model refuses */
    char error[256];          /* its message (also: why the planner has no layout at batch 1) */
    int batch;                /* the largest batch <= max_batch whose step fits (0: none) */
    size_t peak;              /* the measured peak of a step at `batch` */
    bool next_measured;       /* batch + 1 <= max_batch was measured, and did not fit */
    size_t peak_next;         /* ... its peak (0: out of memory under a limit, or no layout) */
    double fixed, per_image;  /* peak(b) ~ fixed + per_image * b, from the first two steps */
    size_t need;              /* the smallest budget for the asked batch: its step's peak */
    bool need_predicted;      /* the planner's row: the planner's prediction, not a step */
    size_t at_peak[FR_TAG_COUNT]; /* the asked batch's step: bytes per tag at its peak */
    int steps;                /* training steps run for the row */
} fr_fit_row;

typedef struct {
    int64_t shape[4];         /* the asked batch and image */
    size_t budget;
    int max_batch;
    int n_rows;
    fr_fit_row *rows;         /* owned */
} fr_fit_report;

/* For m on inputs of `shape` (N, C, H, W) under m->cfg.precision on the
 * device of its parameters: per strategy the largest batch whose step fits
 * `budget` and the budget a step of N needs (with its split by tag). opts
 * may be NULL. The trials leave m as they found it: parameters, BN running
 * statistics, m->cfg.strategy, any .grad and the random stream (an
 * installed plan layout is removed). A strategy the model refuses is a row
 * with its error; FR_ERR_ARG for bad arguments. Resets the ledger's peaks. */
fr_status fr_fit(fr_model *m, const int64_t *shape, size_t budget, const fr_fit_options *opts,
                 fr_fit_report *out);
/* The report as a short table. */
void fr_fit_print(const fr_fit_report *r, FILE *out);

/* The largest batch <= max_batch (inputs of image[1..3]) for which the
 * planner finds a layout in one micro-batch whose whole measured step holds
 * `budget` (train --batch auto), from few plans: two small batches give the
 * line of the least a step needs, each guess where it meets the budget is
 * planned, until the batch that fits and the next that does not are
 * neighbours, or the line through the largest that fits puts one image
 * more over the budget (then next_estimated). `po`: the plan's options
 * (optim_bytes, extra_bytes held beside the step, allow_abn,
 * allow_compress; max_accum is 1), with extra_per_image bytes more per
 * image (a loader's batches). FR_OK with batch 0 when not even one image
 * fits (`why` says the planner's reason). */
typedef struct {
    int batch;            /* the largest batch found to fit (0: none) */
    double peak;          /* its plan's verified peak */
    int next;             /* the batch above it known or estimated not to fit (0: none) */
    double next_need;     /* the least that batch needs (planned, or the line's estimate) */
    bool next_estimated;  /* next was not planned: the line says so */
    int plans;            /* fr_plan_memory calls made (each profiles a new batch) */
    char why[256];        /* the planner's last refusal */
} fr_fit_batch_result;

fr_status fr_fit_batch(fr_model *m, const int64_t *image, size_t budget, const fr_plan_options *po,
                       size_t extra_per_image, int max_batch, fr_fit_batch_result *out);
void fr_fit_report_free(fr_fit_report *r); /* NULL-safe */

#ifdef __cplusplus
}
#endif
#endif
