/* test_build.c: the model-building API (nn/build.h), the registry, and a
 * model that is not built in getting every strategy from the engine: the
 * same loss, gradients and BN running statistics as plain, bit for bit
 * (abn against abn_reference to round-off), fewer saved bytes, and a clear
 * refusal where a strategy cannot apply. */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"
#include "frugal.h"

static char build_dir[512];

/* ---- a small model with a residual block, a dense module and dropout ---- */

typedef struct {
    fr_module *conv1, *bn1, *conv2, *bn2, *proj;
} res_block;

static fr_tensor *res_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    res_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv1, x, run);
    y = fr_forward_take(b->bn1, y, run);
    y = fr_forward_take(b->conv2, y, run);
    fr_tensor *s = b->proj ? fr_forward(b->proj, x, run) : fr_retain(x);
    y = fr_norm_add_take(b->bn2, y, s, run);
    fr_release(s);
    return y;
}

static void res_block_new(fr_module *parent, const char *name, int in, int out, int stride) {
    fr_module *blk = fr_block_new(parent, name, res_forward, sizeof(res_block));
    res_block *b = fr_block_state(blk);
    if (!b)
        return;
    b->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = in, .out = out, .stride = stride});
    b->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = out, .act = FR_ACT_RELU});
    b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = out, .out = out});
    b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = out, .act = FR_ACT_RELU});
    if (stride != 1 || in != out) {
        b->proj = fr_chain_new(blk, "proj");
        fr_conv2d_new(b->proj, "0", (fr_conv2d_opts){.in = in, .out = out, .kernel = 1, .stride = stride});
        fr_norm_new(b->proj, "1", (fr_norm_opts){.channels = out});
    }
}

/* dense: no abn (its first layer reads the block input, held elsewhere) */
static fr_model *mixed_create(const char *name, int in, int classes, uint64_t seed, bool dense) {
    fr_model *m = fr_model_new(name, in, classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = in, .out = 8});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_module *stage = fr_chain_new(net, "stage");
    res_block_new(stage, "0", 8, 8, 1);
    res_block_new(stage, "1", 8, 12, 2);
    res_block_new(stage, "2", 12, 12, 1);
    int width = 12;
    if (dense) {
        fr_module *d = fr_dense_new(net, "dense");
        for (int j = 0; j < 3; j++, width += 4) {
            char n[8];
            snprintf(n, sizeof n, "l%d", j);
            fr_module *l = fr_chain_new(d, n);
            fr_norm_new(l, "norm", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
            fr_conv2d_new(l, "conv", (fr_conv2d_opts){.in = width, .out = 4});
        }
        fr_norm_new(net, "norm", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_dropout_new(net, "drop", 0.25f);
    fr_linear_new(net, "fc", (fr_linear_opts){.in = width, .out = classes});
    return fr_model_finish(m);
}

static void test_names_follow_the_tree(void) {
    fr_model *m = mixed_create("mixed", 3, 5, 1, true);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    static const char *const want[] = {
        "stem.weight", "stem_bn.weight", "stem_bn.num_batches_tracked", "stage.0.conv1.weight",
        "stage.0.bn2.running_var", "stage.1.proj.0.weight", "stage.1.proj.1.bias",
        "dense.l0.norm.weight", "dense.l2.conv.weight", "norm.running_mean", "fc.weight", "fc.bias"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK(fr_params_get(m->params, want[i]) != NULL);
    CHECK(fr_params_get(m->params, "stage.0.proj.0.weight") == NULL);
    CHECK(fr_params_get(m->params, "dense.l2.conv.weight")->shape[1] == 20);
    CHECK(!strcmp(fr_module_name(fr_module_child(fr_model_root(m), 2)), "stage"));
    CHECK(fr_module_kind_of(fr_module_child(fr_model_root(m), 3)) == FR_MODULE_DENSE);
    fr_model_free(m);
}

/* The first construction error is kept; later constructors do nothing. */
static void test_first_construction_error_wins(void) {
    fr_model *m = fr_model_new("broken", 3, 10, 1);
    fr_module *net = fr_model_root(m);
    CHECK(fr_conv2d_new(net, "conv", (fr_conv2d_opts){.in = 3, .out = 0}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "conv2d conv");
    CHECK(fr_norm_new(net, "bn", (fr_norm_opts){.channels = 4}) == NULL);
    CHECK(fr_linear_new(NULL, "fc", (fr_linear_opts){.in = 1, .out = 1}) == NULL);
    CHECK(fr_model_finish(m) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "conv2d conv");
    CHECK(fr_model_new("", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "needs a name");
    /* NULL in, NULL out, the error left alone */
    m = mixed_create("mixed", 3, 5, 1, false);
    fr_error(FR_ERR_IO, "sentinel");
    fr_run run = {.training = true};
    CHECK(fr_forward(fr_module_child(fr_model_root(m), 0), NULL, &run) == NULL);
    CHECK(fr_norm_add(fr_module_child(fr_model_root(m), 1), NULL, NULL, &run) == NULL);
    CHECK(fr_residual_add(NULL, NULL, &run) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_IO, "sentinel");
    fr_model_free(m);
}

/* ---- every strategy on the custom model ---- */

static void check_strategies(bool dense) {
    fr_model *m = mixed_create("mixed", 3, 5, 3, dense);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 12, 12), 21);
    int32_t lab[4] = {0, 3, 1, 4};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    static const char *const exact[] = {"recompute", "checkpoint", "checkpoint:1",
                                        "checkpoint:2", "recompute+checkpoint",
                                        "recompute+checkpoint:3"};
    /* the same dropout masks in every run: each step draws them from seed 5 */
    fr_t_check_strategies(m, init, x, labels, "plain", exact, (int)(sizeof exact / sizeof *exact),
                          -1, 5);
    if (!dense) {
        static const char *const abn[] = {"abn", "abn+checkpoint", "abn+checkpoint:2"};
        fr_t_check_strategies(m, init, x, labels, "abn_reference", abn,
                              (int)(sizeof abn / sizeof *abn), 2e-4, 5);
    } else {
        CHECK_OK(fr_strategy_parse("abn", &m->cfg.strategy));
        CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
                  "strategy abn cannot apply: dense.l0.norm");
        fr_tape_clear();
    }
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

static void test_custom_model_every_strategy_equals_plain(void) { check_strategies(false); }
static void test_custom_dense_model_every_strategy_equals_plain(void) { check_strategies(true); }

/* ---- a block that reads a tensor again after passing it to a layer ---- */

typedef struct {
    fr_module *conv, *act, *bn, *conv2, *bn2;
} reread_block;

/* relu(y) + y, then (bn2(conv2(...)) + y), then with y passed borrowed to
 * a norm and read again as the residual: under recompute the act layer and
 * the residual add wrote over y, and abn over bn's input, because nothing
 * but the block held it (the block's reference looked exclusive) */
static fr_tensor *reread_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    reread_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv, x, run);
    fr_tensor *a = fr_forward(b->act, y, run);
    fr_tensor *s = fr_residual_add(a, y, run);
    fr_release(a);
    fr_tensor *t = fr_residual_add(y, s, run); /* y borrowed: y + s, y kept */
    fr_release(s);
    fr_tensor *n = fr_forward(b->bn, t, run);
    n = fr_forward_take(b->conv2, n, run);
    fr_tensor *out = fr_norm_add(b->bn2, t, n, run); /* t borrowed */
    fr_release(n);
    fr_tensor *sum = fr_residual_add_take(out, t, run);
    fr_release(t);
    fr_release(y);
    return sum;
}

static fr_model *reread_create(void) {
    fr_model *m = fr_model_new("reread", 3, 3, 1);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = 3, .out = 4});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_module *blk = fr_block_new(net, "blk", reread_forward, sizeof(reread_block));
    reread_block *b = fr_block_state(blk);
    if (b) {
        b->conv = fr_conv2d_new(blk, "conv", (fr_conv2d_opts){.in = 4, .out = 4});
        b->act = fr_act_new(blk, "act", (fr_act_opts){.act = FR_ACT_RELU});
        b->bn = fr_norm_new(blk, "bn", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
        b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = 4, .out = 4});
        b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 4, .out = 3});
    return fr_model_finish(m);
}

