/* test_cuda_alloc_host.c: the CUDA caching allocator (cuda/allocator.cu)
 * without a GPU. The allocator's source is compiled here as C against a fake
 * CUDA runtime: cudaMalloc hands out host memory from a "device" of a chosen
 * capacity, can be told to fail as a full device does
 * (cudaErrorMemoryAllocation) or as a device left in a sticky error state
 * by a faulting kernel (cudaErrorIllegalAddress, also on cudaFree), and
 * counts every call. So the suite checks on any machine, ASan build
 * included: no two live blocks overlap, the exact block and reserved bytes
 * (512-byte rounding, 2 MiB small segments, large segments rounded to 2 MiB,
 * large remainders split only above 1 MiB), coalescing of freed neighbours,
 * the out-of-memory path (cache returned, one retry, FR_ERR_OOM with the
 * ledger report), and that a sticky error is FR_ERR_CUDA, not out of memory,
 * with the cache left alone; and the bound it shares with the CPU cache
 * (tensor/cache_policy.h): `reserved` within 115% of the ledger's peak, no
 * 2 MiB segments for a small ledger, --memory-limit capping reserved bytes.
 * test_cuda_alloc.c checks the same allocator on a real GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* ---- the fake runtime ---- */

typedef enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorIllegalAddress = 700,
} cudaError_t;

enum { FAKE_MAX_SEGMENTS = 4096 };

static struct {
    size_t capacity, used;          /* bytes of the fake device */
    bool sticky;                    /* every call fails with cudaErrorIllegalAddress */
    size_t mallocs, frees, refused; /* calls */
    void *live[FAKE_MAX_SEGMENTS];
    size_t live_bytes[FAKE_MAX_SEGMENTS];
} fake;

static void fake_reset(size_t capacity) {
    memset(&fake, 0, sizeof fake);
    fake.capacity = capacity;
}

static cudaError_t cudaMalloc(void **p, size_t size) {
    if (fake.sticky)
        return cudaErrorIllegalAddress;
    if (fake.used + size > fake.capacity) {
        fake.refused++;
        return cudaErrorMemoryAllocation;
    }
    for (int i = 0; i < FAKE_MAX_SEGMENTS; i++)
        if (!fake.live[i]) {
            /* 512-aligned like the driver's (at least 256) and the allocator's blocks */
            void *m = aligned_alloc(512, size);
            if (!m)
                return cudaErrorMemoryAllocation;
            fake.live[i] = m;
            fake.live_bytes[i] = size;
            fake.used += size;
            fake.mallocs++;
            *p = m;
            return cudaSuccess;
        }
    return cudaErrorMemoryAllocation;
}

static cudaError_t cudaFree(void *p) {
    if (fake.sticky)
        return cudaErrorIllegalAddress;
    for (int i = 0; i < FAKE_MAX_SEGMENTS; i++)
        if (fake.live[i] == p) {
            free(p);
            fake.live[i] = NULL;
            fake.used -= fake.live_bytes[i];
            fake.frees++;
            return cudaSuccess;
        }
    FR_ASSERT(!"cudaFree of a pointer cudaMalloc did not return");
    return cudaSuccess;
}

/* The sticky error stays; a refusal is not sticky and is cleared here. */
static cudaError_t cudaGetLastError(void) {
    return fake.sticky ? cudaErrorIllegalAddress : cudaSuccess;
}

static const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    default:
        return "an illegal memory access was encountered";
    }
}

/* ---- the allocator, under names of its own ----
 * The core (libfrugal.a) has forwarders named fr_cuda_*, so the allocator's
 * entry points are renamed here; internal.h (the real CUDA headers) is kept
 * out by its include guard, the runtime above stands in for it. */
#define fr_cuda_alloc harness_alloc
#define fr_cuda_free harness_free
#define fr_cuda_empty_cache harness_empty_cache
#define fr_cuda_cache_stats harness_cache_stats
#define fr_cuda_device_count harness_device_count
void *harness_alloc(size_t nbytes, size_t peak, size_t limit, size_t *block_bytes);
void harness_free(void *ptr);
void harness_empty_cache(void);
void harness_cache_stats(size_t *reserved, size_t *device_mallocs);
static int harness_device_count(void) { return 1; }
static cudaError_t fr_cuda_bind_thread(void) { return cudaSuccess; } /* one fake device */
#define FR_CUDA_INTERNAL_H
#include "../cuda/allocator.cu"

/* ---- helpers ---- */

/* A request outside any ledger: the cache unbounded, no limit (what the
 * tests before the bound (issue 22) measure). */
