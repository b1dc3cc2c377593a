/* test_examples_torch.c: the three example models, built by the examples'
 * own builders (examples/gan_model.h, mobilenet_model.h, unet_model.h),
 * against the same models written in PyTorch (tests/fixtures/gen_examples.py)
 * with the same weights, loaded by name: one training-mode step each, the
 * outputs, the loss, every parameter's gradient and every running statistic.
 * Narrower than the examples (the fixture stays small), the same code.
 *
 * Tolerances: outputs, losses and running statistics |got - want| <= 1e-5 +
 * 1e-4 |want|; gradients per tensor |got - want| <= 1e-4 (max|want| + |want|),
 * i.e. 1e-4 relative with a floor scaled to the tensor (fr_t_check_grad). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

#include "../examples/gan_model.h"
#include "../examples/mobilenet_model.h"
#include "../examples/unet_model.h"

#define TOL 1e-4
#define FIXTURE "tests/fixtures/examples.safetensors"

/* m's weights and buffers from "<prefix>.<name>" */
static bool load(fr_model *m, fr_st_file *f, const char *prefix) {
    char p[32];
    snprintf(p, sizeof p, "%s.", prefix);
    fr_status st = fr_params_read(m->params, f, FIXTURE, p);
    CHECK_OK(st);
    return st == FR_OK;
}

static double max_abs(const fr_tensor *t) {
    size_t n = (size_t)fr_numel(t);
    float *v = malloc(n * sizeof *v);
    double m = 0;
    if (v && fr_read_f32(t, v, n) == FR_OK)
        for (size_t i = 0; i < n; i++)
            m = fabs(v[i]) > m ? fabs(v[i]) : m;
    free(v);
    return m;
}

/* Every parameter's gradient against "<prefix>_grad.<name>" and every f32
 * buffer (running statistics) against "<prefix>_after.<name>". A gradient
 * that is zero in exact arithmetic (the bias of a BN whose output only
 * reaches the loss through another batch-statistics BN: the mean cancels
 * it) is rounding noise on both sides, ~1e-9 against gradients ~1e-2; such
 * a tensor (PyTorch's below 1e-6 x the largest gradient of the model) must
 * be as small in frugal too, and the others match at TOL. */
static void compare_grads(const fr_model *m, fr_st_file *f, const char *prefix) {
    char key[FR_NAME_MAX + 40];
    int grads = 0;
    double largest = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->params->count; i++) {
            const fr_param *e = &m->params->items[i];
            if (e->kind == FR_PARAMETER) {
                snprintf(key, sizeof key, "%s_grad.%s", prefix, e->name);
                fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
                double w = want ? max_abs(want) : 0;
                if (pass == 0)
                    largest = w > largest ? w : largest;
                else if (w < 1e-6 * largest && e->tensor->grad)
                    CHECK(max_abs(e->tensor->grad) < 1e-6 * largest);
                else
                    fr_t_check_grad(e->tensor->grad, want, TOL, key);
                fr_release(want);
                grads += pass;
            } else if (pass == 1 && e->tensor->dtype == FR_F32) {
                snprintf(key, sizeof key, "%s_after.%s", prefix, e->name);
                fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
                fr_t_allclose_t(e->tensor, want, 1e-5, TOL, key);
                fr_release(want);
            }
        }
    CHECK(grads > 0);
}

/* The rest of a training step from the model's output `out`: its loss by
 * the model's own (fr_model_loss: cross-entropy, or m->loss), backward,
 * then out, the loss and every gradient against "<prefix>_<out_name>",
 * "<prefix>_loss" and the rest of the fixture. */
static void check_step(fr_model *m, fr_st_file *f, const char *prefix, const char *out_name,
                       fr_tensor *out, fr_tensor *x, fr_tensor *labels) {
    fr_t_fixture_expect(f, prefix, out_name, out, 1e-5, TOL);
    fr_tensor *loss = out ? fr_model_loss(m, out, x, labels) : NULL;
    CHECK_NOTNULL(loss);
    fr_t_fixture_expect(f, prefix, "loss", loss, 1e-5, TOL);
    CHECK_OK(fr_backward(loss));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    compare_grads(m, f, prefix);
    fr_release(loss);
}

/* G(z), D(real), D(G(z)) (not detached, so D's backward reaches G),
 * BCEWithLogits(D(real), 1) + BCEWithLogits(D(fake), 0), one backward. */
