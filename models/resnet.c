/* resnet.c: CIFAR ResNets and pre-activation ResNets; see resnet.h. */
#include "resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/build.h"
#include "registry.h"

enum { STAGES = 3, EXPANSION = 4 };
static const int stage_width[STAGES] = {16, 32, 64};

/* ---- the basic block: relu(bn2(conv2(relu(bn1(conv1 x)))) + shortcut x) ---- */

typedef struct {
    fr_module *conv1, *bn1, *conv2, *bn2, *shortcut; /* shortcut NULL: identity */
} basic_block;

static fr_tensor *basic_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    basic_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv1, x, run);
    y = fr_forward_take(b->bn1, y, run);
    y = fr_forward_take(b->conv2, y, run);
    fr_tensor *s = b->shortcut ? fr_forward(b->shortcut, x, run) : fr_retain(x);
    y = fr_norm_add_take(b->bn2, y, s, run);
    fr_release(s);
    return y;
}

static void basic_block_new(fr_module *stage, const char *name, int in, int out, int stride) {
    fr_module *blk = fr_block_new(stage, name, basic_forward, sizeof(basic_block));
    basic_block *b = fr_block_state(blk);
    if (!b)
        return;
    b->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = in, .out = out, .stride = stride});
    b->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = out, .act = FR_ACT_RELU});
    b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = out, .out = out});
    b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = out, .act = FR_ACT_RELU});
    if (stride == 1 && in == out)
        return;
    /* option B: 1x1 projection and BN, named as nn.Sequential names them */
    b->shortcut = fr_chain_new(blk, "shortcut");
    fr_conv2d_new(b->shortcut, "0", (fr_conv2d_opts){.in = in, .out = out, .kernel = 1, .stride = stride});
    fr_norm_new(b->shortcut, "1", (fr_norm_opts){.channels = out});
}

/* ---- the pre-activation bottleneck ---- */

typedef struct {
    fr_module *bn1, *conv1, *bn2, *conv2, *bn3, *conv3, *shortcut; /* shortcut NULL: identity */
} bottleneck;

static fr_tensor *bottleneck_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    bottleneck *b = fr_block_state(self);
    /* The projection sees the pre-activated input, the identity the raw one. */
    fr_tensor *act = fr_forward(b->bn1, x, run);
    fr_tensor *s = b->shortcut ? fr_forward(b->shortcut, act, run) : fr_retain(x);
    fr_tensor *y = fr_forward_take(b->conv1, act, run);
    y = fr_forward_take(b->bn2, y, run);
    y = fr_forward_take(b->conv2, y, run);
    y = fr_forward_take(b->bn3, y, run);
    y = fr_forward_take(b->conv3, y, run);
    y = fr_residual_add_take(y, s, run);
    fr_release(s);
    return y;
}

static void bottleneck_new(fr_module *stage, const char *name, int in, int planes, int stride) {
    fr_module *blk = fr_block_new(stage, name, bottleneck_forward, sizeof(bottleneck));
    bottleneck *b = fr_block_state(blk);
    if (!b)
        return;
    int out = planes * EXPANSION;
    b->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = in, .act = FR_ACT_RELU});
    b->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = in, .out = planes, .kernel = 1});
    b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = planes, .act = FR_ACT_RELU});
    b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = planes, .out = planes, .stride = stride});
    b->bn3 = fr_norm_new(blk, "bn3", (fr_norm_opts){.channels = planes, .act = FR_ACT_RELU});
    b->conv3 = fr_conv2d_new(blk, "conv3", (fr_conv2d_opts){.in = planes, .out = out, .kernel = 1});
    if (stride != 1 || in != out)
        b->shortcut = fr_conv2d_new(blk, "shortcut.0",
                                    (fr_conv2d_opts){.in = in, .out = out, .kernel = 1, .stride = stride});
}

/* ---- the network ---- */