static void *unbounded(size_t nbytes, size_t *block_bytes) {
    return harness_alloc(nbytes, FR_CACHE_NO_LEDGER, 0, block_bytes);
}


static size_t reserved_now(void) {
    size_t r = 0;
    harness_cache_stats(&r, NULL);
    return r;
}

/* Empties the cache and starts a fresh fake device of `capacity` bytes; the
 * allocator must hold nothing at this point. */
static void fresh(size_t capacity) {
    fake.sticky = false;
    harness_empty_cache();
    FR_ASSERT(fake.used == 0 && reserved_now() == 0);
    fake_reset(capacity);
}

#define MIB ((size_t)1 << 20)

/* ---- tests ---- */

/* Random allocations and frees: no new block overlaps a live one (checked
 * as intervals against every live block); each block's first and last
 * EDGE bytes are written with its own byte and found intact when it is
 * freed (under ASan, a block reaching past its segment's host memory is
 * caught too); block sizes follow the rounding and split rules exactly;
 * the allocator's reserved bytes are the fake device's; in steady state
 * (the same sizes again) no cudaMalloc happens. */
#define EDGE ((size_t)64)

static void mark(unsigned char *p, size_t n, unsigned char v) {
    memset(p, v, n < EDGE ? n : EDGE);
    if (n > EDGE)
        memset(p + n - EDGE, v, EDGE);
}

static bool marked(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++) {
        if (i == EDGE && n > 2 * EDGE)
            i = n - EDGE;
        if (p[i] != v)
            return false;
    }
    return true;
}

static void test_random_no_overlap_exact_bytes(void) {
    fresh((size_t)1 << 34);
    enum { LIVE = 64, OPS = 40000 };
    unsigned char *p[LIVE] = {NULL};
    size_t got[LIVE] = {0};
    uint32_t s = 12345;
    int bad_size = 0, bad_fill = 0, overlaps = 0;
    for (int op = 0; op < OPS; op++) {
        s = s * 1664525u + 1013904223u;
        int slot = (int)((s >> 8) % LIVE);
        if (p[slot]) {
            bad_fill += !marked(p[slot], got[slot], (unsigned char)slot);
            harness_free(p[slot]);
            p[slot] = NULL;
        } else {
            /* mostly small, some large (up to 9 MiB), some 0 */
            size_t n = (s >> 12) % 8 == 0 ? (size_t)(s >> 9) % (9 * MIB)
                       : (s >> 12) % 8 == 1 ? 0 : (size_t)(s >> 14) % 70000;
            p[slot] = (unsigned char *)unbounded(n, &got[slot]);
            CHECK_NOTNULL(p[slot]);
            if (!p[slot])
                break;
            size_t rounded = round_up(n ? n : 1, 512);
            bool ok = rounded <= SMALL_MAX ? got[slot] == rounded
                                           : got[slot] >= rounded && got[slot] <= rounded + MIB;
            ok = ok && ((uintptr_t)p[slot] & 511) == 0;
            if (!ok && bad_size++ == 0)
                fprintf(stderr, "    %zu bytes: a block of %zu\n", n, got[slot]);
            for (int o = 0; o < LIVE; o++)
                if (o != slot && p[o] && p[o] < p[slot] + got[slot] && p[slot] < p[o] + got[o])
                    overlaps++;
            mark(p[slot], got[slot], (unsigned char)slot);
        }
        if (op % 997 == 0)
            CHECK(reserved_now() == fake.used);
    }
    CHECK(bad_size == 0);
    CHECK(bad_fill == 0);
    CHECK(overlaps == 0);
    CHECK(fake.refused == 0);
    for (int i = 0; i < LIVE; i++)
        harness_free(p[i]);
    /* every block free: the segments are whole again and all go back */
    harness_empty_cache();
    CHECK(fake.used == 0 && reserved_now() == 0);
    CHECK(fake.frees == fake.mallocs);

    /* steady state: the same sizes twice, the second round from the cache */
    static const size_t sizes[] = {0, 1000, 4096, 300000, 5 * MIB, 33 * MIB};
    void *q[6];
    for (int round = 0; round < 2; round++) {
        size_t before = fake.mallocs;
        for (int i = 0; i < 6; i++)
            q[i] = unbounded(sizes[i], NULL);
        for (int i = 0; i < 6; i++)
            harness_free(q[i]);
        if (round == 1)
            CHECK(fake.mallocs == before);
    }
}

/* Exact segment sizes, and coalescing: eight 256 KiB blocks fill one 2 MiB
 * small segment; freed in any order they merge back into one block that
 * holds 1 MiB without a new segment; empty_cache returns it. */
