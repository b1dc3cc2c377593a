/* test_flat_checkpoint.c: checkpoint on models written as flat chains of
 * layers (docs/MODELS.md section 1): every layer is a step the segment
 * planner may cut (nn/segments.c), and the planner minimises the total peak
 * (nn/seg_split.h), so checkpoint lowers a flat VGG's total peak, equals plain
 * bit for bit, and never raises the total peak over the same strategy
 * without it. Peaks are the ledger's, exact. */
#include <stdio.h>
#include <string.h>

#include "testlib.h"
#include "nn/build.h"
#include "nn/module_impl.h"
#include "models/resnet.h"

/* Where the next layer goes: the root itself, or (wrap) the chain inside a
 * new block of the root's, so each layer is a block: a step on the parent
 * engine too, the same steps under the old and the new planner. */
static bool wrap;
static int n_wrapped;

static fr_tensor *wrap_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    fr_module **inner = fr_block_state(self);
    return fr_forward(*inner, x, run);
}

static fr_module *at(fr_module *net) {
    if (!wrap)
        return net;
    char name[16];
    snprintf(name, sizeof name, "w%d", n_wrapped++);
    fr_module *blk = fr_block_new(net, name, wrap_forward, sizeof(fr_module *));
    fr_module **inner = fr_block_state(blk);
    if (!inner)
        return NULL;
    return *inner = fr_chain_new(blk, "");
}

static void conv_norm(fr_module *net, const char *name, int in, int out) {
    char conv[32], bn[32];
    snprintf(conv, sizeof conv, "%s_conv", name);
    snprintf(bn, sizeof bn, "%s_bn", name);
    fr_conv2d_new(at(net), conv, (fr_conv2d_opts){.in = in, .out = out});
    fr_norm_new(at(net), bn, (fr_norm_opts){.channels = out, .act = FR_ACT_RELU});
}

static void pool(fr_module *net, const char *name) {
    fr_max_pool2d_new(at(net), name, (fr_pool_params){.kernel = 2, .stride = 2});
}

/* VGG-style: three stages of two conv + norm layers, max pools between,
 * all layers of the root chain (no block). */
static fr_model *flat_vgg(void) {
    fr_model *m = fr_model_new(wrap ? "blockvgg" : "flatvgg", 3, 10, 3);
    fr_module *net = fr_model_root(m);
    conv_norm(net, "c1", 3, 16);
    conv_norm(net, "c2", 16, 16);
    pool(net, "p1");
    conv_norm(net, "c3", 16, 32);
    conv_norm(net, "c4", 32, 32);
    pool(net, "p2");
    conv_norm(net, "c5", 32, 64);
    conv_norm(net, "c6", 64, 64);
    fr_global_avg_pool_new(at(net), "gap");
    fr_linear_new(at(net), "fc", (fr_linear_opts){.in = 64, .out = 10});
    return fr_model_finish(m);
}

/* MobileNet-like widths: a narrow-wide-narrow chain (expand 1x1 convs to 6x,
 * project back), the shape where a cut holds a big input and frees little. */
static fr_model *expand_chain(void) {
    fr_model *m = fr_model_new(wrap ? "blockexpand" : "expand", 3, 10, 5);
    fr_module *net = fr_model_root(m);
    conv_norm(net, "stem", 3, 8);
    for (int i = 0; i < 3; i++) {
        char e[16], p[16];
        snprintf(e, sizeof e, "e%d", i);
        snprintf(p, sizeof p, "p%d", i);
        fr_conv2d_new(at(net), e, (fr_conv2d_opts){.in = 8, .out = 48, .kernel = 1});
        char bn[16];
        snprintf(bn, sizeof bn, "e%d_bn", i);
        fr_norm_new(at(net), bn, (fr_norm_opts){.channels = 48, .act = FR_ACT_RELU});
        fr_conv2d_new(at(net), p, (fr_conv2d_opts){.in = 48, .out = 8, .kernel = 1});
        snprintf(bn, sizeof bn, "p%d_bn", i);
        fr_norm_new(at(net), bn, (fr_norm_opts){.channels = 8});
    }
    fr_global_avg_pool_new(at(net), "gap");
    fr_linear_new(at(net), "fc", (fr_linear_opts){.in = 8, .out = 10});
    return fr_model_finish(m);
}

