/* profile.c: the planner's per-block profile; see profile.h and planner.h.
 *
 * Each step of the root sequence runs alone, on a tape of its own, from the
 * output the steps before it give under no_grad: forward with grad, then
 * backward from the sum of its output (so the output's gradient is made
 * and freed by the engine as a real one is), then forward under no_grad.
 * The ledger's total level around each phase and its peak inside give the
 * bytes; the clock gives the times. Recompute mode keeps BN running
 * statistics and counters as they are, the random state is put back, and
 * any .grad the caller had is set aside and restored, so profiling changes
 * nothing a training step computes. Under a cap (profile.h) the ledger's
 * limit is lowered for the trials and put back after: a trial stopped by it
 * leaves its strategy invalid for that step, and a step whose input cannot
 * be made leaves every later step invalid. The steps run in the layout the
 * plan will run in (the model's channels-last mode, which every strategy
 * takes): profiled NCHW, a channels-last ResNet-20 b16 under mixed compress
 * groups measured 13% below its prediction (tests/test_planner.c). */
#include "../autograd/checkpoint_log.h"
#include "../nn/module_impl.h"
#include "profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../autograd/functions.h"
#include "../autograd/node.h"
#include "../tensor/cuda.h"

#define MAX_CACHED 16

typedef struct {
    int n;
    fr_profile *items[MAX_CACHED];
} profile_cache;

static void profile_free(fr_profile *p) {
    if (!p)
        return;
    free(p->names);
    free(p->barrier);
    free(p->valid);
    free(p->cost);
    free(p->valid_ri);
    free(p->cost_ri);
    free(p);
}

