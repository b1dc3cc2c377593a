/* fn_clamp.c: differentiable clamp. The node keeps the input: whether an
 * element was inside the bounds cannot be told from a clamped output equal
 * to a bound. Output, saved input and gradient in x's dtype (f32, f16 or
 * bf16; tensor/ops_pad.c stages half to f32). */
#include "functions.h"
#include "node.h"

typedef struct {
    float lo, hi;
} clamp_ctx;

static fr_status clamp_grad(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x, const void *ctx) {
    const clamp_ctx *c = ctx;
    return fr_clamp_backward(dx, dy, x, c->lo, c->hi);
}

fr_tensor *fr_clamp(fr_tensor *x, float lo, float hi) {
    if (fr_check_defined("clamp", "x", x) != FR_OK)
        return NULL;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *y = cx ? fr_empty_like(cx, FR_TAG_TRANSIENT) : NULL;
    clamp_ctx c = {lo, hi};
    bool ok = y && fr_clamp_forward(y, cx, lo, hi) == FR_OK &&
              fr_record_unary_grad("clamp", clamp_grad, x, y, &c, sizeof c, cx) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}
