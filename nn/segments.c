/* segments.c: running chains and dense modules, and cutting them into
 * checkpointed segments (Chen et al. 2016) from measured bytes; see build.h
 * and seg_split.h.
 *
 * A segment is described by value (which sequence, which steps, the run
 * context) and fr_checkpoint keeps a copy, so its replay in backward runs
 * exactly what its forward ran, whatever runs in between. */
#include "../autograd/checkpoint_log.h"
#include "../autograd/node.h"
#include "module_impl.h"

#include <stdlib.h>
#include <string.h>

#include "seg_split.h"

typedef struct {
    fr_module *seq;   /* a chain or a dense module */
    int first, count; /* steps */
    fr_run run;
} segment;

/* ---- chains ---- */

/* A chain of layers only (a transition, a "Sequential" a user nests): its
 * layers are one step together. */
static bool layers_only(const fr_module *m) {
    for (int i = 0; i < m->n_children; i++)
        if (m->children[i]->kind != FR_MODULE_LAYER)
            return false;
    return m->n_children > 0;
}

/* Appends m (a chain: its items) to c's items; unit[i] is the nested chain
 * of layers only that item i belongs to, NULL for none. */
static fr_status append_items(fr_module *c, fr_module *m, const fr_module *in_unit, int *cap,
                              const fr_module ***unit) {
    if (m->kind == FR_MODULE_CHAIN) {
        const fr_module *u = m != c && layers_only(m) ? m : in_unit;
        for (int i = 0; i < m->n_children; i++)
            FR_TRY(append_items(c, m->children[i], u, cap, unit));
        return FR_OK;
    }
    if (c->n_items == *cap) {
        *cap = *cap ? 2 * *cap : 8;
        fr_module **grown = realloc(c->items, (size_t)*cap * sizeof *grown);
        if (grown)
            c->items = grown;
        const fr_module **ugrown = grown ? realloc(*unit, (size_t)*cap * sizeof *ugrown) : NULL;
        if (!ugrown)
            return fr_error(FR_ERR_OOM, "%s: out of memory", c->model->name);
        *unit = ugrown;
    }
    (*unit)[c->n_items] = in_unit;
    c->items[c->n_items++] = m;
    return FR_OK;
}

fr_status fr_chain_prepare(fr_module *c) {
    int cap = 0;
    const fr_module **unit = NULL;
    c->n_items = c->n_steps = 0;
    fr_status st = append_items(c, c, NULL, &cap, &unit);
    c->step_first = malloc(((size_t)c->n_items + 1) * sizeof *c->step_first);
    c->step_len = malloc(((size_t)c->n_items + 1) * sizeof *c->step_len);
    if (st == FR_OK && (!c->step_first || !c->step_len))
        st = fr_error(FR_ERR_OOM, "%s: out of memory", c->model->name);
    /* A block or a dense module is a step of its own, and so is a nested
     * chain of layers only. In a run of other layers each conv2d (or
     * conv_transpose2d) starts a step, which the layers after it (norm, pool, flatten, linear) join,
     * so a flat chain (a VGG) can be cut before any conv. A norm layer
     * never starts a step after a layer: under abn it writes over its
     * input, which a segment's checkpoint (or the trial measuring the step)
     * would still hold. */
    for (int i = 0; i < c->n_items && st == FR_OK; i++) {
        const fr_module *it = c->items[i];
        bool after_layer = i > 0 && it->kind == FR_MODULE_LAYER &&
                           c->items[i - 1]->kind == FR_MODULE_LAYER;
        fr_layer_kind kind = it->kind == FR_MODULE_LAYER ? ((const fr_layer *)it->state)->kind
                                                          : FR_LAYER_KIND_COUNT;
        bool starts = kind == FR_LAYER_CONV2D || kind == FR_LAYER_CONV_TRANSPOSE2D;
        bool joins = after_layer && (unit[i] ? unit[i] == unit[i - 1] : !unit[i - 1] && !starts);
        if (joins) {
            c->step_len[c->n_steps - 1]++;
            continue;
        }
        c->step_first[c->n_steps] = i;
        c->step_len[c->n_steps++] = 1;
    }
    free(unit);
    return st;
}

