/* test_densenet.c: DenseNet-BC (models/densenet.h) against PyTorch
 * (tests/fixtures/gen_densenet.py), the memory-efficient mechanism at op
 * level (recomputable concat + BN+ReLU built on its recipe), every strategy
 * against plain, and the ledger's account of what each keeps: linear in depth
 * for the efficient form, quadratic for plain, to the byte.
 *
 * Tolerances: against PyTorch, logits, loss and running statistics
 * |got - want| <= 1e-5 + 1e-4 |want|; gradients per tensor |got - want| <=
 * 1e-4 (max|want| + |want|) (1e-4 relative with a floor scaled to the
 * tensor). Strategies against plain, and the op-level efficient path against
 * the plain composition: bit-identical (same kernels on the same values in
 * the same order). */
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

#include "autograd/checkpoint_log.h"
#include "models/densenet.h"

#define TOL 1e-4

/* ---- names, counts, arguments ---- */

static void test_state_dict_names_and_counts(void) {
    fr_st_file *f = fr_t_fixture("densenet_arch");
    static const char *const described[] = {"densenet-bc-40-k12", "densenet-bc-100-k12"};
    for (int i = 0; f && i < 2; i++) {
        fr_model *m = fr_densenet_create(described[i], 0, 3, 10, 1);
        const char *want = fr_st_metadata(f, described[i]);
        CHECK_NOTNULL(m);
        CHECK_NOTNULL(want);
        if (m && want)
            fr_t_check_state_dict(m->params, want, described[i]);
        fr_model_free(m);
    }
    /* gen_densenet.py's COUNTED; the growth given by argument or by name */
    static const struct {
        const char *name;
        int growth;
    } counted[] = {{"densenet-bc-40", 12}, {"densenet-bc-100", 0}, {"densenet-bc-190-k12", 0},
                   {"densenet-bc-100-k24", 24}};
    fr_tensor *counts = f ? fr_t_fixture_tensor(f, "counts", FR_CPU) : NULL;
    for (int i = 0; counts && i < 4; i++) {
        fr_model *m = fr_densenet_create(counted[i].name, counted[i].growth, 3, 10, 1);
        CHECK_NOTNULL(m);
        int64_t want = ((const int32_t *)fr_data(counts))[i];
        if (m && fr_params_count(m->params) != want) {
            fprintf(stderr, "    %s: %lld parameters, PyTorch %lld\n", counted[i].name,
                    (long long)fr_params_count(m->params), (long long)want);
            fr_t_failed_now = 1;
        }
        fr_model_free(m);
    }
    fr_release(counts);
    fr_st_close(f);
}

static void test_create_and_strategy_errors(void) {
    fr_model *m = fr_densenet_create("densenet-bc-40", 0, 3, 10, 1);
    CHECK(m && !strcmp(m->name, "densenet-bc-40-k12"));
    fr_model_free(m);
    m = fr_densenet_create("densenet-bc-40-k8", 8, 1, 10, 1);
    CHECK(m && !strcmp(m->name, "densenet-bc-40-k8"));
    fr_model_free(m);
    fr_clear_error();
    CHECK(!fr_densenet_create("densenet-100", 0, 3, 10, 1));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "densenet-bc-<6n+4>");
    CHECK(!fr_densenet_create("densenet-bc-100-k", 0, 3, 10, 1));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "unknown model");
    CHECK(!fr_densenet_create("densenet-bc-41", 0, 3, 10, 1));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "6n + 4");
    CHECK(!fr_densenet_create("densenet-bc-40-k12", 24, 3, 10, 1));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "disagrees");
    CHECK(!fr_densenet_create("densenet-bc-40", 0, 0, 10, 1));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "in_channels");

    m = fr_densenet_create("densenet-bc-10", 4, 3, 10, 1);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 1);
    static const char *const rejected[] = {"abn", "abn_reference", "abn+checkpoint"};
    for (int i = 0; m && i < 3; i++) {
        CHECK_OK(fr_strategy_parse(rejected[i], &m->cfg.strategy));
        CHECK_ERR(fr_t_status_of(fr_model_forward(m, x, true)), FR_ERR_ARG, "cannot be overwritten");
    }
    fr_tape_clear();
    fr_release(x);
    fr_model_free(m);
}

/* ---- against PyTorch ---- */

/* Eval (under no_grad) and train forward, loss, backward, under `strategy`,
 * each compared with the fixture. */
