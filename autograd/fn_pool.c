/* fn_pool.c: differentiable max, average, adaptive average and global
 * average pooling.
 *
 * Max pooling saves x and finds each window's argmax again in backward, so no
 * index tensor is ever kept; average pooling (adaptive too) saves nothing at all (its
 * gradient depends only on shapes, which the context holds). */
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"

typedef enum { POOL_MAX, POOL_AVG, POOL_GLOBAL, POOL_ADAPTIVE } pool_kind;

typedef struct {
    pool_kind kind;
    fr_pool_params p;
    int64_t x_shape[4];
    fr_dtype x_dtype; /* dx's: the output and gradients follow the input's dtype */
    int x; /* saved slot (max pooling), else -1 */
} pool_ctx;

static fr_status pool_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const pool_ctx *c = node->ctx;
    fr_tensor *x = c->x >= 0 ? fr_node_unpack(node, c->x) : NULL;
    if (c->x >= 0 && !x)
        return fr_last_status();
    fr_tensor *dx = fr_empty(fr_device_of(dout[0]), c->x_dtype, 4, c->x_shape, FR_TAG_TRANSIENT);
    fr_status st = !dx                   ? fr_last_status()
                   : c->kind == POOL_MAX ? fr_max_pool2d_backward(dx, dout[0], x, c->p)
                   : c->kind == POOL_AVG ? fr_avg_pool2d_backward(dx, dout[0], c->p)
                   : c->kind == POOL_ADAPTIVE ? fr_adaptive_avg_pool2d_backward(dx, dout[0])
                                              : fr_global_avg_pool_backward(dx, dout[0]);
    fr_release(x);
    if (st != FR_OK) {
        fr_release(dx);
        return st;
    }
    din[0] = dx;
    return FR_OK;
}

static fr_status pool_record(const char *op, pool_kind kind, fr_pool_params p, fr_tensor *x,
                             fr_tensor *y) {
    pool_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return fr_error(FR_ERR_OOM, "%s: out of memory recording a node", op);
    fr_node *node = fr_node_new(op, pool_backward, 1, &x, 1);
    if (!node) {
        free(c);
        return fr_last_status();
    }
    c->kind = kind;
    c->p = p;
    memcpy(c->x_shape, x->shape, sizeof c->x_shape);
    c->x_dtype = x->dtype;
    c->x = -1;
    fr_node_set_ctx(node, c, NULL);
    if (kind == POOL_MAX && (c->x = fr_node_save(node, x)) < 0)
        return fr_last_status();
    fr_node_set_output(node, 0, y);
    return FR_OK;
}

/* p: the window; for POOL_ADAPTIVE p.kernel and p.stride carry the
 * output's height and width. */
static fr_tensor *pool(const char *op, pool_kind kind, fr_tensor *x, fr_pool_params p) {
    fr_pool_shape s;
    if (fr_check_defined(op, "x", x) != FR_OK || fr_check_ndim(op, "x", x, 4) != FR_OK)
        return NULL;
    if (kind == POOL_ADAPTIVE) {
        if (p.kernel < 1 || p.stride < 1) {
            fr_error(FR_ERR_ARG, "%s: output size %dx%d must be positive", op, p.kernel, p.stride);
            return NULL;
        }
        s = (fr_pool_shape){.n = (int)x->shape[0], .c = (int)x->shape[1], .oh = p.kernel,
                            .ow = p.stride};
    } else if (kind != POOL_GLOBAL && fr_pool2d_shape(x, p, &s) != FR_OK)
        return NULL;
    fr_tensor *y = kind == POOL_GLOBAL
                       ? fr_empty(fr_device_of(x), x->dtype, 2, FR_SHAPE(x->shape[0], x->shape[1]),
                                  FR_TAG_TRANSIENT)
                       : fr_empty(fr_device_of(x), x->dtype, 4, FR_SHAPE(s.n, s.c, s.oh, s.ow),
                                  FR_TAG_TRANSIENT);
    if (!y)
        return NULL;
    fr_status st = kind == POOL_MAX        ? fr_max_pool2d_forward(y, x, p)
                   : kind == POOL_AVG      ? fr_avg_pool2d_forward(y, x, p)
                   : kind == POOL_ADAPTIVE ? fr_adaptive_avg_pool2d_forward(y, x)
                                           : fr_global_avg_pool_forward(y, x);
    if (st == FR_OK && fr_should_record(1, &x))
        st = pool_record(op, kind, p, x, y);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}

fr_tensor *fr_max_pool2d(fr_tensor *x, fr_pool_params p) { return pool("max_pool2d", POOL_MAX, x, p); }
fr_tensor *fr_avg_pool2d(fr_tensor *x, fr_pool_params p) { return pool("avg_pool2d", POOL_AVG, x, p); }
fr_tensor *fr_global_avg_pool(fr_tensor *x) {
    return pool("global_avg_pool", POOL_GLOBAL, x, (fr_pool_params){0, 0, 0});
}
fr_tensor *fr_adaptive_avg_pool2d(fr_tensor *x, int out_h, int out_w) {
    return pool("adaptive_avg_pool2d", POOL_ADAPTIVE, x, (fr_pool_params){out_h, out_w, 0});
}