static void cache_free(void *c) {
    profile_cache *pc = c;
    if (!pc)
        return;
    for (int i = 0; i < pc->n; i++)
        profile_free(pc->items[i]);
    free(pc);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static fr_status sync_device(fr_device dev) { return dev == FR_CUDA ? fr_cuda_synchronize() : FR_OK; }

static double level(fr_device dev) { return (double)fr_mem_total_current(dev); }
static double peak(fr_device dev) { return (double)fr_mem_total_peak(dev); }

/* Bytes of an activation that the ledger counts against the step: not a
 * data batch, which the caller holds anyway. */
static double activation_bytes(const fr_tensor *t) {
    return t->storage->home_tag == FR_TAG_TRANSIENT ? (double)t->storage->nbytes : 0;
}

static fr_strategy strategy_of(int k) {
    static const fr_strategy base[FR_PROFILE_BASE_STRATEGIES] = {
        {0}, {.recompute = true}, {.abn = true}};
    static const int bits[FR_PROFILE_COMPRESS_LEVELS] = {0, 8, 4, 2};
    fr_strategy s = base[k % FR_PROFILE_BASE_STRATEGIES];
    if ((k / FR_PROFILE_BASE_STRATEGIES) % 2)
        s.checkpoint = -1;
    s.compress = bits[k / (2 * FR_PROFILE_BASE_STRATEGIES)];
    return s;
}

static double grad_bytes(const fr_params *ps) {
    double n = 0;
    for (int i = 0; i < ps->count; i++)
        if (ps->items[i].tensor->grad)
            n += (double)fr_nbytes(ps->items[i].tensor->grad);
    return n;
}

/* Step s over x: *y (NULL on failure), the ledger's peak above the level
 * before it, and the time. */
static fr_status timed_forward(fr_module *root, int s, fr_tensor *x, const fr_run *run, fr_device dev,
                               fr_tensor **y, double *peak_above, double *ms) {
    fr_mem_reset_peak();
    double t0 = level(dev), start = now_ms();
    *y = fr_seq_run_steps(root, s, 1, x, run);
    fr_status st = *y ? sync_device(dev) : fr_last_status();
    *ms = now_ms() - start;
    *peak_above = peak(dev) - t0;
    return st;
}

/* A recipe that makes a copy of x: the trial's stand-in for the recipe a
 * recompute step's output carries in a training step (the tensors that
 * recipe reads are held by that step's nodes, so they cost the next step
 * nothing; the copy is what making it again costs in backward). */
typedef struct {
    fr_recipe base;
    fr_tensor *x;
} copy_recipe;

static fr_tensor *copy_make(fr_recipe *self) {
    const fr_tensor *x = ((copy_recipe *)self)->x;
    fr_tensor *t = fr_empty_like(x, FR_TAG_TRANSIENT); /* in x's layout, as the recipes it stands for */
    if (t && fr_copy_(t, x) != FR_OK)
        fr_clear(&t);
    return t;
}

static void copy_destroy(fr_recipe *self) {
    fr_release(((copy_recipe *)self)->x);
    free(self);
}

static fr_recipe *copy_recipe_new(fr_tensor *x) {
    copy_recipe *r = calloc(1, sizeof *r);
    if (!r) {
        fr_error(FR_ERR_OOM, "planner: out of host memory for a trial");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = "planner trial input", .make = copy_make,
                          .destroy = copy_destroy};
    r->x = fr_retain(x);
    return &r->base;
}

/* One step under one strategy from input x (`recipe_in`: given a recipe
 * that makes x, as a training step gives the step after a recompute step;
 * x is held by the caller either way); fills *c. FR_ERR_ARG from the step
 * (a strategy it refuses) comes back as is for the caller to judge. */
static fr_status trial(fr_model *m, fr_module *root, int s, fr_tensor *x, bool recipe_in,
                       const fr_run *run, fr_device dev, fr_unit_cost *c) {
    *c = (fr_unit_cost){.in_b = activation_bytes(x)};
    FR_TRY(fr_tape_push());
    /* a dense module that cuts its own children plans them on its first
     * forward (a trial of its own): do that first, outside the measurement */
    if (run->strategy.checkpoint && fr_seq_is_barrier(root, s)) {
        fr_tensor *warm = fr_seq_run_steps(root, s, 1, x, run);
        fr_status st = warm ? FR_OK : fr_last_status();
        fr_release(warm);
        fr_tape_clear();
        if (st != FR_OK) {
            fr_tape_pop();
            return st;
        }
    }
    fr_tensor *leaf = s == 0 ? fr_retain(x) : fr_detach(x);
    fr_status st = leaf ? FR_OK : fr_last_status();
    if (st == FR_OK && s > 0)
        fr_set_requires_grad(leaf, true);
    if (st == FR_OK && s > 0 && recipe_in) {
        fr_recipe *r = copy_recipe_new(x);
        if (r)
            fr_set_recipe(leaf, r);
        else
            st = fr_last_status();
    }
    fr_tensor *y = NULL, *loss = NULL;
    if (st == FR_OK) {
        size_t saved0 = fr_mem_current(dev, FR_TAG_SAVED);
        double t0 = level(dev);
        size_t signs = fr_sign_bytes_packed();
        st = timed_forward(root, s, leaf, run, dev, &y, &c->fwd_peak, &c->fwd_ms);
        c->masks = (double)(fr_sign_bytes_packed() - signs);
        if (st == FR_OK) {
            c->in_saved = x->storage->saved_count > 0;
            c->out_saved = y->storage->saved_count > 0;
            c->out_recipe = fr_live_recipe(y) != NULL;
            c->out_b = (double)y->storage->nbytes;
            c->saved = (double)fr_mem_current(dev, FR_TAG_SAVED) - (double)saved0 -
                       (c->in_saved ? c->in_b : 0);
            /* a channels-last output through its NCHW copy (as the
             * model's pool takes it): the sum reads NCHW only */
            fr_tensor *yc = fr_to_nchw(y);
            loss = yc ? fr_sum(yc) : NULL;
            fr_release(yc);
            st = loss ? FR_OK : fr_last_status();
            c->fwd_delta = level(dev) - t0;
        }
    }
    fr_release(y);
    if (st == FR_OK) {
        fr_mem_reset_peak();
        double t1 = level(dev), ms = now_ms();
        st = fr_backward(loss);
        if (st == FR_OK)
            st = sync_device(dev);
        c->bwd_ms = now_ms() - ms;
        fr_release(loss);
        loss = NULL;
        c->bwd_peak = peak(dev) - t1;
        /* the input's compressed copy: its nodes are done with it, but the
         * trial's input still holds it, where a training step's input is
         * gone by now (unless the step before keeps it held: eval_group in
         * planner.c adds it back then) */
        double kept = level(dev);
        if (s > 0 && leaf->packed) {
            fr_recipe_release(leaf->packed);
            leaf->packed = NULL;
        }
        c->in_packed = kept - level(dev);
        c->bwd_delta = level(dev) - t1;
        c->grads = grad_bytes(m->params);
    }
    fr_release(loss);
    fr_release(leaf);
    fr_tape_clear();
    fr_tape_pop();
    fr_params_zero_grad(m->params);
    if (st != FR_OK)
        return st;
    fr_no_grad_enter();
    double t0 = level(dev);
    st = timed_forward(root, s, x, run, dev, &y, &c->ng_peak, &c->ng_ms);
    c->ng_delta = level(dev) - t0;
    fr_release(y);
    fr_no_grad_exit();
    return st;
}

static void unit_name(const fr_module *root, int s, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    if (fr_seq_is_barrier(root, s) || root->kind != FR_MODULE_CHAIN) {
        snprintf(buf, len, "%.*s", (int)len - 1, root->items[root->step_first[s]]->name);
        return;
    }
    for (int i = root->step_first[s]; i < root->step_first[s] + root->step_len[s] && used + 1 < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? "+" : "", (int)(len - used - 1),
                                 root->items[i]->name);
}

/* The ledger cap for the trials of step s under `cap` (the lower of it and
 * the caller's own limit; the caller's alone without a cap). */
static void trial_limit(fr_device dev, size_t user_limit, const fr_profile_cap *cap, int s) {
    if (!cap || cap->cap <= 0)
        return;
    double c = cap->cap + (s == 0 ? cap->first_extra : 0);
    size_t lim = c >= (double)SIZE_MAX / 2 ? 0 : (size_t)c;
    if (user_limit && (!lim || user_limit < lim))
        lim = user_limit;
    fr_mem_set_limit(dev, lim);
}

/* Whether a trial's failure is its cap's doing: a strategy left out, not
 * an error. */
static bool capped_out(const fr_profile_cap *cap, fr_status st) {
    if (!cap || cap->cap <= 0 || st != FR_ERR_OOM)
        return false;
    fr_clear_error();
    return true;
}

/* A batch of normal noise of `shape` (N, C, H, W) on dev, tagged as data;
 * NULL on failure (the error set). */
static fr_tensor *trial_batch(const fr_model *m, fr_device dev, const int64_t *shape) {
    size_t n = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    float *host = malloc(n * sizeof *host);
    if (!host) {
        fr_error(FR_ERR_OOM, "%s: planner: out of host memory for a trial batch", m->name);
        return NULL;
    }
    fr_rng rng;
    fr_rng_seed(&rng, 7);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)fr_rng_normal(&rng);
    fr_tensor *t = fr_from_host(dev, FR_F32, 4, shape, FR_TAG_DATA, host);
    free(host);
    return t;
}

