/* ops_pool.c: checked pooling (see ops.h). x (N, C, H, W), y (N, C, OH, OW)
 * with OH = (H + 2 pad - kernel) / stride + 1 (floor), the same along the
 * width; square windows. */
#include <limits.h>

#include "ops.h"
#include "staging.h"

fr_status fr_pool2d_shape(const fr_tensor *x, fr_pool_params p, fr_pool_shape *s) {
    const char *op = "pool2d";
    char sx[96];
    FR_TRY(fr_check_ndim(op, "x", x, 4));
    fr_shape_str(x, sx, sizeof sx);
    if (p.kernel < 1 || p.stride < 1 || p.pad < 0)
        return fr_error(FR_ERR_ARG,
                        "pool2d: need kernel >= 1, stride >= 1, pad >= 0; got kernel %d, stride %d, "
                        "pad %d",
                        p.kernel, p.stride, p.pad);
    /* PyTorch's rule: a window must always overlap the real input. */
    if (p.pad > p.kernel / 2)
        return fr_error(FR_ERR_ARG, "pool2d: pad %d is more than half the kernel %d", p.pad, p.kernel);
    if (x->shape[0] * x->shape[1] > INT_MAX || x->shape[2] * x->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "pool2d: x %s is too large for the kernels", sx);
    int64_t ph = x->shape[2] + 2 * (int64_t)p.pad, pw = x->shape[3] + 2 * (int64_t)p.pad;
    if (p.kernel > ph || p.kernel > pw)
        return fr_error(FR_ERR_SHAPE, "pool2d: kernel %d is larger than x %s padded by %d", p.kernel,
                        sx, p.pad);
    *s = (fr_pool_shape){
        .n = (int)x->shape[0], .c = (int)x->shape[1], .h = (int)x->shape[2], .w = (int)x->shape[3],
        .oh = (int)((ph - p.kernel) / p.stride + 1), .ow = (int)((pw - p.kernel) / p.stride + 1),
        .kernel = p.kernel, .stride = p.stride, .pad = p.pad,
    };
    return FR_OK;
}

/* f32 / f16 / bf16, contiguous, on ref's device, and (when shape != NULL)
 * of that shape. */
static fr_status check_t(const char *op, const char *arg, const fr_tensor *t, int ndim,
                         const int64_t *shape, const char *ref_name, const fr_tensor *ref) {
    FR_TRY(fr_check_floatc(op, arg, t));
    if (shape)
        FR_TRY(fr_check_shape(op, arg, t, ndim, shape));
    return fr_check_same_device(op, arg, t, ref_name, ref);
}

/* Checks x (the pooled input, or the tensor carrying its shape) and the
 * output-shaped tensor `out`, filling s. */
static fr_status check_pool(const char *op, const char *x_name, const fr_tensor *x,
                            const char *out_name, const fr_tensor *out, fr_pool_params p,
                            fr_pool_shape *s) {
    FR_TRY(check_t(op, x_name, x, 0, NULL, x_name, x));
    FR_TRY(fr_pool2d_shape(x, p, s));
    return check_t(op, out_name, out, 4, FR_SHAPE(s->n, s->c, s->oh, s->ow), x_name, x);
}

/* Pooling runs a block of images at a time when an operand is half
 * (staging.h); the kernels see the block as a batch of `count` images. */
static fr_pool_shape block_shape(const void *s, size_t count) {
    fr_pool_shape b = *(const fr_pool_shape *)s;
    b.n = (int)count;
    return b;
}
static size_t in_img(const fr_pool_shape *s) { return (size_t)s->c * s->h * s->w; }
static size_t out_img(const fr_pool_shape *s) { return (size_t)s->c * s->oh * s->ow; }

static fr_status max_pool2d_forward_block(fr_device dev, float *y, const float *const *in, size_t count,
                                   size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, max_pool2d_forward, y, in[0], &b);
}

static fr_status max_pool2d_backward_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                   size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, max_pool2d_backward, dx, in[0], in[1], &b);
}

static fr_status avg_pool2d_forward_block(fr_device dev, float *y, const float *const *in, size_t count,
                                   size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, avg_pool2d_forward, y, in[0], &b);
}

static fr_status avg_pool2d_backward_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                   size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, avg_pool2d_backward, dx, in[0], &b);
}

/* Global pooling: a unit is one (n, c) plane of hw pixels. */
static fr_status global_fwd_block(fr_device dev, float *y, const float *const *in, size_t count,
                                  size_t first, const void *hw) {
    (void)first;
    return FR_CALL_KERNEL(dev, global_avg_pool_forward, y, in[0], (int)count, *(const int *)hw);
}

static fr_status global_bwd_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                  size_t first, const void *hw) {
    (void)first;
    return FR_CALL_KERNEL(dev, global_avg_pool_backward, dx, in[0], (int)count, *(const int *)hw);
}

fr_status fr_max_pool2d_forward(fr_tensor *y, const fr_tensor *x, fr_pool_params p) {
    fr_pool_shape s;
    FR_TRY(check_pool("max_pool2d", "x", x, "y", y, p, &s));
    return fr_stage_run_units(y, out_img(&s), false, &x, (size_t[]){in_img(&s)}, 1, (size_t)s.n,
                              max_pool2d_forward_block, &s);
}

fr_status fr_max_pool2d_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x, fr_pool_params p) {
    const char *op = "max_pool2d_backward";
    fr_pool_shape s;
    FR_TRY(check_pool(op, "x", x, "dy", dy, p, &s));
    FR_TRY(check_t(op, "dx", dx, 4, x->shape, "x", x));
    return fr_stage_run_units(dx, in_img(&s), false, (const fr_tensor *[]){dy, x},
                              (size_t[]){out_img(&s), in_img(&s)}, 2, (size_t)s.n,
                              max_pool2d_backward_block, &s);
}

