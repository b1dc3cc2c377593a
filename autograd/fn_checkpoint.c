/* fn_checkpoint.c: segment checkpointing (Chen et al. 2016, "Training Deep Nets
 * with Sublinear Memory Cost"). The segment runs forward under no_grad, so
 * none of its activations are kept; only its input is saved. In backward the
 * segment is run again with grad on, on a tape of its own, and backpropagated
 * at once; parameters inside it receive their gradients as leaves do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_log.h"
#include "functions.h"
#include "node.h"

/* ---- what the forward hands to the replay (checkpoint_log.h) ---- */

/* One norm's statistics: C means then C invstds, host floats. Like the
 * node's other bookkeeping (its ctx, its edges) they live outside the
 * ledger: 8 bytes a channel, where a tagged tensor per norm would change
 * the saved bytes the segment planner predicts exactly (nn/segments.c). */
typedef struct {
    const fr_tensor *gamma; /* which norm: compared, never read */
    int64_t channels, numel;
    float *stats;
} stats_entry;

/* One sign-only activation's mask: NULL where compression did not apply to
 * its output (the replay makes its own there too) */
typedef struct {
    fr_recipe *mask;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
    bool channels_last;
} mask_entry;

typedef struct {
    stats_entry *items;
    int count, cap;
    int next;    /* the replay's cursor */
    bool broken; /* nothing is taken: an entry was lost, or the replay's input is not the forward's */
    /* masks: kept only when the segment's input is kept as codes */
    mask_entry *masks;
    int n_masks, cap_masks, next_mask;
    bool masks_on;     /* the forward keeps them, the replay takes them */
    bool masks_broken; /* the replay met an op its forward did not run: none taken from there */
    bool masks_shared; /* the graph is retained: a replay shares each mask with its node
                        * (a second backward replays again), else hands it over */
} replay_log;

/* The log the running checkpoint forward fills and the one a replay reads:
 * a replay may run a nested checkpoint's forward, which fills its own log
 * while reading the outer one. */
static _Thread_local replay_log *recording;
static _Thread_local replay_log *replaying;

/* ---- what the segment read: versions (checkpoint_log.h) ---- */

/* A tensor the segment's forward read that it did not make (a parameter, a
 * buffer, a constant), at the storage version it had then. The replay reads
 * it again, so a write between the forward and the backward would give
 * gradients of another function than the one the forward computed. */
typedef struct {
    fr_tensor *t; /* a reference */
    uint64_t version;
} read_entry;

typedef struct {
    uint64_t mark;               /* the birth mark of what this forward makes */
    const fr_storage *input;     /* the segment's input: its node checks it itself */
    read_entry *items;
    int count, cap;
    bool oom;                    /* an entry was lost: the forward fails */
} read_log;

static _Thread_local read_log *watching;
static _Atomic uint64_t marks_made;

static void read_log_free(read_log *r) {
    if (!r)
        return;
    for (int i = 0; i < r->count; i++)
        fr_release(r->items[i].t);
    free(r->items);
    free(r);
}

static void note_read(read_log *r, fr_tensor *t) {
    /* made by this forward (an activation) or by a graph with grad (it
     * comes in through the segment's input or is another defect: see
     * fr_checkpoint_check_input) */
    if (t->made_in == r->mark || t->storage == r->input || fr_has_grad_fn(t))
        return;
    for (int i = 0; i < r->count; i++)
        if (r->items[i].t->storage == t->storage)
            return;
    if (r->count == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        read_entry *grown = realloc(r->items, (size_t)cap * sizeof *grown);
        if (!grown) {
            r->oom = true;
            return;
        }
        r->items = grown;
        r->cap = cap;
    }
    r->items[r->count++] = (read_entry){.t = fr_retain(t), .version = t->storage->version};
}

void fr_checkpoint_note_reads(int n, fr_tensor *const *inputs) {
    read_log *r = watching;
    if (!r)
        return;
    for (int i = 0; i < n; i++)
        if (inputs[i])
            note_read(r, inputs[i]);
}

/* t as an error names it: its registry name (nn/params.c sets it), else
 * its dtype and shape. */
