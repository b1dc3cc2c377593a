/* train.c: the training step, evaluation and top-1 count; see train.h. */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../autograd/functions.h"

fr_status fr_count_correct(const fr_tensor *logits, const fr_tensor *labels, int64_t *correct) {
    FR_TRY(fr_check_ndim("count_correct", "logits", logits, 2));
    int64_t n = logits->shape[0], k = logits->shape[1];
    FR_TRY(fr_check_shape("count_correct", "labels", labels, 1, FR_SHAPE(n)));
    FR_TRY(fr_check_dtype("count_correct", "labels", labels, FR_I32));
    float *host = malloc((size_t)(n * k) * sizeof *host);
    if (!host)
        return fr_error(FR_ERR_OOM, "count_correct: out of memory");
    fr_tensor *lab = fr_device_of(labels) == FR_CPU ? fr_retain((fr_tensor *)labels)
                                                    : fr_to_device(labels, FR_CPU, FR_TAG_WORKSPACE);
    fr_status st = lab ? fr_read_f32(logits, host, (size_t)(n * k)) : fr_last_status();
    int64_t hits = 0;
    for (int64_t i = 0; st == FR_OK && i < n; i++) {
        const float *row = host + i * k;
        int64_t best = 0;
        for (int64_t j = 1; j < k; j++)
            if (row[j] > row[best])
                best = j;
        hits += best == ((const int32_t *)fr_data(lab))[i];
    }
    fr_release(lab);
    free(host);
    if (st == FR_OK)
        *correct = hits;
    return st;
}

fr_tensor *fr_model_loss(fr_model *m, fr_tensor *out, fr_tensor *x, fr_tensor *y) {
    if (!out)
        return NULL;
    return m->loss ? m->loss(m, out, x, y) : fr_cross_entropy(out, y);
}

static const char *const phase_names[] = {"forward", "backward", "optimizer", "end"};

/* Calls m's hook for `phase` (none without hooks); a hook's error comes
 * back naming the phase and the micro-batch. */
static fr_status run_hook(const fr_model *m, fr_step_phase phase, int micro, int parts) {
    const fr_step_hooks *h = m->step_hooks;
    if (!h || !h->phase)
        return FR_OK;
    fr_status st = h->phase(h->ctx, phase, micro, parts);
    if (st == FR_OK)
        return FR_OK;
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", fr_last_error());
    return fr_error(st, "train step: the %s hook of micro-batch %d of %d failed: %s", phase_names[phase],
                    micro, parts, cause);
}

/* Forward, loss and backward of micro-batch `micro` of `parts`; the loss is
 * scaled by `share` before backward so the gradients of the parts add up to
 * the whole batch's, and then by the loss scaler's scale (when there is
 * one) so that half-precision gradients do not underflow. *loss (NULL: not
 * read, so no device sync) is the loss times `share` only. */
static fr_status micro_step(fr_model *m, const fr_loss_scaler *scaler, fr_tensor *x, fr_tensor *y, int micro,
                            int parts, float share, double *loss, int64_t *correct) {
    fr_status st = run_hook(m, FR_STEP_FORWARD, micro, parts);
    if (st != FR_OK)
        return st;
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *l = fr_model_loss(m, logits, x, y);
    /* one part is the whole batch: no scaling, no extra scalar */
    fr_tensor *part = l && parts > 1 ? fr_scale(l, share) : fr_retain(l);
    fr_tensor *scaled = part && scaler ? fr_loss_scaler_scale(scaler, part) : fr_retain(part);
    st = scaled ? FR_OK : fr_last_status();
    if (st == FR_OK && correct && !m->loss)
        st = fr_count_correct(logits, y, correct);
    if (st == FR_OK && loss)
        *loss = fr_item(part);
    /* the logits are no longer needed: releasing them before backward lets
     * backward free their bytes as soon as it has used them */
    fr_release(logits);
    fr_release(l);
    fr_release(part);
    if (st == FR_OK)
        st = run_hook(m, FR_STEP_BACKWARD, micro, parts);
    if (st == FR_OK)
        st = fr_backward(scaled);
    fr_release(scaled);
    if (st != FR_OK)
        fr_tape_clear();
    return st;
}

