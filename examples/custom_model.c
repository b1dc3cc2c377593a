/* custom_model.c: a model that is not built in, written with the building
 * API (docs/MODELS.md), trained on Fashion-MNIST for --steps steps under
 * any --strategy, then a no_grad validation pass and the memory ledger.
 *
 *     build/examples/custom_model --strategy checkpoint --steps 20
 *
 * The model: a stem, two stages of three residual blocks (16 and 32
 * channels) with a max pool and a widening convolution between, and a
 * classifier with dropout. No strategy code anywhere: the
 * engine applies the strategy to it. */
#include <stdio.h>
#include <string.h>

#include <frugal/frugal.h>

/* ---- the model ---- */

typedef struct {
    fr_module *conv1, *bn1, *conv2, *bn2;
} res_block;

/* relu(bn2(conv2(relu(bn1(conv1 x)))) + x) */
static fr_tensor *res_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    res_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv1, x, run);
    y = fr_forward_take(b->bn1, y, run);
    y = fr_forward_take(b->conv2, y, run);
    return fr_norm_add_take(b->bn2, y, x, run);
}

static void res_block_new(fr_module *parent, const char *name, int width) {
    fr_module *blk = fr_block_new(parent, name, res_forward, sizeof(res_block));
    res_block *b = fr_block_state(blk);
    if (!b)
        return;
    b->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = width, .out = width});
    b->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
    b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = width, .out = width});
    b->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = width, .act = FR_ACT_RELU});
}

static fr_model *tinyres_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = in_channels, .out = 16});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
    for (int i = 0; i < 3; i++)
        res_block_new(net, i == 0 ? "a0" : i == 1 ? "a1" : "a2", 16);
    fr_max_pool2d_new(net, "pool", (fr_pool_params){.kernel = 2, .stride = 2});
    fr_conv2d_new(net, "widen", (fr_conv2d_opts){.in = 16, .out = 32});
    fr_norm_new(net, "widen_bn", (fr_norm_opts){.channels = 32, .act = FR_ACT_RELU});
    for (int i = 0; i < 3; i++)
        res_block_new(net, i == 0 ? "b0" : i == 1 ? "b1" : "b2", 32);
    fr_global_avg_pool_new(net, "gap");
    fr_dropout_new(net, "drop", 0.1f);
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 32, .out = num_classes});
    return fr_model_finish(m);
}

/* ---- training ---- */

typedef struct {
    const char *strategy;
    int64_t steps, batch, val;
} options;

static fr_status parse(int argc, char **argv, options *o) {
    *o = (options){.strategy = "plain", .steps = 20, .batch = 32, .val = 1000};
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        if (!strcmp(argv[i], "--strategy") && has_value)
            o->strategy = argv[++i];
        else if (!strcmp(argv[i], "--steps") && has_value)
            FR_TRY(fr_cli_int("--steps", argv[++i], 1, 1000000, &o->steps));
        else if (!strcmp(argv[i], "--batch") && has_value)
            FR_TRY(fr_cli_int("--batch", argv[++i], 1, 4096, &o->batch));
        else if (!strcmp(argv[i], "--val") && has_value)
            FR_TRY(fr_cli_int("--val", argv[++i], 1, 10000, &o->val));
        else
            return fr_cli_bad_flag(argv[0], argv[i], !strcmp(argv[i], "--strategy") ||
                                                         !strcmp(argv[i], "--steps") ||
                                                         !strcmp(argv[i], "--batch") ||
                                                         !strcmp(argv[i], "--val"));
    }
    return FR_OK;
}

static fr_status run(const options *o) {
    FR_TRY(fr_model_register("tinyres", false, tinyres_create, "tinyres (examples/custom_model.c)"));
    fr_data_spec spec;
    FR_TRY(fr_data_spec_parse("fashion-mnist", &spec));
    fr_dataset *train = fr_data_open(&spec, true, 0), *test = fr_data_open(&spec, false, o->val);
    fr_model *m = train && test ? fr_model_create("tinyres", (int)train->c, (int)train->num_classes, 1)
                                : NULL;
    fr_status st = m ? fr_strategy_parse(o->strategy, &m->cfg.strategy) : fr_last_status();
    fr_loader_config lc = {.batch_size = (int)o->batch, .shuffle = true, .drop_last = true, .seed = 1};
    fr_loader *tl = NULL, *vl = NULL;
    if (st == FR_OK) {
        lc.aug = fr_data_augment(spec.kind, train, false);
        tl = fr_loader_new(train, &lc);
        lc.shuffle = lc.drop_last = false;
        vl = tl ? fr_loader_new(test, &lc) : NULL;
        st = vl ? FR_OK : fr_last_status();
    }
    fr_optim *opt = st == FR_OK ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9})
                                : NULL;
    if (st == FR_OK && !opt)
        st = fr_last_status();
    double loss = 0;
    for (int64_t step = 1; st == FR_OK && step <= o->steps; step++) {
        fr_tensor *x, *y;
        if ((st = fr_loader_next(tl, &x, &y)) == FR_OK && !x) /* epoch over: next one */
            st = fr_loader_next(tl, &x, &y);
        if (st == FR_OK && x)
            st = fr_train_step(m, opt, NULL, x, y, 1, &loss, NULL, NULL);
        fr_release(x);
        fr_release(y);
        if (st == FR_OK && (step % 10 == 0 || step == o->steps))
            printf("step %lld  loss %.4f\n", (long long)step, loss);
    }
    size_t saved_peak = fr_mem_peak(FR_CPU, FR_TAG_SAVED);
    double val_loss = 0, acc = 0;
    if (st == FR_OK)
        st = fr_evaluate(m, vl, &val_loss, &acc, NULL);
    if (st == FR_OK) {
        char strategy[64];
        printf("validation (no_grad, %lld images): loss %.4f  accuracy %.2f%%\n", (long long)test->n,
               val_loss, 100 * acc);
        printf("strategy %s: saved peak %zu bytes during training\n",
               fr_strategy_format(m->cfg.strategy, strategy, sizeof strategy), saved_peak);
        fr_mem_report(stdout);
    }
    fr_optim_free(opt);
    fr_loader_free(tl);
    fr_loader_free(vl);
    fr_model_free(m);
    fr_dataset_free(train);
    fr_dataset_free(test);
    return st;
}

int main(int argc, char **argv) {
    if (fr_cli_wants_help(argc, argv)) {
        printf("usage: %s [--strategy S] [--steps N] [--batch B] [--val N]\n"
               "  trains a small residual CNN written with nn/build.h on Fashion-MNIST\n"
               "  (%s), validates it under no_grad and prints the memory ledger.\n"
               "  --strategy  plain (default), or '+'-joined recompute, abn,\n"
               "              checkpoint[:K]\n"
               "  --steps     training steps (default 20)   --batch  batch size (default 32)\n"
               "  --val       test images in the validation pass (default 1000)\n",
               argv[0], FR_FASHION_MNIST_DIR);
        return 0;
    }
    options o;
    fr_status st = parse(argc, argv, &o);
    if (st == FR_OK)
        st = run(&o);
    return fr_cli_exit_status("custom_model", st);
}
