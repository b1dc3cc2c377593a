/* resnet.c: CIFAR ResNets and pre-activation ResNets; see resnet.h. */
#include "resnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "plan.h"

typedef struct {
    fr_conv2d_layer conv1, conv2;
    fr_batchnorm2d_layer bn1, bn2;
    bool has_shortcut;
    fr_conv2d_layer shortcut_conv;    /* shortcut.0: 1x1, stride s */
    fr_batchnorm2d_layer shortcut_bn; /* shortcut.1 */
} basic_block;

typedef struct {
    fr_batchnorm2d_layer bn1, bn2, bn3;
    fr_conv2d_layer conv1, conv2, conv3;
    bool has_shortcut;
    fr_conv2d_layer shortcut_conv;    /* shortcut.0: 1x1, stride s, no BN */
} preact_bottleneck;

struct resnet;

/* A run of blocks checkpointed as one segment; the checkpoint node keeps a
 * copy (fr_checkpoint), so the replay reads the strategy and training flag
 * of its own forward. */
typedef struct {
    const struct resnet *r;
    fr_model_cfg cfg;
    int first, count;
    bool training;
} segment;

typedef struct resnet {
    bool preact;
    int n_blocks;                /* 3 stages of n_blocks / 3 */
    fr_conv2d_layer conv1;       /* stem */
    fr_batchnorm2d_layer bn;     /* after the stem (basic) or before the pool (preact) */
    basic_block *basic;          /* n_blocks, when !preact */
    preact_bottleneck *bottleneck; /* n_blocks, when preact */
    fr_linear_layer fc;
} resnet;

enum { STAGES = 3, EXPANSION = 4 };
static const int stage_width[STAGES] = {16, 32, 64};

/* ---- forward ---- */

static fr_tensor *basic_block_forward(const basic_block *b, fr_tensor *x, bool training,
                                      const fr_model_cfg *cfg) {
    fr_tensor *out = fr_conv_bn_relu(&b->conv1, &b->bn1, x, training, cfg);
    out = fr_chain(out, fr_conv2d_layer_forward(&b->conv2, out));
    fr_tensor *shortcut = b->has_shortcut
                              ? fr_conv_bn(&b->shortcut_conv, &b->shortcut_bn, x, training, cfg)
                              : fr_retain(x);
    out = fr_chain(out, fr_bn_add_relu(&b->bn2, out, shortcut, training, cfg));
    fr_release(shortcut);
    return out;
}

static fr_tensor *bottleneck_forward(const preact_bottleneck *b, fr_tensor *x, bool training,
                                     const fr_model_cfg *cfg) {
    /* The projection sees the pre-activated input, the identity the raw one. */
    fr_tensor *act = fr_bn_relu(&b->bn1, x, training, cfg);
    fr_tensor *shortcut = b->has_shortcut ? fr_conv2d_layer_forward(&b->shortcut_conv, act)
                                          : fr_retain(x);
    fr_tensor *out = fr_chain(act, fr_conv2d_layer_forward(&b->conv1, act));
    out = fr_chain(out, fr_bn_relu_conv(&b->bn2, &b->conv2, out, training, cfg));
    out = fr_chain(out, fr_bn_relu_conv(&b->bn3, &b->conv3, out, training, cfg));
    out = fr_chain(out, fr_residual_add(out, shortcut, cfg));
    fr_release(shortcut);
    return out;
}

static fr_tensor *block_forward(const resnet *r, int i, fr_tensor *x, bool training,
                                const fr_model_cfg *cfg) {
    return r->preact ? bottleneck_forward(&r->bottleneck[i], x, training, cfg)
                     : basic_block_forward(&r->basic[i], x, training, cfg);
}

static fr_tensor *segment_forward(void *ctx, fr_tensor *x) {
    const segment *s = ctx;
    fr_tensor *out = fr_retain(x);
    for (int i = s->first; i < s->first + s->count; i++)
        out = fr_chain(out, block_forward(s->r, i, out, s->training, &s->cfg));
    return out;
}

/* Splits the blocks into checkpoint segments: k blocks each for
 * "checkpoint:k"; for "checkpoint", by estimated bytes (nn/plan.h). A block's
 * cost counts the activation-sized tensors it keeps for backward, in units
 * of its output's elements: conv1, relu1 and conv2 outputs plus the block
 * output (4) under plain, one fewer under recompute (relu1 is a recipe), two
 * under abn (each BN+act writes over its conv's output); a projection
 * shortcut keeps one more. Returns the number of segments. */