static void test_dcgan_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("examples");
    fr_model *g = gan_generator_new(1, 8, 4), *d = gan_discriminator_new(2, 4);
    CHECK_NOTNULL(g);
    CHECK_NOTNULL(d);
    if (f && g && d && load(g, f, "gan.g") && load(d, f, "gan.d")) {
        fr_tensor *z = fr_t_fixture_tensor(f, "gan_z", FR_CPU);
        fr_tensor *real = fr_t_fixture_tensor(f, "gan_real", FR_CPU);
        fr_tensor *ones = gan_targets(4, 1.0f), *zeros = gan_targets(4, 0.0f);
        fr_tensor *fake = fr_model_forward(g, z, true);
        fr_tensor *lr = fr_model_forward(d, real, true);
        fr_tensor *lf = fake ? fr_model_forward(d, fake, true) : NULL;
        CHECK_NOTNULL(lf);
        fr_t_fixture_expect(f, "gan", "fake", fake, 1e-5, TOL);
        fr_t_fixture_expect(f, "gan", "logits_real", lr, 1e-5, TOL);
        fr_t_fixture_expect(f, "gan", "logits_fake", lf, 1e-5, TOL);
        fr_tensor *a = lr ? fr_bce_with_logits_loss(lr, ones) : NULL;
        fr_tensor *b = lf ? fr_bce_with_logits_loss(lf, zeros) : NULL;
        fr_tensor *loss = a && b ? fr_add(a, b) : NULL;
        CHECK_NOTNULL(loss);
        fr_t_fixture_expect(f, "gan", "loss", loss, 1e-5, TOL);
        CHECK_OK(fr_backward(loss));
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
        compare_grads(g, f, "gan.g");
        compare_grads(d, f, "gan.d");
        fr_release(loss);
        fr_release(a);
        fr_release(b);
        fr_release(lf);
        fr_release(lr);
        fr_release(fake);
        fr_release(ones);
        fr_release(zeros);
        fr_release(real);
        fr_release(z);
    }
    fr_tape_clear();
    fr_model_free(g);
    fr_model_free(d);
    fr_st_close(f);
}

/* Eval forward (running statistics, no_grad), then a training step with
 * cross-entropy: squeeze-excitation, depthwise convs, SiLU and hardswish. */
static void test_mobilenet_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("examples");
    fr_model *m = mobilenet_create_opts("mobilenet_se", 3, 10, 1, 8, 0.0f);
    CHECK_NOTNULL(m);
    if (f && m && load(m, f, "mobilenet")) {
        fr_tensor *x = fr_t_fixture_tensor(f, "mobilenet_input", FR_CPU);
        fr_tensor *labels = fr_t_fixture_tensor(f, "mobilenet_labels", FR_CPU);
        fr_no_grad_enter();
        fr_tensor *logits = fr_model_forward(m, x, false);
        fr_no_grad_exit();
        fr_t_fixture_expect(f, "mobilenet", "logits_eval", logits, 1e-5, TOL);
        fr_release(logits);
        logits = fr_model_forward(m, x, true);
        check_step(m, f, "mobilenet", "logits_train", logits, x, labels);
        fr_release(logits);
        fr_release(labels);
        fr_release(x);
    }
    fr_tape_clear();
    fr_model_free(m);
    fr_st_close(f);
}

/* The model's own noise (replayed in Python), GroupNorm + SiLU, max pool,
 * bilinear upsampling, skip concatenation; the loss callback's MSE against
 * the clean input. */
static void test_unet_matches_pytorch(void) {
    fr_st_file *f = fr_t_fixture("examples");
    fr_model *m = unet_create_width("unet", 1, 10, 1, 4);
    CHECK_NOTNULL(m);
    if (f && m && load(m, f, "unet")) {
        fr_tensor *x = fr_t_fixture_tensor(f, "unet_input", FR_CPU);
        fr_tensor *noisy = unet_add_noise(x, true);
        fr_t_fixture_expect(f, "unet", "noisy", noisy, 1e-6, 1e-6);
        fr_tensor *out = fr_model_forward(m, x, true);
        check_step(m, f, "unet", "output", out, x, NULL);
        fr_release(out);
        fr_release(noisy);
        fr_release(x);
    }
    fr_tape_clear();
    fr_model_free(m);
    fr_st_close(f);
}

int main(void) {
    RUN(test_dcgan_matches_pytorch);
    RUN(test_mobilenet_matches_pytorch);
    RUN(test_unet_matches_pytorch);
    return TEST_SUMMARY();
}