static fr_tensor *run_chain(fr_module *c, int first, int count, fr_tensor *x, const fr_run *run) {
    fr_tensor *out = fr_retain(x);
    for (int s = first; s < first + count && out; s++)
        for (int i = c->step_first[s]; i < c->step_first[s] + c->step_len[s] && out; i++)
            out = fr_forward_take(c->items[i], out, run);
    return out;
}

/* ---- dense modules ---- */

/* The features side by side: the one feature as it is (no copy), else a new
 * concatenation, recomputable when asked. Borrowed in, new reference out. */
static fr_tensor *join(fr_tensor *const *f, int n, bool recomputable) {
    if (n == 1)
        return fr_retain(f[0]);
    return recomputable ? fr_concat_recomputable(f, n) : fr_concat(f, n);
}

/* Children [first, first + count) over x: returns x and every new feature
 * joined (recomputable when `recomputable`). Each child reads the join of
 * the features so far, a recipe under recompute (Pleiss et al. 2017) and
 * under compress:B, where the norm that saves it keeps the recipe over
 * its features' codes (fn_bn_act.c), not codes of the whole join. */
static fr_tensor *run_dense(fr_module *d, int first, int count, fr_tensor *x, const fr_run *run,
                            bool recomputable) {
    fr_tensor **f = calloc((size_t)count + 1, sizeof *f);
    if (!f) {
        fr_error(FR_ERR_OOM, "%s: %s: out of memory", run->model, d->name);
        return NULL;
    }
    int n = 0;
    f[n++] = fr_retain(x);
    for (int i = first; i < first + count; i++) {
        fr_tensor *in = join(f, n, run->strategy.recompute || run->strategy.compress > 0);
        fr_tensor *y = fr_forward(d->children[i], in, run);
        fr_release(in);
        if (!y)
            break;
        f[n++] = y;
    }
    fr_tensor *out = n == count + 1 ? join(f, n, recomputable) : NULL;
    for (int i = 0; i < n; i++)
        fr_release(f[i]);
    free(f);
    return out;
}

/* ---- segments ---- */

static int n_steps(const fr_module *seq) {
    return seq->kind == FR_MODULE_DENSE ? seq->n_children : seq->n_steps;
}

/* A step that a segment of its sequence never contains: a dense module in a
 * chain checkpoints its own children instead. */
static bool is_barrier(const fr_module *seq, int step) {
    return seq->kind == FR_MODULE_CHAIN && seq->items[seq->step_first[step]]->kind == FR_MODULE_DENSE;
}

static fr_tensor *segment_forward(void *ctx, fr_tensor *x) {
    const segment *s = ctx;
    /* A replay in backward runs outside the forward of the module that owns
     * the sequence, so it enters the segment's compress:B itself: what the
     * dense joins between children keep (their concatenation recipes) is
     * compressed in the replay as in a forward. */
    int outer;
    if (fr_compress_enter(s->run.strategy.compress, &outer) != FR_OK)
        return NULL;
    fr_tensor *y;
    /* a segment's output is kept by the next segment's checkpoint: a real
     * tensor, not a recipe */
    if (s->seq->kind == FR_MODULE_DENSE)
        y = run_dense(s->seq, s->first, s->count, x, &s->run, false);
    else
        y = run_chain(s->seq, s->first, s->count, x, &s->run);
    fr_compress_restore(outer);
    return y;
}

/* Bytes of t that count as saved when a checkpoint holds it: activations
 * (transient), not data batches. */
static double held_bytes(const fr_tensor *t) {
    return t->storage->home_tag == FR_TAG_TRANSIENT ? (double)t->storage->nbytes : 0;
}

