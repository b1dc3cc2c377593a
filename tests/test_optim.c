/* test_optim.c: SGD / Adam / AdamW and the lr schedules against PyTorch
 * (tests/fixtures/gen_optim.py), plus the optimizer's bookkeeping.
 * Tolerance for weights and state: |got - want| <= 1e-7 + 1e-6 |want|. */
#include "testlib.h"

#include <string.h>

#include "nn/layers.h"
#include "train/optim.h"
#include "train/schedule.h"

#define ATOL 1e-7
#define RTOL 1e-6

typedef struct {
    const char *name;
    fr_optim_kind kind;
    fr_sgd_options sgd;
    fr_adam_options adam;
} config;

/* The same configurations as gen_optim.py's CONFIGS. */
static const config configs[] = {
    {"sgd", FR_OPTIM_SGD, .sgd = {.lr = 0.1}},
    {"sgd_momentum", FR_OPTIM_SGD, .sgd = {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4}},
    {"sgd_dampening", FR_OPTIM_SGD, .sgd = {.lr = 0.05, .momentum = 0.9, .dampening = 0.1}},
    {"sgd_nesterov", FR_OPTIM_SGD,
     .sgd = {.lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3}},
    {"adam", FR_OPTIM_ADAM, .adam = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
    {"adam_l2", FR_OPTIM_ADAM,
     .adam = {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}},
    {"adamw", FR_OPTIM_ADAMW,
     .adam = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1}},
};
enum { STEPS = 5 };

static fr_optim *make(const config *c, fr_params *p) {
    switch (c->kind) {
    case FR_OPTIM_SGD:
        return fr_sgd_new(p, c->sgd);
    case FR_OPTIM_ADAM:
        return fr_adam_new(p, c->adam);
    default:
        return fr_adamw_new(p, c->adam);
    }
}

/* Five steps with the fixture's gradients; weights after each step and the
 * final state compared with torch.optim. */
static void run_config(const char *name) {
    const config *c = NULL;
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        if (!strcmp(configs[i].name, name))
            c = &configs[i];
    FR_ASSERT(c);
    fr_st_file *f = fr_t_fixture("optim");
    if (!f)
        return;
    fr_params *p = fr_params_new();
    fr_tensor *w = fr_params_new_tensor(p, "w", FR_PARAMETER, FR_F32, 2, FR_SHAPE(5, 7));
    CHECK_OK(fr_st_read_into(f, "w0", w));
    fr_optim *opt = make(c, p);
    CHECK_NOTNULL(opt);
    char key[64];
    for (int k = 0; opt && k < STEPS; k++) {
        snprintf(key, sizeof key, "grad%d", k);
        w->grad = fr_st_get(f, key, FR_CPU, FR_TAG_GRAD);
        CHECK_OK(fr_optim_step(opt));
        fr_optim_zero_grad(opt);
        CHECK(w->grad == NULL);
        snprintf(key, sizeof key, "%s.w%d", name, k + 1);
        fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
        fr_t_allclose_t(w, want, ATOL, RTOL, key);
        fr_release(want);
    }
    for (int slot = 0; opt && slot < 2; slot++) {
        const char *state = fr_optim_state_name(opt, slot);
        if (!state)
            continue;
        snprintf(key, sizeof key, "%s.%s", name, state);
        fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
        fr_t_allclose_t(opt->state[slot][0], want, ATOL, RTOL, key);
        fr_release(want);
    }
    if (opt)
        CHECK(opt->steps[0] == STEPS);
    fr_optim_free(opt);
    fr_params_free(p);
    fr_st_close(f);
}

static void test_sgd(void) { run_config("sgd"); }
static void test_sgd_momentum_weight_decay(void) { run_config("sgd_momentum"); }
static void test_sgd_dampening(void) { run_config("sgd_dampening"); }
static void test_sgd_nesterov(void) { run_config("sgd_nesterov"); }
static void test_adam(void) { run_config("adam"); }
static void test_adam_l2(void) { run_config("adam_l2"); }
static void test_adamw(void) { run_config("adamw"); }

