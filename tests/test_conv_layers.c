/* test_conv_layers.c: the grouped / dilated conv2d, conv_transpose2d,
 * upsample and adaptive average pool layers (nn/build.h) in a model: PyTorch's
 * parameter names and shapes, construction errors naming the layer, and
 * every memory strategy giving the same loss, gradients and running
 * statistics as plain, bit for bit (abn against abn_reference to
 * round-off). */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

/* A small encoder-decoder: depthwise-separable and dilated convolutions
 * down, a transposed convolution and bilinear / nearest upsampling up,
 * adaptive pooling to the classifier. */
static fr_model *model_create(uint64_t seed) {
    fr_model *m = fr_model_new("updown", 3, 5, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = 3, .out = 8});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_conv2d_new(net, "dw", (fr_conv2d_opts){.in = 8, .out = 8, .stride = 2, .groups = 8});
    fr_norm_new(net, "dw_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_conv2d_new(net, "pw", (fr_conv2d_opts){.in = 8, .out = 12, .kernel = 1});
    fr_norm_new(net, "pw_bn", (fr_norm_opts){.channels = 12, .act = FR_ACT_RELU});
    fr_conv2d_new(net, "dil", (fr_conv2d_opts){.in = 12, .out = 12, .dilation = 2, .groups = 3});
    fr_norm_new(net, "dil_bn", (fr_norm_opts){.channels = 12, .act = FR_ACT_LEAKY_RELU});
    fr_conv_transpose2d_new(net, "up", (fr_conv_transpose2d_opts){.in = 12, .out = 8, .kernel = 4,
                                                                  .stride = 2, .pad = 1,
                                                                  .no_bias = true});
    fr_norm_new(net, "up_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_upsample_new(net, "bil", (fr_upsample_opts){.scale = 2, .mode = FR_UPSAMPLE_BILINEAR});
    fr_conv2d_new(net, "mix", (fr_conv2d_opts){.in = 8, .out = 8, .stride = 2});
    fr_norm_new(net, "mix_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_upsample_new(net, "near", (fr_upsample_opts){.scale = 2});
    fr_conv_transpose2d_new(net, "up2", (fr_conv_transpose2d_opts){.in = 8, .out = 6, .kernel = 3,
                                                                   .stride = 2, .pad = 1,
                                                                   .output_pad = 1, .groups = 2});
    fr_norm_new(net, "up2_bn", (fr_norm_opts){.channels = 6, .act = FR_ACT_RELU});
    fr_adaptive_avg_pool2d_new(net, "pool", 2, 3);
    fr_flatten_new(net, "flat");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 36, .out = 5});
    return fr_model_finish(m);
}

static void test_names_and_shapes_follow_pytorch(void) {
    fr_model *m = model_create(1);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    static const struct {
        const char *name;
        int64_t shape[4];
    } want[] = {
        {"dw.weight", {8, 1, 3, 3}},    {"pw.weight", {12, 8, 1, 1}}, {"dil.weight", {12, 4, 3, 3}},
        {"up.weight", {12, 8, 4, 4}},   {"up2.weight", {8, 3, 3, 3}}, {"up2.bias", {6}},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const fr_tensor *t = fr_params_get(m->params, want[i].name);
        CHECK(t != NULL);
        for (int d = 0; t && d < t->ndim; d++)
            CHECK(t->shape[d] == want[i].shape[d]);
    }
    CHECK(fr_params_get(m->params, "up.bias") == NULL);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 12, 12), 3);
    fr_tensor *y = fr_model_forward(m, x, false);
    CHECK_NOTNULL(y);
    if (y)
        CHECK(y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 5);
    fr_release(y);
    fr_tape_clear();
    fr_release(x);
    fr_model_free(m);
}

static void test_construction_errors_name_the_layer(void) {
    fr_model *m = fr_model_new("bad", 3, 2, 1);
    CHECK(fr_conv2d_new(fr_model_root(m), "g", (fr_conv2d_opts){.in = 6, .out = 4, .groups = 4}) ==
          NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "conv2d g: groups 4 must divide in 6 and out 4");
    fr_model_free(fr_model_finish(m));
    m = fr_model_new("bad", 3, 2, 1);
    CHECK(fr_conv_transpose2d_new(fr_model_root(m), "t",
                                  (fr_conv_transpose2d_opts){.in = 4, .out = 4, .kernel = 3,
                                                             .stride = 2, .output_pad = 2}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG,
              "conv_transpose2d t: pad 0 must be >= 0 and output_pad 2 in [0, stride 2)");
    fr_model_free(fr_model_finish(m));
    m = fr_model_new("bad", 3, 2, 1);
    CHECK(fr_conv_transpose2d_new(fr_model_root(m), "t",
                                  (fr_conv_transpose2d_opts){.in = 4, .out = 6, .kernel = 3,
                                                             .groups = 4}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG,
              "conv_transpose2d t: groups 4 must divide the 4 input and 6 output channels");
    fr_model_free(fr_model_finish(m));
    m = fr_model_new("bad", 3, 2, 1);
    CHECK(fr_upsample_new(fr_model_root(m), "u", (fr_upsample_opts){.scale = 0}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "upsample u: scale 0 must be an integer >= 1");
    fr_model_free(fr_model_finish(m));
    m = fr_model_new("bad", 3, 2, 1);
    CHECK(fr_adaptive_avg_pool2d_new(fr_model_root(m), "a", 0, 1) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "adaptive_avg_pool2d a: output size 0x1");
    fr_model_free(fr_model_finish(m));
}

static void test_every_strategy_equals_plain(void) {
    fr_model *m = model_create(3);
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
    fr_t_check_strategies(m, init, x, labels, "plain", exact, (int)(sizeof exact / sizeof *exact),
                          -1, 5);
    static const char *const abn[] = {"abn", "abn+checkpoint:2"};
    fr_t_check_strategies(m, init, x, labels, "abn_reference", abn, (int)(sizeof abn / sizeof *abn),
                          2e-4, 5);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

int main(void) {
    RUN(test_names_and_shapes_follow_pytorch);
    RUN(test_construction_errors_name_the_layer);
    RUN(test_every_strategy_equals_plain);
    return TEST_SUMMARY();
}