static fr_model *wrapped(fr_model *(*make)(void)) {
    wrap = true;
    fr_model *m = make();
    wrap = false;
    return m;
}

/* Flatten then linear: one step (layers after a layer join its step unless
 * they are convs), nothing to cut. */
static fr_model *two_layers(void) {
    fr_model *m = fr_model_new("mlp", 3, 10, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    fr_linear_new(fr_model_root(m), "fc", (fr_linear_opts){.in = 3 * 16 * 16, .out = 10});
    return fr_model_finish(m);
}

typedef struct {
    fr_tensor *x, *labels;
    float **init;
} batch;

static batch make_batch(fr_model *m, int n, int hw) {
    batch b = {.x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, 3, hw, hw), 17), .init = fr_t_snapshot_save(m)};
    int32_t lab[16];
    for (int i = 0; i < n; i++)
        lab[i] = (i * 7) % 10;
    b.labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, lab);
    return b;
}

static void free_batch(fr_model *m, batch *b) {
    fr_t_snapshot_free(m, b->init);
    fr_release(b->x);
    fr_release(b->labels);
}

/* Each strategy S and S+checkpoint: bit-identical, and the total peak with
 * checkpoint at most the one without. Returns plain's and checkpoint's total
 * peaks through the pointers when given. */
static void check_never_above(fr_model *m, batch *b, int n_strategies, size_t *plain_total,
                              size_t *ckpt_total) {
    static const char *const base[] = {"plain", "recompute"};
    static const char *const with[] = {"checkpoint", "recompute+checkpoint"};
    for (int i = 0; i < n_strategies; i++) {
        /* a first checkpoint step plans (one trial forward per step); the
         * second runs the plan: measure that one */
        fr_t_step ref = fr_t_model_step(m, base[i], b->init, b->x, b->labels);
        fr_t_step warm = fr_t_model_step(m, with[i], b->init, b->x, b->labels);
        fr_t_step got = fr_t_model_step(m, with[i], b->init, b->x, b->labels);
        fr_t_compare_steps(m, &ref, &warm, -1, with[i]);
        fr_t_compare_steps(m, &ref, &got, -1, with[i]);
        fprintf(stderr, "  %s: %s total peak %zu (saved %zu), %s %zu (saved %zu)\n", m->name,
                with[i], got.peak_total, got.peak_saved, base[i], ref.peak_total, ref.peak_saved);
        CHECK(got.peak_total <= ref.peak_total);
        CHECK(got.peak_saved <= ref.peak_saved);
        if (i == 0 && plain_total)
            *plain_total = ref.peak_total;
        if (i == 0 && ckpt_total)
            *ckpt_total = got.peak_total;
        fr_t_step_free(&ref, m->params->count);
        fr_t_step_free(&warm, m->params->count);
        fr_t_step_free(&got, m->params->count);
    }
}

static void test_flat_vgg_checkpoint_lowers_total_peak(void) {
    fr_model *m = flat_vgg();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    batch b = make_batch(m, 8, 32);
    size_t plain = 0, ckpt = 0;
    check_never_above(m, &b, 2, &plain, &ckpt);
    fprintf(stderr, "  flat VGG b8 32x32: total peak plain %zu, checkpoint %zu (%.3fx)\n", plain, ckpt,
            (double)ckpt / (double)plain);
    CHECK(plain > 0 && (double)ckpt <= 0.8 * (double)plain);
    /* fixed segments of layers also equal plain bit for bit */
    fr_t_step ref = fr_t_model_step(m, "plain", b.init, b.x, b.labels);
    fr_t_step k3 = fr_t_model_step(m, "checkpoint:3", b.init, b.x, b.labels);
    fr_t_compare_steps(m, &ref, &k3, -1, "checkpoint:3");
    CHECK(k3.peak_saved < ref.peak_saved);
    fr_t_step_free(&ref, m->params->count);
    fr_t_step_free(&k3, m->params->count);
    free_batch(m, &b);
    fr_model_free(m);
}

