/* fn_loss.c: differentiable fused cross-entropy. The node saves the logits
 * and labels: the softmax is recomputed from the logits in backward rather
 * than kept, which costs one pass over (N, K) and saves an (N, K) buffer. */
#include "functions.h"

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
