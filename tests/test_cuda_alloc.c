/* test_cuda_alloc.c: the CUDA caching allocator through the public memory
 * API: freed blocks are reused without cudaMalloc (steady state, also over
 * the training steps of a small ResNet), reserved bytes cover allocated ones,
 * empty_cache returns whole free segments, freed neighbours coalesce, a
 * memory limit and an impossible request both fail with FR_ERR_OOM (no
 * abort; the device's refusal comes with the ledger report) and leave the
 * device usable, and two threads may allocate at once. Exact byte counts follow cuda/allocator.cu's rules:
 * 512-byte rounding, 2 MiB small-pool segments for requests up to 1 MiB,
 * large segments rounded to 2 MiB.
 *
 * Without a GPU (or in a CUDA=0 build) every test skips. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "train/optim.h"
#include "models/resnet.h"
#include "testlib.h"

static fr_mem_stats cuda_stats(void) {
    fr_mem_stats s;
    fr_mem_get_stats(FR_CUDA, &s);
    return s;
}

/* Freed blocks are reused: the same sizes again need no cudaMalloc. */
static void test_allocator_reuse(void) {
    NEED_CUDA();
    static const size_t sizes[] = {0, 1000, 4096, 300000, (size_t)5 << 20, (size_t)33 << 20};
    fr_t_check_allocator_reuse(FR_CUDA, sizes, (int)(sizeof sizes / sizeof *sizes), 20);
}

/* Tensors through a training-like loop: after the first step no cudaMalloc. */
static void test_allocator_steady_state(void) {
    NEED_CUDA();
    size_t mallocs = 0;
    for (int step = 0; step < 4; step++) {
        fr_tensor *x = fr_t_rand(FR_CUDA, 2, FR_SHAPE(64, 300), 1300);
        fr_tensor *y = x ? fr_relu(x) : NULL;
        fr_tensor *s = y ? fr_sum(y) : NULL;
        CHECK_NOTNULL(s);
        fr_release(x);
        fr_release(y);
        fr_release(s);
        if (step == 1)
            mallocs = cuda_stats().device_mallocs;
        if (step > 1)
            CHECK(cuda_stats().device_mallocs == mallocs);
    }
}

/* empty_cache gives whole free segments back; freed neighbours coalesce, so a
 * segment carved into small blocks is whole again once they are all freed. */
