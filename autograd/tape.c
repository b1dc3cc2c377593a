/* tape.c: grad mode, nodes, saved tensors and the backward engine. */
#include "autograd.h"
#include "checkpoint_log.h"
#include "node.h"
#include "../tensor/rng.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int no_grad_depth;

/* The tape: nodes in creation order, so reverse order is a topological order
 * (every consumer of a node's outputs was recorded after it). Several graphs
 * may be pending on it at once; a backward takes out only the nodes it
 * reached, leaving NULL holes that it closes before it returns. seqs[i] is
 * nodes[i]->seq and stays readable after the node is freed, so a tensor or an
 * edge can find out whether its producer is still here (find_node). */
typedef struct {
    fr_node **nodes;
    uint64_t *seqs;   /* increasing */
    int len, cap;     /* slots used, holes included */
    int live;         /* nodes on the tape */
    int running;      /* backwards walking this tape now */
} fr_tape;
static _Thread_local fr_tape tape;

/* Node sequence numbers are unique in the process, so a tensor made on
 * another thread or on a popped tape never matches a node here. */
static _Atomic uint64_t seq_counter;

/* Outer tapes set aside by fr_tape_push (checkpointing recomputes a segment
 * on a tape of its own in the middle of backward). */
#define FR_TAPE_DEPTH 8
static _Thread_local fr_tape outer[FR_TAPE_DEPTH];
static _Thread_local int n_outer;

/* The op of recently freed nodes, by sequence number, so that a backward
 * through a freed graph can say which op it was (error path only). */
#define FREED_RING 1024
static _Thread_local struct {
    uint64_t seq;
    const char *op;
} freed[FREED_RING];
static _Thread_local unsigned freed_next;

static const char *freed_op(uint64_t seq) {
    for (int i = 0; i < FREED_RING; i++)
        if (freed[i].seq == seq && freed[i].op)
            return freed[i].op;
    return "an op";
}

