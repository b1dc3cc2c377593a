/* autograd.h: the tape, its nodes, saved tensors, grad mode and backward.
 *
 * Define-by-run: a differentiable op (autograd/fn_*.c) computes its output
 * with tensor/ops.h and, when fr_should_record() says so, appends a node to
 * the tape: which inputs gradients flow to (edges), what it saved, and its
 * backward function. fr_backward(loss) walks, in reverse creation order, the
 * nodes reachable from the loss (its graph) and no others; as soon as a node
 * has run, its saved tensors and the gradients of its outputs are released
 * and the node leaves the tape, so memory falls during backward instead of
 * at its end. Other graphs pending on the same tape (a second model, a
 * second loss) keep their nodes and saved tensors. Gradients accumulate into
 * .grad of leaves (tagged FR_TAG_GRAD). See docs/ARCHITECTURE.md, "Graphs on
 * the tape".
 *
 * Saved tensors have two forms. HELD: a reference plus the storage version
 * seen at save time; unpacking a tensor whose storage was written inplace
 * since then fails with FR_ERR_VERSION naming the saving op and the writer.
 * RECIPE: an fr_recipe (tensor.h) that recomputes the tensor in backward
 * from what the recipe itself keeps, so the tensor need not stay alive.
 * fr_node_save picks the form: a tensor that carries a recipe (an op under a
 * recompute strategy attached one) is saved as its recipe, anything else is
 * held. The engine treats both alike: fr_node_unpack returns a reference the
 * backward function releases when done; recomputation runs under no_grad.
 *
 * Ownership: the tape owns its nodes. Every node has a sequence number,
 * unique in the process; a tensor records its producer's (grad_fn_gen) and
 * an edge its input's, and either is valid only while a node with that
 * number is on the current tape: a backward that consumed it, or
 * fr_tape_clear, removes it. A graph nobody runs backward on stays on the
 * tape until fr_tape_clear.
 *
 * One tape per thread (the tape and grad mode are thread-local). */
#ifndef FR_AUTOGRAD_H
#define FR_AUTOGRAD_H

#include "../tensor/ops.h"
#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_node fr_node;

/* dout[i]: gradient of output i (never NULL: an output that received no
 * gradient gets zeros when another output did). din[j]: the function sets a
 * NEW reference for every input j with fr_node_needs_grad(node, j) and may
 * leave others NULL. dout tensors may be shared with other consumers: a
 * backward may write into dout[i] (to reuse it as a din) only when both
 * dout[i]->refcount and dout[i]->storage->refcount are 1. The same tensor
 * (or a view of dout) may be returned for several inputs; the engine copies
 * before it accumulates into shared bytes. */
typedef fr_status (*fr_backward_fn)(fr_node *node, fr_tensor *const *dout, fr_tensor **din);

typedef enum { FR_EDGE_NONE = 0, FR_EDGE_LEAF, FR_EDGE_NODE } fr_edge_kind;
typedef struct {
    fr_edge_kind kind;
    fr_tensor *leaf;     /* FR_EDGE_LEAF: the leaf (a reference) */
    fr_node *node;       /* FR_EDGE_NODE: the producer, valid while a node */
    uint64_t seq;        /*   with this sequence number is on the tape */
    const char *op;      /* the producer's op, for errors once it is freed */
    int output;          /* which output of the producer */
} fr_edge;

typedef struct {
    fr_tensor *held;          /* held form; NULL for a recipe */
    uint64_t version;         /* storage version when saved */
    fr_recipe *recipe;        /* recipe form (a reference) */
} fr_saved;

struct fr_node {
    const char *op;           /* "conv2d": named in errors */
    fr_backward_fn backward;
    void *ctx;                /* op parameters and small state */
    void (*ctx_free)(void *ctx);
    int n_inputs;
    fr_edge *inputs;
    int n_outputs;
    fr_tensor **grads;        /* accumulated gradient per output */
    int64_t (*out_shapes)[FR_MAX_DIMS];
    int *out_ndims;
    fr_dtype *out_dtypes;     /* a missing output gradient is zeros of this dtype */
    fr_device device;
    int n_saved, cap_saved;
    fr_saved *saved;
    uint64_t seq;             /* creation order; unique in the process */
    uint64_t mark;            /* id of the last backward that reached it */
};

/* ---- grad mode ---- */
/* Nestable: while the depth is > 0 no node is recorded and nothing is saved. */
void fr_no_grad_enter(void);
void fr_no_grad_exit(void);
bool fr_grad_enabled(void);

