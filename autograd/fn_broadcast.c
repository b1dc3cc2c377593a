/* fn_broadcast.c: differentiable add, sub, mul and div with NumPy
 * broadcasting, and sums and means over chosen dims (keepdim or not).
 *
 * The gradient of a broadcast operand is the output's gradient summed over
 * the dims the operand was stretched along (fr_reduce_sum_out), so it has
 * the operand's shape again, in the operand's dtype. Half operands are
 * staged to f32 in the ops layer (tensor/ops_broadcast.c); a gradient's
 * intermediates at the output's shape (dout * other, a / b) are stored in
 * dout's dtype, as PyTorch's half backward stores them, so no full-size f32
 * tensor is made (docs/ARCHITECTURE.md, "Mixed precision: half storage,
 * f32 arithmetic"). */
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"

typedef struct {
    fr_binary_op op;
    fr_dtype dtype[2];
    int ndim[2];
    int64_t shape[2][FR_MAX_DIMS];
    int saved_a, saved_b; /* -1 when not kept */
} binary_ctx;

static bool same_shape(const fr_tensor *t, int ndim, const int64_t *shape) {
    return t->ndim == ndim && !memcmp(t->shape, shape, (size_t)ndim * sizeof shape[0]);
}

/* g (the output's shape) summed down to input i's shape, times scale: a
 * new reference. */
static fr_tensor *reduce_to(fr_tensor *g, const binary_ctx *c, int i, float scale) {
    if (scale == 1.0f && same_shape(g, c->ndim[i], c->shape[i]) && g->dtype == c->dtype[i])
        return fr_retain(g);
    fr_tensor *r = fr_empty(fr_device_of(g), c->dtype[i], c->ndim[i], c->shape[i], FR_TAG_TRANSIENT);
    if (r && fr_reduce_sum_out(r, g, scale) != FR_OK)
        fr_clear(&r);
    return r;
}

/* t op u into a new tensor of the output's shape like g */
static fr_tensor *combine(const fr_tensor *g, const fr_tensor *t, const fr_tensor *u,
                          fr_binary_op op) {
    fr_tensor *r = fr_empty_like(g, FR_TAG_TRANSIENT);
    if (r && fr_bcast_binary_out(r, t, u, op) != FR_OK)
        fr_clear(&r);
    return r;
}

static fr_status binary_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const binary_ctx *c = node->ctx;
    fr_tensor *g = fr_contiguous(dout[0], FR_TAG_TRANSIENT);
    fr_tensor *a = c->saved_a >= 0 ? fr_node_unpack(node, c->saved_a) : NULL;
    fr_tensor *b = c->saved_b >= 0 ? fr_node_unpack(node, c->saved_b) : NULL;
    fr_status st = g && (c->saved_a < 0 || a) && (c->saved_b < 0 || b) ? FR_OK : fr_last_status();
    for (int i = 0; st == FR_OK && i < 2; i++) {
        if (!fr_node_needs_grad(node, i))
            continue;
        fr_tensor *t = NULL;   /* the gradient at the output's shape */
        float sign = 1.0f;
        switch (c->op) {
        case FR_BINARY_MUL: { /* d(a*b) = dout * other */
            fr_tensor *other = i == 0 ? b : a;
            if (!same_shape(g, c->ndim[i], c->shape[i]) &&
                same_shape(g, other->ndim, other->shape)) {
                /* a broadcast factor (a squeeze-excitation's scale): the
                 * product summed in one pass, no product tensor */
                din[i] = fr_empty(fr_device_of(g), c->dtype[i], c->ndim[i], c->shape[i],
                                  FR_TAG_TRANSIENT);
                if (din[i] && fr_reduce_sum_prod_out(din[i], g, other, 1.0f) != FR_OK)
                    fr_clear(&din[i]);
                if (!din[i])
                    st = fr_last_status();
                continue;
            }
            t = combine(g, g, other, FR_BINARY_MUL);
            break;
        }
        case FR_BINARY_DIV:
            if (i == 0) { /* da = dout / b */
                t = combine(g, g, b, FR_BINARY_DIV);
            } else {      /* db = -dout * (a / b) / b, PyTorch's order */
                fr_tensor *q = combine(g, a, b, FR_BINARY_DIV);
                fr_tensor *q2 = q ? combine(g, q, b, FR_BINARY_DIV) : NULL;
                t = q2 ? combine(g, g, q2, FR_BINARY_MUL) : NULL;
                fr_release(q);
                fr_release(q2);
                sign = -1.0f;
            }
            break;
        default: /* add, sub */
            t = fr_retain(g);
            sign = c->op == FR_BINARY_SUB && i == 1 ? -1.0f : 1.0f;
            break;
        }
        if (t)
            din[i] = reduce_to(t, c, i, sign);
        fr_release(t);
        if (!din[i])
            st = fr_last_status();
    }
    fr_release(a);
    fr_release(b);
    fr_release(g);
    return st;
}

