/* ops_activation.c: checked activations (see ops.h; the formulas are in
 * activation.h). y may be x and dx may be dy: the kernels read each element
 * before writing it. Operands may be f32, f16 or bf16 (staged in blocks,
 * staging.h); ReLU is exact in any of them. */
#include "activation.h"
#include "ops.h"
#include "staging.h"

static const char *const act_names[] = {
#define FR_ACT_NAME_(NAME, name, needs, inv) name,
    FR_ACT_LIST(FR_ACT_NAME_)
#undef FR_ACT_NAME_
};
_Static_assert(sizeof act_names / sizeof *act_names == FR_ACT_COUNT,
               "one name per activation of FR_ACT_LIST");

const char *fr_act_name(fr_act act) {
    return (unsigned)act < FR_ACT_COUNT ? act_names[act] : "unknown activation";
}

bool fr_act_needs_input(fr_act act) { return fr_act_needs_of(act) == FR_ACT_NEEDS_INPUT; }

bool fr_act_is_invertible(fr_act act) { return fr_act_invertible(act) != 0; }

fr_status fr_act_check(const char *op, fr_act act, float p) {
    if ((unsigned)act >= FR_ACT_COUNT)
        return fr_error(FR_ERR_ARG, "%s: unknown activation %d", op, (int)act);
    /* leaky ReLU's backward recovers the sign of x from y, which needs
     * slope > 0; ELU's recovers e^x from y + alpha */
    if (act == FR_ACT_LEAKY_RELU && !(p > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: leaky_relu slope must be > 0 (got %g); use relu for "
                        "slope 0", op, (double)p);
    if (act == FR_ACT_ELU && !(p > 0.0f))
        return fr_error(FR_ERR_ARG, "%s: elu alpha must be > 0 (got %g)", op, (double)p);
    return FR_OK;
}

typedef struct {
    fr_act act;
    float p;
} act_args;

static fr_status fwd_block(fr_device dev, float *y, const float *const *in, size_t n, size_t off,
                           const void *args) {
    (void)off;
    const act_args *a = args;
    return FR_CALL_KERNEL(dev, act_forward, y, in[0], a->act, a->p, n);
}

static fr_status bwd_block(fr_device dev, float *dx, const float *const *in, size_t n, size_t off,
                           const void *args) {
    (void)off;
    const act_args *a = args;
    return FR_CALL_KERNEL(dev, act_backward, dx, in[0], in[1], a->act, a->p, n);
}

fr_status fr_act_forward(fr_tensor *y, const fr_tensor *x, fr_act act, float p) {
    const char *op = fr_act_name(act);
    FR_TRY(fr_act_check(op, act, p));
    FR_TRY(fr_check_float_pair(op, "y", y, "x", x));
    act_args a = {act, p};
    return fr_stage_run(y, false, &x, 1, (size_t)fr_numel(y), fwd_block, &a);
}

fr_status fr_act_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *s, fr_act act,
                          float p) {
    char op[48];
    snprintf(op, sizeof op, "%s_backward", fr_act_name(act));
    FR_TRY(fr_act_check(op, act, p));
    FR_TRY(fr_check_float_pair(op, "dx", dx, "dy", dy));
    FR_TRY(fr_check_float_pair(op, "dy", dy, fr_act_needs_input(act) ? "x" : "y", s));
    act_args a = {act, p};
    return fr_stage_run(dx, false, (const fr_tensor *[]){dy, s}, 2, (size_t)fr_numel(dx),
                        bwd_block, &a);
}

fr_status fr_relu_forward(fr_tensor *y, const fr_tensor *x) {
    return fr_act_forward(y, x, FR_ACT_RELU, 0.0f);
}

fr_status fr_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y) {
    return fr_act_backward(dx, dy, y, FR_ACT_RELU, 0.0f);
}

fr_status fr_leaky_relu_forward(fr_tensor *y, const fr_tensor *x, float slope) {
    return fr_act_forward(y, x, FR_ACT_LEAKY_RELU, slope);
}

fr_status fr_leaky_relu_backward(fr_tensor *dx, const fr_tensor *dy, const fr_tensor *y,
                                 float slope) {
    return fr_act_backward(dx, dy, y, FR_ACT_LEAKY_RELU, slope);
}