static fr_status measure_all(fr_model *m, void *profile, const fr_profile_cap *cap) {
    fr_profile *p = profile;
    fr_module *root = m->build->root;
    fr_device dev = p->device;
    fr_run run = {.training = true, .channels_last = p->channels_last};
    snprintf(run.model, sizeof run.model, "%s", m->name);
    for (int s = 0; s < p->n_units; s++) {
        p->barrier[s] = fr_seq_is_barrier(root, s);
        unit_name(root, s, p->names[s], sizeof p->names[s]);
    }
    size_t user_limit = fr_mem_get_limit(dev);
    trial_limit(dev, user_limit, cap, 0);
    fr_tensor *cur = trial_batch(m, dev, p->shape);
    fr_status st = cur ? fr_autocast_enter(p->precision) : fr_last_status();
    if (st != FR_OK) {
        fr_release(cur);
        fr_mem_set_limit(dev, user_limit);
        if (capped_out(cap, st)) {
            p->complete = false; /* not even the batch fits: nothing valid */
            return FR_OK;
        }
        return st;
    }
    bool prev_recipe = false; /* some strategy of the step before outputs a recipe */
    for (int s = 0; s < p->n_units && st == FR_OK; s++) {
        trial_limit(dev, user_limit, cap, s);
        /* a first run warms caches and buffers (the first GEMM of a
         * shape, the first touch of fresh pages), which would otherwise be
         * charged to whichever strategy comes first */
        fr_unit_cost warm;
        run.strategy = FR_STRATEGY_PLAIN;
        st = trial(m, root, s, cur, false, &run, dev, &warm);
        if (capped_out(cap, st))
            st = FR_OK;
        for (int k = 0; k < FR_PROFILE_STRATEGIES && st == FR_OK; k++) {
            /* A dense module under recompute whose children are not
             * checkpointed returns a recomputable concatenation, which the
             * step after it does not see in its own trial (its input comes
             * from a plain run): the composed prediction came out up to 8%
             * over the ledger (DenseNet-BC-40, batch 2, first dense block:
             * 10.48 MiB predicted, 9.73 measured). Until that interaction is
             * profiled, a dense module takes recompute only with its
             * children checkpointed, which is predicted exactly. */
            bool dense_recompute = p->barrier[s] && strategy_of(k).recompute && !strategy_of(k).checkpoint;
            bool wanted = (k % FR_PROFILE_BASE_STRATEGIES < 2 || p->allow_abn) &&
                          (!strategy_of(k).checkpoint || p->barrier[s]) && !dense_recompute &&
                          (!strategy_of(k).compress ||
                           /* compression packs f32 activations only: under f16
                            * or bf16 it is left out, not a failed plan */
                           (p->allow_compress && p->precision == FR_F32));
            if (!wanted)
                continue;
            run.strategy = p->strategies[k];
            int i = s * FR_PROFILE_STRATEGIES + k;
            st = trial(m, root, s, cur, false, &run, dev, &p->cost[i]);
            if (st == FR_ERR_ARG && run.strategy.abn) {
                st = FR_OK; /* a step that cannot take abn (its input is read elsewhere) */
                continue;
            }
            if (capped_out(cap, st)) {
                st = FR_OK;
                p->complete = false;
                continue;
            }
            p->valid[i] = st == FR_OK;
            /* after a step whose output may be a recipe, again with one
             * (profile.h); a trial the cap stops leaves the held input's
             * cost, which counts the input held longer: never less */
            if (st == FR_OK && prev_recipe) {
                st = trial(m, root, s, cur, true, &run, dev, &p->cost_ri[i]);
                p->valid_ri[i] = st == FR_OK;
                if (st == FR_ERR_ARG) { /* a strategy refusing that input: the held cost stands */
                    fr_clear_error();
                    st = FR_OK;
                }
                if (capped_out(cap, st))
                    st = FR_OK;
            }
        }
        if (st != FR_OK)
            break;
        prev_recipe = false;
        for (int k = 0; k < FR_PROFILE_STRATEGIES; k++)
            prev_recipe |= p->valid[s * FR_PROFILE_STRATEGIES + k] &&
                           p->cost[s * FR_PROFILE_STRATEGIES + k].out_recipe;
        /* the next step's input: held, made under no_grad (the trials
         * with a recipe input wrap it in one) */
        fr_no_grad_enter();
        run.strategy = FR_STRATEGY_PLAIN;
        fr_tensor *next = fr_seq_run_steps(root, s, 1, cur, &run);
        fr_no_grad_exit();
        fr_release(cur);
        cur = next;
        if (!cur) {
            st = fr_last_status();
            if (capped_out(cap, st)) { /* the steps after it stay invalid */
                st = FR_OK;
                p->complete = false;
                break;
            }
        }
    }
    fr_autocast_exit();
    fr_release(cur);
    fr_mem_set_limit(dev, user_limit);
    return st;
}

