/* blocks.c: BN / add / ReLU compositions under each memory strategy; see
 * blocks.h and model.h. */
#include "blocks.h"

/* relu(y) (leaky for the ABN function), releasing y. INPLACE writes over y:
 * callers pass only tensors nobody saved (a fresh BN output or sum). */
static fr_tensor *act_consume(fr_tensor *y, const fr_model_cfg *cfg) {
    if (!y)
        return NULL;
    bool leaky = cfg->strategy.abn_reference;
    if (cfg->strategy.inplace)
        return fr_chain(y, leaky ? fr_leaky_relu_(y, FR_ABN_SLOPE) : fr_relu_(y));
    return fr_chain(y, leaky ? fr_leaky_relu(y, FR_ABN_SLOPE) : fr_relu(y));
}

/* BN the plain way; for abn_reference the scale is |gamma| + eps. */
static fr_tensor *plain_bn(const fr_batchnorm2d_layer *bn, fr_tensor *x, bool training,
                           const fr_model_cfg *cfg) {
    if (!x)
        return NULL;
    if (!cfg->strategy.abn_reference)
        return fr_batchnorm2d_layer_forward(bn, x, training);
    fr_tensor *scale = fr_abn_scale(bn->weight, bn->eps);
    fr_tensor *y = scale ? fr_batch_norm(x, scale, bn->bias, bn->running_mean, bn->running_var,
                                         training, bn->momentum, bn->eps)
                         : NULL;
    fr_release(scale);
    if (y && training)
        fr_batchnorm2d_layer_count_batch(bn);
    return y;
}

/* act(BN(x) + residual) through the fused op, when the strategy asks for it
 * (ABN always: it defines the function; recompute only in training, where
 * there is something to save). Returns false when the plain path applies. */
static bool fused(const fr_batchnorm2d_layer *bn, fr_tensor *x, fr_tensor *residual, fr_act act,
                  bool training, const fr_model_cfg *cfg, fr_tensor **out) {
    fr_bnact_mode mode;
    if (cfg->strategy.abn) {
        mode = FR_BNACT_INPLACE_ABN;
        if (act == FR_ACT_RELU)
            act = FR_ACT_LEAKY_RELU;
    } else if (cfg->strategy.recompute && training) {
        mode = FR_BNACT_RECOMPUTE;
    } else {
        return false;
    }
    fr_bn_state st = fr_batchnorm2d_layer_state(bn, training);
    *out = fr_bn_act(x, residual, &st, act, FR_ABN_SLOPE, mode);
    if (*out && training)
        fr_batchnorm2d_layer_count_batch(bn);
    return true;
}

fr_tensor *fr_bn_relu(const fr_batchnorm2d_layer *bn, fr_tensor *x, bool training,
                      const fr_model_cfg *cfg) {
    fr_tensor *y;
    if (!x)
        return NULL;
    if (fused(bn, x, NULL, FR_ACT_RELU, training, cfg, &y))
        return y;
    return act_consume(plain_bn(bn, x, training, cfg), cfg);
}

fr_tensor *fr_bn_add_relu(const fr_batchnorm2d_layer *bn, fr_tensor *x, fr_tensor *shortcut, bool training,
                          const fr_model_cfg *cfg) {
    fr_tensor *y;
    if (!x || !shortcut)
        return NULL;
    if (fused(bn, x, shortcut, FR_ACT_RELU, training, cfg, &y))
        return y;
    y = plain_bn(bn, x, training, cfg);
    return act_consume(fr_chain(y, fr_residual_add(y, shortcut, cfg)), cfg);
}

fr_tensor *fr_conv_bn(const fr_conv2d_layer *conv, const fr_batchnorm2d_layer *bn, fr_tensor *x,
                      bool training, const fr_model_cfg *cfg) {
    fr_tensor *c = fr_conv2d_layer_forward(conv, x), *y;
    if (!c)
        return NULL;
    /* Under ABN the projection's BN (identity activation) runs in place over
     * the conv output too; recompute gains nothing here (the sum consumes
     * the output without saving it). */
    if (cfg->strategy.abn && fused(bn, c, NULL, FR_ACT_IDENTITY, training, cfg, &y))
        return fr_chain(c, y);
    return fr_chain(c, plain_bn(bn, c, training, cfg));
}

fr_tensor *fr_conv_bn_relu(const fr_conv2d_layer *conv, const fr_batchnorm2d_layer *bn, fr_tensor *x,
                           bool training, const fr_model_cfg *cfg) {
    fr_tensor *y = fr_conv2d_layer_forward(conv, x);
    return fr_chain(y, fr_bn_relu(bn, y, training, cfg));
}

fr_tensor *fr_bn_relu_conv(const fr_batchnorm2d_layer *bn, const fr_conv2d_layer *conv, fr_tensor *x,
                           bool training, const fr_model_cfg *cfg) {
    fr_tensor *y = fr_bn_relu(bn, x, training, cfg);
    return fr_chain(y, fr_conv2d_layer_forward(conv, y));
}

fr_tensor *fr_residual_add(fr_tensor *y, fr_tensor *shortcut, const fr_model_cfg *cfg) {
    if (!y || !shortcut)
        return NULL;
    return cfg->strategy.inplace ? fr_add_(y, shortcut) : fr_add(y, shortcut);
}

fr_tensor *fr_global_pool(fr_tensor *x) { return x ? fr_global_avg_pool(x) : NULL; }