fr_status fr_avg_pool2d_forward(fr_tensor *y, const fr_tensor *x, fr_pool_params p) {
    fr_pool_shape s;
    FR_TRY(check_pool("avg_pool2d", "x", x, "y", y, p, &s));
    return fr_stage_run_units(y, out_img(&s), false, &x, (size_t[]){in_img(&s)}, 1, (size_t)s.n,
                              avg_pool2d_forward_block, &s);
}

/* Needs no input values: dx carries the input's shape. */
fr_status fr_avg_pool2d_backward(fr_tensor *dx, const fr_tensor *dy, fr_pool_params p) {
    fr_pool_shape s;
    FR_TRY(check_pool("avg_pool2d_backward", "dx", dx, "dy", dy, p, &s));
    return fr_stage_run_units(dx, in_img(&s), false, &dy, (size_t[]){out_img(&s)}, 1, (size_t)s.n,
                              avg_pool2d_backward_block, &s);
}

/* x (N, C, H, W) and y (N, C): the kernels see (N*C, H*W) and (N*C). */
static fr_status check_global(const char *op, const char *x_name, const fr_tensor *x,
                              const char *y_name, const fr_tensor *y) {
    char sx[96];
    FR_TRY(check_t(op, x_name, x, 0, NULL, x_name, x));
    FR_TRY(fr_check_ndim(op, x_name, x, 4));
    if (x->shape[0] * x->shape[1] > INT_MAX || x->shape[2] * x->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the kernels", op, x_name,
                        fr_shape_str(x, sx, sizeof sx));
    return check_t(op, y_name, y, 2, FR_SHAPE(x->shape[0], x->shape[1]), x_name, x);
}

fr_status fr_global_avg_pool_forward(fr_tensor *y, const fr_tensor *x) {
    FR_TRY(check_global("global_avg_pool", "x", x, "y", y));
    int hw = (int)(x->shape[2] * x->shape[3]);
    return fr_stage_run_units(y, 1, false, &x, (size_t[]){(size_t)hw}, 1,
                              (size_t)(x->shape[0] * x->shape[1]), global_fwd_block, &hw);
}

fr_status fr_global_avg_pool_backward(fr_tensor *dx, const fr_tensor *dy) {
    FR_TRY(check_global("global_avg_pool_backward", "dx", dx, "dy", dy));
    int hw = (int)(dx->shape[2] * dx->shape[3]);
    return fr_stage_run_units(dx, (size_t)hw, false, &dy, (size_t[]){1}, 1,
                              (size_t)(dx->shape[0] * dx->shape[1]), global_bwd_block, &hw);
}

/* ---- adaptive average pooling: the output size is y's (dy's) ---- */

static fr_status check_adaptive(const char *op, const char *x_name, const fr_tensor *x,
                                const char *y_name, const fr_tensor *y, fr_pool_shape *s) {
    char sx[96], sy[96];
    FR_TRY(check_t(op, x_name, x, 0, NULL, x_name, x));
    FR_TRY(fr_check_ndim(op, x_name, x, 4));
    FR_TRY(check_t(op, y_name, y, 0, NULL, x_name, x));
    FR_TRY(fr_check_ndim(op, y_name, y, 4));
    fr_shape_str(x, sx, sizeof sx);
    fr_shape_str(y, sy, sizeof sy);
    if (y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] < 1 ||
        y->shape[3] < 1)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s and %s %s must share N and C, with an output of "
                        "at least 1x1", op, x_name, sx, y_name, sy);
    if (x->shape[0] * x->shape[1] > INT_MAX || x->shape[2] * x->shape[3] > INT_MAX ||
        y->shape[2] * y->shape[3] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the kernels", op, x_name, sx);
    *s = (fr_pool_shape){.n = (int)x->shape[0], .c = (int)x->shape[1], .h = (int)x->shape[2],
                         .w = (int)x->shape[3], .oh = (int)y->shape[2], .ow = (int)y->shape[3]};
    return FR_OK;
}

static fr_status adaptive_fwd_block(fr_device dev, float *y, const float *const *in, size_t count,
                                    size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, adaptive_avg_pool2d_forward, y, in[0], &b);
}

static fr_status adaptive_bwd_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                    size_t first, const void *s) {
    (void)first;
    fr_pool_shape b = block_shape(s, count);
    return FR_CALL_KERNEL(dev, adaptive_avg_pool2d_backward, dx, in[0], &b);
}

fr_status fr_adaptive_avg_pool2d_forward(fr_tensor *y, const fr_tensor *x) {
    fr_pool_shape s;
    FR_TRY(check_adaptive("adaptive_avg_pool2d", "x", x, "y", y, &s));
    return fr_stage_run_units(y, out_img(&s), false, &x, (size_t[]){in_img(&s)}, 1, (size_t)s.n,
                              adaptive_fwd_block, &s);
}

fr_status fr_adaptive_avg_pool2d_backward(fr_tensor *dx, const fr_tensor *dy) {
    fr_pool_shape s;
    FR_TRY(check_adaptive("adaptive_avg_pool2d_backward", "dx", dx, "dy", dy, &s));
    return fr_stage_run_units(dx, in_img(&s), false, &dy, (size_t[]){out_img(&s)}, 1, (size_t)s.n,
                              adaptive_bwd_block, &s);
}