fr_status fr_train_step(fr_model *m, fr_optim *opt, fr_loss_scaler *scaler, fr_tensor *images,
                        fr_tensor *labels, int accum, double *loss, int64_t *correct, bool *stepped) {
    if (stepped)
        *stepped = false;
    if (!m || !images || !labels || accum < 1)
        return fr_error(FR_ERR_ARG, "train step: model, images or labels is NULL, or accum %d < 1", accum);
    int64_t b = images->shape[0];
    if (labels->ndim != 1 || labels->shape[0] != b)
        return fr_error(FR_ERR_SHAPE, "train step: %lld labels for %lld images",
                        (long long)labels->shape[0], (long long)b);
    int parts = accum < b ? accum : (int)b;
    double total = 0;
    int64_t hits = 0;
    fr_status st = FR_OK;
    for (int i = 0; i < parts && st == FR_OK; i++) {
        /* part i covers [b*i/parts, b*(i+1)/parts): sizes differ by at most 1 */
        int64_t lo = b * i / parts, hi = b * (i + 1) / parts;
        fr_tensor *x = parts == 1 ? fr_retain(images) : fr_narrow(images, 0, lo, hi - lo);
        fr_tensor *y = parts == 1 ? fr_retain(labels) : fr_narrow(labels, 0, lo, hi - lo);
        double part_loss = 0;
        int64_t part_hits = 0;
        const fr_grad_sync *sync = m->grad_sync;
        if (x && y && sync)
            st = sync->begin(sync->ctx, i, parts);
        if (st == FR_OK)
            st = x && y ? micro_step(m, scaler, x, y, i, parts, (float)((double)(hi - lo) / (double)b),
                                     loss ? &part_loss : NULL, correct ? &part_hits : NULL)
                        : fr_last_status();
        total += part_loss;
        hits += part_hits;
        fr_release(x);
        fr_release(y);
    }
    bool did_step = false;
    if (st == FR_OK && m->grad_sync)
        st = m->grad_sync->finish(m->grad_sync->ctx);
    if (st == FR_OK)
        st = run_hook(m, FR_STEP_OPTIMIZER, parts, parts);
    if (st == FR_OK && opt && scaler && m->grad_sync) {
        st = fr_loss_scaler_unscale(scaler, opt->params);
        if (st == FR_OK)
            st = m->grad_sync->any(m->grad_sync->ctx, &scaler->found_nonfinite);
    }
    if (st == FR_OK && opt && scaler) {
        st = fr_loss_scaler_step(scaler, opt, NULL, &did_step);
    } else if (st == FR_OK && opt) {
        st = fr_optim_step(opt);
        did_step = st == FR_OK;
    }
    if (opt)
        fr_optim_zero_grad(opt);
    if (st == FR_OK)
        st = run_hook(m, FR_STEP_END, parts, parts);
    if (st == FR_OK && loss)
        *loss = total;
    if (st == FR_OK && correct)
        *correct = hits; /* 0 for a model with its own loss */
    if (stepped) /* true even when the end hook failed after the step */
        *stepped = did_step;
    return st;
}

fr_status fr_evaluate(fr_model *m, fr_loader *loader, double *loss, double *accuracy, int64_t *images) {
    double loss_sum = 0;
    int64_t seen = 0, hits = 0;
    fr_status st = FR_OK;
    fr_no_grad_enter();
    for (;;) {
        fr_tensor *x, *y;
        st = fr_loader_next(loader, &x, &y);
        if (st != FR_OK || !x)
            break;
        fr_tensor *logits = fr_model_forward(m, x, false);
        fr_tensor *l = fr_model_loss(m, logits, x, y);
        int64_t c = 0;
        st = !l ? fr_last_status() : m->loss ? FR_OK : fr_count_correct(logits, y, &c);
        if (st == FR_OK) {
            loss_sum += fr_item(l) * (double)x->shape[0];
            seen += x->shape[0];
            hits += c;
        }
        fr_release(l);
        fr_release(logits);
        fr_release(x);
        fr_release(y);
        if (st != FR_OK)
            break;
    }
    fr_no_grad_exit();
    fr_tape_clear();
    if (st != FR_OK)
        return st;
    if (loss)
        *loss = seen ? loss_sum / (double)seen : 0;
    if (accuracy) /* no accuracy for a model with its own loss */
        *accuracy = m->loss ? NAN : seen ? (double)hits / (double)seen : 0;
    if (images)
        *images = seen;
    return FR_OK;
}


char *fr_nonfinite_culprit(const fr_model *m, char *buf, size_t len) {
    int at = -1;
    if (fr_params_find_nonfinite(m->params, &at) != FR_OK) {
        snprintf(buf, len, "looking for a non-finite parameter failed: %s", fr_last_error());
    } else if (at >= 0) {
        const fr_param *p = &m->params->items[at];
        snprintf(buf, len, "%s '%s' holds an inf or a NaN (the first in the model's order)",
                 p->kind == FR_PARAMETER ? "parameter" : "buffer", p->name);
    } else {
        snprintf(buf, len, "every parameter and buffer is finite, so an inf or a NaN came from the input "
                 "or from an overflow in %s", fr_dtype_name(m->cfg.precision));
    }
    return buf;
}