fr_dtype fr_binary_dtype(const fr_tensor *a, const fr_tensor *b) {
    return a->dtype == b->dtype ? a->dtype : FR_F32;
}

fr_tensor *fr_broadcast_op(fr_binary_op op, fr_tensor *a, fr_tensor *b) {
    static const char *names[FR_BINARY_COUNT] = {"add", "sub", "mul", "div", "expand", "eq"};
    if ((unsigned)op >= FR_BINARY_FIRST) {
        fr_error(FR_ERR_ARG, "broadcast_op: %d is not add, sub, mul or div", (int)op);
        return NULL;
    }
    const char *name = names[op];
    int nd;
    int64_t shape[FR_MAX_DIMS];
    if (fr_broadcast_shape(name, a, b, &nd, shape) != FR_OK)
        return NULL;
    fr_tensor *ca = fr_contiguous(a, FR_TAG_TRANSIENT), *cb = fr_contiguous(b, FR_TAG_TRANSIENT);
    fr_tensor *y = ca && cb ? fr_empty(fr_device_of(a), fr_binary_dtype(a, b), nd, shape,
                                       FR_TAG_TRANSIENT)
                            : NULL;
    bool ok = y && fr_bcast_binary_out(y, ca, cb, op) == FR_OK;
    fr_release(ca);
    fr_release(cb);
    fr_tensor *in[2] = {a, b};
    if (ok && fr_should_record(2, in)) {
        binary_ctx *c = calloc(1, sizeof *c);
        fr_node *node = c ? fr_node_new(name, binary_backward, 2, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "%s: out of memory", name);
            free(c);
            ok = false;
        } else {
            fr_node_set_ctx(node, c, NULL);
            c->op = op;
            c->saved_a = c->saved_b = -1;
            for (int i = 0; i < 2; i++) {
                c->dtype[i] = in[i]->dtype;
                c->ndim[i] = in[i]->ndim;
                memcpy(c->shape[i], in[i]->shape, sizeof c->shape[i]);
            }
            /* mul: each gradient reads the other operand; div: both read
             * b, and b's reads a */
            bool need_a = (op == FR_BINARY_MUL && fr_node_needs_grad(node, 1)) ||
                          (op == FR_BINARY_DIV && fr_node_needs_grad(node, 1));
            bool need_b = (op == FR_BINARY_MUL && fr_node_needs_grad(node, 0)) ||
                          op == FR_BINARY_DIV;
            if (need_a && (c->saved_a = fr_node_save(node, a)) < 0)
                ok = false;
            if (ok && need_b && (c->saved_b = fr_node_save(node, b)) < 0)
                ok = false;
            if (ok)
                fr_node_set_output(node, 0, y);
        }
    }
    if (!ok)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_sub(fr_tensor *a, fr_tensor *b) { return fr_broadcast_op(FR_BINARY_SUB, a, b); }
fr_tensor *fr_div(fr_tensor *a, fr_tensor *b) { return fr_broadcast_op(FR_BINARY_DIV, a, b); }

/* ---- sum and mean over dims ---- */

typedef struct {
    float scale;
    bool max;                        /* amax: saved x, the gradient split over ties */
    int ndim;
    int64_t shape[FR_MAX_DIMS];      /* x's */
    int64_t kept[FR_MAX_DIMS];       /* x's with the reduced dims 1 */
} reduce_dims_ctx;

/* torch.amax's gradient: dy / (the number of elements equal to the
 * maximum) to each of them, 0 elsewhere; the maximum is taken again from
 * the saved x (it is small next to x) */
static fr_status max_grad(fr_tensor *dx, const reduce_dims_ctx *c, const fr_tensor *gv,
                          const fr_tensor *x) {
    fr_device dev = fr_device_of(dx);
    fr_tensor *m = fr_empty(dev, FR_F32, c->ndim, c->kept, FR_TAG_TRANSIENT);
    /* the 0/1 mask at x's shape in dx's dtype (exact in half) */
    fr_tensor *mask = m ? fr_empty(dev, dx->dtype, c->ndim, c->shape, FR_TAG_TRANSIENT) : NULL;
    fr_tensor *count = mask ? fr_empty_like(m, FR_TAG_TRANSIENT) : NULL;
    fr_status st = count ? fr_reduce_max_out(m, x) : fr_last_status();
    if (st == FR_OK)
        st = fr_bcast_binary_out(mask, x, m, FR_BINARY_EQ);
    if (st == FR_OK)
        st = fr_reduce_sum_out(count, mask, 1.0f);
    if (st == FR_OK) /* m is free again: the gradient per maximum */
        st = fr_bcast_binary_out(m, gv, count, FR_BINARY_DIV);
    if (st == FR_OK)
        st = fr_bcast_binary_out(dx, mask, m, FR_BINARY_MUL);
    fr_release(m);
    fr_release(mask);
    fr_release(count);
    return st;
}

