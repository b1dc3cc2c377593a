/* fn_concat.c: differentiable concat along channels. Backward needs no
 * saved tensor, only each input's channel count: input i's gradient is its
 * slice of dout, copied out for the inputs that want one.
 *
 * fr_concat_recomputable also attaches a recipe to its output that
 * concatenates the inputs again. An op that saves the output (BN) then keeps
 * the recipe, i.e. references to the inputs, instead of a copy of their
 * bytes: memory-efficient DenseNet, where every layer reads the
 * concatenation of all earlier features, which are kept anyway. Under
 * compress:B an activation input is kept as its B-bit codes instead
 * (fr_compressed_of, shared with every other op saving the same feature), so
 * what the recipes of a dense block hold shrinks like any saved tensor
 * (docs/ARCHITECTURE.md, "Saved tensors: held, recipe or compressed"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"

typedef struct {
    int count;
    int64_t channels[]; /* of each input */
} concat_ctx;

/* The gradient input i's slice would be added into, when tape.c's
 * accumulate would add it in place (fr_axpy_): a producer's gradient already
 * there, f32, contiguous and held by nobody else (fr_grad_held_alone, the
 * tape's own test). NULL otherwise. */
static fr_tensor *owned_grad(const fr_node *node, int i, fr_dtype dtype) {
    const fr_edge *e = &node->inputs[i];
    if (e->kind != FR_EDGE_NODE || !e->node || e->node->seq != e->seq || dtype != FR_F32)
        return NULL;
    fr_tensor *cur = e->node->grads[e->output];
    bool owned = cur && fr_grad_held_alone(cur) && cur->dtype == FR_F32 && fr_is_contiguous(cur);
    return owned ? cur : NULL;
}

/* Input i's gradient is its slice of dout. When its producer already holds
 * a gradient (in a dense block, every feature after its first consumer in
 * the backward walk), the slice is added into that gradient here, straight
 * from dout, and din[i] stays NULL: the tape would otherwise get a copy of
 * the slice only to add it and free it, O(L^2) copied bytes per block
 * (docs/ARCHITECTURE.md, "Smaller decisions"). Otherwise the slice is copied out
 * into a new tensor for the tape to take, as before. */
static fr_status concat_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const concat_ctx *c = node->ctx;
    fr_tensor *g = dout[0]; // (N, sum Ci, ...)
    int64_t shape[FR_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++)
        shape[d] = g->shape[d];
    int64_t c0 = 0;
    for (int i = 0; i < c->count; i++) {
        int64_t ci = c->channels[i];
        if (fr_node_needs_grad(node, i)) {
            shape[1] = ci;
            fr_tensor *slice = fr_narrow(g, 1, c0, ci);
            fr_tensor *into = slice ? owned_grad(node, i, g->dtype) : NULL;
            fr_status st;
            if (into) {
                st = fr_concat_backward_add(into, slice);
            } else {
                din[i] = slice ? fr_empty(node->device, g->dtype, g->ndim, shape, FR_TAG_TRANSIENT)
                               : NULL;
                st = din[i] ? fr_concat_backward(&din[i], 1, slice) : fr_last_status();
            }
            fr_release(slice);
            FR_TRY(st);
        }
        c0 += ci;
    }
    return FR_OK;
}

/* ---- the recipe: the inputs (references) and their versions ---- */

typedef struct {
    fr_recipe base;
    int count;
    int ndim;
    int64_t shape[FR_MAX_DIMS]; /* of the output */
    uint64_t *versions;         /* of each input's storage when recorded */
    fr_recipe **packed;         /* per input: its codes (inputs[i] NULL), or NULL */
    fr_tensor *memo;            /* the last rebuild, for the next make (see make) */
    fr_tensor *inputs[];
} concat_recipe;

