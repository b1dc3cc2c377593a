/* test_train.c: training end to end (programs/cli.h's step and evaluation, the
 * train and validate programs).
 *
 *  - a few steps of ResNet-8 on separable synthetic images lower the loss
 *    and fit the data;
 *  - gradient accumulation: a batch split into 2 (and an uneven 3)
 *    micro-batches gives the gradients and the update of the whole batch,
 *    to float round-off, for a model without BN (a linear classifier);
 *  - the loss scaler through fr_train_step: with a power-of-two scale the
 *    update is bit for bit the unscaled one and the reported loss unscaled;
 *    an inf planted in an image skips the step (parameters and optimizer
 *    state unchanged bit for bit, gradients dropped, scale halved, one skip
 *    counted), for a dynamic (f16) scaler and for the f32 guard;
 *  - fr_train_step's phase hooks fire in order with the micro-batch
 *    indices, and a hook's error stops the step with a message naming it;
 *  - --precision parsing (fr_cli_precision) and the planner's element size
 *    under autocast (2 bytes: same segments, half the estimated bytes);
 *  - f16 / bf16 models (need the half-precision ops): a step follows the f32
 *    step to about 1e-2, and ResNet-8 fits the separable set;
 *  - the built programs (found next to this test's binary: <build>/tests/..
 *    -> <build>/examples/train) train and validate on a tiny IDX data set,
 *    and exit non-zero with a clear message on a missing data directory, a
 *    bad flag value and an unknown flag. Skipped when the programs are not
 *    built (`make tests` alone builds no examples). */
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "train/state.h"
#include "programs/cli_impl.h"
#include "nn/seg_split.h"
#include "models/resnet.h"

static char build_dir[512];

/* ---- synthetic data ---- */

/* Class 0: a bright upper half, class 1: a bright lower half, plus noise. */
static void separable(uint8_t *px, int32_t *labels, int n, int hw) {
    uint32_t s = 99;
    for (int i = 0; i < n; i++) {
        labels[i] = i % 2;
        for (int y = 0; y < hw; y++)
            for (int x = 0; x < hw; x++) {
                s = s * 1664525u + 1013904223u;
                int bright = (y < hw / 2) == (labels[i] == 0);
                px[(i * hw + y) * hw + x] = (uint8_t)((bright ? 150 : 40) + (s >> 26));
            }
    }
}

static void loss_decreases(fr_dtype precision) {
    enum { N = 64, HW = 8 };
    uint8_t px[N * HW * HW];
    int32_t labels[N];
    separable(px, labels, N, HW);
    fr_dataset *ds = fr_dataset_from_host("separable", N, 1, HW, HW, px, labels, 2);
    fr_model *m = fr_resnet_create("resnet8", 1, 2, 3);
    m->cfg.precision = precision;
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, precision));
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9});
    fr_loader_config lc = {.batch_size = 8, .shuffle = true, .drop_last = true, .seed = 1,
                           .aug = {.mean = {0.5f}, .std = {0.25f}}};
    fr_loader *ld = fr_loader_new(ds, &lc);
    CHECK_NOTNULL(ld);
    double first = 0, last = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        CHECK_OK(fr_loader_seek(ld, epoch, 0));
        for (int b = 0; b < N / 8; b++) {
            fr_tensor *x, *y;
            double loss = 0;
            CHECK_OK(fr_loader_next(ld, &x, &y));
            CHECK_OK(fr_train_step(m, opt, &sc, x, y, 1, &loss, NULL, NULL));
            fr_release(x);
            fr_release(y);
            if (epoch == 0 && b < 2)
                first += loss / 2;
            if (epoch == 2 && b >= N / 8 - 2)
                last += loss / 2;
        }
    }
    /* chance is ln 2 = 0.69; a separable set is fitted well within 24 steps */
    CHECK(first > 0.4);
    CHECK(last < 0.5 * first);
    lc.shuffle = false;
    fr_loader *eval = fr_loader_new(ds, &(fr_loader_config){.batch_size = 16, .aug = lc.aug});
    double acc = 0, loss = 0;
    int64_t seen = 0;
    CHECK_OK(fr_evaluate(m, eval, &loss, &acc, &seen));
    CHECK(seen == N && acc >= 0.9);
    /* 24 clean steps: nothing to skip on this data, and far from growing */
    CHECK(sc.skipped == 0);
    CHECK(sc.scale == (precision == FR_F16 ? FR_LOSS_SCALE_INIT : 1.0f));
    fr_loader_free(eval);
    fr_loader_free(ld);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_dataset_free(ds);
}

static void test_loss_decreases(void) { loss_decreases(FR_F32); }
/* These two need the half-precision ops (issue 6). */
static void test_loss_decreases_f16(void) { loss_decreases(FR_F16); }
static void test_loss_decreases_bf16(void) { loss_decreases(FR_BF16); }

/* ---- accumulation ---- */

/* logits = flatten(x) W^T + b: no BN, so micro-batches are independent. */
static fr_model *linear_model(int in, int classes) {
    fr_model *m = fr_model_new("linear", 1, classes, 1);
    fr_flatten_new(fr_model_root(m), "flat");
    fr_linear_new(fr_model_root(m), "fc", (fr_linear_opts){.in = in, .out = classes});
    m = fr_model_finish(m);
    CHECK_NOTNULL(m);
    fr_tensor *w = fr_params_get(m->params, "fc.weight"), *b = fr_params_get(m->params, "fc.bias");
    fr_t_fill_rand(fr_data_f32(w), (size_t)fr_numel(w), 11);
    fr_t_fill_rand(fr_data_f32(b), (size_t)fr_numel(b), 12);
    return m;
}

