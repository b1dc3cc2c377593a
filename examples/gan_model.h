/* gan_model.h: the DCGAN generator and discriminator of examples/gan.c, in a
 * header so that the example and its test against PyTorch
 * (tests/test_examples_torch.c) build the one definition. Written with the
 * building API (docs/MODELS.md); no strategy code.
 *
 *     G: z (N, zdim, 1, 1) -> ConvTranspose2d(zdim, 2w, 7) -> BN-ReLU (2w, 7, 7)
 *        -> ConvTranspose2d(2w, w, 4, 2, 1) -> BN-ReLU (w, 14, 14)
 *        -> ConvTranspose2d(w, 1, 4, 2, 1) -> Tanh (1, 28, 28)
 *     D: Conv2d(1, w, 4, 2, 1) -> LeakyReLU(0.2) (w, 14, 14)
 *        -> Conv2d(w, 2w, 4, 2, 1) -> BN-LeakyReLU(0.2) (2w, 7, 7)
 *        -> Flatten -> Linear(2w * 7 * 7, 1): one logit
 *
 * The example uses zdim 32 and width w 32; the test a narrower one. */
#ifndef FRUGAL_EXAMPLES_GAN_MODEL_H
#define FRUGAL_EXAMPLES_GAN_MODEL_H

#include <frugal/frugal.h>

static inline fr_model *gan_generator_new(uint64_t seed, int zdim, int width) {
    /* "in channels" and "classes" are only recorded: z's features, one grey channel out */
    fr_model *m = fr_model_new("gan_g", zdim, 1, seed);
    fr_module *net = fr_model_root(m);
    fr_conv_transpose2d_new(net, "up1", (fr_conv_transpose2d_opts){.in = zdim, .out = 2 * width,
                                                                   .kernel = 7, .no_bias = true});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 2 * width, .act = FR_ACT_RELU});
    fr_conv_transpose2d_new(net, "up2", (fr_conv_transpose2d_opts){.in = 2 * width, .out = width,
                                                                   .kernel = 4, .stride = 2,
                                                                   .pad = 1, .no_bias = true});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    fr_conv_transpose2d_new(net, "up3", (fr_conv_transpose2d_opts){.in = width, .out = 1,
                                                                   .kernel = 4, .stride = 2,
                                                                   .pad = 1});
    fr_act_new(net, "tanh", (fr_act_opts){.act = FR_ACT_TANH});
    return fr_model_finish(m);
}

static inline fr_model *gan_discriminator_new(uint64_t seed, int width) {
    fr_model *m = fr_model_new("gan_d", 1, 1, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 1, .out = width, .kernel = 4, .stride = 2,
                                                  .pad = 1, .bias = true});
    fr_act_new(net, "leaky", (fr_act_opts){.act = FR_ACT_LEAKY_RELU, .slope = 0.2f});
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = width, .out = 2 * width, .kernel = 4,
                                                  .stride = 2, .pad = 1});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = 2 * width, .act = FR_ACT_LEAKY_RELU,
                                           .slope = 0.2f});
    fr_flatten_new(net, "flatten");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 2 * width * 7 * 7, .out = 1});
    return fr_model_finish(m);
}

/* BCE targets: (N, 1) all `value`, or NULL (fr_last_error) */
static inline fr_tensor *gan_targets(int64_t n, float value) {
    fr_tensor *t = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(n, 1), FR_TAG_DATA);
    if (t && fr_fill_(t, value) != FR_OK)
        fr_clear(&t);
    return t;
}

/* BCEWithLogits(D(x), target), D in training mode; target (N, 1) */
static inline fr_tensor *gan_d_loss(fr_model *d, fr_tensor *x, fr_tensor *target) {
    fr_tensor *logits = fr_model_forward(d, x, true);
    return logits ? fr_chain(logits, fr_bce_with_logits_loss(logits, target)) : NULL;
}

#endif
