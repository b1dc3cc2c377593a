/* ops_conv.c: checked 2-d convolution, grouped and dilated, and the
 * transposed convolution (see ops.h). x (N, C, H, W), w (K, C/groups, R, S),
 * b (K), y (N, K, OH, OW) with OH = (H + 2 pad - dilation (R - 1) - 1) /
 * stride + 1 (floor), the same along the width. */
#include <limits.h>

#include "ops.h"
#include "staging.h"

/* groups and dilation with their defaults (0 -> 1), or an error naming op. */
static fr_status conv_factors(const char *op, int groups, int dilation, int *g, int *d) {
    if (groups < 0 || dilation < 0)
        return fr_error(FR_ERR_ARG, "%s: groups and dilation must be >= 1, got groups %d, "
                        "dilation %d", op, groups, dilation);
    *g = groups ? groups : 1;
    *d = dilation ? dilation : 1;
    return FR_OK;
}

/* C input and K output channels both split into g groups, or an error. */
static fr_status check_groups(const char *op, const char *sx, const char *sw, int64_t c, int64_t k,
                              int g) {
    if (c % g || k % g)
        return fr_error(FR_ERR_SHAPE, "%s: groups %d must divide the %lld input and %lld output "
                        "channels (x %s, w %s)", op, g, (long long)c, (long long)k, sx, sw);
    return FR_OK;
}

static fr_status check_sizes(const char *op, const fr_tensor *x, const fr_tensor *w, const char *sx,
                             const char *sw) {
    for (int i = 0; i < 4; i++)
        if (x->shape[i] > INT_MAX / 4 || w->shape[i] > INT_MAX / 4)
            return fr_error(FR_ERR_SHAPE, "%s: x %s or w %s is too large for the kernels", op, sx, sw);
    return FR_OK;
}

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
    int g = 1, d = 1;
    FR_TRY(conv_factors(op, p.groups, p.dilation, &g, &d));
    FR_TRY(check_groups(op, sx, sw, x->shape[1], w->shape[0], g));
    if (x->shape[1] != w->shape[1] * g)
        return fr_error(FR_ERR_SHAPE,
                        "conv2d: x %s has %lld channels but w %s expects %lld (w is (K, C/groups, "
                        "R, S), groups %d)", sx, (long long)x->shape[1], sw,
                        (long long)(w->shape[1] * g), g);
    FR_TRY(check_sizes(op, x, w, sx, sw));
    int64_t ph = x->shape[2] + 2 * (int64_t)p.pad, pw = x->shape[3] + 2 * (int64_t)p.pad;
    int64_t rh = (int64_t)d * (w->shape[2] - 1) + 1, rw = (int64_t)d * (w->shape[3] - 1) + 1;
    if (w->shape[0] < 1 || w->shape[2] < 1 || w->shape[3] < 1 || rh > ph || rw > pw)
        return fr_error(FR_ERR_SHAPE,
                        "conv2d: w %s with dilation %d does not fit the input: x %s padded by %d is "
                        "%lldx%lld", sw, d, sx, p.pad, (long long)ph, (long long)pw);
    int64_t oh = (ph - rh) / p.stride + 1, ow = (pw - rw) / p.stride + 1;
    if (oh * ow > INT_MAX || w->shape[1] * w->shape[2] * w->shape[3] > INT_MAX ||
        x->shape[2] * x->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "conv2d: x %s with w %s is too large for the kernels", sx, sw);
    *s = (fr_conv_shape){
        .n = (int)x->shape[0], .c = (int)x->shape[1], .h = (int)x->shape[2], .w = (int)x->shape[3],
        .k = (int)w->shape[0], .r = (int)w->shape[2], .s = (int)w->shape[3],
        .oh = (int)oh, .ow = (int)ow, .stride = p.stride, .pad = p.pad, .groups = g, .dilation = d,
    };
    return FR_OK;
}

/* The transposed convolution is the convolution's data gradient (and its
 * gradients the convolution's forward and weight gradient), so it is
 * described by the convolution it transposes: s's input (N, C, H, W) is the
 * transposed op's output (N, Cout, OH, OW), s's output (N, K, OH', OW') its
 * input x (N, Cin, H, W), and w (Cin, Cout/groups, R, S) is that
 * convolution's weight (K, C/groups, R, S) as it is, PyTorch's layout. */
