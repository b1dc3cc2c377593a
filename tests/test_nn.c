/* test_nn.c: the parameter registry, layers, initialisation and model
 * construction: names, shapes and counts equal PyTorch's state_dict
 * (tests/fixtures/gen_resnet.py), save/load round trips and load errors. */
#include "testlib.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/layers.h"
#include "nn/build.h"
#include "models/resnet.h"

/* A temporary file name for this process. */
static const char *tmp_path(const char *tag) {
    static char path[128];
    snprintf(path, sizeof path, "/tmp/frugal_test_nn_%ld_%s.safetensors", (long)getpid(), tag);
    return path;
}

static void check_names(const char *model) {
    fr_st_file *f = fr_t_fixture("resnet_arch");
    const char *described = f ? fr_st_metadata(f, model) : NULL;
    fr_model *m = fr_resnet_create(model, 3, 10, 1);
    CHECK_NOTNULL(m);
    CHECK_NOTNULL(described);
    if (m && described)
        fr_t_check_state_dict(m->params, described, model);
    fr_model_free(m);
    fr_st_close(f);
}

static void test_resnet20_state_dict_names(void) { check_names("resnet20"); }
static void test_preresnet164_state_dict_names(void) { check_names("preresnet164"); }

static void test_parameter_counts(void) {
    static const char *const models[] = {"resnet20", "resnet32", "resnet44", "resnet56",
                                         "resnet110", "preresnet164", "preresnet1001"};
    fr_st_file *f = fr_t_fixture("resnet_arch");
    fr_tensor *counts = fr_t_fixture_tensor(f, "counts", FR_CPU);
    for (int i = 0; counts && i < 7; i++) {
        fr_model *m = fr_resnet_create(models[i], 3, 10, 1);
        CHECK_NOTNULL(m);
        int64_t want = ((const int32_t *)fr_data(counts))[i];
        if (m && fr_params_count(m->params) != want) {
            fprintf(stderr, "    %s: %lld parameters, PyTorch %lld\n", models[i],
                    (long long)fr_params_count(m->params), (long long)want);
            fr_t_failed_now = 1;
        }
        fr_model_free(m);
    }
    fr_release(counts);
    fr_st_close(f);
}

static double mean_of(const float *x, int64_t n, double *std) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *std = sqrt(s2 / n - (s / n) * (s / n));
    return s / n;
}

/* Seeded, deterministic, and distributed as layers.h says. */
static void test_init(void) {
    fr_model *a = fr_resnet_create("resnet20", 3, 10, 7), *b = fr_resnet_create("resnet20", 3, 10, 7);
    fr_model *c = fr_resnet_create("resnet20", 3, 10, 8);
    const fr_params *pa = a->params, *pb = b->params, *pc = c->params;
    bool same = true, differs = false;
    for (int i = 0; i < pa->count; i++) {
        same &= !memcmp(fr_data(pa->items[i].tensor), fr_data(pb->items[i].tensor),
                        fr_nbytes(pa->items[i].tensor));
        differs |= !!memcmp(fr_data(pa->items[i].tensor), fr_data(pc->items[i].tensor),
                            fr_nbytes(pa->items[i].tensor));
    }
    CHECK(same);
    CHECK(differs);
    double std;
    /* layer3.1.conv1: 64*64*9 values, kaiming fan_out std sqrt(2/576) */
    fr_tensor *w = fr_params_get(pa, "layer3.1.conv1.weight");
    double mean = mean_of(fr_data_f32(w), fr_numel(w), &std);
    CHECK_CLOSE(mean, 0.0, 0.002);
    CHECK_CLOSE(std / sqrt(2.0 / 576), 1.0, 0.02);
    fr_tensor *fc = fr_params_get(pa, "fc.weight");
    float lo = 1, hi = -1;
    for (int64_t i = 0; i < fr_numel(fc); i++) {
        lo = fminf(lo, fr_data_f32(fc)[i]);
        hi = fmaxf(hi, fr_data_f32(fc)[i]);
    }
    CHECK(lo >= -0.125f && hi <= 0.125f && hi - lo > 0.2f); /* U(-1/sqrt(64), 1/sqrt(64)) */
    CHECK(fr_data_f32(fr_params_get(pa, "layer2.0.bn2.weight"))[5] == 1.0f);
    CHECK(fr_data_f32(fr_params_get(pa, "layer2.0.bn2.bias"))[5] == 0.0f);
    CHECK(fr_data_f32(fr_params_get(pa, "layer2.0.shortcut.1.running_var"))[3] == 1.0f);
    CHECK(fr_params_get(pa, "layer1.0.shortcut.0.weight") == NULL); /* identity shortcut */
    fr_model_free(a);
    fr_model_free(b);
    fr_model_free(c);
}

