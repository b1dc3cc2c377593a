/* test_loss.c: fused cross-entropy against PyTorch (tests/fixtures/
 * gen_loss.py), including logits of magnitude 1000 and an upstream gradient
 * other than 1; finite differences; bad labels and shapes. */
#include <string.h>

#include "testlib.h"

static void run_case(fr_st_file *f, const char *name, const char *labels_name, double loss_rtol) {
    char key[64];
    snprintf(key, sizeof key, "%s_logits", name);
    fr_tensor *logits = fr_t_fixture_tensor(f, key, FR_CPU);
    fr_tensor *labels = fr_t_fixture_tensor(f, labels_name, FR_CPU);
    if (!logits || !labels) {
        fr_release(logits);
        fr_release(labels);
        return;
    }
    fr_set_requires_grad(logits, true);
    fr_tensor *loss = fr_cross_entropy(logits, labels);
    CHECK_NOTNULL(loss);
    if (loss) {
        CHECK(loss->ndim == 0);
        CHECK(isfinite(fr_item(loss)));
        snprintf(key, sizeof key, "%s_loss", name);
        fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
        fr_t_allclose_t(loss, want, 1e-6, loss_rtol, key);
        fr_release(want);
        CHECK_OK(fr_backward(loss));
        snprintf(key, sizeof key, "%s_dlogits", name);
        want = fr_t_fixture_tensor(f, key, FR_CPU);
        /* softmax entries ~0.1 divided by N: float rounding ~1e-8 */
        fr_t_allclose_t(logits->grad, want, 1e-7, 1e-5, key);
        fr_release(want);
    }
    fr_release(loss);
    fr_release(labels);
    fr_release(logits);
}

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("loss");
    run_case(f, "small", "labels", 1e-6);
    fr_st_close(f);
}

/* |logits| ~ 1000: exp would overflow without the max shift; PyTorch's loss
 * is ~2000/6 here, so compare relatively. */
static void test_large_logits_stay_finite(void) {
    fr_st_file *f = fr_t_fixture("loss");
    run_case(f, "large", "labels_large", 1e-6);
    fr_st_close(f);
}

static void test_upstream_gradient(void) {
    fr_st_file *f = fr_t_fixture("loss");
    fr_tensor *logits = fr_t_fixture_tensor(f, "small_logits", FR_CPU);
    fr_tensor *labels = fr_t_fixture_tensor(f, "labels", FR_CPU);
    fr_tensor *want = fr_t_fixture_tensor(f, "small_dlogits_half", FR_CPU);
    float half = 0.5f;
    fr_tensor *g = fr_from_host(FR_CPU, FR_F32, 0, NULL, FR_TAG_TRANSIENT, &half);
    if (logits && labels) {
        fr_set_requires_grad(logits, true);
        fr_tensor *loss = fr_cross_entropy(logits, labels);
        CHECK_NOTNULL(loss);
        if (loss) {
            CHECK(loss->grad_fn && loss->grad_fn->n_saved == 2); /* logits, labels */
            CHECK_OK(fr_backward_with(loss, g));
            fr_t_allclose_t(logits->grad, want, 1e-7, 1e-5, "dlogits with dloss 0.5");
        }
        fr_release(loss);
    }
    fr_release(g);
    fr_release(want);
    fr_release(labels);
    fr_release(logits);
    fr_st_close(f);
}

typedef struct {
    fr_tensor *logits, *labels;
} ce_case;

static fr_tensor *ce_loss(void *ctx) {
    ce_case *c = ctx;
    return fr_cross_entropy(c->logits, c->labels);
}

static fr_tensor *ce_smooth_loss(void *ctx) {
    ce_case *c = ctx;
    return fr_cross_entropy_smooth(c->logits, c->labels, 0.2f);
}

static void test_gradcheck(void) {
    int32_t lab[5] = {0, 6, 3, 3, 1};
    fr_t_loss_fn fns[2] = {ce_loss, ce_smooth_loss};
    for (int k = 0; k < 2; k++) {
        ce_case c = {fr_t_rand(FR_CPU, 2, FR_SHAPE(5, 7), 3),
                     fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(5), FR_TAG_DATA, lab)};
        CHECK_OK(fr_scale_out(c.logits, c.logits, 3.0f));
        fr_set_requires_grad(c.logits, true);
        fr_tensor *l = fns[k](&c);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* float32 loss ~2, eps 1e-2, gradients ~0.1 */
            CHECK(fr_t_gradcheck(fns[k], &c, &c.logits, 1, 1e-2, 2e-4, 1e-3, 35));
        }
        fr_release(l);
        fr_release(c.labels);
        fr_release(c.logits);
    }
}