static void test_accumulation_equals_full_batch(void) {
    enum { B = 8, IN = 12, K = 5 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 21);
    int32_t lab[B] = {0, 4, 2, 1, 3, 3, 0, 2};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    fr_model *m = linear_model(IN, K);
    fr_tensor *w = fr_params_get(m->params, "fc.weight"), *b = fr_params_get(m->params, "fc.bias");
    double loss_full, loss_acc;
    int64_t hits_full, hits_acc;
    CHECK_OK(fr_train_step(m, NULL, NULL, x, y, 1, &loss_full, &hits_full, NULL));
    fr_tensor *dw = fr_retain(w->grad), *db = fr_retain(b->grad);
    fr_params_zero_grad(m->params);
    for (int accum = 2; accum <= 3; accum++) {
        /* 8 = 4 + 4, and 8 = 2 + 3 + 3: each part's loss weighted by its size */
        CHECK_OK(fr_train_step(m, NULL, NULL, x, y, accum, &loss_acc, &hits_acc, NULL));
        CHECK_CLOSE(loss_acc, loss_full, 1e-6);
        CHECK(hits_acc == hits_full);
        CHECK(fr_t_allclose_t(w->grad, dw, 1e-7, 1e-5, "dW accumulated"));
        CHECK(fr_t_allclose_t(b->grad, db, 1e-7, 1e-5, "db accumulated"));
        fr_params_zero_grad(m->params);
    }
    /* and the update: one SGD step from the same weights both ways */
    fr_model *m2 = linear_model(IN, K);
    fr_optim *o1 = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.5, .momentum = 0.9});
    fr_optim *o2 = fr_sgd_new(m2->params, (fr_sgd_options){.lr = 0.5, .momentum = 0.9});
    CHECK_OK(fr_train_step(m, o1, NULL, x, y, 1, NULL, NULL, NULL));
    CHECK_OK(fr_train_step(m2, o2, NULL, x, y, 2, NULL, NULL, NULL));
    CHECK(w->grad == NULL); /* the step zeroes the gradients */
    CHECK(fr_t_allclose_t(fr_params_get(m2->params, "fc.weight"), w, 1e-7, 1e-5, "W after a step"));
    CHECK(fr_t_allclose_t(fr_params_get(m2->params, "fc.bias"), b, 1e-7, 1e-5, "b after a step"));
    /* more micro-batches than images: one image each */
    CHECK_OK(fr_train_step(m2, NULL, NULL, x, y, 100, &loss_acc, NULL, NULL));
    fr_params_zero_grad(m2->params);
    CHECK_ERR(fr_train_step(m2, NULL, NULL, x, y, 0, NULL, NULL, NULL), FR_ERR_ARG, "accum 0");
    fr_optim_free(o1);
    fr_optim_free(o2);
    fr_model_free(m2);
    fr_release(dw);
    fr_release(db);
    fr_model_free(m);
    fr_release(x);
    fr_release(y);
}

/* ---- the loss scaler through fr_train_step ---- */

static bool same_bits(const fr_tensor *a, const fr_tensor *b) {
    return a && b && fr_nbytes(a) == fr_nbytes(b) && !memcmp(fr_data(a), fr_data(b), fr_nbytes(a));
}

/* A copy of every tensor of a registry (values, not references). */
static fr_tensor **copy_params(const fr_params *p) {
    fr_tensor **c = calloc((size_t)p->count, sizeof *c);
    for (int i = 0; i < p->count; i++) {
        c[i] = fr_empty_like(p->items[i].tensor, FR_TAG_WORKSPACE);
        fr_copy_(c[i], p->items[i].tensor);
    }
    return c;
}

static bool params_equal(const fr_params *p, fr_tensor *const *c) {
    for (int i = 0; i < p->count; i++)
        if (!same_bits(p->items[i].tensor, c[i])) {
            fprintf(stderr, "    %s changed\n", p->items[i].name);
            return false;
        }
    return true;
}

static void free_copy(const fr_params *p, fr_tensor **c) {
    for (int i = 0; i < p->count; i++)
        fr_release(c[i]);
    free(c);
}

/* ---- fr_train_step's phase hooks ---- */

typedef struct {
    int n, fail_at; /* calls so far; the call (index) that fails, or -1 */
    int phase[16], micro[16], parts[16];
    bool grads_at[16]; /* fc.weight has a gradient when the hook runs */
    fr_tensor *w;
} hook_log;

static fr_status log_phase(void *ctx, fr_step_phase phase, int micro, int parts) {
    hook_log *h = ctx;
    if (h->n == 16)
        return fr_error(FR_ERR_ARG, "hook log full");
    h->phase[h->n] = (int)phase;
    h->micro[h->n] = micro;
    h->parts[h->n] = parts;
    h->grads_at[h->n] = h->w->grad != NULL;
    return h->n++ == h->fail_at ? fr_error(FR_ERR_ARG, "the test's hook says stop") : FR_OK;
}

/* The hooks fire forward, backward per micro-batch, then optimizer and end,
 * with the micro-batch indices; gradients exist from the second backward
 * on and at the optimizer, not at the end (zeroed). A hook's error stops the
 * step (no later hook, no update, tape cleared) naming phase and
 * micro-batch, and the next step without hooks runs. */
