/* autograd.h: the tape, grad mode, autocast and backward: what a program
 * that trains calls. How an op records a node and saves tensors (the
 * extension tier, for op authors) is autograd/node.h; the description of
 * both is here.
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

#include "../tensor/shapes.h"
#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A node of the tape; its record and the API that makes one (for an op
 * author) are in autograd/node.h. */
typedef struct fr_node fr_node;

/* ---- grad mode ---- */
/* Nestable: while the depth is > 0 no node is recorded and nothing is saved. */
void fr_no_grad_enter(void);
void fr_no_grad_exit(void);
bool fr_grad_enabled(void);

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
 * for the replay, so the replay draws the same masks. fr_manual_seed seeds
 * this stream and compression's below (each from the seed, unrelated to
 * each other), so a seeded run repeats, compressed rounding included. */
void fr_manual_seed(uint64_t seed);
uint64_t fr_random_state(void);
void fr_set_random_state(uint64_t state);
/* Draws the next seed (advances the state). */
uint64_t fr_random_next_seed(void);

/* Compression's rounding stream (compress:B, autograd/compressed.c): one
 * seed per packed tensor, from a per-thread generator of its own, so that
 * compressing never moves the stream above and a model with dropout keeps
 * plain's masks and loss. A checkpoint draws one seed from it for its
 * replay, which runs on a stream of that seed (autograd/fn_checkpoint.c).
 * Saved and put back beside fr_random_state by whatever must leave a step
 * unchanged (the planner's trials). */
uint64_t fr_compress_random_state(void);
void fr_set_compress_random_state(uint64_t state);
uint64_t fr_compress_next_seed(void);

/* ---- leaves ---- */
/* Marks a leaf as wanting a gradient (parameters). */
void fr_set_requires_grad(fr_tensor *t, bool on);
/* True for a tensor that needs grad and whose producer is on the live tape. */
bool fr_has_grad_fn(const fr_tensor *t);
/* Drops the leaf's accumulated gradient (frees it). */
void fr_zero_grad(fr_tensor *t);
/* A view of t that is cut off from the tape. */
fr_tensor *fr_detach(fr_tensor *t);

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
