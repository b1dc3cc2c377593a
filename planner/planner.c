/* planner.c: the memory plan (planner.h): profiles at a micro-batch, the layout search's result
 * (plan_search.c) turned into a plan, verified by real steps, applied to a model. */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/module_impl.h"
#include "plan_search.h"
#include "profile.h"

/* What planning may hold (issue 22): trial steps stay within the budget, plus what the caller
 * holds beyond the plan's static bytes (`slack`, when positive: a data set outside extra_bytes). */
typedef struct {
    double budget, slack;
    bool capped;          /* false: measure without a cap of the planner's */
} room;

/* The profile at micro-batch `micro`, its trials within r (planner/profile.h says why). */
static fr_profile_cap trial_cap(const room *r, int64_t micro, const int64_t *shape) {
    double trial_batch = (double)(micro * shape[1] * shape[2] * shape[3]) * 4;
    return (fr_profile_cap){.cap = r->budget + fmax(0, r->slack),
                            .first_extra = fmax(0, r->slack + trial_batch) - fmax(0, r->slack)};
}

static fr_status profile_at(fr_model *m, int64_t micro, const int64_t *shape, const fr_plan_options *o,
                            const room *r, const fr_profile **p) {
    int64_t s[4] = {micro, shape[1], shape[2], shape[3]};
    fr_profile_cap cap = trial_cap(r, micro, shape);
    return fr_profile_get(m, s, o->allow_abn, o->allow_compress, r->capped ? &cap : NULL, p);
}

/* The least peak any layout reaches at micro-batch `micro` of `batch`;
 * INFINITY when none can run (its trials passed the cap). */
static fr_status leanest(fr_model *m, int64_t micro, const int64_t *shape, const fr_plan_options *o,
                         const room *r, int batch, double *peak) {
    const fr_profile *p;
    FR_TRY(profile_at(m, micro, shape, o, r, &p));
    plan_context cx = fr_plan_make_context(p, o, batch, micro < batch);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "%s: planner: out of memory", m->name);
    plan_layout best;
    double ms = 0;
    if (!(fr_plan_search(&cx, FR_PLAN_LEAST_PEAK, 0, &best) && fr_plan_simulate(&cx, &best, peak, &ms, NULL)))
        *peak = INFINITY;
    free(cx.grads_after);
    return FR_OK;
}

/* Fills the plan's units and curve from layout s under context cx. */
static fr_status describe(const plan_context *cx, const plan_layout *s, fr_memory_plan *plan) {
    const fr_profile *p = cx->p;
    plan->n_units = p->n_units;
    plan->units = calloc((size_t)p->n_units, sizeof *plan->units);
    if (!plan->units)
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    for (int g = 0; g < s->n_groups; g++)
        for (int u = s->start[g]; u < s->start[g] + s->len[g]; u++) {
            fr_plan_unit *pu = &plan->units[u];
            snprintf(pu->name, sizeof pu->name, "%s", p->names[u]);
            pu->strategy = p->strategies[s->strategy[g]];
            pu->checkpointed = s->ckpt[g];
            pu->segment_start = u == s->start[g];
            pu->barrier = p->barrier[u];
            pu->kept_bytes = fr_profile_cost(p, u, s->strategy[g])->saved;
        }
    plan_curve c = {0};
    double peak, ms;
    fr_plan_simulate(cx, s, &peak, &ms, &c);
    plan->points = c.pts;
    plan->n_points = c.n;
    return FR_OK;
}

/* The layout the plan's units describe (fr_plan_predict, apply). */
static bool units_layout(const fr_profile *p, const fr_plan_unit *units, plan_layout *s) {
    s->n_groups = 0;
    for (int u = 0; u < p->n_units; u++) {
        int k = -1;
        for (int a = 0; a < FR_PROFILE_STRATEGIES; a++)
            if (fr_strategy_equal(p->strategies[a], units[u].strategy))
                k = a;
        if (k < 0 || s->n_groups == 512)
            return false;
        if (u == 0 || units[u].segment_start) {
            s->start[s->n_groups] = u;
            s->len[s->n_groups] = 0;
            s->strategy[s->n_groups] = k;
            s->ckpt[s->n_groups++] = units[u].checkpointed;
        } else if (k != s->strategy[s->n_groups - 1] || units[u].checkpointed != s->ckpt[s->n_groups - 1]) {
            return false;
        }
        s->len[s->n_groups - 1]++;
    }
    return true;
}

