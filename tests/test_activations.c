/* test_activations.c: every activation of FR_ACT_LIST (tensor/shapes.h)
 * as an op (fr_activation) against PyTorch 1.13
 * (tests/fixtures/gen_activations.py: forward and backward, 1e-5
 * relative) and finite differences; what a node keeps (the output or the
 * input, as the activation declares); the inplace forms and their refusal
 * for input-needing activations; the act layer and norm layers with any
 * activation under every function-preserving strategy, bit-identical to
 * plain; abn refused for an activation it cannot invert. The fused BN+act
 * kernels for every activation are in test_bn_act.c.
 *
 * ReLU and leaky ReLU in more depth (tests/fixtures/gen_activation.py):
 * the inplace forms after an op that saves nothing, their version checks
 * (a write to a saved output fails naming both ops), what a node saves,
 * aliasing and large inputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "tensor/activation.h"
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
        static const char *const exact[] = {"recompute"};
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

/* ---- ReLU and leaky ReLU in depth ---- */

#define SHAPE4 FR_SHAPE(4, 3, 5, 5)

/* Values of fixture tensor `name`, compared with `got`. */
static void expect_fixture(fr_st_file *f, const char *name, const fr_tensor *got, double atol,
                           double rtol) {
    fr_tensor *want = fr_t_fixture_tensor(f, name, FR_CPU);
    fr_t_allclose_t(got, want, atol, rtol, name);
    fr_release(want);
}

/* A leaf that requires grad, holding a fixture tensor's values. */
static fr_tensor *fixture_leaf(fr_st_file *f, const char *name) {
    fr_tensor *t = fr_t_fixture_tensor(f, name, FR_CPU);
    if (t)
        fr_set_requires_grad(t, true);
    return t;
}

/* Random values moved at least 0.05 away from 0, where the kink is, so a
 * central difference never straddles it. */
static fr_tensor *rand_off_kink(int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *t = fr_t_rand(FR_CPU, ndim, shape, seed);
    float *x = fr_data_f32(t);
    for (int64_t i = 0; i < fr_numel(t); i++)
        x[i] += x[i] >= 0 ? 0.05f : -0.05f;
    return t;
}

/* ---- against PyTorch ---- */

static void test_relu_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
    fr_tensor *y = x ? fr_relu(x) : NULL;
    CHECK_NOTNULL(y);
    if (y) {
        expect_fixture(f, "relu_y", y, 0, 0); /* exact: max(x, 0) */
        CHECK_OK(fr_backward_with(y, dy));
        expect_fixture(f, "relu_dx", x->grad, 0, 0);
    }
    fr_release(y);
    fr_release(dy);
    fr_release(x);
    fr_st_close(f);
}

static void test_leaky_relu_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    const struct {
        const char *prefix;
        float slope;
    } cases[] = {{"leaky01", 0.1f}, {"leaky001", 0.01f}};
    for (size_t c = 0; c < 2; c++) {
        char name[64];
        fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
        fr_tensor *y = x ? fr_leaky_relu(x, cases[c].slope) : NULL;
        CHECK_NOTNULL(y);
        if (y) {
            /* one float multiplication each, as in PyTorch: 1 ulp */
            snprintf(name, sizeof name, "%s_y", cases[c].prefix);
            expect_fixture(f, name, y, 1e-7, 1e-6);
            CHECK_OK(fr_backward_with(y, dy));
            snprintf(name, sizeof name, "%s_dx", cases[c].prefix);
            expect_fixture(f, name, x->grad, 1e-7, 1e-6);
        }
        fr_release(y);
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* y = 2x; y.relu_() (resp. leaky_relu_); gradient to x from PyTorch. */
static void test_inplace_after_scale_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    for (int leaky = 0; leaky < 2; leaky++) {
        fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
        fr_tensor *y = x ? fr_scale(x, 2.0f) : NULL;
        CHECK_NOTNULL(y);
        if (!y) {
            fr_release(dy);
            fr_release(x);
            continue;
        }
        uint64_t v = y->storage->version;
        fr_tensor *r = leaky ? fr_leaky_relu_(y, 0.1f) : fr_relu_(y);
        CHECK(r == y);
        CHECK(y->storage->version == v + 1);
        CHECK(fr_tape_size() == 2);
        fr_release(r);
        expect_fixture(f, leaky ? "inplace_leaky01_y" : "inplace_relu_y", y, 1e-7, 1e-6);
        CHECK_OK(fr_backward_with(y, dy));
        expect_fixture(f, leaky ? "inplace_leaky01_dx" : "inplace_relu_dx", x->grad, 1e-7, 1e-6);
        fr_release(y);
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *x;
    int kind; /* 0 relu, 1 leaky relu, 2 scale + relu_, 3 scale + leaky_relu_ */
} relu_case;

static fr_tensor *relu_loss(void *ctx) {
    const relu_case *c = ctx;
    fr_tensor *y;
    if (c->kind < 2) {
        y = c->kind == 0 ? fr_relu(c->x) : fr_leaky_relu(c->x, 0.2f);
    } else {
        y = fr_scale(c->x, 2.0f);
        fr_tensor *r = !y ? NULL : c->kind == 2 ? fr_relu_(y) : fr_leaky_relu_(y, 0.2f);
        if (!r)
            fr_clear(&y);
        fr_release(r);
    }
    fr_tensor *l = y ? fr_t_weighted_sum(y, 99) : NULL;
    fr_release(y);
    return l;
}

static void test_relu_gradcheck(void) {
    for (int kind = 0; kind < 4; kind++) {
        relu_case c = {rand_off_kink(4, FR_SHAPE(2, 3, 4, 4), 5 + (uint32_t)kind), kind};
        fr_set_requires_grad(c.x, true);
        fr_tensor *l = relu_loss(&c);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* float32 loss of ~100 terms, eps 1e-2: numeric error ~1e-4 */
            CHECK(fr_t_gradcheck(relu_loss, &c, &c.x, 1, 1e-2, 1e-3, 1e-3, 96));
        }
        fr_release(l);
        fr_release(c.x);
    }
}