/* The first input's codes decoded into the concatenation's own buffer: a
 * checkpointed dense segment's first input is every feature before it, so
 * its decoding beside the concatenation held the whole twice (DenseNet-BC-100
 * b64 checkpoint+compress:8 total 424.5 -> 460.2 MiB once a dense layer's
 * norm kept the recipe; 415.2 with this). Decoded contiguously at the buffer's start, then
 * each image's block moved to its place, the last image first (a block's
 * place is at or after where it was decoded, and after every block not yet
 * moved). The CPU only (a serial memmove); *c0: its channels, 0 when it
 * did not apply (*y then stays NULL). */
static fr_status first_in_place(const concat_recipe *r, fr_tensor **y, int64_t *c0) {
    const fr_recipe *codes = r->packed[0];
    fr_device dev;
    int64_t ch = fr_compressed_dim1(codes, &dev), n = r->shape[0], ct = r->shape[1];
    *y = NULL;
    *c0 = 0;
    if (!ch || dev != FR_CPU || n < 1)
        return FR_OK;
    fr_tensor *out = fr_empty(FR_CPU, FR_F32, r->ndim, r->shape, FR_TAG_TRANSIENT);
    if (!out)
        return fr_last_status();
    int64_t inner = fr_numel(out) / (n * ct), blk0 = ch * inner, blk = ct * inner;
    fr_tensor *flat = fr_view(out, 1, (int64_t[]){fr_numel(out)});
    fr_tensor *head = flat ? fr_narrow(flat, 0, 0, n * blk0) : NULL;
    fr_status st = head ? fr_compressed_decode_into(codes, head) : fr_last_status();
    fr_release(head);
    fr_release(flat);
    if (st != FR_OK) {
        fr_release(out);
        return st;
    }
    float *p = fr_data_f32(out);
    for (int64_t i = n - 1; i > 0; i--)
        memmove(p + i * blk, p + i * blk0, (size_t)blk0 * sizeof *p);
    *y = out;
    *c0 = ch;
    return FR_OK;
}

/* The concatenation made again: held inputs in one pass; under compress:B
 * each input decoded, copied into its channels and freed before the next
 * is decoded, so a rebuild holds the concatenation and one input's decoding
 * (all of them decoded first had held it twice: DenseNet-BC-40 b16
 * checkpoint:2+compress:8, total peak +9.9% once a dense layer's norm kept
 * the recipe rather than the concatenation's own codes). */
static fr_tensor *concat_rebuild(const concat_recipe *r) {
    bool any_packed = false;
    for (int i = 0; i < r->count; i++)
        any_packed |= !r->inputs[i];
    fr_tensor *y = NULL;
    if (!any_packed) {
        const fr_tensor *first = r->inputs[0];
        y = fr_empty(fr_device_of(first), first->dtype, r->ndim, r->shape, FR_TAG_TRANSIENT);
        if (y && fr_concat_forward(y, r->inputs, r->count) != FR_OK)
            fr_clear(&y);
        return y;
    }
    int64_t c0 = 0; /* the channels placed so far */
    if (!r->inputs[0] && first_in_place(r, &y, &c0) != FR_OK)
        return NULL;
    for (int i = c0 > 0 ? 1 : 0; i < r->count; i++) {
        fr_tensor *t = r->inputs[i] ? fr_retain(r->inputs[i]) : r->packed[i]->make(r->packed[i]);
        if (t && !y)
            y = fr_empty(fr_device_of(t), t->dtype, r->ndim, r->shape, FR_TAG_TRANSIENT);
        fr_tensor *dst = t && y ? fr_narrow(y, 1, c0, t->shape[1]) : NULL;
        bool ok = dst && fr_concat_forward(dst, &t, 1) == FR_OK;
        c0 += t ? t->shape[1] : 0;
        fr_release(dst);
        fr_release(t);
        if (!ok) {
            fr_clear(&y);
            break;
        }
    }
    return y;
}