static void compare_with_pytorch(fr_model *m, fr_st_file *f, const char *strategy) {
    CHECK_OK(fr_strategy_parse(strategy, &m->cfg.strategy));
    fr_t_step_vs_fixture(m, f, 1e-5, TOL);
    /* everything kept for backward, recipes included, is gone */
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);

    char key[FR_NAME_MAX + 8];
    int grads = 0, stats = 0;
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        snprintf(key, sizeof key, "%s.%s", e->kind == FR_PARAMETER ? "grad" : "after", e->name);
        if (e->kind == FR_BUFFER && e->tensor->dtype == FR_I32)
            CHECK(*(const int32_t *)fr_data(e->tensor) == 1); /* one training batch */
        if (fr_st_find(f, key) < 0)
            continue;
        fr_tensor *r = fr_t_fixture_tensor(f, key, FR_CPU);
        if (e->kind == FR_PARAMETER) {
            fr_t_check_grad(e->tensor->grad, r, TOL, key);
            grads++;
        } else {
            fr_t_allclose_t(e->tensor, r, 1e-5, TOL, key);
            stats++;
        }
        fr_release(r);
    }
    CHECK(grads == 21 && stats == 7); /* gen_densenet.py's GRAD_KEYS, AFTER_KEYS */
    fr_params_zero_grad(m->params);
}

static void test_densenet40_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("densenet40");
    fr_model *m = fr_densenet_create("densenet-bc-40", 12, 3, 10, 0);
    CHECK_NOTNULL(m);
    /* the efficient form too, from the same weights (the load is strict:
     * every name and shape must match) */
    static const char *const strategies[] = {"plain", "recompute"};
    for (int s = 0; f && m && s < 2; s++) {
        CHECK_OK(fr_params_read(m->params, f, "tests/fixtures/densenet40.safetensors", "model."));
        compare_with_pytorch(m, f, strategies[s]);
    }
    fr_model_free(m);
    fr_st_close(f);
}

/* ---- the mechanism at op level ---- */

#define NB 4
#define HW 5

typedef struct {
    fr_tensor *x, *w0, *w1, *w2, *gamma, *beta, *rmean, *rvar;
} op_case;

static void op_case_new(op_case *k) {
    k->x = fr_t_rand(FR_CPU, 4, FR_SHAPE(NB, 2, HW, HW), 1);
    k->w0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 2, 3, 3), 2);  /* x -> f0, 3 channels */
    k->w1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 3, 3), 3);  /* f0 -> f1, 2 channels */
    k->w2 = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 5, 1, 1), 4);  /* relu(bn([f0 f1])) -> out */
    k->gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 5);
    k->beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 6);
    k->rmean = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(5), FR_TAG_PARAM);
    k->rvar = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(5), FR_TAG_PARAM);
    fr_fill_(k->rvar, 1.0f);
    fr_tensor *p[] = {k->w0, k->w1, k->w2, k->gamma, k->beta};
    for (int i = 0; i < 5; i++)
        fr_set_requires_grad(p[i], true);
}