/* ---- what backward keeps ---- */

static void test_saves_only_the_output(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 1);
    fr_set_requires_grad(a, true);
    fr_tensor *h = fr_scale(a, 1.0f); /* a transient activation */
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *y = fr_relu(h);
    CHECK_NOTNULL(y);
    if (y) {
        CHECK(y->grad_fn && y->grad_fn->n_saved == 1);
        CHECK(y->grad_fn && y->grad_fn->saved[0].held->storage == y->storage);
        /* only y's bytes moved to "saved"; h stays transient */
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0 + fr_nbytes(y));
    }
    /* inplace: nothing new is allocated at all */
    size_t total0 = fr_mem_total_current(FR_CPU);
    fr_tensor *r = fr_leaky_relu_(h, 0.1f);
    CHECK(r == h);
    CHECK(fr_mem_total_current(FR_CPU) == total0);
    fr_release(r);
    fr_release(y);
    fr_release(h);
    fr_release(a);
    fr_tape_clear();
}

/* ---- inplace and versions ---- */

/* y = relu(a) saves y; an inplace write to y afterwards must make backward
 * fail naming both ops, and leave a's gradient untouched. */
static void test_write_to_saved_output_fails(void) {
    const char *writers[] = {"scale_", "relu_", "leaky_relu_"};
    for (int w = 0; w < 3; w++) {
        fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 2);
        fr_set_requires_grad(a, true);
        fr_tensor *y = fr_relu(a);
        fr_tensor *r = w == 0 ? fr_scale_(y, 2.0f) : w == 1 ? fr_relu_(y) : fr_leaky_relu_(y, 0.1f);
        CHECK_NOTNULL(r);
        fr_release(r);
        fr_tensor *l = fr_t_weighted_sum(y, 3);
        CHECK_NOTNULL(l);
        if (l) {
            char needle[64];
            fr_status st = fr_backward(l);
            CHECK_ERR(st, FR_ERR_VERSION, "backward of relu:");
            snprintf(needle, sizeof needle, "modified inplace by %s", writers[w]);
            CHECK_ERR(st, FR_ERR_VERSION, needle);
        }
        CHECK(a->grad == NULL); /* never a wrong gradient */
        CHECK(fr_tape_size() == 0);
        fr_release(l);
        fr_release(y);
        fr_release(a);
    }
}

/* The same graph without the inplace write runs, with the right gradient:
 * d/da sum(2 relu(a) * r) = 2 r [a > 0]. */