static void test_allocator_empty_cache_and_coalescing(void) {
    NEED_CUDA();
    /* the cache is bounded by 115% of the ledger's peak (tensor/cache_policy.h):
     * a 32 MiB peak first, so that the 2 MiB segment and the 9 MiB block
     * below stay cached whatever ran before */
    void *high = fr_mem_alloc(FR_CUDA, (size_t)32 << 20, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(high);
    fr_mem_free(FR_CUDA, high, (size_t)32 << 20, FR_TAG_TRANSIENT);
    fr_mem_empty_cache(); /* the small pool now has no free segment */
    fr_mem_stats base = cuda_stats();
    enum { PIECES = 8 };
    const size_t piece = 256 << 10; /* 8 x 256 KiB fill one 2 MiB small segment */
    void *p[PIECES];
    for (int i = 0; i < PIECES; i++) {
        p[i] = fr_mem_alloc(FR_CUDA, piece, FR_TAG_TRANSIENT);
        CHECK_NOTNULL(p[i]);
    }
    fr_mem_stats full = cuda_stats();
    CHECK(full.device_mallocs == base.device_mallocs + 1);
    CHECK(full.reserved == base.reserved + ((size_t)2 << 20));
    for (int i = 0; i < PIECES; i += 2) /* every other block first: no neighbour is free */
        fr_mem_free(FR_CUDA, p[i], piece, FR_TAG_TRANSIENT);
    for (int i = 1; i < PIECES; i += 2)
        fr_mem_free(FR_CUDA, p[i], piece, FR_TAG_TRANSIENT);
    /* only a coalesced block can hold 1 MiB without a new segment */
    void *big = fr_mem_alloc(FR_CUDA, (size_t)1 << 20, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(big);
    CHECK(cuda_stats().device_mallocs == full.device_mallocs);
    fr_mem_free(FR_CUDA, big, (size_t)1 << 20, FR_TAG_TRANSIENT);
    /* a large block held in the cache, then released */
    void *large = fr_mem_alloc(FR_CUDA, (size_t)9 << 20, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(large);
    fr_mem_free(FR_CUDA, large, (size_t)9 << 20, FR_TAG_TRANSIENT);
    CHECK(cuda_stats().reserved >= base.reserved + ((size_t)12 << 20));
    fr_mem_empty_cache();
    CHECK(cuda_stats().reserved == base.reserved);
}

/* A limit set with fr_mem_set_limit, and a request the device cannot hold,
 * both fail with FR_ERR_OOM (no abort), and the device works afterwards. */
static void test_allocator_out_of_memory(void) {
    NEED_CUDA();
    fr_mem_set_limit(FR_CUDA, fr_mem_total_current(FR_CUDA) + 4096);
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CUDA, FR_F32, 1, FR_SHAPE(1 << 20), FR_TAG_TRANSIENT)),
              FR_ERR_OOM, "out of memory");
    fr_mem_set_limit(FR_CUDA, 0);
    size_t mallocs = cuda_stats().device_mallocs;
    /* 1 PiB: cudaMalloc fails, the cache is emptied, the retry fails too */
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CUDA, FR_U8, 1, FR_SHAPE((int64_t)1 << 50), FR_TAG_TRANSIENT)),
              FR_ERR_OOM, "out of memory");
    CHECK(cuda_stats().device_mallocs == mallocs);
    fr_tensor *t = fr_zeros(FR_CUDA, FR_F32, 1, FR_SHAPE(1000), FR_TAG_TRANSIENT);
    CHECK_NOTNULL(t);
    if (t) {
        CHECK_OK(fr_fill_(t, 2.0f));
        CHECK(fr_item(t) == 2.0f);
    }
    fr_release(t);
}

/* Several training steps of a small ResNet (batch 4, 16x16): once the first
 * step has run (every activation, gradient, workspace and the optimizer's
 * momentum allocated once, cuDNN's algorithm searches done), the cache
 * serves every later step without a cudaMalloc. */
static void test_allocator_resnet_steps(void) {
    NEED_CUDA();
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 1);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    CHECK_OK(fr_params_to_device(m->params, FR_CUDA));
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9,
                                                           .weight_decay = 5e-4});
    fr_tensor *x = fr_t_rand(FR_CUDA, 4, FR_SHAPE(4, 3, 16, 16), 1400);
    int32_t lab[4] = {1, 3, 5, 7};
    fr_tensor *y = fr_from_host(FR_CUDA, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    CHECK(opt && x && y);
    size_t after_first = 0;
    float first_loss = 0.0f, last_loss = 0.0f;
    for (int step = 0; step < 6 && opt && x && y; step++) {
        last_loss = fr_t_train_step(m, opt, x, y);
        if (isnan(last_loss))
            break;
        if (step == 0)
            first_loss = last_loss;
        size_t mallocs = cuda_stats().device_mallocs;
        if (step == 0)
            after_first = mallocs;
        else if (mallocs != after_first) {
            fprintf(stderr, "    step %d: %zu cudaMalloc calls since the first step\n", step,
                    mallocs - after_first);
            fr_t_failed_now = 1;
        }
        CHECK(cuda_stats().current[FR_TAG_WORKSPACE] == 0);
    }
    /* the same batch six times: the loss must go down (it is training) */
    CHECK(isfinite(last_loss) && last_loss < first_loss);
    fr_tape_clear();
    fr_release(x);
    fr_release(y);
    fr_optim_free(opt);
    fr_model_free(m);
}

/* A request larger than the device (1 TiB): the cache gives its free
 * segments back and tries once more, then FR_ERR_OOM (no abort) with the
 * ledger's CUDA report in the message: what frugal holds, by tag. */