/* A parameter without a gradient and a buffer are left alone; state is
 * created lazily and counted under FR_TAG_OPTIM. */
static void test_lazy_state_and_skips(void) {
    fr_params *p = fr_params_new();
    fr_tensor *a = fr_params_new_tensor(p, "a", FR_PARAMETER, FR_F32, 1, FR_SHAPE(10));
    fr_tensor *b = fr_params_new_tensor(p, "b", FR_PARAMETER, FR_F32, 1, FR_SHAPE(6));
    fr_tensor *buf = fr_params_new_tensor(p, "buf", FR_BUFFER, FR_F32, 1, FR_SHAPE(4));
    CHECK_OK(fr_fill_(b, 2.0f));
    size_t optim_before = fr_mem_current(FR_CPU, FR_TAG_OPTIM);
    fr_optim *opt = fr_adam_new(p, fr_adam_defaults(0.1, 0.0));
    CHECK_NOTNULL(opt);
    CHECK(fr_optim_state_bytes(opt) == 0);
    a->grad = fr_zeros_like(a, FR_TAG_GRAD);
    CHECK_OK(fr_fill_(a->grad, 1.0f));
    CHECK_OK(fr_optim_step(opt));
    /* Adam's first step moves each weight by -lr * sign(g) (up to eps). */
    CHECK_CLOSE(fr_data_f32(a)[3], -0.1, 1e-6);
    CHECK(fr_data_f32(b)[0] == 2.0f);
    CHECK(opt->state[0][1] == NULL && opt->state[0][2] == NULL && opt->steps[1] == 0);
    CHECK(fr_optim_state_bytes(opt) == 2 * 10 * sizeof(float));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_OPTIM) - optim_before == fr_optim_state_bytes(opt));
    CHECK(fr_params_count(p) == 16);
    CHECK(fr_params_bytes(p) == 20 * sizeof(float));
    (void)buf;
    fr_optim_free(opt);
    fr_params_free(p);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_OPTIM) == optim_before);
}

static void test_optim_errors(void) {
    fr_params *p = fr_params_new();
    fr_params_new_tensor(p, "w", FR_PARAMETER, FR_F32, 1, FR_SHAPE(3));
    CHECK(!fr_sgd_new(p, (fr_sgd_options){.lr = 0.1, .nesterov = true}));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "nesterov");
    CHECK(!fr_sgd_new(p, (fr_sgd_options){.lr = -1}));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "lr");
    fr_adam_options o = fr_adam_defaults(1e-3, 0.0);
    o.beta2 = 1.0;
    CHECK(!fr_adam_new(p, o));
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "beta2");
    fr_optim *opt = fr_sgd_new(p, (fr_sgd_options){.lr = 0.1});
    fr_params_new_tensor(p, "late", FR_PARAMETER, FR_F32, 1, FR_SHAPE(3));
    CHECK_ERR(fr_optim_step(opt), FR_ERR_ARG, "after the model");
    fr_optim_free(opt);
    fr_params_free(p);
}

/* The documented accumulation rule: k micro-batches with loss / k give the
 * gradient of the whole batch (a network without BN). Tolerance 1e-6 abs. */
static fr_tensor *batch_loss(fr_tensor *x, fr_tensor *labels, const fr_linear_layer *fc, float scale) {
    fr_tensor *logits = fr_linear_layer_forward(fc, x);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    fr_release(logits);
    return fr_chain(loss, loss ? fr_scale(loss, scale) : NULL);
}

