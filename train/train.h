/* train.h: the training loop's parts a program calls, whatever its model:
 * one optimizer step (gradient accumulation, loss scaling), an evaluation
 * pass over a loader, and the top-1 count.
 *
 *     fr_train_step(m, opt, NULL, images, labels, 1, &loss, &correct, NULL);
 *     fr_evaluate(m, test_loader, &test_loss, &accuracy, NULL);
 *
 * Like the rest of the library these return fr_status with fr_last_error()
 * set and never exit. */
#ifndef FR_TRAIN_H
#define FR_TRAIN_H

#include "../data/loader.h"
#include "amp.h"
#include "../nn/model.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The loss of m's output on a batch: m->loss when the model has one, else
 * fr_cross_entropy(out, y). A new reference or NULL with an error. */
fr_tensor *fr_model_loss(fr_model *m, fr_tensor *out, fr_tensor *x, fr_tensor *y);

/* Correct top-1 predictions of logits (N, K) for labels (N) i32 (any
 * device). */
fr_status fr_count_correct(const fr_tensor *logits, const fr_tensor *labels, int64_t *correct);

/* One optimizer step on a batch (images (B, C, H, W), labels (B)) split into
 * `accum` micro-batches (fewer when B < accum): forward in training mode
 * (under the model's precision, fr_model_forward), cross-entropy scaled by
 * the micro-batch's share of the batch (1/accum for equal parts), backward
 * (gradients add up), then the optimizer step and zero grad. *loss gets the
 * batch's mean loss, *correct its correct predictions (either may be NULL).
 *
 * With a loss scaler (make it for m->cfg.precision: amp.h), each micro-batch's
 * loss is multiplied by the scale (fr_loss_scaler_scale) before backward and
 * the step goes through fr_loss_scaler_step: the gradients are unscaled and,
 * when any is inf or NaN, the optimizer step is skipped and the scale backs
 * off. *loss is the unscaled loss either way. Without one (NULL) the loss is
 * not scaled and fr_optim_step runs unconditionally. *stepped (may be NULL)
 * says whether the optimizer stepped.
 *
 * With opt NULL nothing is updated and the gradients stay (tests, memory
 * measurements); a scaler then only scales the loss, so the gradients stay
 * multiplied by its scale, and its state does not change. With loss NULL
 * the loss is not read back (no device sync per micro-batch).
 *
 * m->step_hooks (nn/model.h; NULL: none) is called at each phase: forward
 * and backward of every micro-batch, then optimizer and end, so a caller
 * marks phases (memreport's per-phase peaks, the bench's held bytes) with
 * the library's step instead of a loop of its own. A hook's error stops
 * the step and comes back prefixed "train step: the <phase> hook of
 * micro-batch I of N failed: ". */
fr_status fr_train_step(fr_model *m, fr_optim *opt, fr_loss_scaler *scaler, fr_tensor *images,
                        fr_tensor *labels, int accum, double *loss, int64_t *correct, bool *stepped);

/* One pass over the loader's next epoch in eval mode under no_grad: mean
 * loss and accuracy in [0, 1] (either may be NULL). */
fr_status fr_evaluate(fr_model *m, fr_loader *loader, double *loss, double *accuracy, int64_t *images);

/* Why a loss came out inf or NaN, into buf (returned), for the error a
 * program reports: "parameter 'layer1.0.conv1.weight' holds an inf or a
 * NaN" naming the first parameter or buffer of m that does
 * (fr_params_find_nonfinite), else that every one is finite (the input or an
 * overflow in m's precision). It reads every tensor: call it only after the
 * loss came out non-finite, never on the normal path. */
char *fr_nonfinite_culprit(const fr_model *m, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
