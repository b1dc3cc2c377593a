/* planner.c: the memory planner's layout search; see planner.h. A layout cuts the root sequence's
 * steps (units) into groups, each kept or checkpointed and each under one strategy of the profile.
 * One function, eval_group, predicts what a group adds to the ledger from the profile of its units:
 * its forward peak above the bytes held before it, what it leaves held for backward, and its
 * backward peak above what is held then (the groups before it, the parameter gradients made so far
 * and its output's gradient). The dynamic programme, the comparison layouts and the predicted
 * curve all go through it, so they agree exactly. */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/module_impl.h"
#include "../nn/seg_split.h"
#include "profile.h"

/* ---- one group ---- */

typedef struct {
    bool ok;          /* the units can run as this group */
    double fwd_peak;  /* above static + bytes held before the group */
    double bwd_peak;  /* above static + held before + later gradients */
    double held;      /* what it leaves held for backward */
    double ms;        /* forward + backward (+ replay) */
    int out;          /* what becomes of its output (OUT_*) */
} group_eval;

/* A group's output: gone after the next step (which may keep it), held by
 * the group's own nodes, or carrying a recipe (profile.h) */
enum { OUT_GONE, OUT_KEPT, OUT_RECIPE, OUT_KINDS };

/* The predicted curve, when asked for: points at base + level. */
typedef struct {
    fr_plan_point *pts;
    int n, cap;
    double ms, base;
} curve;

static void emit(curve *c, double dt, double level) {
    if (!c)
        return;
    c->ms += dt;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        fr_plan_point *grown = realloc(c->pts, (size_t)cap * sizeof *grown);
        if (!grown)
            return; /* the curve is a drawing: a short one is not an error */
        c->pts = grown;
        c->cap = cap;
    }
    c->pts[c->n++] = (fr_plan_point){.ms = c->ms, .bytes = c->base + level};
}

/* One unit's phase: a peak halfway, then the level after. */
static void emit_phase(curve *c, double ms, double start, double peak, double end) {
    emit(c, ms / 2, start + peak);
    emit(c, ms / 2, end);
}

/* Whether the units [i, j) can run as a group under strategy k. */
static bool group_allowed(const fr_profile *p, int i, int j, bool ckpt, int k) {
    for (int u = i; u < j; u++)
        if (!fr_profile_valid(p, u, k) || (p->barrier[u] && (ckpt || j - i > 1)))
            return false;
    return true;
}

/* prev: what the group before left of this group's input (OUT_*). A step's
 * input is a recipe where the step before made one (a checkpoint's replay
 * starts from its held input). fwd / bwd: curves to draw into, or NULL. */
