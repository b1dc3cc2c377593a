/* cache_policy.h: the one rule of frugal's two caching allocators, the CPU's
 * (cpu/allocator.c) and the GPU's (cuda/allocator.cu): how many bytes a cache
 * may hold from the system, what it gives back before it takes more, and
 * when a --memory-limit refuses (docs/ARCHITECTURE.md, "Memory: the bounded
 * CPU cache"; issue 22: the process must hold what the ledger says, within
 * 15%, on a GPU as on the CPU). Pure functions of byte counts, so the rule
 * is tested on any machine (tests/test_cache_policy.c), and the CUDA
 * allocator that applies it is tested without a GPU
 * (tests/test_cuda_alloc_host.c). Internal: not installed; header-only so
 * that the CUDA backend, a separate shared object, compiles it in too. */
#ifndef FR_CACHE_POLICY_H
#define FR_CACHE_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes held from the system (`reserved`: blocks in use at their rounded
 * size, and cached ones) stay within this percentage of the ledger's peak
 * of requested bytes since its last reset, except by the rounding of blocks
 * in use, and never pass a limit. */
#define FR_CACHE_RESERVE_PCT 115

/* The peak to give for a request outside the ledger (the CUDA allocator's
 * own cuBLAS workspace): no bound but the limit. */
#define FR_CACHE_NO_LEDGER SIZE_MAX

/* The most bytes a cache may hold: FR_CACHE_RESERVE_PCT percent of `peak`
 * (the ledger's peak since its last reset, counting the request being
 * served), capped by `limit` (0: none). Without overflow: a peak too large
 * for it (FR_CACHE_NO_LEDGER) is no bound. */
static inline size_t fr_cache_bound(size_t peak, size_t limit) {
    size_t whole = peak / 100, part = peak % 100;
    size_t b = whole > (SIZE_MAX - 100) / FR_CACHE_RESERVE_PCT
                   ? SIZE_MAX
                   : whole * FR_CACHE_RESERVE_PCT + part * FR_CACHE_RESERVE_PCT / 100;
    return limit && limit < b ? limit : b;
}

/* Cached bytes to give back before `grow` more bytes are taken from the
 * system, with `reserved` held of which `cached` are free: enough to bring
 * reserved + grow within `bound`, and never more than is cached (blocks in
 * use cannot be given back). */
static inline size_t fr_cache_release(size_t reserved, size_t cached, size_t grow, size_t bound) {
    size_t want = reserved + grow > bound ? reserved + grow - bound : 0;
    return want < cached ? want : cached;
}

/* Whether taking `grow` more bytes must be refused: it would take
 * `reserved` (after the cache gave back what it could) past `limit` (0:
 * none), as a device of that size could not hold it either. */
static inline bool fr_cache_refuse(size_t reserved, size_t grow, size_t limit) {
    return limit && reserved + grow > limit;
}

/* The bytes to take from the system for a block of `size` bytes (already
 * rounded) when the allocator's usual unit is `unit` bytes (the CUDA
 * allocator's 2 MiB segments of small blocks, large ones rounded up to
 * 2 MiB): the unit when it fits within `bound` with `reserved` held, else
 * just the block. So a small ledger
 * (a test, a tiny budget) is not held in 2 MiB pieces, while a large one
 * still gets the few big segments that keep cudaMalloc out of the steps. */
static inline size_t fr_cache_unit(size_t size, size_t unit, size_t reserved, size_t bound) {
    return unit > size && reserved + unit <= bound ? unit : size;
}

#endif