static fr_tensor *concat_recipe_make(fr_recipe *self) {
    concat_recipe *r = (concat_recipe *)self;
    for (int i = 0; i < r->count; i++) {
        if (!r->inputs[i])
            continue; /* codes: a snapshot, no version to check */
        const fr_storage *s = r->inputs[i]->storage;
        if (s->version != r->versions[i]) {
            fr_error(FR_ERR_VERSION,
                     "concat recompute: input %d was modified inplace by %s after the forward "
                     "(recorded at version %llu, now %llu)",
                     i, s->last_writer ? s->last_writer : "an inplace op",
                     (unsigned long long)r->versions[i], (unsigned long long)s->version);
            return NULL;
        }
    }
    /* The rebuild a holder asked for while another still held the recipe
     * goes to that other one's make: in a memory-efficient dense layer the
     * conv's weight gradient rebuilds BN+ReLU's output from the
     * concatenation, then BN's backward reads the concatenation itself:
     * one copy of every feature instead of two (DenseNet-BC-100's memmove
     * a third lower under recompute, bench/RESULTS.md, issue 24, dn24).
     * The price: BN+ReLU's output is no longer rebuilt over the
     * concatenation, so the conv's output gradient is held beside both
     * (its recompute peak +3.2%). */
    if (r->memo) {
        fr_tensor *y = r->memo;
        r->memo = NULL;
        return y;
    }
    fr_tensor *y = concat_rebuild(r);
    if (y && self->refcount > 1)
        r->memo = fr_retain(y);
    return y;
}

static void concat_recipe_destroy(fr_recipe *self) {
    concat_recipe *r = (concat_recipe *)self;
    fr_release(r->memo);
    for (int i = 0; i < r->count; i++) {
        if (r->packed[i])
            fr_recipe_release(r->packed[i]);
        if (!r->inputs[i]) /* codes, or not reached when building failed */
            continue;
        fr_storage_unmark_saved(r->inputs[i]->storage);
        fr_release(r->inputs[i]);
    }
    free(r->packed);
    free(r->versions);
    free(r);
}

/* The inputs are what backward will need to rebuild y, so while the recipe
 * lives they count as saved in the ledger (the tape's own saves do the
 * same); an input several recipes hold is counted once. */
static fr_recipe *concat_recipe_new(fr_tensor *const *inputs, int count, const fr_tensor *y) {
    concat_recipe *r = calloc(1, sizeof *r + (size_t)count * sizeof r->inputs[0]);
    uint64_t *versions = r ? malloc((size_t)count * sizeof *versions) : NULL;
    fr_recipe **packed = versions ? calloc((size_t)count, sizeof *packed) : NULL;
    if (!packed) {
        free(versions);
        free(r);
        fr_error(FR_ERR_OOM, "concat: out of memory building a recipe");
        return NULL;
    }
    r->base = (fr_recipe){.refcount = 1, .op = "concat", .make = concat_recipe_make,
                          .destroy = concat_recipe_destroy};
    r->count = count;
    r->ndim = y->ndim;
    for (int d = 0; d < y->ndim; d++)
        r->shape[d] = y->shape[d];
    r->versions = versions;
    r->packed = packed;
    for (int i = 0; i < count; i++) {
        if (fr_compressed_of(inputs[i], &packed[i]) != FR_OK) {
            concat_recipe_destroy(&r->base);
            return NULL;
        }
        if (packed[i])
            continue;
        r->inputs[i] = fr_retain(inputs[i]);
        r->versions[i] = inputs[i]->storage->version;
        fr_storage_mark_saved(inputs[i]->storage);
    }
    return &r->base;
}