/* The trial: each step run once with grad on, on a tape of its own, from
 * the previous step's output; cost[s] is the growth of saved bytes it
 * causes (its input excluded: it is marked saved first, as the checkpoint
 * holding it will), input[s] the bytes of its input, input_kept[s] those
 * bytes again when the step keeps its input itself (a conv or a norm layer:
 * inside a segment its predecessor's output is then kept for backward),
 * backward[s] the most bytes the step's backward allocates above what it
 * holds then (its input's gradient, a norm output recompute brings back, a
 * workspace, the weight gradients): it runs once from a zero output
 * gradient, with every parameter's .grad set aside and put back after
 * (the trial's are dropped) and the gradient-ready hook off (data
 * parallelism must not all-reduce a trial). Without
 * it the estimate missed what a recomputing step allocates in backward,
 * and recompute+checkpoint cut a flat expand chain where the uncut one
 * peaked lower (1.20x). Barriers run under
 * no_grad. Recompute mode keeps BN running statistics and batch counters
 * as they are, and the random state is put back, so the trial changes
 * nothing the real forward computes. */
/* The most bytes y's backward allocates above what is in use when it
 * starts (measure's backward[s]); leaves every .grad as it was. */
static fr_status measure_backward(fr_params *ps, fr_tensor *y, fr_tensor *leaf, fr_device dev,
                                  double *bytes) {
    fr_tensor **kept = calloc((size_t)ps->count + 1, sizeof *kept);
    fr_tensor *g = kept ? fr_zeros_like(y, FR_TAG_TRANSIENT) : NULL;
    if (!g) {
        free(kept);
        return kept ? fr_last_status() : fr_error(FR_ERR_OOM, "out of memory measuring a step's backward");
    }
    for (int i = 0; i < ps->count; i++) {
        kept[i] = ps->items[i].tensor->grad;
        ps->items[i].tensor->grad = NULL;
    }
    void *hook_ctx = NULL;
    fr_grad_ready_fn hook = fr_get_grad_ready_hook(&hook_ctx);
    fr_set_grad_ready_hook(NULL, NULL);
    size_t start = fr_mem_total_current(dev);
    fr_mem_watch_start(dev);
    fr_status st = fr_backward_with(y, g);
    size_t top = fr_mem_watch_peak(dev);
    *bytes = top > start ? (double)(top - start) : 0;
    fr_set_grad_ready_hook(hook, hook_ctx);
    for (int i = 0; i < ps->count; i++) {
        fr_release(ps->items[i].tensor->grad);
        ps->items[i].tensor->grad = kept[i];
    }
    fr_release(leaf->grad);
    leaf->grad = NULL;
    fr_release(g);
    free(kept);
    return st;
}

