/* ops_concat.c: checked concat along channels and its backward (see ops.h).
 *
 * Besides contiguous tensors, every tensor here may be a channel slice of a
 * contiguous one (fr_narrow on dim 1): within a sample its channels are still
 * adjacent, only the samples lie further apart, which the copy_channels
 * kernel expresses as a larger channel count per row. So a backward can copy
 * one input's part of dout with fr_narrow + fr_concat_backward, without first
 * making the slice contiguous. */
#include <limits.h>
#include <stdio.h>

#include "kernels.h"
#include "ops.h"

/* How the kernel addresses a (N, C, ...) tensor: the first element, and the
 * channels per sample in the buffer it lives in. */
typedef struct {
    void *data;
    int row_c;
} chan_view;

static int64_t pixels(const fr_tensor *t) {
    int64_t hw = 1;
    for (int d = 2; d < t->ndim; d++)
        hw *= t->shape[d];
    return hw;
}

static fr_status channel_view(const char *op, const char *arg, const fr_tensor *t, chan_view *v) {
    char buf[96];
    if (!fr_dtype_is_float(t->dtype))
        return fr_error(FR_ERR_DTYPE, "%s: %s must be f32, f16 or bf16, got %s", op, arg,
                        fr_dtype_name(t->dtype));
    if (t->ndim < 2)
        return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected at least (N, C)", op, arg,
                        fr_shape_str(t, buf, sizeof buf));
    int64_t hw = pixels(t);
    if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX || hw > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: %s %s is too large for the concat kernel", op, arg,
                        fr_shape_str(t, buf, sizeof buf));
    v->data = fr_data(t);
    v->row_c = (int)t->shape[1];
    if (fr_is_contiguous(t) || fr_numel(t) == 0)
        return FR_OK;
    bool ok = true;
    int64_t stride = 1;
    for (int d = t->ndim - 1; d >= 1 && ok; d--) {
        ok = t->shape[d] == 1 || t->stride[d] == stride;
        stride *= t->shape[d];
    }
    ok = ok && t->stride[0] % hw == 0 && t->stride[0] / hw >= t->shape[1] &&
         t->stride[0] / hw <= INT_MAX;
    if (!ok)
        return fr_error(FR_ERR_SHAPE,
                        "%s: %s %s is not contiguous and not a channel slice of a contiguous "
                        "tensor; call fr_contiguous first",
                        op, arg, fr_shape_str(t, buf, sizeof buf));
    v->row_c = (int)(t->stride[0] / hw);
    return FR_OK;
}

/* Same N and same trailing dimensions as `ref`; the channel count is free. */
static fr_status check_fits(const char *op, const char *arg, const fr_tensor *t,
                            const char *ref_name, const fr_tensor *ref) {
    char a[96], b[96];
    FR_TRY(fr_check_same_device(op, arg, t, ref_name, ref));
    if (t->dtype != ref->dtype)
        return fr_error(FR_ERR_DTYPE, "%s: %s is %s but %s is %s; concat copies, it does not convert",
                        op, arg, fr_dtype_name(t->dtype), ref_name, fr_dtype_name(ref->dtype));
    bool ok = t->ndim == ref->ndim && t->shape[0] == ref->shape[0];
    for (int d = 2; ok && d < t->ndim; d++)
        ok = t->shape[d] == ref->shape[d];
    if (!ok)
        return fr_error(FR_ERR_SHAPE,
                        "%s: %s %s and %s %s must agree in every dimension but the channels (1)",
                        op, arg, fr_shape_str(t, a, sizeof a), ref_name,
                        fr_shape_str(ref, b, sizeof b));
    return FR_OK;
}

fr_status fr_concat_forward(fr_tensor *out, fr_tensor *const *inputs, int count) {
    const char *op = "concat";
    char arg[32], buf[96];
    chan_view vo;
    if (!inputs || count < 1)
        return fr_error(FR_ERR_ARG, "%s: needs at least one input, got %d", op, inputs ? count : 0);
    FR_TRY(channel_view(op, "out", out, &vo));
    int64_t channels = 0;
    for (int i = 0; i < count; i++) {
        chan_view vi;
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        FR_TRY(fr_check_defined(op, arg, inputs[i]));
        FR_TRY(channel_view(op, arg, inputs[i], &vi));
        FR_TRY(check_fits(op, arg, inputs[i], "out", out));
        channels += inputs[i]->shape[1];
    }
    if (channels != out->shape[1])
        return fr_error(FR_ERR_SHAPE, "%s: the inputs have %lld channels in all but out %s has %lld",
                        op, (long long)channels, fr_shape_str(out, buf, sizeof buf),
                        (long long)out->shape[1]);
    int n = (int)out->shape[0], hw = (int)pixels(out), c0 = 0;
    for (int i = 0; i < count; i++) {
        chan_view vi;
        FR_TRY(channel_view(op, "input", inputs[i], &vi));
        int ci = (int)inputs[i]->shape[1];
        if (ci > 0 && n > 0 && hw > 0)
            FR_TRY(FR_CALL_KERNEL(fr_device_of(out), copy_channels, vo.data, vo.row_c, c0, vi.data,
                                  vi.row_c, 0, ci, n, hw, fr_dtype_size(out->dtype)));
        c0 += ci;
    }
    return FR_OK;
}