static void test_step_hooks(void) {
    enum { B = 7, IN = 12, K = 5 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 31);
    int32_t lab[B] = {0, 4, 2, 1, 3, 3, 0};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    fr_model *m = linear_model(IN, K);
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.5, .momentum = 0.9});
    hook_log h = {.fail_at = -1, .w = fr_params_get(m->params, "fc.weight")};
    const fr_step_hooks hooks = {.ctx = &h, .phase = log_phase};
    m->step_hooks = &hooks;
    static const int want_phase[] = {FR_STEP_FORWARD, FR_STEP_BACKWARD, FR_STEP_FORWARD, FR_STEP_BACKWARD,
                                     FR_STEP_FORWARD, FR_STEP_BACKWARD, FR_STEP_OPTIMIZER, FR_STEP_END};
    static const int want_micro[] = {0, 0, 1, 1, 2, 2, 3, 3};
    static const bool want_grads[] = {false, false, true, true, true, true, true, false};
    CHECK_OK(fr_train_step(m, opt, NULL, x, y, 3, NULL, NULL, NULL));
    CHECK(h.n == 8);
    for (int i = 0; i < h.n && i < 8; i++) {
        CHECK(h.phase[i] == want_phase[i] && h.micro[i] == want_micro[i] && h.parts[i] == 3);
        CHECK(h.grads_at[i] == want_grads[i]);
    }
    /* one micro-batch: forward, backward, optimizer, end with micro 0, 0, 1, 1 */
    h.n = 0;
    CHECK_OK(fr_train_step(m, opt, NULL, x, y, 1, NULL, NULL, NULL));
    CHECK(h.n == 4 && h.phase[3] == FR_STEP_END && h.micro[1] == 0 && h.micro[3] == 1 && h.parts[3] == 1);
    /* the second micro-batch's backward hook fails */
    fr_tensor *before = fr_empty_like(h.w, FR_TAG_WORKSPACE);
    fr_copy_(before, h.w);
    h.n = 0;
    h.fail_at = 3;
    CHECK_ERR(fr_train_step(m, opt, NULL, x, y, 3, NULL, NULL, NULL), FR_ERR_ARG,
              "train step: the backward hook of micro-batch 1 of 3 failed: the test's hook says stop");
    CHECK(h.n == 4);
    CHECK(fr_tape_size() == 0);
    CHECK(h.w->grad == NULL);
    CHECK(same_bits(h.w, before));
    /* the optimizer hook fails: no update either */
    h.n = 0;
    h.fail_at = 6;
    CHECK_ERR(fr_train_step(m, opt, NULL, x, y, 3, NULL, NULL, NULL), FR_ERR_ARG, "optimizer hook");
    CHECK(h.n == 7 && same_bits(h.w, before));
    m->step_hooks = NULL;
    CHECK_OK(fr_train_step(m, opt, NULL, x, y, 3, NULL, NULL, NULL));
    CHECK(!same_bits(h.w, before));
    fr_release(before);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_release(x);
    fr_release(y);
}

/* With scale 2^16 every gradient is the unscaled one times 2^16 exactly and
 * divides back exactly: the step equals the step without a scaler, bit for
 * bit, and the reported loss is the unscaled loss. */
static void test_scaled_step_equals_unscaled(void) {
    enum { B = 8, IN = 12, K = 5 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 31);
    int32_t lab[B] = {1, 4, 2, 0, 3, 3, 0, 2};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    for (int accum = 1; accum <= 2; accum++) {
        fr_model *a = linear_model(IN, K), *b = linear_model(IN, K);
        fr_optim *oa = fr_sgd_new(a->params, (fr_sgd_options){.lr = 0.3, .momentum = 0.9});
        fr_optim *ob = fr_sgd_new(b->params, (fr_sgd_options){.lr = 0.3, .momentum = 0.9});
        fr_loss_scaler sc;
        CHECK_OK(fr_loss_scaler_init(&sc, FR_F16)); /* dynamic, 2^16, on an f32 model */
        for (int step = 0; step < 2; step++) {
            double la = 0, lb = 0;
            int64_t ca = -1, cb = -2;
            bool stepped = false;
            CHECK_OK(fr_train_step(a, oa, &sc, x, y, accum, &la, &ca, &stepped));
            CHECK_OK(fr_train_step(b, ob, NULL, x, y, accum, &lb, &cb, NULL));
            CHECK(stepped);
            CHECK(la == lb && ca == cb);
            CHECK(la > 0.5 && la < 10); /* unscaled: 2^16 times it would be far above */
        }
        CHECK(same_bits(fr_params_get(a->params, "fc.weight"), fr_params_get(b->params, "fc.weight")));
        CHECK(same_bits(fr_params_get(a->params, "fc.bias"), fr_params_get(b->params, "fc.bias")));
        CHECK(same_bits(oa->state[0][0], ob->state[0][0])); /* momentum */
        CHECK(sc.scale == FR_LOSS_SCALE_INIT && sc.growth_tracker == 2 && sc.skipped == 0);
        CHECK(fr_params_get(a->params, "fc.weight")->grad == NULL);
        fr_optim_free(oa);
        fr_optim_free(ob);
        fr_model_free(a);
        fr_model_free(b);
    }
    fr_release(x);
    fr_release(y);
}

/* An inf in one image makes the loss and the gradients non-finite: the step
 * is skipped and nothing the optimizer owns changes. */