static void test_borrowed_inputs_are_never_written_over(void) {
    fr_model *m = reread_create();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 5);
    int32_t lab[2] = {0, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    /* recompute was 0.49-1.03 off plain's gradients here, silently */
    static const char *const exact[] = {"recompute", "checkpoint:1", "recompute+checkpoint"};
    fr_t_check_strategies(m, init, x, labels, "plain", exact, 3, -1, 5);
    /* eval: no tape, the in-place paths run too */
    float out[2][3];
    for (int i = 0; i < 2; i++) {
        fr_t_snapshot_restore(m, init);
        CHECK_OK(fr_strategy_parse(i ? "recompute" : "plain", &m->cfg.strategy));
        fr_no_grad_enter();
        fr_tensor *o = fr_model_forward(m, x, false);
        fr_no_grad_exit();
        CHECK_NOTNULL(o);
        if (o)
            memcpy(out[i], fr_data_f32(o), sizeof out[i]);
        fr_release(o);
    }
    CHECK(!memcmp(out[0], out[1], sizeof out[0]));
    /* abn would write over bn's input, which the block reads again */
    fr_t_snapshot_restore(m, init);
    CHECK_OK(fr_strategy_parse("abn", &m->cfg.strategy));
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "strategy abn cannot apply: blk.bn would write over its input");
    fr_tape_clear();
    fr_clear_error();
    /* the NULL convention of the residual add: with no error pending, the
     * NULL is itself the error (it returned NULL and left none) */
    fr_run run = {.training = true};
    CHECK(fr_residual_add(x, NULL, &run) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "residual_add");
    fr_clear_error();
    CHECK(fr_norm_add(fr_module_child(fr_model_root(m), 1), x, NULL, &run) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "residual");
    fr_clear_error();
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* ---- refusals ---- */

