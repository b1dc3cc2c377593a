/* test_graphs.c: several graphs on one tape. A backward consumes only the
 * graph it reaches: two models interleaved give each the gradients it gets
 * alone, under every strategy; the GAN step (discriminator on a detached
 * fake, then the generator through the discriminator with inputs = the
 * generator's parameters) gives what fresh tapes give; the ledger's saved
 * bytes after each backward are exactly what the pending graphs hold; a
 * shared trunk sums both losses' gradients under retain_graph. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "models/densenet.h"
#include "nn/layers.h"
#include "models/resnet.h"

/* ---- two models interleaved ---- */

static fr_tensor *labels_of(int n, int offset) {
    int32_t lab[8];
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)((i * 7 + offset) % 10);
    return fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, lab);
}

static fr_tensor *model_loss(fr_model *m, fr_tensor *x, fr_tensor *labels) {
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    fr_release(logits);
    return loss;
}

typedef struct {
    const char *strategy;
    fr_dtype precision;
} setting;

/* A forward, B forward + backward, A backward: each model's loss, gradients
 * and running statistics equal those of its step alone, bit for bit, and
 * after each backward the ledger holds exactly what the graph still pending
 * saved. Both models run under each setting in turn; for abn settings, A is
 * also compared with abn_reference alone (listed earlier). Frees a and b. */