static void skip_case(fr_dtype scaler_dtype, int accum) {
    enum { B = 6, IN = 12, K = 3 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 41);
    int32_t lab[B] = {0, 1, 2, 2, 1, 0};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    fr_model *m = linear_model(IN, K);
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.3, .momentum = 0.9});
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, scaler_dtype));
    float scale0 = sc.scale;
    bool stepped = false;
    /* a clean step first, so there is momentum to keep unchanged */
    CHECK_OK(fr_train_step(m, opt, &sc, x, y, accum, NULL, NULL, &stepped));
    CHECK(stepped && sc.skipped == 0 && sc.scale == scale0);
    fr_tensor **before = copy_params(m->params);
    fr_tensor *momentum = fr_empty_like(opt->state[0][0], FR_TAG_WORKSPACE);
    CHECK_OK(fr_copy_(momentum, opt->state[0][0]));
    int64_t steps_before = opt->steps[0];

    fr_data_f32(x)[B * IN - 1] = INFINITY; /* last image, last pixel */
    double loss = 0;
    stepped = true;
    CHECK_OK(fr_train_step(m, opt, &sc, x, y, accum, &loss, NULL, &stepped));
    CHECK(!stepped);
    CHECK(!isfinite(loss));
    CHECK(params_equal(m->params, before));
    CHECK(same_bits(opt->state[0][0], momentum) && opt->steps[0] == steps_before);
    CHECK(fr_params_get(m->params, "fc.weight")->grad == NULL); /* dropped, not kept for later */
    CHECK(sc.skipped == 1 && sc.growth_tracker == 0);
    /* f16 backs off by half; the f32 guard keeps its fixed scale of 1 */
    CHECK(sc.scale == (scaler_dtype == FR_F16 ? 0.5f * scale0 : 1.0f));

    /* the next clean batch steps again from the same weights */
    fr_data_f32(x)[B * IN - 1] = 0.5f;
    CHECK_OK(fr_train_step(m, opt, &sc, x, y, accum, &loss, NULL, &stepped));
    CHECK(stepped && isfinite(loss) && sc.skipped == 1);
    CHECK(!same_bits(fr_params_get(m->params, "fc.weight"), before[0]));
    free_copy(m->params, before);
    fr_release(momentum);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_release(x);
    fr_release(y);
}

static void test_inf_skips_step(void) {
    skip_case(FR_F16, 1);
    skip_case(FR_F16, 2); /* the inf in the second micro-batch only */
    skip_case(FR_F32, 1);
}

/* Without an optimizer the scaler only scales: the gradients stay scaled
 * and the scaler does not change. */
static void test_scaler_without_optimizer(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 1, 3, 4), 51);
    int32_t lab[4] = {0, 1, 2, 1};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    fr_model *m = linear_model(12, 3);
    fr_tensor *w = fr_params_get(m->params, "fc.weight");
    CHECK_OK(fr_train_step(m, NULL, NULL, x, y, 1, NULL, NULL, NULL));
    fr_tensor *dw = fr_retain(w->grad);
    fr_params_zero_grad(m->params);
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, FR_F16));
    bool stepped = true;
    CHECK_OK(fr_train_step(m, NULL, &sc, x, y, 1, NULL, NULL, &stepped));
    CHECK(!stepped && sc.scale == FR_LOSS_SCALE_INIT && sc.growth_tracker == 0 && !sc.unscaled);
    fr_tensor *want = fr_scale(dw, FR_LOSS_SCALE_INIT);
    CHECK(same_bits(w->grad, want));
    fr_release(want);
    fr_release(dw);
    fr_params_zero_grad(m->params);
    fr_model_free(m);
    fr_release(x);
    fr_release(y);
}

/* ---- --precision and the planner ---- */

static void test_precision_flag(void) {
    fr_dtype d = FR_F32;
    CHECK_OK(fr_cli_precision("--precision", "bf16", &d));
    CHECK(d == FR_BF16);
    CHECK_OK(fr_cli_precision("--precision", "fp16", &d));
    CHECK(d == FR_F16);
    CHECK_OK(fr_cli_precision("--precision", "float32", &d));
    CHECK(d == FR_F32);
    d = FR_BF16;
    CHECK_ERR(fr_cli_precision("--precision", "f8", &d), FR_ERR_ARG,
              "--precision: \"f8\" is not a precision (choose f32, f16 or bf16)");
    CHECK(d == FR_BF16); /* untouched on error */
    CHECK_ERR(fr_cli_precision("--precision", NULL, &d), FR_ERR_ARG, "--precision: \"\"");
}

static void test_plan_precision(void) {
    CHECK(fr_seg_elem_bytes() == 4);
    CHECK_OK(fr_autocast_enter(FR_F16));
    CHECK(fr_seg_elem_bytes() == 2);
    CHECK_OK(fr_autocast_enter(FR_F32)); /* nested f32 region */
    CHECK(fr_seg_elem_bytes() == 4);
    fr_autocast_exit();
    fr_autocast_exit();
    CHECK_OK(fr_autocast_enter(FR_BF16));
    CHECK(fr_seg_elem_bytes() == 2);
    fr_autocast_exit();
    CHECK(fr_seg_elem_bytes() == 4);
    /* a ResNet-56-like profile in elements (3 stages of 9 blocks, widths
     * 16/32/64 at 32/16/8 pixels, 4 values a block, as models/resnet.c counts):
     * in half the split is the same and the estimated peak exactly half */
    enum { N = 27 };
    double elems[N], input[N], c4[N], i4[N], c2[N], i2[N];
    for (int i = 0; i < N; i++) {
        double hw = i < 9 ? 1024 : i < 18 ? 256 : 64, width = i < 9 ? 16 : i < 18 ? 32 : 64;
        elems[i] = 4 * width * hw;
        input[i] = width * hw * (i == 9 || i == 18 ? 2 : 1); /* a stage's first block reads the last */
        c4[i] = 4 * elems[i];
        i4[i] = 4 * input[i];
        c2[i] = 2 * elems[i];
        i2[i] = 2 * input[i];
    }
    int l4[N], l2[N];
    fr_seg_costs p4 = {.cost = c4, .input = i4, .n = N}, p2 = {.cost = c2, .input = i2, .n = N};
    int n4 = fr_seg_split(&p4, l4), n2 = fr_seg_split(&p2, l2);
    CHECK(n4 == n2 && n4 > 1 && n4 < N);
    for (int s = 0; s < n4 && s < n2; s++)
        CHECK(l4[s] == l2[s]);
    CHECK(fr_seg_peak(&p2, l2, n2) == 0.5 * fr_seg_peak(&p4, l4, n4));
}

