/* test_strategies.c: the memory mechanisms at op level: fused BN+act with
 * recompute, InPlace-ABN, and segment checkpointing each give the plain
 * composition's outputs and gradients, and keep fewer bytes (exact ledger
 * figures). Model-level equivalence is in test_resnet.c. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "nn/seg_split.h"
#include "models/resnet.h"

#define NB 4
#define C 3
#define HW 5

typedef struct {
    fr_tensor *x, *w, *gamma, *beta, *rmean, *rvar, *residual;
} bn_case;

static void make_case(bn_case *k, bool with_residual) {
    k->x = fr_t_rand(FR_CPU, 4, FR_SHAPE(NB, C, HW, HW), 1);
    k->w = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 3, 3), 2);
    k->gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 3);
    k->beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 4);
    k->rmean = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
    k->rvar = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
    fr_fill_(k->rvar, 1.0f);
    k->residual = with_residual ? fr_t_rand(FR_CPU, 4, FR_SHAPE(NB, C, HW, HW), 5) : NULL;
    fr_set_requires_grad(k->w, true);
    fr_set_requires_grad(k->gamma, true);
    fr_set_requires_grad(k->beta, true);
    if (k->residual)
        fr_set_requires_grad(k->residual, true);
}

static void free_case(bn_case *k) {
    fr_tensor *all[] = {k->x, k->w, k->gamma, k->beta, k->rmean, k->rvar, k->residual};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void zero_grads(bn_case *k) {
    fr_zero_grad(k->w);
    fr_zero_grad(k->gamma);
    fr_zero_grad(k->beta);
    if (k->residual)
        fr_zero_grad(k->residual);
}

/* loss = weighted_sum(conv(act(BN(conv(x)) + residual))), by plain ops
 * (mode < 0) or by fr_bn_act in `mode`. `abn_gamma` replaces gamma by
 * |gamma| + eps in the plain path, matching ABN's parametrisation. */
static fr_tensor *forward(bn_case *k, int mode, fr_act act, size_t *saved_after) {
    fr_conv_params p = {.stride = 1, .pad = 1};
    fr_tensor *c1 = fr_conv2d(k->x, k->w, NULL, p);
    fr_tensor *h;
    if (mode < 0) {
        fr_tensor *g = k->gamma;
        fr_tensor *geff = NULL;
        if (act == FR_ACT_LEAKY_RELU || act == FR_ACT_IDENTITY) {
            /* |gamma| + eps through differentiable ops: gamma * sign + eps */
            float gs[C], sign[C];
            fr_read_f32(k->gamma, gs, C);
            for (int i = 0; i < C; i++)
                sign[i] = gs[i] >= 0 ? 1.0f : -1.0f;
            fr_tensor *s = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_DATA, sign);
            fr_tensor *ag = fr_mul(k->gamma, s);
            fr_tensor *e = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_DATA);
            fr_fill_(e, 1e-5f);
            geff = fr_add(ag, e);
            fr_release(s);
            fr_release(ag);
            fr_release(e);
            g = geff;
        }
        fr_tensor *b = fr_batch_norm(c1, g, k->beta, k->rmean, k->rvar, true, 0.1f, 1e-5f);
        fr_release(geff);
        if (k->residual) {
            fr_tensor *s = fr_add(b, k->residual);
            fr_release(b);
            b = s;
        }
        h = act == FR_ACT_RELU ? fr_relu(b) : act == FR_ACT_LEAKY_RELU ? fr_leaky_relu(b, 0.01f)
                                                                      : fr_retain(b);
        fr_release(b);
    } else {
        fr_bn_state bn = {.gamma = k->gamma, .beta = k->beta, .running_mean = k->rmean,
                          .running_var = k->rvar, .momentum = 0.1f, .eps = 1e-5f, .training = true};
        h = fr_bn_act(c1, k->residual, &bn, act, 0.01f, (fr_bnact_mode)mode);
    }
    fr_release(c1);
    fr_tensor *c2 = h ? fr_conv2d(h, k->w, NULL, p) : NULL;
    fr_release(h);
    if (saved_after)
        *saved_after = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *loss = c2 ? fr_t_weighted_sum(c2, 9) : NULL;
    fr_release(c2);
    return loss;
}

