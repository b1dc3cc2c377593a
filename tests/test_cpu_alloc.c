/* test_cpu_alloc.c: the CPU caching allocator (cpu/allocator.c) through the
 * public memory API: freed blocks are reused without a system allocation
 * (also over the training steps of a small ResNet, for every block of any
 * size), reserved bytes cover allocated ones, empty_cache gives cached
 * blocks back, and the ledger still counts requested bytes exactly. Under
 * AddressSanitizer the cache is off (so use-after-free stays detectable) and
 * the reuse tests skip. */
#include <stdlib.h>
#include <string.h>

#include "train/optim.h"
#include "models/resnet.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define NEED_CACHE() SKIP("the CPU cache is off under AddressSanitizer")
#else
#define NEED_CACHE() (void)0
#endif

static fr_mem_stats cpu_stats(void) {
    fr_mem_stats s;
    fr_mem_get_stats(FR_CPU, &s);
    return s;
}

static void test_reuse_without_system_allocation(void) {
    NEED_CACHE();
    static const size_t sizes[] = {0, 100, 4096, 4097, 300000, (size_t)5 << 20, (size_t)33 << 20};
    fr_t_check_allocator_reuse(FR_CPU, sizes, (int)(sizeof sizes / sizeof *sizes), 10);
}

/* empty_cache gives every cached block back; blocks in use stay. The ledger
 * counts the requested bytes, whatever the cache holds. */
static void test_empty_cache(void) {
    void *held = fr_mem_alloc(FR_CPU, (size_t)3 << 20, FR_TAG_TRANSIENT);
    void *cached = fr_mem_alloc(FR_CPU, (size_t)7 << 20, FR_TAG_TRANSIENT);
    CHECK(held && cached);
    size_t in_use = cpu_stats().total_current;
    fr_mem_free(FR_CPU, cached, (size_t)7 << 20, FR_TAG_TRANSIENT);
    CHECK(cpu_stats().total_current == in_use - ((size_t)7 << 20));
    fr_mem_empty_cache();
    fr_mem_stats s = cpu_stats();
    CHECK(s.reserved >= ((size_t)3 << 20));
    CHECK(s.reserved < ((size_t)7 << 20)); /* the freed 7 MiB are gone */
    size_t mallocs = s.device_mallocs;
    cached = fr_mem_alloc(FR_CPU, (size_t)7 << 20, FR_TAG_TRANSIENT); /* a fresh block */
    CHECK_NOTNULL(cached);
    CHECK(cpu_stats().device_mallocs == mallocs + 1);
    fr_mem_free(FR_CPU, cached, (size_t)7 << 20, FR_TAG_TRANSIENT);
    fr_mem_free(FR_CPU, held, (size_t)3 << 20, FR_TAG_TRANSIENT);
    fr_mem_empty_cache();
}

/* Training steps of a small ResNet (batch 8, 16x16): once two steps have run,
 * every later step is served from the cache: no system allocation for any
 * block, activation-sized or not. (The first step's optimizer update creates
 * the momentum buffers from blocks the activations had just freed, so the
 * second step still takes a few new blocks, 19 here.) */
static void test_resnet_steps_need_no_system_allocation(void) {
    NEED_CACHE();
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 1);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9,
                                                           .weight_decay = 5e-4});
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 3, 16, 16), 1400);
    int32_t lab[8] = {1, 3, 5, 7, 0, 2, 4, 6};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA, lab);
    CHECK(opt && x && y);
    size_t after_first = 0; /* system allocations after step 1 */
    for (int step = 0; step < 5 && opt && x && y; step++) {
        if (isnan(fr_t_train_step(m, opt, x, y)))
            break;
        fr_mem_stats s = cpu_stats();
        CHECK(s.reserved >= s.total_current);
        if (step == 1)
            after_first = s.device_mallocs;
        else if (step > 1 && s.device_mallocs != after_first) {
            fprintf(stderr, "    step %d: %zu system allocations since the second step\n", step,
                    s.device_mallocs - after_first);
            fr_t_failed_now = 1;
        }
    }
    fr_tape_clear();
    fr_release(x);
    fr_release(y);
    fr_optim_free(opt);
    fr_model_free(m);
}

int main(void) {
    RUN(test_reuse_without_system_allocation);
    RUN(test_empty_cache);
    RUN(test_resnet_steps_need_no_system_allocation);
    return TEST_SUMMARY();
}
