/* fn_concat.c: differentiable concat along channels. Backward needs no
 * saved tensor, only each input's channel count: input i's gradient is its
 * slice of dout, copied out for the inputs that want one. */
#include <stdio.h>
#include <stdlib.h>

#include "functions.h"

typedef struct {
    int count;
    int64_t channels[]; /* of each input */
} concat_ctx;

static fr_status concat_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const concat_ctx *c = node->ctx;
    fr_tensor *g = dout[0]; // (N, sum Ci, ...)
    int64_t shape[FR_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++)
        shape[d] = g->shape[d];
    int64_t c0 = 0;
    for (int i = 0; i < c->count; i++) {
        int64_t ci = c->channels[i];
        if (fr_node_needs_grad(node, i)) {
            shape[1] = ci;
            fr_tensor *slice = fr_narrow(g, 1, c0, ci);
            din[i] = slice ? fr_empty(node->device, FR_F32, g->ndim, shape, FR_TAG_TRANSIENT) : NULL;
            fr_status st = din[i] ? fr_concat_backward(&din[i], 1, slice) : fr_last_status();
            fr_release(slice);
            FR_TRY(st);
        }
        c0 += ci;
    }
    return FR_OK;
}

fr_tensor *fr_concat(fr_tensor *const *inputs, int count) {
    char arg[32];
    if (!inputs || count < 1) {
        fr_error(FR_ERR_ARG, "concat: needs at least one input, got %d", inputs ? count : 0);
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (fr_check_defined("concat", arg, inputs[i]) != FR_OK)
            return NULL;
        if (inputs[i]->ndim < 2) {
            char buf[96];
            fr_error(FR_ERR_SHAPE, "concat: %s has shape %s, expected (N, C, ...)", arg,
                     fr_shape_str(inputs[i], buf, sizeof buf));
            return NULL;
        }
    }
    int64_t shape[FR_MAX_DIMS];
    const fr_tensor *first = inputs[0];
    for (int d = 0; d < first->ndim; d++)
        shape[d] = first->shape[d];
    shape[1] = 0;
    for (int i = 0; i < count; i++)
        shape[1] += inputs[i]->shape[1];
    fr_tensor *y = fr_empty(fr_device_of(first), FR_F32, first->ndim, shape, FR_TAG_TRANSIENT);
    if (!y || fr_concat_forward(y, inputs, count) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    if (fr_should_record(count, inputs)) {
        concat_ctx *c = malloc(sizeof *c + (size_t)count * sizeof c->channels[0]);
        fr_node *node = c ? fr_node_new("concat", concat_backward, count, inputs, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "concat: out of memory");
            free(c);
            fr_release(y);
            return NULL;
        }
        c->count = count;
        for (int i = 0; i < count; i++)
            c->channels[i] = inputs[i]->shape[1];
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
    }
    return y;
}