static void describe(const fr_tensor *t, char *buf, size_t size) {
    if (t->name) {
        snprintf(buf, size, "%s", t->name);
        return;
    }
    int k = snprintf(buf, size, "a tensor (%s, shape [", fr_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && k < (int)size - 24; d++)
        k += snprintf(buf + k, size - (size_t)k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    snprintf(buf + k, size - (size_t)k, "])");
}

/* What the replay would read differently: the first tensor the forward
 * read that an inplace write changed since. */
static fr_status reads_check(const read_log *r) {
    for (int i = 0; r && i < r->count; i++) {
        const fr_storage *st = r->items[i].t->storage;
        if (st->version == r->items[i].version)
            continue;
        char what[160];
        describe(r->items[i].t, what, sizeof what);
        return fr_error(FR_ERR_VERSION,
                        "backward of checkpoint: %s, which its segment read in the forward, was "
                        "modified inplace by %s (read at version %llu, now version %llu), so the "
                        "replay would compute another function; use the out-of-place op, or "
                        "clone before writing",
                        what, st->last_writer ? st->last_writer : "an inplace op",
                        (unsigned long long)r->items[i].version, (unsigned long long)st->version);
    }
    return FR_OK;
}

fr_status fr_checkpoint_check_input(const char *op, int i, const fr_tensor *t) {
    if (!t || !t->made_in)
        return FR_OK;
    return fr_error(FR_ERR_GRAPH,
                    "%s: input %d was made inside a checkpointed segment's forward (strategy "
                    "checkpoint runs it without grad) and is read outside that segment, where "
                    "its gradient would be lost; keep the blocks that make and read it in one "
                    "segment (checkpoint:k over both), do not checkpoint this model, or "
                    "fr_detach it if it is meant as a constant",
                    op, i);
}

/* Host tensors only: on a GPU, reading the statistics back would wait for
 * the device, and computing them again there is cheap. */
static bool loggable(const fr_tensor *x, const fr_tensor *mean, const fr_tensor *invstd) {
    return x->ndim >= 2 && fr_device_of(x) == FR_CPU && mean->dtype == FR_F32 &&
           invstd->dtype == FR_F32 && fr_is_contiguous(mean) && fr_is_contiguous(invstd) &&
           fr_numel(mean) == x->shape[1] && fr_numel(invstd) == x->shape[1];
}

fr_checkpoint_logs fr_checkpoint_logs_suspend(void) {
    fr_checkpoint_logs logs = {recording, replaying, watching, fr_set_birth_mark(0)};
    recording = replaying = NULL;
    watching = NULL;
    return logs;
}

void fr_checkpoint_logs_resume(fr_checkpoint_logs logs) {
    recording = logs.recording;
    replaying = logs.replaying;
    watching = logs.watching;
    fr_set_birth_mark(logs.mark);
}

static _Thread_local long n_taken;
long fr_checkpoint_stats_taken(void) { return n_taken; }

bool fr_checkpoint_stats_take(const fr_tensor *gamma, const fr_tensor *x, fr_tensor *mean,
                              fr_tensor *invstd) {
    replay_log *log = replaying;
    /* synchronised BN sums across processes in the replay as before: a
     * process whose log broke (out of memory) alone would skip a collective
     * the others run */
    if (!log || log->broken || fr_batch_norm_synced() || !loggable(x, mean, invstd))
        return false;
    /* the next entry of this norm in the forward's order: an entry the
     * replay does not ask for (a norm it runs another way) is passed over */
    for (int i = log->next; i < log->count; i++) {
        const stats_entry *e = &log->items[i];
        if (e->gamma != gamma || e->channels != x->shape[1] || e->numel != fr_numel(x))
            continue;
        /* a norm the segment runs twice: which call an entry belongs to
         * is not certain when the replay passes one over, so such a norm
         * computes its statistics again */
        for (int j = 0; j < log->count; j++)
            if (j != i && log->items[j].gamma == gamma)
                return false;
        log->next = i + 1;
        size_t c = (size_t)e->channels;
        memcpy(fr_data_f32(mean), e->stats, c * sizeof(float));
        memcpy(fr_data_f32(invstd), e->stats + c, c * sizeof(float));
        n_taken++;
        return true;
    }
    return false;
}

void fr_checkpoint_stats_keep(const fr_tensor *gamma, const fr_tensor *x, const fr_tensor *mean,
                              const fr_tensor *invstd) {
    replay_log *log = recording;
    if (!log || !loggable(x, mean, invstd))
        return;
    size_t c = (size_t)x->shape[1];
    float *stats = malloc(2 * c * sizeof *stats);
    if (log->count == log->cap && stats) {
        int cap = log->cap ? 2 * log->cap : 32;
        stats_entry *items = realloc(log->items, (size_t)cap * sizeof *items);
        if (items) {
            log->items = items;
            log->cap = cap;
        }
    }
    if (!stats || log->count == log->cap) { /* a lost entry would shift the ones after it */
        free(stats);
        log->broken = true;
        return;
    }
    memcpy(stats, fr_data_f32(mean), c * sizeof *stats);
    memcpy(stats + c, fr_data_f32(invstd), c * sizeof *stats);
    log->items[log->count++] = (stats_entry){.gamma = gamma, .channels = x->shape[1],
                                             .numel = fr_numel(x), .stats = stats};
}

/* ---- masks ---- */

static _Thread_local long n_masks_taken;
long fr_checkpoint_masks_taken(void) { return n_masks_taken; }

static void masks_free(replay_log *log) {
    for (int i = 0; i < log->n_masks; i++)
        fr_recipe_release(log->masks[i].mask);
    free(log->masks);
    log->masks = NULL;
    log->n_masks = log->cap_masks = log->next_mask = 0;
}

/* The replay's next mask, a new reference handed over (the log lets go of
 * it, so each mask is freed with the replayed node that saves it), or NULL:
 * none for this op. */
static fr_recipe *mask_take(replay_log *log, const fr_tensor *y) {
    mask_entry *e = log->next_mask < log->n_masks ? &log->masks[log->next_mask] : NULL;
    if (!e || e->ndim != y->ndim || e->channels_last != fr_is_channels_last(y) ||
        memcmp(e->shape, y->shape, (size_t)y->ndim * sizeof *y->shape)) {
        log->masks_broken = true;
        return NULL;
    }
    log->next_mask++;
    fr_recipe *m = e->mask;
    if (log->masks_shared)
        fr_recipe_retain(m);
    else
        e->mask = NULL;
    n_masks_taken += m != NULL;
    return m;
}

/* Appends a mask (the caller's reference, NULL allowed); false out of memory. */
static bool mask_append(replay_log *log, fr_recipe *m, const fr_tensor *y) {
    if (log->n_masks == log->cap_masks) {
        int cap = log->cap_masks ? 2 * log->cap_masks : 32;
        mask_entry *grown = realloc(log->masks, (size_t)cap * sizeof *grown);
        if (!grown) {
            fr_recipe_release(m);
            return false;
        }
        log->masks = grown;
        log->cap_masks = cap;
    }
    mask_entry *e = &log->masks[log->n_masks++];
    *e = (mask_entry){.mask = m, .ndim = y->ndim, .channels_last = fr_is_channels_last(y)};
    memcpy(e->shape, y->shape, (size_t)y->ndim * sizeof *y->shape);
    return true;
}

int fr_node_keep_sign(fr_node *node, fr_tensor *y) {
    replay_log *rep = replaying, *rec = recording;
    fr_recipe *m = NULL;
    bool taken = false;
    if (rep && rep->masks_on && !rep->masks_broken) {
        m = mask_take(rep, y);
        taken = !rep->masks_broken;
    }
    /* a checkpointed forward keeps the mask its replay will use: the one
     * taken from an outer replay (a nested checkpoint's forward runs inside
     * it), else y's own */
    if (rec && rec->masks_on) {
        fr_recipe *k = NULL;
        if (taken)
            k = m ? fr_recipe_retain(m) : NULL;
        else if (fr_sign_mask_of(y, &k) != FR_OK) {
            fr_recipe_release(m);
            return -1;
        }
        if (!mask_append(rec, k, y)) {
            fr_recipe_release(m);
            fr_error(FR_ERR_OOM, "checkpoint: out of memory keeping a ReLU mask");
            return -1;
        }
    }
    if (!node) {
        fr_recipe_release(m);
        return 0;
    }
    return m ? fr_node_save_recipe(node, m) : fr_node_save_sign(node, y);
}

static void replay_log_free(replay_log *log) {
    if (!log)
        return;
    for (int i = 0; i < log->count; i++)
        free(log->items[i].stats);
    free(log->items);
    masks_free(log);
    free(log);
}

/* Everything the replay reads is owned here, copied at forward time: the
 * segment's description (fn_ctx, a byte copy), the random state, the
 * replay's compression seed and the autocast dtype. Nothing is borrowed
 * from the model but its layers, so a forward run between this one and its
 * backward (an eval pass, another model, a changed strategy, a failed
 * forward) cannot change the replay. */
typedef struct {
    fr_segment_fn fn;
    void *fn_ctx;           /* owned copy of ctx_size bytes */
    uint64_t random_state;  /* before the forward: the replay draws the same masks */
    uint64_t compress_seed; /* the replay's rounding stream (autograd.h): fr_checkpoint */
    fr_dtype autocast;      /* the forward's autocast dtype: the replay computes in it too */
    int compress;           /* the forward's compress:B (0: off): the replay's ops save as
                             * its forward's would have, and its masks meet the same ops */
    replay_log *log;        /* the forward's batch statistics and masks, for the replay */
    read_log *reads;        /* what the forward read and did not make, at its versions */
} checkpoint_ctx;

/* Backpropagates the replayed segment. Under a backward restricted to some
 * inputs, the replay is restricted to the same ones plus the segment's input
 * leaf (when its gradient is wanted; NULL: not), so parameters outside the
 * list get no gradient from inside segments either. */
static fr_status replay_backward(fr_tensor *y, fr_tensor *dy, fr_tensor *leaf) {
    const fr_backward_options *outer = fr_backward_running();
    if (!outer || outer->n_inputs == 0)
        return fr_backward_with(y, dy);
    fr_tensor **inputs = malloc((size_t)(outer->n_inputs + 1) * sizeof *inputs);
    if (!inputs)
        return fr_error(FR_ERR_OOM, "backward of checkpoint: out of memory");
    for (int i = 0; i < outer->n_inputs; i++)
        inputs[i] = outer->inputs[i];
    if (leaf)
        inputs[outer->n_inputs] = leaf;
    fr_backward_options o = {.n_inputs = outer->n_inputs + (leaf != NULL), .inputs = inputs};
    fr_status st = fr_backward_with_options(y, dy, &o);
    free(inputs);
    return st;
}

static fr_status checkpoint_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const checkpoint_ctx *c = node->ctx;
    /* the input's gradient only where someone wants it: a segment over the
     * data batch (the model's first) would otherwise make the batch's
     * gradient and its convolution's backward-data workspace, which nobody
     * reads (at ResNet-56 batch 640, 7.5 MiB and a workspace at the step's
     * peak: bench/RESULTS.md, issue 23) */
    bool want_dx = fr_node_needs_grad(node, 0);
    /* the parameters and buffers the replay reads are those the forward
     * read, as the ones a plain node saves are (docs/ARCHITECTURE.md,
     * "Strategies") */
    FR_TRY(reads_check(c->reads));
    fr_tensor *x = fr_node_unpack(node, 0);
    if (!x)
        return fr_last_status();
    FR_TRY(fr_tape_push());
    fr_tensor *leaf = fr_detach(x);
    fr_release(x);
    fr_status st = leaf ? FR_OK : fr_last_status();
    fr_tensor *y = NULL;
    if (st == FR_OK) {
        /* The input becomes a leaf of the inner tape, so its gradient lands
         * in leaf->grad; the segment's parameters are leaves already. */
        if (want_dx)
            fr_set_requires_grad(leaf, true);
        uint64_t now = fr_random_state(), now_compress = fr_compress_random_state();
        fr_set_random_state(c->random_state);
        fr_set_compress_random_state(c->compress_seed);
        fr_recompute_enter();
        replay_log *outer = replaying;
        replaying = c->log;
        c->log->next = 0;
        c->log->next_mask = 0;
        c->log->masks_broken = false;
        const fr_backward_options *running = fr_backward_running();
        c->log->masks_shared = running && running->retain_graph;
        int compress = 0;
        st = fr_compress_enter(c->compress, &compress);
        if (st == FR_OK && (st = fr_autocast_enter(c->autocast)) == FR_OK) {
            y = c->fn(c->fn_ctx, leaf);
            fr_autocast_exit();
        }
        fr_compress_restore(compress);
        replaying = outer;
        fr_recompute_exit();
        fr_set_random_state(now);
        fr_set_compress_random_state(now_compress);
        if (st == FR_OK && !y && (st = fr_last_status()) == FR_OK)
            st = fr_error(FR_ERR_ARG, "backward of checkpoint: the segment's replay produced no "
                                      "output (its function returned NULL without an error)");
        /* nobody saves the replay's output (the segment's output outside
         * is the forward's tensor), so a recipe on it (recompute) would
         * only hold what it reads, such as the last norm's input, through
         * the whole replay's backward: a recompute segment of two steps
         * peaked one activation above the planner's exact prediction */
        if (st == FR_OK && y != leaf)
            fr_set_recipe(y, NULL);
        /* an identity segment (a block that returns its input): the
         * gradient passes through, as without the checkpoint; nothing in it
         * takes a gradient (no parameters, an input that wants none):
         * nothing to do */
        if (st == FR_OK && y == leaf) {
            if (want_dx)
                din[0] = fr_retain(dout[0]);
        } else if (st == FR_OK && (y->requires_grad || y->grad_fn))
            st = replay_backward(y, dout[0], want_dx ? leaf : NULL);
    }
    if (st == FR_OK && want_dx && leaf->grad && !din[0])
        din[0] = fr_retain(leaf->grad);
    fr_release(y);
    fr_release(leaf);
    fr_tape_pop();
    return st;
}