/* ---- half-precision models: need the half-precision ops (issue 6) ---- */

/* One SGD step of the linear model in `precision` against the same step in
 * f32, from the same weights on the same batch. Tolerances: f16 keeps 11
 * significant bits (2^-11 = 4.9e-4 relative rounding), bf16 8 (3.9e-3);
 * the inputs, weights and logits are each rounded once, and the products
 * accumulate in f32, so the loss is good to a few roundings; the weight
 * change (lr times the gradient) to about 2e-2 relative of its size. */
static void half_step_case(fr_dtype precision) {
    enum { B = 8, IN = 12, K = 5 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 61);
    int32_t lab[B] = {0, 4, 2, 1, 3, 3, 0, 2};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    fr_model *ref = linear_model(IN, K), *half = linear_model(IN, K);
    half->cfg.precision = precision;
    fr_tensor *w0 = fr_empty_like(fr_params_get(ref->params, "fc.weight"), FR_TAG_WORKSPACE);
    fr_copy_(w0, fr_params_get(ref->params, "fc.weight"));
    fr_optim *oref = fr_sgd_new(ref->params, (fr_sgd_options){.lr = 0.5});
    fr_optim *ohalf = fr_sgd_new(half->params, (fr_sgd_options){.lr = 0.5});
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, precision));
    double lref = 0, lhalf = 0;
    bool stepped = false;
    CHECK_OK(fr_train_step(ref, oref, NULL, x, y, 1, &lref, NULL, NULL));
    CHECK_OK(fr_train_step(half, ohalf, &sc, x, y, 1, &lhalf, NULL, &stepped));
    CHECK(stepped && sc.skipped == 0);
    CHECK(lhalf != lref); /* it did run in half: rounded inputs give another loss */
    CHECK_CLOSE(lhalf, lref, (precision == FR_F16 ? 5e-3 : 3e-2) * lref);
    const float *wr = fr_data_f32(fr_params_get(ref->params, "fc.weight"));
    const float *wh = fr_data_f32(fr_params_get(half->params, "fc.weight"));
    const float *w0p = fr_data_f32(w0);
    double max_change = 0, max_diff = 0;
    for (int i = 0; i < K * IN; i++) {
        max_change = fmax(max_change, fabs((double)wr[i] - w0p[i]));
        max_diff = fmax(max_diff, fabs((double)wh[i] - wr[i]));
    }
    CHECK(max_change > 1e-3); /* the step did move the weights */
    CHECK(max_diff <= (precision == FR_F16 ? 2e-2 : 6e-2) * max_change);
    /* the weights and their gradients stay f32 (master weights) */
    CHECK(fr_params_get(half->params, "fc.weight")->dtype == FR_F32);
    fr_release(w0);
    fr_optim_free(oref);
    fr_optim_free(ohalf);
    fr_model_free(ref);
    fr_model_free(half);
    fr_release(x);
    fr_release(y);
}

static void test_half_step_f16(void) { half_step_case(FR_F16); }
static void test_half_step_bf16(void) { half_step_case(FR_BF16); }

/* ---- the programs ---- */

static void write_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* IDX files (uncompressed) of n separable 8x8 images under dir/<prefix>-*. */
static void write_idx(const char *dir, const char *prefix, int n) {
    enum { HW = 8 };
    uint8_t *px = malloc((size_t)n * HW * HW);
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    separable(px, lab, n, HW);
    char path[600];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(path, "wb");
    write_be32(f, 0x803);
    write_be32(f, (uint32_t)n);
    write_be32(f, HW);
    write_be32(f, HW);
    fwrite(px, 1, (size_t)n * HW * HW, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(path, "wb");
    write_be32(f, 0x801);
    write_be32(f, (uint32_t)n);
    for (int i = 0; i < n; i++)
        fputc(lab[i], f);
    fclose(f);
    free(px);
    free(lab);
}

/* Runs `<build>/examples/<prog> args`, returning its exit code and output. */
static int run_prog(const char *prog, const char *args, char *out, size_t len) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/examples/%s %s 2>&1", build_dir, prog, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    int rc = p ? pclose(p) : -1;
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static bool programs_built(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/train", build_dir);
    bool train = access(path, X_OK) == 0;
    snprintf(path, sizeof path, "%s/examples/validate", build_dir);
    return train && access(path, X_OK) == 0;
}

static bool memreport_built(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/memreport", build_dir);
    return access(path, X_OK) == 0;
}

/* the output of the last expect_output */
static char last_output[65536];

static void expect_output(const char *prog, const char *args, int want_rc, const char *needle) {
    char *out = last_output;
    int rc = run_prog(prog, args, out, sizeof last_output);
    if ((want_rc == 0) != (rc == 0) || !strstr(out, needle)) {
        fprintf(stderr, "    %s %s: exit %d (wanted %s), output lacks \"%s\":\n%s\n", prog, args, rc,
                want_rc ? "non-zero" : "0", needle, out);
        fr_t_failed_now = 1;
    }
}

/* Whether two safetensors files hold the same names with the same bytes. */
static bool same_tensors(const char *a_path, const char *b_path) {
    fr_st_file *a = fr_st_open(a_path), *b = fr_st_open(b_path);
    bool same = a && b && fr_st_count(a) == fr_st_count(b);
    for (int i = 0; same && i < fr_st_count(a); i++) {
        const char *name = fr_st_name(a, i);
        fr_tensor *x = fr_st_get(a, name, FR_CPU, FR_TAG_WORKSPACE);
        fr_tensor *y = fr_st_find(b, name) >= 0 ? fr_st_get(b, name, FR_CPU, FR_TAG_WORKSPACE) : NULL;
        same = x && y && fr_nbytes(x) == fr_nbytes(y) && !memcmp(fr_data(x), fr_data(y), fr_nbytes(x));
        if (!same)
            fprintf(stderr, "    %s differs between %s and %s\n", name, a_path, b_path);
        fr_release(x);
        fr_release(y);
    }
    fr_st_close(a);
    fr_st_close(b);
    return same;
}

/* A copy of the training checkpoint `from` recorded as trained in
 * `precision` with the given scaler state (made here, not trained: the
 * programs' handling of the amp fields does not need half-precision ops). */
/* from's run written to `to` in `precision`, with the scaler state ss and,
 * where total_steps > 0, a cosine schedule of that many steps. */
static void write_precision_copy(const char *from, const char *to, fr_dtype precision,
                                 fr_loss_scaler_state ss, int64_t total_steps) {
    fr_state_info info;
    CHECK_OK(fr_state_read_info(from, &info));
    fr_model *m = fr_cli_model_create(info.model, info.in_channels, info.num_classes, 0);
    CHECK_NOTNULL(m);
    fr_optim *opt = fr_sgd_new(m->params, info.sgd);
    fr_train_state st;
    CHECK_OK(fr_state_load(from, m, opt, NULL, &st));
    m->cfg.precision = precision;
    if (total_steps > 0)
        st.schedule.total_steps = total_steps;
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, precision));
    CHECK_OK(fr_loss_scaler_set_state(&sc, ss));
    CHECK_OK(fr_state_save(to, m, opt, &sc, &st));
    fr_optim_free(opt);
    fr_model_free(m);
}

