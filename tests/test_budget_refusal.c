/* test_budget_refusal.c: when no plan holds a memory budget, the refusal
 * says what would (issue 22). Two models whose whole step needs more than
 * the planner's measurements of its parts, made so on purpose:
 *  - "growing": a block whose forward takes a workspace one MiB larger at
 *    every call, so each whole trial step the planner verifies its layout
 *    with passes what the profile measured, round after round: the planner
 *    refuses with FR_ERR_ARG naming the model, the budget and the least a
 *    measured layout needed (plan.min_budget keeps it). On the parent the
 *    cap stopped every round and the message named no budget;
 *  - "spiky": a block that takes 4 MiB of workspace only in the training
 *    phase (fr_mem_phase), which planning never sees: `train
 *    --memory-budget` plans, verifies, and its first training step passes
 *    the budget: a non-zero exit whose message names the phase, the step,
 *    the tag holding most at the peak and the smallest budget found. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "planner/planner.h"
#include "programs/programs.h"

enum { GROW_FLOATS = 1 << 18, SPIKE_FLOATS = 1 << 20 };

static int64_t grow_calls;

static fr_tensor *grow_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)self, (void)run;
    fr_tensor *ws = fr_empty(fr_device_of(x), FR_F32, 1, FR_SHAPE(++grow_calls * GROW_FLOATS), FR_TAG_WORKSPACE);
    if (!ws)
        return NULL;
    fr_release(ws);
    return fr_relu(x);
}

static fr_tensor *spike_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)self, (void)run;
    const char *phase = fr_mem_phase();
    if (phase && !strcmp(phase, "training")) {
        fr_tensor *ws = fr_empty(fr_device_of(x), FR_F32, 1, FR_SHAPE(SPIKE_FLOATS), FR_TAG_WORKSPACE);
        if (!ws)
            return NULL;
        fr_release(ws);
    }
    return fr_relu(x);
}

/* conv-BN-ReLU, the odd block, conv-BN-ReLU, global pool, linear */
static fr_model *odd_model(const char *name, int in_channels, int num_classes, uint64_t seed,
                           fr_block_fn odd) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "c1", (fr_conv2d_opts){.in = in_channels, .out = 8});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_block_new(net, "odd", odd, 0);
    fr_conv2d_new(net, "c2", (fr_conv2d_opts){.in = 8, .out = 8});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 8, .out = num_classes});
    return fr_model_finish(m);
}

static fr_model *spiky_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    return odd_model(name, in_channels, num_classes, seed, spike_forward);
}

static void test_no_plan_holds_names_a_budget(void) {
    fr_model *m = odd_model("growing", 3, 10, 1, grow_forward);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 8, 8), 2);
    fr_tensor *y = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA);
    fr_plan_options o = {.max_accum = 1};
    fr_memory_plan plan;
    /* the profile, measured without a cap (and cached); then a budget of
     * what its whole step measured, which the next whole step passes */
    CHECK_OK(fr_plan_memory(m, x->shape, SIZE_MAX / 2, &o, &plan));
    size_t budget = (size_t)plan.verified_peak;
    fr_memory_plan_free(&plan);
    CHECK_ERR(fr_plan_memory(m, x->shape, budget, &o, &plan), FR_ERR_ARG, "growing: no plan holds");
    char want[64];
    snprintf(want, sizeof want, "(%zu bytes)", budget);
    CHECK(strstr(fr_last_error(), want) != NULL);
    CHECK(strstr(fr_last_error(), "give at least that") != NULL);
    /* the least a measured layout needed: named, above the budget, kept */
    CHECK(plan.min_budget > (double)budget);
    snprintf(want, sizeof want, "(%.0f bytes); give at least that", plan.min_budget);
    CHECK(strstr(fr_last_error(), want) != NULL);
    printf("    %s\n", fr_last_error());
    CHECK(plan.units == NULL);
    fr_release(x);
    fr_release(y);
    fr_model_free(m);
}

/* A CIFAR-100 binary file of n records (coarse label, fine label, 3x32x32
 * pixels) whose fine label follows the record. */
static void write_cifar100(const char *dir, const char *file, int n) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    CHECK_NOTNULL(f);
    if (!f)
        return;
    for (int i = 0; i < n; i++) {
        fputc(0, f);
        fputc(i % 4, f);
        for (int p = 0; p < 3 * 32 * 32; p++)
            fputc((p * 13 + i * 7) & 255, f);
    }
    fclose(f);
}

static void test_train_refuses_a_step_past_the_budget(void) {
    const char *dir = fr_t_make_tmpdir("refusal");
    write_cifar100(dir, "train.bin", 32);
    write_cifar100(dir, "test.bin", 8);
    char line[1024];
    snprintf(line, sizeof line, "train --model spiky --data cifar100:%s --batch 8 --epochs 1 --threads 1 "
             "--memory-budget 3M", dir);
    int rc = fr_t_run_main(fr_train_main, line);
    CHECK(rc != 0);
    CHECK(fr_last_status() == FR_ERR_OOM);
    const char *e = fr_last_error();
    printf("    %s\n", e);
    CHECK(strstr(e, "spiky: the memory plan did not hold during training step 1") != NULL);
    CHECK(strstr(e, "past the --memory-budget of 3145728") != NULL);
    CHECK(strstr(e, "workspace") != NULL);
    /* the least budget known to hold: this step's peak */
    const char *at = strstr(e, "peaked at ");
    size_t peak = at ? strtoull(at + 10, NULL, 10) : 0;
    char want[96], b[32];
    snprintf(want, sizeof want, "the least budget known to hold batch 8 is %s",
             fr_mem_format_bytes(peak, b, sizeof b));
    CHECK(peak > 3145728 && strstr(e, want) != NULL);
    fr_clear_error();
    fr_t_remove_tmpdir(dir);
}

int main(void) {
    RUN(test_no_plan_holds_names_a_budget);
    CHECK_OK(fr_model_register("spiky", false, spiky_create, "spiky (a test model)"));
    RUN(test_train_refuses_a_step_past_the_budget);
    return TEST_SUMMARY();
}