/* dx: dy spread back over the reduced dims (sum, mean) or onto the maxima.
 * A mean scales the small dy before spreading it, which writes the same
 * products as scaling dx afterwards, in one pass over dx instead of two. */
static fr_status reduce_dims_grad(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x,
                                  const void *ctx) {
    const reduce_dims_ctx *c = ctx;
    fr_tensor *gv = fr_view((fr_tensor *)dy, c->ndim, c->kept);
    if (!gv)
        return fr_last_status();
    fr_status st;
    if (c->max) {
        st = max_grad(dx, c, gv, x);
    } else if (c->scale != 1.0f) {
        fr_tensor *gs = fr_empty_like(gv, FR_TAG_TRANSIENT);
        st = gs ? fr_scale_out(gs, gv, c->scale) : fr_last_status();
        if (st == FR_OK)
            st = fr_bcast_binary_out(dx, gs, NULL, FR_BINARY_FIRST);
        fr_release(gs);
    } else {
        st = fr_bcast_binary_out(dx, gv, NULL, FR_BINARY_FIRST);
    }
    fr_release(gv);
    return st;
}

typedef enum { REDUCE_SUM, REDUCE_MEAN, REDUCE_MAX } reduce_kind;

static fr_tensor *reduce_dims(const char *op, fr_tensor *x, int ndims, const int *dims,
                              bool keepdim, reduce_kind kind) {
    if (fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    if (!fr_dtype_is_float(x->dtype)) { /* named here, not by the kernel's reduce_sum */
        fr_error(FR_ERR_DTYPE, "%s: x must be f32, f16 or bf16, got %s", op, fr_dtype_name(x->dtype));
        return NULL;
    }
    if (ndims < 1 || ndims > x->ndim || !dims) {
        fr_error(FR_ERR_ARG, "%s: %d dims for a tensor of %d dims", op, ndims, x->ndim);
        return NULL;
    }
    bool red[FR_MAX_DIMS] = {false};
    for (int i = 0; i < ndims; i++) {
        int d = dims[i] < 0 ? dims[i] + x->ndim : dims[i];
        if (d < 0 || d >= x->ndim || red[d]) {
            fr_error(FR_ERR_ARG, "%s: dim %d is out of range for %d dims or repeated", op, dims[i],
                     x->ndim);
            return NULL;
        }
        red[d] = true;
    }
    reduce_dims_ctx c = {.ndim = x->ndim, .max = kind == REDUCE_MAX};
    int64_t out_shape[FR_MAX_DIMS], count = 1;
    int out_nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        c.shape[d] = x->shape[d];
        c.kept[d] = red[d] ? 1 : x->shape[d];
        count *= red[d] ? x->shape[d] : 1;
        if (!red[d] || keepdim)
            out_shape[out_nd++] = c.kept[d];
    }
    c.scale = kind == REDUCE_MEAN ? (count ? 1.0f / (float)count : 0.0f) : 1.0f;
    fr_tensor *cx = fr_contiguous(x, FR_TAG_TRANSIENT);
    fr_tensor *full = cx ? fr_empty(fr_device_of(x), x->dtype, x->ndim, c.kept, FR_TAG_TRANSIENT) : NULL;
    bool ok = full && (kind == REDUCE_MAX ? fr_reduce_max_out(full, cx)
                                          : fr_reduce_sum_out(full, cx, c.scale)) == FR_OK;
    fr_tensor *y = ok ? fr_view(full, out_nd, out_shape) : NULL;
    fr_release(full);
    if (!y) {
        fr_release(cx);
        return NULL;
    }
    /* a view starts with no autograd state of its own */
    y->requires_grad = false;
    y->grad_fn = NULL;
    if (fr_record_unary_grad(op, reduce_dims_grad, x, y, &c, sizeof c, c.max ? cx : NULL) != FR_OK)
        fr_clear(&y);
    fr_release(cx);
    return y;
}

fr_tensor *fr_sum_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce_dims("sum_dims", x, ndims, dims, keepdim, REDUCE_SUM);
}
fr_tensor *fr_mean_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce_dims("mean_dims", x, ndims, dims, keepdim, REDUCE_MEAN);
}
fr_tensor *fr_amax_dims(fr_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce_dims("amax_dims", x, ndims, dims, keepdim, REDUCE_MAX);
}