static void test_save_load_round_trip(void) {
    const char *path = tmp_path("round");
    fr_model *a = fr_resnet_create("resnet20", 3, 10, 1), *b = fr_resnet_create("resnet20", 3, 10, 2);
    *(int32_t *)fr_data(fr_params_get(a->params, "bn1.num_batches_tracked")) = 41;
    CHECK_OK(fr_params_save(a->params, path));
    CHECK_OK(fr_params_load(b->params, path));
    for (int i = 0; i < a->params->count; i++) {
        const fr_tensor *ta = a->params->items[i].tensor, *tb = b->params->items[i].tensor;
        if (memcmp(fr_data(ta), fr_data(tb), fr_nbytes(ta))) {
            fprintf(stderr, "    %s differs after the round trip\n", a->params->items[i].name);
            fr_t_failed_now = 1;
        }
    }
    CHECK(*(int32_t *)fr_data(fr_params_get(b->params, "bn1.num_batches_tracked")) == 41);
    remove(path);
    fr_model_free(a);
    fr_model_free(b);
}

static void test_load_errors(void) {
    const char *path = tmp_path("errors");
    fr_model *a = fr_resnet_create("resnet20", 3, 10, 1);
    CHECK_OK(fr_params_save(a->params, path));

    /* Wrong shape (a 1-channel model): names the file and the tensor, and
     * changes nothing. */
    fr_model *gray = fr_resnet_create("resnet20", 1, 10, 2);
    fr_tensor *fc = fr_params_get(gray->params, "fc.weight");
    float before = fr_data_f32(fc)[0];
    CHECK_ERR(fr_params_load(gray->params, path), FR_ERR_SHAPE, path);
    CHECK(strstr(fr_last_error(), "conv1.weight") && strstr(fr_last_error(), "(16, 3, 3, 3)"));
    CHECK(fr_data_f32(fc)[0] == before);

    /* Missing and unexpected names. */
    fr_params *p = fr_params_new();
    fr_params_new_tensor(p, "conv1.weight", FR_PARAMETER, FR_F32, 4, FR_SHAPE(16, 3, 3, 3));
    fr_params_new_tensor(p, "head.weight", FR_PARAMETER, FR_F32, 2, FR_SHAPE(10, 64));
    CHECK_ERR(fr_params_load(p, path), FR_ERR_FORMAT, path);
    CHECK(strstr(fr_last_error(), "missing from the file: 1 [head.weight]"));
    CHECK(strstr(fr_last_error(), "not in the model): 127 [bn1.bias, "));

    /* Wrong dtype. */
    fr_params *q = fr_params_new();
    fr_params_new_tensor(q, "bn1.num_batches_tracked", FR_BUFFER, FR_F32, 0, NULL);
    CHECK_ERR(fr_params_load(q, path), FR_ERR_DTYPE, "bn1.num_batches_tracked has dtype i32");
    fr_params_free(q);

    /* A missing file. */
    CHECK_ERR(fr_params_load(p, "/nonexistent/model.safetensors"), FR_ERR_IO, "/nonexistent/model");
    fr_params_free(p);
    fr_model_free(gray);
    fr_model_free(a);
    remove(path);
}

static void test_registry(void) {
    fr_params *p = fr_params_new();
    fr_tensor *w = fr_params_new_tensor(p, "w", FR_PARAMETER, FR_F32, 2, FR_SHAPE(2, 3));
    CHECK(w && w->requires_grad && fr_params_get(p, "w") == w && fr_params_find(p, "w") == 0);
    CHECK(fr_params_new_tensor(p, "w", FR_BUFFER, FR_F32, 1, FR_SHAPE(2)) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "twice");
    CHECK(fr_params_new_tensor(p, "i", FR_PARAMETER, FR_I32, 1, FR_SHAPE(2)) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_DTYPE, "parameters are f32");
    fr_tensor *own = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_PARAM);
    CHECK_OK(fr_params_add(p, "own", own, FR_BUFFER));
    fr_release(own); /* the registry keeps it */
    CHECK(fr_params_count(p) == 6 && fr_params_bytes(p) == 10 * sizeof(float));
    w->grad = fr_zeros_like(w, FR_TAG_GRAD);
    fr_params_zero_grad(p);
    CHECK(w->grad == NULL);
    char name[FR_NAME_MAX];
    CHECK(!strcmp(fr_name_join(name, sizeof name, "layer1.0", "conv1"), "layer1.0.conv1"));
    CHECK(!strcmp(fr_name_join(name, sizeof name, NULL, "fc"), "fc"));
    fr_params_free(p);
}