fr_status fr_conv_transpose2d_shape(const fr_tensor *x, const fr_tensor *w,
                                    fr_conv_transpose_params p, fr_conv_shape *s) {
    const char *op = "conv_transpose2d";
    char sx[96], sw[96];
    FR_TRY(fr_check_ndim(op, "x", x, 4));
    FR_TRY(fr_check_ndim(op, "w", w, 4));
    fr_shape_str(x, sx, sizeof sx);
    fr_shape_str(w, sw, sizeof sw);
    int g = 1, d = 1;
    FR_TRY(conv_factors(op, p.groups, p.dilation, &g, &d));
    if (p.stride < 1 || p.pad < 0 || p.output_pad < 0)
        return fr_error(FR_ERR_ARG, "conv_transpose2d: stride must be >= 1, pad and output_pad >= 0, "
                        "got stride %d, pad %d, output_pad %d", p.stride, p.pad, p.output_pad);
    /* PyTorch also takes output_pad < dilation alone; then the output has
     * rows no input pixel reaches past the convolution's own, which the
     * kernels' padding rule does not describe: refused rather than guessed. */
    if (p.output_pad >= p.stride)
        return fr_error(FR_ERR_ARG, "conv_transpose2d: output_pad %d must be smaller than stride %d "
                        "(dilation %d)", p.output_pad, p.stride, d);
    if (x->shape[1] != w->shape[0])
        return fr_error(FR_ERR_SHAPE, "conv_transpose2d: x %s has %lld channels but w %s expects "
                        "%lld (w is (Cin, Cout/groups, R, S))", sx, (long long)x->shape[1], sw,
                        (long long)w->shape[0]);
    FR_TRY(check_groups(op, sx, sw, x->shape[1], w->shape[1] * g, g));
    FR_TRY(check_sizes(op, x, w, sx, sw));
    int64_t oh = (x->shape[2] - 1) * p.stride - 2 * (int64_t)p.pad + (int64_t)d * (w->shape[2] - 1) +
                 p.output_pad + 1;
    int64_t ow = (x->shape[3] - 1) * p.stride - 2 * (int64_t)p.pad + (int64_t)d * (w->shape[3] - 1) +
                 p.output_pad + 1;
    if (w->shape[1] < 1 || w->shape[2] < 1 || w->shape[3] < 1 || x->shape[2] < 1 ||
        x->shape[3] < 1 || oh < 1 || ow < 1)
        return fr_error(FR_ERR_SHAPE, "conv_transpose2d: x %s with w %s, stride %d, pad %d gives "
                        "no output (%lldx%lld)", sx, sw, p.stride, p.pad, (long long)oh,
                        (long long)ow);
    if (oh * ow > INT_MAX || w->shape[1] * g > INT_MAX / 4 ||
        w->shape[1] * w->shape[2] * w->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "conv_transpose2d: x %s with w %s is too large for the "
                        "kernels", sx, sw);
    *s = (fr_conv_shape){
        .n = (int)x->shape[0], .c = (int)(w->shape[1] * g), .h = (int)oh, .w = (int)ow,
        .k = (int)x->shape[1], .r = (int)w->shape[2], .s = (int)w->shape[3],
        .oh = (int)x->shape[2], .ow = (int)x->shape[3], .stride = p.stride, .pad = p.pad,
        .groups = g, .dilation = d,
    };
    return FR_OK;
}

/* f32 / f16 / bf16, contiguous, on ref's device, and (when shape != NULL)
 * 4-d of that shape. */
static fr_status check_t(const char *op, const char *arg, const fr_tensor *t, const int64_t *shape,
                         const char *ref_name, const fr_tensor *ref) {
    FR_TRY(fr_check_floatc(op, arg, t));
    if (shape)
        FR_TRY(fr_check_shape(op, arg, t, 4, shape));
    return fr_check_same_device(op, arg, t, ref_name, ref);
}

static fr_status check_bias(const char *op, const char *arg, const fr_tensor *b, int k,
                            const fr_tensor *ref) {
    FR_TRY(fr_check_f32c(op, arg, b));
    FR_TRY(fr_check_shape(op, arg, b, 1, FR_SHAPE(k)));
    return fr_check_same_device(op, arg, b, "x", ref);
}

/* Half operands are run a block of images at a time (staging.h): the
 * kernels see f32 x / y / dy blocks of `imgs` images, and f32 weights. s is
 * the convolution; a transposed op's input is s's output and its output
 * s's input, so `t` swaps which image size is the op's input. */
