/* test_budget_run.c: a memory budget holds for the whole run (issue 22):
 * planning (planner/profile.c's trial steps), training and the evaluation
 * pass, on a device of exactly the budget plus the data set's bytes (the
 * data set shares the CPU; the budget covers the rest). For 8 budgets from
 * the smallest the planner names to plain's peak, on a built-in model
 * (ResNet-20) and a flat chain of layers (docs/MODELS.md section 1), each on
 * a fresh model (a cached profile would skip the trials): the limit is set
 * to budget + data set, and the plan, two training steps and an
 * evaluation pass at the batch planner/fit.c chooses must all succeed, with
 * the ledger's highest total over all of it (recorded by a trace observer,
 * which no reset of the peaks touches) at most that limit. Peaks are the
 * ledger's, exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flat_vgg.h"
#include "testlib.h"
#include "nn/build.h"
#include "planner/planner.h"
#include "train/train.h"

enum { BUDGETS = 8, N = 8 };

static int HW; /* the image's height and width */

static size_t high_water;

static void trace(void *user, fr_device dev, const fr_mem_stats *now) {
    (void)user;
    if (dev == FR_CPU && now->total_current > high_water)
        high_water = now->total_current;
}

static fr_model *make(const char *name) {
    return strcmp(name, "flatvgg") ? fr_model_create(name, 3, 10, 3) : flat_vgg();
}

static fr_tensor *random_tensor(int64_t n, uint64_t seed) {
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    float *h = malloc((size_t)n * 3 * HW * HW * sizeof *h);
    if (!h)
        return NULL;
    for (int64_t i = 0; i < n * 3 * HW * HW; i++)
        h[i] = (float)fr_rng_normal(&rng);
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(n, 3, HW, HW), FR_TAG_DATA, h);
    free(h);
    return t;
}

/* One run under `budget` with the limit at budget + the data set's bytes
 * (`whole`: for the whole run; else for planning only, the steps measured
 * without it); false when anything failed. */
static bool run_under(const char *name, bool whole, size_t budget, size_t data_bytes, fr_tensor *x,
                      fr_tensor *y) {
    fr_model *m = make(name);
    fr_optim *opt = m ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9}) : NULL;
    if (!opt) {
        fr_model_free(m);
        return false;
    }
    fr_plan_options o = {.optim_bytes = fr_plan_optim_bytes(opt)};
    size_t limit = budget + data_bytes;
    high_water = fr_mem_total_current(FR_CPU);
    fr_mem_set_trace(trace, NULL);
    fr_mem_set_limit(FR_CPU, limit);
    fr_memory_plan plan;
    fr_mem_set_phase("planning", 0);
    fr_status st = fr_plan_memory(m, x->shape, budget, &o, &plan);
    size_t planning = high_water;
    CHECK_OK(st);
    CHECK(planning <= limit);
    if (!whole)
        fr_mem_set_limit(FR_CPU, 0);
    high_water = fr_mem_total_current(FR_CPU);
    double loss;
    if (st == FR_OK)
        st = fr_plan_apply(m, &plan);
    for (int i = 0; i < 2 && st == FR_OK; i++) {
        fr_mem_set_phase("training", i + 1);
        st = fr_train_step(m, opt, NULL, x, y, plan.accum, &loss, NULL, NULL);
    }
    fr_mem_set_phase("evaluation", 0);
    int eval_n = 0;
    if (st == FR_OK)
        st = fr_fit_eval_batch(m, x->shape, plan.micro_batch, limit, fr_mem_total_current(FR_CPU), &eval_n,
                               NULL);
    for (int64_t at = 0; st == FR_OK && at < N; at += eval_n) {
        int64_t n = at + eval_n <= N ? eval_n : N - at;
        fr_tensor *part = fr_narrow(x, 0, at, n);
        fr_no_grad_enter();
        fr_tensor *out = part ? fr_model_forward(m, part, false) : NULL;
        fr_no_grad_exit();
        st = out ? FR_OK : fr_last_status();
        fr_release(out);
        fr_release(part);
    }
    fr_mem_set_limit(FR_CPU, 0);
    fr_mem_set_trace(NULL, NULL);
    fr_mem_set_phase(NULL, 0);
    printf("    %s budget %8.2f MiB, limit %8.2f MiB: %s; planning's highest %8.2f MiB; accum %d, "
           "predicted step %.2f MiB (verified %.2f, %d round%s) + data set, highest after planning %8.2f MiB%s; eval "
           "batch %d\n",
           name, (double)budget / 1048576, (double)limit / 1048576, st == FR_OK ? "ok" : fr_last_error(),
           (double)planning / 1048576, plan.accum, plan.predicted_peak / 1048576, plan.verified_peak / 1048576,
           plan.verify_rounds, plan.verify_rounds == 1 ? "" : "s",
           (double)high_water / 1048576, whole ? "" : " (no limit)", eval_n);
    CHECK_OK(st);
    if (whole)
        CHECK(high_water <= limit);
    fr_memory_plan_free(&plan);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_clear_error();
    return st == FR_OK && planning <= limit;
}

static void check_model(const char *name, bool whole, int hw) {
    HW = hw;
    /* the data set: four batches the run holds beside the budget, and the
     * batch it trains on */
    fr_tensor *data = random_tensor(4 * N, 21);
    fr_tensor *x = random_tensor(N, 22);
    int32_t labels[N];
    for (int i = 0; i < N; i++)
        labels[i] = i % 10;
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(N), FR_TAG_DATA, labels);
    CHECK(data && x && y);
    fr_model *m = make(name);
    fr_optim *opt = m ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9}) : NULL;
    CHECK_NOTNULL(opt);
    fr_plan_options o = {.optim_bytes = fr_plan_optim_bytes(opt)};
    /* the smallest budget the planner names (asked with one nothing fits)
     * and plain's peak */
    fr_memory_plan wide;
    CHECK_ERR(fr_plan_memory(m, x->shape, 1, &o, &wide), FR_ERR_ARG, "give at least that");
    double lo = wide.min_budget;
    fr_memory_plan_free(&wide);
    CHECK_OK(fr_plan_memory(m, x->shape, SIZE_MAX / 2, &o, &wide));
    double hi = wide.plain_peak;
    /* an out-of-memory error can name it (issue 22): known to any plan */
    CHECK(wide.min_budget == lo);
    fr_memory_plan_free(&wide);
    fr_optim_free(opt);
    fr_model_free(m);
    size_t data_bytes = fr_nbytes(data);
    for (int i = 0; i < BUDGETS && lo > 0 && lo < hi; i++)
        run_under(name, whole, (size_t)ceil(lo + (hi - lo) * i / (BUDGETS - 1)), data_bytes, x, y);
    fr_release(data);
    fr_release(x);
    fr_release(y);
}

static void test_resnet20(void) { check_model("resnet20", true, 32); }
/* The whole run too: the planner's composed prediction for this flat chain
 * is off by up to +8.4% under recompute (bench/RESULTS.md, issue 22), which
 * took its steps past the limit at 2 of the 8 budgets until the plan was
 * verified by a whole measured step (planner/planner.h). */
static void test_flat_chain(void) { check_model("flatvgg", true, 16); }

int main(void) {
    RUN(test_resnet20);
    RUN(test_flat_chain);
    return TEST_SUMMARY();
}
