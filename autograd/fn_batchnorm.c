/* fn_batchnorm.c: differentiable batch norm over (N, C, H, W) or (N, C).
 *
 * Training normalises with the batch statistics and updates the running ones
 * once, in the forward; its node saves x, the batch mean and invstd (C each,
 * small) and gamma, and backward goes through the statistics. Eval
 * normalises with the running statistics, which makes it an affine map per
 * channel: its node saves the running mean, the invstd computed from the
 * running variance, gamma, and x only when gamma wants a gradient. */
#include <stdlib.h>

#include "checkpoint_log.h"
#include "functions.h"
#include "node.h"

enum { BN_X = 0, BN_GAMMA, BN_BETA };

typedef struct {
    bool training;
    int x, mean, invstd, gamma; /* saved slots; x is -1 when not saved */
} bn_ctx;

static fr_tensor *channels(const fr_tensor *like_x) {
    return fr_empty(fr_device_of(like_x), FR_F32, 1, FR_SHAPE(like_x->shape[1]), FR_TAG_TRANSIENT);
}

/* Hands t to din[i] when input i wants a gradient, else drops it. */
static void route(fr_node *node, fr_tensor **din, int i, fr_tensor *t) {
    if (fr_node_needs_grad(node, i))
        din[i] = t;
    else
        fr_release(t);
}

static fr_status train_backward(fr_node *node, const bn_ctx *c, fr_tensor *dy, fr_tensor **din) {
    fr_tensor *x = fr_node_unpack(node, c->x);
    fr_tensor *mean = x ? fr_node_unpack(node, c->mean) : NULL;
    fr_tensor *invstd = mean ? fr_node_unpack(node, c->invstd) : NULL;
    fr_tensor *gamma = invstd ? fr_node_unpack(node, c->gamma) : NULL;
    fr_tensor *dx = NULL, *dgamma = NULL, *dbeta = NULL;
    fr_status st = gamma ? FR_OK : fr_last_status();
    if (st == FR_OK && fr_node_needs_grad(node, BN_X) && !(dx = fr_empty_like(x, FR_TAG_TRANSIENT)))
        st = fr_last_status();
    /* The kernel always produces both parameter gradients; unwanted ones are
     * C floats and dropped. */
    if (st == FR_OK && (!(dgamma = channels(x)) || !(dbeta = channels(x))))
        st = fr_last_status();
    if (st == FR_OK)
        st = fr_batch_norm_backward(dx, dgamma, dbeta, dy, x, mean, invstd, gamma);
    fr_release(x);
    fr_release(mean);
    fr_release(invstd);
    fr_release(gamma);
    if (st != FR_OK) {
        fr_release(dx);
        fr_release(dgamma);
        fr_release(dbeta);
        return st;
    }
    din[BN_X] = dx;
    route(node, din, BN_GAMMA, dgamma);
    route(node, din, BN_BETA, dbeta);
    return FR_OK;
}

static fr_status eval_backward(fr_node *node, const bn_ctx *c, fr_tensor *dy, fr_tensor **din) {
    fr_tensor *mean = fr_node_unpack(node, c->mean);
    fr_tensor *invstd = mean ? fr_node_unpack(node, c->invstd) : NULL;
    fr_tensor *gamma = invstd ? fr_node_unpack(node, c->gamma) : NULL;
    fr_tensor *x = gamma && c->x >= 0 ? fr_node_unpack(node, c->x) : NULL;
    fr_tensor *zero = NULL, *dx = NULL, *dgamma = NULL, *dbeta = NULL;
    fr_status st = gamma && (c->x < 0 || x) ? FR_OK : fr_last_status();
    if (st == FR_OK && fr_node_needs_grad(node, BN_X)) {
        /* dx = dy * gamma * invstd: the affine map with a zero shift. */
        zero = fr_zeros(fr_device_of(dy), FR_F32, 1, FR_SHAPE(dy->shape[1]), FR_TAG_TRANSIENT);
        dx = zero ? fr_empty_like(dy, FR_TAG_TRANSIENT) : NULL;
        st = dx ? fr_batch_norm_apply(dx, dy, zero, invstd, gamma, zero) : fr_last_status();
    }
    if (st == FR_OK && (fr_node_needs_grad(node, BN_GAMMA) || fr_node_needs_grad(node, BN_BETA))) {
        /* dgamma = sum(dy * (x - mean) * invstd) and dbeta = sum(dy) are the
         * training kernel's parameter gradients with the running statistics.
         * Without x (gamma frozen) dy stands in for it: only dbeta is kept. */
        if (!(dgamma = channels(dy)) || !(dbeta = channels(dy)))
            st = fr_last_status();
        else
            st = fr_batch_norm_backward(NULL, dgamma, dbeta, dy, x ? x : dy, mean, invstd, gamma);
    }
    fr_release(zero);
    fr_release(x);
    fr_release(mean);
    fr_release(invstd);
    fr_release(gamma);
    if (st != FR_OK) {
        fr_release(dx);
        fr_release(dgamma);
        fr_release(dbeta);
        return st;
    }
    din[BN_X] = dx;
    if (dgamma) {
        route(node, din, BN_GAMMA, dgamma);
        route(node, din, BN_BETA, dbeta);
    }
    return FR_OK;
}