/* Runs fn(m, p, cap) as a trial: the caller's gradients set aside (a
 * trial makes and frees its own), the random stream saved, recompute mode
 * on (BN statistics and counters kept), all put back after. */
fr_status fr_trial_stash_take(fr_model *m, fr_trial_stash *s) {
    s->grads = calloc((size_t)m->params->count + 1, sizeof *s->grads);
    if (!s->grads)
        return fr_error(FR_ERR_OOM, "%s: planner: out of host memory for a trial", m->name);
    for (int i = 0; i < m->params->count; i++) {
        s->grads[i] = m->params->items[i].tensor->grad;
        m->params->items[i].tensor->grad = NULL;
    }
    s->random_state = fr_random_state();
    s->compress_random_state = fr_compress_random_state();
    return FR_OK;
}

void fr_trial_stash_put_back(fr_model *m, fr_trial_stash *s) {
    if (!s->grads)
        return;
    fr_set_random_state(s->random_state);
    fr_set_compress_random_state(s->compress_random_state);
    fr_params_zero_grad(m->params);
    for (int i = 0; i < m->params->count; i++)
        m->params->items[i].tensor->grad = s->grads[i];
    free(s->grads);
    s->grads = NULL;
}

static fr_status preserving(fr_model *m, fr_status (*fn)(fr_model *, void *, const fr_profile_cap *),
                            void *p, const fr_profile_cap *cap) {
    fr_trial_stash stash;
    FR_TRY(fr_trial_stash_take(m, &stash));
    fr_checkpoint_logs logs = fr_checkpoint_logs_suspend(); /* checkpoint_log.h */
    fr_recompute_enter();
    fr_status st = fn(m, p, cap);
    fr_recompute_exit();
    fr_checkpoint_logs_resume(logs);
    fr_trial_stash_put_back(m, &stash);
    fr_mem_reset_peak();
    return st;
}