static void test_allocator_oom_report(void) {
    NEED_CUDA();
    fr_tensor *held = fr_zeros(FR_CUDA, FR_F32, 1, FR_SHAPE(1 << 16), FR_TAG_PARAM);
    CHECK_NOTNULL(held);
    void *cached = fr_mem_alloc(FR_CUDA, (size_t)64 << 20, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(cached);
    fr_mem_free(FR_CUDA, cached, (size_t)64 << 20, FR_TAG_TRANSIENT); /* stays reserved */
    fr_mem_stats before = cuda_stats();
    CHECK(before.reserved >= before.total_current + ((size_t)64 << 20));
    fr_tensor *huge = fr_empty(FR_CUDA, FR_U8, 1, FR_SHAPE((int64_t)1 << 40), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_t_status_of(huge), FR_ERR_OOM, "cannot allocate 1.00 TiB");
    const char *msg = fr_last_error();
    static const char *const needles[] = {"memory on cuda", "parameters", "transient",
                                          "workspace", "256.00 KiB"};
    for (size_t i = 0; i < sizeof needles / sizeof *needles; i++)
        if (!strstr(msg, needles[i])) {
            fprintf(stderr, "    the OOM message lacks \"%s\":\n%s\n", needles[i], msg);
            fr_t_failed_now = 1;
        }
    fr_mem_stats after = cuda_stats();
    CHECK(after.device_mallocs == before.device_mallocs);
    CHECK(after.reserved + ((size_t)64 << 20) <= before.reserved); /* the cache was emptied */
    CHECK(after.total_current == before.total_current);
    /* the device still works */
    CHECK_OK(fr_fill_(held, 1.5f));
    fr_tensor *s = held ? fr_sum(held) : NULL;
    CHECK(s && fr_item(s) == 1.5f * (1 << 16));
    fr_release(s);
    fr_release(held);
}

/* Two threads allocating and freeing at once (the loader thread does). */
static void *alloc_worker(void *arg) {
    uint32_t s = (uint32_t)(uintptr_t)arg;
    enum { LIVE = 8 };
    void *p[LIVE] = {NULL};
    size_t n[LIVE] = {0};
    int *failed = calloc(1, sizeof *failed);
    for (int i = 0; i < 3000; i++) {
        s = s * 1664525u + 1013904223u;
        int slot = (int)((s >> 8) % LIVE);
        if (p[slot]) {
            fr_mem_free(FR_CUDA, p[slot], n[slot], FR_TAG_DATA);
            p[slot] = NULL;
        } else {
            n[slot] = (s >> 12) % 4 == 0 ? (size_t)(s >> 10) % ((size_t)3 << 20) : (s >> 16) % 8192;
            p[slot] = fr_mem_alloc(FR_CUDA, n[slot], FR_TAG_DATA);
            if (!p[slot] && failed)
                *failed = 1;
        }
    }
    for (int i = 0; i < LIVE; i++)
        fr_mem_free(FR_CUDA, p[i], n[i], FR_TAG_DATA);
    return failed;
}

static void test_allocator_threads(void) {
    NEED_CUDA();
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, alloc_worker, (void *)(uintptr_t)(77 + i)) == 0);
    for (int i = 0; i < 2; i++) {
        void *ret = NULL;
        pthread_join(th[i], &ret);
        CHECK(ret && *(int *)ret == 0);
        free(ret);
    }
    fr_mem_stats s = cuda_stats();
    CHECK(s.reserved >= s.total_current);
    fr_mem_empty_cache();
}

int main(void) {
    RUN(test_allocator_reuse);
    RUN(test_allocator_steady_state);
    RUN(test_allocator_empty_cache_and_coalescing);
    RUN(test_allocator_out_of_memory);
    RUN(test_allocator_resnet_steps);
    RUN(test_allocator_oom_report);
    RUN(test_allocator_threads);
    return TEST_SUMMARY();
}
