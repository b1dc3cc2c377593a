/* ops_loss.c: checked fused cross-entropy (see ops.h). Logits (and their
 * gradient) may be f16 or bf16: they are staged whole (N x K is small) and
 * the log-sum-exp runs in f32; the loss is f32. */
#include <limits.h>

#include "ops.h"
#include "staging.h"

/* logits (N, K) f32 / f16 / bf16, labels (N) i32, both contiguous and on
 * one device. */
static fr_status check_inputs(const char *op, const fr_tensor *logits, const fr_tensor *labels) {
    char buf[96];
    FR_TRY(fr_check_floatc(op, "logits", logits));
    FR_TRY(fr_check_ndim(op, "logits", logits, 2));
    if (logits->shape[1] < 1 || logits->shape[0] > INT_MAX || logits->shape[1] > INT_MAX)
        return fr_error(FR_ERR_SHAPE, "%s: logits %s must have between 1 and %d classes and rows",
                        op, fr_shape_str(logits, buf, sizeof buf), INT_MAX);
    FR_TRY(fr_check_dtype(op, "labels", labels, FR_I32));
    FR_TRY(fr_check_contiguous(op, "labels", labels));
    FR_TRY(fr_check_shape(op, "labels", labels, 1, FR_SHAPE(logits->shape[0])));
    return fr_check_same_device(op, "logits", logits, "labels", labels);
}

static fr_status check_scalar(const char *op, const char *arg, const fr_tensor *t,
                              const fr_tensor *logits) {
    char buf[96];
    FR_TRY(fr_check_f32c(op, arg, t));
    if (fr_numel(t) != 1)
        return fr_error(FR_ERR_SHAPE, "%s: %s has shape %s, expected one element", op, arg,
                        fr_shape_str(t, buf, sizeof buf));
    return fr_check_same_device(op, arg, t, "logits", logits);
}

fr_status fr_cross_entropy_forward(fr_tensor *loss, const fr_tensor *logits, const fr_tensor *labels) {
    const char *op = "cross_entropy";
    FR_TRY(check_inputs(op, logits, labels));
    FR_TRY(check_scalar(op, "loss", loss, logits));
    fr_stage sl;
    FR_TRY(fr_stage_in(&sl, logits, 0, (size_t)fr_numel(logits)));
    fr_status st = FR_CALL_KERNEL(fr_device_of(logits), cross_entropy_forward, fr_data_f32(loss), sl.p,
                                  (const int32_t *)fr_data(labels), (int)logits->shape[0],
                                  (int)logits->shape[1]);
    fr_stage_free(&sl);
    return st;
}

fr_status fr_cross_entropy_backward(fr_tensor *dlogits, const fr_tensor *dloss, const fr_tensor *logits,
                                    const fr_tensor *labels) {
    const char *op = "cross_entropy_backward";
    FR_TRY(check_inputs(op, logits, labels));
    FR_TRY(check_scalar(op, "dloss", dloss, logits));
    FR_TRY(fr_check_floatc(op, "dlogits", dlogits));
    FR_TRY(fr_check_same_shape(op, "dlogits", dlogits, "logits", logits));
    FR_TRY(fr_check_same_device(op, "dlogits", dlogits, "logits", logits));
    size_t n = (size_t)fr_numel(logits);
    fr_stage sl, sd;
    FR_TRY(fr_stage_in(&sl, logits, 0, n));
    fr_status st = fr_stage_out(&sd, dlogits, 0, n, false, NULL, NULL);
    if (st == FR_OK)
        st = fr_stage_commit(&sd, dlogits, 0, n,
                             FR_CALL_KERNEL(fr_device_of(logits), cross_entropy_backward, sd.p,
                                            fr_data_f32(dloss), sl.p,
                                            (const int32_t *)fr_data(labels),
                                            (int)logits->shape[0], (int)logits->shape[1]));
    fr_stage_free(&sl);
    return st;
}
