/* fn_softmax.c: differentiable softmax and log-softmax over one dim. The
 * node keeps the output only: both gradients are functions of it
 * (kernels.def: softmax_backward). Output and saved output in x's dtype:
 * half is staged to f32 by the ops layer (tensor/ops_softmax.c), so the
 * row sums stay f32 (docs/ARCHITECTURE.md, "Broadcasting ops"). */
#include "functions.h"
#include "node.h"

typedef struct {
    int dim;
    bool log_out;
} softmax_ctx;

static fr_status softmax_grad(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y, const void *ctx) {
    const softmax_ctx *c = ctx;
    return fr_softmax_backward(dx, dy, y, c->dim, c->log_out);
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
              fr_record_unary_grad(op, softmax_grad, x, y, &c, sizeof c, y) == FR_OK;
    fr_release(cx);
    if (!ok)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_softmax(fr_tensor *x, int dim) { return softmax(x, dim, false); }
fr_tensor *fr_log_softmax(fr_tensor *x, int dim) { return softmax(x, dim, true); }
