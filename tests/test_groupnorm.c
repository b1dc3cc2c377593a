/* test_groupnorm.c: group, layer and instance normalisation fused with an
 * activation: the op against PyTorch 1.13 (tests/fixtures/gen_groupnorm.py,
 * output and the gradients of x, weight and bias, 1e-5 relative), finite
 * differences, the norm layer kinds with PyTorch's parameter names, every
 * function-preserving strategy bit-identical to plain on a model with
 * GroupNorm + SiLU (and less saved under recompute), abn refused, and bad
 * groups refused naming the shape; CUDA against the CPU where there is a
 * GPU. */
#include <stdio.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

typedef struct {
    const char *name;
    int groups;
    fr_act act;
} gn_case;

static const gn_case CASES[] = {
    {"group3_silu", 3, FR_ACT_SILU},        {"group2_gelu", 2, FR_ACT_GELU},
    {"layer_relu", 1, FR_ACT_RELU},         {"instance_identity", 6, FR_ACT_IDENTITY},
    {"flat_tanh", 2, FR_ACT_TANH},
};
#define N_CASES (sizeof CASES / sizeof *CASES)

static fr_tensor *leaf(fr_st_file *f, const char *prefix, const char *name, fr_device dev) {
    fr_tensor *h = fr_t_fixture_case(f, prefix, name);
    fr_tensor *t = dev == FR_CPU ? h : fr_to_device(h, dev, FR_TAG_DATA);
    if (t != h)
        fr_release(h);
    if (t)
        fr_set_requires_grad(t, true);
    return t;
}

static void run_cases(fr_device dev) {
    fr_st_file *f = fr_t_fixture("groupnorm");
    for (size_t i = 0; i < N_CASES; i++) {
        const gn_case *c = &CASES[i];
        fr_tensor *x = leaf(f, c->name, "x", dev), *w = leaf(f, c->name, "w", dev);
        fr_tensor *b = leaf(f, c->name, "b", dev), *dy = leaf(f, c->name, "dy", dev);
        for (int rec = 0; rec < 2; rec++) {
            fr_tensor *y = fr_group_norm_act(x, w, b, c->groups, 1e-5f, c->act, 0.0f, rec == 1);
            CHECK_NOTNULL(y);
            if (!y)
                continue;
            fr_t_fixture_expect(f, c->name, "y", y, 1e-6, 1e-5);
            CHECK_OK(fr_backward_with(y, dy));
            fr_t_fixture_expect(f, c->name, "dx", x->grad, 1e-6, 1e-5);
            fr_t_fixture_expect(f, c->name, "dw", w->grad, 1e-6, 1e-5);
            fr_t_fixture_expect(f, c->name, "db", b->grad, 1e-6, 1e-5);
            fr_zero_grad(x);
            fr_zero_grad(w);
            fr_zero_grad(b);
            fr_release(y);
        }
        fr_release(x);
        fr_release(w);
        fr_release(b);
        fr_release(dy);
    }
    fr_st_close(f);
}

static void test_matches_torch(void) { run_cases(FR_CPU); }

static void test_cuda_matches_torch(void) {
    NEED_CUDA();
    run_cases(FR_CUDA);
}

typedef struct {
    fr_tensor *x, *w, *b;
    int groups;
    fr_act act;
} fd_ctx;

static fr_tensor *fd_loss(void *ctx) {
    fd_ctx *g = ctx;
    fr_tensor *y = fr_group_norm_act(g->x, g->w, g->b, g->groups, 1e-5f, g->act, 0.0f, false);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 17) : NULL;
    fr_release(y);
    return l;
}

static void test_finite_differences(void) {
    static const fr_act acts[] = {FR_ACT_SILU, FR_ACT_SIGMOID, FR_ACT_IDENTITY};
    static const int groups[] = {2, 1, 4};
    for (int k = 0; k < 3; k++) {
        fd_ctx g = {fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 4, 3, 3), 10 + (uint32_t)k),
                    fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 20 + (uint32_t)k),
                    fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 30 + (uint32_t)k), groups[k], acts[k]};
        fr_tensor *wrt[3] = {g.x, g.w, g.b};
        for (int i = 0; i < 3; i++)
            fr_set_requires_grad(wrt[i], true);
        fr_tensor *l = fd_loss(&g);
        CHECK_NOTNULL(l);
        if (l)
            CHECK_OK(fr_backward(l));
        fr_release(l);
        CHECK(fr_t_gradcheck(fd_loss, &g, wrt, 3, 1e-3, 2e-3, 2e-2, 40));
        for (int i = 0; i < 3; i++)
            fr_release(wrt[i]);
    }
}

/* conv, GroupNorm(2) + SiLU, a residual block whose second norm is a layer
 * norm added to its input before GELU, instance norm + hardswish, pool,
 * linear */
typedef struct {
    fr_module *conv1, *n1, *conv2, *n2;
} gn_block;

static fr_tensor *gn_block_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    gn_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv1, x, run);
    y = fr_forward_take(b->n1, y, run);
    y = fr_forward_take(b->conv2, y, run);
    return fr_norm_add_take(b->n2, y, x, run);
}

