/* ops_dropout.c: checked dropout (see ops.h); f32, f16 or bf16 operands,
 * staged in blocks that each draw their part of the whole tensor's mask. */
#include "ops.h"
#include "staging.h"

static fr_status check(const char *op, const char *out_name, const fr_tensor *out,
                       const char *in_name, const fr_tensor *in, float p) {
    FR_TRY(fr_check_float_pair(op, out_name, out, in_name, in));
    if (!(p >= 0.0f && p < 1.0f))
        return fr_error(FR_ERR_ARG, "%s: p must be in [0, 1), got %g", op, (double)p);
    return FR_OK;
}

typedef struct {
    float p;
    uint64_t seed;
} dropout_args;

static fr_status fwd_block(fr_device dev, float *y, const float *const *in, size_t n, size_t off,
                           const void *args) {
    const dropout_args *a = args;
    return FR_CALL_KERNEL(dev, dropout_forward, y, in[0], a->p, fr_dropout_seed_at(a->seed, off), n);
}

static fr_status bwd_block(fr_device dev, float *dx, const float *const *in, size_t n, size_t off,
                           const void *args) {
    const dropout_args *a = args;
    return FR_CALL_KERNEL(dev, dropout_backward, dx, in[0], a->p, fr_dropout_seed_at(a->seed, off), n);
}

fr_status fr_dropout_forward(fr_tensor *y, const fr_tensor *x, float p, uint64_t seed) {
    FR_TRY(check("dropout", "y", y, "x", x, p));
    dropout_args a = {p, seed};
    return fr_stage_run(y, false, &x, 1, (size_t)fr_numel(x), fwd_block, &a);
}

fr_status fr_dropout_backward(fr_tensor *dx, const fr_tensor *dy, float p, uint64_t seed) {
    FR_TRY(check("dropout backward", "dx", dx, "dy", dy, p));
    dropout_args a = {p, seed};
    return fr_stage_run(dx, false, &dy, 1, (size_t)fr_numel(dy), bwd_block, &a);
}