static size_t x_img(const fr_conv_shape *s) { return (size_t)s->c * s->h * s->w; }
static size_t y_img(const fr_conv_shape *s) { return (size_t)s->k * s->oh * s->ow; }
static size_t in_img(const fr_conv_shape *s, bool t) { return t ? y_img(s) : x_img(s); }
static size_t out_img(const fr_conv_shape *s, bool t) { return t ? x_img(s) : y_img(s); }

static size_t images_per_block(const fr_tensor *a, const fr_tensor *b, const fr_conv_shape *s) {
    size_t unit = x_img(s) > y_img(s) ? x_img(s) : y_img(s);
    return fr_stage_block_units((const fr_tensor *[]){a, b}, 2, unit, (size_t)s->n);
}

/* Three half operands of one dtype go first to the backend's half compute
 * (kernels.def: conv2d_half), which may decline; *done says whether it ran. */
static fr_status try_half(fr_tensor *out, const fr_tensor *in0, const fr_tensor *in1, int direction,
                          const fr_conv_shape *s, bool *done) {
    *done = false;
    if (out->dtype == FR_F32 || in0->dtype != out->dtype || in1->dtype != out->dtype)
        return FR_OK;
    return FR_CALL_KERNEL(fr_device_of(out), conv2d_half, fr_data(out), fr_data(in0), fr_data(in1),
                          out->dtype, direction, s, done);
}

/* The op's output channels and pixels (for the bias). */
static int out_channels(const fr_conv_shape *s, bool t) { return t ? s->c : s->k; }
static int out_pixels(const fr_conv_shape *s, bool t) { return t ? s->h * s->w : s->oh * s->ow; }

/* y = op(x, w) + b for checked tensors: the convolution's forward, or for
 * the transposed op the convolution's data gradient. */
static fr_status forward_checked(fr_tensor *y, const fr_tensor *x, const fr_tensor *w,
                                 const fr_tensor *b, const fr_conv_shape *s, bool t) {
    fr_device dev = fr_device_of(x);
    fr_stage sw;
    FR_TRY(fr_stage_in(&sw, w, 0, (size_t)fr_numel(w)));
    size_t per = images_per_block(x, y, s), xi = in_img(s, t), yi = out_img(s, t);
    fr_status st = FR_OK;
    for (size_t n0 = 0; n0 < (size_t)s->n && st == FR_OK; n0 += per) {
        fr_conv_shape sb = *s;
        sb.n = (int)((size_t)s->n - n0 < per ? (size_t)s->n - n0 : per);
        fr_stage sx, sy;
        st = fr_stage_in(&sx, x, n0 * xi, sb.n * xi);
        if (st != FR_OK)
            break;
        st = fr_stage_out(&sy, y, n0 * yi, sb.n * yi, false, NULL, NULL);
        if (st == FR_OK) {
            fr_status k = t ? FR_CALL_KERNEL(dev, conv2d_backward_data, sy.p, sx.p, sw.p, &sb)
                            : FR_CALL_KERNEL(dev, conv2d_forward, sy.p, sx.p, sw.p, &sb);
            if (k == FR_OK && b)
                k = FR_CALL_KERNEL(dev, bias_add, sy.p, fr_data_f32(b), sb.n, out_channels(s, t),
                                   out_pixels(s, t));
            st = fr_stage_commit(&sy, y, n0 * yi, sb.n * yi, k);
        }
        fr_stage_free(&sx);
    }
    fr_stage_free(&sw);
    return st;
}

fr_status fr_conv2d_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w, const fr_tensor *b,
                            fr_conv_params p) {
    const char *op = "conv2d";
    fr_conv_shape s;
    FR_TRY(check_t(op, "x", x, NULL, "x", x));
    FR_TRY(check_t(op, "w", w, NULL, "x", x));
    FR_TRY(fr_conv2d_shape(x, w, p, &s));
    FR_TRY(check_t(op, "y", y, FR_SHAPE(s.n, s.k, s.oh, s.ow), "x", x));
    if (b)
        FR_TRY(check_bias(op, "b", b, s.k, x));
    bool done = false;
    if (!b)
        FR_TRY(try_half(y, x, w, 0, &s, &done));
    if (done)
        return FR_OK;
    return forward_checked(y, x, w, b, &s, false);
}

fr_status fr_conv_transpose2d_forward(fr_tensor *y, const fr_tensor *x, const fr_tensor *w,
                                      const fr_tensor *b, fr_conv_transpose_params p) {
    const char *op = "conv_transpose2d";
    fr_conv_shape s;
    FR_TRY(check_t(op, "x", x, NULL, "x", x));
    FR_TRY(check_t(op, "w", w, NULL, "x", x));
    FR_TRY(fr_conv_transpose2d_shape(x, w, p, &s));
    FR_TRY(check_t(op, "y", y, FR_SHAPE(s.n, s.c, s.h, s.w), "x", x));
    if (b)
        FR_TRY(check_bias(op, "b", b, s.c, x));
    return forward_checked(y, x, w, b, &s, true);
}