static bool same_config(const fr_profile *p, const int64_t *shape, fr_dtype precision,
                        fr_device dev, bool allow_abn, bool allow_compress, bool channels_last) {
    return !memcmp(p->shape, shape, sizeof p->shape) && p->precision == precision &&
           p->device == dev && p->allow_abn == allow_abn && p->allow_compress == allow_compress &&
           p->channels_last == channels_last;
}

fr_status fr_profile_get(fr_model *m, const int64_t *shape, bool allow_abn, bool allow_compress,
                         const fr_profile_cap *cap, const fr_profile **out) {
    struct fr_model_build *b = m->build;
    fr_device dev = m->params->count ? fr_device_of(m->params->items[0].tensor) : FR_CPU;
    profile_cache *pc = b->profiles;
    bool cl = fr_model_channels_last(m, dev, NULL); /* every strategy runs in it */
    for (int i = 0; pc && i < pc->n; i++)
        if (same_config(pc->items[i], shape, m->cfg.precision, dev, allow_abn, allow_compress, cl) &&
            (!cap || pc->items[i]->complete || pc->items[i]->cap == cap->cap)) {
            *out = pc->items[i];
            return FR_OK;
        }
    if (!pc) {
        if (!(pc = calloc(1, sizeof *pc)))
            return fr_error(FR_ERR_OOM, "%s: planner: out of memory", m->name);
        b->profiles = pc;
        b->profiles_free = cache_free;
    }
    int n = fr_seq_steps(b->root);
    fr_profile *p = calloc(1, sizeof *p);
    if (p) {
        p->names = calloc((size_t)n, sizeof *p->names);
        p->barrier = calloc((size_t)n, sizeof *p->barrier);
        p->valid = calloc((size_t)n * FR_PROFILE_STRATEGIES, sizeof *p->valid);
        p->cost = calloc((size_t)n * FR_PROFILE_STRATEGIES, sizeof *p->cost);
        p->valid_ri = calloc((size_t)n * FR_PROFILE_STRATEGIES, sizeof *p->valid_ri);
        p->cost_ri = calloc((size_t)n * FR_PROFILE_STRATEGIES, sizeof *p->cost_ri);
    }
    if (!p || !p->names || !p->barrier || !p->valid || !p->cost || !p->valid_ri || !p->cost_ri) {
        profile_free(p);
        return fr_error(FR_ERR_OOM, "%s: planner: out of memory", m->name);
    }
    memcpy(p->shape, shape, sizeof p->shape);
    p->precision = m->cfg.precision;
    p->device = dev;
    p->allow_abn = allow_abn;
    p->allow_compress = allow_compress;
    p->channels_last = cl;
    p->cap = cap ? cap->cap : 0;
    p->complete = true;
    p->n_units = n;
    for (int k = 0; k < FR_PROFILE_STRATEGIES; k++)
        p->strategies[k] = strategy_of(k);
    p->param_bytes = (double)fr_mem_current(dev, FR_TAG_PARAM);
    for (int i = 0; i < m->params->count; i++)
        if (m->params->items[i].kind == FR_PARAMETER)
            p->grad_bytes += (double)fr_nbytes(m->params->items[i].tensor);

    fr_status st = preserving(m, measure_all, p, cap);
    if (st != FR_OK) {
        profile_free(p);
        return st;
    }
    if (pc->n == MAX_CACHED) { /* the oldest goes */
        profile_free(pc->items[0]);
        memmove(pc->items, pc->items + 1, (MAX_CACHED - 1) * sizeof *pc->items);
        pc->n--;
    }
    pc->items[pc->n++] = p;
    *out = p;
    return FR_OK;
}