static void test_checkpoint_never_raises_total_peak(void) {
    /* the wrapped models have the same steps on the parent engine, whose
     * planner minimised saved bytes: there checkpoint raised their total
     * peak (nn/seg_split.h) */
    fr_model *models[] = {expand_chain(), fr_resnet_create("resnet8", 3, 10, 7), wrapped(flat_vgg),
                          wrapped(expand_chain)};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        CHECK_NOTNULL(models[i]);
        if (!models[i])
            continue;
        batch b = make_batch(models[i], 8, 16);
        /* the flat expand chain under recompute+checkpoint peaked 1.20x
         * recompute while the planner's estimate left out what a step
         * allocates in its own backward; each step's backward is measured
         * now (nn/segments.c) */
        check_never_above(models[i], &b, 2, NULL, NULL);
        free_batch(models[i], &b);
        fr_model_free(models[i]);
    }
}

static fr_tensor *one_block_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)self;
    (void)run;
    return fr_flatten(x);
}

/* A root of one step (a block; flatten + linear) has nothing to cut:
 * refused, naming the model. */
static void test_uncuttable_model_is_refused(void) {
    fr_model *m = fr_model_new("oneblock", 3, 10, 1);
    fr_block_new(fr_model_root(m), "body", one_block_forward, 0);
    m = fr_model_finish(m);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 4), 1);
    CHECK_OK(fr_strategy_parse("checkpoint", &m->cfg.strategy));
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "oneblock: strategy checkpoint cannot apply: the model has nothing to cut");
    fr_model_free(m);
    m = two_layers();
    CHECK_NOTNULL(m);
    if (m) {
        CHECK_OK(fr_strategy_parse("checkpoint", &m->cfg.strategy));
        CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
                  "mlp: strategy checkpoint cannot apply: the model has nothing to cut");
        fr_model_free(m);
    }
    fr_release(x);
}

/* The splitter's estimate held to the ledger: after a forward cut into
 * one-step segments, the saved tag is every checkpoint's input as the
 * checkpoint keeps it plus what the last segment (run as it is) keeps;
 * fr_seq_estimate's forward_saved must be exactly that. Under compress:B a
 * checkpoint keeps its input's B-bit codes: the parent's estimate counted
 * the input at full width (4 bytes an element against 0.28-0.53) and chose
 * the split from it. */
static void test_estimate_matches_ledger(void) {
    /* one-step segments, then the chain uncut (one segment, run as it is:
     * a block's input codes are its predecessor's, made once) */
    static const char *const strategies[] = {"abn+checkpoint:1+compress:2",
                                             "abn+checkpoint:1+compress:4",
                                             "checkpoint:1+compress:8", "abn+compress:2",
                                             "compress:4", "recompute+compress:4",
                                             "abn+compress:8"};
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 7);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 16, 16), 5);
    fr_module *root = m->build->root;
    int n = fr_seq_steps(root);
    int len[16];
    CHECK(n > 2 && n <= 16);
    for (int i = 0; i < n; i++)
        len[i] = 1;
    for (size_t k = 0; k < sizeof strategies / sizeof *strategies && n <= 16; k++) {
        CHECK_OK(fr_strategy_parse(strategies[k], &m->cfg.strategy));
        fr_run run = {.strategy = m->cfg.strategy, .training = true};
        snprintf(run.model, sizeof run.model, "%s", m->name);
        double forward_saved = -1, peak = -1;
        bool uncut = !run.strategy.checkpoint;
        int whole = n;
        CHECK_OK(fr_seq_estimate(root, x, &run, uncut ? &whole : len, uncut ? 1 : n,
                                 &forward_saved, &peak));
        size_t before = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_tensor *y = fr_model_forward(m, x, true);
        CHECK_NOTNULL(y);
        double got = (double)(fr_mem_current(FR_CPU, FR_TAG_SAVED) - before);
        fprintf(stderr, "  resnet8 b4 16x16 %s: saved after forward %.0f, estimated %.0f (peak %.0f)\n",
                strategies[k], got, forward_saved, peak);
        CHECK(got == forward_saved);
        CHECK(peak > forward_saved);
        fr_release(y);
        fr_tape_clear();
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == before);
    }
    fr_release(x);
    fr_model_free(m);
}

int main(void) {
    RUN(test_estimate_matches_ledger);
    RUN(test_flat_vgg_checkpoint_lowers_total_peak);
    RUN(test_checkpoint_never_raises_total_peak);
    RUN(test_uncuttable_model_is_refused);
    return TEST_SUMMARY();
}
