/* fn_activation.c: every activation (shapes.h: FR_ACT_LIST) as a
 * differentiable op, out-of-place, and inplace for those whose gradient
 * needs only the output.
 *
 * A node saves what the activation's backward reads (tensor/ops.h): the
 * output, or the input for the activations that need it (GELU, SiLU, ...).
 * For the inplace forms the output IS the input's storage: the node
 * saves it after the write, at the new version, and any earlier node that
 * saved the same storage now sees a changed version and fails in backward
 * instead of computing a wrong gradient. */
#include <stdio.h>
#include <stdlib.h>

#include "checkpoint_log.h"
#include "functions.h"
#include "node.h"

typedef struct {
    fr_act act;
    float p; /* leaky ReLU's slope, ELU's alpha */
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
    fr_tensor *s = fr_node_unpack(node, 0); /* y, or x (needs input) */
    if (!s)
        return fr_last_status();
    fr_tensor *dx = grad_buffer(dout[0]);
    fr_status st = dx ? fr_act_backward(dx, dout[0], s, c->act, c->p) : fr_last_status();
    fr_release(s);
    if (st != FR_OK) {
        fr_release(dx);
        return st;
    }
    din[0] = dx;
    return FR_OK;
}

/* Saves what the gradient reads: x, or the output y; only its sign for
 * ReLU and leaky ReLU (one bit under compress:B). Called without a node
 * too: a checkpointed forward keeps a sign-only activation's mask for its
 * replay (checkpoint_log.h). */
static int save_for_grad(fr_node *node, fr_act a, fr_tensor *s) {
    if (fr_act_needs_input(a) || (a != FR_ACT_RELU && a != FR_ACT_LEAKY_RELU))
        return node ? fr_node_save_activation(node, s, true) : 0;
    return fr_node_keep_sign(node, s);
}

/* Makes a node for op on x, or sets *node to NULL when nothing records. */
static fr_status act_node(const char *op, fr_tensor *x, fr_act act, float p, fr_node **node) {
    *node = NULL;
    if (!fr_should_record(1, &x))
        return FR_OK;
    act_ctx *c = malloc(sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    c->act = act;
    c->p = p;
    *node = fr_node_new(op, act_backward, 1, &x, 1);
    if (!*node) {
        free(c);
        return fr_last_status();
    }
    fr_node_set_ctx(*node, c, NULL);
    return FR_OK;
}

static fr_tensor *act(const char *op, fr_tensor *x, fr_act a, float p) {
    if (fr_act_check(op, a, p) != FR_OK || fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_node *node = NULL;
    if (!y || fr_act_forward(y, x, a, p) != FR_OK || act_node(op, x, a, p, &node) != FR_OK ||
        save_for_grad(node, a, fr_act_needs_input(a) ? x : y) < 0) {
        fr_release(y);
        return NULL;
    }
    if (node)
        fr_node_set_output(node, 0, y);
    return y;
}

static fr_tensor *act_(const char *op, const char *name, fr_tensor *x, fr_act a, float p) {
    if (fr_act_check(op, a, p) != FR_OK || fr_check_floatc(op, "x", x) != FR_OK)
        return NULL;
    /* The input is gone after the write: only an activation whose gradient
     * reads its output can run in place. */
    if (fr_act_needs_input(a)) {
        fr_error(FR_ERR_ARG,
                 "%s: %s cannot run in place: its gradient needs its input, which the write "
                 "would destroy; use the out-of-place fr_activation",
                 op, name);
        return NULL;
    }
    if (fr_check_inplace(op, x) != FR_OK)
        return NULL;
    /* The node is made before the write: its edge must point at x's current
     * producer, which the write is about to replace. */
    fr_node *node;
    if (act_node(op, x, a, p, &node) != FR_OK)
        return NULL;
    if (fr_act_forward(x, x, a, p) != FR_OK)
        return NULL; /* the node stays on the tape; nothing refers to it */
    fr_bump_version(x, op);
    if (save_for_grad(node, a, x) < 0)
        return NULL;
    if (node)
        fr_node_set_output(node, 0, x);
    return fr_retain(x);
}

fr_tensor *fr_activation(fr_tensor *x, fr_act a, float p) {
    return act(fr_act_name(a), x, a, p);
}

fr_tensor *fr_activation_(fr_tensor *x, fr_act a, float p) {
    char op[40];
    snprintf(op, sizeof op, "%s_", fr_act_name(a));
    return act_(op, fr_act_name(a), x, a, p);
}

fr_tensor *fr_sigmoid(fr_tensor *x) { return act("sigmoid", x, FR_ACT_SIGMOID, 0.0f); }
fr_tensor *fr_tanh(fr_tensor *x) { return act("tanh", x, FR_ACT_TANH, 0.0f); }
fr_tensor *fr_relu(fr_tensor *x) { return act("relu", x, FR_ACT_RELU, 0.0f); }
fr_tensor *fr_relu_(fr_tensor *x) { return act_("relu_", "relu", x, FR_ACT_RELU, 0.0f); }
fr_tensor *fr_leaky_relu(fr_tensor *x, float slope) {
    return act("leaky_relu", x, FR_ACT_LEAKY_RELU, slope);
}
fr_tensor *fr_leaky_relu_(fr_tensor *x, float slope) {
    return act_("leaky_relu_", "leaky_relu", x, FR_ACT_LEAKY_RELU, slope);
}
