/* fn_cast.c: differentiable dtype conversion between f32, f16 and bf16
 * (functions.h). The gradient is converted back to the input's dtype: the
 * rounding is treated as the identity, as every mixed-precision framework
 * does. Nothing is saved; the node only remembers the input's dtype. */
#include <stdlib.h>

#include "functions.h"
#include "node.h"

typedef struct {
    fr_dtype from;
} cast_ctx;

static fr_status cast_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const cast_ctx *c = node->ctx;
    din[0] = fr_to_dtype(dout[0], c->from, FR_TAG_TRANSIENT);
    return din[0] ? FR_OK : fr_last_status();
}

fr_tensor *fr_cast(fr_tensor *x, fr_dtype dtype) {
    if (fr_check_defined("cast", "x", x) != FR_OK)
        return NULL;
    if (!fr_dtype_is_float(x->dtype) || !fr_dtype_is_float(dtype)) {
        fr_error(FR_ERR_DTYPE, "cast: differentiable casts are between f32, f16 and bf16, not %s to %s",
                 fr_dtype_name(x->dtype), fr_dtype_name(dtype));
        return NULL;
    }
    if (x->dtype == dtype)
        return fr_retain(x);
    fr_tensor *y = fr_to_dtype(x, dtype, FR_TAG_TRANSIENT);
    if (!y || !fr_should_record(1, &x))
        return y;
    cast_ctx *c = malloc(sizeof *c);
    fr_node *node = c ? fr_node_new("cast", cast_backward, 1, &x, 1) : NULL;
    if (!node) {
        if (!c)
            fr_error(FR_ERR_OOM, "cast: out of memory");
        free(c);
        fr_release(y);
        return NULL;
    }
    c->from = x->dtype;
    fr_node_set_ctx(node, c, NULL);
    fr_node_set_output(node, 0, y);
    return y;
}

fr_dtype fr_autocast_out_dtype(const fr_tensor *x) {
    fr_dtype mode = fr_autocast_dtype();
    return mode != FR_F32 ? mode : x->dtype;
}

fr_tensor *fr_autocast_weight(fr_tensor *w, fr_dtype compute) {
    if (!w || w->dtype == compute || !fr_dtype_is_float(compute) || !fr_dtype_is_float(w->dtype))
        return fr_retain(w);
    /* Workspace, not an activation: it lives for one op call. */
    return fr_to_dtype(w, compute, FR_TAG_WORKSPACE);
}