static int plan(const resnet *r, const fr_strategy *st, const fr_tensor *x, int *seg_len) {
    if (st->checkpoint > 0) {
        int n = 0;
        for (int first = 0; first < r->n_blocks; first += st->checkpoint)
            seg_len[n++] = first + st->checkpoint <= r->n_blocks ? st->checkpoint : r->n_blocks - first;
        return n;
    }
    double *cost = malloc(2 * (size_t)r->n_blocks * sizeof *cost);
    if (!cost) {
        for (int i = 0; i < r->n_blocks; i++)
            seg_len[i] = 1;
        return r->n_blocks;
    }
    double *input = cost + r->n_blocks;
    double per_block = st->abn ? 2 : st->recompute ? 3 : 4;
    /* bytes per activation element: 2 under f16 / bf16 autocast */
    double elem = (double)fr_plan_elem_bytes();
    int64_t h = x->shape[2], w = x->shape[3];
    double prev = (double)stage_width[0] * (double)(h * w) * elem;
    int per_stage = r->n_blocks / STAGES;
    for (int i = 0; i < r->n_blocks; i++) {
        int stage = i / per_stage;
        if (i > 0 && i % per_stage == 0) { /* a stride-2 block: (H+1)/2 */
            h = (h + 1) / 2;
            w = (w + 1) / 2;
        }
        double width = stage_width[stage] * (r->preact ? EXPANSION : 1);
        double out = width * (double)(h * w) * elem;
        bool projection = r->preact ? r->bottleneck[i].has_shortcut : r->basic[i].has_shortcut;
        cost[i] = out * (per_block + (projection ? 1 : 0));
        input[i] = prev;
        prev = out;
    }
    int n = fr_plan_segments(cost, input, r->n_blocks, seg_len);
    free(cost);
    return n;
}

static fr_tensor *resnet_forward(fr_model *m, fr_tensor *x, bool training) {
    if (fr_check_defined(m->name, "input", x) != FR_OK)
        return NULL;
    resnet *r = m->impl;
    const fr_model_cfg *cfg = &m->cfg;
    if (r->preact && cfg->strategy.abn) {
        /* A pre-activation block starts with BN+ReLU on its input, which the
         * identity shortcut still needs: it cannot be overwritten in place. */
        fr_error(FR_ERR_ARG, "%s: the abn strategy needs post-activation blocks (resnet<6n+2>); "
                             "use recompute for pre-activation ResNets", m->name);
        return NULL;
    }
    fr_tensor *out;
    if (r->preact)
        out = fr_conv2d_layer_forward(&r->conv1, x);
    else
        out = fr_conv_bn_relu(&r->conv1, &r->bn, x, training, cfg);
    if (cfg->strategy.checkpoint) {
        int *seg_len = malloc((size_t)r->n_blocks * sizeof *seg_len);
        int n_seg = seg_len ? plan(r, &cfg->strategy, x, seg_len) : 0;
        if (!seg_len) {
            fr_error(FR_ERR_OOM, "%s: out of memory planning checkpoint segments", m->name);
            fr_clear(&out);
        }
        for (int s = 0, first = 0; s < n_seg && out; first += seg_len[s], s++) {
            segment seg = {.r = r, .cfg = *cfg, .first = first, .count = seg_len[s],
                           .training = training};
            out = fr_chain(out, fr_checkpoint(segment_forward, &seg, sizeof seg, out));
        }
        free(seg_len);
    } else {
        for (int i = 0; i < r->n_blocks; i++)
            out = fr_chain(out, block_forward(r, i, out, training, cfg));
    }
    if (r->preact)
        out = fr_chain(out, fr_bn_relu(&r->bn, out, training, cfg));
    out = fr_chain(out, fr_global_pool(out));
    return fr_chain(out, fr_linear_layer_forward(&r->fc, out));
}

/* ---- construction ---- */

static fr_status basic_block_init(basic_block *b, fr_params *p, const char *name, int in, int out,
                                  int stride, fr_rng *rng) {
    char n[FR_NAME_MAX];
    FR_TRY(fr_conv2d_layer_init(&b->conv1, p, fr_name_join(n, sizeof n, name, "conv1"), in, out, 3,
                                stride, 1, false, rng));
    FR_TRY(fr_batchnorm2d_layer_init(&b->bn1, p, fr_name_join(n, sizeof n, name, "bn1"), out));
    FR_TRY(fr_conv2d_layer_init(&b->conv2, p, fr_name_join(n, sizeof n, name, "conv2"), out, out, 3, 1,
                                1, false, rng));
    FR_TRY(fr_batchnorm2d_layer_init(&b->bn2, p, fr_name_join(n, sizeof n, name, "bn2"), out));
    b->has_shortcut = stride != 1 || in != out;
    if (!b->has_shortcut)
        return FR_OK;
    FR_TRY(fr_conv2d_layer_init(&b->shortcut_conv, p, fr_name_join(n, sizeof n, name, "shortcut.0"), in,
                                out, 1, stride, 0, false, rng));
    return fr_batchnorm2d_layer_init(&b->shortcut_bn, p, fr_name_join(n, sizeof n, name, "shortcut.1"),
                                     out);
}