static void check_interleaved(fr_model *a, fr_model *b, const setting *settings, size_t n_settings) {
    CHECK_NOTNULL(a && b);
    fr_tensor *xa = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 8, 8), 3);
    fr_tensor *xb = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 8, 8), 4);
    fr_tensor *la = labels_of(4, 0), *lb = labels_of(4, 5);
    float **init_a = a ? fr_t_snapshot_save(a) : NULL, **init_b = b ? fr_t_snapshot_save(b) : NULL;
    fr_t_step abn_reference_alone = {0};
    bool any_abn = false;
    for (size_t s = 0; a && b && s < n_settings; s++) {
        const char *name = settings[s].strategy;
        a->cfg.precision = b->cfg.precision = settings[s].precision;
        fr_t_step alone_a = fr_t_model_step(a, name, init_a, xa, la);
        fr_t_step alone_b = fr_t_model_step(b, name, init_b, xb, lb);
        CHECK_OK(fr_strategy_parse(name, &b->cfg.strategy));
        fr_t_snapshot_restore(a, init_a);
        fr_t_snapshot_restore(b, init_b);
        fr_tensor *loss_a = model_loss(a, xa, la);
        size_t saved_a = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        CHECK(saved_a == alone_a.saved_loss);
        fr_tensor *loss_b = model_loss(b, xb, lb);
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved_a + alone_b.saved_loss);
        CHECK_OK(fr_backward(loss_b));
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved_a); /* A's graph, intact */
        fr_t_step mixed_b = fr_t_step_capture(b, loss_b ? fr_item(loss_b) : NAN);
        CHECK_OK(fr_backward(loss_a));
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
        CHECK(fr_tape_size() == 0);
        fr_t_step mixed_a = fr_t_step_capture(a, loss_a ? fr_item(loss_a) : NAN);
        char what[96];
        snprintf(what, sizeof what, "A interleaved, %s %s", name, fr_dtype_name(settings[s].precision));
        fr_t_compare_steps(a, &alone_a, &mixed_a, -1, what);
        snprintf(what, sizeof what, "B interleaved, %s %s", name, fr_dtype_name(settings[s].precision));
        fr_t_compare_steps(b, &alone_b, &mixed_b, -1, what);
        /* abn computes abn_reference's function the memory-saving way (to
         * float round-off: the tolerance of test_strategies.c) */
        if (!strcmp(name, "abn_reference")) {
            abn_reference_alone = alone_a;
            alone_a.values = NULL;
        } else if (a->cfg.strategy.abn && settings[s].precision == FR_F32) {
            any_abn = true;
            CHECK(abn_reference_alone.values != NULL); /* listed before */
            if (abn_reference_alone.values)
                fr_t_compare_steps(a, &abn_reference_alone, &mixed_a, 2e-4, what);
        }
        fr_release(loss_a);
        fr_release(loss_b);
        fr_params_zero_grad(a->params);
        fr_params_zero_grad(b->params);
        if (alone_a.values)
            fr_t_step_free(&alone_a, a->params->count);
        fr_t_step_free(&alone_b, b->params->count);
        fr_t_step_free(&mixed_a, a->params->count);
        fr_t_step_free(&mixed_b, b->params->count);
    }
    CHECK(!any_abn || abn_reference_alone.values != NULL);
    if (abn_reference_alone.values)
        fr_t_step_free(&abn_reference_alone, a->params->count);
    if (a)
        fr_t_snapshot_free(a, init_a);
    if (b)
        fr_t_snapshot_free(b, init_b);
    fr_model_free(a);
    fr_model_free(b);
    fr_tensor *all[] = {xa, xb, la, lb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void test_interleaved_models_equal_alone(void) {
    const setting settings[] = {
        {"plain", FR_F32},           {"checkpoint:2", FR_F32},
        {"recompute", FR_F32},       {"abn_reference", FR_F32},
        {"abn", FR_F32},             {"checkpoint:1", FR_F32},
        {"checkpoint", FR_F32},      {"recompute+checkpoint:2", FR_F32},
        {"abn+checkpoint:3", FR_F32}, {"recompute+checkpoint:2", FR_F32},
        {"recompute+checkpoint:2", FR_BF16}, {"abn", FR_F16},
    };
    check_interleaved(fr_resnet_create("resnet20", 3, 10, 1), fr_resnet_create("resnet20", 3, 10, 2),
                      settings, sizeof settings / sizeof *settings);
}

/* DenseNet's efficient form: concat and BN+ReLU recipes in a pending graph */
static void test_interleaved_densenets_equal_alone(void) {
    const setting settings[] = {
        {"plain", FR_F32}, {"recompute", FR_F32}, {"recompute+checkpoint:2", FR_F32},
        {"recompute", FR_BF16},
    };
    check_interleaved(fr_densenet_create("densenet-bc-40", 8, 3, 10, 1),
                      fr_densenet_create("densenet-bc-40", 8, 3, 10, 2), settings,
                      sizeof settings / sizeof *settings);
}

/* ---- the GAN step ---- */

#define GN 6  /* batch */
#define GZ 5  /* latent size */
#define GH 12 /* hidden width */

typedef struct {
    fr_tensor *g1, *g1b, *g2, *g2b;   /* generator: z -> (GN, 1, 4, 4) */
    fr_tensor *d1, *d2, *d2b;         /* discriminator: conv 3x3 -> leaky -> linear (2 logits) */
    fr_tensor *z, *real, *ones, *zeros;
    bool checkpoint_d;                /* the discriminator as one checkpointed segment */
} gan;

static fr_tensor *param(int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *t = fr_t_rand(FR_CPU, ndim, shape, seed);
    fr_release(fr_scale_(t, 0.5f)); /* returns t, one more reference */
    fr_set_requires_grad(t, true);
    return t;
}

static void gan_new(gan *g, bool checkpoint_d) {
    *g = (gan){.checkpoint_d = checkpoint_d};
    g->g1 = param(2, FR_SHAPE(GH, GZ), 10);
    g->g1b = param(1, FR_SHAPE(GH), 11);
    g->g2 = param(2, FR_SHAPE(16, GH), 12);
    g->g2b = param(1, FR_SHAPE(16), 13);
    g->d1 = param(4, FR_SHAPE(3, 1, 3, 3), 14);
    g->d2 = param(2, FR_SHAPE(2, 48), 15);
    g->d2b = param(1, FR_SHAPE(2), 16);
    g->z = fr_t_rand(FR_CPU, 2, FR_SHAPE(GN, GZ), 17);
    g->real = fr_t_rand(FR_CPU, 4, FR_SHAPE(GN, 1, 4, 4), 18);
    int32_t one[GN], zero[GN];
    for (int i = 0; i < GN; i++) {
        one[i] = 1;
        zero[i] = 0;
    }
    g->ones = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(GN), FR_TAG_DATA, one);
    g->zeros = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(GN), FR_TAG_DATA, zero);
}

