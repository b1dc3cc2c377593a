/* test_cuda_alloc.c: the CUDA caching allocator through the public memory
 * API: freed blocks are reused without cudaMalloc (steady state), reserved
 * bytes cover allocated ones, empty_cache returns whole free segments, freed
 * neighbours coalesce, a memory limit and an impossible request both fail
 * with FR_ERR_OOM (no abort) and leave the device usable, and two threads
 * may allocate at once. Exact byte counts follow cuda/allocator.cu's rules:
 * 512-byte rounding, 2 MiB small-pool segments for requests up to 1 MiB,
 * large segments rounded to 2 MiB.
 *
 * Without a GPU (or in a CUDA=0 build) every test skips. */
#include <pthread.h>
#include <stdlib.h>

#include "testlib.h"

#define NEED_CUDA()                      \
    do {                                 \
        if (!fr_t_have_cuda())           \
            SKIP("no CUDA device");      \
    } while (0)

static fr_mem_stats cuda_stats(void) {
    fr_mem_stats s;
    fr_mem_get_stats(FR_CUDA, &s);
    return s;
}

/* Freed blocks are reused: the same sizes again need no cudaMalloc. */
static void test_allocator_reuse(void) {
    NEED_CUDA();
    static const size_t sizes[] = {0, 1000, 4096, 300000, (size_t)5 << 20, (size_t)33 << 20};
    enum { K = sizeof sizes / sizeof *sizes };
    void *p[K];
    for (int i = 0; i < K; i++) /* warm up: the cache now holds these sizes */
        p[i] = fr_mem_alloc(FR_CUDA, sizes[i], FR_TAG_TRANSIENT);
    for (int i = 0; i < K; i++) {
        CHECK_NOTNULL(p[i]);
        fr_mem_free(FR_CUDA, p[i], sizes[i], FR_TAG_TRANSIENT);
    }
    fr_mem_stats before = cuda_stats();
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < K; i++) {
            p[i] = fr_mem_alloc(FR_CUDA, sizes[i], FR_TAG_TRANSIENT);
            CHECK_NOTNULL(p[i]);
        }
        fr_mem_stats now = cuda_stats();
        CHECK(now.reserved >= now.total_current);
        for (int i = 0; i < K; i++)
            fr_mem_free(FR_CUDA, p[i], sizes[i], FR_TAG_TRANSIENT);
    }
    fr_mem_stats after = cuda_stats();
    CHECK(after.device_mallocs == before.device_mallocs);
    CHECK(after.reserved == before.reserved);
    /* two 0-byte requests still get distinct pointers */
    void *a = fr_mem_alloc(FR_CUDA, 0, FR_TAG_TRANSIENT), *b = fr_mem_alloc(FR_CUDA, 0, FR_TAG_TRANSIENT);
    CHECK(a && b && a != b);
    fr_mem_free(FR_CUDA, a, 0, FR_TAG_TRANSIENT);
    fr_mem_free(FR_CUDA, b, 0, FR_TAG_TRANSIENT);
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
    RUN(test_allocator_threads);
    return TEST_SUMMARY();
}