static void test_unchanged_version_succeeds(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 2);
    fr_set_requires_grad(a, true);
    fr_tensor *y = fr_relu(a);
    fr_tensor *z = fr_scale(y, 2.0f); /* out of place: y keeps its version */
    fr_tensor *l = fr_t_weighted_sum(z, 3);
    CHECK_NOTNULL(l);
    if (l) {
        CHECK_OK(fr_backward(l));
        fr_tensor *r = fr_t_rand(FR_CPU, 4, SHAPE4, 3); /* the weights weighted_sum used */
        size_t n = (size_t)fr_numel(a);
        float *want = malloc(n * sizeof *want);
        const float *av = fr_data_f32(a), *rv = fr_data_f32(r);
        for (size_t i = 0; i < n; i++)
            want[i] = av[i] > 0 ? 2.0f * rv[i] : 0.0f;
        fr_t_allclose(a->grad, want, n, 0, 0, "2 r [a > 0]");
        free(want);
        fr_release(r);
    }
    fr_release(l);
    fr_release(z);
    fr_release(y);
    fr_release(a);
}

static void test_inplace_refuses_leaf_that_requires_grad(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 4);
    fr_set_requires_grad(a, true);
    uint64_t v = a->storage->version;
    CHECK_ERR(fr_t_status_of(fr_relu_(a)), FR_ERR_ARG, "relu_: in-place write on a leaf that requires grad");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu_(a, 0.1f)), FR_ERR_ARG,
              "leaky_relu_: in-place write on a leaf that requires grad");
    CHECK(a->storage->version == v); /* refused before writing */
    CHECK(fr_tape_size() == 0);
    /* under no_grad the write is allowed (initialising a parameter) */
    fr_no_grad_enter();
    fr_tensor *r = fr_relu_(a);
    fr_no_grad_exit();
    CHECK(r == a);
    CHECK(a->storage->version == v + 1);
    CHECK(fr_tape_size() == 0);
    fr_release(r);
    fr_release(a);
}

static void test_inplace_without_recording(void) {
    float xs[4] = {-2.0f, -0.5f, 0.0f, 3.0f};
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA, xs);
    uint64_t v = x->storage->version;
    fr_tensor *r = fr_leaky_relu_(x, 0.5f);
    CHECK(r == x);
    CHECK(fr_tape_size() == 0);
    CHECK(x->storage->version == v + 1);
    CHECK(x->storage->last_writer && strcmp(x->storage->last_writer, "leaky_relu_") == 0);
    const float want[4] = {-1.0f, -0.25f, 0.0f, 3.0f};
    fr_t_allclose(x, want, 4, 0, 0, "leaky_relu_ in place");
    fr_release(r);
    r = fr_relu_(x);
    const float want2[4] = {0.0f, 0.0f, 0.0f, 3.0f};
    fr_t_allclose(x, want2, 4, 0, 0, "relu_ in place");
    CHECK(x->storage->version == v + 2);
    fr_release(r);
    fr_release(x);
}

/* ---- tensor-level ops ---- */

static void test_ops_alias_outputs(void) {
    float xs[6] = {-3, -1, 0, 0.5f, 2, -0.25f}, gs[6] = {1, 2, 3, 4, 5, 6};
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA, xs);
    fr_tensor *g = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA, gs);
    CHECK_OK(fr_leaky_relu_forward(x, x, 0.25f)); /* y == x */
    const float y[6] = {-0.75f, -0.25f, 0, 0.5f, 2, -0.0625f};
    fr_t_allclose(x, y, 6, 0, 0, "leaky_relu y == x");
    CHECK_OK(fr_leaky_relu_backward(g, g, x, 0.25f)); /* dx == dy */
    const float dx[6] = {0.25f, 0.5f, 0.75f, 4, 5, 1.5f};
    fr_t_allclose(g, dx, 6, 0, 0, "leaky_relu dx == dy");
    CHECK_OK(fr_relu_forward(x, x));
    CHECK_OK(fr_relu_backward(g, g, x));
    const float dx2[6] = {0, 0, 0, 4, 5, 0};
    fr_t_allclose(g, dx2, 6, 0, 0, "relu dx == dy");
    fr_release(g);
    fr_release(x);
}

/* Past the kernels' OpenMP threshold, against the definition. */
static void test_ops_large(void) {
    const int64_t n = 100000;
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(n), 12), *dy = fr_t_rand(FR_CPU, 1, FR_SHAPE(n), 13);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT), *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    float *want = malloc((size_t)n * sizeof *want), *want_dx = malloc((size_t)n * sizeof *want);
    const float *xv = fr_data_f32(x), *dyv = fr_data_f32(dy);
    for (int64_t i = 0; i < n; i++) {
        want[i] = xv[i] > 0 ? xv[i] : xv[i] * 0.3f;
        want_dx[i] = xv[i] > 0 ? dyv[i] : dyv[i] * 0.3f;
    }
    CHECK_OK(fr_leaky_relu_forward(y, x, 0.3f));
    CHECK_OK(fr_leaky_relu_backward(dx, dy, y, 0.3f));
    fr_t_allclose(y, want, (size_t)n, 0, 0, "large leaky_relu y");
    fr_t_allclose(dx, want_dx, (size_t)n, 0, 0, "large leaky_relu dx");
    free(want_dx);
    free(want);
    fr_release(dx);
    fr_release(y);
    fr_release(dy);
    fr_release(x);
}

