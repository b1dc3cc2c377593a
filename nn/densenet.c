/* densenet.c: DenseNet-BC for CIFAR and its memory-efficient form; see
 * densenet.h. */
#include "densenet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"

enum { BLOCKS = 3, DEFAULT_GROWTH = 12, BOTTLENECK = 4 };

typedef struct {
    fr_batchnorm2d_layer norm1, norm2;
    fr_conv2d_layer conv1, conv2; /* 1x1 to 4K channels, 3x3 to K */
} dense_layer;

typedef struct {
    fr_batchnorm2d_layer norm;
    fr_conv2d_layer conv; /* 1x1, compression 0.5; an average pool follows */
} transition;

struct densenet;

/* A run of dense layers of one block checkpointed as one segment; the
 * checkpoint node keeps a copy (fr_checkpoint). */
typedef struct {
    const struct densenet *d;
    fr_model_cfg cfg;
    int first, count; /* layer indices into densenet.layers */
    bool training;
} segment;

typedef struct densenet {
    int per_block;       /* dense layers per block */
    fr_conv2d_layer conv0;
    dense_layer *layers; /* BLOCKS * per_block */
    transition trans[BLOCKS - 1];
    fr_batchnorm2d_layer norm5;
    fr_linear_layer classifier;
} densenet;

/* ---- forward ---- */

/* The features side by side: the one feature as it is (no copy), else a new
 * concatenation, recomputable under the efficient strategy. Borrowed in, new
 * reference out. */
static fr_tensor *join(fr_tensor *const *f, int n, bool recomputable) {
    if (n == 1)
        return fr_retain(f[0]);
    return recomputable ? fr_concat_recomputable(f, n) : fr_concat(f, n);
}

/* relu(bn(x)) where x is a concatenation. Under recompute (training) the
 * fused op keeps x as its recipe and builds its own output's recipe from it,
 * so neither is stored; otherwise the blocks.c composition. */
static fr_tensor *bn_relu_of_concat(const fr_batchnorm2d_layer *bn, fr_tensor *x, bool training,
                                    const fr_model_cfg *cfg) {
    if (!x)
        return NULL;
    if (!(cfg->strategy.recompute && training))
        return fr_bn_relu(bn, x, training, cfg);
    fr_bn_state st = fr_batchnorm2d_layer_state(bn, training);
    fr_tensor *y = fr_bn_act(x, NULL, &st, FR_ACT_RELU, 0.0f, FR_BNACT_RECOMPUTE_X);
    if (y)
        fr_batchnorm2d_layer_count_batch(bn);
    return y;
}

/* The new feature (N, K, H, W) of a layer reading features f[0..n). */
static fr_tensor *dense_layer_forward(const dense_layer *l, fr_tensor *const *f, int n,
                                      bool training, const fr_model_cfg *cfg) {
    fr_tensor *cat = join(f, n, cfg->strategy.recompute);
    fr_tensor *h = fr_chain(cat, bn_relu_of_concat(&l->norm1, cat, training, cfg));
    h = fr_chain(h, fr_conv2d_layer_forward(&l->conv1, h));
    return fr_chain(h, fr_bn_relu_conv(&l->norm2, &l->conv2, h, training, cfg));
}

/* Runs layers [first, first + count) over x and returns the features x, f1,
 * f2, ... joined (recomputable when `recomputable`). */
static fr_tensor *run_layers(const densenet *d, int first, int count, fr_tensor *x, bool training,
                             const fr_model_cfg *cfg, bool recomputable) {
    fr_tensor **f = calloc((size_t)count + 1, sizeof *f);
    if (!f) {
        fr_error(FR_ERR_OOM, "densenet: out of memory");
        return NULL;
    }
    int n = 0;
    f[n++] = fr_retain(x);
    for (int i = first; i < first + count; i++) {
        fr_tensor *y = dense_layer_forward(&d->layers[i], f, n, training, cfg);
        if (!y)
            break;
        f[n++] = y;
    }
    fr_tensor *out = n == count + 1 ? join(f, n, recomputable) : NULL;
    for (int i = 0; i < n; i++)
        fr_release(f[i]);
    free(f);
    return out;
}

static fr_tensor *segment_forward(void *ctx, fr_tensor *x) {
    const segment *s = ctx;
    /* The segment's output is kept by the next segment's checkpoint: a real
     * tensor, not a recipe. */
    return run_layers(s->d, s->first, s->count, x, s->training, &s->cfg, false);
}

/* Dense layers per checkpointed segment: ceil(sqrt(layers per block)) unless
 * given. */
static int segment_length(const densenet *d, const fr_strategy *st) {
    if (st->checkpoint > 0)
        return st->checkpoint < d->per_block ? st->checkpoint : d->per_block;
    int k = 1;
    while (k * k < d->per_block)
        k++;
    return k;
}

/* Block b over its input x: the concatenation of x and every layer's
 * feature, the input of the transition (or of norm5). */
static fr_tensor *block_forward(densenet *d, int b, fr_tensor *x, bool training,
                                const fr_model_cfg *cfg) {
    int first = b * d->per_block;
    if (!cfg->strategy.checkpoint)
        return run_layers(d, first, d->per_block, x, training, cfg, cfg->strategy.recompute);
    int k = segment_length(d, &cfg->strategy);
    fr_tensor *out = fr_retain(x);
    for (int i = first; i < first + d->per_block && out; i += k) {
        segment s = {.d = d, .cfg = *cfg, .first = i, .training = training,
                     .count = i + k <= first + d->per_block ? k : first + d->per_block - i};
        out = fr_chain(out, fr_checkpoint(segment_forward, &s, sizeof s, out));
    }
    return out;
}

