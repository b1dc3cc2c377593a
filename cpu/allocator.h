/* cpu/allocator.h: the CPU caching allocator behind fr_mem_alloc (the twin of
 * cuda/allocator.cu). Internal: tensor/memory.c is its only caller, and the
 * ledger counts requested bytes above it, so caching never changes a
 * ledger figure. */
#ifndef FR_CPU_ALLOCATOR_H
#define FR_CPU_ALLOCATOR_H

#include "../tensor/fr_base.h"

/* A 64-byte aligned block of at least nbytes (a unique pointer for 0), from
 * the cache when a freed block of the same size class is there, else from
 * the system (after emptying the cache once if the system refuses). NULL
 * when the system refuses; sets no error (the caller does). */
void *fr_cpu_alloc(size_t nbytes);
/* Returns a block fr_cpu_alloc(nbytes) gave to the cache. */
void fr_cpu_free(void *ptr, size_t nbytes);
/* Returns every cached block to the system. */
void fr_cpu_empty_cache(void);
/* Bytes held from the system (blocks in use at their class size, plus
 * cached ones) and system allocations since the start. */
void fr_cpu_cache_stats(size_t *reserved, size_t *system_allocs);

#endif
