/* test_examples.c: the example models, built by the examples' own builders
 * (examples/mobilenet_model.h), under every function-preserving memory
 * strategy: the same loss, gradients and running statistics as plain, bit
 * for bit, with no more saved bytes (fewer under checkpointing). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

#include "../examples/mobilenet_model.h"

static void test_mobilenet_strategies_equal_plain(void) {
    fr_model *m = mobilenet_create("mobilenet_se", 3, 10, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 16, 16), 21);
    int32_t lab[2] = {7, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(2), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    /* abn is refused (a block's input is read again by its residual add) */
    static const char *const exact[] = {"inplace", "recompute", "checkpoint", "checkpoint:2",
                                        "recompute+checkpoint", "inplace+recompute+checkpoint:3"};
    fr_t_check_strategies(m, init, x, labels, "plain", exact, (int)(sizeof exact / sizeof *exact),
                          -1, 5);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
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

int main(void) {
    RUN(test_mobilenet_strategies_equal_plain);
    RUN(test_mobilenet_saved_bytes_targets);
    return TEST_SUMMARY();
}
