/* ops_loss.c: checked fused cross-entropy and the pointwise losses (see ops.h). Logits (and their
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

/* ---- the pointwise losses ---- */

static const char *const loss_names[] = {"mse_loss", "l1_loss", "smooth_l1_loss",
                                         "binary_cross_entropy_with_logits"};
_Static_assert(sizeof loss_names / sizeof *loss_names == FR_LOSS_COUNT, "one name per loss");

static fr_status check_pointwise(const char *op, const fr_tensor *pred, const fr_tensor *target,
                                 fr_pointwise_loss kind, float beta) {
    if ((unsigned)kind >= FR_LOSS_COUNT)
        return fr_error(FR_ERR_ARG, "%s: unknown loss %d", op, (int)kind);
    if (kind == FR_LOSS_SMOOTH_L1 && !(beta >= 0.0f))
        return fr_error(FR_ERR_ARG, "%s: beta must be >= 0 (got %g)", op, (double)beta);
    FR_TRY(fr_check_f32c(op, "pred", pred));
    FR_TRY(fr_check_f32c(op, "target", target));
    FR_TRY(fr_check_same_shape(op, "target", target, "pred", pred));
    FR_TRY(fr_check_same_device(op, "target", target, "pred", pred));
    if (fr_numel(pred) == 0)
        return fr_error(FR_ERR_SHAPE, "%s: pred is empty: the mean of no elements is undefined", op);
    return FR_OK;
}

fr_status fr_pointwise_loss_forward(fr_tensor *loss, const fr_tensor *pred, const fr_tensor *target,
                                    fr_pointwise_loss kind, float beta) {
    const char *op = (unsigned)kind < FR_LOSS_COUNT ? loss_names[kind] : "pointwise_loss";
    FR_TRY(check_pointwise(op, pred, target, kind, beta));
    FR_TRY(check_scalar(op, "loss", loss, pred));
    size_t n = (size_t)fr_numel(pred);
    fr_tensor *each = fr_empty_like(pred, FR_TAG_TRANSIENT);
    if (!each)
        return fr_last_status();
    fr_status st = FR_CALL_KERNEL(fr_device_of(pred), pointwise_loss_forward, fr_data_f32(each),
                                  fr_data_f32(pred), fr_data_f32(target), kind, beta, n);
    if (st == FR_OK)
        st = fr_sum_out(loss, each);
    if (st == FR_OK)
        st = fr_scale_out(loss, loss, (float)(1.0 / (double)n));
    fr_release(each);
    return st;
}

fr_status fr_pointwise_loss_backward(fr_tensor *dpred, const fr_tensor *dloss, const fr_tensor *pred,
                                     const fr_tensor *target, fr_pointwise_loss kind, float beta) {
    const char *op = (unsigned)kind < FR_LOSS_COUNT ? loss_names[kind] : "pointwise_loss";
    FR_TRY(check_pointwise(op, pred, target, kind, beta));
    FR_TRY(check_scalar(op, "dloss", dloss, pred));
    FR_TRY(fr_check_f32c(op, "dpred", dpred));
    FR_TRY(fr_check_same_shape(op, "dpred", dpred, "pred", pred));
    FR_TRY(fr_check_same_device(op, "dpred", dpred, "pred", pred));
    size_t n = (size_t)fr_numel(pred);
    return FR_CALL_KERNEL(fr_device_of(pred), pointwise_loss_backward, fr_data_f32(dpred),
                          fr_data_f32(dloss), fr_data_f32(pred), fr_data_f32(target), kind, beta,
                          (float)(1.0 / (double)n), n);
}
