/* test_examples.c: the example models, built by the examples' own builders
 * (examples/mobilenet_model.h, examples/unet_model.h), under every function-preserving memory
 * strategy: the same loss, gradients and running statistics as plain, bit
 * for bit, with no more saved bytes (fewer under checkpointing). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

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
    /* abn is refused (a block's input is read again by its residual add) */
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

int main(void) {
    RUN(test_mobilenet_strategies_equal_plain);
    RUN(test_mobilenet_saved_bytes_targets);
    RUN(test_unet_strategies_equal_plain);
    return TEST_SUMMARY();
}
