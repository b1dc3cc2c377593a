/* test_fit.c: batch sizes chosen from measured bytes (planner/fit.c, planner.h).
 * The evaluation pass under a budget: fr_fit_eval_batch's batch, run for
 * real, peaks within the budget (exact ledger bytes), and a budget that
 * holds the whole batch keeps it. */
#include "testlib.h"
#include "planner/planner.h"
#include "models/resnet.h"

/* Peak bytes above what is in use of a no_grad eval forward of n images. */
static size_t eval_peak(fr_model *m, int n) {
    size_t base = fr_mem_total_current(FR_CPU);
    fr_mem_reset_peak();
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, 3, 16, 16), 5);
    fr_no_grad_enter();
    fr_tensor *y = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    CHECK_NOTNULL(y);
    fr_release(y);
    fr_release(x);
    return fr_mem_total_peak(FR_CPU) - base;
}

static void test_eval_batch_fits_budget(void) {
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    const int64_t shape[4] = {64, 3, 16, 16};
    size_t held = (size_t)1 << 20; /* what the run would hold beside the pass */
    size_t full = eval_peak(m, 64);
    int n = 0;
    double predicted = 0;
    /* a budget for about half the batch */
    size_t budget = held + full / 2;
    CHECK_OK(fr_fit_eval_batch(m, shape, 8, budget, held, &n, &predicted));
    size_t got = eval_peak(m, n);
    fprintf(stderr, "  resnet8 16x16: batch 64 needs %zu B; budget %zu B gives batch %d, measured %zu B "
            "(+%zu held), predicted %.0f B\n", full, budget, n, got, held, predicted);
    CHECK(n >= 8 && n < 64);
    CHECK(held + got <= budget);
    CHECK(predicted <= (double)budget);
    /* a budget that holds the whole batch keeps it */
    CHECK_OK(fr_fit_eval_batch(m, shape, 8, held + full + 4096, held, &n, NULL));
    CHECK(n == 64);
    /* nothing fits: still one image, never 0 */
    CHECK_OK(fr_fit_eval_batch(m, shape, 8, 1, held, &n, NULL));
    CHECK(n == 1);
    fr_model_free(m);
}

int main(void) {
    RUN(test_eval_batch_fits_budget);
    return TEST_SUMMARY();
}
