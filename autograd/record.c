/* record.c: the recording step shared by the one-input, one-output ops
 * (node.h: fr_record_unary, fr_record_unary_grad), and the one backward of
 * the ops recorded by their gradient kernel. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "node.h"

/* A node of `op` over x with ctx c (malloc'd, owned from here on; NULL for
 * none), saving `save` (NULL for nothing) and outputting y. */
static fr_status record(const char *op, fr_backward_fn backward, fr_tensor *x, fr_tensor *y, void *c,
                        fr_tensor *save) {
    fr_node *node = fr_node_new(op, backward, 1, &x, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    if (c)
        fr_node_set_ctx(node, c, NULL);
    if (save && fr_node_save(node, save) < 0)
        return fr_last_status(); /* the node stays on the tape; nothing refers to it */
    fr_node_set_output(node, 0, y);
    return FR_OK;
}

fr_status fr_record_unary(const char *op, fr_backward_fn backward, fr_tensor *x, fr_tensor *y,
                          const void *ctx, size_t ctx_size, fr_tensor *save) {
    if (!fr_should_record(1, &x))
        return FR_OK;
    void *c = NULL;
    if (ctx_size && !(c = malloc(ctx_size)))
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    if (c)
        memcpy(c, ctx, ctx_size);
    return record(op, backward, x, y, c, save);
}

/* The ctx of a node recorded by fr_record_unary_grad: its kernel, what dx
 * looks like (x's dtype and shape, so an op that saves nothing need not
 * keep them itself), then the op's own ctx bytes. */
typedef struct {
    fr_unary_grad_fn grad;
    fr_dtype dtype;
    int ndim;
    int64_t shape[FR_MAX_DIMS];
    max_align_t op_ctx[];
} unary_grad_ctx;

/* dx = grad(contiguous dout, the saved tensor): unpack, allocate, run, release. */
static fr_status unary_grad_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const unary_grad_ctx *c = node->ctx;
    fr_tensor *saved = NULL;
    if (node->n_saved && !(saved = fr_node_unpack(node, 0)))
        return fr_last_status();
    fr_tensor *dy = fr_contiguous(dout[0], FR_TAG_TRANSIENT);
    fr_tensor *dx = dy ? fr_empty(node->device, c->dtype, c->ndim, c->shape, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dx ? c->grad(dx, dy, saved, c->op_ctx) : fr_last_status();
    fr_release(dy);
    fr_release(saved);
    if (st != FR_OK)
        fr_release(dx);
    else
        din[0] = dx;
    return st;
}

fr_status fr_record_unary_grad(const char *op, fr_unary_grad_fn grad, fr_tensor *x, fr_tensor *y,
                               const void *ctx, size_t ctx_size, fr_tensor *save) {
    if (!fr_should_record(1, &x))
        return FR_OK;
    unary_grad_ctx *c = malloc(offsetof(unary_grad_ctx, op_ctx) + ctx_size);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory", op);
    c->grad = grad;
    c->dtype = x->dtype;
    c->ndim = x->ndim;
    memcpy(c->shape, x->shape, sizeof c->shape);
    if (ctx_size)
        memcpy(c->op_ctx, ctx, ctx_size);
    return record(op, unary_grad_backward, x, y, c, save);
}