static void checkpoint_ctx_free(void *p) {
    checkpoint_ctx *c = p;
    if (c) {
        free(c->fn_ctx);
        replay_log_free(c->log);
        read_log_free(c->reads);
    }
    free(c);
}

/* Runs the segment's no-grad forward for c: what it makes carries a birth
 * mark of its own, and what it reads and did not make is noted with its
 * version (c->reads). Returns its output as the tensor the node will own:
 * made here, it loses the mark (the node makes it a tensor of the graph);
 * not made here (the input itself, from a block that returns its input),
 * a new view of it, so the caller's tensor never becomes the node's
 * output. NULL with the error set. */
static fr_tensor *forward_watched(checkpoint_ctx *c, fr_tensor *x) {
    read_log *reads = c->reads;
    reads->mark = ++marks_made;
    reads->input = x->storage;
    replay_log *outer = recording;
    read_log *outer_reads = watching;
    recording = c->log;
    watching = reads;
    uint64_t outer_mark = fr_set_birth_mark(reads->mark);
    fr_no_grad_enter();
    fr_tensor *y = c->fn(c->fn_ctx, x);
    fr_no_grad_exit();
    fr_set_birth_mark(outer_mark);
    watching = outer_reads;
    recording = outer;
    if (!y) {
        if (fr_last_status() == FR_OK)
            fr_error(FR_ERR_ARG, "checkpoint: the segment produced no output (its function "
                                 "returned NULL without an error)");
        return NULL;
    }
    if (reads->oom) {
        fr_release(y);
        fr_error(FR_ERR_OOM, "checkpoint: out of memory noting what its segment read");
        return NULL;
    }
    if (y->made_in == reads->mark) {
        y->made_in = 0;
        return y;
    }
    fr_tensor *view = fr_detach(y);
    fr_release(y);
    return view;
}