static fr_status check_model(const fr_model *m, const int64_t *shape) {
    if (!m || !m->build || !m->build->finished)
        return fr_error(FR_ERR_ARG, "planner: %s is not a finished model (nn/build.h: fr_model_finish)",
                        m ? m->name : "(null)");
    if (!shape || shape[0] < 1 || shape[1] != m->in_channels || shape[2] < 1 || shape[3] < 1)
        return fr_error(FR_ERR_ARG, "planner: %s: input shape must be (N >= 1, %d, H, W)", m->name,
                        m->in_channels);
    if (fr_seq_steps(m->build->root) > 512)
        return fr_error(FR_ERR_ARG, "planner: %s: more than 512 steps in its sequence", m->name);
    return FR_OK;
}

/* The layout at micro-batch `micro` that fits `budget` fastest: the
 * dynamic programme, and the comparison layouts, whichever is faster. */
static fr_status plan_at(fr_model *m, const int64_t *shape, int64_t micro, size_t budget,
                         const fr_plan_options *o, const room *r, fr_memory_plan *plan) {
    const fr_profile *p;
    int64_t s4[4] = {micro, shape[1], shape[2], shape[3]};
    FR_TRY(profile_at(m, micro, shape, o, r, &p));
    int batch = (int)shape[0];
    plan_context cx = fr_plan_make_context(p, o, batch, micro < batch);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    plan_layout dp, cand, best;
    double peak, ms, best_ms = INFINITY, best_peak = 0;
    plan->dp_ms = plan->chen_ms = -1;
    if (fr_plan_search(&cx, FR_PLAN_LEAST_TIME, (double)budget, &dp) && fr_plan_simulate(&cx, &dp, &peak, &ms, NULL) &&
        peak <= (double)budget) {
        plan->dp_ms = ms;
        plan->dp_peak = peak;
        best = dp;
        best_ms = ms;
        best_peak = peak;
        snprintf(plan->chosen, sizeof plan->chosen, "dynamic programme");
    }
    static const char *const names[3] = {"kept", "chen", "sqrt(N)"};
    int seg_k = (int)lround(sqrt((double)p->n_units));
    for (int kind = 0; kind < 3; kind++)
        for (int k = 0; k < FR_PROFILE_BASE_STRATEGIES; k++) {
            if (!fr_plan_uniform_layout(p, k, kind == 0 ? 0 : kind == 1 ? -1 : (seg_k > 0 ? seg_k : 1), &cand) ||
                !fr_plan_simulate(&cx, &cand, &peak, &ms, NULL) || peak > (double)budget)
                continue;
            if (kind == 1 && (plan->chen_ms < 0 || ms < plan->chen_ms)) {
                plan->chen_ms = ms;
                plan->chen_peak = peak;
            }
            if (ms < best_ms) {
                best = cand;
                best_ms = ms;
                best_peak = peak;
                snprintf(plan->chosen, sizeof plan->chosen, "%s, %s everywhere", names[kind],
                         fr_strategy_format(p->strategies[k], (char[48]){0}, 48));
            }
        }
    fr_status st = FR_OK;
    if (!isfinite(best_ms)) {
        st = fr_error(FR_ERR_ARG, "planner: %s: no layout fits %zu bytes at micro-batch %lld",
                      m->name, budget, (long long)micro);
    } else {
        plan->predicted_peak = best_peak;
        plan->predicted_ms = best_ms * (double)(batch / micro);
        plan->static_bytes = cx.statics;
        memcpy(plan->shape, s4, sizeof plan->shape);
        st = describe(&cx, &best, plan);
    }
    free(cx.grads_after);
    return st;
}

