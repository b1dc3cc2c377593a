/* test_examples.c: the example models, built by the examples' own builders
 * (examples/gan_model.h, mobilenet_model.h, unet_model.h), under every function-preserving memory
 * strategy: the same loss, gradients and running statistics as plain, bit
 * for bit, with no more saved bytes (fewer under checkpointing). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"
#include "frugal.h"

#include "../examples/gan_model.h"
#include "../examples/mobilenet_model.h"
#include "../examples/unet_model.h"

/* Each of strategies[0..n) bit-identical to plain on m, one step on a random
 * batch of 2 images c x hw x hw. */
static void check_exact(fr_model *m, int c, int hw, const char *const *strategies, int n) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, c, hw, hw), 21);
    int32_t lab[2] = {7, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    fr_t_check_strategies(m, init, x, labels, "plain", strategies, n, -1, 5);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
}

static void test_mobilenet_strategies_equal_plain(void) {
    fr_model *m = mobilenet_create("mobilenet_se", 3, 10, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    /* abn is refused (hardswish and SiLU cannot be inverted) */
    static const char *const exact[] = {"recompute", "checkpoint", "checkpoint:2",
                                        "recompute+checkpoint", "recompute+checkpoint:3"};
    check_exact(m, 3, 16, exact, (int)(sizeof exact / sizeof *exact));
    fr_model_free(m);
}

/* The targets for the MobileNet example, in exact ledger bytes at
 * Fashion-MNIST's shape: saved activations under recompute at most 0.6x
 * plain's, under recompute+checkpoint at most 0.25x. */
static void test_mobilenet_saved_bytes_targets(void) {
    fr_model *m = mobilenet_create("mobilenet_se", 1, 10, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    enum { N = 8 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, 1, 28, 28), 22);
    int32_t lab[N] = {0, 1, 2, 3, 4, 5, 6, 7};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(N), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    static const char *const strategies[] = {"plain", "recompute", "recompute+checkpoint"};
    size_t peak[3];
    for (int i = 0; i < 3; i++) {
        fr_manual_seed(5);
        fr_t_step r = fr_t_model_step(m, strategies[i], init, x, labels);
        peak[i] = r.peak_saved;
        fr_t_step_free(&r, m->params->count);
    }
    printf("    mobilenet_se batch %d, 1x28x28: saved peak %zu plain, %zu recompute (%.3fx), "
           "%zu recompute+checkpoint (%.3fx)\n",
           N, peak[0], peak[1], (double)peak[1] / (double)peak[0], peak[2],
           (double)peak[2] / (double)peak[0]);
    CHECK(peak[1] * 10 <= peak[0] * 6);
    CHECK(peak[2] * 4 <= peak[0]);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* The U-Net denoiser (width 4: GroupNorm of one group of 4, skip concats,
 * bilinear upsampling, its loss callback) under every strategy it honours:
 * bit-identical to plain. abn is refused (GroupNorm cannot be inverted);
 * checkpoint too, with a message: the skips cross every stage, so the whole
 * net is one block and there is nothing to cut into segments. */
static void test_unet_strategies_equal_plain(void) {
    fr_model *m = unet_create_width("unet", 1, 10, 4, 4);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    CHECK(m->loss == unet_loss);
    static const char *const exact[] = {"recompute"};
    check_exact(m, 1, 12, exact, (int)(sizeof exact / sizeof *exact));
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 1, 12, 12), 23);
    CHECK_OK(fr_strategy_parse("checkpoint", &m->cfg.strategy));
    fr_tensor *out = fr_model_forward(m, x, true);
    CHECK(out == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "unet: strategy checkpoint cannot apply");
    fr_release(out);
    fr_release(x);
    fr_model_free(m);
}

/* One DCGAN step, G and D under `strategy` from the weights gi, di: G(z),
 * D(real), D(G(z)) (not detached), BCEWithLogits(D(real), 1) +
 * BCEWithLogits(D(fake), 0), one backward into both: the first half of
 * examples/gan.c's step, where its saved bytes peak (G's graph pending
 * while D's runs). The step's peaks are in g's fr_t_step. */
typedef struct {
    fr_t_step g, d;
} gan_run;

static gan_run gan_strategy_step(fr_model *g, fr_model *d, const char *strategy, float **gi,
                                 float **di, fr_tensor *z, fr_tensor *real) {
    CHECK_OK(fr_strategy_parse(strategy, &g->cfg.strategy));
    d->cfg.strategy = g->cfg.strategy;
    fr_t_snapshot_restore(g, gi);
    fr_t_snapshot_restore(d, di);
    int64_t n = z->shape[0];
    fr_tensor *ones = gan_targets(n, 1.0f), *zeros = gan_targets(n, 0.0f);
    fr_mem_reset_peak();
    size_t base = fr_mem_total_current(FR_CPU);
    fr_tensor *fake = fr_model_forward(g, z, true);
    fr_tensor *a = gan_d_loss(d, real, ones);
    fr_tensor *b = fake ? gan_d_loss(d, fake, zeros) : NULL;
    fr_release(fake);
    fr_tensor *loss = a && b ? fr_add(a, b) : NULL;
    fr_release(a);
    fr_release(b);
    CHECK_NOTNULL(loss);
    float l = loss ? fr_item(loss) : NAN;
    CHECK_OK(fr_backward(loss));
    fr_release(loss);
    fr_tape_clear();
    gan_run r = {fr_t_step_capture(g, l), fr_t_step_capture(d, l)};
    r.g.peak_saved = fr_mem_peak(FR_CPU, FR_TAG_SAVED);
    r.g.peak_total = fr_mem_total_peak(FR_CPU) - base;
    fr_params_zero_grad(g->params);
    fr_params_zero_grad(d->params);
    fr_release(ones);
    fr_release(zeros);
    return r;
}