/* Recomputation mode (nestable): set while backward re-runs forward code
 * (checkpointed segments). Ops that update state in forward — BN running
 * statistics — skip the update then, so a step updates them exactly once. */
void fr_recompute_enter(void);
void fr_recompute_exit(void);
bool fr_in_recompute(void);

/* Autocast (nestable, per thread): while a half dtype is entered, ops that
 * create activations from weights (conv2d, linear) produce that dtype, and
 * every op downstream follows its input's dtype, so a whole network runs in
 * f16 / bf16 without its code changing. Weights stay f32 (master weights)
 * and are cast to the half dtype on the fly inside those ops. Entering FR_F32
 * switches it off for the nested region. FR_ERR_DTYPE for another dtype,
 * FR_ERR_ARG past 16 levels. Checkpointed segments record the dtype and
 * replay under it. */
fr_status fr_autocast_enter(fr_dtype dtype);
void fr_autocast_exit(void);
/* FR_F32 when off. */
fr_dtype fr_autocast_dtype(void);

/* The random stream of random ops (dropout): each call draws one 64-bit seed
 * from this per-thread generator, and the op's mask is a function of that
 * seed. Checkpointing records the state before a segment and restores it
 * for the replay, so the replay draws the same masks. */
void fr_manual_seed(uint64_t seed);
uint64_t fr_random_state(void);
void fr_set_random_state(uint64_t state);
/* Draws the next seed (advances the state). */
uint64_t fr_random_next_seed(void);

/* ---- leaves ---- */
/* Marks a leaf as wanting a gradient (parameters). */
void fr_set_requires_grad(fr_tensor *t, bool on);
/* True for a tensor that needs grad and whose producer is on the live tape. */
bool fr_has_grad_fn(const fr_tensor *t);
/* Drops the leaf's accumulated gradient (frees it). */
void fr_zero_grad(fr_tensor *t);
/* A view of t that is cut off from the tape. */
fr_tensor *fr_detach(fr_tensor *t);

/* ---- writing a differentiable op ---- */
/* Whether an op with these inputs (NULL entries ignored) must record. */
bool fr_should_record(int n, fr_tensor *const *inputs);
/* Appends a node. Input edges are taken from the inputs' current state, so an
 * inplace op must call this before rebinding its output. Returns NULL with
 * FR_ERR_GRAPH when an input comes from a graph that backward already freed. */
fr_node *fr_node_new(const char *op, fr_backward_fn backward, int n_inputs,
                     fr_tensor *const *inputs, int n_outputs);
/* Makes `t` output `index` of the node (sets grad_fn, requires_grad). */
void fr_node_set_output(fr_node *node, int index, fr_tensor *t);
/* Takes ownership of ctx; ctx_free (may be NULL for plain free) runs when the
 * node is freed. */
void fr_node_set_ctx(fr_node *node, void *ctx, void (*ctx_free)(void *));
bool fr_node_needs_grad(const fr_node *node, int input);
/* Saves t: as its recipe when it carries one, else held. Returns the index
 * or -1 with an error. */
int fr_node_save(fr_node *node, fr_tensor *t);
/* Saves t held even if it carries a recipe (for ops whose own recipe is
 * built from t). */
int fr_node_save_held(fr_node *node, fr_tensor *t);
/* Saves a recipe directly (takes the caller's reference). */
int fr_node_save_recipe(fr_node *node, fr_recipe *r);
/* ---- compressed saved activations (autograd/compressed.c; the strategy
 * compress:B) ----
 * While bits (8, 4 or 2; 0: off) are entered on this thread, the save
 * functions below keep an activation as bits-wide codes per group of
 * FR_COMPRESS_GROUP elements with stochastic rounding (tensor/kernels.def),
 * or a sign as one bit, under FR_TAG_SAVED; unpacking decodes to a new f32
 * tensor. Only tensors the forward made (storage home `transient`) are
 * compressed; parameters and input batches are held. A f16 / bf16
 * activation is FR_ERR_DTYPE. enter stores the bits in force before in
 * *previous, for fr_compress_restore; FR_ERR_ARG for other bits. */
fr_status fr_compress_enter(int bits, int *previous);
void fr_compress_restore(int previous);
int fr_compress_bits(void);
/* Saves an activation that backward reads by value: as t's recipe when
 * use_recipe and t carries one, else compressed when compression is on and
 * applies, else held. A tensor two ops save is packed once (the copy is kept
 * on t while its storage version stays). */
