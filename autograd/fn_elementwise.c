/* fn_elementwise.c: differentiable add, mul, scale, sum, mean and views. */
#include <stdlib.h>

#include "functions.h"
#include "node.h"

/* A transient tensor shaped like `like`, or NULL. */
static fr_tensor *new_like(const fr_tensor *like) { return fr_empty_like(like, FR_TAG_TRANSIENT); }

/* Shapes that differ go to the broadcasting ops (fn_broadcast.c). */
static bool same_shape(const fr_tensor *a, const fr_tensor *b) {
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* a's shape in the dtype of a op b (fr_binary_dtype: the broadcasting
 * ops' rule, so a result's dtype never depends on whether shapes differ) */
static fr_tensor *promoted_like(const fr_tensor *a, const fr_tensor *b) {
    /* two channels-last tensors (a model's residual sum) give one */
    if (fr_same_dense_layout(a, b))
        return fr_empty_like(a, FR_TAG_TRANSIENT);
    return fr_empty(fr_device_of(a), fr_binary_dtype(a, b), a->ndim, a->shape, FR_TAG_TRANSIENT);
}

/* ---- add ---- */

static fr_status add_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    /* Both inputs receive dout itself; the engine copies before it sums into
     * shared bytes. */
    for (int i = 0; i < 2; i++)
        if (fr_node_needs_grad(node, i))
            din[i] = fr_retain(dout[0]);
    return FR_OK;
}

fr_tensor *fr_add(fr_tensor *a, fr_tensor *b) {
    if (fr_check_defined("add", "a", a) != FR_OK || fr_check_defined("add", "b", b) != FR_OK)
        return NULL;
    if (!same_shape(a, b))
        return fr_broadcast_op(FR_BINARY_ADD, a, b);
    fr_tensor *y = promoted_like(a, b);
    if (!y || fr_add_out(y, a, b) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[2] = {a, b};
    if (fr_should_record(2, in)) {
        fr_node *node = fr_node_new("add", add_backward, 2, in, 1);
        if (!node) {
            fr_release(y);
            return NULL;
        }
        fr_node_set_output(node, 0, y);
    }
    return y;
}

fr_tensor *fr_add_(fr_tensor *a, fr_tensor *b) {
    if (fr_check_inplace("add_", a) != FR_OK || fr_check_defined("add_", "b", b) != FR_OK)
        return NULL;
    fr_tensor *in[2] = {a, b};
    fr_node *node = NULL;
    /* The node is made before the write so its edge points at a's old
     * producer; then a is rebound to the node. */
    if (fr_should_record(2, in) && !(node = fr_node_new("add_", add_backward, 2, in, 1)))
        return NULL;
    if (fr_add_out(a, a, b) != FR_OK)
        return NULL; /* the node stays on the tape; nothing refers to it */
    fr_bump_version(a, "add_");
    if (node)
        fr_node_set_output(node, 0, a);
    return fr_retain(a);
}

/* ---- mul ---- */

/* Each input's gradient needs the other input; only those are kept. */
typedef struct {
    int saved_other[2]; /* saved index of the tensor input i's gradient needs */
} mul_ctx;

static fr_status mul_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const mul_ctx *c = node->ctx;
    for (int i = 0; i < 2; i++) {
        if (!fr_node_needs_grad(node, i))
            continue;
        fr_tensor *other = fr_node_unpack(node, c->saved_other[i]);
        if (!other)
            return fr_last_status();
        din[i] = new_like(dout[0]);
        fr_status st = din[i] ? fr_mul_out(din[i], dout[0], other) : fr_last_status();
        fr_release(other);
        FR_TRY(st);
    }
    return FR_OK;
}

fr_tensor *fr_mul(fr_tensor *a, fr_tensor *b) {
    if (fr_check_defined("mul", "a", a) != FR_OK || fr_check_defined("mul", "b", b) != FR_OK)
        return NULL;
    if (!same_shape(a, b))
        return fr_broadcast_op(FR_BINARY_MUL, a, b);
    fr_tensor *y = promoted_like(a, b);
    if (!y || fr_mul_out(y, a, b) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[2] = {a, b};
    if (fr_should_record(2, in)) {
        mul_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new("mul", mul_backward, 2, in, 1) : NULL;
        bool ok = node != NULL;
        if (node) {
            fr_node_set_ctx(node, c, NULL);
            c->saved_other[0] = c->saved_other[1] = -1;
            for (int i = 0; ok && i < 2; i++)
                if (fr_node_needs_grad(node, i))
                    ok = (c->saved_other[i] = fr_node_save(node, in[1 - i])) >= 0;
        } else if (!c) {
            fr_error(FR_ERR_OOM, "mul: out of memory");
        } else {
            free(c);
        }
        if (!ok) {
            fr_release(y);
            return NULL;
        }
        fr_node_set_output(node, 0, y);
    }
    return y;
}

/* ---- scale ---- */

typedef struct {
    float alpha;
} scale_ctx;

static fr_status scale_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const scale_ctx *c = node->ctx;
    din[0] = new_like(dout[0]);
    if (!din[0])
        return fr_last_status();
    return fr_scale_out(din[0], dout[0], c->alpha);
}

