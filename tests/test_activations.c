/* test_activations.c: every activation of FR_ACT_LIST (tensor/shapes.h)
 * as an op (fr_activation) against PyTorch 1.13
 * (tests/fixtures/gen_activations.py: forward and backward, 1e-5
 * relative) and finite differences; what a node keeps (the output or the
 * input, as the activation declares); the inplace forms and their refusal
 * for input-needing activations; the act layer and norm layers with any
 * activation under every function-preserving strategy, bit-identical to
 * plain; abn refused for an activation it cannot invert. The fused BN+act
 * kernels for every activation are in test_bn_act.c. */
#include <stdio.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

/* leaky ReLU's slope and ELU's alpha, as the generator's */
static float param_of(fr_act a) {
    return a == FR_ACT_LEAKY_RELU ? 0.1f : a == FR_ACT_ELU ? 0.5f : 0.0f;
}

static void test_every_activation_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activations");
    for (int a = 0; a < FR_ACT_COUNT; a++) {
        const char *name = fr_act_name((fr_act)a);
        char key[64];
        fr_tensor *x = fr_t_fixture_tensor(f, "x", FR_CPU);
        fr_tensor *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
        if (!x || !dy) {
            CHECK(false);
            break;
        }
        fr_set_requires_grad(x, true);
        fr_tensor *y = fr_activation(x, (fr_act)a, param_of((fr_act)a));
        CHECK_NOTNULL(y);
        if (y) {
            snprintf(key, sizeof key, "%s_y", name);
            fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
            fr_t_allclose_t(y, want, 1e-6, 1e-5, key);
            fr_release(want);
            CHECK_OK(fr_backward_with(y, dy));
            snprintf(key, sizeof key, "%s_dx", name);
            want = fr_t_fixture_tensor(f, key, FR_CPU);
            fr_t_allclose_t(x->grad, want, 1e-6, 1e-5, key);
            fr_release(want);
        }
        fr_release(y);
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

typedef struct {
    fr_tensor *x;
    fr_act act;
} act_case;

static fr_tensor *act_loss(void *ctx) {
    const act_case *c = ctx;
    fr_tensor *y = fr_activation(c->x, c->act, param_of(c->act));
    fr_tensor *l = y ? fr_t_weighted_sum(y, 99) : NULL;
    fr_release(y);
    return l;
}

static void test_every_activation_gradcheck(void) {
    for (int a = 0; a < FR_ACT_COUNT; a++) {
        /* values in [-4, 4], at least 0.05 from the kinks at 0 and +-3 */
        act_case c = {fr_t_rand(FR_CPU, 2, FR_SHAPE(6, 16), 30 + (uint32_t)a), (fr_act)a};
        float *v = fr_data_f32(c.x);
        for (int64_t i = 0; i < fr_numel(c.x); i++) {
            v[i] *= 4.0f;
            for (float k = -3.0f; k <= 3.0f; k += 3.0f)
                if (v[i] - k < 0.05f && v[i] - k > -0.05f)
                    v[i] = k + (v[i] >= k ? 0.05f : -0.05f);
        }
        fr_set_requires_grad(c.x, true);
        fr_tensor *l = act_loss(&c);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            bool ok = fr_t_gradcheck(act_loss, &c, &c.x, 1, 1e-2, 1e-3, 1e-3, 96);
            if (!ok)
                fprintf(stderr, "  gradcheck failed for %s\n", fr_act_name((fr_act)a));
            CHECK(ok);
        }
        fr_release(l);
        fr_release(c.x);
    }
}

/* A node keeps the output, or the input for an input-needing activation;
 * the inplace form runs exactly where the output suffices. */