static void test_strategies_a_model_cannot_honour_are_refused(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 4), 1);
    /* no norm layer: nothing for recompute to act on */
    fr_model *m = fr_model_new("mlp", 3, 4, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    fr_linear_new(fr_model_root(m), "fc", (fr_linear_opts){.in = 48, .out = 4});
    m = fr_model_finish(m);
    CHECK_OK(fr_strategy_parse("recompute", &m->cfg.strategy));
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "mlp: strategy recompute cannot apply: the model has no norm layer");
    fr_model_free(m);
    /* one layer: one step, nothing to cut (tests/test_flat_checkpoint.c has
     * a block alone) */
    m = fr_model_new("flat", 3, 48, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    m = fr_model_finish(m);
    CHECK_OK(fr_strategy_parse("checkpoint", &m->cfg.strategy));
    fr_tensor *y = fr_model_forward(m, x, true);
    CHECK_ERR(fr_t_status_of(y), FR_ERR_ARG, "flat: strategy checkpoint cannot apply");
    fr_model_free(m);
    /* a model still under construction runs nothing */
    m = fr_model_new("unfinished", 3, 48, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "unfinished: the model was not finished (fr_model_finish)");
    fr_model_free(m);
    /* pre-activation: abn would write over the block input the shortcut reads */
    m = fr_resnet_create("preresnet11", 3, 4, 1);
    CHECK_OK(fr_strategy_parse("abn", &m->cfg.strategy));
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "preresnet11: strategy abn cannot apply: layer1.0.bn1");
    fr_tape_clear();
    fr_model_free(m);
    fr_release(x);
}

/* ---- registry ---- */

static fr_model *tiny_create(const char *name, int in, int classes, uint64_t seed) {
    return mixed_create(name, in, classes, seed, false);
}

static void test_registry(void) {
    CHECK(fr_model_registry_count() >= 3);
    CHECK_OK(fr_model_register("tiny", false, tiny_create, "tiny (a test model)"));
    CHECK_ERR(fr_model_register("tiny", false, tiny_create, NULL), FR_ERR_ARG, "registered already");
    fr_model *m = fr_model_create("tiny", 3, 5, 1);
    CHECK(m && !strcmp(m->name, "tiny") && fr_params_get(m->params, "stage.1.proj.0.weight"));
    fr_model_free(m);
    m = fr_model_create("resnet20", 3, 10, 1);
    CHECK(m && fr_params_get(m->params, "layer3.2.bn2.weight"));
    fr_model_free(m);
    CHECK(fr_model_create("vgg16", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "unknown model \"vgg16\"");
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "tiny (a test model)");
    CHECK(fr_cli_model_create("vgg16", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "--model: unknown model");
}

/* ---- examples/custom_model: checkpoint keeps at most 0.6x plain's bytes ---- */

static size_t saved_peak_of(const char *strategy, char *out, size_t len) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/examples/custom_model --strategy %s --steps 2 --batch 8 --val 16 2>&1",
             build_dir, strategy);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    int rc = p ? pclose(p) : -1;
    CHECK(rc == 0);
    const char *at = strstr(out, "saved peak ");
    return at ? (size_t)strtoull(at + 11, NULL, 10) : 0;
}

static void test_custom_model_example_checkpoint_saves(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/custom_model", build_dir);
    if (access(path, X_OK) != 0)
        SKIP("examples not built");
    if (access(FR_FASHION_MNIST_DIR, R_OK) != 0)
        SKIP("no Fashion-MNIST at " FR_FASHION_MNIST_DIR);
    static char plain_out[65536], ck_out[65536];
    size_t plain = saved_peak_of("plain", plain_out, sizeof plain_out);
    size_t ck = saved_peak_of("checkpoint", ck_out, sizeof ck_out);
    printf("    custom_model saved peak: plain %zu, checkpoint %zu (%.3fx)\n", plain, ck,
           plain ? (double)ck / (double)plain : 0.0);
    CHECK(plain > 0 && ck > 0);
    CHECK((double)ck <= 0.6 * (double)plain);
    /* the same training: the loss lines agree */
    const char *a = strstr(plain_out, "step 2  loss"), *b = strstr(ck_out, "step 2  loss");
    CHECK(a && b && !strncmp(a, b, 20));
    CHECK(strstr(ck_out, "validation (no_grad, 16 images)") != NULL);
}

int main(int argc, char **argv) {
    (void)argc;
    char self[512];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(build_dir, sizeof build_dir, "%s", dirname(dirname(self)));
    RUN(test_names_follow_the_tree);
    RUN(test_first_construction_error_wins);
    RUN(test_custom_model_every_strategy_equals_plain);
    RUN(test_custom_dense_model_every_strategy_equals_plain);
    RUN(test_borrowed_inputs_are_never_written_over);
    RUN(test_strategies_a_model_cannot_honour_are_refused);
    RUN(test_registry);
    RUN(test_custom_model_example_checkpoint_saves);
    return TEST_SUMMARY();
}
