/* fn_layout.c: differentiable changes of memory layout between NCHW and
 * channels last (tensor.h: fr_is_channels_last), for a model's
 * channels-last mode: the model's layers keep its activations channels last
 * between convolutions and norms, and hand every other layer an NCHW copy
 * (docs/ARCHITECTURE.md, layout between ops). Same values, other bytes: the
 * gradient goes back through the opposite copy. */
#include "functions.h"
#include "node.h"
#include "../cpu/layout.h"

fr_tensor *fr_layout_copy(const fr_tensor *t, bool channels_last) {
    if (fr_check_defined("layout_copy", "t", t) != FR_OK)
        return NULL;
    if (fr_is_channels_last(t) == channels_last && (channels_last || fr_is_contiguous(t)))
        return fr_retain((fr_tensor *)t);
    if (t->ndim != 4 || t->dtype != FR_F32 || fr_device_of(t) != FR_CPU) {
        char buf[96];
        fr_error(FR_ERR_ARG, "layout_copy: channels last is for f32 (N, C, H, W) CPU tensors, got "
                 "%s %s", fr_dtype_name(t->dtype), fr_shape_str(t, buf, sizeof buf));
        return NULL;
    }
    fr_tensor *out = channels_last ? fr_empty_channels_last(FR_CPU, t->shape, FR_TAG_TRANSIENT)
                                   : fr_empty(FR_CPU, FR_F32, 4, t->shape, FR_TAG_TRANSIENT);
    if (!out)
        return NULL;
    int n = (int)t->shape[0], c = (int)t->shape[1], hw = (int)(t->shape[2] * t->shape[3]);
    fr_status st = FR_OK;
    if (channels_last && fr_is_contiguous(t))
        fr_cpu_nchw_to_nhwc(fr_data_f32(out), fr_data_f32(t), n, c, hw);
    else if (!channels_last && fr_is_channels_last(t))
        fr_cpu_nhwc_to_nchw(fr_data_f32(out), fr_data_f32(t), n, c, hw);
    else
        st = fr_copy_(out, t); /* any other strides: element by element */
    if (st != FR_OK)
        fr_clear(&out);
    return out;
}

static fr_status to_nchw_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    (void)node;
    return (din[0] = fr_layout_copy(dout[0], true)) ? FR_OK : fr_last_status();
}

static fr_status to_channels_last_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    (void)node;
    return (din[0] = fr_layout_copy(dout[0], false)) ? FR_OK : fr_last_status();
}

/* x itself when it is in the layout already, else a recorded copy */
static fr_tensor *to_layout(fr_tensor *x, bool channels_last) {
    const char *op = channels_last ? "to_channels_last" : "to_nchw";
    if (fr_check_defined(op, "x", x) != FR_OK)
        return NULL;
    if (fr_is_channels_last(x) == channels_last)
        return fr_retain(x);
    fr_tensor *y = fr_layout_copy(x, channels_last);
    if (y && fr_should_record(1, &x)) {
        fr_node *node = fr_node_new(op, channels_last ? to_channels_last_backward : to_nchw_backward, 1, &x, 1);
        if (!node)
            fr_clear(&y);
        else
            fr_node_set_output(node, 0, y);
    }
    return y;
}

fr_tensor *fr_to_nchw(fr_tensor *x) { return to_layout(x, false); }

fr_tensor *fr_to_channels_last(fr_tensor *x) { return to_layout(x, true); }
