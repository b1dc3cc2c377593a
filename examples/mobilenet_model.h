/* mobilenet_model.h: the MobileNetV2-style CIFAR network of
 * examples/mobilenet.c, in a header so that the example and its test
 * (tests/test_examples.c) build the one definition. Written with the building
 * API (docs/MODELS.md).
 *
 * Each inverted-residual block: 1x1 expand, BN + act, 3x3 depthwise conv
 * (groups = channels), BN + act, squeeze-excitation (mean over H, W; linear,
 * ReLU, linear, hardsigmoid; x times the scale, broadcast), 1x1 project, BN,
 * and the input added back when the shapes allow (fr_norm_add); act is SiLU
 * in the early blocks and hardswish in the later ones. No strategy code: the
 * engine applies the strategy (abn is refused: its norms' activations,
 * hardswish and SiLU, cannot be inverted). */
#ifndef FRUGAL_EXAMPLES_MOBILENET_MODEL_H
#define FRUGAL_EXAMPLES_MOBILENET_MODEL_H

#include <stdio.h>

#include <frugal/frugal.h>

typedef struct {
    fr_module *expand, *bn1, *conv, *bn2, *fc1, *fc2, *project, *bn3;
    bool residual;
} inv_block;

/* x * hardsigmoid(fc2(relu(fc1(mean(x, (2, 3)))))), the scale broadcast
 * over H and W as in torchvision's SqueezeExcitation */
static fr_tensor *squeeze_excite(inv_block *b, fr_tensor *x, const fr_run *run) {
    fr_tensor *s = fr_mean_dims(x, 2, (int[]){2, 3}, false);   // (N, C)
    s = fr_forward_take(b->fc1, s, run);
    s = fr_chain(s, fr_relu(s));
    s = fr_forward_take(b->fc2, s, run);
    s = fr_chain(s, fr_activation(s, FR_ACT_HARDSIGMOID, 0.0f));
    s = fr_chain(s, s ? fr_reshape(s, 4, FR_SHAPE(x->shape[0], x->shape[1], 1, 1)) : NULL);
    return fr_chain(s, s ? fr_mul(x, s) : NULL);
}

static fr_tensor *inv_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    inv_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->expand, x, run);
    y = fr_forward_take(b->bn1, y, run);
    y = fr_forward_take(b->conv, y, run);
    y = fr_forward_take(b->bn2, y, run);
    y = fr_chain(y, y ? squeeze_excite(b, y, run) : NULL);
    y = fr_forward_take(b->project, y, run);
    if (b->residual)
        return fr_norm_add_take(b->bn3, y, x, run);
    return fr_forward_take(b->bn3, y, run);
}

static void inv_block_new(fr_module *parent, const char *name, int in, int out, int expand,
                          int stride, fr_act act) {
    fr_module *blk = fr_block_new(parent, name, inv_forward, sizeof(inv_block));
    inv_block *b = fr_block_state(blk);
    if (!b)
        return;
    int mid = in * expand, squeezed = mid / 4 > 8 ? mid / 4 : 8;
    b->expand = fr_conv2d_new(blk, "expand", (fr_conv2d_opts){.in = in, .out = mid, .kernel = 1});
    b->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = mid, .act = act});
    /* depthwise: one 3x3 filter per channel, as MobileNetV2 */
    b->conv = fr_conv2d_new(blk, "conv",
                            (fr_conv2d_opts){.in = mid, .out = mid, .stride = stride, .groups = mid});
    b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = mid, .act = act});
    b->fc1 = fr_linear_new(blk, "se_fc1", (fr_linear_opts){.in = mid, .out = squeezed});
    b->fc2 = fr_linear_new(blk, "se_fc2", (fr_linear_opts){.in = squeezed, .out = mid});
    b->project = fr_conv2d_new(blk, "project", (fr_conv2d_opts){.in = mid, .out = out, .kernel = 1});
    b->bn3 = fr_norm_new(blk, "bn3", (fr_norm_opts){.channels = out});
    b->residual = stride == 1 && in == out;
}

/* width: the stem's channels (16 in the example; every other width scales
 * with it); dropout: before the classifier (0.2 in the example; 0 leaves the
 * layer out, so the test against PyTorch is deterministic) */
static inline fr_model *mobilenet_create_opts(const char *name, int in_channels, int num_classes,
                                              uint64_t seed, int width, float dropout) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = in_channels, .out = width});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = width, .act = FR_ACT_HARDSWISH});
    /* (out, expand, stride, activation) per block at width 16, CIFAR-sized: 32 -> 16 -> 8 */
    static const struct {
        int out, expand, stride;
        fr_act act;
    } cfg[] = {{16, 1, 1, FR_ACT_SILU},      {24, 4, 2, FR_ACT_SILU},      {24, 4, 1, FR_ACT_SILU},
               {40, 4, 2, FR_ACT_HARDSWISH}, {40, 4, 1, FR_ACT_HARDSWISH}, {48, 4, 1, FR_ACT_HARDSWISH}};
    int in = width, head = 128 * width / 16;
    for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
        char nm[8];
        int out = cfg[i].out * width / 16;
        snprintf(nm, sizeof nm, "b%zu", i);
        inv_block_new(net, nm, in, out, cfg[i].expand, cfg[i].stride, cfg[i].act);
        in = out;
    }
    fr_conv2d_new(net, "head", (fr_conv2d_opts){.in = in, .out = head, .kernel = 1});
    fr_norm_new(net, "head_bn", (fr_norm_opts){.channels = head, .act = FR_ACT_HARDSWISH});
    fr_global_avg_pool_new(net, "gap");
    if (dropout > 0)
        fr_dropout_new(net, "drop", dropout);
    fr_linear_new(net, "fc", (fr_linear_opts){.in = head, .out = num_classes});
    return fr_model_finish(m);
}

static inline fr_model *mobilenet_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    return mobilenet_create_opts(name, in_channels, num_classes, seed, 16, 0.2f);
}

#endif
