/* fn_loss.c: differentiable fused cross-entropy and the pointwise losses
 * (MSE, L1, smooth L1, BCE with logits). Cross-entropy's node saves the logits
 * and labels: the softmax is recomputed from the logits in backward rather
 * than kept, which costs one pass over (N, K) and saves an (N, K) buffer. */
#include <stdlib.h>

#include "functions.h"
#include "node.h"

static fr_status ce_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    fr_tensor *logits = fr_node_unpack(node, 0);
    fr_tensor *labels = logits ? fr_node_unpack(node, 1) : NULL;
    fr_tensor *dlogits = labels ? fr_empty_like(logits, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dlogits ? fr_cross_entropy_backward(dlogits, dout[0], logits, labels)
                           : fr_last_status();
    fr_release(logits);
    fr_release(labels);
    if (st != FR_OK) {
        fr_release(dlogits);
        return st;
    }
    din[0] = dlogits;
    return FR_OK;
}

fr_tensor *fr_cross_entropy(fr_tensor *logits, fr_tensor *labels) {
    if (fr_check_defined("cross_entropy", "logits", logits) != FR_OK ||
        fr_check_defined("cross_entropy", "labels", labels) != FR_OK)
        return NULL;
    fr_tensor *loss = fr_empty(fr_device_of(logits), FR_F32, 0, NULL, FR_TAG_TRANSIENT);
    if (!loss || fr_cross_entropy_forward(loss, logits, labels) != FR_OK) {
        fr_release(loss);
        return NULL;
    }
    /* Only the logits take a gradient; labels are integers. */
    if (fr_should_record(1, &logits)) {
        fr_node *node = fr_node_new("cross_entropy", ce_backward, 1, &logits, 1);
        if (!node || fr_node_save(node, logits) < 0 || fr_node_save(node, labels) < 0) {
            fr_release(loss);
            return NULL;
        }
        fr_node_set_output(node, 0, loss);
    }
    return loss;
}

/* ---- the pointwise losses: the node saves pred and target (backward
 * reads both); the target takes no gradient and is refused if it wants
 * one, rather than silently getting none. ---- */

typedef struct {
    fr_pointwise_loss kind;
    float beta;
} pointwise_ctx;

static fr_status pointwise_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const pointwise_ctx *c = node->ctx;
    fr_tensor *pred = fr_node_unpack(node, 0);
    fr_tensor *target = pred ? fr_node_unpack(node, 1) : NULL;
    fr_tensor *dpred = target ? fr_empty_like(pred, FR_TAG_TRANSIENT) : NULL;
    fr_status st = dpred ? fr_pointwise_loss_backward(dpred, dout[0], pred, target, c->kind, c->beta)
                         : fr_last_status();
    fr_release(pred);
    fr_release(target);
    if (st != FR_OK) {
        fr_release(dpred);
        return st;
    }
    din[0] = dpred;
    return FR_OK;
}

static fr_tensor *pointwise(const char *op, fr_tensor *pred, fr_tensor *target,
                            fr_pointwise_loss kind, float beta) {
    if (fr_check_defined(op, "pred", pred) != FR_OK ||
        fr_check_defined(op, "target", target) != FR_OK)
        return NULL;
    if (fr_grad_enabled() && target->requires_grad) {
        fr_error(FR_ERR_ARG, "%s: target requires grad; frugal's losses differentiate pred only "
                 "(detach the target)", op);
        return NULL;
    }
    fr_tensor *loss = fr_empty(fr_device_of(pred), FR_F32, 0, NULL, FR_TAG_TRANSIENT);
    if (!loss || fr_pointwise_loss_forward(loss, pred, target, kind, beta) != FR_OK) {
        fr_release(loss);
        return NULL;
    }
    if (fr_should_record(1, &pred)) {
        pointwise_ctx *c = malloc(sizeof *c);
        fr_node *node = c ? fr_node_new(op, pointwise_backward, 1, &pred, 1) : NULL;
        if (!node) {
            if (c)
                free(c);
            else
                fr_error(FR_ERR_OOM, "%s: out of memory", op);
            fr_release(loss);
            return NULL;
        }
        *c = (pointwise_ctx){kind, beta};
        fr_node_set_ctx(node, c, NULL);
        if (fr_node_save(node, pred) < 0 || fr_node_save(node, target) < 0) {
            fr_release(loss);
            return NULL;
        }
        fr_node_set_output(node, 0, loss);
    }
    return loss;
}

fr_tensor *fr_mse_loss(fr_tensor *pred, fr_tensor *target) {
    return pointwise("mse_loss", pred, target, FR_LOSS_MSE, 0.0f);
}
fr_tensor *fr_l1_loss(fr_tensor *pred, fr_tensor *target) {
    return pointwise("l1_loss", pred, target, FR_LOSS_L1, 0.0f);
}
fr_tensor *fr_smooth_l1_loss(fr_tensor *pred, fr_tensor *target, float beta) {
    return pointwise("smooth_l1_loss", pred, target, FR_LOSS_SMOOTH_L1, beta);
}
fr_tensor *fr_bce_with_logits_loss(fr_tensor *logits, fr_tensor *target) {
    return pointwise("binary_cross_entropy_with_logits", logits, target, FR_LOSS_BCE_LOGITS, 0.0f);
}

/* ---- cross-entropy with label smoothing ----
 * PyTorch's F.cross_entropy(logits, labels, label_smoothing=eps): the
 * target is (1 - eps) * onehot + eps / K, so the mean loss is
 * (1 - eps) * cross_entropy + eps * mean over (N, K) of -log_softmax. Built
 * from the differentiable ops, so the gradient follows; the extra node keeps
 * one (N, K) log-softmax, the size of the logits. */
fr_tensor *fr_cross_entropy_smooth(fr_tensor *logits, fr_tensor *labels, float eps) {
    if (!(eps >= 0.0f && eps <= 1.0f)) {
        fr_error(FR_ERR_ARG, "cross_entropy_smooth: eps %g must be in [0, 1]", (double)eps);
        return NULL;
    }
    if (eps == 0.0f)
        return fr_cross_entropy(logits, labels);
    fr_tensor *ce = fr_cross_entropy(logits, labels);
    fr_tensor *nll = ce ? fr_scale(ce, 1.0f - eps) : NULL;
    fr_tensor *lsm = nll ? fr_log_softmax(logits, 1) : NULL;
    fr_tensor *mean = lsm ? fr_mean(lsm) : NULL;
    fr_tensor *smooth = mean ? fr_scale(mean, -eps) : NULL;
    fr_tensor *loss = smooth ? fr_add(nll, smooth) : NULL;
    fr_release(ce);
    fr_release(nll);
    fr_release(lsm);
    fr_release(mean);
    fr_release(smooth);
    return loss;
}