/* One block of images [n0, n0 + sb->n): whichever of dx, dw, db are wanted;
 * the parameter gradients of blocks after the first go through dw_part /
 * db_part (fr_stage_add_partial). Transposed (t): dw is the convolution's
 * weight gradient with the roles of x and dy swapped, dx its forward. */
static fr_status backward_block(fr_tensor *dx, float *dw, float *db, float *dw_part, float *db_part,
                                const fr_tensor *dy, const fr_tensor *x, const float *w,
                                const fr_conv_shape *s, const fr_conv_shape *sb, size_t n0, bool t) {
    fr_device dev = fr_device_of(dy);
    bool first = n0 == 0;
    size_t xi = in_img(s, t), yi = out_img(s, t);
    fr_stage sdy;
    FR_TRY(fr_stage_in(&sdy, dy, n0 * yi, sb->n * yi));
    fr_status st = FR_OK;
    if (dw) {
        fr_stage sx;
        st = fr_stage_in(&sx, x, n0 * xi, sb->n * xi);
        if (st == FR_OK) {
            float *out = fr_stage_partial_dst(dw, dw_part, first);
            st = fr_stage_add_partial(
                dev, dw, out, (size_t)s->k * (s->c / fr_conv_groups(s)) * s->r * s->s, first,
                t ? FR_CALL_KERNEL(dev, conv2d_backward_weight, out, sx.p, sdy.p, sb)
                  : FR_CALL_KERNEL(dev, conv2d_backward_weight, out, sdy.p, sx.p, sb));
        }
        fr_stage_free(&sx);
    }
    if (st == FR_OK && dx) {
        fr_stage sdx;
        st = fr_stage_out(&sdx, dx, n0 * xi, sb->n * xi, false, NULL, NULL);
        if (st == FR_OK)
            st = fr_stage_commit(&sdx, dx, n0 * xi, sb->n * xi,
                                 t ? FR_CALL_KERNEL(dev, conv2d_forward, sdx.p, sdy.p, w, sb)
                                   : FR_CALL_KERNEL(dev, conv2d_backward_data, sdx.p, sdy.p, w, sb));
    }
    if (st == FR_OK && db) {
        float *out = fr_stage_partial_dst(db, db_part, first);
        int bc = out_channels(s, t);
        st = fr_stage_add_partial(dev, db, out, (size_t)bc, first,
                                  FR_CALL_KERNEL(dev, bias_grad, out, sdy.p, sb->n, bc,
                                                 out_pixels(s, t)));
    }
    fr_stage_free(&sdy);
    return st;
}

/* The gradients for a checked shape s (dy's batch when s came from dy). */
static fr_status backward_checked(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                                  const fr_tensor *x, const fr_tensor *w, const fr_conv_shape *s,
                                  bool t) {
    if (!dx && !dw && !db)
        return FR_OK;
    fr_device dev = fr_device_of(dy);
    size_t per = images_per_block(dy, dx ? dx : x, s);
    size_t dw_len = (size_t)s->k * (s->c / fr_conv_groups(s)) * s->r * s->s;
    size_t db_len = (size_t)out_channels(s, t);
    if (s->n == 0) { /* an empty batch: no block runs, the parameter gradients are 0 */
        if (dw)
            FR_TRY(FR_CALL_KERNEL(dev, fill, fr_data_f32(dw), 0.0f, dw_len));
        if (db)
            FR_TRY(FR_CALL_KERNEL(dev, fill, fr_data_f32(db), 0.0f, db_len));
        return FR_OK;
    }
    bool blocks = per < (size_t)s->n;
    fr_stage sw = {0};
    if (dx)
        FR_TRY(fr_stage_in(&sw, w, 0, (size_t)fr_numel(w)));
    /* Partial parameter gradients of the blocks after the first. */
    size_t part_bytes = blocks ? ((dw ? dw_len : 0) + (db ? db_len : 0)) * sizeof(float) : 0;
    float *part = part_bytes ? fr_mem_alloc(dev, part_bytes, FR_TAG_WORKSPACE) : NULL;
    fr_status st = part_bytes && !part ? fr_last_status() : FR_OK;
    for (size_t n0 = 0; n0 < (size_t)s->n && st == FR_OK; n0 += per) {
        fr_conv_shape sb = *s;
        sb.n = (int)((size_t)s->n - n0 < per ? (size_t)s->n - n0 : per);
        st = backward_block(dx, dw ? fr_data_f32(dw) : NULL, db ? fr_data_f32(db) : NULL, part,
                            part && dw ? part + dw_len : part, dy, x, sw.p, s, &sb, n0, t);
    }
    if (part)
        fr_mem_free(dev, part, part_bytes, FR_TAG_WORKSPACE);
    fr_stage_free(&sw);
    return st;
}