/* ---- a whole measured step (planner.h: the plan is verified) ---- */

typedef struct {
    const fr_memory_plan *plan;
    double dynamic;
} whole_step;

/* Forward through the whole root, the sum of the logits (the loss the
 * profile's trials use), backward; *peak_above: the ledger's peak above the
 * level it started from. */
static fr_status one_pass(fr_model *m, fr_tensor *x, fr_device dev, double *peak_above) {
    FR_TRY(fr_tape_push());
    fr_mem_reset_peak();
    double t0 = level(dev);
    fr_tensor *y = fr_model_forward(m, x, true);
    fr_tensor *loss = y ? fr_sum(y) : NULL;
    fr_release(y);
    fr_status st = loss ? fr_backward(loss) : fr_last_status();
    if (st == FR_OK)
        st = sync_device(dev);
    fr_release(loss);
    *peak_above = peak(dev) - t0;
    fr_tape_clear();
    fr_tape_pop();
    return st;
}

static fr_status run_whole(fr_model *m, void *ctx, const fr_profile_cap *cap) {
    whole_step *w = ctx;
    const fr_memory_plan *plan = w->plan;
    fr_device dev = plan->device;
    size_t user_limit = fr_mem_get_limit(dev);
    trial_limit(dev, user_limit, cap, 0);
    /* the plan's layout for the step, the caller's put back after */
    fr_seg_layout saved = m->build->root->installed;
    fr_strategy strategy = m->cfg.strategy;
    m->build->root->installed = (fr_seg_layout){0};
    fr_tensor *x = trial_batch(m, dev, plan->shape);
    fr_status st = x ? fr_plan_apply(m, plan) : fr_last_status();
    /* a first pass plans what plans itself on its first forward (a dense
     * module's own children) and, with micro-batches, leaves the gradients
     * held that the next micro-batch adds to, as the prediction assumes */
    double first = 0;
    if (st == FR_OK)
        st = one_pass(m, x, dev, &first);
    if (st == FR_OK && plan->accum == 1)
        fr_params_zero_grad(m->params);
    if (st == FR_OK)
        st = one_pass(m, x, dev, &w->dynamic);
    fr_release(x);
    fr_seg_layout_free(&m->build->root->installed);
    m->build->root->installed = saved;
    m->cfg.strategy = strategy;
    fr_mem_set_limit(dev, user_limit);
    return st;
}

fr_status fr_profile_whole_step(fr_model *m, const fr_memory_plan *plan, const fr_profile_cap *cap,
                                double *peak_bytes) {
    whole_step w = {.plan = plan};
    fr_status st = preserving(m, run_whole, &w, cap);
    if (st == FR_ERR_OOM) { /* the cap (or the caller's limit) stopped it: over */
        fr_clear_error();
        *peak_bytes = INFINITY;
        return FR_OK;
    }
    *peak_bytes = plan->static_bytes + w.dynamic;
    return st;
}