/* Room the plan leaves below the budget (1/ROOM of it; planner.h, step 3),
 * included in every smallest budget it names (tests/test_budget_run.c). */
#define ROOM 128
static double with_room(double need) { return ceil(need * ROOM / (ROOM - 1)); }

/* The fewest micro-batches and the fastest layout that fit `target` bytes
 * (the budget less its room, or less once a verification missed; `budget`
 * for messages), from the leanest
 * layouts' peaks at the whole batch (`lean`) and in the smallest
 * micro-batches (`lean1`; div[nd]: the batch's divisors tried). */
static fr_status choose(fr_model *m, const int64_t *shape, size_t budget, size_t target, const fr_plan_options *o,
                        const room *r, const int *div, int nd, double lean, double lean1,
                        fr_memory_plan *plan) {
    int batch = (int)shape[0];
    int accum = 1;
    if (lean > (double)target) {
        /* micro-batches: the fewest parts (a divisor of the batch, so every
         * part has the shape the layout is made for) that fit */
        if (!nd || lean1 > (double)target) {
            char need[32], have[32];
            fr_mem_format_bytes(budget, have, sizeof have);
            int smallest = nd ? batch / div[nd - 1] : batch;
            if (!isfinite(lean1))
                return fr_error(FR_ERR_ARG, "%s: a memory budget of %s (%zu bytes) is too small: no "
                                "layout fits even in micro-batches of %d image%s, nor within the "
                                "memory limit", m->name, have, budget, smallest, smallest == 1 ? "" : "s");
            fr_mem_format_bytes((size_t)with_room(lean1), need, sizeof need);
            return fr_error(FR_ERR_ARG, "%s: a memory budget of %s (%zu bytes) is too small: the "
                            "leanest layout needs %s (%.0f bytes) even in micro-batches of %d "
                            "image%s; give at least that", m->name, have, budget, need,
                            with_room(lean1), smallest, smallest == 1 ? "" : "s");
        }
        int lo = -1, hi = nd - 1; /* div[hi] fits; find the first that does */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            double l;
            FR_TRY(leanest(m, batch / div[mid], shape, o, r, batch, &l));
            if (l <= (double)target)
                hi = mid;
            else
                lo = mid;
        }
        accum = div[hi];
        FR_TRY(leanest(m, batch / accum, shape, o, r, batch, &lean));
    }
    plan->accum = accum;
    plan->micro_batch = batch / accum;
    plan->bn_caveat = accum > 1;
    plan->leanest_peak = lean;
    FR_TRY(plan_at(m, shape, batch / accum, target, o, r, plan));
    /* the strategy for other shapes: the leanest switches the plan uses */
    plan->base = (fr_strategy){.recompute = true, .checkpoint = -1};
    for (int u = 0; u < plan->n_units; u++)
        plan->base.abn |= plan->units[u].strategy.abn;
    return FR_OK;
}

#define VERIFY_ROUNDS 4 /* whole measured steps a plan gets to hold its budget (first and re-plans) */