fr_tensor *fr_checkpoint(fr_segment_fn fn, const void *fn_ctx, size_t ctx_size, fr_tensor *x) {
    if (!fn) {
        fr_error(FR_ERR_ARG, "checkpoint: segment function is NULL");
        return NULL;
    }
    if (fr_check_defined("checkpoint", "x", x) != FR_OK)
        return NULL;
    /* Recorded whenever grad is on: the segment's parameters need gradients
     * even when its input (a data batch) does not. */
    if (!fr_grad_enabled())
        return fn((void *)fn_ctx, x);
    /* the copy is made before the forward, so the forward and the replay
     * read the same description */
    checkpoint_ctx *c = calloc(1, sizeof *c);
    replay_log *log = c ? calloc(1, sizeof *log) : NULL;
    read_log *reads = log ? calloc(1, sizeof *reads) : NULL;
    void *copy = reads ? malloc(ctx_size ? ctx_size : 1) : NULL;
    if (!copy) {
        free(reads);
        free(log);
        free(c);
        fr_error(FR_ERR_OOM, "checkpoint: out of memory");
        return NULL;
    }
    if (ctx_size)
        memcpy(copy, fn_ctx, ctx_size);
    /* The replay packs what its no-grad forward did not, from compression's
     * own stream (autograd.h), so dropout's stream, restored, gives it the
     * forward's masks. It packs from a stream of a seed drawn here: the
     * same codes at every replay (a second backward under retain_graph
     * gives the same gradients), reproducible under fr_manual_seed, and
     * unrelated to the codes packed after the segment (restoring the
     * state itself would have the replay repeat those). */
    *c = (checkpoint_ctx){.fn = fn, .fn_ctx = copy, .random_state = fr_random_state(),
                          .compress_seed = fr_compress_next_seed(),
                          .autocast = fr_autocast_dtype(), .compress = fr_compress_bits(),
                          .log = log, .reads = reads};
    /* masks only where the input will be kept as codes: on an exact input
     * the replay's masks are the forward's */
    log->masks_on = fr_compress_would_pack(x);
    fr_tensor *y = forward_watched(c, x);
    fr_node *node = y ? fr_node_new("checkpoint", checkpoint_backward, 1, &x, 1) : NULL;
    if (!node) {
        checkpoint_ctx_free(c);
        fr_release(y);
        return NULL;
    }
    fr_node_set_ctx(node, c, checkpoint_ctx_free);
    int slot = fr_node_save_activation(node, x, false);
    if (slot < 0) {
        fr_release(y);
        return NULL;
    }
    /* x kept as compressed codes (compress:B): the replay runs on their
     * decoding, whose statistics are not the forward's */
    if (node->saved[slot].recipe)
        log->broken = true;
    else {
        masks_free(log);
        log->masks_on = false;
    }
    fr_node_set_output(node, 0, y);
    return y;
}