static fr_tensor *transition_forward(const transition *t, fr_tensor *x, bool training,
                                     const fr_model_cfg *cfg) {
    fr_tensor *y = bn_relu_of_concat(&t->norm, x, training, cfg);
    y = fr_chain(y, fr_conv2d_layer_forward(&t->conv, y));
    return fr_chain(y, y ? fr_avg_pool2d(y, (fr_pool_params){.kernel = 2, .stride = 2}) : NULL);
}

static fr_tensor *densenet_forward(fr_model *m, fr_tensor *x, bool training) {
    if (fr_check_defined(m->name, "input", x) != FR_OK)
        return NULL;
    densenet *d = m->impl;
    const fr_model_cfg *cfg = &m->cfg;
    if (cfg->strategy.abn || cfg->strategy.abn_reference) {
        fr_error(FR_ERR_ARG,
                 "%s: the abn strategy cannot apply to DenseNet: a layer's input, the "
                 "concatenation of earlier features, is read again by every later layer and "
                 "cannot be overwritten in place; use recompute (memory-efficient DenseNet)",
                 m->name);
        return NULL;
    }
    fr_tensor *out = fr_conv2d_layer_forward(&d->conv0, x);
    for (int b = 0; b < BLOCKS && out; b++) {
        out = fr_chain(out, block_forward(d, b, out, training, cfg));
        if (b < BLOCKS - 1)
            out = fr_chain(out, transition_forward(&d->trans[b], out, training, cfg));
    }
    out = fr_chain(out, bn_relu_of_concat(&d->norm5, out, training, cfg));
    out = fr_chain(out, fr_global_pool(out));
    return fr_chain(out, fr_linear_layer_forward(&d->classifier, out));
}

/* ---- construction ---- */

static fr_status dense_layer_init(dense_layer *l, fr_params *p, const char *name, int in, int growth,
                                  fr_rng *rng) {
    char n[FR_NAME_MAX];
    int mid = BOTTLENECK * growth;
    FR_TRY(fr_batchnorm2d_layer_init(&l->norm1, p, fr_name_join(n, sizeof n, name, "norm1"), in));
    FR_TRY(fr_conv2d_layer_init(&l->conv1, p, fr_name_join(n, sizeof n, name, "conv1"), in, mid, 1, 1,
                                0, false, rng));
    FR_TRY(fr_batchnorm2d_layer_init(&l->norm2, p, fr_name_join(n, sizeof n, name, "norm2"), mid));
    return fr_conv2d_layer_init(&l->conv2, p, fr_name_join(n, sizeof n, name, "conv2"), mid, growth,
                                3, 1, 1, false, rng);
}

/* Registers everything in PyTorch's state_dict order. */
static fr_status densenet_build(densenet *d, fr_params *p, int growth, int in_channels,
                                int num_classes, fr_rng *rng) {
    int width = 2 * growth;
    char name[FR_NAME_MAX], n[FR_NAME_MAX];
    FR_TRY(fr_conv2d_layer_init(&d->conv0, p, "features.conv0", in_channels, width, 3, 1, 1, false,
                                rng));
    for (int b = 0; b < BLOCKS; b++) {
        for (int j = 0; j < d->per_block; j++) {
            snprintf(name, sizeof name, "features.denseblock%d.denselayer%d", b + 1, j + 1);
            FR_TRY(dense_layer_init(&d->layers[b * d->per_block + j], p, name, width, growth, rng));
            width += growth;
        }
        if (b == BLOCKS - 1)
            break;
        transition *t = &d->trans[b];
        snprintf(name, sizeof name, "features.transition%d", b + 1);
        FR_TRY(fr_batchnorm2d_layer_init(&t->norm, p, fr_name_join(n, sizeof n, name, "norm"), width));
        FR_TRY(fr_conv2d_layer_init(&t->conv, p, fr_name_join(n, sizeof n, name, "conv"), width,
                                    width / 2, 1, 1, 0, false, rng));
        width /= 2;
    }
    FR_TRY(fr_batchnorm2d_layer_init(&d->norm5, p, "features.norm5", width));
    return fr_linear_layer_init(&d->classifier, p, "classifier", width, num_classes, true, rng);
}

static void densenet_free(void *impl) {
    densenet *d = impl;
    if (!d)
        return;
    free(d->layers);
    free(d);
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
    char canonical[32];
    snprintf(canonical, sizeof canonical, "densenet-bc-%d-k%d", depth, growth);
    fr_model *m = fr_model_alloc(canonical, in_channels, num_classes);
    densenet *d = calloc(1, sizeof *d);
    if (d) {
        d->per_block = (depth - 4) / 6;
        d->layers = calloc((size_t)(BLOCKS * d->per_block), sizeof *d->layers);
    }
    if (!m || !d || !d->layers) {
        if (m)
            fr_error(FR_ERR_OOM, "densenet: %s: out of memory", name);
        densenet_free(d);
        fr_model_free(m);
        return NULL;
    }
    m->impl = d;
    m->impl_free = densenet_free;
    m->forward = densenet_forward;
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    if (densenet_build(d, m->params, growth, in_channels, num_classes, &rng) != FR_OK) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}