/* The DCGAN example's models (zdim 32, width 32, 1x28x28) at batch 16:
 * recompute, checkpoint and both bit-identical to plain in no more saved
 * bytes; abn (BN + ReLU becomes leaky ReLU 0.01) against abn_reference at
 * 1e-5. Prints each strategy's saved and total peak (docs/MODELS.md's
 * DCGAN row). */
static void test_dcgan_strategies(void) {
    enum { N = 16 };
    fr_model *g = gan_generator_new(1, 32, 32), *d = gan_discriminator_new(2, 32);
    CHECK_NOTNULL(g);
    CHECK_NOTNULL(d);
    if (!g || !d) {
        fr_model_free(g);
        fr_model_free(d);
        return;
    }
    fr_tensor *z = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, 32, 1, 1), 24);
    fr_tensor *real = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, 1, 28, 28), 25);
    float **gi = fr_t_snapshot_save(g), **di = fr_t_snapshot_save(d);
    static const char *const names[] = {"plain", "recompute", "checkpoint", "recompute+checkpoint",
                                        "abn_reference", "abn"};
    enum { K = sizeof names / sizeof *names };
    gan_run r[K];
    /* each twice, the second kept: no row pays for the first gradients or
     * for checkpoint's one-off measuring of its steps */
    for (int i = 0; i < K; i++)
        for (int rep = 0; rep < 2; rep++) {
            if (rep) {
                fr_t_step_free(&r[i].g, g->params->count);
                fr_t_step_free(&r[i].d, d->params->count);
            }
            r[i] = gan_strategy_step(g, d, names[i], gi, di, z, real);
        }
    for (int i = 1; i < K; i++) {
        if (i == K - 2)
            continue; /* abn_reference: abn's function the plain way, not plain's */
        int ref = i == K - 1 ? K - 2 : 0;
        double tol = i == K - 1 ? 1e-5 : -1;
        fr_t_compare_steps(g, &r[ref].g, &r[i].g, tol, names[i]);
        fr_t_compare_steps(d, &r[ref].d, &r[i].d, tol, names[i]);
        CHECK(r[i].g.peak_saved <= r[ref].g.peak_saved);
    }
    for (int i = 0; i < K; i++)
        printf("    dcgan batch %d: %-21s saved peak %8.3f MiB (%.2fx plain), step peak %8.3f MiB\n", N,
               names[i], r[i].g.peak_saved / 1048576.0,
               (double)r[i].g.peak_saved / (double)r[0].g.peak_saved, r[i].g.peak_total / 1048576.0);
    for (int i = 0; i < K; i++) {
        fr_t_step_free(&r[i].g, g->params->count);
        fr_t_step_free(&r[i].d, d->params->count);
    }
    fr_t_snapshot_free(g, gi);
    fr_t_snapshot_free(d, di);
    fr_release(z);
    fr_release(real);
    fr_model_free(g);
    fr_model_free(d);
}

/* validate --save-logits on a model with its own loss (the U-Net, registered
 * as a program would): refused, no file. Its output's first N x classes
 * values had been written as "logits" and exit 0. */
static void test_unet_logits_refused(void) {
    if (access(FR_FASHION_MNIST_DIR, R_OK) != 0)
        SKIP("no Fashion-MNIST at " FR_FASHION_MNIST_DIR);
    CHECK_OK(fr_model_register("unet", false, unet_create, "unet (test)"));
    fr_model *m = unet_create("unet", 1, 10, 1);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    const char *dir = fr_t_make_tmpdir("ulog");
    char path[600], out[600];
    snprintf(path, sizeof path, "%s/unet.safetensors", dir);
    snprintf(out, sizeof out, "%s/logits.safetensors", dir);
    CHECK_OK(fr_state_save(path, m, NULL, NULL, NULL));
    char *argv[] = {"validate", "--checkpoint", path, "--model", "unet", "--limit-test", "8",
                    "--batch", "8", "--threads", "1", "--save-logits", out, NULL};
    int rc = fr_validate_main(13, argv);
    CHECK(rc == 1 && access(out, F_OK) != 0);
    CHECK(strstr(fr_last_error(), "model unet has its own loss") != NULL);
    fr_clear_error();
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

int main(void) {
    RUN(test_dcgan_strategies);
    RUN(test_mobilenet_strategies_equal_plain);
    RUN(test_mobilenet_saved_bytes_targets);
    RUN(test_unet_strategies_equal_plain);
    RUN(test_unet_logits_refused);
    return TEST_SUMMARY();
}