static fr_status measure(fr_module *seq, fr_tensor *x, const fr_run *run, double *cost, double *input,
                         double *input_kept, double *backward, double *held, double *shared,
                         double *masks) {
    int n = n_steps(seq);
    fr_device dev = fr_device_of(x);
    uint64_t random_state = fr_random_state(), compress_state = fr_compress_random_state();
    segment trial = {.seq = seq, .count = 1, .run = *run};
    trial.run.in_segment = true;
    fr_status st = FR_OK;
    fr_tensor *cur = fr_retain(x);
    bool cur_packed = false; /* the previous step saved its output compressed */
    fr_checkpoint_logs logs = fr_checkpoint_logs_suspend(); /* checkpoint_log.h */
    fr_recompute_enter();
    for (int s = 0; s < n && st == FR_OK; s++) {
        trial.first = s;
        input[s] = held_bytes(cur);
        /* under compress:B the checkpoint keeps the input's codes
         * (autograd/compressed.c), which is what the saved tag gets */
        held[s] = input[s] > 0 && run->strategy.compress
                      ? (double)fr_compress_nbytes(run->strategy.compress, (size_t)fr_numel(cur))
                      : input[s];
        cost[s] = input_kept[s] = backward[s] = shared[s] = masks[s] = 0;
        fr_tensor *next = NULL;
        if (is_barrier(seq, s)) {
            fr_no_grad_enter();
            next = segment_forward(&trial, cur);
            fr_no_grad_exit();
            cur_packed = false;
        } else if ((st = fr_tape_push()) == FR_OK) {
            fr_tensor *leaf = fr_detach(cur);
            if (leaf) {
                fr_set_requires_grad(leaf, true);
                fr_storage_mark_saved(leaf->storage);
                size_t before = fr_mem_current(dev, FR_TAG_SAVED);
                size_t signs = fr_sign_bytes_packed();
                fr_tensor *y = segment_forward(&trial, leaf);
                size_t after = fr_mem_current(dev, FR_TAG_SAVED);
                cost[s] = after > before ? (double)(after - before) : 0;
                /* its ReLU masks as bits: under compress:B a checkpoint
                 * whose input is kept as codes keeps them for the replay
                 * too (autograd/checkpoint_log.h) */
                masks[s] = (double)(fr_sign_bytes_packed() - signs);
                /* marked once above: a second mark is the step's own */
                if (leaf->storage->saved_count > 1)
                    input_kept[s] = input[s];
                /* the step packed its input (the trial's leaf is a fresh
                 * tensor) where a chain reuses the codes its predecessor
                 * made of that very tensor */
                if (cur_packed && leaf->packed)
                    shared[s] = held[s];
                /* or carries a recipe (recompute, InPlace-ABN under
                 * compress) whose codes the next step's first op saves
                 * rather than packing its input again */
                cur_packed = y && (y->packed || fr_live_recipe(y));
                next = y ? fr_detach(y) : NULL;
                /* a step with no graph (a block that returns its input)
                 * has no backward: its gradient passes through */
                if (y && st == FR_OK && fr_has_grad_fn(y))
                    st = measure_backward(seq->model->params, y, leaf, dev, &backward[s]);
                fr_release(y);
                fr_storage_unmark_saved(leaf->storage);
                fr_release(leaf);
            }
            fr_tape_pop();
        }
        fr_release(cur);
        cur = next;
        if (st == FR_OK && !cur)
            st = fr_last_status();
    }
    fr_recompute_exit();
    fr_checkpoint_logs_resume(logs);
    fr_set_random_state(random_state);
    fr_set_compress_random_state(compress_state);
    fr_release(cur);
    return st;
}

void fr_seg_layout_free(fr_seg_layout *p) {
    free(p->group_len);
    free(p->group_ckpt);
    free(p->group_strategy);
    *p = (fr_seg_layout){0};
}


static bool layout_matches(const fr_seg_layout *p, const fr_tensor *x, const fr_run *run) {
    return p->valid && p->ndim == x->ndim &&
           !memcmp(p->shape, x->shape, (size_t)x->ndim * sizeof x->shape[0]) &&
           p->dtype == x->dtype && p->autocast == fr_autocast_dtype() &&
           p->device == fr_device_of(x) && fr_strategy_equal(p->strategy, run->strategy) &&
           p->training == run->training;
}

/* The splitter's view of steps [s, end) of seq from measure's arrays (each
 * n_steps long, cost first). */
static fr_seg_costs costs_of(const fr_module *seq, const fr_run *run, const double *cost, int s,
                             int end) {
    int n = n_steps(seq);
    const double *input = cost + n, *input_kept = cost + 2 * n, *backward = cost + 3 * n,
                 *held = cost + 4 * n, *shared = cost + 5 * n, *masks = cost + 6 * n;
    /* the root chain's last segment runs as it is (make_layout) */
    return (fr_seg_costs){.cost = cost + s, .input = input + s, .input_kept = input_kept + s,
                          .backward = backward + s,
                          .held = run->strategy.compress ? held + s : NULL,
                          .input_shared = shared + s,
                          .masks = run->strategy.compress ? masks + s : NULL, .n = end - s,
                          .last_as_is = seq->kind == FR_MODULE_CHAIN && end == n};
}