static void op_case_free(op_case *k) {
    fr_tensor *all[] = {k->x, k->w0, k->w1, k->w2, k->gamma, k->beta, k->rmean, k->rvar};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

/* A two-feature dense layer: out = conv1x1(relu(bn(concat(f0, f1)))), by
 * plain ops or the efficient pair. *f1_out (if given) gets f1 to misuse. */
static fr_tensor *op_forward(op_case *k, bool efficient, size_t *saved, fr_tensor **f1_out) {
    fr_conv_params p3 = {.stride = 1, .pad = 1}, p1 = {.stride = 1};
    fr_tensor *f[2];
    f[0] = fr_conv2d(k->x, k->w0, NULL, p3);
    f[1] = fr_conv2d(f[0], k->w1, NULL, p3);
    fr_tensor *h;
    if (efficient) {
        fr_tensor *cat = fr_concat_recomputable(f, 2);
        CHECK(cat && cat->recipe);
        fr_bn_state bn = {.gamma = k->gamma, .beta = k->beta, .running_mean = k->rmean,
                          .running_var = k->rvar, .momentum = 0.1f, .eps = 1e-5f, .training = true};
        h = fr_bn_act(cat, NULL, &bn, FR_ACT_RELU, 0.0f, FR_BNACT_RECOMPUTE_X);
        fr_release(cat);
    } else {
        fr_tensor *cat = fr_concat(f, 2);
        fr_tensor *b = fr_batch_norm(cat, k->gamma, k->beta, k->rmean, k->rvar, true, 0.1f, 1e-5f);
        h = fr_relu(b);
        fr_release(cat);
        fr_release(b);
    }
    fr_tensor *out = fr_conv2d(h, k->w2, NULL, p1);
    fr_release(h);
    *saved = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *loss = fr_t_weighted_sum(out, 9);
    fr_release(out);
    fr_release(f[0]);
    if (f1_out)
        *f1_out = f[1];
    else
        fr_release(f[1]);
    return loss;
}

static void test_recomputable_concat_bn_relu_equals_plain(void) {
    op_case k;
    op_case_new(&k);
    fr_tensor *ps[] = {k.w0, k.w1, k.w2, k.gamma, k.beta};
    float loss[2], *vals[2][7];
    size_t saved[2];
    for (int e = 0; e < 2; e++) {
        fr_fill_(k.rmean, 0.0f);
        fr_fill_(k.rvar, 1.0f);
        fr_tensor *l = op_forward(&k, e, &saved[e], NULL);
        CHECK_NOTNULL(l);
        loss[e] = l ? fr_item(l) : NAN;
        CHECK_OK(fr_backward(l));
        fr_release(l);
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
        for (int i = 0; i < 7; i++) {
            const fr_tensor *t = i < 5 ? ps[i]->grad : i == 5 ? k.rmean : k.rvar;
            vals[e][i] = malloc(fr_nbytes(t));
            memcpy(vals[e][i], fr_data(t), fr_nbytes(t));
            if (i < 5)
                fr_zero_grad(ps[i]);
        }
    }
    CHECK(loss[0] == loss[1]);
    for (int i = 0; i < 7; i++) {
        const fr_tensor *t = i < 5 ? ps[i] : k.rmean;
        CHECK(!memcmp(vals[0][i], vals[1][i], fr_nbytes(t)));
        free(vals[0][i]);
        free(vals[1][i]);
    }
    /* plain keeps f0 (conv w1's input), the concat (BN's input), the ReLU
     * output (conv w2's input) and BN's mean and invstd; efficient keeps the
     * two features, which its recipes reference, and the statistics. */
    size_t plane = NB * HW * HW * sizeof(float), stats = 2 * 5 * sizeof(float);
    CHECK(saved[0] == (3 + 5 + 5) * plane + stats);
    CHECK(saved[1] == (3 + 2) * plane + stats);
    op_case_free(&k);
}

static void test_recomputable_concat_detects_inplace_misuse(void) {
    op_case k;
    op_case_new(&k);
    size_t saved;
    fr_tensor *f1 = NULL;
    fr_tensor *loss = op_forward(&k, true, &saved, &f1);
    /* overwrite a feature the recipes read: the recompute must refuse */
    fr_tensor *bad = f1 ? fr_scale_(f1, 2.0f) : NULL;
    CHECK_NOTNULL(bad);
    CHECK_ERR(fr_backward(loss), FR_ERR_VERSION, "scale_");
    CHECK(strstr(fr_last_error(), "concat recompute") != NULL);
    CHECK(fr_tape_size() == 1); /* scale_'s node: the loss does not reach it */
    fr_tape_clear();
    fr_release(bad);
    fr_release(f1);
    fr_release(loss);
    op_case_free(&k);
}

/* A concatenation's recipe made while another holder still keeps it (the
 * conv's rebuilt input in a dense layer, then BN's backward): the second
 * make takes the first one's tensor instead of copying every feature again
 * (fn_concat.c); with one holder left, each make is a copy of its own. */
static void test_concat_recipe_rebuilds_once_for_two_holders(void) {
    fr_tensor *f[2] = {fr_t_rand(FR_CPU, 4, FR_SHAPE(NB, 3, HW, HW), 1),
                       fr_t_rand(FR_CPU, 4, FR_SHAPE(NB, 2, HW, HW), 2)};
    fr_set_requires_grad(f[0], true);
    fr_set_requires_grad(f[1], true);
    fr_tensor *cat = fr_concat_recomputable(f, 2);
    CHECK(cat && cat->recipe);
    if (!cat || !cat->recipe) {
        fr_release(cat);
        fr_release(f[0]);
        fr_release(f[1]);
        return;
    }
    fr_recipe *r = fr_recipe_retain(cat->recipe); /* two holders: cat and this test */
    fr_tensor *a = r->make(r), *b = r->make(r);
    CHECK(a && a == b);
    CHECK(a && fr_t_same_bits(a, cat));
    fr_release(a);
    fr_release(b);
    fr_recipe_release(r); /* cat alone */
    fr_tensor *c = r->make(r), *d = r->make(r);
    CHECK(c && d && c != d);
    CHECK(c && d && fr_t_same_bits(c, cat) && fr_t_same_bits(d, cat));
    fr_release(c);
    fr_release(d);
    fr_release(cat);
    fr_tape_clear();
    fr_release(f[0]);
    fr_release(f[1]);
}

/* ---- whole models: every strategy against plain, and the ledger ---- */

/* Batch 8, 16x16: every strategy gives plain's loss, gradients and running
 * statistics bit for bit, keeping no more. */
static void test_strategies_equal_plain(void) {
    fr_model *m = fr_densenet_create("densenet-bc-40", 12, 3, 10, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 3, 16, 16), 5);
    int32_t lab[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    static const char *const same[] = {"recompute", "checkpoint", "checkpoint:2",
                                       "recompute+checkpoint", "recompute+checkpoint:4"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        long taken = fr_checkpoint_stats_taken();
        fr_t_step r = fr_t_model_step(m, same[i], init, x, labels);
        fr_t_compare_steps(m, &plain, &r, -1, same[i]);
        /* a checkpoint's replay takes its norms' statistics from the
         * segment's forward (autograd/checkpoint_log.h) */
        taken = fr_checkpoint_stats_taken() - taken;
        CHECK(strstr(same[i], "checkpoint") ? taken > 0 : taken == 0);
        CHECK(r.peak_saved < plain.peak_saved);
        fr_t_step_free(&r, m->params->count);
    }
    fr_t_step_free(&plain, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* What the tape keeps after a training forward of densenet-bc-<depth>-k<k>
 * on (n, 3, hw, hw), derived op by op. Per BN with C channels its batch mean
 * and invstd: 8C bytes. plain: each layer's concat (norm1's input; the first
 * layer's is the block input itself) and ReLU output (conv1's input), the
 * bottleneck's conv1 output (norm2's input) and ReLU output, the same two
 * for each transition and norm5. efficient: every feature once (the recipes
 * reference them) and the conv1 outputs (norm2's fused BN holds its input);
 * concatenations and BN+ReLU outputs are recipes. Both: the pooled features
 * the classifier keeps. Average pooling keeps nothing. */
static size_t expected_saved(int depth, int k, int64_t n, int64_t hw, bool efficient) {
    int64_t per = (depth - 4) / 6, c0 = 2 * k, c_out = 0;
    size_t total = 0;
    for (int b = 0; b < 3; b++, hw /= 2) {
        int64_t plane = n * hw * hw * (int64_t)sizeof(float);
        int64_t sum_in = per * c0 + k * per * (per - 1) / 2; /* channels into the norm1s */
        int64_t mid = 4 * k * per;                           /* channels into the norm2s */
        c_out = c0 + per * k;
        int64_t stats = 8 * (sum_in + mid + c_out);
        if (efficient)
            total += (size_t)((c_out + mid) * plane + stats);
        else
            total += (size_t)(2 * (sum_in + mid + c_out) * plane + stats);
        c0 = c_out / 2;
    }
    return total + (size_t)(n * c_out) * sizeof(float);
}

/* The memory claim, measured by the ledger at depths 40 and 100: exact bytes
 * kept by plain and by the efficient form, plain's share growing with depth
 * (quadratic against linear); backward never raises what is kept. */
static void test_saved_bytes_linear_vs_quadratic(void) {
    const int depths[2] = {40, 100};
    double ratio[2] = {0, 0};
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 6);
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, (int32_t[]){1, 8});
    for (int d = 0; d < 2; d++) {
        char name[32];
        snprintf(name, sizeof name, "densenet-bc-%d", depths[d]);
        fr_model *m = fr_densenet_create(name, 12, 3, 10, 2);
        CHECK_NOTNULL(m);
        if (!m)
            continue;
        fr_t_step p = fr_t_model_step(m, "plain", NULL, x, labels);
        fr_t_step e = fr_t_model_step(m, "recompute", NULL, x, labels);
        size_t want_p = expected_saved(depths[d], 12, 2, 8, false);
        size_t want_e = expected_saved(depths[d], 12, 2, 8, true);
        if (p.saved_forward != want_p || e.saved_forward != want_e) {
            fprintf(stderr, "    %s: saved plain %zu (derived %zu), efficient %zu (derived %zu)\n",
                    name, p.saved_forward, want_p, e.saved_forward, want_e);
            fr_t_failed_now = 1;
        }
        CHECK(p.peak_saved == p.saved_loss && e.peak_saved == e.saved_loss);
        CHECK(e.peak_total < p.peak_total);
        ratio[d] = (double)p.saved_forward / (double)e.saved_forward;
        fr_t_step_free(&p, m->params->count);
        fr_t_step_free(&e, m->params->count);
        fr_model_free(m);
    }
    /* 3.64x at depth 40, 5.65x at depth 100 (batch 2, 8x8) */
    CHECK(ratio[0] > 3.5 && ratio[1] > 5.5);
    fr_release(x);
    fr_release(labels);
}

int main(void) {
    RUN(test_state_dict_names_and_counts);
    RUN(test_create_and_strategy_errors);
    RUN(test_densenet40_matches_pytorch);
    RUN(test_recomputable_concat_bn_relu_equals_plain);
    RUN(test_recomputable_concat_detects_inplace_misuse);
    RUN(test_concat_recipe_rebuilds_once_for_two_holders);
    RUN(test_strategies_equal_plain);
    RUN(test_saved_bytes_linear_vs_quadratic);
    return TEST_SUMMARY();
}
