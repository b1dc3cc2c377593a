/* cpu/allocator.h: the CPU caching allocator behind fr_mem_alloc (the twin of
 * cuda/allocator.cu). Internal: tensor/memory.c is its only caller, and the
 * ledger counts requested bytes above it, so caching never changes a
 * ledger figure. The cache is bounded (cpu/allocator.c says how). */
#ifndef FR_CPU_ALLOCATOR_H
#define FR_CPU_ALLOCATOR_H

#include "../tensor/cache_policy.h"
#include "../tensor/fr_base.h"

/* `reserved` stays within FR_CACHE_RESERVE_PCT percent of the peak of
 * requested bytes since the last fr_cpu_reset_peak (plus the rounding of
 * blocks in use to 64 bytes or a page), and never passes fr_cpu_set_limit's
 * cap: the rule of tensor/cache_policy.h, shared with the CUDA allocator. */
/* Requests from this size up take whole pages of mmap'd memory, cut from
 * and joined with cached pieces (and given back with munmap); smaller ones
 * come from malloc, rounded up to 64 bytes. */
#define FR_CPU_MMAP_MIN ((size_t)256 << 10)

/* A 64-byte aligned block of at least nbytes (a unique pointer for 0), from
 * the cache when a freed block of its size (small) or a cached piece that
 * holds it (large) is there, else from the system after giving back cached
 * blocks over the bound or the limit (and emptying the cache once if the
 * system refuses). NULL when the system refuses, or with *over_limit set
 * when the block would take `reserved` past fr_cpu_set_limit's cap even
 * with the cache emptied; sets no error (the caller does). */
void *fr_cpu_alloc(size_t nbytes, bool *over_limit);
/* Returns a block fr_cpu_alloc(nbytes) gave to the cache. */
void fr_cpu_free(void *ptr, size_t nbytes);
/* Returns every cached block to the system. */
void fr_cpu_empty_cache(void);
/* Starts a new peak at the bytes in use now and gives back cached blocks
 * over the bound it sets; the peak of reserved bytes restarts too. */
void fr_cpu_reset_peak(void);
/* A cap on reserved bytes (0 = none): cached blocks over it are given back,
 * none is kept that would pass it, and a request that would pass it with
 * the cache empty fails (fr_cpu_alloc's *over_limit). */
void fr_cpu_set_limit(size_t max_bytes);

typedef struct {
    size_t reserved;      /* held from the system: blocks in use (rounded size) + cached */
    size_t reserved_peak; /* highest `reserved` since the last fr_cpu_reset_peak */
    size_t cached;        /* of which free, kept for reuse */
    size_t system_allocs; /* mmap, mremap and posix_memalign calls since the start */
} fr_cpu_cache;
void fr_cpu_cache_info(fr_cpu_cache *out);
/* Reserved bytes and system allocations (fr_cpu_cache_info's). */
void fr_cpu_cache_stats(size_t *reserved, size_t *system_allocs);

#endif