static void test_segments_and_coalescing(void) {
    fresh((size_t)1 << 30);
    size_t got = 0;
    void *large = unbounded(3 * MIB + 1, &got);
    CHECK(large && got == 4 * MIB); /* the rest of its 4 MiB segment, < 1 MiB, is not split off */
    CHECK(fake.mallocs == 1 && fake.used == 4 * MIB && reserved_now() == 4 * MIB);
    void *p[8];
    for (int i = 0; i < 8; i++) {
        p[i] = unbounded(256 << 10, &got);
        CHECK(p[i] && got == (size_t)256 << 10);
    }
    CHECK(fake.mallocs == 2 && fake.used == 6 * MIB);
    for (int i = 1; i < 8; i++) /* adjacent, from the segment's start */
        CHECK((char *)p[i] == (char *)p[0] + (size_t)i * (256 << 10));
    for (int i = 0; i < 8; i += 2) /* every other block first: no free neighbour */
        harness_free(p[i]);
    for (int i = 1; i < 8; i += 2)
        harness_free(p[i]);
    void *big = unbounded(MIB, &got);
    CHECK(big == p[0] && got == MIB);
    CHECK(fake.mallocs == 2);
    harness_free(big);
    harness_free(large);
    harness_empty_cache();
    CHECK(fake.used == 0 && reserved_now() == 0 && fake.frees == 2);
}

/* A full device: the cache's free segments go back and the request is tried
 * once more, which succeeds when that made room; a request that cannot fit
 * either way is FR_ERR_OOM naming the size. */
static void test_out_of_memory_path(void) {
    fresh(8 * MIB);
    void *a = unbounded(4 * MIB, NULL); /* a 4 MiB large segment, then cached */
    CHECK_NOTNULL(a);
    harness_free(a);
    CHECK(reserved_now() == 4 * MIB);
    void *b = unbounded(6 * MIB, NULL); /* 4 + 6 > 8: refused, cache emptied, retried */
    CHECK_NOTNULL(b);
    CHECK(fake.refused == 1 && fake.frees == 1 && reserved_now() == 6 * MIB);
    fr_clear_error();
    void *c = unbounded(4 * MIB, NULL); /* 6 + 4 > 8, nothing cached to return */
    CHECK(c == NULL);
    CHECK(fr_last_status() == FR_ERR_OOM);
    CHECK(strstr(fr_last_error(), "cannot allocate 4.00 MiB") != NULL);
    CHECK(strstr(fr_last_error(), "out of memory, also after returning") != NULL);
    CHECK(fake.refused == 3 && reserved_now() == 6 * MIB);
    harness_free(b);
    harness_free(c);
}

/* A device in a sticky error state (a kernel faulted): cudaMalloc fails with
 * that error. The allocator must report FR_ERR_CUDA naming it, not
 * FR_ERR_OOM (callers shrink and retry on OOM), and must not empty the
 * cache (its cudaFrees fail too, and the blocks would be lost). */
static void test_sticky_error_is_not_oom(void) {
    fresh((size_t)1 << 30);
    void *a = unbounded(4 * MIB, NULL);
    CHECK_NOTNULL(a);
    harness_free(a); /* cached */
    void *small = unbounded(1000, NULL); /* a small segment, in use */
    CHECK_NOTNULL(small);
    size_t reserved = reserved_now(), frees = fake.frees;
    fake.sticky = true;
    fr_clear_error();
    void *b = unbounded(16 * MIB, NULL);
    CHECK(b == NULL);
    CHECK(fr_last_status() == FR_ERR_CUDA);
    CHECK(strstr(fr_last_error(), "illegal memory access") != NULL);
    CHECK(strstr(fr_last_error(), "not out of memory") != NULL);
    CHECK(reserved_now() == reserved && fake.frees == frees);
    /* a cached block still serves a request that fits it: no driver call */
    void *c = unbounded(2 * MIB, NULL);
    CHECK(c == a);
    harness_free(c);
    harness_free(small);
    fake.sticky = false;
    harness_empty_cache();
    CHECK(fake.used == 0 && reserved_now() == 0);
}

/* ---- the bound and the limit (tensor/cache_policy.h; issue 22) ----
 * A ledger as tensor/memory.c keeps it: bytes in use and their peak since
 * a reset, which each request passes with the limit. */
typedef struct {
    size_t in_use, peak, limit;
} ledger;

static void *led_alloc(ledger *l, size_t n) {
    size_t peak = l->in_use + n > l->peak ? l->in_use + n : l->peak;
    void *p = harness_alloc(n, peak, l->limit, NULL);
    if (p) {
        l->in_use += n;
        l->peak = peak;
    }
    return p;
}

