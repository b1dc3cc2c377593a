/* densenet.c: DenseNet-BC for CIFAR and its memory-efficient form; see
 * densenet.h. */
#include "densenet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../nn/build.h"
#include "registry.h"

enum { BLOCKS = 3, DEFAULT_GROWTH = 12, BOTTLENECK = 4 };

/* A dense layer: conv3x3_K(relu(bn(conv1x1_4K(relu(bn(x)))))) of the
 * concatenation x of the features so far (the dense module makes it). */
static void dense_layer_new(fr_module *block, const char *name, int in, int growth) {
    int mid = BOTTLENECK * growth;
    fr_module *l = fr_chain_new(block, name);
    fr_norm_new(l, "norm1", (fr_norm_opts){.channels = in, .act = FR_ACT_RELU});
    fr_conv2d_new(l, "conv1", (fr_conv2d_opts){.in = in, .out = mid, .kernel = 1});
    fr_norm_new(l, "norm2", (fr_norm_opts){.channels = mid, .act = FR_ACT_RELU});
    fr_conv2d_new(l, "conv2", (fr_conv2d_opts){.in = mid, .out = growth});
}

/* Everything in PyTorch's state_dict order. */
static void densenet_build(fr_module *net, int per_block, int growth, int in_channels, int num_classes) {
    int width = 2 * growth;
    char name[32];
    fr_module *features = fr_chain_new(net, "features");
    fr_conv2d_new(features, "conv0", (fr_conv2d_opts){.in = in_channels, .out = width});
    for (int b = 0; b < BLOCKS; b++) {
        snprintf(name, sizeof name, "denseblock%d", b + 1);
        fr_module *block = fr_dense_new(features, name);
        for (int j = 0; j < per_block; j++, width += growth) {
            snprintf(name, sizeof name, "denselayer%d", j + 1);
            dense_layer_new(block, name, width, growth);
        }
        if (b == BLOCKS - 1)
            break;
        snprintf(name, sizeof name, "transition%d", b + 1);
        fr_module *t = fr_chain_new(features, name);
        fr_norm_new(t, "norm", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
        fr_conv2d_new(t, "conv", (fr_conv2d_opts){.in = width, .out = width / 2, .kernel = 1});
        fr_avg_pool2d_new(t, "pool", (fr_pool_params){.kernel = 2, .stride = 2});
        width /= 2;
    }
    fr_norm_new(features, "norm5", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "pool");
    fr_linear_new(net, "classifier", (fr_linear_opts){.in = width, .out = num_classes});
}

/* The parameters and the f32 activation bytes of one 32x32 image (each
 * layer's concatenation, BN, conv and pool outputs once) densenet_build
 * would make, from the numbers alone: checked against the ceilings
 * (models/registry.h) before any allocation. Mirrors densenet_build. */
static void densenet_size(int per_block, int growth, int in_channels, int num_classes, double *params,
                          double *act) {
    double k = growth, width = 2 * k, hw = 32 * 32, mid = BOTTLENECK * k;
    *params = 9.0 * in_channels * width;
    *act = width * hw;
    for (int b = 0; b < BLOCKS; b++) {
        for (int j = 0; j < per_block; j++, width += k) {
            *params += 2 * width + width * mid + 2 * mid + 9 * mid * k;
            *act += (2 * width + 2 * mid + k) * hw;
        }
        if (b == BLOCKS - 1)
            break;
        double half = (double)((int64_t)width / 2);
        *params += 2 * width + width * half;
        *act += (width + half) * hw + half * hw / 4;
        width = half;
        hw /= 4;
    }
    *params += 2 * width + width * num_classes + num_classes;
    *act = 4 * (*act + width * hw + width + num_classes);
}

/* Reads a positive decimal at *p (at most 5 digits) and advances past it. */
static bool read_int(const char **p, int *out) {
    int v = 0, digits = 0;
    while (**p >= '0' && **p <= '9' && digits < 6) {
        v = v * 10 + (**p - '0');
        (*p)++;
        digits++;
    }
    *out = v;
    return digits > 0 && digits < 6 && v > 0;
}

/* "densenet-bc-100" or "densenet-bc-100-k12"; *growth 0 when absent. */
static bool parse_name(const char *name, int *depth, int *growth) {
    static const char prefix[] = "densenet-bc-";
    if (strncmp(name, prefix, sizeof prefix - 1))
        return false;
    const char *p = name + sizeof prefix - 1;
    if (!read_int(&p, depth))
        return false;
    *growth = 0;
    if (!*p)
        return true;
    if (strncmp(p, "-k", 2))
        return false;
    p += 2;
    return read_int(&p, growth) && !*p;
}

fr_model *fr_densenet_create(const char *name, int growth, int in_channels, int num_classes,
                             uint64_t seed) {
    int depth, named_growth;
    if (!name || !parse_name(name, &depth, &named_growth)) {
        fr_error(FR_ERR_ARG, "densenet: unknown model \"%s\" (use densenet-bc-<6n+4> such as "
                             "densenet-bc-100 or densenet-bc-40, optionally with a growth rate: "
                             "densenet-bc-100-k24)",
                 name ? name : "(null)");
        return NULL;
    }
    if (growth < 0 || (growth > 0 && named_growth > 0 && growth != named_growth)) {
        fr_error(FR_ERR_ARG, "densenet: %s: growth %d disagrees with the name (0 takes it from the "
                             "name)", name, growth);
        return NULL;
    }
    growth = growth ? growth : named_growth ? named_growth : DEFAULT_GROWTH;
    if (depth < 10 || depth > 10000 || (depth - 4) % 6) {
        fr_error(FR_ERR_ARG, "densenet: %s: depth %d is not 6n + 4 with n >= 1", name, depth);
        return NULL;
    }
    if (in_channels <= 0 || num_classes <= 0 || growth > 4096) {
        fr_error(FR_ERR_ARG, "densenet: %s: in_channels %d, num_classes %d must be positive and "
                             "growth %d at most 4096", name, in_channels, num_classes, growth);
        return NULL;
    }
    double params, act;
    densenet_size((depth - 4) / 6, growth, in_channels, num_classes, &params, &act);
    if (fr_model_check_size(name, params, act) != FR_OK)
        return NULL;
    char canonical[32];
    snprintf(canonical, sizeof canonical, "densenet-bc-%d-k%d", depth, growth);
    fr_model *m = fr_model_new(canonical, in_channels, num_classes, seed);
    if (m)
        densenet_build(fr_model_root(m), (depth - 4) / 6, growth, in_channels, num_classes);
    return fr_model_finish(m);
}