static group_eval eval_group(const fr_profile *p, int i, int j, bool ckpt, int k, int prev,
                             curve *fwd, curve *bwd) {
    group_eval g = {.ok = group_allowed(p, i, j, ckpt, k)};
    if (!g.ok)
        return g;
#define RECIPE_IN(u) ((u) == i ? !ckpt && prev == OUT_RECIPE : fr_profile_cost(p, (u) - 1, k)->out_recipe)
#define C(u) fr_profile_cost_in(p, (u), k, RECIPE_IN(u))
#define HELD_BEFORE(u) ((u) == i ? (ckpt || prev == OUT_KEPT) : C((u) - 1)->out_saved)
    const fr_unit_cost *last = C(j - 1);
    double L = prev == OUT_KEPT ? 0 : C(i)->in_b, pk = L;
    for (int u = i; u < j; u++) {
        const fr_unit_cost *c = C(u);
        double start = L;
        if (ckpt) { /* under no_grad: nothing but the group's input stays */
            pk = fmax(pk, L + c->ng_peak);
            L += c->ng_delta - (u > i ? c->in_b : 0);
            g.ms += c->ng_ms;
        } else {
            pk = fmax(pk, L + c->fwd_peak);
            L += c->fwd_delta - (!c->in_saved && !HELD_BEFORE(u) ? c->in_b : 0);
            g.ms += c->fwd_ms + c->bwd_ms;
        }
        emit_phase(fwd, ckpt ? c->ng_ms : c->fwd_ms, start, ckpt ? c->ng_peak : c->fwd_peak, L);
    }
    g.fwd_peak = pk;
    g.out = ckpt ? OUT_GONE : last->out_saved ? OUT_KEPT : last->out_recipe ? OUT_RECIPE : OUT_GONE;
    g.held = L - (g.out == OUT_KEPT ? 0 : last->out_b);
    /* backward: what the group holds and its output's gradient */
    L = g.held + last->out_b;
    double bk = L;
    if (ckpt) { /* the replay: forward with grad from the held input */
        for (int u = i; u < j; u++) {
            const fr_unit_cost *c = C(u);
            double start = L;
            bk = fmax(bk, L + c->fwd_peak);
            L += c->fwd_delta - (!c->in_saved && !HELD_BEFORE(u) ? c->in_b : 0);
            g.ms += c->fwd_ms + c->bwd_ms;
            emit_phase(bwd, c->fwd_ms, start, c->fwd_peak, L);
        }
    }
    for (int u = j - 1; u >= i; u--) {
        const fr_unit_cost *c = C(u);
        double start = L;
        if (ckpt && u == j - 1) {
            /* the segment's output and its gradient stay held by the
             * checkpoint's backward until the replay is done */
            double y = c->out_saved ? c->out_b : 0;
            bk = fmax(bk, L + c->bwd_peak + y);
            L += c->bwd_delta + y;
        } else {
            /* the output's gradient is replaced by the trial's own */
            bk = fmax(bk, L - c->out_b + c->bwd_peak);
            L += c->bwd_delta - c->out_b;
        }
        if (c->in_saved && !HELD_BEFORE(u))
            L -= c->in_b;
        if (HELD_BEFORE(u)) /* its input lives on, and the input's compressed copy with it */
            L += c->in_packed;
        emit_phase(bwd, c->bwd_ms, start, bk - start > 0 ? fmax(0, c->bwd_peak) : 0, L);
    }
    g.bwd_peak = bk;
#undef C
#undef HELD_BEFORE
#undef RECIPE_IN
    return g;
}

/* ---- a layout ---- */

typedef struct {
    int n_groups;
    int start[512], len[512], strategy[512];
    bool ckpt[512];
} layout;

typedef struct {
    const fr_profile *p;
    double statics;   /* parameters, batch, optimizer state (+ all gradients when accumulating) */
    bool accumulating;
    double *grads_after; /* (n + 1): gradient bytes of units >= j (0 when accumulating) */
} context;

/* Peak and time of a whole layout, and its curve when asked. */
static bool simulate(const context *cx, const layout *s, double *peak, double *ms, curve *out) {
    const fr_profile *p = cx->p;
    double held = 0, pk = cx->statics, t = 0;
    double *held_before = malloc(((size_t)s->n_groups + 1) * sizeof *held_before);
    group_eval *ge = malloc(((size_t)s->n_groups + 1) * sizeof *ge);
    bool ok = held_before && ge;
    int prev = OUT_KEPT; /* the batch: held by the caller */
    if (out)
        emit(out, 0, cx->statics);
    for (int g = 0; ok && g < s->n_groups; g++) {
        if (out)
            out->base = cx->statics + held;
        ge[g] = eval_group(p, s->start[g], s->start[g] + s->len[g], s->ckpt[g], s->strategy[g], prev,
                           out, NULL);
        ok = ge[g].ok;
        held_before[g] = held;
        pk = fmax(pk, cx->statics + held + ge[g].fwd_peak);
        held += ge[g].held;
        t += ge[g].ms;
        prev = ge[g].out;
    }
    for (int g = s->n_groups - 1; ok && g >= 0; g--) {
        int j = s->start[g] + s->len[g];
        double base = cx->statics + held_before[g] + cx->grads_after[j];
        pk = fmax(pk, base + ge[g].bwd_peak);
        if (out) {
            int before = g > 0 ? ge[g - 1].out : OUT_KEPT;
            out->base = base;
            eval_group(p, s->start[g], j, s->ckpt[g], s->strategy[g], before, NULL, out);
        }
    }
    pk = fmax(pk, cx->statics + held);
    pk = fmax(pk, cx->statics + (cx->accumulating ? 0 : cx->grads_after[0]));
    free(held_before);
    free(ge);
    *peak = pk;
    *ms = t;
    return ok;
}