static void resnet_build(fr_module *net, bool preact, int per_stage, int in_channels, int num_classes) {
    int width = stage_width[0];
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = in_channels, .out = width});
    if (!preact)
        fr_norm_new(net, "bn1", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    for (int s = 0; s < STAGES; s++) {
        char name[16];
        snprintf(name, sizeof name, "layer%d", s + 1);
        fr_module *stage = fr_chain_new(net, name);
        for (int j = 0; j < per_stage; j++) {
            snprintf(name, sizeof name, "%d", j);
            int stride = s > 0 && j == 0 ? 2 : 1;
            if (preact) {
                bottleneck_new(stage, name, width, stage_width[s], stride);
                width = stage_width[s] * EXPANSION;
            } else {
                basic_block_new(stage, name, width, stage_width[s], stride);
                width = stage_width[s];
            }
        }
    }
    if (preact)
        fr_norm_new(net, "bn", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "avgpool");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = width, .out = num_classes});
}

/* The parameters and the f32 activation bytes of one 32x32 image (every
 * conv, BN and add output once) that resnet_build would make, from the
 * numbers alone: checked against the ceilings (models/registry.h) before any
 * allocation. Mirrors resnet_build block by block. */
static void resnet_size(bool preact, int per_stage, int in_channels, int num_classes, double *params,
                        double *act) {
    double width = stage_width[0], hw = 32 * 32;
    *params = 9.0 * in_channels * width + (preact ? 0 : 2 * width);
    *act = (preact ? 1 : 2) * width * hw;
    for (int s = 0; s < STAGES; s++) {
        for (int j = 0; j < per_stage; j++) {
            bool down = s > 0 && j == 0;
            double hw_out = down ? hw / 4 : hw, planes = stage_width[s];
            if (preact) {
                double out = planes * EXPANSION;
                *params += 2 * width + width * planes + 2 * planes + 9 * planes * planes + 2 * planes +
                           planes * out;
                *act += width * hw + planes * hw + 2 * planes * hw + planes * hw_out * 2 + out * hw_out * 2;
                if (down || width != out) {
                    *params += width * out;
                    *act += out * hw_out;
                }
                width = out;
            } else {
                *params += 9 * width * planes + 2 * planes + 9 * planes * planes + 2 * planes;
                *act += 4 * planes * hw_out;
                if (down || width != planes) {
                    *params += width * planes + 2 * planes;
                    *act += 2 * planes * hw_out;
                }
                width = planes;
            }
            hw = hw_out;
        }
    }
    *params += (preact ? 2 * width : 0) + width * num_classes + num_classes;
    *act = 4 * (*act + (preact ? width * hw : 0) + width + num_classes);
}

/* "resnet20" -> preact false, depth 20; false when the name is not a form
 * we know. */
static bool parse_name(const char *name, bool *preact, int *depth) {
    const char *digits;
    if (!strncmp(name, "preresnet", 9)) {
        *preact = true;
        digits = name + 9;
    } else if (!strncmp(name, "resnet", 6)) {
        *preact = false;
        digits = name + 6;
    } else {
        return false;
    }
    char *end;
    long d = strtol(digits, &end, 10);
    if (end == digits || *end || d <= 0 || d > 10000)
        return false;
    *depth = (int)d;
    return true;
}

fr_model *fr_resnet_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    bool preact;
    int depth;
    if (!name || !parse_name(name, &preact, &depth)) {
        fr_error(FR_ERR_ARG, "resnet: unknown model \"%s\" (use resnet<6n+2> such as resnet20, "
                             "resnet56, resnet110, or preresnet<9n+2> such as preresnet164)",
                 name ? name : "(null)");
        return NULL;
    }
    int per_block = preact ? 9 : 6;
    if (depth < per_block + 2 || (depth - 2) % per_block) {
        fr_error(FR_ERR_ARG, "resnet: %s: depth %d is not %dn + 2 with n >= 1", name, depth, per_block);
        return NULL;
    }
    if (in_channels <= 0 || num_classes <= 0) {
        fr_error(FR_ERR_ARG, "resnet: %s: in_channels %d and num_classes %d must be positive", name,
                 in_channels, num_classes);
        return NULL;
    }
    double params, act;
    resnet_size(preact, (depth - 2) / per_block, in_channels, num_classes, &params, &act);
    if (fr_model_check_size(name, params, act) != FR_OK)
        return NULL;
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    if (m) {
        resnet_build(fr_model_root(m), preact, (depth - 2) / per_block, in_channels, num_classes);
        /* convolutions and batch norms only between the input and the
         * pool: channels last applies (nn/model.h) */
        m->channels_last_capable = true;
    }
    return fr_model_finish(m);
}