static void gan_free(gan *g) {
    fr_tensor *all[] = {g->g1, g->g1b, g->g2, g->g2b, g->d1, g->d2, g->d2b,
                        g->z, g->real, g->ones, g->zeros};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static fr_tensor *generator(gan *g) {
    fr_tensor *h = fr_linear(g->z, g->g1, g->g1b);
    h = h ? fr_chain(h, fr_relu(h)) : NULL;
    h = h ? fr_chain(h, fr_linear(h, g->g2, g->g2b)) : NULL;
    return h ? fr_chain(h, fr_reshape(h, 4, FR_SHAPE(GN, 1, 4, 4))) : NULL;
}

/* ctx holds a pointer to the gan (fr_checkpoint copies the ctx bytes) */
static fr_tensor *discriminator_segment(void *ctx, fr_tensor *x) {
    gan *g = *(gan **)ctx;
    fr_tensor *h = fr_conv2d(x, g->d1, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    h = h ? fr_chain(h, fr_leaky_relu(h, 0.2f)) : NULL;
    h = h ? fr_chain(h, fr_flatten(h)) : NULL;
    return h ? fr_chain(h, fr_linear(h, g->d2, g->d2b)) : NULL;
}

static fr_tensor *d_loss(gan *g, fr_tensor *x, fr_tensor *labels) {
    fr_tensor *logits = g->checkpoint_d ? fr_checkpoint(discriminator_segment, &g, sizeof g, x)
                                        : discriminator_segment(&g, x);
    fr_tensor *l = logits ? fr_cross_entropy(logits, labels) : NULL;
    fr_release(logits);
    return l;
}

/* real labelled 1, fake labelled 0 */
static fr_tensor *discriminator_loss(gan *g, fr_tensor *fake) {
    fr_tensor *lr = d_loss(g, g->real, g->ones), *lf = d_loss(g, fake, g->zeros);
    fr_tensor *l = lr && lf ? fr_add(lr, lf) : NULL;
    fr_release(lr);
    fr_release(lf);
    return l;
}

static void read_grads(fr_tensor *const *ps, int n, float out[][256]) {
    for (int i = 0; i < n; i++) {
        memset(out[i], 0, sizeof out[i]);
        CHECK(ps[i]->grad != NULL);
        if (ps[i]->grad)
            fr_read_f32(ps[i]->grad, out[i], (size_t)fr_numel(ps[i]));
    }
}

static void zero_all(fr_tensor *const *ps, int n) {
    for (int i = 0; i < n; i++)
        fr_zero_grad(ps[i]);
}

static void check_gan_pattern(bool checkpoint_d) {
    gan g;
    gan_new(&g, checkpoint_d);
    fr_tensor *gp[4] = {g.g1, g.g1b, g.g2, g.g2b}, *dp[3] = {g.d1, g.d2, g.d2b};
    float ref_d[3][256], ref_g[4][256], got[4][256];

    /* references, each loss on a fresh tape */
    fr_no_grad_enter();
    fr_tensor *fake0 = generator(&g);
    fr_no_grad_exit();
    fr_tensor *ld = discriminator_loss(&g, fake0);
    CHECK_OK(fr_backward(ld));
    read_grads(dp, 3, ref_d);
    fr_release(ld);
    fr_release(fake0);
    zero_all(dp, 3);
    fr_tensor *fake1 = generator(&g);
    fr_tensor *lg = fake1 ? d_loss(&g, fake1, g.ones) : NULL;
    CHECK_OK(fr_backward(lg));
    read_grads(gp, 4, ref_g);
    fr_release(lg);
    fr_release(fake1);
    zero_all(dp, 3);
    zero_all(gp, 4);
    CHECK(fr_tape_size() == 0 && fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);

    /* the alternating step on one tape */
    fr_tensor *fake = generator(&g);
    int g_nodes = fr_tape_size();
    size_t g_saved = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    CHECK(g_nodes == 4 && g_saved > 0); /* linear, relu, linear, reshape; relu keeps its output */
    fr_tensor *detached = fake ? fr_detach(fake) : NULL;
    ld = detached ? discriminator_loss(&g, detached) : NULL;
    CHECK_OK(fr_backward(ld));
    /* the generator's graph is untouched: its nodes and their saved bytes */
    CHECK(fr_tape_size() == g_nodes);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == g_saved);
    for (int i = 0; i < 4; i++)
        CHECK(gp[i]->grad == NULL);
    read_grads(dp, 3, got);
    CHECK(!memcmp(got, ref_d, sizeof ref_d));
    lg = fake ? d_loss(&g, fake, g.ones) : NULL;
    fr_backward_options only_g = {.n_inputs = 4, .inputs = gp};
    CHECK_OK(fr_backward_with_options(lg, NULL, &only_g));
    CHECK(fr_tape_size() == 0 && fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    read_grads(gp, 4, got);
    CHECK(!memcmp(got, ref_g, sizeof ref_g));
    /* the discriminator's gradients are still those of its own step */
    read_grads(dp, 3, got);
    CHECK(!memcmp(got, ref_d, sizeof ref_d));
    fr_release(ld);
    fr_release(lg);
    fr_release(detached);
    fr_release(fake);
    zero_all(dp, 3);
    zero_all(gp, 4);
    gan_free(&g);
}

static void test_gan_pattern_equals_fresh_tapes(void) { check_gan_pattern(false); }
static void test_gan_pattern_checkpointed_discriminator(void) { check_gan_pattern(true); }

/* ---- the ledger, graph by graph ---- */

/* Three graphs, relu(scale(x)) summed; relu keeps its output (n floats), so
 * graph k holds exactly 4 n_k bytes until its backward. */
static void test_saved_bytes_per_pending_graph(void) {
    const int n[3] = {10, 20, 30};
    fr_tensor *x[3], *loss[3];
    for (int k = 0; k < 3; k++) {
        x[k] = fr_t_rand(FR_CPU, 1, FR_SHAPE(n[k]), 40 + (uint32_t)k);
        fr_set_requires_grad(x[k], true);
        fr_tensor *s = fr_scale(x[k], 2.0f);
        fr_tensor *r = s ? fr_relu(s) : NULL;
        loss[k] = r ? fr_sum(r) : NULL;
        fr_release(s);
        fr_release(r);
    }
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 4 * (10 + 20 + 30));
    CHECK(fr_tape_size() == 9);
    CHECK_OK(fr_backward(loss[1]));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 4 * (10 + 30));
    CHECK(fr_tape_size() == 6);
    CHECK(x[1]->grad && !x[0]->grad && !x[2]->grad);
    CHECK_OK(fr_backward(loss[2]));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 4 * 10);
    /* a graph nobody runs backward on stays until fr_tape_clear */
    fr_tape_clear();
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0 && fr_tape_size() == 0);
    CHECK_ERR(fr_backward(loss[0]), FR_ERR_GRAPH, "made by sum");
    for (int k = 0; k < 3; k++) {
        fr_release(x[k]);
        fr_release(loss[k]);
    }
}

