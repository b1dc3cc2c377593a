/* ops_pad.c: checked padding of the last two dims and clamp (see ops.h).
 * Operands may be f32, f16 or bf16, each its own: padding is staged to f32
 * in blocks of planes, clamp in runs of elements (staging.h). */
#include <stdio.h>

#include "kernels.h"
#include "ops.h"
#include "staging.h"

static fr_status pad_block(fr_device dev, float *out, const float *const *in, size_t count,
                           size_t first, const void *args) {
    (void)first;
    fr_pad_shape s = *(const fr_pad_shape *)args;
    s.planes = (long long)count;
    return FR_CALL_KERNEL(dev, pad2d_forward, out, in[0], &s);
}

static fr_status pad_backward_block(fr_device dev, float *out, const float *const *in, size_t count,
                                    size_t first, const void *args) {
    (void)first;
    fr_pad_shape s = *(const fr_pad_shape *)args;
    s.planes = (long long)count;
    return FR_CALL_KERNEL(dev, pad2d_backward, out, in[0], &s);
}

typedef struct {
    float lo, hi;
} clamp_args;

static fr_status clamp_block(fr_device dev, float *out, const float *const *in, size_t n,
                             size_t first, const void *args) {
    (void)first;
    const clamp_args *a = args;
    return FR_CALL_KERNEL(dev, clamp_forward, out, in[0], a->lo, a->hi, n);
}

static fr_status clamp_backward_block(fr_device dev, float *out, const float *const *in, size_t n,
                                      size_t first, const void *args) {
    (void)first;
    const clamp_args *a = args;
    return FR_CALL_KERNEL(dev, clamp_backward, out, in[0], in[1], a->lo, a->hi, n);
}

/* elements of one plane of x and of the padded tensor */
static size_t plane(const fr_pad_shape *s, bool padded) {
    return padded ? (size_t)(s->top + s->h + s->bottom) * (size_t)(s->left + s->w + s->right)
                  : (size_t)s->h * (size_t)s->w;
}

fr_status fr_pad2d_shape(const fr_tensor *x, const int pad[4], fr_pad_mode mode, fr_pad_shape *s) {
    FR_TRY(fr_check_defined("pad", "x", x));
    char buf[64];
    if (x->ndim < 2)
        return fr_error(FR_ERR_SHAPE, "pad: x %s needs at least 2 dims",
                        fr_shape_str(x, buf, sizeof buf));
    if ((unsigned)mode >= FR_PAD_COUNT)
        return fr_error(FR_ERR_ARG, "pad: unknown mode %d", (int)mode);
    int h = (int)x->shape[x->ndim - 2], w = (int)x->shape[x->ndim - 1];
    for (int i = 0; i < 4; i++) {
        if (pad[i] < 0)
            return fr_error(FR_ERR_ARG, "pad: padding %d is negative (left, right, top, bottom)",
                            pad[i]);
        int size = i < 2 ? w : h;
        if (mode == FR_PAD_REFLECT && pad[i] >= size)
            return fr_error(FR_ERR_SHAPE,
                            "pad: reflect padding %d must be smaller than the dim it pads (%d) of x %s",
                            pad[i], size, fr_shape_str(x, buf, sizeof buf));
    }
    s->planes = 1;
    for (int d = 0; d < x->ndim - 2; d++)
        s->planes *= x->shape[d];
    s->h = h, s->w = w;
    s->left = pad[0], s->right = pad[1], s->top = pad[2], s->bottom = pad[3];
    s->mode = mode;
    return FR_OK;
}

static fr_status check_padded(const char *op, const fr_tensor *big, const char *big_name,
                              const fr_tensor *x, const fr_pad_shape *s) {
    FR_TRY(fr_check_floatc(op, big_name, big));
    FR_TRY(fr_check_floatc(op, "x", x));
    FR_TRY(fr_check_same_device(op, big_name, big, "x", x));
    int64_t shape[FR_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++)
        shape[d] = x->shape[d];
    shape[x->ndim - 2] += s->top + s->bottom;
    shape[x->ndim - 1] += s->left + s->right;
    return fr_check_shape(op, big_name, big, x->ndim, shape);
}

fr_status fr_pad2d_forward(fr_tensor *y, const fr_tensor *x, const int pad[4], fr_pad_mode mode) {
    fr_pad_shape s;
    FR_TRY(fr_pad2d_shape(x, pad, mode, &s));
    FR_TRY(check_padded("pad", y, "y", x, &s));
    return fr_stage_run_units(y, plane(&s, true), false, &x, (const size_t[]){plane(&s, false)}, 1,
                              (size_t)s.planes, pad_block, &s);
}

fr_status fr_pad2d_backward(fr_tensor *dx, const fr_tensor *dy, const int pad[4], fr_pad_mode mode) {
    fr_pad_shape s;
    FR_TRY(fr_pad2d_shape(dx, pad, mode, &s));
    FR_TRY(check_padded("pad_backward", dy, "dy", dx, &s));
    return fr_stage_run_units(dx, plane(&s, false), false, &dy, (const size_t[]){plane(&s, true)}, 1,
                              (size_t)s.planes, pad_backward_block, &s);
}

static fr_status check_clamp(const char *op, float lo, float hi) {
    if (!(lo <= hi))
        return fr_error(FR_ERR_ARG, "%s: min %g is not <= max %g", op, (double)lo, (double)hi);
    return FR_OK;
}

fr_status fr_clamp_forward(fr_tensor *y, const fr_tensor *x, float lo, float hi) {
    FR_TRY(check_clamp("clamp", lo, hi));
    FR_TRY(fr_check_float_pair("clamp", "y", y, "x", x));
    clamp_args a = {lo, hi};
    return fr_stage_run(y, false, &x, 1, (size_t)fr_numel(x), clamp_block, &a);
}

fr_status fr_clamp_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *x, float lo,
                            float hi) {
    FR_TRY(check_clamp("clamp_backward", lo, hi));
    FR_TRY(fr_check_float_pair("clamp_backward", "dy", dy, "x", x));
    FR_TRY(fr_check_float_pair("clamp_backward", "dx", dx, "x", x));
    clamp_args a = {lo, hi};
    return fr_stage_run(dx, false, (const fr_tensor *[]){dy, x}, 2, (size_t)fr_numel(x),
                        clamp_backward_block, &a);
}
