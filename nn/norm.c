/* norm.c: the norm layer and the residual add under each memory strategy;
 * see norm.h, build.h and model.h. */
#include "module_impl.h"

/* Whether t may be written over: nobody else holds the tensor or its bytes
 * (the engine holds a block's input for the block's whole forward). */
static bool exclusive(const fr_tensor *t) { return t->refcount == 1 && t->storage->refcount == 1; }

/* Whether activations and residual adds write over their input: recompute
 * does (it absorbed the retired "inplace" strategy, which alone saved 0 bytes
 * on every built-in model: docs/MODELS.md). */
static bool in_place(const fr_run *run) { return run && run->strategy.recompute; }

/* act(y), releasing y (leaky ReLU for ReLU in the ABN function). recompute
 * writes over y when the activation's gradient needs only its output: y is
 * a fresh BN output or sum nobody saved. */
static fr_tensor *act_consume(fr_tensor *y, fr_act act, float slope, const fr_run *run) {
    if (!y || act == FR_ACT_IDENTITY)
        return y;
    if (run->strategy.abn_reference && act == FR_ACT_RELU) {
        act = FR_ACT_LEAKY_RELU;
        slope = FR_ABN_SLOPE;
    }
    if (in_place(run) && !fr_act_needs_input(act))
        return fr_chain(y, fr_activation_(y, act, slope));
    return fr_chain(y, fr_activation(y, act, slope));
}

fr_tensor *fr_act_layer_apply(const fr_module *m, fr_tensor *x, const fr_run *run) {
    const fr_layer *l = m->state;
    if (!x) {
        fr_error_null(m->name, "x");
        return NULL;
    }
    /* in place only over a tensor nobody else holds or saved: taken by
     * fr_forward_take (fr_forward holds a borrowed one for the call) */
    if (in_place(run) && !fr_act_needs_input(l->act) && exclusive(x))
        return fr_activation_(x, l->act, l->slope);
    return fr_activation(x, l->act, l->slope);
}

/* BN the plain way; for abn_reference the scale is |gamma| + eps. */
static fr_tensor *plain_bn(const fr_batch_norm2d_layer *bn, fr_tensor *x, const fr_run *run) {
    if (!run->strategy.abn_reference)
        return fr_batch_norm2d_layer_forward(bn, x, run->training);
    fr_tensor *scale = fr_abn_scale(bn->weight, bn->eps);
    fr_tensor *y = scale ? fr_batch_norm(x, scale, bn->bias, bn->running_mean, bn->running_var,
                                         run->training, bn->momentum, bn->eps)
                         : NULL;
    fr_release(scale);
    if (y && run->training)
        fr_batch_norm2d_layer_count_batch(bn);
    return y;
}

/* Group, layer and instance norm: fused with the activation (one kernel
 * under every strategy, so every strategy computes plain's bits); under
 * recompute in training the output is a recipe. With a residual the sum
 * comes between the norm and the activation, as for BN. */
static fr_tensor *group_norm_apply(const fr_module *m, fr_tensor *x, fr_tensor *residual,
                                   const fr_run *run) {
    const fr_layer *l = m->state;
    const fr_group_norm_layer *gn = &l->gn;
    const fr_strategy *st = &run->strategy;
    if (st->abn || st->abn_reference) {
        fr_error(FR_ERR_ARG, "%s: strategy %s cannot apply: %s is a group/layer/instance norm, and "
                 "InPlace-ABN inverts batch norm only; use recompute instead", run->model,
                 st->abn ? "abn" : "abn_reference", m->name);
        return NULL;
    }
    bool recompute = st->recompute && run->training;
    if (!residual)
        return fr_group_norm_act(x, gn->weight, gn->bias, gn->groups, gn->eps, l->act, l->slope,
                                 recompute);
    fr_tensor *y = fr_group_norm_act(x, gn->weight, gn->bias, gn->groups, gn->eps, FR_ACT_IDENTITY,
                                     0.0f, false);
    y = fr_residual_add_take(y, residual, run);
    return act_consume(y, l->act, l->slope, run);
}