fr_status fr_plan_memory(fr_model *m, const int64_t *shape, size_t budget, const fr_plan_options *opts,
                         fr_memory_plan *plan) {
    *plan = (fr_memory_plan){0};
    FR_TRY(check_model(m, shape));
    fr_plan_options o = opts ? *opts : (fr_plan_options){0};
    int batch = (int)shape[0];
    if (o.max_accum < 1 || o.max_accum > batch)
        o.max_accum = batch;
    plan->budget = budget;
    plan->batch = batch;
    plan->options = o;
    plan->precision = m->cfg.precision;
    /* the budget holds for planning too: every trial step stays within
     * it, plus what the caller holds beyond the step's static bytes */
    fr_device dev = m->params->count ? fr_device_of(m->params->items[0].tensor) : FR_CPU;
    double batch_bytes = (double)batch * (double)(shape[1] * shape[2] * shape[3]) * 4 + (double)batch * 4;
    room r = {.budget = (double)budget, .capped = true,
              .slack = (double)fr_mem_total_current(dev) -
                       ((double)fr_mem_current(dev, FR_TAG_PARAM) + (double)o.optim_bytes +
                        (double)o.extra_bytes + batch_bytes)};
    /* the whole batch: plain's figures (when its trials fit), and whether
     * anything fits */
    const fr_profile *p;
    FR_TRY(profile_at(m, batch, shape, &o, &r, &p));
    plan->device = p->device;
    plan_context cx = fr_plan_make_context(p, &o, batch, false);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    plan_layout plain;
    if (!(fr_plan_uniform_layout(p, 0, 0, &plain) && fr_plan_simulate(&cx, &plain, &plan->plain_peak, &plan->plain_ms, NULL)))
        plan->plain_peak = plan->plain_ms = 0; /* over the budget: not measured */
    free(cx.grads_after);
    double lean;
    FR_TRY(leanest(m, batch, shape, &o, &r, batch, &lean));
    /* the smallest budget for this batch, at the smallest micro-batch:
     * what an out-of-memory error names (issue 22) */
    int div[64], nd = 0;
    for (int a = 2; a <= o.max_accum && nd < 64; a++)
        if (batch % a == 0)
            div[nd++] = a;
    double lean1 = lean;
    if (nd)
        FR_TRY(leanest(m, batch / div[nd - 1], shape, &o, &r, batch, &lean1));
    if (!isfinite(lean1)) {
        /* its trials passed the budget: measured again under no cap but
         * the caller's limit, to name the budget that works */
        room wide = {.budget = INFINITY, .capped = true};
        FR_TRY(leanest(m, nd ? batch / div[nd - 1] : batch, shape, &o, &wide, batch, &lean1));
    }
    plan->min_budget = isfinite(lean1) ? with_room(fmin(lean, lean1)) : 0;
    /* verified by a whole measured step (planner.h, step 4); one that passes
     * the budget is made again for the budget lowered by the miss */
    double target = (double)budget - floor((double)budget / ROOM), least = INFINITY;
    bool missed = false, held = false;
    fr_status st = FR_OK;
    for (int round = 0; round < VERIFY_ROUNDS && target >= 1; round++) {
        /* made in a copy: a lowered budget that fits no layout leaves the
         * last measured one in *plan */
        fr_memory_plan next = *plan;
        next.units = NULL;
        next.points = NULL;
        st = choose(m, shape, budget, (size_t)target, &o, &r, div, nd, lean, lean1, &next);
        if (st == FR_ERR_ARG && missed) { /* the lowered budget fits no layout */
            fr_clear_error();
            free(next.units);
            free(next.points);
            st = FR_OK;
            break;
        }
        free(plan->units);
        free(plan->points);
        *plan = next;
        if (st != FR_OK)
            break;
        fr_profile_cap cap = trial_cap(&r, plan->micro_batch, shape);
        plan->verify_rounds = round + 1;
        st = fr_profile_whole_step(m, plan, &cap, &plan->verified_peak);
        if (st != FR_OK || (held = plan->verified_peak <= (double)budget))
            break;
        missed = true;
        least = fmin(least, plan->verified_peak);
        /* lowered by the miss; a step the cap stopped missed by an unknown amount */
        target -= isfinite(plan->verified_peak) ? plan->verified_peak - (double)budget : (double)budget / 16;
    }
    /* every round stopped by the cap: its last layout once more under the
     * caller's limit alone, to name a budget that works (as for `lean1`) */
    if (st == FR_OK && !held && !isfinite(least) && plan->units)
        st = fr_profile_whole_step(m, plan, &(fr_profile_cap){0}, &least);
    if (st == FR_OK && !held) {
        char have[32], need[32];
        if (isfinite(least))
            plan->min_budget = fmax(plan->min_budget, with_room(least));
        fr_mem_format_bytes(budget, have, sizeof have);
        fr_mem_format_bytes(isfinite(least) ? (size_t)with_room(least) : 0, need, sizeof need);
        st = isfinite(least)
                 ? fr_error(FR_ERR_ARG, "%s: no plan holds a memory budget of %s (%zu bytes): measured in "
                            "a whole trial step, the leanest of its layouts needed %s (%.0f bytes); give "
                            "at least that", m->name, have, budget, need, with_room(least))
                 : fr_error(FR_ERR_ARG, "%s: no plan holds a memory budget of %s (%zu bytes): every "
                            "layout passed it in a whole trial step", m->name, have, budget);
    }
    if (st != FR_OK) {
        double min_budget = plan->min_budget;
        fr_memory_plan_free(plan);
        plan->min_budget = min_budget;
        return st;
    }
    return FR_OK;
}