/* The live node with this sequence number on tape t, or NULL. */
static fr_node *find_node_on(const fr_tape *t, uint64_t seq) {
    int lo = 0, hi = t->len - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (t->seqs[mid] == seq)
            return t->nodes[mid];
        if (t->seqs[mid] < seq)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* The live node with this sequence number on the current tape, or NULL. */
static fr_node *find_node(uint64_t seq) { return find_node_on(&tape, seq); }

/* Whether the node is alive on a tape set aside by fr_tape_push: a replay
 * reads a tensor of the graph outside its segment (error path only). */
static bool on_outer_tape(uint64_t seq) {
    for (int i = 0; i < n_outer; i++)
        if (find_node_on(&outer[i], seq))
            return true;
    return false;
}

static bool node_alive(const fr_node *n, uint64_t seq) { return n && find_node(seq) == n; }

static _Thread_local uint64_t random_state = 0x853C49E6748FEA9Bull;
/* Compression's rounding stream (autograd.h): its own state, so packing a
 * saved tensor never moves the one dropout draws from (docs/ARCHITECTURE.md,
 * "Saved tensors: held, recipe or compressed"). */
static _Thread_local uint64_t compress_random_state = 0xDA942042E4DD58B5ull;

/* The compression stream's start for a seed: the seed through the
 * finaliser, so the two streams of one seed are unrelated rather than
 * equal (equal states would hand compression dropout's seeds). */
static uint64_t compress_state_of(uint64_t seed) { return fr_rng_mix(seed ^ 0x5851F42D4C957F2Dull); }

void fr_manual_seed(uint64_t seed) {
    random_state = seed;
    compress_random_state = compress_state_of(seed);
}
uint64_t fr_random_state(void) { return random_state; }
void fr_set_random_state(uint64_t state) { random_state = state; }

/* SplitMix64 (tensor/rng.h): a counter through a finaliser, so consecutive
 * seeds are unrelated and a state is one integer to save and restore. */
static uint64_t next_seed(uint64_t *state) {
    fr_rng r = {*state};
    uint64_t z = fr_rng_next(&r);
    *state = r.state;
    return z;
}

uint64_t fr_random_next_seed(void) { return next_seed(&random_state); }

uint64_t fr_compress_random_state(void) { return compress_random_state; }
void fr_set_compress_random_state(uint64_t state) { compress_random_state = state; }
uint64_t fr_compress_next_seed(void) { return next_seed(&compress_random_state); }

static _Thread_local int recompute_depth;
void fr_recompute_enter(void) { recompute_depth++; }
void fr_recompute_exit(void) {
    FR_ASSERT(recompute_depth > 0);
    recompute_depth--;
}
bool fr_in_recompute(void) { return recompute_depth > 0; }

void fr_no_grad_enter(void) { no_grad_depth++; }
void fr_no_grad_exit(void) {
    FR_ASSERT(no_grad_depth > 0);
    no_grad_depth--;
}
bool fr_grad_enabled(void) { return no_grad_depth == 0; }

enum { AUTOCAST_MAX_DEPTH = 16 };
static _Thread_local fr_dtype autocast_stack[AUTOCAST_MAX_DEPTH];
static _Thread_local int autocast_depth;

fr_status fr_autocast_enter(fr_dtype dtype) {
    if (!fr_dtype_is_float(dtype))
        return fr_error(FR_ERR_DTYPE, "autocast: dtype must be f32, f16 or bf16, got %s",
                        fr_dtype_name(dtype));
    if (autocast_depth >= AUTOCAST_MAX_DEPTH)
        return fr_error(FR_ERR_ARG, "autocast: nested more than %d levels", AUTOCAST_MAX_DEPTH);
    autocast_stack[autocast_depth++] = dtype;
    return FR_OK;
}

void fr_autocast_exit(void) {
    FR_ASSERT(autocast_depth > 0);
    autocast_depth--;
}

fr_dtype fr_autocast_dtype(void) { return autocast_depth ? autocast_stack[autocast_depth - 1] : FR_F32; }

void fr_set_requires_grad(fr_tensor *t, bool on) {
    FR_ASSERT(t);
    t->requires_grad = on;
}

bool fr_has_grad_fn(const fr_tensor *t) {
    return t && t->requires_grad && t->grad_fn && node_alive(t->grad_fn, t->grad_fn_gen);
}

static bool is_leaf(const fr_tensor *t) { return t->requires_grad && !t->grad_fn; }

void fr_zero_grad(fr_tensor *t) {
    if (t)
        fr_clear(&t->grad);
}

fr_tensor *fr_detach(fr_tensor *t) {
    if (fr_check_defined("detach", "input", t) != FR_OK)
        return NULL;
    fr_tensor *v = fr_narrow(t, 0, 0, t->ndim ? t->shape[0] : 0);
    if (!v && t->ndim == 0) /* narrow needs a dimension; a scalar views as itself */
        v = fr_view(t, 0, NULL);
    if (v) {
        v->requires_grad = false;
        v->grad_fn = NULL;
        v->made_in = 0; /* a constant by the caller's choice (fn_checkpoint.c) */
        v->cut_from_graph = false; /* the same: cut on purpose */
    }
    return v;
}

bool fr_should_record(int n, fr_tensor *const *inputs) {
    if (no_grad_depth > 0) {
        /* in a checkpointed segment's forward, what the replay will read
         * again (checkpoint_log.h) */
        fr_checkpoint_note_reads(n, inputs);
        return false;
    }
    /* a view cut from the graph is recorded only to be refused
     * (fr_node_new): an op over it alone made a result without a graph, and
     * whatever read that result later lost the gradient silently */
    for (int i = 0; i < n; i++)
        if (inputs[i] && (inputs[i]->requires_grad || inputs[i]->cut_from_graph))
            return true;
    return false;
}

static void saved_release(fr_saved *s) {
    if (s->held) {
        fr_storage_unmark_saved(s->held->storage);
        fr_clear(&s->held);
    }
    fr_recipe_release(s->recipe);
    memset(s, 0, sizeof *s);
}

static void node_free(fr_node *n) {
    if (!n)
        return;
    for (int i = 0; i < n->n_saved; i++)
        saved_release(&n->saved[i]);
    for (int i = 0; i < n->n_inputs; i++)
        if (n->inputs[i].kind == FR_EDGE_LEAF)
            fr_release(n->inputs[i].leaf);
    for (int i = 0; i < n->n_outputs; i++)
        fr_release(n->grads[i]);
    if (n->ctx_free)
        n->ctx_free(n->ctx);
    else
        free(n->ctx);
    free(n->saved);
    free(n->inputs);
    free(n->grads);
    free(n->out_shapes);
    free(n->out_ndims);
    free(n->out_dtypes);
    free(n);
}

/* Frees tape slot i's node (the slot becomes a hole until compact_tape). */
static void free_slot(int i) {
    fr_node *n = tape.nodes[i];
    freed[freed_next % FREED_RING].seq = n->seq;
    freed[freed_next % FREED_RING].op = n->op;
    freed_next++;
    node_free(n);
    tape.nodes[i] = NULL;
    tape.live--;
}

/* Closes the holes backward left, keeping creation order. */
static void compact_tape(void) {
    int kept = 0;
    for (int i = 0; i < tape.len; i++)
        if (tape.nodes[i]) {
            tape.nodes[kept] = tape.nodes[i];
            tape.seqs[kept] = tape.seqs[i];
            kept++;
        }
    tape.len = kept;
    FR_ASSERT(kept == tape.live);
}

static fr_status grow_tape(const char *op) {
    int cap = tape.cap ? tape.cap * 2 : 256;
    fr_node **nodes = realloc(tape.nodes, (size_t)cap * sizeof *nodes);
    if (nodes)
        tape.nodes = nodes;
    uint64_t *seqs = nodes ? realloc(tape.seqs, (size_t)cap * sizeof *seqs) : NULL;
    if (!seqs)
        return fr_error(FR_ERR_OOM, "%s: out of memory growing the tape", op);
    tape.seqs = seqs;
    tape.cap = cap;
    return FR_OK;
}

fr_node *fr_node_new(const char *op, fr_backward_fn backward, int n_inputs,
                     fr_tensor *const *inputs, int n_outputs) {
    FR_ASSERT(backward && n_outputs >= 1 && n_inputs >= 0);
    for (int i = 0; i < n_inputs; i++) {
        const fr_tensor *t = inputs[i];
        if (t && t->requires_grad && t->grad_fn && !node_alive(t->grad_fn, t->grad_fn_gen) &&
            on_outer_tape(t->grad_fn_gen)) {
            fr_error(FR_ERR_GRAPH,
                     "%s: input %d (made by %s) comes from outside the checkpointed segment being "
                     "replayed, where its gradient cannot go (a segment passes gradient back only "
                     "through its input); keep the blocks that make and read it in one segment "
                     "(checkpoint:k over both), or do not checkpoint this model",
                     op, i, t->grad_fn->op);
            return NULL;
        }
        if (t && t->requires_grad && t->grad_fn && !node_alive(t->grad_fn, t->grad_fn_gen)) {
            fr_error(FR_ERR_GRAPH,
                     "%s: input %d comes from a graph (made by %s) that backward (or fr_tape_clear) "
                     "already freed; detach it or recompute it",
                     op, i, freed_op(t->grad_fn_gen));
            return NULL;
        }
        if (fr_checkpoint_check_input(op, i, t) != FR_OK)
            return NULL;
        if (t && t->cut_from_graph) {
            fr_error(FR_ERR_GRAPH,
                     "%s: input %d is a view (fr_view or fr_narrow) of a tensor that wants a "
                     "gradient, and such a view carries none; use fr_reshape or fr_slice, which "
                     "autograd records, or fr_detach the view if a constant is meant",
                     op, i);
            return NULL;
        }
    }
    if (tape.len == tape.cap && grow_tape(op) != FR_OK)
        return NULL;
    fr_node *n = calloc(1, sizeof *n);
    if (!n || !(n->inputs = calloc((size_t)(n_inputs ? n_inputs : 1), sizeof *n->inputs)) ||
        !(n->grads = calloc((size_t)n_outputs, sizeof *n->grads)) ||
        !(n->out_shapes = calloc((size_t)n_outputs, sizeof *n->out_shapes)) ||
        !(n->out_ndims = calloc((size_t)n_outputs, sizeof *n->out_ndims)) ||
        !(n->out_dtypes = calloc((size_t)n_outputs, sizeof *n->out_dtypes))) {
        node_free(n);
        fr_error(FR_ERR_OOM, "%s: out of memory recording a node", op);
        return NULL;
    }
    n->op = op;
    n->backward = backward;
    n->n_inputs = n_inputs;
    n->n_outputs = n_outputs;
    n->seq = atomic_fetch_add(&seq_counter, 1) + 1;
    for (int i = 0; i < n_inputs; i++) {
        fr_tensor *t = inputs[i];
        if (!t || !t->requires_grad)
            continue;
        if (is_leaf(t)) {
            n->inputs[i].kind = FR_EDGE_LEAF;
            n->inputs[i].leaf = fr_retain(t);
        } else {
            n->inputs[i].kind = FR_EDGE_NODE;
            n->inputs[i].node = t->grad_fn;
            n->inputs[i].seq = t->grad_fn_gen;
            n->inputs[i].op = t->grad_fn->op;
            n->inputs[i].output = t->grad_fn_out;
        }
    }
    tape.nodes[tape.len] = n;
    tape.seqs[tape.len] = n->seq;
    tape.len++;
    tape.live++;
    return n;
}

void fr_node_set_output(fr_node *node, int index, fr_tensor *t) {
    FR_ASSERT(index >= 0 && index < node->n_outputs);
    t->cut_from_graph = false; /* a view recorded as an op's output (fr_reshape) */
    t->requires_grad = true;
    t->grad_fn = node;
    t->grad_fn_gen = node->seq;
    t->grad_fn_out = index;
    node->device = fr_device_of(t);
    node->out_ndims[index] = t->ndim;
    node->out_dtypes[index] = t->dtype;
    memcpy(node->out_shapes[index], t->shape, sizeof node->out_shapes[index]);
}

void fr_node_set_ctx(fr_node *node, void *ctx, void (*ctx_free)(void *)) {
    FR_ASSERT(!node->ctx);
    node->ctx = ctx;
    node->ctx_free = ctx_free;
}

/* The backward running now on this thread (innermost), or NULL. */
typedef struct backward_run {
    uint64_t id;                  /* marks the nodes it reached */
    fr_backward_options opts;
    struct backward_run *outer;
} backward_run;
static _Thread_local backward_run *running;
static _Thread_local uint64_t run_counter;

static bool leaf_wanted(const backward_run *r, const fr_tensor *leaf) {
    if (r->opts.n_inputs == 0)
        return true;
    for (int i = 0; i < r->opts.n_inputs; i++)
        if (r->opts.inputs[i] == leaf)
            return true;
    return false;
}

bool fr_node_needs_grad(const fr_node *node, int input) {
    FR_ASSERT(input >= 0 && input < node->n_inputs);
    const fr_edge *e = &node->inputs[input];
    /* A leaf outside the running backward's inputs gets no gradient, so the
     * op need not compute it. Only nodes that backward reached are asked
     * this way: forward code run inside it (a checkpoint replay) still sees
     * every edge. */
    if (e->kind == FR_EDGE_LEAF && running && node->mark == running->id)
        return leaf_wanted(running, e->leaf);
    return e->kind != FR_EDGE_NONE;
}

static int saved_slot(fr_node *node) {
    if (node->n_saved == node->cap_saved) {
        int cap = node->cap_saved ? node->cap_saved * 2 : 4;
        fr_saved *grown = realloc(node->saved, (size_t)cap * sizeof *grown);
        if (!grown) {
            fr_error(FR_ERR_OOM, "%s: out of memory saving a tensor", node->op);
            return -1;
        }
        node->saved = grown;
        node->cap_saved = cap;
    }
    memset(&node->saved[node->n_saved], 0, sizeof node->saved[0]);
    return node->n_saved++;
}

int fr_node_save(fr_node *node, fr_tensor *t) {
    FR_ASSERT(t);
    fr_recipe *r = fr_live_recipe(t);
    if (r)
        return fr_node_save_recipe(node, fr_recipe_retain(r));
    return fr_node_save_held(node, t);
}

int fr_node_save_held(fr_node *node, fr_tensor *t) {
    FR_ASSERT(t);
    int i = saved_slot(node);
    if (i < 0)
        return -1;
    node->saved[i].held = fr_retain(t);
    node->saved[i].version = t->storage->version;
    fr_storage_mark_saved(t->storage);
    return i;
}

int fr_node_save_recipe(fr_node *node, fr_recipe *r) {
    FR_ASSERT(r && r->make);
    int i = saved_slot(node);
    if (i < 0) {
        fr_recipe_release(r);
        return -1;
    }
    node->saved[i].recipe = r;
    return i;
}

fr_tensor *fr_node_unpack(fr_node *node, int i) {
    FR_ASSERT(i >= 0 && i < node->n_saved);
    fr_saved *s = &node->saved[i];
    if (s->held) {
        const fr_storage *st = s->held->storage;
        if (st->version != s->version) {
            fr_error(FR_ERR_VERSION,
                     "backward of %s: a tensor it saved for backward was modified inplace by %s "
                     "(saved at version %llu, now version %llu); use the out-of-place op, or "
                     "clone before writing",
                     node->op, st->last_writer ? st->last_writer : "an inplace op",
                     (unsigned long long)s->version, (unsigned long long)st->version);
            return NULL;
        }
        return fr_retain(s->held);
    }
    FR_ASSERT(s->recipe);
    /* Recomputation must not record a node of its own. */
    fr_no_grad_enter();
    fr_tensor *t = s->recipe->make(s->recipe);
    fr_no_grad_exit();
    if (!t) {
        char why[512];
        snprintf(why, sizeof why, "%s", fr_last_error());
        fr_error(fr_last_status(), "backward of %s: recomputing a saved tensor (made by %s) "
                 "failed: %s", node->op, s->recipe->op, why);
    }
    return t;
}

void fr_node_drop_saved(fr_node *node, int i) {
    FR_ASSERT(i >= 0 && i < node->n_saved);
    saved_release(&node->saved[i]);
}

int fr_tape_size(void) { return tape.live; }

void fr_tape_clear(void) {
    FR_ASSERT(!tape.running);
    for (int i = 0; i < tape.len; i++)
        if (tape.nodes[i])
            free_slot(i);
    free(tape.nodes);
    free(tape.seqs);
    tape = (fr_tape){0};
}

fr_status fr_tape_push(void) {
    if (n_outer == FR_TAPE_DEPTH)
        return fr_error(FR_ERR_GRAPH, "tape: more than %d nested tapes", FR_TAPE_DEPTH);
    outer[n_outer++] = tape;
    tape = (fr_tape){0};
    return FR_OK;
}

void fr_tape_pop(void) {
    FR_ASSERT(n_outer > 0);
    fr_tape_clear();
    tape = outer[--n_outer];
}

/* Adds g into *slot: takes the reference when the slot is empty. A backward
 * may hand the same gradient (or a view of it) to several inputs, so a slot
 * whose bytes are shared is replaced by a fresh sum rather than written. */
bool fr_grad_held_alone(const fr_tensor *g) { return g->refcount == 1 && g->storage->refcount == 1; }

/* Two writes autograd cannot follow: over a leaf that wants a gradient (no
 * producer to record the write against; its old values would be lost), and
 * over bytes another tensor shares (a view, a reshape, or the base of one):
 * the write is recorded against x alone, so the other tensor's values change
 * under a graph that does not know it, and its gradient came out wrong
 * silently (sum(y) after scaling a reshape of y in place: half of it). */
fr_status fr_check_inplace(const char *op, const fr_tensor *x) {
    FR_TRY(fr_check_defined(op, "input", x));
    if (!fr_grad_enabled() || !x->requires_grad)
        return FR_OK;
    if (!fr_has_grad_fn(x))
        return fr_error(FR_ERR_ARG, "%s: in-place write on a leaf that requires grad; use the "
                        "out-of-place op, or run under no_grad", op);
    if (x->storage->refcount > 1)
        return fr_error(FR_ERR_ARG, "%s: in-place write on a tensor whose bytes another tensor "
                        "shares (a view or reshape of it, or the tensor it views); autograd "
                        "would record the write against one of them only: use the out-of-place "
                        "op", op);
    return FR_OK;
}

static fr_status accumulate(fr_tensor **slot, fr_tensor *g) {
    if (!*slot) {
        *slot = g;
        return FR_OK;
    }
    fr_status st;
    fr_tensor *cur = *slot;
    if (!fr_grad_held_alone(cur)) {
        fr_tensor *sum = fr_empty_like(cur, FR_TAG_TRANSIENT);
        st = sum ? fr_add_out(sum, cur, g) : fr_last_status();
        if (st == FR_OK) {
            fr_release(cur);
            *slot = sum;
        } else {
            fr_release(sum);
        }
    } else {
        st = fr_axpy_(cur, 1.0f, g);
    }
    fr_release(g);
    return st;
}

static fr_status accumulate_leaf(fr_tensor *leaf, fr_tensor *g) {
    if (!leaf->grad) {
        /* A parameter's gradient outlives backward: it counts as a gradient.
         * A leaf cut from an activation (a checkpointed segment's input)
         * passes its gradient on at once: it stays an activation gradient. */
        fr_mem_tag tag = leaf->storage->home_tag == FR_TAG_TRANSIENT ? FR_TAG_TRANSIENT : FR_TAG_GRAD;
        leaf->grad = fr_empty_like(leaf, tag);
        fr_status st = leaf->grad ? fr_copy_(leaf->grad, g) : fr_last_status();
        fr_release(g);
        return st;
    }
    fr_status st = fr_axpy_(leaf->grad, 1.0f, g);
    fr_release(g);
    return st;
}

/* Runs one node: fills missing output gradients with zeros, calls backward,
 * routes the input gradients. */
static fr_status run_node(fr_node *n) {
    for (int o = 0; o < n->n_outputs; o++)
        if (!n->grads[o]) {
            n->grads[o] = fr_zeros(n->device, n->out_dtypes[o], n->out_ndims[o], n->out_shapes[o],
                                   FR_TAG_TRANSIENT);
            if (!n->grads[o])
                return fr_last_status();
        }
    fr_tensor *stack_din[8];
    fr_tensor **din = n->n_inputs <= 8 ? stack_din : calloc((size_t)n->n_inputs, sizeof *din);
    if (!din)
        return fr_error(FR_ERR_OOM, "backward of %s: out of memory", n->op);
    memset(din, 0, (size_t)n->n_inputs * sizeof *din);
    fr_status st = n->backward(n, n->grads, din);
    /* The output gradients are consumed: free them before routing, so they
     * never coexist with the gradients flowing further down. */
    for (int o = 0; o < n->n_outputs; o++)
        fr_clear(&n->grads[o]);
    for (int i = 0; i < n->n_inputs; i++) {
        fr_tensor *g = din[i];
        din[i] = NULL;
        if (!g)
            continue;
        fr_edge *e = &n->inputs[i];
        if (st != FR_OK || !fr_node_needs_grad(n, i)) {
            fr_release(g);
        } else if (e->kind == FR_EDGE_LEAF) {
            st = accumulate_leaf(e->leaf, g);
        } else {
            st = accumulate(&e->node->grads[e->output], g);
        }
    }
    if (din != stack_din)
        free(din);
    return st;
}

/* ---- gradient-ready hook (autograd.h) ----
 * Before the reverse walk, one pass over this backward's nodes (those marked
 * with its run id) in recording order finds each leaf's lowest-indexed
 * consumer: walking in reverse, that node is the last to add to the leaf's
 * gradient. Nodes of other pending graphs do not count: they are not run. The (node, leaf) pairs come out sorted
 * by node index, so the walk pops them from the end as it passes each node. */
static _Thread_local fr_grad_ready_fn ready_fn;
static _Thread_local void *ready_ctx;

void fr_set_grad_ready_hook(fr_grad_ready_fn fn, void *ctx) {
    ready_fn = fn;
    ready_ctx = ctx;
}

fr_grad_ready_fn fr_get_grad_ready_hook(void **ctx) {
    if (ctx)
        *ctx = ready_ctx;
    return ready_fn;
}

typedef struct {
    int node;
    fr_tensor *leaf;
} ready_entry;

typedef struct {
    fr_grad_ready_fn fn;
    void *ctx;
    ready_entry *entries;
    int n;
} ready_list;

/* The node at tape index i if this backward (run id) reaches it, else NULL. */
static const fr_node *reached_at(int i, uint64_t id) {
    const fr_node *n = tape.nodes[i];
    return n && n->mark == id ? n : NULL;
}

static fr_status ready_plan(ready_list *r, uint64_t id) {
    *r = (ready_list){.fn = ready_fn, .ctx = ready_ctx};
    if (!r->fn)
        return FR_OK;
    size_t edges = 0, cap = 16;
    for (int i = 0; i < tape.len; i++) {
        const fr_node *n = reached_at(i, id);
        for (int j = 0; n && j < n->n_inputs; j++)
            edges += n->inputs[j].kind == FR_EDGE_LEAF;
    }
    if (!edges)
        return FR_OK;
    while (cap < 2 * edges)
        cap *= 2;
    const fr_tensor **seen = calloc(cap, sizeof *seen); /* open addressing on the pointer */
    r->entries = malloc(edges * sizeof *r->entries);
    if (!seen || !r->entries) {
        free(seen);
        free(r->entries);
        r->entries = NULL;
        return fr_error(FR_ERR_OOM, "backward: out of memory planning the gradient-ready calls");
    }
    for (int i = 0; i < tape.len; i++) {
        const fr_node *n = reached_at(i, id);
        for (int j = 0; n && j < n->n_inputs; j++) {
            if (n->inputs[j].kind != FR_EDGE_LEAF)
                continue;
            fr_tensor *leaf = n->inputs[j].leaf;
            size_t h = (size_t)(((uintptr_t)leaf >> 4) * 0x9E3779B97F4A7C15ull) & (cap - 1);
            while (seen[h] && seen[h] != leaf)
                h = (h + 1) & (cap - 1);
            if (seen[h])
                continue;
            seen[h] = leaf;
            r->entries[r->n++] = (ready_entry){.node = i, .leaf = leaf};
        }
    }
    free(seen);
    return FR_OK;
}

/* Reports the leaves whose last contributor is node `index` (just passed). */
static fr_status ready_fire(ready_list *r, int index) {
    fr_status st = FR_OK;
    while (st == FR_OK && r->n > 0 && r->entries[r->n - 1].node == index) {
        r->n--;
        st = r->fn(r->entries[r->n].leaf, r->ctx);
    }
    return st;
}

/* Marks every node reachable from root with id and checks that each edge on
 * the way still leads to a node on the tape. */
static fr_status mark_reachable(fr_node *root, uint64_t id) {
    fr_node **stack = malloc((size_t)(tape.live ? tape.live : 1) * sizeof *stack);
    if (!stack)
        return fr_error(FR_ERR_OOM, "backward: out of memory walking the graph");
    int top = 0;
    root->mark = id;
    stack[top++] = root;
    fr_status st = FR_OK;
    while (top > 0 && st == FR_OK) {
        fr_node *n = stack[--top];
        for (int i = 0; i < n->n_inputs; i++) {
            const fr_edge *e = &n->inputs[i];
            if (e->kind != FR_EDGE_NODE)
                continue;
            if (!node_alive(e->node, e->seq)) {
                st = fr_error(FR_ERR_GRAPH,
                              "backward: input %d of %s comes from %s, whose graph an earlier "
                              "backward (or fr_tape_clear) already freed; pass retain_graph to that "
                              "backward to run through it again",
                              i, n->op, e->op);
                break;
            }
            if (e->node->mark != id) {
                e->node->mark = id;
                stack[top++] = e->node; /* each node is pushed once: top <= live */
            }
        }
    }
    free(stack);
    return st;
}

static fr_status check_options(const fr_backward_options *o) {
    if (o->n_inputs < 0 || (o->n_inputs > 0 && !o->inputs))
        return fr_error(FR_ERR_ARG, "backward: %d inputs given with %s list", o->n_inputs,
                        o->inputs ? "a" : "no");
    for (int i = 0; i < o->n_inputs; i++) {
        const fr_tensor *t = o->inputs[i];
        if (!t || !is_leaf(t))
            return fr_error(FR_ERR_ARG, "backward: inputs[%d] is %s; inputs must be leaves that "
                            "require grad (parameters)", i,
                            !t ? "NULL" : t->requires_grad ? "not a leaf (an op made it)"
                                                           : "a tensor that does not require grad");
    }
    return FR_OK;
}

fr_status fr_backward_with_options(fr_tensor *out, fr_tensor *grad_out,
                                   const fr_backward_options *opts) {
    static const fr_backward_options defaults = {0};
    if (!opts)
        opts = &defaults;
    FR_TRY(fr_check_defined("backward", "output", out));
    FR_TRY(check_options(opts));
    if (!fr_has_grad_fn(out)) {
        if (out->requires_grad && out->grad_fn)
            return fr_error(FR_ERR_GRAPH, "backward: the output's graph (made by %s) was already "
                            "freed by an earlier backward or fr_tape_clear; pass retain_graph to "
                            "the first backward to run another", freed_op(out->grad_fn_gen));
        return fr_error(FR_ERR_GRAPH, out->requires_grad
                                          ? "backward: the output is a leaf; it has no graph"
                                          : "backward: the output does not require grad (no "
                                            "parameter reached it, or it was computed under no_grad)");
    }
    if (tape.running)
        return fr_error(FR_ERR_GRAPH, "backward: called from inside a backward on the same tape");
    fr_tensor *seed = grad_out ? fr_retain(grad_out) : NULL;
    if (!seed) {
        if (fr_numel(out) != 1) {
            char buf[96];
            return fr_error(FR_ERR_GRAPH, "backward: loss must have one element, got shape %s; "
                            "use fr_backward_with for other outputs",
                            fr_shape_str(out, buf, sizeof buf));
        }
        seed = fr_empty_like(out, FR_TAG_TRANSIENT);
        if (!seed)
            return fr_last_status();
        fr_status st = fr_fill_(seed, 1.0f);
        if (st != FR_OK) {
            fr_release(seed);
            return st;
        }
    } else if (fr_check_same_shape("backward", "output", out, "gradient", seed) != FR_OK) {
        fr_release(seed);
        return fr_last_status();
    }
    backward_run run = {.id = ++run_counter, .opts = *opts, .outer = running};
    fr_node *root = out->grad_fn;
    fr_status st = mark_reachable(root, run.id);
    if (st != FR_OK) {
        fr_release(seed);
        return st;
    }
    st = accumulate(&root->grads[out->grad_fn_out], seed);
    ready_list ready = {0};
    if (st == FR_OK)
        st = ready_plan(&ready, run.id);
    running = &run;
    tape.running++;
    /* Reverse creation order over the nodes this graph reached; the others
     * (other pending graphs) are not touched. Each node is freed right after
     * it ran, unless the graph is retained; after a failure the rest of the
     * graph is freed (or, retained, cleared of partial gradients). */
    for (int i = tape.len - 1; i >= 0; i--) {
        fr_node *n = tape.nodes[i];
        if (!n || n->mark != run.id)
            continue;
        bool reached = false;
        for (int o = 0; o < n->n_outputs; o++)
            reached |= n->grads[o] != NULL;
        if (reached && st == FR_OK)
            st = run_node(n);
        if (st == FR_OK)
            st = ready_fire(&ready, i);
        for (int o = 0; o < n->n_outputs; o++)
            fr_clear(&n->grads[o]);
        if (!opts->retain_graph)
            free_slot(i);
    }
    free(ready.entries);
    tape.running--;
    running = run.outer;
    compact_tape();
    return st;
}

fr_status fr_backward_with(fr_tensor *out, fr_tensor *grad_out) {
    FR_TRY(fr_check_defined("backward", "gradient", grad_out));
    return fr_backward_with_options(out, grad_out, NULL);
}

const fr_backward_options *fr_backward_running(void) { return running ? &running->opts : NULL; }

fr_status fr_backward(fr_tensor *loss) {
    FR_TRY(fr_check_defined("backward", "loss", loss));
    return fr_backward_with_options(loss, NULL, NULL);
}