typedef struct {
    float loss;
    float dw[C * C * 9], dgamma[C], dbeta[C], dres[NB * C * HW * HW], rmean[C], rvar[C];
    size_t saved;
} result;

static void run(bn_case *k, int mode, fr_act act, result *r) {
    zero_grads(k);
    fr_fill_(k->rmean, 0.0f);
    fr_fill_(k->rvar, 1.0f);
    fr_tensor *loss = forward(k, mode, act, &r->saved);
    CHECK_NOTNULL(loss);
    if (!loss)
        return;
    r->loss = fr_item(loss);
    CHECK_OK(fr_backward(loss));
    fr_release(loss);
    fr_read_f32(k->w->grad, r->dw, C * C * 9);
    fr_read_f32(k->gamma->grad, r->dgamma, C);
    fr_read_f32(k->beta->grad, r->dbeta, C);
    if (k->residual)
        fr_read_f32(k->residual->grad, r->dres, NB * C * HW * HW);
    fr_read_f32(k->rmean, r->rmean, C);
    fr_read_f32(k->rvar, r->rvar, C);
}

static void test_recompute_equals_plain_bitwise(void) {
    for (int with_res = 0; with_res < 2; with_res++) {
        bn_case k;
        make_case(&k, with_res);
        static result plain, fused;
        run(&k, -1, FR_ACT_RELU, &plain);
        run(&k, FR_BNACT_RECOMPUTE, FR_ACT_RELU, &fused);
        /* same kernels in the same order: bit-identical */
        CHECK(plain.loss == fused.loss);
        CHECK(!memcmp(plain.dw, fused.dw, sizeof plain.dw));
        CHECK(!memcmp(plain.dgamma, fused.dgamma, sizeof plain.dgamma));
        CHECK(!memcmp(plain.dbeta, fused.dbeta, sizeof plain.dbeta));
        CHECK(!memcmp(plain.dres, fused.dres, sizeof plain.dres));
        CHECK(!memcmp(plain.rmean, fused.rmean, sizeof plain.rmean));
        CHECK(!memcmp(plain.rvar, fused.rvar, sizeof plain.rvar));
        /* plain keeps conv1's output (for BN) and the ReLU output (for ReLU
         * and conv2); recompute keeps conv1's output alone (plus, with a
         * residual, the block output that the next block keeps anyway). */
        size_t act = NB * C * HW * HW * sizeof(float);
        size_t stats = 2 * C * sizeof(float); /* mean + invstd */
        CHECK(plain.saved == 2 * act + stats);
        CHECK(fused.saved == (with_res ? 2 * act : act) + stats);
        free_case(&k);
    }
}

static void test_inplace_abn_matches_plain(void) {
    const fr_act acts[2] = {FR_ACT_LEAKY_RELU, FR_ACT_IDENTITY};
    for (int a = 0; a < 2; a++)
        for (int with_res = 0; with_res < 2; with_res++) {
            bn_case k;
            make_case(&k, with_res);
            static result plain, abn;
            run(&k, -1, acts[a], &plain);
            run(&k, FR_BNACT_INPLACE_ABN, acts[a], &abn);
            /* the input is rebuilt by inverting the affine map: equal to
             * float round-off, not bitwise */
            CHECK_CLOSE(abn.loss, plain.loss, 1e-5 * (1 + fabs(plain.loss)));
            for (int i = 0; i < C * C * 9; i++)
                CHECK_CLOSE(abn.dw[i], plain.dw[i], 1e-4 * (1 + fabs(plain.dw[i])));
            for (int i = 0; i < C; i++) {
                CHECK_CLOSE(abn.dgamma[i], plain.dgamma[i], 1e-4 * (1 + fabs(plain.dgamma[i])));
                CHECK_CLOSE(abn.dbeta[i], plain.dbeta[i], 1e-4 * (1 + fabs(plain.dbeta[i])));
                CHECK(abn.rmean[i] == plain.rmean[i]);
                CHECK(abn.rvar[i] == plain.rvar[i]);
            }
            for (int i = 0; with_res && i < NB * C * HW * HW; i++)
                CHECK_CLOSE(abn.dres[i], plain.dres[i], 1e-4 * (1 + fabs(plain.dres[i])));
            /* ABN keeps one activation: its output, written over conv1's */
            size_t act = NB * C * HW * HW * sizeof(float);
            CHECK(abn.saved == act + 2 * C * sizeof(float)); /* + invstd, gamma_eff */
            free_case(&k);
        }
}