/* examples/gan: a few steps on Fashion-MNIST write the PNG and leave
 * nothing alive; images of another size are refused. */
static void test_gan_program(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/gan", build_dir);
    if (access(path, X_OK) != 0)
        SKIP("examples/gan not built");
    if (access(FR_FASHION_MNIST_DIR, R_OK) != 0)
        SKIP("no Fashion-MNIST at " FR_FASHION_MNIST_DIR);
    const char *dir = fr_t_make_tmpdir("gan");
    char args[1024];
    snprintf(args, sizeof args, "--steps 3 --batch 8 --limit 64 --strategy abn+checkpoint --out %s/g.png",
             dir);
    expect_output("gan", args, 0, "step 3/3: loss D ");
    CHECK(strstr(last_output, "alive at exit: 0 tensors, 0 bytes") != NULL);
    snprintf(path, sizeof path, "%s/g.png", dir);
    CHECK(access(path, R_OK) == 0);
    write_idx(dir, "train", 16);
    snprintf(args, sizeof args, "--data mnist:%s --steps 1", dir);
    expect_output("gan", args, 1, "take 1x28x28 grey images");
    fr_t_remove_tmpdir(dir);
}

/* A copy of `from` as `to` with `edit` applied to its bytes (NULL: none). */
static void copy_edited(const char *from, const char *to, void (*edit)(char *, size_t)) {
    size_t n = 0;
    char *b = fr_t_read_file(from, &n);
    CHECK_NOTNULL(b);
    if (b && edit)
        edit(b, n);
    CHECK(b && fr_t_write_file(to, b, n));
    free(b);
}

/* The seed's first digit, one up: a metadata value edited in place. */
static void edit_seed(char *b, size_t n) {
    char *at = memmem(b, n, "\"seed\":\"", 8);
    CHECK_NOTNULL(at);
    if (at)
        at[8] = at[8] == '9' ? '0' : (char)(at[8] + 1);
}

/* validate and train --resume on a checkpoint damaged after its save (a
 * weight's bit, a metadata value), and on one saved with a negative
 * running variance, which no checksum can call wrong: each refused with
 * the file and the tensor or field named, before any evaluation. */
static void damaged_checkpoints(const char *whole, const char *dir) {
    char bad[600], args[2048];
    snprintf(bad, sizeof bad, "%s/damaged.safetensors", dir);
    copy_edited(whole, bad, NULL);
    CHECK(fr_t_st_flip(bad, "conv1.weight", 2));
    snprintf(args, sizeof args, "--checkpoint %s --data mnist:%s --batch 8 --threads 1", bad, dir);
    expect_output("validate", args, 1, "tensor 'conv1.weight': its bytes do not match their checksum");
    CHECK(strstr(last_output, bad) && !strstr(last_output, "accuracy"));
    snprintf(args, sizeof args, "--resume %s --data mnist:%s --threads 1", bad, dir);
    expect_output("train", args, 1, "tensor 'conv1.weight': its bytes do not match their checksum");
    copy_edited(whole, bad, edit_seed);
    expect_output("train", args, 1, "the __metadata__ does not match its checksum");
    snprintf(args, sizeof args, "--checkpoint %s --data mnist:%s --batch 8 --threads 1", bad, dir);
    expect_output("validate", args, 1, "the __metadata__ does not match its checksum");
    CHECK(strstr(last_output, bad) != NULL);

    fr_state_info info;
    CHECK_OK(fr_state_read_info(whole, &info));
    fr_model *m = fr_cli_model_create(info.model, info.in_channels, info.num_classes, 0);
    CHECK_NOTNULL(m);
    fr_train_state st;
    int k = m ? fr_params_find(m->params, "bn1.running_var") : -1;
    CHECK(k >= 0);
    if (k >= 0) {
        CHECK_OK(fr_state_load(whole, m, NULL, NULL, &st));
        fr_data_f32(m->params->items[k].tensor)[0] = -0.5f;
        CHECK_OK(fr_state_save(bad, m, NULL, NULL, &st));
        expect_output("validate", args, 1, "tensor bn1.running_var holds -0.5 at element 0, expected a finite "
                      "number >= 0");
        CHECK(!strstr(last_output, "the test loss is NaN"));
    }
    fr_model_free(m);
}