fr_status fr_plan_predict(fr_model *m, const fr_memory_plan *plan, const fr_plan_unit *units,
                          double *peak, double *ms) {
    FR_TRY(check_model(m, plan->shape));
    const fr_profile *p;
    FR_TRY(fr_profile_get(m, plan->shape, plan->options.allow_abn, plan->options.allow_compress, NULL, &p));
    if (plan->n_units != p->n_units)
        return fr_error(FR_ERR_ARG, "planner: %s: the plan has %d units, the model %d", m->name,
                        plan->n_units, p->n_units);
    plan_context cx = fr_plan_make_context(p, &plan->options, plan->batch, plan->accum > 1);
    plan_layout s;
    bool ok = cx.grads_after && units_layout(p, units, &s) && fr_plan_simulate(&cx, &s, peak, ms, NULL);
    free(cx.grads_after);
    return ok ? FR_OK
              : fr_error(FR_ERR_ARG, "planner: %s: the units do not make a layout (a strategy not "
                         "profiled, a group mixing strategies, a dense module checkpointed)", m->name);
}

fr_status fr_plan_apply(fr_model *m, const fr_memory_plan *plan) {
    FR_TRY(check_model(m, plan->shape));
    const fr_profile *p;
    FR_TRY(fr_profile_get(m, plan->shape, plan->options.allow_abn, plan->options.allow_compress, NULL, &p));
    plan_layout s;
    if (plan->n_units != p->n_units || !units_layout(p, plan->units, &s))
        return fr_error(FR_ERR_ARG, "planner: %s: the plan does not fit this model", m->name);
    fr_seg_layout *sp = &m->build->root->installed;
    fr_seg_layout_free(sp);
    sp->group_len = malloc((size_t)s.n_groups * sizeof *sp->group_len);
    sp->group_ckpt = malloc((size_t)s.n_groups * sizeof *sp->group_ckpt);
    sp->group_strategy = malloc((size_t)s.n_groups * sizeof *sp->group_strategy);
    if (!sp->group_len || !sp->group_ckpt || !sp->group_strategy) {
        fr_seg_layout_free(sp);
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    }
    for (int g = 0; g < s.n_groups; g++) {
        sp->group_len[g] = s.len[g];
        sp->group_ckpt[g] = s.ckpt[g];
        sp->group_strategy[g] = p->strategies[s.strategy[g]];
    }
    sp->n_groups = s.n_groups;
    /* the key the forward matches (segments.c): a training forward of
     * this input shape, precision and device under the base strategy */
    sp->ndim = 4;
    memcpy(sp->shape, plan->shape, sizeof plan->shape);
    sp->dtype = FR_F32;
    sp->autocast = plan->precision;
    sp->device = plan->device;
    sp->strategy = plan->base;
    sp->training = true;
    sp->valid = true;
    m->cfg.strategy = plan->base;
    return FR_OK;
}

void fr_plan_remove(fr_model *m) {
    if (m && m->build && m->build->root)
        fr_seg_layout_free(&m->build->root->installed);
}
