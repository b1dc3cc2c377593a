/* test_planner_flat.c: why the planner's prediction for a flat chain under
 * recompute is off (issue 22, item 4; bench/RESULTS.md): the interaction
 * planner/profile.c does not see. On a flat VGG chain (conv + norm + ReLU
 * steps) a step under recompute returns a recipe (the norm's output, made
 * again from its input in backward), so the next step's conv keeps that
 * recipe, not the tensor: once the caller drops the output its bytes are
 * gone. The profile feeds each step's lone trial a held tensor made by a
 * plain no_grad run, which the step's conv keeps as it is: so the trial
 * charges the step with holding its input, and the composed prediction keeps
 * every such output to backward. On this chain at batch 8, 16x16, the
 * bytes at stake at the first boundary are exactly the 128 KiB that the
 * "recompute, all kept" layout was predicted over its measured step
 * (1077.6 KiB against 949.6 KiB, bench/RESULTS.md's 04:38 table). This test
 * pins the engine's side of it (both ways of feeding the step), so a planner
 * fix can rely on it; it fails if either changes. */
#include "flat_vgg.h"
#include "testlib.h"
#include "nn/build.h"
#include "nn/module_impl.h"

/* Bytes freed when the caller drops step 0's output after step 1 ran on it:
 * with step 0 run with grad (`chained`, as in a training step) or under
 * no_grad (as the profile makes a step's input). */
static long freed_after_step1(fr_model *m, fr_strategy s, bool chained, long *out_bytes) {
    fr_module *root = m->build->root;
    fr_run run = {.training = true, .strategy = s};
    snprintf(run.model, sizeof run.model, "%s", m->name);
    fr_tensor *x = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(8, 3, 16, 16), FR_TAG_DATA);
    if (!chained)
        fr_no_grad_enter();
    fr_tensor *o1 = x ? fr_seq_run_steps(root, 0, 1, x, &run) : NULL;
    if (!chained)
        fr_no_grad_exit();
    fr_tensor *o2 = o1 ? fr_seq_run_steps(root, 1, 1, o1, &run) : NULL;
    CHECK(o1 && o2);
    *out_bytes = o1 ? (long)fr_nbytes(o1) : 0;
    long before = (long)fr_mem_total_current(FR_CPU);
    fr_release(o1);
    long freed = before - (long)fr_mem_total_current(FR_CPU);
    fr_release(o2);
    fr_release(x);
    fr_tape_clear();
    return freed;
}

static void test_recompute_output_is_a_recipe_the_next_step_keeps(void) {
    fr_model *m = flat_vgg();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_strategy rec = {.recompute = true};
    long bytes = 0;
    /* plain: step 1's conv holds its input either way */
    CHECK(freed_after_step1(m, FR_STRATEGY_PLAIN, true, &bytes) == 0);
    CHECK(freed_after_step1(m, FR_STRATEGY_PLAIN, false, &bytes) == 0);
    /* recompute, chained as in a training step: the output goes (a recipe is kept) */
    CHECK(freed_after_step1(m, rec, true, &bytes) == bytes);
    CHECK(bytes == 8 * 16 * 16 * 16 * 4); /* 128 KiB */
    /* recompute, fed as the profile feeds a step: held */
    CHECK(freed_after_step1(m, rec, false, &bytes) == 0);
    fr_model_free(m);
}

int main(void) {
    RUN(test_recompute_output_is_a_recipe_the_next_step_keeps);
    return TEST_SUMMARY();
}