static fr_status bottleneck_init(preact_bottleneck *b, fr_params *p, const char *name, int in,
                                 int planes, int stride, fr_rng *rng) {
    char n[FR_NAME_MAX];
    int out = planes * EXPANSION;
    FR_TRY(fr_batchnorm2d_layer_init(&b->bn1, p, fr_name_join(n, sizeof n, name, "bn1"), in));
    FR_TRY(fr_conv2d_layer_init(&b->conv1, p, fr_name_join(n, sizeof n, name, "conv1"), in, planes, 1,
                                1, 0, false, rng));
    FR_TRY(fr_batchnorm2d_layer_init(&b->bn2, p, fr_name_join(n, sizeof n, name, "bn2"), planes));
    FR_TRY(fr_conv2d_layer_init(&b->conv2, p, fr_name_join(n, sizeof n, name, "conv2"), planes, planes,
                                3, stride, 1, false, rng));
    FR_TRY(fr_batchnorm2d_layer_init(&b->bn3, p, fr_name_join(n, sizeof n, name, "bn3"), planes));
    FR_TRY(fr_conv2d_layer_init(&b->conv3, p, fr_name_join(n, sizeof n, name, "conv3"), planes, out, 1,
                                1, 0, false, rng));
    b->has_shortcut = stride != 1 || in != out;
    if (!b->has_shortcut)
        return FR_OK;
    return fr_conv2d_layer_init(&b->shortcut_conv, p, fr_name_join(n, sizeof n, name, "shortcut.0"), in,
                                out, 1, stride, 0, false, rng);
}

static void resnet_free(void *impl) {
    resnet *r = impl;
    if (!r)
        return;
    free(r->basic);
    free(r->bottleneck);
    free(r);
}

static fr_status resnet_build(resnet *r, fr_params *p, int per_stage, int in_channels, int num_classes,
                              fr_rng *rng) {
    int width = stage_width[0];
    FR_TRY(fr_conv2d_layer_init(&r->conv1, p, "conv1", in_channels, width, 3, 1, 1, false, rng));
    if (!r->preact)
        FR_TRY(fr_batchnorm2d_layer_init(&r->bn, p, "bn1", width));
    for (int s = 0, i = 0; s < STAGES; s++) {
        for (int j = 0; j < per_stage; j++, i++) {
            char name[FR_NAME_MAX];
            snprintf(name, sizeof name, "layer%d.%d", s + 1, j);
            int stride = s > 0 && j == 0 ? 2 : 1;
            if (r->preact) {
                FR_TRY(bottleneck_init(&r->bottleneck[i], p, name, width, stage_width[s], stride, rng));
                width = stage_width[s] * EXPANSION;
            } else {
                FR_TRY(basic_block_init(&r->basic[i], p, name, width, stage_width[s], stride, rng));
                width = stage_width[s];
            }
        }
    }
    if (r->preact)
        FR_TRY(fr_batchnorm2d_layer_init(&r->bn, p, "bn", width));
    return fr_linear_layer_init(&r->fc, p, "fc", width, num_classes, true, rng);
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
    int per_stage = (depth - 2) / per_block;
    fr_model *m = fr_model_alloc(name, in_channels, num_classes);
    resnet *r = calloc(1, sizeof *r);
    if (r) {
        r->preact = preact;
        r->n_blocks = STAGES * per_stage;
        if (preact)
            r->bottleneck = calloc((size_t)r->n_blocks, sizeof *r->bottleneck);
        else
            r->basic = calloc((size_t)r->n_blocks, sizeof *r->basic);
    }
    if (!m || !r || !(r->basic || r->bottleneck)) {
        if (m)
            fr_error(FR_ERR_OOM, "resnet: %s: out of memory", name);
        resnet_free(r);
        fr_model_free(m);
        return NULL;
    }
    m->impl = r;
    m->impl_free = resnet_free;
    m->forward = resnet_forward;
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    if (resnet_build(r, m->params, per_stage, in_channels, num_classes, &rng) != FR_OK) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}