/* Everything is checked before anything is computed, so a bad argument never
 * leaves some gradients written and others not. The input's shape comes from
 * x or, when only dx is wanted (x may then be NULL), from dx; the weight's
 * from w or dw. Parameter gradients dw and db are f32 (they go to f32 master
 * weights); dx has the activations' dtype. */
static fr_status backward_shape(const char *op, fr_tensor *dx, fr_tensor *dw, const fr_tensor *dy,
                                const fr_tensor *x, const fr_tensor *w, const fr_conv_params *p,
                                const fr_conv_transpose_params *tp, fr_conv_shape *s) {
    FR_TRY(check_t(op, "dy", dy, NULL, "dy", dy));
    FR_TRY(fr_check_ndim(op, "dy", dy, 4));
    bool t = tp != NULL;
    if (!dx && !dw) {
        *s = (fr_conv_shape){.n = (int)dy->shape[0], .k = (int)dy->shape[1], .c = (int)dy->shape[1],
                             .oh = (int)dy->shape[2], .ow = (int)dy->shape[3],
                             .h = (int)dy->shape[2], .w = (int)dy->shape[3]};
        return FR_OK;
    }
    if (dx)
        FR_TRY(check_t(op, "w", w, NULL, "dy", dy));
    if (dw)
        FR_TRY(check_t(op, "x", x, NULL, "dy", dy));
    const fr_tensor *xs = x ? x : dx, *ws = w ? w : dw;
    FR_TRY(check_t(op, x ? "x" : "dx", xs, NULL, "dy", dy));
    FR_TRY(check_t(op, w ? "w" : "dw", ws, NULL, "dy", dy));
    if (t)
        FR_TRY(fr_conv_transpose2d_shape(xs, ws, *tp, s));
    else
        FR_TRY(fr_conv2d_shape(xs, ws, *p, s));
    const int64_t *in = t ? FR_SHAPE(s->n, s->k, s->oh, s->ow) : FR_SHAPE(s->n, s->c, s->h, s->w);
    const int64_t *out = t ? FR_SHAPE(s->n, s->c, s->h, s->w) : FR_SHAPE(s->n, s->k, s->oh, s->ow);
    FR_TRY(fr_check_shape(op, "dy", dy, 4, out));
    if (dx)
        FR_TRY(check_t(op, "dx", dx, in, "dy", dy));
    if (dw) {
        FR_TRY(fr_check_f32c(op, "dw", dw));
        FR_TRY(check_t(op, "dw", dw, ws->shape, "dy", dy));
    }
    return FR_OK;
}

fr_status fr_conv2d_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db, const fr_tensor *dy,
                             const fr_tensor *x, const fr_tensor *w, fr_conv_params p) {
    const char *op = "conv2d_backward";
    fr_conv_shape s = {0};
    FR_TRY(backward_shape(op, dx, dw, dy, x, w, &p, NULL, &s));
    if (db)
        FR_TRY(check_bias(op, "db", db, (int)dy->shape[1], dy));
    bool done = false;
    if (dx && s.n > 0)
        FR_TRY(try_half(dx, dy, w, 1, &s, &done));
    if (done)
        dx = NULL;
    return backward_checked(dx, dw, db, dy, x, w, &s, false);
}

fr_status fr_conv_transpose2d_backward(fr_tensor *dx, fr_tensor *dw, fr_tensor *db,
                                       const fr_tensor *dy, const fr_tensor *x, const fr_tensor *w,
                                       fr_conv_transpose_params p) {
    const char *op = "conv_transpose2d_backward";
    fr_conv_shape s = {0};
    FR_TRY(backward_shape(op, dx, dw, dy, x, w, NULL, &p, &s));
    if (db)
        FR_TRY(check_bias(op, "db", db, (int)dy->shape[1], dy));
    return backward_checked(dx, dw, db, dy, x, w, &s, true);
}
