/* test_pointwise_loss.c: fr_mse_loss, fr_l1_loss, fr_smooth_l1_loss and
 * fr_bce_with_logits_loss against PyTorch 1.13
 * (tests/fixtures/gen_pointwise_loss.py: the mean loss and its gradient,
 * 1e-5 relative), finite differences, and refusals (shapes, beta, a target
 * that requires grad, an empty input). */
#include <stdio.h>

#include "testlib.h"

typedef struct {
    const char *name;
    const char *pred, *target; /* fixture tensors */
    int kind;                  /* 0 mse, 1 l1, 2 smooth l1, 3 bce */
    float beta;
} loss_case;

static const loss_case CASES[] = {
    {"mse", "pred", "target", 0, 0.0f},        {"l1", "pred", "target", 1, 0.0f},
    {"smooth_l1", "pred", "target", 2, 0.5f},  {"smooth_l1_beta0", "pred", "target", 2, 0.0f},
    {"bce", "logits", "prob", 3, 0.0f},
};
#define N_CASES (sizeof CASES / sizeof *CASES)

static fr_tensor *run_loss(const loss_case *c, fr_tensor *p, fr_tensor *t) {
    switch (c->kind) {
    case 0:
        return fr_mse_loss(p, t);
    case 1:
        return fr_l1_loss(p, t);
    case 2:
        return fr_smooth_l1_loss(p, t, c->beta);
    default:
        return fr_bce_with_logits_loss(p, t);
    }
}

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("pointwise_loss");
    for (size_t i = 0; i < N_CASES; i++) {
        const loss_case *c = &CASES[i];
        char key[64];
        fr_tensor *p = fr_t_fixture_tensor(f, c->pred, FR_CPU);
        fr_tensor *t = fr_t_fixture_tensor(f, c->target, FR_CPU);
        fr_tensor *dl = fr_from_host(FR_CPU, FR_F32, 0, NULL, FR_TAG_DATA, (float[]){1.5f});
        fr_set_requires_grad(p, true);
        fr_tensor *l = run_loss(c, p, t);
        CHECK_NOTNULL(l);
        if (l) {
            snprintf(key, sizeof key, "%s_loss", c->name);
            fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
            CHECK_CLOSE(fr_item(l), fr_data_f32(want)[0], 1e-5 * fabs(fr_data_f32(want)[0]));
            fr_release(want);
            CHECK_OK(fr_backward_with(l, dl));
            snprintf(key, sizeof key, "%s_dpred", c->name);
            want = fr_t_fixture_tensor(f, key, FR_CPU);
            fr_t_allclose_t(p->grad, want, 1e-9, 1e-5, key);
            fr_release(want);
        }
        fr_release(l);
        fr_release(dl);
        fr_release(p);
        fr_release(t);
    }
    fr_st_close(f);
}

typedef struct {
    const loss_case *c;
    fr_tensor *p, *t;
} grad_ctx;

static fr_tensor *loss_of(void *ctx) {
    grad_ctx *g = ctx;
    return run_loss(g->c, g->p, g->t);
}

static void test_gradcheck(void) {
    for (size_t i = 0; i < N_CASES; i++) {
        grad_ctx g = {&CASES[i], fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 6), 40 + (uint32_t)i),
                      fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 6), 60 + (uint32_t)i)};
        float *p = fr_data_f32(g.p), *t = fr_data_f32(g.t);
        for (int k = 0; k < 24; k++) {
            if (CASES[i].kind == 3) {
                p[k] *= 4.0f;
                t[k] = 0.5f + 0.5f * t[k]; /* a probability */
            } else if (p[k] - t[k] < 0.05f && p[k] - t[k] > -0.05f) {
                p[k] = t[k] + 0.1f; /* off L1's kink */
            } else if (CASES[i].kind == 2 && CASES[i].beta > 0 &&
                       fabsf(fabsf(p[k] - t[k]) - CASES[i].beta) < 0.05f) {
                p[k] += p[k] > t[k] ? 0.1f : -0.1f; /* off smooth L1's seam */
            }
        }
        fr_set_requires_grad(g.p, true);
        fr_tensor *l = loss_of(&g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            bool ok = fr_t_gradcheck(loss_of, &g, &g.p, 1, 1e-2, 1e-4, 1e-3, 24);
            if (!ok)
                fprintf(stderr, "  gradcheck failed for %s\n", CASES[i].name);
            CHECK(ok);
        }
        fr_release(l);
        fr_release(g.p);
        fr_release(g.t);
    }
}

static void test_refusals(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 1), *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 3), 2);
    CHECK_ERR(fr_t_status_of(fr_mse_loss(a, b)), FR_ERR_SHAPE,
              "mse_loss: target (4, 3) and pred (3, 4)");
    CHECK_ERR(fr_t_status_of(fr_smooth_l1_loss(a, a, -1.0f)), FR_ERR_ARG,
              "smooth_l1_loss: beta must be >= 0 (got -1)");
    fr_tensor *t = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 3);
    fr_set_requires_grad(t, true);
    CHECK_ERR(fr_t_status_of(fr_l1_loss(a, t)), FR_ERR_ARG, "l1_loss: target requires grad");
    fr_tensor *e = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(0, 4), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_t_status_of(fr_bce_with_logits_loss(e, e)), FR_ERR_SHAPE, "pred is empty");
    fr_release(a);
    fr_release(b);
    fr_release(t);
    fr_release(e);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_gradcheck);
    RUN(test_refusals);
    return TEST_SUMMARY();
}
