/* fn_activation.c: differentiable ReLU and leaky ReLU, out-of-place and
 * inplace.
 *
 * Backward needs only the output (tensor/kernels.def), so that is all a node
 * saves. For the inplace forms the output IS the input's storage: the node
 * saves it after the write, at the new version, and any earlier node that
 * saved the same storage now sees a changed version and fails in backward
 * instead of computing a wrong gradient. */
#include <stdlib.h>

#include "functions.h"

typedef struct {
    float slope; /* 0 for relu */
} act_ctx;

/* Writes into dout when nothing else holds it (autograd.h allows this), so
 * the gradient passes through without a second buffer. */
static fr_tensor *grad_buffer(fr_tensor *dout) {
    if (dout->refcount == 1 && dout->storage->refcount == 1)
        return fr_retain(dout);
    return fr_empty_like(dout, FR_TAG_TRANSIENT);
}

static fr_status act_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const act_ctx *c = node->ctx;
    fr_tensor *y = fr_node_unpack(node, 0);
    if (!y)
        return fr_last_status();
    fr_tensor *dx = grad_buffer(dout[0]);
    fr_status st = !dx                ? fr_last_status()
                   : c->slope == 0.0f ? fr_relu_backward(dx, dout[0], y)
                                      : fr_leaky_relu_backward(dx, dout[0], y, c->slope);
    fr_release(y);
    if (st != FR_OK) {
        fr_release(dx);
        return st;
    }
    din[0] = dx;
    return FR_OK;
}

static fr_status act_forward(fr_tensor *y, fr_tensor *x, float slope) {
    return slope == 0.0f ? fr_relu_forward(y, x) : fr_leaky_relu_forward(y, x, slope);
}

/* Makes a node for op on x, or sets *node to NULL when nothing records. */
static fr_status act_node(const char *op, fr_tensor *x, float slope, fr_node **node) {
    *node = NULL;
    if (!fr_should_record(1, &x))
        return FR_OK;
    act_ctx *c = malloc(sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    c->slope = slope;
    *node = fr_node_new(op, act_backward, 1, &x, 1);
    if (!*node) {
        free(c);
        return fr_last_status();
    }
    fr_node_set_ctx(*node, c, NULL);
    return FR_OK;
}

static fr_tensor *act(const char *op, fr_tensor *x, float slope) {
    if (fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_node *node = NULL;
    if (!y || act_forward(y, x, slope) != FR_OK || act_node(op, x, slope, &node) != FR_OK ||
        (node && fr_node_save(node, y) < 0)) {
        fr_release(y);
        return NULL;
    }
    if (node)
        fr_node_set_output(node, 0, y);
    return y;
}

static fr_tensor *act_(const char *op, const char *name, fr_tensor *x, float slope) {
    if (fr_check_floatc(op, "x", x) != FR_OK)
        return NULL;
    /* A leaf that wants a gradient has no producer the write could be
     * recorded against, and its old values would be lost. */
    if (fr_grad_enabled() && x->requires_grad && !fr_has_grad_fn(x)) {
        fr_error(FR_ERR_ARG,
                 "%s: in-place %s on a leaf that requires grad; use the out-of-place %s, or "
                 "run under no_grad",
                 op, name, name);
        return NULL;
    }
    /* The node is made before the write: its edge must point at x's current
     * producer, which the write is about to replace. */
    fr_node *node;
    if (act_node(op, x, slope, &node) != FR_OK)
        return NULL;
    if (act_forward(x, x, slope) != FR_OK)
        return NULL; /* the node stays on the tape; nothing refers to it */
    fr_bump_version(x, op);
    if (node) {
        if (fr_node_save(node, x) < 0)
            return NULL;
        fr_node_set_output(node, 0, x);
    }
    return fr_retain(x);
}

fr_tensor *fr_relu(fr_tensor *x) { return act("relu", x, 0.0f); }
fr_tensor *fr_relu_(fr_tensor *x) { return act_("relu_", "relu", x, 0.0f); }
fr_tensor *fr_leaky_relu(fr_tensor *x, float slope) {
    if (!(slope > 0.0f)) {
        fr_error(FR_ERR_ARG, "leaky_relu: slope must be > 0 (got %g); use fr_relu for slope 0",
                 (double)slope);
        return NULL;
    }
    return act("leaky_relu", x, slope);
}
fr_tensor *fr_leaky_relu_(fr_tensor *x, float slope) {
    if (!(slope > 0.0f)) {
        fr_error(FR_ERR_ARG, "leaky_relu_: slope must be > 0 (got %g); use fr_relu_ for slope 0",
                 (double)slope);
        return NULL;
    }
    return act_("leaky_relu_", "leaky_relu", x, slope);
}
