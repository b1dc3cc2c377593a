/* fn_pad.c: differentiable zero and reflect padding of the last two dims
 * (F.pad with a 4-tuple). Backward needs no saved tensor: only the
 * padding, which says where each input element was read. Output and
 * gradient in x's dtype (f32, f16 or bf16; tensor/ops_pad.c stages half). */
#include <string.h>

#include "functions.h"
#include "node.h"

typedef struct {
    int pad[4];
    fr_pad_mode mode;
} pad_ctx;

static fr_status pad_grad(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *saved, const void *ctx) {
    (void)saved;
    const pad_ctx *c = ctx;
    return fr_pad2d_backward(dx, dy, c->pad, c->mode);
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
    fr_tensor *y = cx ? fr_empty(fr_device_of(x), x->dtype, x->ndim, shape, FR_TAG_TRANSIENT) : NULL;
    pad_ctx c = {.mode = mode};
    memcpy(c.pad, pad, sizeof c.pad);
    bool ok = y && fr_pad2d_forward(y, cx, pad, mode) == FR_OK &&
              fr_record_unary_grad("pad", pad_grad, x, y, &c, sizeof c, NULL) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}
