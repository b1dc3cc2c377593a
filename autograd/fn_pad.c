/* fn_pad.c: differentiable zero and reflect padding of the last two dims
 * (F.pad with a 4-tuple). Backward needs no saved tensor: only the
 * padding, which says where each input element was read. */
#include <string.h>

#include "functions.h"
#include "node.h"

typedef struct {
    int pad[4];
    fr_pad_mode mode;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
} pad_ctx;

static fr_status pad_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const pad_ctx *c = node->ctx;
    fr_tensor *g = fr_contiguous(dout[0], FR_TAG_TRANSIENT);
    fr_tensor *dx = g ? fr_empty(node->device, FR_F32, c->ndim, c->shape, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dx ? fr_pad2d_backward(dx, g, c->pad, c->mode) : fr_last_status();
    fr_release(g);
    if (st != FR_OK)
        fr_release(dx);
    else
        din[0] = dx;
    return st;
}

fr_tensor *fr_pad(fr_tensor *x, const int pad[4], fr_pad_mode mode) {
    fr_pad_shape s;
    if (!pad) {
        fr_error(FR_ERR_ARG, "pad: pad is NULL");
        return NULL;
    }
    if (fr_pad2d_shape(x, pad, mode, &s) != FR_OK)
        return NULL;
    int64_t shape[FR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 2] += s.top + s.bottom;
    shape[x->ndim - 1] += s.left + s.right;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *y = cx ? fr_empty(fr_device_of(x), FR_F32, x->ndim, shape, FR_TAG_TRANSIENT) : NULL;
    pad_ctx c = {.mode = mode, .ndim = x->ndim};
    memcpy(c.pad, pad, sizeof c.pad);
    memcpy(c.shape, x->shape, sizeof c.shape);
    bool ok = y && fr_pad2d_forward(y, cx, pad, mode) == FR_OK &&
              fr_record_unary("pad", pad_backward, x, y, &c, sizeof c, NULL) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}
