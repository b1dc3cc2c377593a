/* ops_upsample.c: checked upsampling by an integer scale (see ops.h).
 * x (N, C, H, W), y (N, C, H * scale, W * scale). Half operands run a
 * block of images at a time (staging.h). */
#include <limits.h>

#include "ops.h"
#include "staging.h"

fr_status fr_upsample_check(const char *op, const char *name, fr_upsample_opts o) {
    const char *sep = name && *name ? " " : "";
    if (!name)
        name = "";
    if (o.scale < 1)
        return fr_error(FR_ERR_ARG, "%s%s%s: scale %d must be an integer >= 1", op, sep, name,
                        o.scale);
    if ((unsigned)o.mode >= FR_UPSAMPLE_MODE_COUNT)
        return fr_error(FR_ERR_ARG, "%s%s%s: unknown mode %d (FR_UPSAMPLE_NEAREST or "
                        "FR_UPSAMPLE_BILINEAR)", op, sep, name, (int)o.mode);
    if (o.align_corners && o.mode == FR_UPSAMPLE_NEAREST)
        return fr_error(FR_ERR_ARG, "%s%s%s: align_corners is for bilinear mode only", op, sep,
                        name);
    return FR_OK;
}

fr_status fr_upsample_shape_of(const fr_tensor *x, fr_upsample_opts o, fr_upsample_shape *s) {
    const char *op = "upsample";
    char sx[96];
    FR_TRY(fr_upsample_check(op, NULL, o));
    FR_TRY(fr_check_ndim(op, "x", x, 4));
    fr_shape_str(x, sx, sizeof sx);
    if (x->shape[0] * x->shape[1] > INT_MAX || x->shape[2] * o.scale > INT_MAX / 4 ||
        x->shape[3] * o.scale > INT_MAX / 4 ||
        x->shape[2] * o.scale * x->shape[3] * o.scale > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "upsample: x %s times %d is too large for the kernels", sx,
                        o.scale);
    *s = (fr_upsample_shape){.n = (int)x->shape[0], .c = (int)x->shape[1], .h = (int)x->shape[2],
                             .w = (int)x->shape[3], .oh = (int)x->shape[2] * o.scale,
                             .ow = (int)x->shape[3] * o.scale, .scale = o.scale, .mode = o.mode,
                             .align_corners = o.align_corners};
    return FR_OK;
}

static fr_status check_t(const char *op, const char *arg, const fr_tensor *t, const int64_t *shape,
                         const char *ref_name, const fr_tensor *ref) {
    FR_TRY(fr_check_floatc(op, arg, t));
    if (shape)
        FR_TRY(fr_check_shape(op, arg, t, 4, shape));
    return fr_check_same_device(op, arg, t, ref_name, ref);
}

static size_t in_img(const fr_upsample_shape *s) { return (size_t)s->c * s->h * s->w; }
static size_t out_img(const fr_upsample_shape *s) { return (size_t)s->c * s->oh * s->ow; }

static fr_status forward_block(fr_device dev, float *y, const float *const *in, size_t count,
                               size_t first, const void *s) {
    (void)first;
    fr_upsample_shape b = *(const fr_upsample_shape *)s;
    b.n = (int)count;
    return FR_CALL_KERNEL(dev, upsample_forward, y, in[0], &b);
}

static fr_status backward_block(fr_device dev, float *dx, const float *const *in, size_t count,
                                size_t first, const void *s) {
    (void)first;
    fr_upsample_shape b = *(const fr_upsample_shape *)s;
    b.n = (int)count;
    return FR_CALL_KERNEL(dev, upsample_backward, dx, in[0], &b);
}

fr_status fr_upsample_forward(fr_tensor *y, const fr_tensor *x, fr_upsample_opts o) {
    const char *op = "upsample";
    fr_upsample_shape s;
    FR_TRY(check_t(op, "x", x, NULL, "x", x));
    FR_TRY(fr_upsample_shape_of(x, o, &s));
    FR_TRY(check_t(op, "y", y, FR_SHAPE(s.n, s.c, s.oh, s.ow), "x", x));
    return fr_stage_run_units(y, out_img(&s), false, &x, (size_t[]){in_img(&s)}, 1, (size_t)s.n,
                              forward_block, &s);
}

fr_status fr_upsample_backward(fr_tensor *dx, const fr_tensor *dy, fr_upsample_opts o) {
    const char *op = "upsample_backward";
    fr_upsample_shape s;
    FR_TRY(check_t(op, "dx", dx, NULL, "dx", dx));
    FR_TRY(fr_upsample_shape_of(dx, o, &s));
    FR_TRY(check_t(op, "dy", dy, FR_SHAPE(s.n, s.c, s.oh, s.ow), "dx", dx));
    return fr_stage_run_units(dx, in_img(&s), false, &dy, (size_t[]){out_img(&s)}, 1, (size_t)s.n,
                              backward_block, &s);
}