fr_tensor *fr_norm_apply(const fr_module *m, fr_tensor *x, fr_tensor *residual, const fr_run *run) {
    if (!x) {
        fr_error_null("norm", "x");
        return NULL;
    }
    const fr_layer *l = m->state;
    if (l->norm_kind != FR_NORM_BATCH)
        return group_norm_apply(m, x, residual, run);
    if (residual && fr_is_channels_last(residual) != fr_is_channels_last(x)) {
        /* a channels-last model's sum where one side ran NCHW (a conv that
         * fr_conv2d_channels_last runs NCHW: a bias, a half or non-contiguous
         * weight): the residual in x's layout */
        fr_tensor *r = fr_is_channels_last(x) ? fr_to_channels_last(residual) : fr_to_nchw(residual);
        fr_tensor *y = r ? fr_norm_apply(m, x, r, run) : NULL;
        fr_release(r);
        return y;
    }
    const fr_batch_norm2d_layer *bn = &l->bn;
    fr_act act = l->act;
    const fr_strategy *st = &run->strategy;
    if ((st->abn || st->abn_reference) && act != FR_ACT_RELU && !fr_act_is_invertible(act)) {
        /* ABN recovers BN's output from the activation's output */
        fr_error(FR_ERR_ARG, "%s: strategy %s cannot apply: %s's activation %s cannot be "
                 "inverted exactly (only identity, relu, taken as leaky_relu, and leaky_relu "
                 "can); use recompute instead", run->model, st->abn ? "abn" : "abn_reference",
                 m->name, fr_act_name(act));
        return NULL;
    }
    if ((st->abn || st->abn_reference) && !exclusive(x)) {
        /* ABN writes its output over its input; where the input is read
         * again (an identity shortcut, a DenseNet feature) that would change
         * what the model computes, so the model cannot take abn. Refused for
         * abn_reference too: it stands for the abn function. */
        fr_error(FR_ERR_ARG, "%s: strategy %s cannot apply: %s would write over its input, which "
                 "cannot be overwritten in place: it is still read elsewhere (a block's input, "
                 "a tensor another layer keeps, or one a block passed borrowed: a block that "
                 "does not read it again passes it with fr_forward_take or fr_norm_add_take); "
                 "use recompute instead", run->model, st->abn ? "abn" : "abn_reference", m->name);
        return NULL;
    }
    /* The fused op where the strategy asks for it: ABN always (it defines
     * the function), recompute in training (where there is something to
     * save) and where an activation follows (an identity BN's output is
     * consumed by a sum that saves nothing); else wherever it keeps what the
     * chain of separate ops keeps (KEEP below). */
    fr_bnact_mode mode = FR_BNACT_COUNT;
    if (st->abn)
        mode = FR_BNACT_INPLACE_ABN;
    else if (st->recompute && run->training && (act != FR_ACT_IDENTITY || residual))
        /* RECOMPUTE_X keeps x as its recipe when x carries one (a dense
         * concatenation), and holds it otherwise, as RECOMPUTE does */
        mode = residual ? FR_BNACT_RECOMPUTE : FR_BNACT_RECOMPUTE_X;
    else if (!fr_grad_enabled() && !st->abn_reference && (act != FR_ACT_IDENTITY || residual))
        /* nothing is recorded (validation, a checkpointed segment's first
         * forward): one pass, the chain's bits, under every strategy */
        mode = FR_BNACT_KEEP;
    else if (run->training && !st->abn_reference && act != FR_ACT_IDENTITY &&
             (!fr_act_needs_input(act) || (!residual && !st->compress)))
        /* plain training: KEEP saves what the chain of separate ops saves
         * here (BN its input, the activation its output) and computes the chain's bits, in one pass forward
         * and one backward: the separate ReLU was 9% of a plain DenseNet
         * step (bench/RESULTS.md, issue 24). An activation that reads its
         * input (SiLU, hardswish) keeps the pre-activation as the chain
         * does, so plain still keeps what PyTorch keeps, but its backward
         * is the one fused pass, which rebuilds the pre-activation from x
         * (fn_bn_act.c). Not under compress, where the chain's backward
         * reads the pre-activation's lossy copy: the fused pass would give
         * other gradients; nor after a residual sum (fr_bn_act splits it). */
        mode = FR_BNACT_KEEP;
    if (mode != FR_BNACT_COUNT) {
        float slope = l->slope;
        if (st->abn && act == FR_ACT_RELU) {
            act = FR_ACT_LEAKY_RELU;
            slope = FR_ABN_SLOPE;
        }
        fr_bn_state s = fr_batch_norm2d_layer_state(bn, run->training);
        fr_tensor *y = fr_bn_act(x, residual, &s, act, slope, mode);
        if (y && run->training)
            fr_batch_norm2d_layer_count_batch(bn);
        return y;
    }
    fr_tensor *y = plain_bn(bn, x, run);
    if (residual)
        y = fr_residual_add_take(y, residual, run);
    return act_consume(y, act, l->slope, run);
}

/* y + shortcut; in place when y is taken and nobody else holds it (an
 * op's fresh output: conv and BN save their inputs, not their outputs). */
static fr_tensor *residual_add(fr_tensor *y, fr_tensor *shortcut, const fr_run *run, bool taken) {
    if (!y || !shortcut) {
        fr_error_null("residual_add", y ? "shortcut" : "y");
        return NULL;
    }
    if (fr_is_channels_last(y) != fr_is_channels_last(shortcut)) {
        /* a channels-last model's sum of two layouts (one side from a conv
         * fr_conv2d_channels_last ran NCHW): in NCHW (model.h) */
        fr_tensor *a = fr_to_nchw(y), *b = a ? fr_to_nchw(shortcut) : NULL;
        fr_tensor *sum = b ? fr_add(a, b) : NULL;
        fr_release(a);
        fr_release(b);
        return sum;
    }
    if (taken && in_place(run) && exclusive(y))
        return fr_add_(y, shortcut);
    return fr_add(y, shortcut);
}

/* Borrowed y: the caller may read it again, so it is never written over. */
fr_tensor *fr_residual_add(fr_tensor *y, fr_tensor *shortcut, const fr_run *run) {
    return residual_add(y, shortcut, run, false);
}

fr_tensor *fr_residual_add_take(fr_tensor *y, fr_tensor *shortcut, const fr_run *run) {
    fr_tensor *sum = residual_add(y, shortcut, run, true);
    fr_release(y);
    return sum;
}
