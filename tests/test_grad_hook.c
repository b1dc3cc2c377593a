/* test_grad_hook.c: the tape's gradient-ready hook (fr_set_grad_ready_hook,
 * autograd/autograd.h), which data parallelism (dist/) uses to all-reduce a
 * bucket as soon as its gradients are final: every leaf is reported exactly
 * once, after its last contribution, with and without a checkpointed
 * segment between its uses. Split from test_dist.c; needs no MPI. */
#include <string.h>

#include "testlib.h"

typedef struct {
    fr_tensor *leaves[4];
    float at_report[4][8];
    int reports[4];
    int n;
} hook_log;

static fr_status log_ready(fr_tensor *leaf, void *ctx) {
    hook_log *h = ctx;
    for (int i = 0; i < h->n; i++)
        if (h->leaves[i] == leaf) {
            h->reports[i]++;
            if (leaf->grad)
                memcpy(h->at_report[i], fr_data_f32(leaf->grad), (size_t)fr_numel(leaf) * sizeof(float));
        }
    return FR_OK;
}

/* ctx holds a pointer to the weight (fr_checkpoint copies the ctx bytes) */
static fr_tensor *segment(void *ctx, fr_tensor *x) {
    fr_tensor *w = *(fr_tensor **)ctx;
    fr_tensor *a = fr_mul(x, w), *b = fr_relu(a);
    fr_release(a);
    return b;
}

static void check_hook(bool checkpointed) {
    /* w is used twice (early and late), v once, u inside the checkpointed
     * segment when asked */
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 1), *v = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 2);
    fr_tensor *u = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 3), *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 4);
    fr_set_requires_grad(w, true);
    fr_set_requires_grad(v, true);
    fr_set_requires_grad(u, true);
    hook_log h = {.leaves = {w, v, u}, .n = 3};
    fr_set_grad_ready_hook(log_ready, &h);
    fr_tensor *a = fr_mul(x, w);
    fr_tensor *b = checkpointed ? fr_checkpoint(segment, &u, sizeof u, a) : segment(&u, a);
    fr_tensor *c = fr_mul(b, v), *d = fr_mul(c, w), *l = fr_sum(d);
    CHECK_OK(fr_backward(l));
    fr_set_grad_ready_hook(NULL, NULL);
    for (int i = 0; i < 3; i++) {
        CHECK(h.reports[i] == 1);
        CHECK(h.leaves[i]->grad && !memcmp(h.at_report[i], fr_data_f32(h.leaves[i]->grad), 8 * sizeof(float)));
    }
    fr_tensor *all[] = {a, b, c, d, l, w, v, u, x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        fr_zero_grad(all[i]);
        fr_release(all[i]);
    }
}

static void test_grad_ready_hook(void) { check_hook(false); }
static void test_grad_ready_hook_checkpoint(void) { check_hook(true); }

int main(void) {
    RUN(test_grad_ready_hook);
    RUN(test_grad_ready_hook_checkpoint);
    return TEST_SUMMARY();
}
