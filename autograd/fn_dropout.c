/* fn_dropout.c: differentiable dropout that keeps no mask (functions.h). */
#include <stdlib.h>

#include "functions.h"
#include "node.h"

typedef struct {
    float p;
    uint64_t seed;
} dropout_ctx;

static fr_status dropout_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const dropout_ctx *c = node->ctx;
    din[0] = fr_empty_like(dout[0], FR_TAG_TRANSIENT);
    if (!din[0])
        return fr_last_status();
    return fr_dropout_backward(din[0], dout[0], c->p, c->seed);
}

fr_tensor *fr_dropout(fr_tensor *x, float p, bool training) {
    if (fr_check_defined("dropout", "x", x) != FR_OK)
        return NULL;
    if (!(p >= 0.0f && p < 1.0f)) {
        fr_error(FR_ERR_ARG, "dropout: p must be in [0, 1), got %g", (double)p);
        return NULL;
    }
    if (!training || p == 0.0f)
        return fr_retain(x);
    uint64_t seed = fr_random_next_seed();
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    if (!y || fr_dropout_forward(y, x, p, seed) != FR_OK) {
        fr_release(y);
        return NULL;
    }
    if (fr_should_record(1, &x)) {
        dropout_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new("dropout", dropout_backward, 1, &x, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "dropout: out of memory");
            free(c);
            fr_release(y);
            return NULL;
        }
        *c = (dropout_ctx){.p = p, .seed = seed};
        fr_node_set_ctx(node, c, NULL);
        fr_node_set_output(node, 0, y);
    }
    return y;
}