static void led_free(ledger *l, void *p, size_t n) {
    harness_free(p);
    l->in_use -= n;
}

/* Eight 1 MiB blocks (small segments), then one 8 MiB block (a large
 * segment), the peak reset each round: `reserved` stays within 115% of the
 * peak at every point (the unbounded cache held both pools' 16 MiB). The
 * pools are separate, so here each round gives segments back and takes new
 * ones (the CPU cache joins pieces instead). A repeated step whose blocks
 * live together, its peak not reset, settles: no cudaMalloc after its
 * first round. */
static void test_cache_bounded_by_the_peak(void) {
    fresh((size_t)1 << 34);
    ledger l = {0};
    int over = 0;
    for (int round = 0; round < 6; round++) {
        l.peak = l.in_use;
        void *p[8];
        for (int i = 0; i < 8; i++) {
            p[i] = led_alloc(&l, MIB);
            over += reserved_now() > fr_cache_bound(l.peak, 0);
        }
        for (int i = 0; i < 8; i++)
            led_free(&l, p[i], MIB);
        void *big = led_alloc(&l, 8 * MIB);
        CHECK_NOTNULL(big);
        over += reserved_now() > fr_cache_bound(l.peak, 0);
        led_free(&l, big, 8 * MIB);
        over += reserved_now() > fr_cache_bound(l.peak, 0);
    }
    printf("    alternating, peak reset each round: %zu cudaMalloc calls in 6 rounds\n", fake.mallocs);
    CHECK(over == 0);
    CHECK(reserved_now() == fake.used);
    fresh((size_t)1 << 34);
    l = (ledger){0};
    size_t after_first = 0;
    for (int round = 0; round < 6; round++) {
        void *p[5];
        for (int i = 0; i < 5; i++) {
            p[i] = led_alloc(&l, i < 4 ? MIB : 8 * MIB);
            over += reserved_now() > fr_cache_bound(l.peak, 0);
        }
        for (int i = 0; i < 5; i++)
            led_free(&l, p[i], i < 4 ? MIB : 8 * MIB);
        if (round == 0)
            after_first = fake.mallocs;
    }
    CHECK(over == 0);
    CHECK(fake.mallocs == after_first);
}

/* A small ledger is not held in 2 MiB segments: ten 10 KiB blocks reserve
 * within 115% of their 100 KiB. */
static void test_small_ledger_small_segments(void) {
    fresh((size_t)1 << 30);
    ledger l = {0};
    void *p[10];
    for (int i = 0; i < 10; i++) {
        p[i] = led_alloc(&l, 10 << 10);
        CHECK_NOTNULL(p[i]);
    }
    CHECK(l.peak == 100 << 10);
    CHECK(reserved_now() <= fr_cache_bound(l.peak, 0));
    for (int i = 0; i < 10; i++)
        led_free(&l, p[i], 10 << 10);
}

/* --memory-limit caps reserved bytes on the GPU too: the fake device never
 * holds more than the limit, and a request whose segment would pass it is
 * FR_ERR_OOM naming the limit, although the ledger's bytes fit. */
static void test_limit_caps_reserved(void) {
    fresh((size_t)1 << 30);
    ledger l = {.limit = 4 * MIB};
    void *a = led_alloc(&l, MIB), *b = led_alloc(&l, MIB);
    void *c = led_alloc(&l, 3 * MIB / 2); /* a large block: its 2 MiB segment still fits */
    CHECK(a && b && c);
    CHECK(fake.used <= l.limit);
    fr_clear_error();
    void *d = led_alloc(&l, MIB / 2); /* ledger 4.0 MiB, within; reserved would be 4.5 MiB */
    CHECK(d == NULL);
    CHECK(fr_last_status() == FR_ERR_OOM);
    CHECK(strstr(fr_last_error(), "limit 4.00 MiB on reserved bytes") != NULL);
    CHECK(fake.used <= l.limit && fake.refused == 0);
    fr_clear_error();
    led_free(&l, a, MIB);
    led_free(&l, b, MIB);
    led_free(&l, c, 3 * MIB / 2);
}

int main(void) {
    RUN(test_random_no_overlap_exact_bytes);
    RUN(test_segments_and_coalescing);
    RUN(test_out_of_memory_path);
    RUN(test_sticky_error_is_not_oom);
    RUN(test_cache_bounded_by_the_peak);
    RUN(test_small_ledger_small_segments);
    RUN(test_limit_caps_reserved);
    return TEST_SUMMARY();
}