static void test_gradient_accumulation(void) {
    fr_params *p = fr_params_new();
    fr_linear_layer fc;
    fr_rng rng;
    fr_rng_seed(&rng, 7);
    CHECK_OK(fr_linear_layer_init(&fc, p, "fc", 6, 3, true, &rng));
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 6), 3);
    int32_t lab[4] = {0, 2, 1, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    fr_tensor *loss = batch_loss(x, labels, &fc, 1.0f);
    CHECK_OK(fr_backward(loss));
    fr_release(loss);
    fr_tensor *whole = fr_to_device(fc.weight->grad, FR_CPU, FR_TAG_DATA);
    fr_params_zero_grad(p);
    for (int k = 0; k < 2; k++) {
        fr_tensor *xs = fr_narrow(x, 0, 2 * k, 2), *ls = fr_narrow(labels, 0, 2 * k, 2);
        loss = batch_loss(xs, ls, &fc, 0.5f);
        CHECK_OK(fr_backward(loss));
        fr_release(loss);
        fr_release(xs);
        fr_release(ls);
    }
    fr_t_allclose_t(fc.weight->grad, whole, 1e-6, 0, "accumulated fc.weight grad");
    fr_release(whole);
    fr_release(x);
    fr_release(labels);
    fr_params_free(p);
}

static void check_schedule(const fr_schedule *s, const char *name) {
    fr_st_file *f = fr_t_fixture("optim");
    fr_tensor *want = fr_t_fixture_tensor(f, name, FR_CPU);
    if (want) {
        int64_t n = fr_numel(want);
        fr_tensor *got = fr_empty_like(want, FR_TAG_DATA);
        for (int64_t i = 0; i < n; i++)
            fr_data_f32(got)[i] = (float)fr_schedule_lr(s, i);
        fr_t_allclose_t(got, want, 1e-9, RTOL, name);
        fr_release(got);
    }
    fr_release(want);
    fr_st_close(f);
}

static void test_schedules(void) {
    fr_schedule s;
    CHECK_OK(fr_schedule_step(&s, 0.1, (const int64_t[]){3, 6}, 2, 0.1));
    check_schedule(&s, "sched.step");
    CHECK_OK(fr_schedule_cosine(&s, 0.1, 10, 0.001));
    check_schedule(&s, "sched.cosine");
    CHECK_CLOSE(fr_schedule_lr(&s, 25), 0.001, 1e-12); /* held at eta_min */
    CHECK_OK(fr_schedule_cosine(&s, 0.1, 12, 0.0));
    CHECK_OK(fr_schedule_warmup(&s, 3, 0.1));
    check_schedule(&s, "sched.warmup_cosine");
    CHECK_OK(fr_schedule_step(&s, 0.2, (const int64_t[]){6, 9}, 2, 0.5));
    CHECK_OK(fr_schedule_warmup(&s, 4, 0.25));
    check_schedule(&s, "sched.warmup_step");
    CHECK_OK(fr_schedule_constant(&s, 0.3));
    CHECK(fr_schedule_lr(&s, 1000) == 0.3);
}

static void test_schedule_errors(void) {
    fr_schedule s;
    CHECK_ERR(fr_schedule_step(&s, 0.1, (const int64_t[]){5, 5}, 2, 0.1), FR_ERR_ARG, "increasing");
    CHECK_ERR(fr_schedule_cosine(&s, 0.1, 0, 0.0), FR_ERR_ARG, "total_steps");
    CHECK_OK(fr_schedule_cosine(&s, 0.1, 10, 0.0));
    CHECK_ERR(fr_schedule_warmup(&s, 10, 0.1), FR_ERR_ARG, "no cosine phase");
    CHECK_ERR(fr_schedule_warmup(&s, 2, 0.0), FR_ERR_ARG, "start_factor");
}

int main(void) {
    RUN(test_sgd);
    RUN(test_sgd_momentum_weight_decay);
    RUN(test_sgd_dampening);
    RUN(test_sgd_nesterov);
    RUN(test_adam);
    RUN(test_adam_l2);
    RUN(test_adamw);
    RUN(test_lazy_state_and_skips);
    RUN(test_optim_errors);
    RUN(test_gradient_accumulation);
    RUN(test_schedules);
    RUN(test_schedule_errors);
    return TEST_SUMMARY();
}