int fr_node_save_activation(fr_node *node, fr_tensor *t, bool use_recipe);
/* Saves a tensor of which backward reads only whether each element is > 0
 * (the output of ReLU or leaky ReLU): one bit per element when compression
 * is on and applies (unpacked as 1 or 0), else as fr_node_save. */
int fr_node_save_sign(fr_node *node, fr_tensor *t);
/* The compressed copy of t (a new reference) in *out, or NULL when
 * compression is off or does not apply to t. */
fr_status fr_compressed_of(fr_tensor *t, fr_recipe **out);
/* A new reference to saved tensor i (recomputed for a recipe), or NULL with
 * FR_ERR_VERSION when a held tensor was written inplace after saving. */
fr_tensor *fr_node_unpack(fr_node *node, int i);
/* Releases saved entry i early (after its last use in backward). */
void fr_node_drop_saved(fr_node *node, int i);
/* The common case of one input x and one output y (record.c): when an op
 * must record, a node `op` whose ctx is a malloc'd copy of the ctx_size
 * bytes at ctx (none when 0), which saves `save` (fr_node_save; NULL for
 * nothing) and outputs y. FR_OK when nothing records. */
fr_status fr_record_unary(const char *op, fr_backward_fn backward, fr_tensor *x, fr_tensor *y,
                          const void *ctx, size_t ctx_size, fr_tensor *save);

/* ---- the tape ---- */
/* Runs backward from a one-element tensor, seeding its gradient with 1. */
fr_status fr_backward(fr_tensor *loss);
/* Runs backward from `out` with the given gradient (same shape). */
fr_status fr_backward_with(fr_tensor *out, fr_tensor *grad_out);

typedef struct {
    /* Keep the nodes this backward walks, and what they saved, so another
     * backward can run through them (a trunk shared by two losses). Without
     * it they are freed as they run, and a later backward that reaches them
     * fails with FR_ERR_GRAPH naming the op. */
    bool retain_graph;
    /* n_inputs > 0: only these leaves (they must require grad and have no
     * producer) receive gradients; ops skip the gradients of other leaves.
     * The list is borrowed for the call. A generator step passes the
     * generator's parameters, so the discriminator's .grad stay as they are. */
    int n_inputs;
    fr_tensor *const *inputs;
} fr_backward_options;

/* fr_backward / fr_backward_with with options (NULL: the defaults, all
 * zero). grad_out NULL seeds a one-element output with 1. */
fr_status fr_backward_with_options(fr_tensor *out, fr_tensor *grad_out,
                                   const fr_backward_options *opts);
/* The options of the backward running now on this thread (the innermost),
 * or NULL: a checkpointed segment's replay passes its inputs on. */
const fr_backward_options *fr_backward_running(void);
/* Frees every node on this thread's tape (every pending graph) and what
 * they saved. */
void fr_tape_clear(void);
/* Nodes on the tape now (all pending graphs). */
int fr_tape_size(void);
/* Sets the current tape (with every graph pending on it) aside and starts an
 * empty one; fr_tape_pop frees the inner tape and restores the outer one.
 * Checkpointing uses this to re-run a segment during backward. */
fr_status fr_tape_push(void);
void fr_tape_pop(void);

/* ---- gradient-ready hook (data parallelism: dist/) ----
 * When set (per thread; NULL clears it), backward calls fn(leaf, ctx) once
 * for every leaf that a node of the tape being backpropagated has an edge
 * to, as soon as the leaf's .grad holds everything this backward adds to it:
 * right after the lowest-indexed node with an edge to the leaf has run (or
 * been passed over as unreached), before that node is freed. leaf->grad may
 * be NULL then (no gradient reached it). A nested tape (a checkpointed
 * segment replayed in backward) reports its own leaves when its own
 * backward finishes with them. An error from fn stops backward with that
 * status. */
typedef fr_status (*fr_grad_ready_fn)(fr_tensor *leaf, void *ctx);
void fr_set_grad_ready_hook(fr_grad_ready_fn fn, void *ctx);
/* The hook set now (NULL for none) and its ctx: a trial backward that must
 * not all-reduce sets it aside (nn/segments.c). */
fr_grad_ready_fn fr_get_grad_ready_hook(void **ctx);

#ifdef __cplusplus
}
#endif
#endif
