/* test_train_utils.c: the training utilities: iterating named parameters
 * and buffers, freezing a module (no gradient, no update; unfreezing),
 * fr_clip_grad_norm against torch.nn.utils.clip_grad_norm_
 * (tests/fixtures/gen_clip_grad.py, 1e-5 relative), and the no-weight-decay
 * group on norms and biases (the update of each entry against its formula). */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

static fr_model *small_model(void) {
    fr_model *m = fr_model_new("small", 3, 4, 7);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 3, .out = 4});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_module *layer = fr_chain_new(net, "layer1");
    fr_conv2d_new(layer, "0", (fr_conv2d_opts){.in = 4, .out = 4});
    fr_norm_new(layer, "1", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 4, .out = 4});
    return fr_model_finish(m);
}

static void test_named_parameters(void) {
    fr_model *m = small_model();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    const char *want[] = {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.weight",
                          "layer1.1.weight", "layer1.1.bias", "fc.weight", "fc.bias"};
    int n = 0;
    for (fr_param *e = NULL; (e = fr_params_next(m->params, e, FR_PARAMETER)); n++)
        CHECK(n < 8 && !strcmp(e->name, want[n]) && e->tensor->requires_grad);
    CHECK(n == 8);
    int buffers = 0;
    for (fr_param *e = NULL; (e = fr_params_next(m->params, e, FR_BUFFER)); buffers++)
        CHECK(strstr(e->name, "bn1.") == e->name || strstr(e->name, "layer1.1.") == e->name);
    CHECK(buffers == 6); /* running_mean, running_var, num_batches_tracked, twice */
    fr_model_free(m);
}

/* one step; returns the values of every parameter after it, in order */
static void train_step(fr_model *m, fr_optim *opt) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 3);
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, (int32_t[]){1, 3});
    fr_t_train_step(m, opt, x, y);
    fr_release(x);
    fr_release(y);
}

static void test_freeze_module(void) {
    fr_model *m = small_model();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
    CHECK_OK(fr_params_set_trainable(m->params, "layer1", false));
    CHECK_ERR(fr_params_set_trainable(m->params, "layer", false), FR_ERR_ARG, "\"layer\"");
    fr_tensor *frozen = fr_params_get(m->params, "layer1.0.weight");
    fr_tensor *live = fr_params_get(m->params, "conv1.weight");
    CHECK(!frozen->requires_grad && live->requires_grad);
    int64_t nf = fr_numel(frozen), nl = fr_numel(live);
    float *before_f = malloc((size_t)nf * sizeof(float)), *before_l = malloc((size_t)nl * sizeof(float));
    memcpy(before_f, fr_data_f32(frozen), (size_t)nf * sizeof(float));
    memcpy(before_l, fr_data_f32(live), (size_t)nl * sizeof(float));
    train_step(m, opt);
    CHECK(!memcmp(before_f, fr_data_f32(frozen), (size_t)nf * sizeof(float)));
    CHECK(memcmp(before_l, fr_data_f32(live), (size_t)nl * sizeof(float)) != 0);
    CHECK(opt->state[0][fr_params_find(m->params, "layer1.0.weight")] == NULL);
    CHECK_OK(fr_params_set_trainable(m->params, "layer1", true));
    train_step(m, opt);
    CHECK(memcmp(before_f, fr_data_f32(frozen), (size_t)nf * sizeof(float)) != 0);
    free(before_f);
    free(before_l);
    fr_optim_free(opt);
    fr_model_free(m);
}

static void test_clip_grad_norm_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("clip_grad");
    const char *tags[2] = {"clip", "keep"};
    const double max_norm[2] = {0.5, 1000.0};
    const char *names[3] = {"w0", "b0", "w1"};
    for (int c = 0; c < 2; c++) {
        fr_params *p = fr_params_new();
        for (int i = 0; i < 3; i++) {
            fr_tensor *g = fr_t_fixture_case(f, tags[c], names[i]);
            fr_tensor *w = fr_params_new_tensor(p, names[i], FR_PARAMETER, FR_F32, g->ndim, g->shape);
            w->grad = g; /* the registry frees it with w */
        }
        /* a parameter without a gradient is skipped */
        fr_params_new_tensor(p, "unused", FR_PARAMETER, FR_F32, 1, FR_SHAPE(3));
        double total = 0;
        CHECK_OK(fr_clip_grad_norm(p, max_norm[c], &total));
        fr_tensor *want = fr_t_fixture_case(f, tags[c], "total");
        CHECK_CLOSE(total, fr_data_f32(want)[0], 1e-5 * fr_data_f32(want)[0]);
        fr_release(want);
        for (int i = 0; i < 3; i++) {
            char key[32];
            snprintf(key, sizeof key, "%s_clipped", names[i]);
            fr_t_fixture_expect(f, tags[c], key, fr_params_get(p, names[i])->grad, 1e-8, 1e-5);
        }
        CHECK_ERR(fr_clip_grad_norm(p, 0.0, NULL), FR_ERR_ARG, "max_norm 0");
        fr_params_free(p);
    }
    fr_st_close(f);
}

/* SGD with weight decay wd: w' = w - lr * (g + wd * w) for the decayed
 * entries and w - lr * g for the 1-d ones (norm weights and biases). */
static void test_no_decay_on_norms_and_biases(void) {
    fr_model *m = small_model();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    const float lr = 0.1f, wd = 0.05f;
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = lr, .weight_decay = wd});
    int excluded = 0;
    CHECK_OK(fr_optim_exclude_from_decay(opt, NULL, NULL, &excluded));
    CHECK(excluded == 5); /* bn1.weight, bn1.bias, layer1.1.weight, layer1.1.bias, fc.bias */
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 3);
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, (int32_t[]){1, 3});
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, y) : NULL;
    CHECK_NOTNULL(loss);
    if (loss)
        CHECK_OK(fr_backward(loss));
    /* expected values, from the weights and gradients before the step */
    int n = m->params->count;
    float **expect = calloc((size_t)n, sizeof *expect);
    for (fr_param *e = NULL; (e = fr_params_next(m->params, e, FR_PARAMETER));) {
        int i = (int)(e - m->params->items);
        int64_t k = fr_numel(e->tensor);
        expect[i] = malloc((size_t)k * sizeof(float));
        const float *w = fr_data_f32(e->tensor), *g = fr_data_f32(e->tensor->grad);
        float d = e->tensor->ndim <= 1 ? 0.0f : wd;
        for (int64_t j = 0; j < k; j++)
            expect[i][j] = w[j] - lr * (g[j] + d * w[j]);
    }
    CHECK_OK(fr_optim_step(opt));
    for (int i = 0; i < n; i++)
        if (expect[i]) {
            fr_t_allclose(m->params->items[i].tensor, expect[i], (size_t)fr_numel(m->params->items[i].tensor),
                          1e-7, 1e-6, m->params->items[i].name);
            free(expect[i]);
        }
    free(expect);
    fr_optim_zero_grad(opt);
    fr_release(loss);
    fr_release(logits);
    fr_release(x);
    fr_release(y);
    fr_optim_free(opt);
    fr_model_free(m);
}

int main(void) {
    RUN(test_named_parameters);
    RUN(test_freeze_module);
    RUN(test_clip_grad_norm_matches_torch);
    RUN(test_no_decay_on_norms_and_biases);
    return TEST_SUMMARY();
}
