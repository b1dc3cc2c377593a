/* small_cnn.c: a program of one's own, built against an installed frugal
 * with nothing but pkg-config (tests/install_test.sh):
 *
 *     cc small_cnn.c $(pkg-config --cflags --libs frugal) -o small_cnn
 *     ./small_cnn [DATA_DIR] [WEIGHTS_OUT]
 *
 * It defines a model of its own (conv-BN-ReLU, max pool, conv-BN-ReLU,
 * global average pool, linear), trains it for a few SGD steps on the first
 * images of Fashion-MNIST, saves the weights, loads them into a fresh model
 * and evaluates both on the same test images: the accuracies must agree.
 * Exit 0 when training lowered the loss and the reload matched. */
#include <frugal/frugal.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    fr_conv2d_layer conv1, conv2;
    fr_batch_norm2d_layer bn1, bn2;
    fr_linear_layer fc;
} small_cnn;

static fr_tensor *small_cnn_forward(fr_model *m, fr_tensor *x, bool training) {
    small_cnn *n = m->impl;
    fr_tensor *h = fr_conv2d_layer_forward(&n->conv1, x);
    h = fr_chain(h, fr_batch_norm2d_layer_forward(&n->bn1, h, training));
    h = fr_chain(h, fr_relu(h));
    h = fr_chain(h, fr_max_pool2d(h, (fr_pool_params){.kernel = 2, .stride = 2}));
    h = fr_chain(h, fr_conv2d_layer_forward(&n->conv2, h));
    h = fr_chain(h, fr_batch_norm2d_layer_forward(&n->bn2, h, training));
    h = fr_chain(h, fr_relu(h));
    h = fr_chain(h, fr_global_avg_pool(h));
    return fr_chain(h, fr_linear_layer_forward(&n->fc, h));
}

static fr_model *small_cnn_new(int in_channels, int classes, uint64_t seed) {
    fr_model *m = fr_model_alloc("small_cnn", in_channels, classes);
    small_cnn *n = m ? calloc(1, sizeof *n) : NULL;
    if (!n) {
        fr_model_free(m);
        return NULL;
    }
    m->impl = n;
    m->impl_free = free;
    m->forward = small_cnn_forward;
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    if (fr_conv2d_layer_init(&n->conv1, m->params, "conv1", in_channels, 16, 3, 1, 1, false, &rng) ||
        fr_batch_norm2d_layer_init(&n->bn1, m->params, "bn1", 16) ||
        fr_conv2d_layer_init(&n->conv2, m->params, "conv2", 16, 32, 3, 1, 1, false, &rng) ||
        fr_batch_norm2d_layer_init(&n->bn2, m->params, "bn2", 32) ||
        fr_linear_layer_init(&n->fc, m->params, "fc", 32, classes, true, &rng)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
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