/* Runs that draw random numbers in their steps, stopped after one epoch
 * and resumed, end as the uninterrupted run, tensor for tensor: compress:4's
 * rounding, and dropout (the MobileNet example's, 0.2). The
 * checkpoint carries the random streams (random.dropout, random.compress);
 * before, a resumed run drew the first epoch's masks and codes again. */
static void resume_draws_the_same(const char *dir) {
    static const struct {
        const char *prog, *flags;
    } runs[] = {{"train", "--model resnet8 --strategy compress:4"}, {"mobilenet", ""}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (!fr_t_have_example(runs[i].prog))
            continue;
        char args[2048], whole[600], half[600];
        snprintf(whole, sizeof whole, "%s/%s_whole.safetensors", dir, runs[i].prog);
        snprintf(half, sizeof half, "%s/%s_half.safetensors", dir, runs[i].prog);
        const char *common = "--batch 16 --epochs 2 --lr 0.05 --threads 1";
        snprintf(args, sizeof args, "%s --data mnist:%s %s --save %s", runs[i].flags, dir, common, whole);
        expect_output(runs[i].prog, args, 0, "epoch 2/2: train loss");
        snprintf(args, sizeof args, "%s --data mnist:%s %s --stop-after 1 --save %s", runs[i].flags, dir,
                 common, half);
        expect_output(runs[i].prog, args, 0, "epoch 1/2: train loss");
        snprintf(args, sizeof args, "--resume %s --threads 1 --data mnist:%s", half, dir);
        expect_output(runs[i].prog, args, 0, "epoch 2/2: train loss");
        if (!same_tensors(whole, half)) {
            fprintf(stderr, "    %s %s: the resumed run ended elsewhere\n", runs[i].prog, runs[i].flags);
            fr_t_failed_now = 1;
        }
    }
}

static void test_programs(void) {
    if (!programs_built())
        SKIP("examples/train or validate not built");
    const char *dir = fr_t_make_tmpdir("train");
    char args[2048];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 2 --lr 0.05 --threads 1 "
             "--save %s/run.safetensors", dir, dir);
    expect_output("train", args, 0, "epoch 2/2: train loss");
    snprintf(args, sizeof args, "--resume %s/run.safetensors --data mnist:%s --threads 1", dir, dir);
    expect_output("train", args, 0, "2 of 2 epochs done"); /* nothing left to train */
    /* the same run stopped after one epoch and resumed: the same file, tensor for tensor */
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 2 --lr 0.05 --threads 1 --stop-after 1 "
             "--save %s/half.safetensors", dir, dir);
    expect_output("train", args, 0, "epoch 1/2: train loss");
    snprintf(args, sizeof args, "--resume %s/half.safetensors --threads 1 --data mnist:%s", dir, dir);
    expect_output("train", args, 0, "epoch 2/2: train loss");
    char whole[600], resumed[600];
    snprintf(whole, sizeof whole, "%s/run.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/half.safetensors", dir);
    CHECK(same_tensors(whole, resumed));
    resume_draws_the_same(dir);
    /* a warm-up as long as the run, under any schedule, names --warmup
     * (only cosine refused it, without the flag); a 2-step run's step
     * schedule keeps its one milestone (both met at step 1 and were dropped) */
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 16 --epochs 1 --threads 1 "
             "--schedule step --warmup 100", dir);
    expect_output("train", args, 1, "--warmup 100 is not shorter than the run's 4 steps");
    char two[600];
    snprintf(two, sizeof two, "%s/two.safetensors", dir);
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 16 --epochs 1 --threads 1 "
             "--limit-train 32 --schedule step --save %s", dir, two);
    expect_output("train", args, 0, "epoch 1/1");
    fr_state_info two_info;
    CHECK_OK(fr_state_read_info(two, &two_info));
    CHECK(two_info.state.schedule.kind == FR_SCHED_STEP && two_info.state.schedule.n_milestones == 1 &&
          two_info.state.schedule.milestones[0] == 1);
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --data mnist:%s --batch 8 --threads 1", dir,
             dir);
    expect_output("validate", args, 0, "accuracy");
    expect_output("validate", args, 0, "one training step (fwd+bwd), plain");
    damaged_checkpoints(whole, dir);

    /* errors: the library's message, non-zero exit */
    expect_output("train", "--data fashion-mnist:/nonexistent/fm --epochs 1", 1,
                  "data folder /nonexistent/fm is missing");
    expect_output("train", "--data cifar10:/nonexistent/c10", 1, "/nonexistent/c10");
    expect_output("train", "--batch many", 1, "--batch: \"many\" is not an integer");
    expect_output("train", "--lr -1", 1, "--lr: \"-1\" is not a number");
    expect_output("train", "--schedule linear", 1,
                  "--schedule: \"linear\" is not one of cosine, step, constant");
    expect_output("train", "--strategy fast", 1, "unknown memory strategy");
    expect_output("train", "--model vgg16", 1, "unknown model \"vgg16\"");
    expect_output("train", "--frobnicate", 1, "unknown flag \"--frobnicate\"");
    expect_output("train", "--precision f8", 1,
                  "--precision: \"f8\" is not a precision (choose f32, f16 or bf16)");
    expect_output("train", "--precision", 1, "--precision needs a value");
    expect_output("validate", "--frobnicate", 1, "unknown flag \"--frobnicate\"");
    expect_output("train", "--data", 1, "--data needs a value");
    snprintf(args, sizeof args, "--resume %s/run.safetensors --lr 0.5", dir);
    expect_output("train", args, 1, "--lr cannot be combined with --resume");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --data mnist:/nonexistent/m", dir);
    expect_output("validate", args, 1,
                  "data folder /nonexistent/m is missing");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --batch 0", dir);
    expect_output("validate", args, 1, "--batch: \"0\" is not an integer in [1,");
    snprintf(args, sizeof args, "--checkpoint %s/missing.safetensors", dir);
    expect_output("validate", args, 1, "missing.safetensors");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --model resnet14 --data mnist:%s", dir, dir);
    expect_output("validate", args, 1, "holds model resnet8, not resnet14");
    expect_output("validate", "--data mnist:/tmp", 1, "--checkpoint PATH is required");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --precision half", dir);
    expect_output("validate", args, 1, "--precision: \"half\" is not a precision");

    /* precision on resume: the run's own is accepted, another refused naming both */
    snprintf(args, sizeof args, "--resume %s/run.safetensors --data mnist:%s --threads 1 --precision f32",
             dir, dir);
    expect_output("train", args, 0, "precision f32;");
    snprintf(args, sizeof args, "--resume %s/run.safetensors --data mnist:%s --precision bf16", dir, dir);
    expect_output("train", args, 1, "--precision bf16: the run in");
    expect_output("train", args, 1, "run.safetensors was trained in f32");
    /* an f16 run's scaler state comes back through --resume (the run is
     * complete, so nothing is computed in f16) */
    char f16[600];
    snprintf(f16, sizeof f16, "%s/f16.safetensors", dir);
    write_precision_copy(whole, f16, FR_F16,
                         (fr_loss_scaler_state){.scale = 1024.0f, .growth_tracker = 5, .skipped = 3}, 0);
    snprintf(args, sizeof args, "--resume %s --data mnist:%s --threads 1", f16, dir);
    expect_output("train", args, 0, "strategy plain, precision f16");
    expect_output("train", args, 0, "precision f16 (loss scale 1024, 3 steps skipped)");
    snprintf(args, sizeof args, "--resume %s --data mnist:%s --precision bf16", f16, dir);
    expect_output("train", args, 1, "--precision bf16: the run in");
    expect_output("train", args, 1, "f16.safetensors was trained in f16");
    /* a cosine of another length than the run's steps: refused, where the
     * rest of the run went at another rate (eta_min past its end) */
    char short_cosine[600];
    snprintf(short_cosine, sizeof short_cosine, "%s/short.safetensors", dir);
    write_precision_copy(whole, short_cosine, FR_F32, (fr_loss_scaler_state){.scale = 1.0f}, 3);
    snprintf(args, sizeof args, "--resume %s --data mnist:%s --threads 1", short_cosine, dir);
    expect_output("train", args, 1, "schedule.total_steps is 3, but the run has");
    if (memreport_built()) {
        expect_output("memreport", "--precision f8", 1, "--precision: \"f8\" is not a precision");
        /* each flag in range, their product past the address space (it
         * wrapped to a malloc(0) and a crash) */
        expect_output("memreport", "--model resnet20 --in-channels 4 --size 1073741824", 1,
                      "--size 1073741824 x 1073741824 floats does not fit");
    }
    fr_t_remove_tmpdir(dir);
}

