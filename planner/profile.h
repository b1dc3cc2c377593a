/* profile.h: the memory planner's per-block profile (internal; see
 * planner.h). For every step of a model's root sequence and every strategy
 * the planner may give it, what a trial step measured on the ledger and the
 * clock. Levels are total bytes on the device (every tag), relative to the
 * level just before the phase. */
#ifndef FR_PROFILE_H
#define FR_PROFILE_H

#include "planner.h"

/* plain, recompute, abn (only with allow_abn); then the same with a dense
 * module's children checkpointed (dense steps only); the six without
 * compression, then with compress:8, :4 and :2 (only with allow_compress).
 * Strategy k: base k % 3, children checkpointed when (k / 3) % 2,
 * compression level k / 6. */
enum {
    FR_PROFILE_BASE_STRATEGIES = 3,
    FR_PROFILE_COMPRESS_LEVELS = 4,
    FR_PROFILE_STRATEGIES = 2 * FR_PROFILE_BASE_STRATEGIES * FR_PROFILE_COMPRESS_LEVELS
};

typedef struct {
    double in_b, out_b;   /* the step's input (0: a data batch) and output bytes */
    bool in_saved;        /* the step's own nodes keep its input */
    bool out_saved;       /* ... and its output */
    double fwd_peak;      /* forward with grad: the highest level above the start */
    double fwd_delta;     /* ... the level after it (kept bytes and the output) */
    double saved;         /* ... growth of the saved tag, its input excluded (Chen's cost) */
    double bwd_peak;      /* backward from the output's sum, its output released first */
    double bwd_delta;     /* ... the level after it (the input's gradient, parameter
                           * gradients, minus what was kept) */
    double grads;         /* parameter gradient bytes it creates */
    double ng_peak;       /* forward under no_grad: highest level, and after */
    double ng_delta;
    double fwd_ms, bwd_ms, ng_ms;
    bool out_recipe;      /* its output (with grad) carries a recipe: a next step that
                           * saves it keeps the recipe, not the bytes */
    double in_packed;     /* the compressed copy of its input its nodes made, which the
                           * trial's input holds past backward (a real step's input
                           * does not, unless the step before keeps it held):
                           * left out of bwd_delta */
    double masks;         /* bytes of the ReLU masks (bits) its forward with grad packed:
                           * a checkpoint whose input is kept as codes keeps them from
                           * its forward to its replay, which saves them rather than
                           * packing its own (autograd/checkpoint_log.h) */
} fr_unit_cost;

typedef struct {
    /* the configuration */
    int64_t shape[4];
    fr_dtype precision;
    fr_device device;
    bool allow_abn;
    bool allow_compress;
    bool channels_last;   /* the steps ran in the model's channels-last mode */
    /* the sequence */
    int n_units;
    fr_strategy strategies[FR_PROFILE_STRATEGIES];
    char (*names)[64];    /* (n_units) */
    bool *barrier;        /* (n_units) */
    bool *valid;          /* (n_units * FR_PROFILE_STRATEGIES): the step can run it */
    fr_unit_cost *cost;   /* (n_units * FR_PROFILE_STRATEGIES) */
    /* the same trials with a recipe-carrying input, as a step after one
     * whose output carries a recipe gets it in a training step (the steps
     * after such a step only; valid_ri false elsewhere): its nodes keep the
     * recipe, so the input's bytes go once the step is done, and backward
     * makes the input again (tests/test_planner_flat.c) */
    bool *valid_ri;       /* (n_units * FR_PROFILE_STRATEGIES) */
    fr_unit_cost *cost_ri;
    double param_bytes;   /* parameters and buffers on the device */
    double grad_bytes;    /* every parameter's gradient */
    /* the cap it was measured under (0: none) and whether a trial or a
     * step's input passed it (then some strategies, or every step from
     * one on, are left invalid) */
    double cap;
    bool complete;
} fr_profile;

/* Profiling within a budget (issue 22: the planner must not need more
 * memory than it plans for). A trial step of a strategy may not take the
 * ledger's total past `cap` (and past the limit of fr_mem_set_limit): one
 * that would is stopped by that cap and its strategy left invalid for the
 * step. Sound because a whole training step holds at least what that
 * trial held (its input, the step's own bytes, everything held outside),
 * except the first step's trial, which holds a copy of the batch besides
 * the caller's: it gets `first_extra` more. */
typedef struct {
    double cap;           /* ledger total, bytes (0: no cap of the planner's) */
    double first_extra;   /* allowance of the first step's trials above cap */
} fr_profile_cap;

/* The profile of m's root sequence for inputs of `shape` under
 * m->cfg.precision on the device of its parameters: cached in the model,
 * measured on first use. A cached profile is reused when it is complete
 * or was measured under the same cap; with cap NULL any cached one is
 * (an uncapped one measured when none is). *out is borrowed from the
 * model. */
fr_status fr_profile_get(fr_model *m, const int64_t *shape, bool allow_abn, bool allow_compress,
                         const fr_profile_cap *cap, const fr_profile **out);

static inline const fr_unit_cost *fr_profile_cost(const fr_profile *p, int unit, int strategy) {
    return &p->cost[unit * FR_PROFILE_STRATEGIES + strategy];
}
static inline bool fr_profile_valid(const fr_profile *p, int unit, int strategy) {
    return p->valid[unit * FR_PROFILE_STRATEGIES + strategy];
}
/* The step's cost with a recipe-carrying input when `recipe_in` and that
 * was measured, else with a held one. */
static inline const fr_unit_cost *fr_profile_cost_in(const fr_profile *p, int unit, int strategy,
                                                     bool recipe_in) {
    int i = unit * FR_PROFILE_STRATEGIES + strategy;
    return recipe_in && p->valid_ri[i] ? &p->cost_ri[i] : &p->cost[i];
}

/* A whole measured trial step of `plan` (planner.h: the plan is verified):
 * its layout installed for the step (the caller's put back after), forward
 * through the whole root at the plan's micro-batch, the sum of the logits,
 * backward, under the same rules and cap as the profile's trials (the cap's
 * first_extra covers the step's own batch). With micro-batches a first
 * pass leaves the gradients the next one adds to, and the second is
 * measured. *peak_bytes: the ledger's peak above where the step started,
 * plus the plan's static bytes (parameters, the whole batch, optimizer
 * state, and the gradients when accumulating), as the prediction counts
 * them; INFINITY when the cap or the caller's limit stopped it. */
fr_status fr_profile_whole_step(fr_model *m, const fr_memory_plan *plan, const fr_profile_cap *cap,
                                double *peak_bytes);

/* What any trial step must give back to the caller (the profile's trials
 * here, fr_fit's in fit.c): the parameters' gradients, set aside (a trial
 * makes and frees its own), and the random streams (dropout's and
 * compression's, autograd.h). */
typedef struct {
    fr_tensor **grads;     /* (params->count) */
    uint64_t random_state, compress_random_state;
} fr_trial_stash;

/* Sets the gradients aside (every .grad is NULL after) and saves the
 * random streams; FR_ERR_OOM (nothing set aside) when the host is out of memory. */
fr_status fr_trial_stash_take(fr_model *m, fr_trial_stash *s);
/* Frees the trials' gradients and puts the caller's and the random streams
 * back; nothing when the take failed. */
void fr_trial_stash_put_back(fr_model *m, fr_trial_stash *s);

#endif