/* ---- the dynamic programme over Pareto fronts of (held, value) ---- */

typedef struct {
    double held, value;
    int from_i, from_keep, from_idx; /* the entry it extends (-1: the start) */
    int strategy;
    bool ckpt;
} entry;

typedef struct {
    entry *e;
    int n, cap;
} front;

/* Inserts x unless an entry holds no more and costs no more; removes the
 * entries x beats. Sorted by held, value strictly falling. */
static bool front_insert(front *f, entry x) {
    int lo = 0, hi = f->n;
    while (lo < hi) { /* first entry with held > x.held */
        int mid = (lo + hi) / 2;
        if (f->e[mid].held <= x.held)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && f->e[lo - 1].value <= x.value)
        return true;
    int end = lo;
    while (end < f->n && f->e[end].value >= x.value)
        end++;
    if (end == lo) {
        if (f->n == f->cap) {
            int cap = f->cap ? 2 * f->cap : 64;
            entry *grown = realloc(f->e, (size_t)cap * sizeof *grown);
            if (!grown)
                return false;
            f->e = grown;
            f->cap = cap;
        }
        memmove(f->e + lo + 1, f->e + lo, (size_t)(f->n - lo) * sizeof *f->e);
        f->n++;
    } else if (end > lo + 1) {
        memmove(f->e + lo + 1, f->e + end, (size_t)(f->n - end) * sizeof *f->e);
        f->n -= end - lo - 1;
    }
    f->e[lo] = x;
    return true;
}

enum { MODE_TIME, MODE_PEAK };

/* Chooses a layout: MODE_TIME the least time whose peak is <= budget,
 * MODE_PEAK the least peak. false when none (or out of memory). */
static bool dynamic_programme(const context *cx, int mode, double budget, layout *best) {
    const fr_profile *p = cx->p;
    int n = p->n_units;
    front *F = calloc(OUT_KINDS * ((size_t)n + 1), sizeof *F);
    group_eval *memo = malloc((size_t)n * (size_t)n * 2 * FR_PROFILE_STRATEGIES * OUT_KINDS * sizeof *memo);
    bool ok = F && memo;
    if (ok) {
        for (size_t i = 0; i < (size_t)n * (size_t)n * 2 * FR_PROFILE_STRATEGIES * OUT_KINDS; i++)
            memo[i].ok = false;
        /* fill the table once: every (i, j, ckpt, strategy, what the group before left) */
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j <= n; j++)
                for (int c = 0; c < 2; c++)
                    for (int k = 0; k < FR_PROFILE_STRATEGIES; k++)
                        for (int pk = 0; pk < OUT_KINDS; pk++)
                            memo[((((size_t)i * n + (j - 1)) * 2 + c) * FR_PROFILE_STRATEGIES + k) * OUT_KINDS + pk] =
                                eval_group(p, i, j, c, k, pk, NULL, NULL);
        ok = front_insert(&F[0 * OUT_KINDS + OUT_KEPT], (entry){.value = mode == MODE_PEAK ? cx->statics : 0,
                                                               .from_i = -1});
    }
    for (int i = 0; ok && i < n; i++)
        for (int keep = 0; keep < OUT_KINDS && ok; keep++)
            for (int e = 0; e < F[i * OUT_KINDS + keep].n && ok; e++) {
                entry src = F[i * OUT_KINDS + keep].e[e];
                for (int j = i + 1; j <= n && ok; j++)
                    for (int c = 0; c < 2 && ok; c++)
                        for (int k = 0; k < FR_PROFILE_STRATEGIES && ok; k++) {
                            const group_eval *g =
                                &memo[((((size_t)i * n + (j - 1)) * 2 + c) * FR_PROFILE_STRATEGIES + k) * OUT_KINDS + keep];
                            if (!g->ok)
                                continue;
                            double fpk = cx->statics + src.held + g->fwd_peak;
                            double bpk = cx->statics + src.held + cx->grads_after[j] + g->bwd_peak;
                            double v;
                            if (mode == MODE_TIME) {
                                if (fpk > budget || bpk > budget)
                                    continue;
                                v = src.value + g->ms;
                            } else {
                                v = fmax(src.value, fmax(fpk, bpk));
                            }
                            ok = front_insert(&F[j * OUT_KINDS + g->out],
                                              (entry){.held = src.held + g->held, .value = v,
                                                      .from_i = i, .from_keep = keep, .from_idx = e,
                                                      .strategy = k, .ckpt = c});
                        }
            }
    /* the best complete layout */
    int best_keep = -1, best_idx = -1;
    double best_v = INFINITY;
    double grads_end = cx->accumulating ? 0 : cx->grads_after[0];
    for (int keep = 0; ok && keep < OUT_KINDS; keep++)
        for (int e = 0; e < F[n * OUT_KINDS + keep].n; e++) {
            const entry *x = &F[n * OUT_KINDS + keep].e[e];
            double end = cx->statics + fmax(x->held, grads_end);
            double v = mode == MODE_TIME ? x->value : fmax(x->value, end);
            if (mode == MODE_TIME && end > budget)
                continue;
            if (v < best_v) {
                best_v = v;
                best_keep = keep;
                best_idx = e;
            }
        }
    bool found = ok && best_idx >= 0;
    if (found) { /* walk back */
        int g = 0, i = n, keep = best_keep, idx = best_idx;
        layout rev = {0};
        while (i > 0) {
            const entry *x = &F[i * OUT_KINDS + keep].e[idx];
            rev.start[g] = x->from_i;
            rev.len[g] = i - x->from_i;
            rev.strategy[g] = x->strategy;
            rev.ckpt[g] = x->ckpt;
            g++;
            i = x->from_i;
            keep = x->from_keep;
            idx = x->from_idx;
        }
        best->n_groups = g;
        for (int a = 0; a < g; a++) {
            best->start[a] = rev.start[g - 1 - a];
            best->len[a] = rev.len[g - 1 - a];
            best->strategy[a] = rev.strategy[g - 1 - a];
            best->ckpt[a] = rev.ckpt[g - 1 - a];
        }
    }
    for (int i = 0; F && i < OUT_KINDS * (n + 1); i++)
        free(F[i].e);
    free(F);
    free(memo);
    return found;
}

