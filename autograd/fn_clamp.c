/* fn_clamp.c: differentiable clamp. The node keeps the input: whether an
 * element was inside the bounds cannot be told from a clamped output equal
 * to a bound. */
#include "functions.h"
#include "node.h"

typedef struct {
    float lo, hi;
} clamp_ctx;

static fr_status clamp_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const clamp_ctx *c = node->ctx;
    fr_tensor *x = fr_node_unpack(node, 0);
    fr_tensor *g = x ? fr_contiguous(dout[0], FR_TAG_TRANSIENT) : NULL;
    fr_tensor *dx = g ? fr_empty_like(x, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dx ? fr_clamp_backward(dx, g, x, c->lo, c->hi) : fr_last_status();
    fr_release(g);
    fr_release(x);
    if (st != FR_OK)
        fr_release(dx);
    else
        din[0] = dx;
    return st;
}

fr_tensor *fr_clamp(fr_tensor *x, float lo, float hi) {
    if (fr_check_defined("clamp", "x", x) != FR_OK)
        return NULL;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *y = cx ? fr_empty_like(cx, FR_TAG_TRANSIENT) : NULL;
    clamp_ctx c = {lo, hi};
    bool ok = y && fr_clamp_forward(y, cx, lo, hi) == FR_OK &&
              fr_record_unary("clamp", clamp_backward, x, y, &c, sizeof c, cx) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}
