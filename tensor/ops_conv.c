/* ops_conv.c: checked 2-d convolution, groups = 1 (see ops.h). x (N, C, H, W),
 * w (K, C, R, S), b (K), y (N, K, OH, OW) with OH = (H + 2 pad - R) / stride
 * + 1 (floor), the same along the width. */
#include <limits.h>

#include "ops.h"

fr_status fr_conv2d_shape(const fr_tensor *x, const fr_tensor *w, fr_conv_params p, fr_conv_shape *s) {
    const char *op = "conv2d";
    char sx[96], sw[96];
    FR_TRY(fr_check_ndim(op, "x", x, 4));
    FR_TRY(fr_check_ndim(op, "w", w, 4));
    fr_shape_str(x, sx, sizeof sx);
    fr_shape_str(w, sw, sizeof sw);
    if (p.stride < 1 || p.pad < 0)
        return fr_error(FR_ERR_ARG, "conv2d: stride must be >= 1 and pad >= 0, got stride %d, pad %d",
                        p.stride, p.pad);
    if (x->shape[1] != w->shape[1])
        return fr_error(FR_ERR_SHAPE,
                        "conv2d: x %s has %lld channels but w %s expects %lld (w is (K, C, R, S))", sx,
                        (long long)x->shape[1], sw, (long long)w->shape[1]);
    for (int i = 0; i < 4; i++)
        if (x->shape[i] > INT_MAX / 4 || w->shape[i] > INT_MAX / 4)
            return fr_error(FR_ERR_SHAPE, "conv2d: x %s or w %s is too large for the kernels", sx, sw);
    int64_t ph = x->shape[2] + 2 * (int64_t)p.pad, pw = x->shape[3] + 2 * (int64_t)p.pad;
    if (w->shape[0] < 1 || w->shape[2] < 1 || w->shape[3] < 1 || w->shape[2] > ph ||
        w->shape[3] > pw)
        return fr_error(FR_ERR_SHAPE,
                        "conv2d: w %s does not fit the input: x %s padded by %d is %lldx%lld", sw, sx,
                        p.pad, (long long)ph, (long long)pw);
    int64_t oh = (ph - w->shape[2]) / p.stride + 1, ow = (pw - w->shape[3]) / p.stride + 1;
    if (oh * ow > INT_MAX || w->shape[1] * w->shape[2] * w->shape[3] > INT_MAX ||
        x->shape[2] * x->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "conv2d: x %s with w %s is too large for the kernels", sx, sw);
    *s = (fr_conv_shape){
        .n = (int)x->shape[0], .c = (int)x->shape[1], .h = (int)x->shape[2], .w = (int)x->shape[3],
        .k = (int)w->shape[0], .r = (int)w->shape[2], .s = (int)w->shape[3],
        .oh = (int)oh, .ow = (int)ow, .stride = p.stride, .pad = p.pad,
    };
    return FR_OK;
}

/* f32, contiguous, on ref's device, and (when shape != NULL) 4-d of that shape. */
static fr_status check_t(const char *op, const char *arg, const fr_tensor *t, const int64_t *shape,
                         const char *ref_name, const fr_tensor *ref) {
    FR_TRY(fr_check_f32c(op, arg, t));
    if (shape)
        FR_TRY(fr_check_shape(op, arg, t, 4, shape));
    return fr_check_same_device(op, arg, t, ref_name, ref);
}

fr_status fr_conv2d_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b,
                            fr_conv_params p) {
    const char *op = "conv2d";
    fr_conv_shape s;
    FR_TRY(check_t(op, "x", x, NULL, "x", x));
    FR_TRY(check_t(op, "w", w, NULL, "x", x));
    FR_TRY(fr_conv2d_shape(x, w, p, &s));
    FR_TRY(check_t(op, "y", y, FR_SHAPE(s.n, s.k, s.oh, s.ow), "x", x));
    if (b) {
        FR_TRY(fr_check_f32c(op, "b", b));
        FR_TRY(fr_check_shape(op, "b", b, 1, FR_SHAPE(s.k)));
        FR_TRY(fr_check_same_device(op, "b", b, "x", x));
    }
    fr_device dev = fr_device_of(x);
    FR_TRY(FR_CALL_KERNEL(dev, conv2d_fwd, fr_data_f32(y), fr_data_f32(x), fr_data_f32(w), &s));
    if (b)
        FR_TRY(FR_CALL_KERNEL(dev, bias_add, fr_data_f32(y), fr_data_f32(b), s.n, s.k, s.oh * s.ow));
    return FR_OK;
}

/* Everything is checked before anything is computed, so a bad argument never
 * leaves some gradients written and others not. The input's shape comes from
 * x or, when only dx is wanted (x may then be NULL), from dx; the weight's
 * from w or dw. */
fr_status fr_conv2d_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                             const fr_tensor *x, const fr_tensor *w, fr_conv_params p) {
    const char *op = "conv2d_backward";
    FR_TRY(check_t(op, "dy", dy, NULL, "dy", dy));
    FR_TRY(fr_check_ndim(op, "dy", dy, 4));
    fr_conv_shape s = {0};
    if (dx || dw) {
        if (dx)
            FR_TRY(check_t(op, "w", w, NULL, "dy", dy));
        if (dw)
            FR_TRY(check_t(op, "x", x, NULL, "dy", dy));
        const fr_tensor *xs = x ? x : dx, *ws = w ? w : dw;
        FR_TRY(check_t(op, x ? "x" : "dx", xs, NULL, "dy", dy));
        FR_TRY(check_t(op, w ? "w" : "dw", ws, NULL, "dy", dy));
        FR_TRY(fr_conv2d_shape(xs, ws, p, &s));
        FR_TRY(fr_check_shape(op, "dy", dy, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow)));
        if (dx)
            FR_TRY(check_t(op, "dx", dx, FR_SHAPE(s.n, s.c, s.h, s.w), "dy", dy));
        if (dw)
            FR_TRY(check_t(op, "dw", dw, FR_SHAPE(s.k, s.c, s.r, s.s), "dy", dy));
    }
    if (db) {
        FR_TRY(fr_check_f32c(op, "db", db));
        FR_TRY(fr_check_shape(op, "db", db, 1, FR_SHAPE(dy->shape[1])));
        FR_TRY(fr_check_same_device(op, "db", db, "dy", dy));
    }
    fr_device dev = fr_device_of(dy);
    if (dw)
        FR_TRY(FR_CALL_KERNEL(dev, conv2d_bwd_weight, fr_data_f32(dw), fr_data_f32(dy),
                              fr_data_f32(x), &s));
    if (dx)
        FR_TRY(FR_CALL_KERNEL(dev, conv2d_bwd_data, fr_data_f32(dx), fr_data_f32(dy), fr_data_f32(w),
                              &s));
    if (db)
        FR_TRY(FR_CALL_KERNEL(dev, bias_grad, fr_data_f32(db), fr_data_f32(dy), (int)dy->shape[0],
                              (int)dy->shape[1], (int)(dy->shape[2] * dy->shape[3])));
    return FR_OK;
}