/* ---- the comparison layouts: one strategy everywhere ---- */

/* A dense module takes the strategy with its own children checkpointed
 * when the others are checkpointed, as "STRATEGY+checkpoint" runs it. */
static int unit_strategy(const fr_profile *p, int u, int k, bool checkpointing) {
    int inner = k + FR_PROFILE_BASE_STRATEGIES;
    return p->barrier[u] && checkpointing && fr_profile_valid(p, u, inner) ? inner : k;
}

/* seg_k: 0 keeps everything, -1 Chen's split (nn/seg_split.h, as "checkpoint"
 * runs it), > 0 that many steps a segment. false when a unit cannot take k. */
static bool uniform_layout(const fr_profile *p, int k, int seg_k, layout *s) {
    int n = p->n_units;
    s->n_groups = 0;
    double *cost = malloc(2 * (size_t)n * sizeof *cost);
    int *len = malloc((size_t)n * sizeof *len);
    bool ok = cost && len;
    for (int u = 0; ok && u < n;) {
        int kk = unit_strategy(p, u, k, seg_k != 0);
        ok = fr_profile_valid(p, u, kk);
        if (!ok)
            break;
        if (p->barrier[u] || seg_k == 0) {
            s->start[s->n_groups] = u;
            s->len[s->n_groups] = 1;
            s->strategy[s->n_groups] = kk;
            s->ckpt[s->n_groups++] = false;
            u++;
            continue;
        }
        int end = u;
        while (end < n && !p->barrier[end])
            end++;
        int m = 0;
        if (seg_k > 0) {
            for (m = 0; u + m * seg_k < end; m++)
                len[m] = u + (m + 1) * seg_k <= end ? seg_k : end - u - m * seg_k;
        } else {
            for (int a = u; a < end; a++) {
                cost[a - u] = fr_profile_cost(p, a, k)->saved;
                cost[n + a - u] = fr_profile_cost(p, a, k)->in_b;
            }
            m = fr_seg_split(&(fr_seg_costs){.cost = cost, .input = cost + n, .n = end - u}, len);
        }
        for (int g = 0; g < m; g++) {
            s->start[s->n_groups] = u;
            s->len[s->n_groups] = len[g];
            s->strategy[s->n_groups] = k;
            s->ckpt[s->n_groups++] = true;
            u += len[g];
        }
    }
    free(cost);
    free(len);
    return ok;
}

