/* ops_optim.c: checked optimizer updates (see ops.h). The per-step scalars
 * are computed here, once, so the CPU and CUDA kernels round alike. */
#include <math.h>

#include "kernels.h"
#include "ops.h"

/* w, each non-NULL state tensor and g: f32, contiguous, same shape and
 * device. */
static fr_status check_update(const char *op, const fr_tensor *w, const fr_tensor *const *state,
                              const char *const *state_names, int n_state, const fr_tensor *g) {
    FR_TRY(fr_check_f32c(op, "w", w));
    FR_TRY(fr_check_f32c(op, "grad", g));
    FR_TRY(fr_check_same_shape(op, "w", w, "grad", g));
    FR_TRY(fr_check_same_device(op, "w", w, "grad", g));
    for (int i = 0; i < n_state; i++) {
        FR_TRY(fr_check_f32c(op, state_names[i], state[i]));
        FR_TRY(fr_check_same_shape(op, "w", w, state_names[i], state[i]));
        FR_TRY(fr_check_same_device(op, "w", w, state_names[i], state[i]));
    }
    return FR_OK;
}

fr_status fr_sgd_update_(fr_tensor *w, fr_tensor *buf, const fr_tensor *g, double lr, double momentum,
                         double dampening, double weight_decay, bool nesterov, bool first_step) {
    const fr_tensor *state[] = {buf};
    const char *names[] = {"momentum buffer"};
    FR_TRY(check_update("sgd", w, state, names, momentum != 0.0 ? 1 : 0, g));
    FR_TRY(FR_CALL_KERNEL(fr_device_of(w), sgd_update, fr_data_f32(w),
                          momentum != 0.0 ? fr_data_f32(buf) : NULL, fr_data_f32(g),
                          (size_t)fr_numel(w), (float)lr, (float)momentum, (float)dampening,
                          (float)weight_decay, nesterov, first_step));
    fr_bump_version(w, "sgd step");
    if (momentum != 0.0)
        fr_bump_version(buf, "sgd step");
    return FR_OK;
}

fr_status fr_adam_update_(fr_tensor *w, fr_tensor *m, fr_tensor *v, const fr_tensor *g, double lr,
                          double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                          int64_t t) {
    const fr_tensor *state[] = {m, v};
    const char *names[] = {"exp_avg", "exp_avg_sq"};
    FR_TRY(check_update("adam", w, state, names, 2, g));
    if (t < 1)
        return fr_error(FR_ERR_ARG, "adam: step count %lld, expected >= 1", (long long)t);
    /* As torch.optim.adam / adamw compute them in Python (double), each then
     * rounded to f32 by the tensor op that takes it. */
    fr_adam_scalars s = {
        .beta1 = (float)beta1,
        .one_minus_beta1 = (float)(1.0 - beta1),
        .beta2 = (float)beta2,
        .one_minus_beta2 = (float)(1.0 - beta2),
        .eps = (float)eps,
        .l2 = decoupled ? 0.0f : (float)weight_decay,
        .decay = decoupled ? (float)(1.0 - lr * weight_decay) : 1.0f,
        .step_size = (float)(lr / (1.0 - pow(beta1, (double)t))),
        .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, (double)t)),
    };
    FR_TRY(FR_CALL_KERNEL(fr_device_of(w), adam_update, fr_data_f32(w), fr_data_f32(m), fr_data_f32(v),
                          fr_data_f32(g), (size_t)fr_numel(w), &s));
    fr_bump_version(w, "adam step");
    fr_bump_version(m, "adam step");
    fr_bump_version(v, "adam step");
    return FR_OK;
}