static void test_saved_tensor_and_inplace(void) {
    for (int a = 0; a < FR_ACT_COUNT; a++) {
        fr_act act = (fr_act)a;
        float p = param_of(act);
        fr_tensor *leaf = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 5), 3);
        fr_set_requires_grad(leaf, true);
        fr_tensor *h = fr_scale(leaf, 1.5f);
        fr_tensor *y = h ? fr_activation(h, act, p) : NULL;
        CHECK_NOTNULL(y);
        if (y) {
            const fr_tensor *kept = fr_act_needs_input(act) ? h : y;
            CHECK(y->grad_fn && y->grad_fn->n_saved == 1 &&
                  y->grad_fn->saved[0].held->storage == kept->storage);
        }
        fr_tensor *r = h ? fr_activation_(h, act, p) : NULL;
        if (fr_act_needs_input(act)) {
            CHECK(r == NULL);
            CHECK_ERR(fr_last_status(), FR_ERR_ARG, "cannot run in place: its gradient needs its input");
        } else {
            CHECK(r == h);
            if (r && y)
                fr_t_allclose_t(r, y, 0, 0, fr_act_name(act)); /* the same bits */
        }
        fr_release(r);
        fr_release(y);
        fr_release(h);
        fr_release(leaf);
        fr_tape_clear();
    }
    /* the convenience forms are the same ops */
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(40), 4);
    fr_tensor *s1 = fr_sigmoid(x), *s2 = fr_activation(x, FR_ACT_SIGMOID, 0);
    fr_tensor *t1 = fr_tanh(x), *t2 = fr_activation(x, FR_ACT_TANH, 0);
    fr_t_allclose_t(s1, s2, 0, 0, "sigmoid");
    fr_t_allclose_t(t1, t2, 0, 0, "tanh");
    fr_tensor *all[] = {s1, s2, t1, t2, x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 5);
    CHECK_ERR(fr_t_status_of(fr_activation(x, FR_ACT_COUNT, 0)), FR_ERR_ARG, "unknown activation");
    CHECK_ERR(fr_t_status_of(fr_activation(x, FR_ACT_ELU, 0)), FR_ERR_ARG,
              "elu: elu alpha must be > 0 (got 0)");
    CHECK_ERR(fr_t_status_of(fr_activation(x, FR_ACT_LEAKY_RELU, -1)), FR_ERR_ARG,
              "slope must be > 0");
    CHECK_ERR(fr_act_backward(x, x, x, (fr_act)99, 0), FR_ERR_ARG, "unknown activation 99");
    CHECK(!strcmp(fr_act_name(FR_ACT_GELU_TANH), "gelu_tanh"));
    fr_release(x);
}

/* ---- the act layer and norm layers with any activation ---- */

static fr_model *act_model(fr_act norm_act, fr_act layer_act) {
    fr_model *m = fr_model_new("acts", 3, 5, 3);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 3, .out = 6});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 6, .act = norm_act});
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = 6, .out = 6});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = 6});
    fr_act_new(net, "act2", (fr_act_opts){.act = layer_act});
    fr_global_avg_pool_new(net, "pool");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 6, .out = 5});
    return fr_model_finish(m);
}

static void test_layers_every_strategy_equals_plain(void) {
    static const fr_act acts[][2] = {{FR_ACT_GELU, FR_ACT_SILU},
                                     {FR_ACT_ELU, FR_ACT_HARDSWISH},
                                     {FR_ACT_SIGMOID, FR_ACT_RELU},
                                     {FR_ACT_LEAKY_RELU, FR_ACT_TANH}};
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 8, 8), 21);
    int32_t lab[4] = {0, 3, 1, 4};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    for (size_t k = 0; k < sizeof acts / sizeof *acts; k++) {
        fr_model *m = act_model(acts[k][0], acts[k][1]);
        CHECK_NOTNULL(m);
        if (!m)
            continue;
        float **init = fr_t_snapshot_save(m);
        /* a chain of layers: no blocks for checkpoint to cut */
        static const char *const exact[] = {"inplace", "recompute", "inplace+recompute"};
        fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
        for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
            fr_t_step r = fr_t_model_step(m, exact[i], init, x, labels);
            fr_t_compare_steps(m, &plain, &r, -1, exact[i]);
            fr_t_step_free(&r, m->params->count);
        }
        fr_t_step_free(&plain, m->params->count);
        /* abn inverts the norm's activation: leaky ReLU can be, the others not */
        CHECK_OK(fr_strategy_parse("abn", &m->cfg.strategy));
        fr_tensor *y = fr_model_forward(m, x, true);
        if (acts[k][0] == FR_ACT_LEAKY_RELU) {
            CHECK_NOTNULL(y);
        } else {
            char want[160];
            snprintf(want, sizeof want,
                     "acts: strategy abn cannot apply: bn1's activation %s cannot be inverted",
                     fr_act_name(acts[k][0]));
            CHECK_ERR(fr_t_status_of(y), FR_ERR_ARG, want);
            y = NULL;
        }
        fr_release(y);
        fr_tape_clear();
        fr_t_snapshot_free(m, init);
        fr_model_free(m);
    }
    /* the fused op itself refuses too */
    fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 2), *b = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 3);
    fr_tensor *h = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 2, 2), 4);
    fr_bn_state s = {.gamma = g, .beta = b, .training = true, .momentum = 0.1f, .eps = 1e-5f};
    CHECK_ERR(fr_t_status_of(fr_bn_act(h, NULL, &s, FR_ACT_TANH, 0, FR_BNACT_INPLACE_ABN)),
              FR_ERR_ARG, "inplace_abn: tanh cannot be inverted exactly in f32");
    /* and a bad activation parameter is a build error naming the layer */
    fr_model *m = fr_model_new("bad", 3, 5, 1);
    CHECK(fr_act_new(fr_model_root(m), "act", (fr_act_opts){.act = FR_ACT_LEAKY_RELU,
                                                            .slope = -1}) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "act: leaky_relu slope must be > 0");
    CHECK(fr_model_finish(m) == NULL);
    fr_release(g);
    fr_release(b);
    fr_release(h);
    fr_release(x);
    fr_release(labels);
}