/* ---- the plan ---- */

static context make_context(const fr_profile *p, const fr_plan_options *o, int batch, bool accumulating) {
    context cx = {.p = p, .accumulating = accumulating};
    int n = p->n_units;
    cx.grads_after = calloc((size_t)n + 1, sizeof *cx.grads_after);
    if (cx.grads_after && !accumulating)
        for (int u = n - 1; u >= 0; u--)
            cx.grads_after[u] = cx.grads_after[u + 1] + fr_profile_cost(p, u, 0)->grads;
    double batch_bytes = (double)batch * (double)(p->shape[1] * p->shape[2] * p->shape[3]) * 4 +
                         (double)batch * 4;
    cx.statics = p->param_bytes + (double)o->optim_bytes + (double)o->extra_bytes + batch_bytes +
                 (accumulating ? p->grad_bytes : 0);
    return cx;
}

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
    context cx = make_context(p, o, batch, micro < batch);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "%s: planner: out of memory", m->name);
    layout best;
    double ms = 0;
    if (!(dynamic_programme(&cx, MODE_PEAK, 0, &best) && simulate(&cx, &best, peak, &ms, NULL)))
        *peak = INFINITY;
    free(cx.grads_after);
    return FR_OK;
}

/* Fills the plan's units and curve from layout s under context cx. */
static fr_status describe(const context *cx, const layout *s, fr_memory_plan *plan) {
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
    curve c = {0};
    double peak, ms;
    simulate(cx, s, &peak, &ms, &c);
    plan->points = c.pts;
    plan->n_points = c.n;
    return FR_OK;
}

/* The layout the plan's units describe (fr_plan_predict, apply). */
static bool units_layout(const fr_profile *p, const fr_plan_unit *units, layout *s) {
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
    context cx = make_context(p, o, batch, micro < batch);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    layout dp, cand, best;
    double peak, ms, best_ms = INFINITY, best_peak = 0;
    plan->dp_ms = plan->chen_ms = -1;
    if (dynamic_programme(&cx, MODE_TIME, (double)budget, &dp) && simulate(&cx, &dp, &peak, &ms, NULL) &&
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
            if (!uniform_layout(p, k, kind == 0 ? 0 : kind == 1 ? -1 : (seg_k > 0 ? seg_k : 1), &cand) ||
                !simulate(&cx, &cand, &peak, &ms, NULL) || peak > (double)budget)
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
    m->plan_nchw = o.allow_abn; /* profiled as it will run (nn/model.h) */
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
    context cx = make_context(p, &o, batch, false);
    if (!cx.grads_after)
        return fr_error(FR_ERR_OOM, "planner: out of memory");
    layout plain;
    if (!(uniform_layout(p, 0, 0, &plain) && simulate(&cx, &plain, &plan->plain_peak, &plan->plain_ms, NULL)))
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
    context cx = make_context(p, &plan->options, plan->batch, plan->accum > 1);
    layout s;
    bool ok = cx.grads_after && units_layout(p, units, &s) && simulate(&cx, &s, peak, ms, NULL);
    free(cx.grads_after);
    return ok ? FR_OK
              : fr_error(FR_ERR_ARG, "planner: %s: the units do not make a layout (a strategy not "
                         "profiled, a group mixing strategies, a dense module checkpointed)", m->name);
}

fr_status fr_plan_apply(fr_model *m, const fr_memory_plan *plan) {
    FR_TRY(check_model(m, plan->shape));
    const fr_profile *p;
    FR_TRY(fr_profile_get(m, plan->shape, plan->options.allow_abn, plan->options.allow_compress, NULL, &p));
    layout s;
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
    m->plan_nchw = plan->options.allow_abn;
    return FR_OK;
}

void fr_plan_remove(fr_model *m) {
    if (m && m->build && m->build->root)
        fr_seg_layout_free(&m->build->root->installed);
    if (m)
        m->plan_nchw = false;
}
