/* fn_conv.c: differentiable 2-d convolution (grouped, dilated) and
 * transposed convolution (one node: the transposed op's passes are the
 * convolution's, swapped: tensor/ops_conv.c).
 *
 * The node saves only what the wanted gradients need: x for dw (so a first
 * layer whose weights are frozen keeps no reference to the batch) and w for
 * dx (a parameter: holding it costs nothing). Shapes live in the context, so
 * a gradient can be allocated without its tensor being saved. Saving goes
 * through fr_node_save, so an x that carries a recipe (a fused BN+ReLU
 * output) is recomputed in backward rather than kept; backward releases the
 * unpacked x as soon as dw is done, before dx is allocated, so a recomputed
 * x and dx are never alive together.
 *
 * Under autocast (mixed precision) y has the autocast dtype and the f32
 * weight is cast to it for the call, and again in backward; dx has x's
 * dtype, dw and db are f32 (fr_autocast_weight). */
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"
#include "../cpu/conv.h"

enum { CONV_X = 0, CONV_W, CONV_B };

typedef struct {
    fr_conv_params p;
    fr_conv_transpose_params tp;
    bool transposed;
    /* channels last (fr_conv2d_channels_last): the pass runs on s with
     * channels-last dy and x; x_nhwc: dx in x's layout */
    bool channels_last, x_nhwc;
    fr_conv_shape s;
    int64_t x_shape[4], w_shape[4];
    fr_dtype x_dtype, w_dtype, compute; /* compute: the dtype w is cast to (autocast) */
    int x, w; /* saved slots, -1 when not saved */
} conv_ctx;

static fr_status conv_cl_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din);

static fr_tensor *grad_like(const fr_tensor *dy, fr_dtype dtype, int ndim, const int64_t *shape) {
    return fr_empty(fr_device_of(dy), dtype, ndim, shape, FR_TAG_TRANSIENT);
}

static fr_status run_backward(const conv_ctx *c, fr_tensor *dx, fr_tensor *dw, fr_tensor *db,
                              const fr_tensor *dy, const fr_tensor *x, const fr_tensor *w) {
    return c->transposed ? fr_conv_transpose2d_backward(dx, dw, db, dy, x, w, c->tp)
                         : fr_conv2d_backward(dx, dw, db, dy, x, w, c->p);
}

static fr_status conv_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const conv_ctx *c = node->ctx;
    if (c->channels_last)
        return conv_cl_backward(node, dout, din);
    fr_tensor *dy = dout[0];
    fr_status st = FR_OK;
    if (fr_node_needs_grad(node, CONV_W)) {
        fr_tensor *x = fr_node_unpack(node, c->x);
        fr_tensor *dw = x ? grad_like(dy, c->w_dtype, 4, c->w_shape) : NULL;
        st = dw ? run_backward(c, NULL, dw, NULL, dy, x, NULL) : fr_last_status();
        fr_release(x);
        if (st != FR_OK) {
            fr_release(dw);
            return st;
        }
        din[CONV_W] = dw;
    }
    if (fr_node_needs_grad(node, CONV_X)) {
        fr_tensor *saved_w = fr_node_unpack(node, c->w);
        fr_tensor *w = saved_w ? fr_autocast_weight(saved_w, c->compute) : NULL;
        fr_release(saved_w);
        fr_tensor *dx = w ? grad_like(dy, c->x_dtype, 4, c->x_shape) : NULL;
        st = dx ? run_backward(c, dx, NULL, NULL, dy, NULL, w) : fr_last_status();
        fr_release(w);
        if (st != FR_OK) {
            fr_release(dx);
            return st;
        }
        din[CONV_X] = dx;
    }
    if (fr_node_needs_grad(node, CONV_B)) {
        fr_tensor *db = grad_like(dy, FR_F32, 1, FR_SHAPE(dy->shape[1]));
        st = db ? run_backward(c, NULL, NULL, db, dy, NULL, NULL) : fr_last_status();
        if (st != FR_OK) {
            fr_release(db);
            return st;
        }
        din[CONV_B] = db;
    }
    return FR_OK;
}