fr_status fr_seq_estimate(fr_module *seq, fr_tensor *x, const fr_run *run, const int *seg_len,
                          int n_seg, double *forward_saved, double *peak) {
    int n = n_steps(seq);
    for (int s = 0; s < n; s++)
        if (is_barrier(seq, s))
            return fr_error(FR_ERR_ARG, "%s: estimate: step %d is a dense module", run->model, s);
    double *cost = calloc(7 * (size_t)n + 1, sizeof *cost);
    if (!cost)
        return fr_error(FR_ERR_OOM, "%s: out of memory estimating checkpoint segments", run->model);
    fr_status st = measure(seq, x, run, cost, cost + n, cost + 2 * n, cost + 3 * n, cost + 4 * n,
                           cost + 5 * n, cost + 6 * n);
    if (st == FR_OK) {
        fr_seg_costs c = costs_of(seq, run, cost, 0, n);
        *forward_saved = fr_seg_forward_saved(&c, seg_len, n_seg);
        *peak = fr_seg_peak(&c, seg_len, n_seg);
    }
    free(cost);
    return st;
}

/* Groups the steps: barriers alone and unsegmented; each run of other steps
 * cut into segments of k steps ("checkpoint:k") or by the splitter (nn/seg_split.h) over the
 * measured bytes ("checkpoint"). */
static fr_status make_layout(fr_module *seq, fr_tensor *x, const fr_run *run) {
    fr_seg_layout *p = &seq->layout;
    fr_seg_layout_free(p);
    int n = n_steps(seq);
    double *cost = calloc(7 * (size_t)n + 1, sizeof *cost);
    int *len = malloc(((size_t)n + 1) * sizeof *len);
    p->group_len = malloc(((size_t)n + 1) * sizeof *p->group_len);
    p->group_ckpt = malloc(((size_t)n + 1) * sizeof *p->group_ckpt);
    fr_status st = cost && len && p->group_len && p->group_ckpt
                       ? FR_OK
                       : fr_error(FR_ERR_OOM, "%s: out of memory planning checkpoint segments",
                                  run->model);
    int k = run->strategy.checkpoint;
    if (st == FR_OK && k < 0)
        st = measure(seq, x, run, cost, cost + n, cost + 2 * n, cost + 3 * n, cost + 4 * n,
                     cost + 5 * n, cost + 6 * n);
    for (int s = 0; s < n && st == FR_OK;) {
        if (is_barrier(seq, s)) {
            p->group_len[p->n_groups] = 1;
            p->group_ckpt[p->n_groups++] = false;
            s++;
            continue;
        }
        int end = s;
        while (end < n && !is_barrier(seq, end))
            end++;
        int m;
        if (k > 0) {
            for (m = 0; s + m * k < end; m++)
                len[m] = s + (m + 1) * k <= end ? k : end - s - m * k;
        } else {
            fr_seg_costs c = costs_of(seq, run, cost, s, end);
            m = fr_seg_split(&c, len);
        }
        for (int g = 0; g < m; g++) {
            p->group_len[p->n_groups] = len[g];
            p->group_ckpt[p->n_groups++] = true;
        }
        s = end;
    }
    /* The root chain's last segment runs as it is, as PyTorch's
     * checkpoint_sequential runs its last one: backward would replay it
     * first thing, so keeping its activations from the forward reaches the
     * same peak (the checkpoints plus that segment's saved tensors) and
     * saves one segment's second forward (docs/ARCHITECTURE.md,
     * "Checkpointing"). A dense module's last segment is followed by the
     * rest of the model, so its segments all stay. */
    if (st == FR_OK && seq->kind == FR_MODULE_CHAIN && p->n_groups > 0)
        p->group_ckpt[p->n_groups - 1] = false;
    free(cost);
    free(len);
    if (st != FR_OK) {
        fr_seg_layout_free(p);
        return st;
    }
    p->valid = true;
    p->ndim = x->ndim;
    memcpy(p->shape, x->shape, sizeof p->shape);
    p->dtype = x->dtype;
    p->autocast = fr_autocast_dtype();
    p->device = fr_device_of(x);
    p->strategy = run->strategy;
    p->training = run->training;
    return FR_OK;
}

