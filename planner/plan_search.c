/* plan_search.c: the memory planner's layout search (plan_search.h). One function, eval_group,
 * predicts what a group adds to the ledger from the profile of its units: its forward peak above
 * the bytes held before it, what it leaves held for backward, and its backward peak above what is
 * held then (the groups before it, the parameter gradients made so far and its output's
 * gradient). The dynamic programme, the comparison layouts and the predicted curve all go
 * through it, so they agree exactly. */
#include "plan_search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/seg_split.h"
#include "../tensor/shapes.h"

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

static void emit(plan_curve *c, double dt, double level) {
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
static void emit_phase(plan_curve *c, double ms, double start, double peak, double end) {
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
                             plan_curve *fwd, plan_curve *bwd) {
    group_eval g = {.ok = group_allowed(p, i, j, ckpt, k)};
    if (!g.ok)
        return g;
#define RECIPE_IN(u) ((u) == i ? !ckpt && prev == OUT_RECIPE : fr_profile_cost(p, (u) - 1, k)->out_recipe)
#define C(u) fr_profile_cost_in(p, (u), k, RECIPE_IN(u))
#define HELD_BEFORE(u) ((u) == i ? (ckpt || prev == OUT_KEPT) : C((u) - 1)->out_saved)
    const fr_unit_cost *last = C(j - 1);
    double L = prev == OUT_KEPT ? 0 : C(i)->in_b, pk = L;
    /* a checkpoint keeps an activation input under compress:B as codes
     * (the input itself goes when the chain moves on), and its steps' ReLU
     * masks for the replay (autograd/checkpoint_log.h) */
    int bits = p->strategies[k].compress;
    bool packed = ckpt && bits && C(i)->in_b > 0;
    double codes = packed ? (double)fr_compress_nbytes(bits, (size_t)(C(i)->in_b / 4)) : 0;
    for (int u = i; u < j; u++) {
        const fr_unit_cost *c = C(u);
        double start = L;
        if (ckpt) { /* under no_grad: nothing but the group's input (and the masks) stays */
            double mk = packed ? c->masks : 0;
            pk = fmax(pk, L + c->ng_peak + mk);
            L += c->ng_delta + mk - (u > i ? c->in_b : 0);
            g.ms += c->ng_ms;
        } else {
            pk = fmax(pk, L + c->fwd_peak);
            L += c->fwd_delta - (!c->in_saved && !HELD_BEFORE(u) ? c->in_b : 0);
            g.ms += c->fwd_ms + c->bwd_ms;
        }
        emit_phase(fwd, ckpt ? c->ng_ms : c->fwd_ms, start, ckpt ? c->ng_peak : c->fwd_peak, L);
    }
    if (packed) { /* packed after the segment ran, beside its input */
        pk = fmax(pk, L + codes);
        L += codes - (prev == OUT_KEPT ? 0 : C(i)->in_b);
    }
    g.fwd_peak = pk;
    g.out = ckpt ? OUT_GONE : last->out_saved ? OUT_KEPT : last->out_recipe ? OUT_RECIPE : OUT_GONE;
    g.held = L - (g.out == OUT_KEPT ? 0 : last->out_b);
    /* backward: what the group holds and its output's gradient */
    L = g.held + last->out_b;
    double bk = L;
    if (ckpt) { /* the replay: forward with grad from the held input */
        L += packed ? C(i)->in_b : 0; /* decoded from its codes */
        bk = fmax(bk, L);
        for (int u = i; u < j; u++) {
            const fr_unit_cost *c = C(u);
            double start = L;
            /* the masks it packed are the forward's, held already */
            bk = fmax(bk, L + c->fwd_peak);
            L += c->fwd_delta - (packed ? c->masks : 0) -
                 (!c->in_saved && !HELD_BEFORE(u) ? c->in_b : 0);
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

bool fr_plan_simulate(const plan_context *cx, const plan_layout *s, double *peak, double *ms, plan_curve *out) {
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

bool fr_plan_search(const plan_context *cx, int mode, double budget, plan_layout *best) {
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
        ok = front_insert(&F[0 * OUT_KINDS + OUT_KEPT], (entry){.value = mode == FR_PLAN_LEAST_PEAK ? cx->statics : 0,
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
                            if (mode == FR_PLAN_LEAST_TIME) {
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
            double v = mode == FR_PLAN_LEAST_TIME ? x->value : fmax(x->value, end);
            if (mode == FR_PLAN_LEAST_TIME && end > budget)
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
        plan_layout rev = {0};
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

bool fr_plan_uniform_layout(const fr_profile *p, int k, int seg_k, plan_layout *s) {
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

plan_context fr_plan_make_context(const fr_profile *p, const fr_plan_options *o, int batch, bool accumulating) {
    plan_context cx = {.p = p, .accumulating = accumulating};
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

