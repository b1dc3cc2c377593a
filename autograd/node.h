/* node.h: writing a differentiable op or a memory strategy (the extension
 * tier, <frugal/ext.h>): the tape's node record, its edges and saved
 * tensors, how an op records a node and saves what its backward needs, and
 * the recomputation mode. How the tape runs them is described in
 * autograd/autograd.h; autograd/fn_<family>.c are the examples. */
#ifndef FR_NODE_H
#define FR_NODE_H

#include "../tensor/ops.h"
#include "autograd.h"

#ifdef __cplusplus
extern "C" {
#endif


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

/* Recomputation mode (nestable): set while backward re-runs forward code
 * (checkpointed segments). Ops that update state in forward — BN running
 * statistics — skip the update then, so a step updates them exactly once. */
void fr_recompute_enter(void);
void fr_recompute_exit(void);
bool fr_in_recompute(void);

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
/* Whether fr_node_save_activation would keep t as codes now (compression
 * on, t an f32 activation it applies to). */
bool fr_compress_would_pack(const fr_tensor *t);
/* A sign mask of t as fr_node_save_sign keeps it under compression (a new
 * reference in *out; NULL when compression is off or does not apply). */
fr_status fr_sign_mask_of(fr_tensor *t, fr_recipe **out);
/* Bytes of sign masks packed on this thread so far (what a checkpointed
 * step's forward keeps for its replay: nn/segments.c measures it). */
size_t fr_sign_bytes_packed(void);
/* When saved entry i is a sign mask kept as bits (fr_node_save_sign under
 * compression) packed from a tensor whose storage order dy shares (both
 * contiguous or both channels last), a new reference to its u8 bits
 * (kernels.def: sign_pack's layout; fr_sign_act_backward reads them), else
 * NULL, no error: unpack it. */
fr_tensor *fr_node_sign_bits(fr_node *node, int i, const fr_tensor *dy);
/* The compressed copy of t (a new reference) in *out, or NULL when
 * compression is off or does not apply to t. */
fr_status fr_compressed_of(fr_tensor *t, fr_recipe **out);
/* Dimension 1 of the tensor that r holds as codes (and in *dev its
 * device), when r is such a copy (fr_compressed_of's, not a sign mask) of a
 * contiguous tensor of at least 2 dimensions; else 0. With it, fr_compressed_decode_into decodes r into
 * dst (contiguous f32 on r's device, the packed tensor's element count, any
 * shape): FR_ERR_ARG when r is not such a copy or dst does not match. For
 * a rebuild that decodes into part of its own output (fn_concat.c). */
int64_t fr_compressed_dim1(const fr_recipe *r, fr_device *dev);
fr_status fr_compressed_decode_into(const fr_recipe *r, fr_tensor *dst);
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
/* The same for an op whose backward is one gradient kernel: dx (x's dtype
 * and shape, allocated for it) from dy (dout made contiguous), the tensor
 * the op saved (NULL when save was NULL) and the op's ctx bytes. The node's
 * backward unpacks, allocates, calls grad and releases (record.c), so the
 * op writes only the kernel call. */
typedef fr_status (*fr_unary_grad_fn)(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *saved,
                                      const void *ctx);
fr_status fr_record_unary_grad(const char *op, fr_unary_grad_fn grad, fr_tensor *x, fr_tensor *y,
                               const void *ctx, size_t ctx_size, fr_tensor *save);
/* Whether the tape adds a further gradient into g in place (tape.c): no
 * other tensor or view holds it. A backward that adds into a producer's
 * gradient itself (fn_concat.c) asks the same question. */
bool fr_grad_held_alone(const fr_tensor *g);
/* FR_OK when an op named `op` may write over x while the tape records
 * (autograd/tape.c says when it may not), else FR_ERR_ARG naming op. */
fr_status fr_check_inplace(const char *op, const fr_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