/* ---- bad arguments ---- */

static void test_relu_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 6);
    fr_tensor *other = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 3), 6);
    fr_tensor *ints = fr_zeros(FR_CPU, FR_I32, 2, FR_SHAPE(3, 4), FR_TAG_DATA);
    fr_tensor *strided = fr_narrow(x, 1, 1, 2);
    CHECK_ERR(fr_t_status_of(fr_relu(NULL)), FR_ERR_ARG, "relu: x is NULL");
    CHECK_ERR(fr_t_status_of(fr_relu_(NULL)), FR_ERR_ARG, "relu_: x is NULL");
    CHECK_ERR(fr_t_status_of(fr_relu(ints)), FR_ERR_DTYPE, "must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_relu_(strided)), FR_ERR_SHAPE, "not contiguous");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu(x, 0.0f)), FR_ERR_ARG, "slope must be > 0");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu_(x, -0.1f)), FR_ERR_ARG, "slope must be > 0");
    CHECK_ERR(fr_relu_forward(other, x), FR_ERR_SHAPE, "must have the same shape");
    CHECK_ERR(fr_relu_backward(x, x, other), FR_ERR_SHAPE, "dy (3, 4) and y (4, 3)");
    CHECK_ERR(fr_leaky_relu_backward(x, x, x, 0.0f), FR_ERR_ARG, "slope must be > 0");
    CHECK(fr_tape_size() == 0);
    fr_release(strided);
    fr_release(ints);
    fr_release(other);
    fr_release(x);
}

/* fr_act_exp, the host's vectorisable e^x under SiLU and sigmoid: within
 * 1.5 ulp of double exp at a million points over its range, exact at 0,
 * and the edges as documented (0 below -86.5, infinity past ln(FLT_MAX), a
 * NaN kept). */
static void test_exp_accuracy(void) {
    double worst = 0.0;
    float at = 0.0f;
    for (int i = 0; i <= 1000000; i++) {
        float x = -86.5f + 175.2f * (float)i / 1000000.0f;
        double e = exp((double)x);
        float ef = (float)e;
        if (isinf(ef))
            continue;
        double ulp = fabs((double)fr_act_exp(x) - e) / (double)(nextafterf(ef, INFINITY) - ef);
        if (ulp > worst) {
            worst = ulp;
            at = x;
        }
    }
    printf("  fr_act_exp: worst %.3f ulp at x = %.9g\n", worst, (double)at);
    CHECK(worst <= 1.5);
    CHECK(fr_act_exp(0.0f) == 1.0f);
    CHECK(fr_act_exp(-90.0f) == 0.0f && fr_act_exp(-INFINITY) == 0.0f);
    CHECK(isinf(fr_act_exp(88.8f)) && isinf(fr_act_exp(INFINITY)) && isinf(fr_act_exp(1e30f)));
    CHECK(isnan(fr_act_exp(NAN)));
    CHECK(fr_act_fwd_SILU(-100.0f, 0.0f) == 0.0f && fr_act_fwd_SILU(100.0f, 0.0f) == 100.0f);
}

int main(void) {
    RUN(test_every_activation_matches_torch);
    RUN(test_every_activation_gradcheck);
    RUN(test_saved_tensor_and_inplace);
    RUN(test_bad_arguments);
    RUN(test_layers_every_strategy_equals_plain);
    RUN(test_residual_with_input_needing_activation);
    RUN(test_relu_matches_torch);
    RUN(test_leaky_relu_matches_torch);
    RUN(test_inplace_after_scale_matches_torch);
    RUN(test_relu_gradcheck);
    RUN(test_saves_only_the_output);
    RUN(test_write_to_saved_output_fails);
    RUN(test_unchanged_version_succeeds);
    RUN(test_inplace_refuses_leaf_that_requires_grad);
    RUN(test_inplace_without_recording);
    RUN(test_ops_alias_outputs);
    RUN(test_ops_large);
    RUN(test_relu_bad_arguments);
    RUN(test_exp_accuracy);
    return TEST_SUMMARY();
}