fr_status fr_concat_backward(fr_tensor *const *dx, int count, const fr_tensor *dout) {
    const char *op = "concat_backward";
    char arg[32], buf[96];
    chan_view vd;
    if (!dx || count < 1)
        return fr_error(FR_ERR_ARG, "%s: needs at least one gradient slot, got %d", op,
                        dx ? count : 0);
    FR_TRY(fr_check_defined(op, "dout", dout));
    FR_TRY(channel_view(op, "dout", dout, &vd));
    int64_t known = 0;
    int missing = -1;
    for (int i = 0; i < count; i++) {
        chan_view vi;
        snprintf(arg, sizeof arg, "dx[%d]", i);
        if (!dx[i]) {
            /* The channels of a skipped input are only known as what the
             * others leave over, so one may be skipped, not more. */
            if (missing >= 0)
                return fr_error(FR_ERR_ARG,
                                "%s: dx[%d] and dx[%d] are both NULL, so the channel offsets are "
                                "unknown; pass fr_narrow(dout, 1, offset, channels) per input "
                                "instead",
                                op, missing, i);
            missing = i;
            continue;
        }
        FR_TRY(channel_view(op, arg, dx[i], &vi));
        FR_TRY(check_fits(op, arg, dx[i], "dout", dout));
        known += dx[i]->shape[1];
    }
    if (known > dout->shape[1] || (missing < 0 && known != dout->shape[1]))
        return fr_error(FR_ERR_SHAPE, "%s: the gradients have %lld channels in all but dout %s has %lld",
                        op, (long long)known, fr_shape_str(dout, buf, sizeof buf),
                        (long long)dout->shape[1]);
    int n = (int)dout->shape[0], hw = (int)pixels(dout), c0 = 0;
    for (int i = 0; i < count; i++) {
        if (!dx[i]) {
            c0 += (int)(dout->shape[1] - known);
            continue;
        }
        chan_view vi;
        FR_TRY(channel_view(op, "dx", dx[i], &vi));
        int ci = (int)dx[i]->shape[1];
        if (ci > 0 && n > 0 && hw > 0)
            FR_TRY(FR_CALL_KERNEL(fr_device_of(dout), copy_channels, vi.data, vi.row_c, 0, vd.data,
                                  vd.row_c, c0, ci, n, hw, fr_dtype_size(dout->dtype)));
        c0 += ci;
    }
    return FR_OK;
}

fr_status fr_concat_backward_add(fr_tensor *dx, const fr_tensor *src) {
    const char *op = "concat_backward_add";
    char a[96], b[96];
    chan_view vd, vs;
    FR_TRY(fr_check_defined(op, "dx", dx));
    FR_TRY(fr_check_defined(op, "src", src));
    FR_TRY(channel_view(op, "dx", dx, &vd));
    FR_TRY(channel_view(op, "src", src, &vs));
    FR_TRY(check_fits(op, "src", src, "dx", dx));
    if (dx->dtype != FR_F32 || src->shape[1] != dx->shape[1])
        return fr_error(FR_ERR_SHAPE, "%s: dx %s (%s) and src %s must be f32 of one shape", op,
                        fr_shape_str(dx, a, sizeof a), fr_dtype_name(dx->dtype),
                        fr_shape_str(src, b, sizeof b));
    size_t n = (size_t)dx->shape[0], hw = (size_t)pixels(dx), c = (size_t)dx->shape[1];
    if (!n || !hw || !c)
        return FR_OK;
    fr_device dev = fr_device_of(dx);
    float *y = vd.data;
    const float *x = vs.data;
    /* Within a sample the channels are adjacent in both, so one axpy per
     * sample, or one in all when neither has other channels between samples.
     * The elementwise y += 1 * x gives the bits the tape's whole-tensor axpy
     * of a copied slice gives. */
    if ((size_t)vd.row_c == c && (size_t)vs.row_c == c)
        return FR_CALL_KERNEL(dev, axpy, y, 1.0f, x, n * c * hw);
    for (size_t i = 0; i < n; i++)
        FR_TRY(FR_CALL_KERNEL(dev, axpy, y + i * (size_t)vd.row_c * hw, 1.0f,
                              x + i * (size_t)vs.row_c * hw, c * hw));
    return FR_OK;
}