static fr_tensor *run_steps(fr_module *seq, int first, int count, fr_tensor *x, const fr_run *run) {
    if (seq->kind == FR_MODULE_DENSE)
        return run_dense(seq, first, count, x, run, run->strategy.recompute);
    return run_chain(seq, first, count, x, run);
}

/* seq under the checkpoint strategy: its groups, each a checkpointed
 * segment or run as it is. Dense: the output of the last group is joined
 * by its segment, so the features so far are one tensor between groups. */
static fr_tensor *run_segmented(fr_module *seq, fr_tensor *x, const fr_run *run) {
    /* a planner's layout (planner/planner.h) for this very input and strategy,
     * else the segments chosen here */
    const fr_seg_layout *p = &seq->installed;
    if (!layout_matches(p, x, run)) {
        if (!layout_matches(&seq->layout, x, run) && make_layout(seq, x, run) != FR_OK)
            return NULL;
        p = &seq->layout;
    }
    fr_tensor *out = fr_retain(x);
    for (int g = 0, s = 0; g < p->n_groups && out; s += p->group_len[g], g++) {
        fr_run group_run = *run;
        if (p->group_strategy)
            group_run.strategy = p->group_strategy[g];
        if (!p->group_ckpt[g]) {
            /* a chain's group step by step, so each step's input goes once
             * the step is done (unless a node keeps it), as the planner
             * predicts: run as one, the group's input stayed held to its
             * end (ResNet-56 batch 192, two compressed blocks in a group:
             * 3.1% above the prediction). A dense module's children read
             * every feature before them, so they run as one. */
            int steps = seq->kind == FR_MODULE_CHAIN ? p->group_len[g] : 1;
            int each = seq->kind == FR_MODULE_CHAIN ? 1 : p->group_len[g];
            for (int t = 0; t < steps && out; t++)
                out = fr_chain(out, run_steps(seq, s + t * each, each, out, &group_run));
            continue;
        }
        segment seg = {.seq = seq, .first = s, .count = p->group_len[g], .run = group_run};
        seg.run.in_segment = true;
        /* the segment's input is kept as the segment's strategy says */
        int outer;
        if (fr_compress_enter(group_run.strategy.compress, &outer) != FR_OK) {
            fr_clear(&out);
            break;
        }
        out = fr_chain(out, fr_checkpoint(segment_forward, &seg, sizeof seg, out));
        fr_compress_restore(outer);
    }
    return out;
}

int fr_seq_steps(const fr_module *seq) { return n_steps(seq); }

bool fr_seq_is_barrier(const fr_module *seq, int step) { return is_barrier(seq, step); }

fr_tensor *fr_seq_run_steps(fr_module *seq, int first, int count, fr_tensor *x, const fr_run *run) {
    if (!x)
        return NULL;
    return run_steps(seq, first, count, x, run);
}

static bool segments_apply(const fr_module *seq, const fr_run *run) {
    return run->strategy.checkpoint && !run->in_segment && fr_grad_enabled() && n_steps(seq) > 0;
}

fr_tensor *fr_chain_forward(fr_module *c, fr_tensor *x, const fr_run *run) {
    if (!x) {
        fr_error_null("chain", "x");
        return NULL;
    }
    /* only the root's sequence is cut: a nested chain is part of it, or
     * runs inside a block or a dense module */
    if (c == c->model->build->root && segments_apply(c, run))
        return run_segmented(c, x, run);
    return run_chain(c, 0, c->n_steps, x, run);
}

fr_tensor *fr_dense_forward(fr_module *d, fr_tensor *x, const fr_run *run) {
    if (!x)
        return NULL;
    if (segments_apply(d, run))
        return run_segmented(d, x, run);
    return run_dense(d, 0, d->n_children, x, run, run->strategy.recompute);
}