/* Records the node for y = conv(x, w) + b (c's settings filled). */
static fr_status conv_record(fr_tensor *const *in, conv_ctx init, fr_dtype compute, fr_tensor *y) {
    const char *op = init.transposed ? "conv_transpose2d" : "conv2d";
    conv_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory recording a node", op);
    fr_node *node = fr_node_new(op, conv_backward, 3, in, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    *c = init;
    memcpy(c->x_shape, in[CONV_X]->shape, sizeof c->x_shape);
    memcpy(c->w_shape, in[CONV_W]->shape, sizeof c->w_shape);
    c->x_dtype = in[CONV_X]->dtype;
    c->w_dtype = in[CONV_W]->dtype;
    c->compute = compute;
    c->x = c->w = -1;
    fr_node_set_ctx(node, c, NULL);
    if (fr_node_needs_grad(node, CONV_W) && (c->x = fr_node_save_activation(node, in[CONV_X], true)) < 0)
        return fr_last_status();
    if (fr_node_needs_grad(node, CONV_X) && (c->w = fr_node_save(node, in[CONV_W])) < 0)
        return fr_last_status();
    fr_node_set_output(node, 0, y);
    return FR_OK;
}

/* Either op: y's shape from s, the forward, the node. */
static fr_tensor *conv_any(fr_tensor *x, fr_tensor *w, fr_tensor *b, conv_ctx init) {
    const char *op = init.transposed ? "conv_transpose2d" : "conv2d";
    fr_conv_shape s;
    if (fr_check_defined(op, "x", x) != FR_OK || fr_check_defined(op, "w", w) != FR_OK ||
        (init.transposed ? fr_conv_transpose2d_shape(x, w, init.tp, &s)
                         : fr_conv2d_shape(x, w, init.p, &s)) != FR_OK)
        return NULL;
    fr_dtype compute = fr_autocast_out_dtype(x);
    const int64_t *shape = init.transposed ? FR_SHAPE(s.n, s.c, s.h, s.w)
                                           : FR_SHAPE(s.n, s.k, s.oh, s.ow);
    fr_tensor *y = fr_empty(fr_device_of(x), compute, 4, shape, FR_TAG_TRANSIENT);
    fr_tensor *wc = y ? fr_autocast_weight(w, compute) : NULL;
    if (!wc) {
        fr_release(y);
        return NULL;
    }
    fr_tensor *in[3] = {x, w, b};
    fr_status st = init.transposed ? fr_conv_transpose2d_forward(y, x, wc, b, init.tp)
                                   : fr_conv2d_forward(y, x, wc, b, init.p);
    fr_release(wc);
    if (st == FR_OK && fr_should_record(3, in))
        st = conv_record(in, init, compute, y);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_conv2d(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_params p) {
    return conv_any(x, w, b, (conv_ctx){.p = p});
}

fr_tensor *fr_conv_transpose2d(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_transpose_params p) {
    return conv_any(x, w, b, (conv_ctx){.tp = p, .transposed = true});
}

/* ---- channels last (functions.h: a model's channels-last mode) ---- */

static fr_status conv_cl_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const conv_ctx *c = node->ctx;
    /* dy channels last whatever reached us (a checkpoint's leaf gradient is
     * made like its leaf, so it normally is) */
    fr_tensor *dy = fr_layout_copy(dout[0], true);
    fr_status st = dy ? FR_OK : fr_last_status();
    if (st == FR_OK && fr_node_needs_grad(node, CONV_W)) {
        fr_tensor *saved = fr_node_unpack(node, c->x);
        fr_tensor *x = saved ? fr_layout_copy(saved, true) : NULL;
        fr_release(saved);
        fr_tensor *dw = x ? fr_empty(FR_CPU, FR_F32, 4, c->w_shape, FR_TAG_TRANSIENT) : NULL;
        st = dw ? fr_cpu_conv2d_nhwc(2, fr_data_f32(dw), fr_data_f32(dy), fr_data_f32(x), &c->s)
                : fr_last_status();
        fr_release(x);
        if (st == FR_OK)
            din[CONV_W] = dw;
        else
            fr_release(dw);
    }
    if (st == FR_OK && fr_node_needs_grad(node, CONV_X)) {
        fr_tensor *w = fr_node_unpack(node, c->w);
        fr_tensor *dx = w ? fr_empty_channels_last(FR_CPU, FR_SHAPE(c->s.n, c->s.c, c->s.h, c->s.w),
                                                   FR_TAG_TRANSIENT)
                          : NULL;
        st = dx ? fr_cpu_conv2d_nhwc(1, fr_data_f32(dx), fr_data_f32(dy), fr_data_f32(w), &c->s)
                : fr_last_status();
        fr_release(w);
        if (st == FR_OK && !c->x_nhwc) {
            fr_tensor *nchw = fr_layout_copy(dx, false);
            fr_release(dx);
            dx = nchw;
            st = dx ? FR_OK : fr_last_status();
        }
        if (st == FR_OK)
            din[CONV_X] = dx;
        else
            fr_release(dx);
    }
    fr_release(dy);
    return st;
}

fr_tensor *fr_conv2d_channels_last(fr_tensor *x, fr_tensor *w, fr_tensor *b, fr_conv_params p) {
    const char *op = "conv2d";
    fr_conv_shape s;
    if (fr_check_defined(op, "x", x) != FR_OK || fr_check_defined(op, "w", w) != FR_OK ||
        fr_conv2d_shape(x, w, p, &s) != FR_OK)
        return NULL;
    bool x_nhwc = fr_is_channels_last(x);
    if (b || fr_device_of(x) != FR_CPU || fr_device_of(w) != FR_CPU || x->dtype != FR_F32 ||
        w->dtype != FR_F32 || !fr_is_contiguous(w) ||
        fr_autocast_out_dtype(x) != FR_F32 || (!x_nhwc && !fr_is_contiguous(x))) {
        /* not covered: the NCHW op on an NCHW x, with its bits */
        fr_tensor *xc = fr_to_nchw(x);
        fr_tensor *y = xc ? fr_conv2d(xc, w, b, p) : NULL;
        fr_release(xc);
        return y;
    }
    fr_tensor *y = fr_empty_channels_last(FR_CPU, FR_SHAPE(s.n, s.k, s.oh, s.ow), FR_TAG_TRANSIENT);
    fr_tensor *xl = y ? fr_layout_copy(x, true) : NULL;
    fr_status st = xl ? fr_cpu_conv2d_nhwc(0, fr_data_f32(y), fr_data_f32(xl), fr_data_f32(w), &s)
                      : fr_last_status();
    fr_release(xl);
    fr_tensor *in[3] = {x, w, NULL};
    if (st == FR_OK && fr_should_record(3, in))
        st = conv_record(in, (conv_ctx){.p = p, .channels_last = true, .x_nhwc = x_nhwc, .s = s},
                         FR_F32, y);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}