static fr_tensor *concat(fr_tensor *const *inputs, int count, bool recomputable) {
    char arg[32];
    if (!inputs || count < 1) {
        fr_error(FR_ERR_ARG, "concat: needs at least one input, got %d", inputs ? count : 0);
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (fr_check_defined("concat", arg, inputs[i]) != FR_OK)
            return NULL;
        if (inputs[i]->ndim < 2) {
            char buf[96];
            fr_error(FR_ERR_SHAPE, "concat: %s has shape %s, expected (N, C, ...)", arg,
                     fr_shape_str(inputs[i], buf, sizeof buf));
            return NULL;
        }
    }
    int64_t shape[FR_MAX_DIMS];
    const fr_tensor *first = inputs[0];
    for (int d = 0; d < first->ndim; d++)
        shape[d] = first->shape[d];
    shape[1] = 0;
    for (int i = 0; i < count; i++)
        shape[1] += inputs[i]->shape[1];
    fr_tensor *y = fr_empty(fr_device_of(first), first->dtype, first->ndim, shape, FR_TAG_TRANSIENT);
    if (!y || fr_concat_forward(y, inputs, count) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    if (fr_should_record(count, inputs)) {
        concat_ctx *c = malloc(sizeof *c + (size_t)count * sizeof c->channels[0]);
        fr_node *node = c ? fr_node_new("concat", concat_backward, count, inputs, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "concat: out of memory");
            free(c);
            fr_release(y);
            return NULL;
        }
        c->count = count;
        for (int i = 0; i < count; i++)
            c->channels[i] = inputs[i]->shape[1];
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
        /* Only a recorded output can be saved by a later op: under no_grad
         * the recipe would buy nothing. */
        if (recomputable) {
            fr_recipe *r = concat_recipe_new(inputs, count, y);
            if (!r) {
                fr_release(y);
                return NULL;
            }
            fr_set_recipe(y, r);
        }
    }
    return y;
}

fr_tensor *fr_concat(fr_tensor *const *inputs, int count) { return concat(inputs, count, false); }

fr_tensor *fr_concat_recomputable(fr_tensor *const *inputs, int count) {
    return concat(inputs, count, true);
}

/* ---- slice: one range of dim 0 or 1, concat's inverse ----
 * A copy, not a view (fr_narrow's view carries no gradient, tensor.h): its
 * backward writes dout into zeros of x's shape, at the range. */

typedef struct {
    int dim, ndim;
    int64_t start;
    int64_t shape[FR_MAX_DIMS]; /* of x */
} slice_ctx;

/* src into dst of the same shape, where one of them is a range of dim
 * `dim` of a contiguous tensor: contiguous for dim 0, a channel slice for
 * dim 1 (concat's kernel, which takes such slices on either side). */
static fr_status copy_range(fr_tensor *dst, fr_tensor *src, int dim) {
    return dim == 0 ? fr_copy_(dst, src) : fr_concat_forward(dst, &src, 1);
}

static fr_status slice_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const slice_ctx *c = node->ctx;
    fr_tensor *g = fr_zeros(node->device, dout[0]->dtype, c->ndim, c->shape, FR_TAG_TRANSIENT);
    fr_tensor *at = g ? fr_narrow(g, c->dim, c->start, dout[0]->shape[c->dim]) : NULL;
    fr_tensor *d = at ? fr_contiguous(dout[0], FR_TAG_TRANSIENT) : NULL;
    fr_status st = d ? copy_range(at, d, c->dim) : fr_last_status();
    fr_release(d);
    fr_release(at);
    if (st != FR_OK) {
        fr_release(g);
        return st;
    }
    din[0] = g;
    return FR_OK;
}

fr_tensor *fr_slice(fr_tensor *x, int dim, int64_t start, int64_t length) {
    if (fr_check_defined("slice", "x", x) != FR_OK)
        return NULL;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *range = cx ? fr_narrow(cx, dim, start, length) : NULL;
    fr_release(cx);
    if (!range)
        return NULL;
    fr_tensor *y = fr_empty(fr_device_of(x), x->dtype, range->ndim, range->shape, FR_TAG_TRANSIENT);
    fr_status st = y ? copy_range(y, range, dim) : fr_last_status();
    fr_release(range);
    if (st != FR_OK) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[1] = {x};
    if (fr_should_record(1, in)) {
        slice_ctx *c = calloc(1, sizeof *c);
        fr_node *node = c ? fr_node_new("slice", slice_backward, 1, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "slice: out of memory");
            free(c);
            fr_release(y);
            return NULL;
        }
        *c = (slice_ctx){.dim = dim, .ndim = x->ndim, .start = start};
        for (int d = 0; d < x->ndim; d++)
            c->shape[d] = x->shape[d];
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
    }
    return y;
}
