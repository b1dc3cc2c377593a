/* fn_upsample.c: differentiable upsampling (nearest, bilinear). Its
 * gradient depends on shapes only, so the node saves no tensor: an
 * upsampled decoder keeps nothing for it. */
#include <stdlib.h>
#include <string.h>

#include "functions.h"
#include "node.h"

typedef struct {
    fr_upsample_opts o;
    int64_t x_shape[4];
    fr_dtype x_dtype;
} upsample_ctx;

static fr_status upsample_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const upsample_ctx *c = node->ctx;
    fr_tensor *dx = fr_empty(fr_device_of(dout[0]), c->x_dtype, 4, c->x_shape, FR_TAG_TRANSIENT);
    fr_status st = dx ? fr_upsample_backward(dx, dout[0], c->o) : fr_last_status();
    if (st != FR_OK) {
        fr_release(dx);
        return st;
    }
    din[0] = dx;
    return FR_OK;
}

fr_tensor *fr_upsample(fr_tensor *x, fr_upsample_opts o) {
    fr_upsample_shape s;
    if (fr_check_defined("upsample", "x", x) != FR_OK || fr_upsample_shape_of(x, o, &s) != FR_OK)
        return NULL;
    fr_tensor *y = fr_empty(fr_device_of(x), x->dtype, 4, FR_SHAPE(s.n, s.c, s.oh, s.ow),
                            FR_TAG_TRANSIENT);
    if (!y)
        return NULL;
    fr_status st = fr_upsample_forward(y, x, o);
    if (st == FR_OK && fr_should_record(1, &x)) {
        upsample_ctx *c = calloc(1, sizeof *c);
        fr_node *node = c ? fr_node_new("upsample", upsample_backward, 1, &x, 1) : NULL;
        if (!node) {
            free(c);
            st = c ? fr_last_status() : fr_error(FR_ERR_OOM, "upsample: out of memory recording a node");
        } else {
            c->o = o;
            memcpy(c->x_shape, x->shape, sizeof c->x_shape);
            c->x_dtype = x->dtype;
            fr_node_set_ctx(node, c, NULL);
            fr_node_set_output(node, 0, y);
        }
    }
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}