static void test_bad_arguments(void) {
    fr_tensor *logits = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 10), 1);
    int32_t bad_hi[4] = {1, 2, 10, 0}, bad_lo[4] = {1, -3, 0, 0}, ok[4] = {1, 2, 3, 4};
    fr_tensor *hi = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, bad_hi);
    fr_tensor *lo = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, bad_lo);
    fr_tensor *good = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, ok);
    fr_tensor *flabels = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA);
    fr_tensor *five = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(5), FR_TAG_DATA);
    fr_tensor *l3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(4, 10, 1), 1);
    fr_tensor *no_classes = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(4, 0), FR_TAG_DATA);

    CHECK_ERR(fr_t_status_of(fr_cross_entropy(logits, hi)), FR_ERR_ARG,
              "cross_entropy: labels[2] = 10 is outside [0, 10)");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(logits, lo)), FR_ERR_ARG,
              "labels[1] = -3 is outside [0, 10)");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(logits, flabels)), FR_ERR_DTYPE,
              "labels has dtype f32, expected i32");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(logits, five)), FR_ERR_SHAPE,
              "labels has shape (5,), expected (4)");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(l3, good)), FR_ERR_SHAPE,
              "logits has shape (4, 10, 1), expected 2 dimensions");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(no_classes, good)), FR_ERR_SHAPE,
              "must have between 1 and");
    fr_clear_error(); /* none pending: the NULL itself is the error (docs/ARCHITECTURE.md, "Errors") */
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(NULL, good)), FR_ERR_ARG, "logits is NULL");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy(logits, NULL)), FR_ERR_ARG, "labels is NULL");
    /* the tensor-level backward checks too */
    fr_tensor *d = fr_empty_like(logits, FR_TAG_TRANSIENT);
    fr_tensor *dl2 = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(2), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_cross_entropy_backward(d, dl2, logits, good), FR_ERR_SHAPE,
              "dloss has shape (2,), expected one element");
    fr_tensor *one = fr_zeros(FR_CPU, FR_F32, 0, NULL, FR_TAG_TRANSIENT);
    CHECK_ERR(fr_cross_entropy_backward(d, one, logits, hi), FR_ERR_ARG, "labels[2] = 10");
    CHECK(fr_tape_size() == 0);

    fr_release(one);
    fr_release(dl2);
    fr_release(d);
    fr_release(no_classes);
    fr_release(l3);
    fr_release(five);
    fr_release(flabels);
    fr_release(good);
    fr_release(lo);
    fr_release(hi);
    fr_release(logits);
}

/* fr_cross_entropy_smooth against F.cross_entropy(label_smoothing=eps)
 * (tests/fixtures/gen_loss_smooth.py), 1e-5 relative; eps 0 is plain
 * cross-entropy bit for bit; eps outside [0, 1] refused. */
static void test_label_smoothing_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("loss_smooth");
    fr_tensor *labels = fr_t_fixture_tensor(f, "labels", FR_CPU);
    const char *names[2] = {"eps01", "eps1"};
    const float eps[2] = {0.1f, 1.0f};
    for (int i = 0; i < 2; i++) {
        fr_tensor *z = fr_t_fixture_tensor(f, "logits", FR_CPU);
        fr_set_requires_grad(z, true);
        fr_tensor *l = fr_cross_entropy_smooth(z, labels, eps[i]);
        CHECK_NOTNULL(l);
        if (l) {
            fr_t_fixture_expect(f, names[i], "loss", l, 1e-7, 1e-5);
            CHECK_OK(fr_backward(l));
            fr_t_fixture_expect(f, names[i], "dlogits", z->grad, 1e-7, 1e-5);
        }
        fr_release(l);
        fr_release(z);
    }
    fr_tensor *z = fr_t_fixture_tensor(f, "logits", FR_CPU);
    fr_tensor *a = fr_cross_entropy_smooth(z, labels, 0.0f), *b = fr_cross_entropy(z, labels);
    CHECK(a && b && fr_item(a) == fr_item(b));
    CHECK_ERR(fr_t_status_of(fr_cross_entropy_smooth(z, labels, 1.5f)), FR_ERR_ARG, "eps 1.5");
    CHECK_ERR(fr_t_status_of(fr_cross_entropy_smooth(z, labels, -0.1f)), FR_ERR_ARG, "[0, 1]");
    fr_release(a);
    fr_release(b);
    fr_release(z);
    fr_release(labels);
    fr_st_close(f);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_label_smoothing_matches_torch);
    RUN(test_large_logits_stay_finite);
    RUN(test_upstream_gradient);
    RUN(test_gradcheck);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