/* The programs in f16 and bf16: need the half-precision ops (issue 6). */
static void test_programs_half(void) {
    if (!programs_built())
        SKIP("examples/train or validate not built");
    const char *dir = fr_t_make_tmpdir("train");
    char args[2048];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 1 --lr 0.05 --threads 1 --precision f16 "
             "--save %s/f16.safetensors", dir, dir);
    expect_output("train", args, 0, "img/s  scale ");
    expect_output("train", args, 0, "precision f16 (loss scale ");
    snprintf(args, sizeof args, "--checkpoint %s/f16.safetensors --data mnist:%s --batch 8 --threads 1", dir,
             dir);
    expect_output("validate", args, 0, "one training step (fwd+bwd), plain, f16");
    char path[600];
    snprintf(path, sizeof path, "%s/f16.safetensors", dir);
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(info.state.precision == FR_F16 && info.state.has_scaler && info.state.scaler.scale > 0);
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 1 --lr 0.05 --threads 1 --precision bf16",
             dir);
    expect_output("train", args, 0, "precision bf16 (loss scale 1, 0 steps skipped)");
    if (memreport_built())
        expect_output("memreport", "--model resnet8 --batch 4 --size 8 --strategies plain,recompute "
                      "--precision bf16", 0, "bf16 - f32");
    fr_t_remove_tmpdir(dir);
}

int main(int argc, char **argv) {
    (void)argc;
    /* <build>/tests/test_train -> <build> */
    char self[512];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(build_dir, sizeof build_dir, "%s", dirname(dirname(self)));
    RUN(test_loss_decreases);
    RUN(test_accumulation_equals_full_batch);
    RUN(test_scaled_step_equals_unscaled);
    RUN(test_inf_skips_step);
    RUN(test_scaler_without_optimizer);
    RUN(test_step_hooks);
    RUN(test_precision_flag);
    RUN(test_plan_precision);
    RUN(test_programs);
    RUN(test_gan_program);
    /* these need the half-precision ops (issue 6) */
    RUN(test_loss_decreases_f16);
    RUN(test_loss_decreases_bf16);
    RUN(test_half_step_f16);
    RUN(test_half_step_bf16);
    RUN(test_programs_half);
    return TEST_SUMMARY();
}