static fr_status record_scale(const char *op, fr_tensor *x_before, fr_tensor *y, float alpha,
                              fr_node **out_node) {
    *out_node = NULL;
    fr_tensor *in[1] = {x_before};
    if (!fr_should_record(1, in))
        return FR_OK;
    scale_ctx *c = malloc(sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    c->alpha = alpha;
    fr_node *node = fr_node_new(op, scale_backward, 1, in, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    fr_node_set_ctx(node, c, NULL);
    if (y)
        fr_node_set_output(node, 0, y);
    *out_node = node;
    return FR_OK;
}

fr_tensor *fr_scale(fr_tensor *x, float alpha) {
    if (fr_check_defined("scale", "x", x) != FR_OK)
        return NULL;
    fr_tensor *y = new_like(x);
    fr_node *node;
    if (!y || fr_scale_out(y, x, alpha) != FR_OK || record_scale("scale", x, y, alpha, &node) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    return y;
}

fr_tensor *fr_scale_(fr_tensor *x, float alpha) {
    fr_node *node;
    if (fr_check_inplace("scale_", x) != FR_OK || record_scale("scale_", x, NULL, alpha, &node) != FR_OK)
        return NULL;
    if (fr_scale_out(x, x, alpha) != FR_OK)
        return NULL;
    fr_bump_version(x, "scale_");
    if (node)
        fr_node_set_output(node, 0, x);
    return fr_retain(x);
}

/* ---- sum and mean ---- */

typedef struct {
    float scale; /* 1 for sum, 1/n for mean */
    fr_dtype dtype; /* x's: the gradient's (the sum itself is f32) */
    int ndim;
    int64_t shape[FR_MAX_DIMS];
} reduce_ctx;

static fr_status reduce_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const reduce_ctx *c = node->ctx;
    din[0] = fr_empty(node->device, c->dtype, c->ndim, c->shape, FR_TAG_TRANSIENT);
    if (!din[0])
        return fr_last_status();
    return fr_fill_from_out(din[0], dout[0], c->scale);
}

static fr_tensor *reduce(const char *op, fr_tensor *x, bool mean) {
    if (fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty(fr_device_of(x), FR_F32, 0, NULL, FR_TAG_TRANSIENT);
    if (!y || fr_sum_out(y, x) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    int64_t n = fr_numel(x);
    float scale = mean ? (n ? 1.0f / (float)n : 0.0f) : 1.0f;
    if (mean && fr_scale_out(y, y, scale) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[1] = {x};
    if (fr_should_record(1, in)) {
        reduce_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new(op, reduce_backward, 1, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "%s: out of memory", op);
            free(c);
            fr_release(y);
            return NULL;
        }
        c->scale = scale;
        c->dtype = x->dtype;
        c->ndim = x->ndim;
        for (int i = 0; i < x->ndim; i++)
            c->shape[i] = x->shape[i];
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
    }
    return y;
}

fr_tensor *fr_sum(fr_tensor *x) { return reduce("sum", x, false); }
fr_tensor *fr_mean(fr_tensor *x) { return reduce("mean", x, true); }

/* ---- reshape ---- */

static fr_status reshape_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const reduce_ctx *c = node->ctx; /* only the input shape is used */
    fr_tensor *g = fr_contiguous(dout[0], FR_TAG_TRANSIENT);
    if (!g)
        return fr_last_status();
    din[0] = fr_view(g, c->ndim, c->shape);
    fr_release(g);
    return din[0] ? FR_OK : fr_last_status();
}

fr_tensor *fr_reshape(fr_tensor *x, int ndim, const int64_t *shape) {
    if (fr_check_defined("reshape", "x", x) != FR_OK)
        return NULL;
    fr_tensor *src = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *y = src ? fr_view(src, ndim, shape) : NULL;
    fr_release(src);
    if (!y)
        return NULL;
    /* A view starts with no autograd state of its own: recorded below, or
     * a constant made under no_grad, never a view cut from the graph. */
    y->requires_grad = false;
    y->grad_fn = NULL;
    y->cut_from_graph = false;
    fr_tensor *in[1] = {x};
    if (fr_should_record(1, in)) {
        reduce_ctx *c = calloc(1, sizeof *c);
        fr_node *node = c ? fr_node_new("reshape", reshape_backward, 1, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "reshape: out of memory");
            free(c);
            fr_release(y);
            return NULL;
        }
        c->ndim = x->ndim;
        for (int i = 0; i < x->ndim; i++)
            c->shape[i] = x->shape[i];
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
    }
    return y;
}

fr_tensor *fr_flatten(fr_tensor *x) {
    if (fr_check_defined("flatten", "x", x) != FR_OK)
        return NULL;
    if (x->ndim < 1) {
        fr_error(FR_ERR_SHAPE, "flatten: input must have a batch dimension");
        return NULL;
    }
    return fr_reshape(x, 2, FR_SHAPE(x->shape[0], -1));
}