static fr_status bn_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    const bn_ctx *c = node->ctx;
    return c->training ? train_backward(node, c, dout[0], din) : eval_backward(node, c, dout[0], din);
}

/* Saves what the backward for `c->training` needs; fills the slots. */
static fr_status save_all(fr_node *node, bn_ctx *c, fr_tensor *x, fr_tensor *mean,
                          fr_tensor *invstd, fr_tensor *gamma) {
    c->x = -1;
    if ((c->training || fr_node_needs_grad(node, BN_GAMMA)) && (c->x = fr_node_save_activation(node, x, true)) < 0)
        return fr_last_status();
    if ((c->mean = fr_node_save(node, mean)) < 0 || (c->invstd = fr_node_save(node, invstd)) < 0 ||
        (c->gamma = fr_node_save(node, gamma)) < 0)
        return fr_last_status();
    return FR_OK;
}

fr_tensor *fr_batch_norm(fr_tensor *x, fr_tensor *gamma, fr_tensor *beta, fr_tensor *running_mean,
                         fr_tensor *running_var, bool training, float momentum, float eps) {
    const char *op = training ? "batch_norm" : "batch_norm (eval)";
    if (fr_check_defined(op, "x", x) != FR_OK || fr_check_defined(op, "gamma", gamma) != FR_OK ||
        fr_check_defined(op, "beta", beta) != FR_OK)
        return NULL;
    if (!training && (fr_check_defined(op, "running_mean", running_mean) != FR_OK ||
                      fr_check_defined(op, "running_var", running_var) != FR_OK))
        return NULL;
    if (x->ndim < 2) {
        char buf[96];
        fr_error(FR_ERR_SHAPE, "%s: x has shape %s, expected (N, C, H, W) or (N, C)", op,
                 fr_shape_str(x, buf, sizeof buf));
        return NULL;
    }
    fr_tensor *in[3] = {x, gamma, beta};
    bool record = fr_should_record(3, in);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_tensor *mean = NULL, *invstd = NULL;
    fr_status st = y ? FR_OK : fr_last_status();
    /* Training always computes the batch statistics; eval needs its invstd
     * only to keep it for backward. */
    if (st == FR_OK && (training || record) && !(invstd = channels(x)))
        st = fr_last_status();
    if (st == FR_OK && training && !(mean = channels(x)))
        st = fr_last_status();
    if (st == FR_OK && training) {
        /* A checkpointed segment replayed in backward must not move the
         * running statistics a second time. */
        bool update = !fr_in_recompute();
        st = fr_batch_norm_train_forward(y, mean, invstd, x, gamma, beta,
                                        update ? running_mean : NULL, update ? running_var : NULL,
                                        momentum, eps);
    } else if (st == FR_OK) {
        /* read here, so a checkpoint's replay reads them again */
        fr_tensor *stats[2] = {running_mean, running_var};
        fr_checkpoint_note_reads(2, stats);
        st = fr_batch_norm_eval_forward(y, x, gamma, beta, running_mean, running_var, eps);
        /* the same kernel on the same variance: the scale y was made with */
        if (st == FR_OK && record)
            st = fr_batch_norm_invstd(invstd, running_var, eps);
    }
    if (st == FR_OK && record) {
        bn_ctx *c = calloc(1, sizeof *c);
        fr_node *node = c ? fr_node_new(op, bn_backward, 3, in, 1) : NULL;
        if (!node) {
            if (!c)
                fr_error(FR_ERR_OOM, "%s: out of memory", op);
            free(c);
            st = fr_last_status();
        } else {
            c->training = training;
            fr_node_set_ctx(node, c, NULL);
            st = save_all(node, c, x, training ? mean : running_mean, invstd, gamma);
            if (st == FR_OK)
                fr_node_set_output(node, 0, y);
        }
    }
    /* The node holds its own references to what it saved. */
    fr_release(mean);
    fr_release(invstd);
    if (st != FR_OK)
        fr_clear(&y);
    return y;
}