/* A layer's forward equals the op it wraps; BN counts training batches. */
static void test_layers(void) {
    fr_params *p = fr_params_new();
    fr_rng rng;
    fr_rng_seed(&rng, 3);
    fr_conv2d_layer conv;
    fr_batch_norm2d_layer bn;
    CHECK_OK(fr_conv2d_layer_init(&conv, p, "c", 2, 4, 3, 2, 1, true, &rng));
    CHECK_OK(fr_batch_norm2d_layer_init(&bn, p, "bn", 4));
    CHECK(p->count == 7 && fr_params_get(p, "c.bias") == conv.bias);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 5, 5), 1);
    fr_tensor *y = fr_conv2d_layer_forward(&conv, x);
    fr_tensor *ref = fr_conv2d(x, conv.weight, conv.bias, (fr_conv_params){.stride = 2, .pad = 1});
    CHECK(y && y->shape[2] == 3);
    fr_t_allclose_t(y, ref, 0, 0, "conv layer");
    fr_tensor *z = fr_batch_norm2d_layer_forward(&bn, y, true);
    z = fr_chain(z, fr_batch_norm2d_layer_forward(&bn, z, false));
    CHECK_NOTNULL(z);
    CHECK(*(int32_t *)fr_data(bn.num_batches_tracked) == 1);
    fr_release(z);
    fr_release(ref);
    fr_release(y);
    fr_release(x);
    fr_tape_clear();
    fr_params_free(p);
}

/* NULL in, NULL out: the first error survives the chain. */
static void test_chain_keeps_first_error(void) {
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 1);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, 2, 8, 8), 1); /* 2 channels, not 3 */
    fr_tensor *y = fr_model_forward(m, x, true);
    CHECK(y == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_SHAPE, "conv2d");
    fr_error(FR_ERR_IO, "sentinel");
    fr_run run = {.training = true};
    CHECK(fr_forward(fr_module_child(fr_model_root(m), 0), NULL, &run) == NULL);
    CHECK(fr_chain(NULL, fr_conv2d_layer_forward(NULL, NULL)) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_IO, "sentinel");
    fr_tape_clear();
    fr_release(x);
    fr_model_free(m);
}

static void test_names_and_strategies(void) {
    CHECK(fr_resnet_create("resnet21", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "6n + 2");
    CHECK(fr_resnet_create("preresnet21", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "9n + 2");
    CHECK(fr_resnet_create("vgg16", 3, 10, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "unknown model");
    CHECK(fr_resnet_create("resnet20", 0, 10, 1) == NULL);
    fr_strategy s = FR_STRATEGY_PLAIN;
    char buf[64];
    /* inplace saved 0 bytes on every built-in model: folded into recompute,
     * and the old name says so instead of doing nothing */
    CHECK_ERR(fr_strategy_parse("inplace", &s), FR_ERR_ARG, "\"inplace\" was folded into recompute");
    CHECK_ERR(fr_strategy_parse("inplace+recompute+checkpoint", &s), FR_ERR_ARG, "use recompute");
    CHECK_OK(fr_strategy_parse("recompute", &s));
    CHECK(!strcmp(fr_strategy_format(s, buf, sizeof buf), "recompute"));
    CHECK_OK(fr_strategy_parse("abn+checkpoint:4", &s));
    CHECK(s.abn && s.checkpoint == 4 && !s.recompute);
    CHECK(!strcmp(fr_strategy_format(s, buf, sizeof buf), "abn+checkpoint:4"));
    CHECK_OK(fr_strategy_parse("recompute+checkpoint", &s));
    CHECK(s.recompute && s.checkpoint == -1);
    CHECK_OK(fr_strategy_parse("plain", &s));
    CHECK(!strcmp(fr_strategy_format(s, buf, sizeof buf), "plain"));
    CHECK_ERR(fr_strategy_parse("fast", &s), FR_ERR_ARG, "unknown memory strategy \"fast\"");
    CHECK_ERR(fr_strategy_parse("checkpoint:0", &s), FR_ERR_ARG, "checkpoint:0");
    CHECK_ERR(fr_strategy_parse("recompute++abn", &s), FR_ERR_ARG, "unknown memory strategy");
}

int main(void) {
    RUN(test_resnet20_state_dict_names);
    RUN(test_preresnet164_state_dict_names);
    RUN(test_parameter_counts);
    RUN(test_init);
    RUN(test_save_load_round_trip);
    RUN(test_load_errors);
    RUN(test_registry);
    RUN(test_layers);
    RUN(test_chain_keeps_first_error);
    RUN(test_names_and_strategies);
    return TEST_SUMMARY();
}
