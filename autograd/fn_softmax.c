/* fn_softmax.c: differentiable softmax and log-softmax over one dim. The
 * node keeps the output only: both gradients are functions of it
 * (kernels.def: softmax_backward). */
#include "functions.h"
#include "node.h"

typedef struct {
    int dim;
    bool log_out;
} softmax_ctx;

static fr_status softmax_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const softmax_ctx *c = node->ctx;
    fr_tensor *y = fr_node_unpack(node, 0);
    fr_tensor *g = y ? fr_contiguous(dout[0], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dx = g ? fr_empty_like(y, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dx ? fr_softmax_backward(dx, g, y, c->dim, c->log_out) : fr_last_status();
    fr_release(g);
    fr_release(y);
    if (st != FR_OK)
        fr_release(dx);
    else
        din[0] = dx;
    return st;
}

static fr_tensor *softmax(fr_tensor *x, int dim, bool log_out) {
    const char *op = log_out ? "log_softmax" : "softmax";
    if (fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    int d = dim < 0 ? dim + x->ndim : dim;
    if (d < 0 || d >= x->ndim) {
        fr_error(FR_ERR_ARG, "%s: dim %d is out of range for %d dims", op, dim, x->ndim);
        return NULL;
    }
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *y = cx ? fr_empty_like(cx, FR_TAG_TRANSIENT) : NULL;
    softmax_ctx c = {d, log_out};
    bool ok = y && fr_softmax_forward(y, cx, d, log_out) == FR_OK &&
              fr_record_unary(op, softmax_backward, x, y, &c, sizeof c, y) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_softmax(fr_tensor *x, int dim) { return softmax(x, dim, false); }
fr_tensor *fr_log_softmax(fr_tensor *x, int dim) { return softmax(x, dim, true); }