static void test_inplace_abn_rejects_relu(void) {
    bn_case k;
    make_case(&k, false);
    fr_tensor *c = fr_scale(k.x, 1.0f);
    fr_bn_state bn = {.gamma = k.gamma, .beta = k.beta, .momentum = 0.1f, .eps = 1e-5f,
                      .training = true};
    CHECK_ERR(fr_t_status_of(fr_bn_act(c, NULL, &bn, FR_ACT_RELU, 0, FR_BNACT_INPLACE_ABN)),
              FR_ERR_ARG, "plain ReLU cannot be inverted");
    fr_release(c);
    fr_tape_clear();
    free_case(&k);
}

static void test_recompute_detects_inplace_misuse(void) {
    bn_case k;
    make_case(&k, false);
    fr_conv_params p = {.stride = 1, .pad = 1};
    fr_bn_state bn = {.gamma = k.gamma, .beta = k.beta, .momentum = 0.1f, .eps = 1e-5f,
                      .training = true};
    fr_tensor *c1 = fr_conv2d(k.x, k.w, NULL, p);
    fr_tensor *h = fr_bn_act(c1, NULL, &bn, FR_ACT_RELU, 0, FR_BNACT_RECOMPUTE);
    fr_tensor *c2 = fr_conv2d(h, k.w, NULL, p);
    /* overwrite what BN kept: its backward (and the recipe) must refuse */
    fr_tensor *bad = fr_scale_(c1, 2.0f);
    fr_tensor *loss = fr_sum(c2);
    CHECK_ERR(fr_backward(loss), FR_ERR_VERSION, "scale_");
    CHECK(fr_tape_size() == 1); /* scale_'s node: the loss does not reach it */
    fr_tape_clear();
    fr_tensor *all[] = {c1, h, c2, bad, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
    free_case(&k);
}

/* ---- checkpointing ---- */

typedef struct {
    bn_case *k;
} segment;

static fr_tensor *segment_fn(void *ctx, fr_tensor *x) {
    bn_case *k = ((segment *)ctx)->k;
    fr_conv_params p = {.stride = 1, .pad = 1};
    fr_tensor *c = fr_conv2d(x, k->w, NULL, p);
    fr_tensor *b = c ? fr_batch_norm(c, k->gamma, k->beta, k->rmean, k->rvar, true, 0.1f, 1e-5f) : NULL;
    fr_release(c);
    fr_tensor *r = b ? fr_relu(b) : NULL;
    fr_release(b);
    fr_tensor *c2 = r ? fr_conv2d(r, k->w, NULL, p) : NULL;
    fr_release(r);
    return c2;
}

static void test_checkpoint_equals_plain_and_keeps_only_inputs(void) {
    bn_case k;
    make_case(&k, false);
    segment seg = {&k};
    static result r[2];
    for (int ck = 0; ck < 2; ck++) {
        zero_grads(&k);
        fr_fill_(k.rmean, 0.0f);
        fr_fill_(k.rvar, 1.0f);
        fr_tensor *h = fr_scale(k.x, 1.0f);
        fr_set_requires_grad(h, false);
        fr_tensor *s1 = ck ? fr_checkpoint(segment_fn, &seg, sizeof seg, h) : segment_fn(&seg, h);
        fr_tensor *s2 = s1 ? (ck ? fr_checkpoint(segment_fn, &seg, sizeof seg, s1) : segment_fn(&seg, s1)) : NULL;
        r[ck].saved = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_tensor *loss = s2 ? fr_t_weighted_sum(s2, 9) : NULL;
        CHECK_NOTNULL(loss);
        r[ck].loss = loss ? fr_item(loss) : 0;
        CHECK_OK(fr_backward(loss));
        fr_read_f32(k.w->grad, r[ck].dw, C * C * 9);
        fr_read_f32(k.gamma->grad, r[ck].dgamma, C);
        fr_read_f32(k.rmean, r[ck].rmean, C);
        fr_read_f32(k.rvar, r[ck].rvar, C);
        fr_release(loss);
        fr_release(s2);
        fr_release(s1);
        fr_release(h);
    }
    CHECK(r[0].loss == r[1].loss);
    CHECK(!memcmp(r[0].dw, r[1].dw, sizeof r[0].dw));
    CHECK(!memcmp(r[0].dgamma, r[1].dgamma, sizeof r[0].dgamma));
    /* BN running statistics moved once per forward, not again in the replay */
    CHECK(!memcmp(r[0].rmean, r[1].rmean, sizeof r[0].rmean));
    CHECK(!memcmp(r[0].rvar, r[1].rvar, sizeof r[0].rvar));
    size_t act = NB * C * HW * HW * sizeof(float);
    /* checkpointed: the two segment inputs (the first is a transient copy of
     * the data); plain: per segment its input, conv out, relu out + stats */
    CHECK(r[1].saved == 2 * act);
    CHECK(r[0].saved == 6 * act + 4 * C * sizeof(float));
    free_case(&k);
}


/* ---- the segment planner ---- */

static void test_plan_balances_bytes(void) {
    /* three stages of 9 blocks whose activations halve per stage (CIFAR
     * ResNet-56), inputs one quarter of a block's cost */
    enum { N = 27 };
    double cost[N], input[N];
    for (int i = 0; i < N; i++) {
        cost[i] = 4.0 * (double)(1 << (2 - i / 9));
        input[i] = cost[i] / 4;
    }
    int len[N], uniform[5] = {6, 6, 6, 6, 3};
    fr_seg_costs pc = {.cost = cost, .input = input, .n = N};
    int n = fr_seg_split(&pc, len);
    int total = 0;
    for (int s = 0; s < n; s++) {
        CHECK(len[s] >= 1);
        total += len[s];
    }
    CHECK(total == N);
    double planned = fr_seg_peak(&pc, len, n);
    double equal = fr_seg_peak(&pc, uniform, 5);
    double none = 0;
    for (int i = 0; i < N; i++)
        none += cost[i];
    /* shorter segments where blocks are big: the planned peak is well below
     * the equal split's and far below keeping everything */
    CHECK(planned < 0.75 * equal);
    CHECK(planned < 0.3 * none);
    /* and no split into equal runs of k blocks does better */
    for (int k = 1; k <= N; k++) {
        int eq[N], m = 0;
        for (int i = 0; i < N; i += k)
            eq[m++] = i + k <= N ? k : N - i;
        CHECK(planned <= fr_seg_peak(&pc, eq, m));
    }
    /* exhaustive check on a small case: no split of 6 blocks beats it */
    double c6[6] = {8, 8, 4, 4, 2, 2}, i6[6] = {2, 2, 1, 1, 0.5, 0.5};
    int l6[6];
    fr_seg_costs p6 = {.cost = c6, .input = i6, .n = 6};
    int n6 = fr_seg_split(&p6, l6);
    double best = fr_seg_peak(&p6, l6, n6);
    for (int mask = 0; mask < 32; mask++) { /* bit b set: a segment ends after block b */
        int l[6], k = 0, run = 0;
        for (int b = 0; b < 6; b++) {
            run++;
            if (b == 5 || (mask >> b & 1)) {
                l[k++] = run;
                run = 0;
            }
        }
        CHECK(best <= fr_seg_peak(&p6, l, k));
    }
    CHECK(fr_seg_split(&(fr_seg_costs){.cost = c6, .input = i6, .n = 0}, l6) == 0);
}

/* ---- whole models: every strategy against plain ---- */

static void check_model_strategies(const char *name, int batch, int size) {
    fr_model *m = fr_resnet_create(name, 3, 10, 7);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(batch, 3, size, size), 11);
    int32_t lab[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);

    /* Same math in the same order: bit-identical to plain. */
    static const char *const exact[] = {"recompute", "checkpoint", "checkpoint:2",
                                        "recompute+checkpoint", "recompute+checkpoint:3"};
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        fr_t_step r = fr_t_model_step(m, exact[i], init, x, labels);
        fr_t_compare_steps(m, &plain, &r, -1, exact[i]);
        CHECK(r.peak_saved <= plain.peak_saved);
        fr_t_step_free(&r, m->params->count);
    }
    /* InPlace-ABN computes its (leaky, |gamma|+eps) function by inverting
     * the output: equal to the reference to float round-off. */
    bool preact = !strncmp(name, "pre", 3);
    if (!preact) {
        fr_t_step ref = fr_t_model_step(m, "abn_reference", init, x, labels);
        static const char *const abn[] = {"abn", "abn+checkpoint", "abn+checkpoint:2"};
        for (size_t i = 0; i < sizeof abn / sizeof *abn; i++) {
            fr_t_step r = fr_t_model_step(m, abn[i], init, x, labels);
            fr_t_compare_steps(m, &ref, &r, 2e-4, abn[i]);
            CHECK(r.peak_saved < ref.peak_saved);
            fr_t_step_free(&r, m->params->count);
        }
        fr_t_step_free(&ref, m->params->count);
    }
    fr_t_step_free(&plain, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* The root chain's last segment runs as it is (nn/segments.c): backward
 * would replay it first, so keeping it reaches the same peak without the
 * second forward. A split into one segment therefore is plain, byte for
 * byte; a real split keeps less and still equals plain bit for bit. */
static void test_last_segment_not_replayed(void) {
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 7);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 16, 16), 5);
    int32_t lab[4] = {3, 1, 4, 1};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    fr_t_step plain = fr_t_model_step(m, "plain", init, x, labels);
    fr_t_step whole = fr_t_model_step(m, "checkpoint:100", init, x, labels);
    fr_t_step split = fr_t_model_step(m, "checkpoint:1", init, x, labels);
    fr_t_compare_steps(m, &plain, &whole, -1, "checkpoint:100");
    fr_t_compare_steps(m, &plain, &split, -1, "checkpoint:1");
    CHECK(whole.peak_saved == plain.peak_saved);
    CHECK(whole.peak_total == plain.peak_total);
    CHECK(split.peak_saved < plain.peak_saved);
    fr_t_step_free(&plain, m->params->count);
    fr_t_step_free(&whole, m->params->count);
    fr_t_step_free(&split, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

static void test_resnet20_every_strategy_equals_plain(void) { check_model_strategies("resnet20", 8, 16); }
static void test_preresnet20_every_strategy_equals_plain(void) {
    check_model_strategies("preresnet20", 4, 8);
}

int main(void) {
    RUN(test_recompute_equals_plain_bitwise);
    RUN(test_inplace_abn_matches_plain);
    RUN(test_inplace_abn_rejects_relu);
    RUN(test_recompute_detects_inplace_misuse);
    RUN(test_checkpoint_equals_plain_and_keeps_only_inputs);
    RUN(test_plan_balances_bytes);
    RUN(test_last_segment_not_replayed);
    RUN(test_resnet20_every_strategy_equals_plain);
    RUN(test_preresnet20_every_strategy_equals_plain);
    return TEST_SUMMARY();
}