static fr_model *gn_model(void) {
    fr_model *m = fr_model_new("gnnet", 3, 5, 9);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 3, .out = 8});
    fr_norm_new(net, "gn1", (fr_norm_opts){.channels = 8, .act = FR_ACT_SILU, .kind = FR_NORM_GROUP,
                                          .groups = 2});
    for (int i = 0; i < 2; i++) {
        fr_module *blk = fr_block_new(net, i ? "b1" : "b0", gn_block_forward, sizeof(gn_block));
        gn_block *b = fr_block_state(blk);
        if (!b)
            break;
        b->conv1 = fr_conv2d_new(blk, "conv1", (fr_conv2d_opts){.in = 8, .out = 8});
        b->n1 = fr_norm_new(blk, "n1", (fr_norm_opts){.channels = 8, .act = FR_ACT_SILU,
                                                      .kind = FR_NORM_GROUP, .groups = 4});
        b->conv2 = fr_conv2d_new(blk, "conv2", (fr_conv2d_opts){.in = 8, .out = 8});
        b->n2 = fr_norm_new(blk, "n2", (fr_norm_opts){.channels = 8, .act = FR_ACT_GELU,
                                                      .kind = FR_NORM_LAYER});
    }
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = 8, .out = 8});
    fr_norm_new(net, "in2", (fr_norm_opts){.channels = 8, .act = FR_ACT_HARDSWISH,
                                          .kind = FR_NORM_INSTANCE});
    fr_global_avg_pool_new(net, "pool");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 8, .out = 5});
    return fr_model_finish(m);
}

static void test_layers_names_and_strategies(void) {
    fr_model *m = gn_model();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    /* PyTorch's names: weight and bias, no running statistics */
    CHECK(fr_params_get(m->params, "gn1.weight") && fr_params_get(m->params, "gn1.bias"));
    CHECK(fr_params_get(m->params, "b0.n2.weight") && fr_params_get(m->params, "in2.bias"));
    CHECK(!fr_params_get(m->params, "gn1.running_mean"));
    CHECK(fr_data_f32(fr_params_get(m->params, "gn1.weight"))[3] == 1.0f);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 8, 8), 21);
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, (int32_t[]){0, 3, 1, 4});
    float **init = fr_t_snapshot_save(m);
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    static const char *const exact[] = {"recompute", "checkpoint:1",
                                        "recompute+checkpoint:1", "checkpoint"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        fr_t_step r = fr_t_model_step(m, exact[i], init, x, labels);
        fr_t_compare_steps(m, &plain, &r, -1, exact[i]);
        if (!strcmp(exact[i], "recompute"))
            CHECK(r.peak_saved < plain.peak_saved);
        fr_t_step_free(&r, m->params->count);
    }
    fr_t_step_free(&plain, m->params->count);
    CHECK_OK(fr_strategy_parse("abn", &m->cfg.strategy));
    CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG,
              "gnnet: strategy abn cannot apply: gn1 is a group/layer/instance norm");
    fr_tape_clear();
    fr_t_snapshot_free(m, init);
    fr_model_free(m);
    fr_release(x);
    fr_release(labels);
}

static void test_bad_groups(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 6, 3, 3), 1);
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(6), 2), *b = fr_t_rand(FR_CPU, 1, FR_SHAPE(6), 3);
    CHECK_ERR(fr_t_status_of(fr_group_norm(x, w, b, 4, 1e-5f)), FR_ERR_SHAPE,
              "group_norm: groups 4 does not divide the 6 channels of x (2, 6, 3, 3)");
    CHECK_ERR(fr_t_status_of(fr_group_norm(x, w, b, 0, 1e-5f)), FR_ERR_SHAPE, "groups 0");
    /* negative: named as groups, not as a tensor size (it reached the
     * statistics' allocation first) */
    CHECK_ERR(fr_t_status_of(fr_group_norm(x, w, b, -2, 1e-5f)), FR_ERR_SHAPE,
              "group_norm: groups -2 must be >= 1");
    fr_tensor *w5 = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 2);
    CHECK_ERR(fr_t_status_of(fr_group_norm(x, w5, b, 3, 1e-5f)), FR_ERR_SHAPE, "weight");
    fr_model *m = fr_model_new("bad", 3, 5, 1);
    CHECK(fr_norm_new(fr_model_root(m), "gn", (fr_norm_opts){.channels = 6, .kind = FR_NORM_GROUP,
                                                             .groups = 4}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "groupnorm gn: groups 4 does not divide its 6 channels");
    CHECK(fr_model_finish(m) == NULL);
    m = fr_model_new("bad", 3, 5, 1);
    CHECK(fr_norm_new(fr_model_root(m), "ln", (fr_norm_opts){.channels = 6, .kind = FR_NORM_LAYER,
                                                             .groups = 2}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, ".groups 2 is for FR_NORM_GROUP only");
    CHECK(fr_model_finish(m) == NULL);
    fr_release(x);
    fr_release(w);
    fr_release(w5);
    fr_release(b);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_finite_differences);
    RUN(test_layers_names_and_strategies);
    RUN(test_bad_groups);
    RUN(test_cuda_matches_torch);
    return TEST_SUMMARY();
}
