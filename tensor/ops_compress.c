/* ops_compress.c: checked packing of saved activations into codes and back
 * (see ops.h and kernels.def). */
#include "kernels.h"
#include "ops.h"

/* x f32 and dense: contiguous, or channels last (a model's channels-last
 * mode): the kernels run over the storage as it lies, so a channels-last
 * tensor's codes and bits follow its NHWC order. */
static fr_status check_dense(const char *op, const char *arg, const fr_tensor *x) {
    if (x && x->dtype == FR_F32 && fr_is_channels_last(x))
        return FR_OK;
    return fr_check_f32c(op, arg, x);
}

static fr_status check(const char *op, const fr_tensor *x, const fr_tensor *packed, size_t want) {
    FR_TRY(check_dense(op, "x", x));
    FR_TRY(fr_check_defined(op, "packed", packed));
    FR_TRY(fr_check_dtype(op, "packed", packed, FR_U8));
    FR_TRY(fr_check_contiguous(op, "packed", packed));
    FR_TRY(fr_check_same_device(op, "x", x, "packed", packed));
    if ((size_t)fr_numel(packed) != want)
        return fr_error(FR_ERR_SHAPE, "%s: packed has %lld bytes, x of %lld elements needs %zu",
                        op, (long long)fr_numel(packed), (long long)fr_numel(x), want);
    return FR_OK;
}

static fr_status check_bits(const char *op, int bits) {
    if (bits != 8 && bits != 4 && bits != 2)
        return fr_error(FR_ERR_ARG, "%s: bits must be 8, 4 or 2, got %d", op, bits);
    return FR_OK;
}

fr_status fr_compress_pack_out(fr_tensor *packed, const fr_tensor *x, int bits, uint64_t seed) {
    FR_TRY(check_bits("compress_pack", bits));
    size_t n = (size_t)fr_numel(x);
    FR_TRY(check("compress_pack", x, packed, fr_compress_nbytes(bits, n)));
    return FR_CALL_KERNEL(fr_device_of(x), compress_pack, fr_data(packed), fr_data(x), bits, seed, n);
}

fr_status fr_compress_unpack_out(fr_tensor *x, const fr_tensor *packed, int bits) {
    FR_TRY(check_bits("compress_unpack", bits));
    size_t n = (size_t)fr_numel(x);
    FR_TRY(check("compress_unpack", x, packed, fr_compress_nbytes(bits, n)));
    return FR_CALL_KERNEL(fr_device_of(x), compress_unpack, fr_data(x), fr_data(packed), bits, n);
}

fr_status fr_sign_pack_out(fr_tensor *mask, const fr_tensor *x) {
    size_t n = (size_t)fr_numel(x);
    FR_TRY(check("sign_pack", x, mask, fr_sign_nbytes(n)));
    return FR_CALL_KERNEL(fr_device_of(x), sign_pack, fr_data(mask), fr_data(x), n);
}

fr_status fr_sign_unpack_out(fr_tensor *y, const fr_tensor *mask) {
    size_t n = (size_t)fr_numel(y);
    FR_TRY(check("sign_unpack", y, mask, fr_sign_nbytes(n)));
    return FR_CALL_KERNEL(fr_device_of(y), sign_unpack, fr_data(y), fr_data(mask), n);
}

fr_status fr_sign_act_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *mask,
                               fr_act act, float slope) {
    const char *op = "sign_act_backward";
    size_t n = (size_t)fr_numel(dy);
    if (act != FR_ACT_RELU && act != FR_ACT_LEAKY_RELU)
        return fr_error(FR_ERR_ARG, "%s: a sign mask gives the gradient of relu or leaky_relu, "
                                    "not of %s", op, fr_act_name(act));
    FR_TRY(check_dense(op, "dy", dy));
    FR_TRY(check_dense(op, "dx", dx));
    FR_TRY(check(op, dy, mask, fr_sign_nbytes(n)));
    FR_TRY(fr_check_same_shape(op, "dx", dx, "dy", dy));
    if (fr_is_channels_last(dx) != fr_is_channels_last(dy))
        return fr_error(FR_ERR_SHAPE, "%s: dx and dy must share a layout (dx %s, dy %s)", op,
                        fr_is_channels_last(dx) ? "channels last" : "contiguous",
                        fr_is_channels_last(dy) ? "channels last" : "contiguous");
    FR_TRY(fr_check_same_device(op, "dx", dx, "dy", dy));
    return FR_CALL_KERNEL(fr_device_of(dy), sign_act_backward, fr_data(dx), fr_data(dy),
                          fr_data(mask), act, slope, n);
}
