/* small_cnn.c: a program of one's own, built against an installed frugal
 * with nothing but pkg-config (tests/install_test.sh):
 *
 *     cc small_cnn.c $(pkg-config --cflags --libs frugal) -o small_cnn
 *     ./small_cnn [DATA_DIR] [WEIGHTS_OUT]
 *
 * It defines a model of its own with a hand-written forward (conv-BN-ReLU,
 * max pool, conv-BN-ReLU, global average pool, linear), trains it for a few SGD steps on the first
 * images of Fashion-MNIST, saves the weights, loads them into a fresh model
 * and evaluates both on the same test images: the accuracies must agree.
 * Exit 0 when training lowered the loss and the reload matched. */
#include <frugal/frugal.h>
#include <stdio.h>
#include <stdlib.h>

/* The forward, written by hand as the model's one root block: the layers
 * are modules created inside it (nn/build.h), so they are named
 * "conv1.weight", ... and the engine applies the memory strategies to them. */
typedef struct {
    fr_module *conv1, *bn1, *pool, *conv2, *bn2, *gap, *fc;
} small_cnn;

static fr_tensor *small_cnn_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    small_cnn *n = fr_block_state(self);
    fr_tensor *h = fr_forward(n->conv1, x, run);
    h = fr_forward_take(n->bn1, h, run);
    h = fr_forward_take(n->pool, h, run);
    h = fr_forward_take(n->conv2, h, run);
    h = fr_forward_take(n->bn2, h, run);
    h = fr_forward_take(n->gap, h, run);
    return fr_forward_take(n->fc, h, run);
}

static fr_model *small_cnn_new(int in_channels, int classes, uint64_t seed) {
    fr_model *m = fr_model_new("small_cnn", in_channels, classes, seed);
    fr_module *blk = fr_block_new(fr_model_root(m), "", small_cnn_forward, sizeof(small_cnn));
    small_cnn *n = blk ? fr_block_state(blk) : NULL;
    if (n) {
        n->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = in_channels, .out = 16});
        n->bn1 = fr_norm_new(blk, "bn1", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
        n->pool = fr_max_pool2d_new(blk, "pool", (fr_pool_params){.kernel = 2, .stride = 2});
        n->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = 16, .out = 32});
        n->bn2 = fr_norm_new(blk, "bn2", (fr_norm_opts){.channels = 32, .act = FR_ACT_RELU});
        n->gap = fr_global_avg_pool_new(blk, "gap");
        n->fc = fr_linear_new(blk, "fc", (fr_linear_opts){.in = 32, .out = classes});
    }
    return fr_model_finish(m);  /* NULL with the first construction error */
}

static int fail(const char *what) {
    fprintf(stderr, "small_cnn: %s: %s\n", what, fr_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : FR_FASHION_MNIST_DIR;
    const char *out = argc > 2 ? argv[2] : "small_cnn.safetensors";
    printf("frugal %s (CUDA backend built: %d)\n", FR_VERSION, FR_CONFIG_CUDA);
    char spec_text[1100];
    snprintf(spec_text, sizeof spec_text, "fashion-mnist:%s", dir);
    fr_data_spec spec;
    if (fr_data_spec_parse(spec_text, &spec) != FR_OK)
        return fail("data");
    fr_dataset *train = fr_data_open(&spec, true, 512), *test = fr_data_open(&spec, false, 256);
    if (!train || !test)
        return fail("data");
    fr_model *m = small_cnn_new((int)train->c, train->num_classes, 7);
    fr_optim *opt = m ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9}) : NULL;
    fr_loader_config lc = {.batch_size = 64, .shuffle = true, .seed = 1,
                           .aug = fr_data_augment(spec.kind, train, false)};
    fr_loader *ld = opt ? fr_loader_new(train, &lc) : NULL;
    if (!ld)
        return fail("setup");
    double first = 0, last = 0;
    for (int step = 0; step < 16;) {
        fr_tensor *x = NULL, *y = NULL;
        double loss;
        if (fr_loader_next(ld, &x, &y) != FR_OK)
            return fail("loader");
        if (!x)
            continue; /* the end of an epoch: the next call starts the next one */
        if (fr_train_step(m, opt, NULL, x, y, 1, &loss, NULL, NULL) != FR_OK)
            return fail("training step");
        fr_release(x);
        fr_release(y);
        if (step++ == 0)
            first = loss;
        last = loss;
    }
    printf("trained 16 steps: loss %.4f -> %.4f\n", first, last);
    if (fr_params_save(m->params, out) != FR_OK)
        return fail("save");

    fr_model *again = small_cnn_new((int)train->c, train->num_classes, 99);
    if (!again || fr_params_load(again->params, out) != FR_OK)
        return fail("load");
    fr_loader_config tc = {.batch_size = 128, .aug = fr_data_augment(spec.kind, test, false)};
    fr_loader *t1 = fr_loader_new(test, &tc), *t2 = fr_loader_new(test, &tc);
    double acc1 = -1, acc2 = -2;
    int64_t n1 = 0, n2 = 0;
    if (!t1 || !t2 || fr_evaluate(m, t1, NULL, &acc1, &n1) != FR_OK ||
        fr_evaluate(again, t2, NULL, &acc2, &n2) != FR_OK)
        return fail("evaluate");
    printf("validated %lld images: accuracy %.2f%% (trained model), %.2f%% (reloaded from %s)\n",
           (long long)n1, 100 * acc1, 100 * acc2, out);
    int ok = last < first && acc1 == acc2 && n1 == n2 && n1 == 256;
    fr_loader_free(t1);
    fr_loader_free(t2);
    fr_loader_free(ld);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_model_free(again);
    fr_dataset_free(train);
    fr_dataset_free(test);
    if (fr_live_tensors() != 0) {
        fprintf(stderr, "small_cnn: %ld tensors still alive\n", fr_live_tensors());
        ok = 0;
    }
    puts(ok ? "small_cnn: ok" : "small_cnn: FAILED");
    return ok ? 0 : 1;
}