/* ---- a trunk shared by two losses ---- */

typedef struct {
    fr_tensor *x, *w, *h1, *h2;
} trunk_case;

/* h = relu(x w^T); loss_k = weighted_sum(h h_k^T, seed k) */
static void trunk_losses(trunk_case *t, fr_tensor **l1, fr_tensor **l2) {
    fr_tensor *a = fr_linear(t->x, t->w, NULL);
    fr_tensor *h = a ? fr_relu(a) : NULL;
    fr_tensor *y1 = h ? fr_linear(h, t->h1, NULL) : NULL;
    fr_tensor *y2 = h ? fr_linear(h, t->h2, NULL) : NULL;
    *l1 = y1 ? fr_t_weighted_sum(y1, 1) : NULL;
    *l2 = y2 ? fr_t_weighted_sum(y2, 2) : NULL;
    fr_tensor *all[] = {a, h, y1, y2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void test_shared_trunk_sums_both_losses(void) {
    trunk_case t = {.x = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 6), 50),
                    .w = param(2, FR_SHAPE(8, 6), 51),
                    .h1 = param(2, FR_SHAPE(3, 8), 52),
                    .h2 = param(2, FR_SHAPE(5, 8), 53)};
    float g1[48], g2[48], sum[48], got[48];
    fr_tensor *l1, *l2;
    /* each loss alone, on a fresh tape */
    trunk_losses(&t, &l1, &l2);
    CHECK_OK(fr_backward(l1));
    fr_read_f32(t.w->grad, g1, 48);
    fr_tape_clear(); /* l2's head and nothing else */
    fr_release(l1);
    fr_release(l2);
    fr_zero_grad(t.w);
    trunk_losses(&t, &l1, &l2);
    CHECK_OK(fr_backward(l2));
    fr_read_f32(t.w->grad, g2, 48);
    fr_tape_clear();
    fr_release(l1);
    fr_release(l2);
    fr_zero_grad(t.w);
    /* both on one tape: the first keeps the trunk */
    trunk_losses(&t, &l1, &l2);
    size_t saved_all = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    CHECK_OK(fr_backward_with_options(l1, NULL, &(fr_backward_options){.retain_graph = true}));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved_all);
    CHECK_OK(fr_backward(l2));
    fr_read_f32(t.w->grad, got, 48);
    fr_tensor *want = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(48), FR_TAG_DATA, g1);
    fr_tensor *add = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(48), FR_TAG_DATA, g2);
    CHECK_OK(fr_axpy_(want, 1.0f, add)); /* the engine accumulates the same way */
    fr_read_f32(want, sum, 48);
    CHECK(!memcmp(got, sum, sizeof sum));
    /* l1's head was retained, its trunk is gone: a clear error naming it */
    CHECK(fr_tape_size() == 3); /* l1's linear, mul and sum */
    CHECK_ERR(fr_backward(l1), FR_ERR_GRAPH, "comes from relu");
    fr_tape_clear();
    fr_release(want);
    fr_release(add);
    fr_release(l1);
    fr_release(l2);
    fr_zero_grad(t.w);
    fr_zero_grad(t.h1);
    fr_zero_grad(t.h2);
    fr_tensor *all[] = {t.x, t.w, t.h1, t.h2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

/* retain_graph: the same backward twice doubles the gradient; without it
 * the second fails naming the op. */
static void test_retain_graph_and_second_backward(void) {
    fr_tensor *w = param(1, FR_SHAPE(6), 60);
    fr_tensor *r = fr_relu(w);
    fr_tensor *l = r ? fr_t_weighted_sum(r, 3) : NULL;
    float once[6], twice[6];
    CHECK_OK(fr_backward_with_options(l, NULL, &(fr_backward_options){.retain_graph = true}));
    fr_read_f32(w->grad, once, 6);
    size_t saved = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    CHECK(saved == 6 * sizeof(float)); /* relu's output, kept */
    CHECK_OK(fr_backward(l));
    fr_read_f32(w->grad, twice, 6);
    for (int i = 0; i < 6; i++)
        CHECK(twice[i] == once[i] + once[i]);
    CHECK(fr_tape_size() == 0 && fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    CHECK_ERR(fr_backward(l), FR_ERR_GRAPH, "already freed");
    CHECK(strstr(fr_last_error(), "retain_graph") != NULL);
    fr_release(r);
    fr_release(l);
    fr_release(w);
}

/* inputs=: only the listed leaves get gradients, and theirs are the full
 * backward's, bit for bit. Bad lists are refused. */
static void test_inputs_select_leaves(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 70);
    fr_tensor *w1 = param(2, FR_SHAPE(5, 4), 71), *w2 = param(2, FR_SHAPE(2, 5), 72);
    float full[10], only[10];
    for (int pass = 0; pass < 2; pass++) {
        fr_tensor *h = fr_linear(x, w1, NULL);
        fr_tensor *y = h ? fr_linear(h, w2, NULL) : NULL;
        fr_tensor *l = y ? fr_t_weighted_sum(y, 4) : NULL;
        if (pass == 0) {
            CHECK_OK(fr_backward(l));
            fr_read_f32(w2->grad, full, 10);
        } else {
            fr_tensor *const list[1] = {w2};
            fr_tensor *const bad[1] = {h};
            CHECK_ERR(fr_backward_with_options(l, NULL, &(fr_backward_options){.n_inputs = 1, .inputs = bad}),
                      FR_ERR_ARG, "inputs[0] is not a leaf");
            CHECK_OK(fr_backward_with_options(l, NULL, &(fr_backward_options){.n_inputs = 1, .inputs = list}));
            CHECK(w1->grad == NULL);
            fr_read_f32(w2->grad, only, 10);
            CHECK(!memcmp(full, only, sizeof full));
        }
        fr_zero_grad(w1);
        fr_zero_grad(w2);
        fr_release(h);
        fr_release(y);
        fr_release(l);
    }
    fr_release(x);
    fr_release(w1);
    fr_release(w2);
}

/* A tensor detached from a pending graph and then written inplace still
 * trips that graph's version check; another graph is unaffected. */
static void test_detached_write_trips_pending_graph(void) {
    fr_tensor *w = param(1, FR_SHAPE(5), 80), *v = param(1, FR_SHAPE(5), 81);
    fr_tensor *r = fr_relu(w); /* saves its output */
    fr_tensor *la = r ? fr_sum(r) : NULL;
    fr_tensor *rb = fr_relu(v);
    fr_tensor *lb = rb ? fr_sum(rb) : NULL;
    fr_tensor *d = r ? fr_detach(r) : NULL;
    fr_tensor *d2 = d ? fr_scale_(d, 3.0f) : NULL;
    CHECK_NOTNULL(d2);
    CHECK_OK(fr_backward(lb));
    CHECK(v->grad != NULL);
    CHECK_ERR(fr_backward(la), FR_ERR_VERSION, "backward of relu");
    CHECK(strstr(fr_last_error(), "scale_") != NULL);
    CHECK(w->grad == NULL && fr_tape_size() == 0);
    fr_zero_grad(v);
    fr_tensor *all[] = {w, v, r, la, rb, lb, d, d2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

int main(void) {
    RUN(test_interleaved_models_equal_alone);
    RUN(test_interleaved_densenets_equal_alone);
    RUN(test_gan_pattern_equals_fresh_tapes);
    RUN(test_gan_pattern_checkpointed_discriminator);
    RUN(test_saved_bytes_per_pending_graph);
    RUN(test_shared_trunk_sums_both_losses);
    RUN(test_retain_graph_and_second_backward);
    RUN(test_inputs_select_leaves);
    RUN(test_detached_write_trips_pending_graph);
    return TEST_SUMMARY();
}