/* act(BN(x) + r) fused, for an activation that needs its input (split by
 * fr_bn_act into the fused BN + add and the activation), against the
 * plain chain fr_batch_norm, fr_add, fr_activation: the same bits forward
 * and backward. */
static void test_residual_with_input_needing_activation(void) {
    fr_tensor *leaves[2][4];
    fr_tensor *out[2];
    for (int fused = 0; fused < 2; fused++) {
        fr_tensor **t = leaves[fused];
        t[0] = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 4), 7);  /* x */
        t[1] = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 4), 8);  /* residual */
        t[2] = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 9);           /* gamma */
        t[3] = fr_t_rand(FR_CPU, 1, FR_SHAPE(3), 10);          /* beta */
        for (int i = 0; i < 4; i++)
            fr_set_requires_grad(t[i], true);
        fr_tensor *y;
        if (fused) {
            fr_bn_state s = {.gamma = t[2], .beta = t[3], .training = true, .momentum = 0.1f,
                             .eps = 1e-5f};
            y = fr_bn_act(t[0], t[1], &s, FR_ACT_GELU, 0, FR_BNACT_RECOMPUTE);
        } else {
            fr_tensor *b = fr_batch_norm(t[0], t[2], t[3], NULL, NULL, true, 0.1f, 1e-5f);
            fr_tensor *z = b ? fr_add(b, t[1]) : NULL;
            y = z ? fr_activation(z, FR_ACT_GELU, 0) : NULL;
            fr_release(b);
            fr_release(z);
        }
        CHECK_NOTNULL(y);
        fr_tensor *l = y ? fr_t_weighted_sum(y, 3) : NULL;
        CHECK_OK(l ? fr_backward(l) : fr_last_status());
        fr_release(l);
        out[fused] = y;
    }
    if (out[0] && out[1])
        fr_t_allclose_t(out[1], out[0], 0, 0, "forward");
    for (int i = 0; i < 4; i++) {
        if (leaves[0][i]->grad && leaves[1][i]->grad)
            fr_t_allclose_t(leaves[1][i]->grad, leaves[0][i]->grad, 0, 0, "gradient");
        else
            CHECK(false);
        fr_release(leaves[0][i]);
        fr_release(leaves[1][i]);
    }
    fr_release(out[0]);
    fr_release(out[1]);
}

int main(void) {
    RUN(test_every_activation_matches_torch);
    RUN(test_every_activation_gradcheck);
    RUN(test_saved_tensor_and_inplace);
    RUN(test_bad_arguments);
    RUN(test_layers_every_strategy_equals_plain);
    RUN(test_residual_with_input_needing_activation);
    return TEST_SUMMARY();
}
