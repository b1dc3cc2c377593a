/* test_cache_policy.c: the bounded cache's rule (tensor/cache_policy.h),
 * which the CPU allocator and the CUDA one apply, in exact byte counts:
 * the bound is 115% of the ledger's peak (rounded down, no overflow, capped
 * by a limit), the bytes a cache gives back before growing are what brings
 * it within the bound and never more than it caches, a limit refuses growth
 * past it, and the CUDA allocator's segment is its 2 MiB unit only when
 * that fits the bound. tests/test_cuda_alloc_host.c runs the CUDA allocator
 * under the rule with a fake device; test_cpu_alloc.c the CPU's. */
#include "testlib.h"
#include "tensor/cache_policy.h"

#define MIB ((size_t)1 << 20)

static void test_bound(void) {
    CHECK(fr_cache_bound(100, 0) == 115);
    CHECK(fr_cache_bound(199, 0) == 228); /* 1 * 115 + 99 * 115 / 100 = 115 + 113 */
    CHECK(fr_cache_bound(0, 0) == 0);
    CHECK(fr_cache_bound(8 * MIB, 0) == 8 * MIB / 100 * 115 + 8 * MIB % 100 * 115 / 100);
    CHECK(fr_cache_bound(8 * MIB, 5 * MIB) == 5 * MIB);   /* the limit caps it */
    CHECK(fr_cache_bound(8 * MIB, 64 * MIB) < 64 * MIB);  /* a looser limit does not */
    CHECK(fr_cache_bound(FR_CACHE_NO_LEDGER, 0) == SIZE_MAX);
    CHECK(fr_cache_bound(FR_CACHE_NO_LEDGER, 3 * MIB) == 3 * MIB);
    CHECK(fr_cache_bound(SIZE_MAX / 100 * 99, 0) == SIZE_MAX); /* no overflow */
    CHECK(fr_cache_bound(SIZE_MAX / 2, 0) > SIZE_MAX / 2);
}

static void test_release(void) {
    /* 10 MiB held, 6 of them cached, 2 more wanted, bound 9: give back 3 */
    CHECK(fr_cache_release(10 * MIB, 6 * MIB, 2 * MIB, 9 * MIB) == 3 * MIB);
    /* only 1 cached: at most that */
    CHECK(fr_cache_release(10 * MIB, MIB, 2 * MIB, 9 * MIB) == MIB);
    /* within the bound: nothing */
    CHECK(fr_cache_release(4 * MIB, 4 * MIB, 2 * MIB, 9 * MIB) == 0);
    CHECK(fr_cache_release(7 * MIB, 4 * MIB, 2 * MIB, 9 * MIB) == 0);
    /* already over with nothing wanted: the excess */
    CHECK(fr_cache_release(12 * MIB, 5 * MIB, 0, 9 * MIB) == 3 * MIB);
}

static void test_refuse(void) {
    CHECK(!fr_cache_refuse(3 * MIB, MIB, 0));            /* no limit */
    CHECK(!fr_cache_refuse(3 * MIB, MIB, 4 * MIB));      /* exactly the limit */
    CHECK(fr_cache_refuse(3 * MIB, MIB + 1, 4 * MIB));
}

static void test_unit(void) {
    size_t seg = 2 * MIB;
    CHECK(fr_cache_unit(512, seg, 0, 64 * MIB) == seg);          /* room: the pool's unit */
    CHECK(fr_cache_unit(512, seg, 0, 100 << 10) == 512);         /* a small ledger: the block */
    CHECK(fr_cache_unit(512, seg, 63 * MIB, 64 * MIB) == 512);   /* near the bound */
    CHECK(fr_cache_unit(3 * MIB, 4 * MIB, 0, SIZE_MAX) == 4 * MIB); /* large, rounded up */
    CHECK(fr_cache_unit(3 * MIB, 4 * MIB, 2 * MIB, 5 * MIB) == 3 * MIB);
    CHECK(fr_cache_unit(3 * MIB, 2 * MIB, 0, SIZE_MAX) == 3 * MIB); /* never below the block */
}

int main(void) {
    RUN(test_bound);
    RUN(test_release);
    RUN(test_refuse);
    RUN(test_unit);
    return TEST_SUMMARY();
}
