/* allocator.cu: the caching device allocator behind fr_mem_alloc(FR_CUDA).
 *
 * cudaMalloc and cudaFree are slow and synchronise the device, so memory is
 * taken from the driver in segments and carved into blocks that are reused:
 *  - sizes are rounded up to 512 bytes;
 *  - requests up to 1 MiB come from the small pool, whose segments are 2 MiB;
 *    larger ones from the large pool, whose segments are the request rounded
 *    up to 2 MiB;
 *  - free blocks sit in bins by size class (floor(log2(size))); a request
 *    takes the smallest free block that fits (best fit), splitting off the
 *    rest when it is worth keeping (>= 512 B small, > 1 MiB large);
 *  - a freed block merges with free neighbours of its own segment, so a
 *    segment whose blocks are all free becomes one block again;
 *  - fr_cuda_empty_cache returns such whole free segments to the driver.
 * In steady state (the same sizes every step) no cudaMalloc happens at all.
 *
 * The cache is bounded by the CPU allocator's rule (tensor/cache_policy.h;
 * docs/ARCHITECTURE.md, "Memory: the bounded CPU cache"): the ledger gives
 * each request its peak since the last reset and the --memory-limit, and
 *  - before a new segment is taken, whole free segments (largest first) go
 *    back until `reserved` plus the new one is within 115% of that peak;
 *  - a segment is the pool's 2 MiB (or the large request rounded up to
 *    2 MiB) only when that fits the bound, else just the rounded request,
 *    so a small ledger is not held in 2 MiB pieces;
 *  - a request served from the cache while `reserved` is over the bound
 *    (the ledger's peak was reset) gives whole free segments back too, and
 *    a free that leaves a whole segment free while `reserved` is over the
 *    bound gives that segment back;
 *  - under a limit, a segment that would take `reserved` past it once every
 *    whole free segment is back is refused (FR_ERR_OOM), as a device of
 *    that size would refuse it: the limit caps reserved bytes, not only
 *    the ledger.
 * Blocks in use are never moved, so `reserved` can pass the bound by the
 * rounding and the partly used segments of blocks in use.
 *
 * When cudaMalloc refuses (cudaErrorMemoryAllocation), the cache's whole
 * free segments go back to the driver and the request is tried once more; if
 * that fails too the error is FR_ERR_OOM, and its message carries the
 * ledger's CUDA report (in use and peak per tag, reserved bytes), so a user
 * sees what fills the device. Any other cudaMalloc error (a sticky error
 * after a kernel fault) is FR_ERR_CUDA and leaves the cache as it is.
 *
 * Reuse without events is safe because all work runs on the one (legacy
 * default) stream: a block freed while a kernel still reads it can only be
 * written by work enqueued later, which runs after that kernel. cudaFree
 * itself waits for the device.
 *
 * One mutex guards everything: the data loader thread allocates too. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "../tensor/cache_policy.h"

#define ROUND ((size_t)512)
#define SMALL_MAX ((size_t)1 << 20)      /* largest request of the small pool */
#define SMALL_SEGMENT ((size_t)2 << 20)  /* segment size of the small pool */
#define LARGE_ROUND ((size_t)2 << 20)    /* large segments are multiples of this */
#define N_BINS 64

enum { POOL_SMALL = 0, POOL_LARGE, N_POOLS };

typedef struct block {
    char *ptr;
    size_t size;
    int pool;
    bool free;
    struct block *prev, *next;          /* neighbours in the segment, by address */
    struct block *bin_prev, *bin_next;  /* free list of the bin (when free) */
    struct block *hash_next;            /* chain in the live table (when in use) */
} block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *bins[N_POOLS][N_BINS];
static size_t reserved_bytes, n_device_mallocs;
static size_t bound_now = SIZE_MAX; /* the bound of the latest request (cache_policy.h) */
/* Bytes of whole free segments: free blocks with no neighbour, none of
 * whose segment is in use. A block in a bin never gains or loses its
 * neighbours (splits and merges happen outside the bins), so the bins
 * keep the count. */
static size_t whole_free;

/* Blocks in use, found by pointer on free: a chained hash table that doubles
 * when it averages two blocks per bucket. */
static block **table;
static size_t table_size, table_count;

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static int bin_of(size_t size) {
    int b = 0;
    while (size >>= 1)
        b++;
    return b < N_BINS ? b : N_BINS - 1;
}

static size_t hash_of(const void *p, size_t buckets) {
    /* Pointers are 512-aligned: drop the zero bits, then scramble. */
    uint64_t h = ((uint64_t)(uintptr_t)p >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (buckets - 1);
}

/* ---- bins (lock held) ---- */

static void bin_insert(block *b) {
    block **head = &bins[b->pool][bin_of(b->size)];
    whole_free += b->prev || b->next ? 0 : b->size;
    b->bin_prev = NULL;
    b->bin_next = *head;
    if (*head)
        (*head)->bin_prev = b;
    *head = b;
}

static void bin_remove(block *b) {
    block **head = &bins[b->pool][bin_of(b->size)];
    whole_free -= b->prev || b->next ? 0 : b->size;
    if (b->bin_prev)
        b->bin_prev->bin_next = b->bin_next;
    else
        *head = b->bin_next;
    if (b->bin_next)
        b->bin_next->bin_prev = b->bin_prev;
    b->bin_prev = b->bin_next = NULL;
}

/* The smallest free block of `pool` holding `size` bytes, or NULL. Every block
 * in a higher bin is larger than every block in a lower one, so the first bin
 * (from size's own upward) with a fitting block holds the best fit. */
static block *best_fit(int pool, size_t size) {
    for (int bin = bin_of(size); bin < N_BINS; bin++) {
        block *best = NULL;
        for (block *b = bins[pool][bin]; b; b = b->bin_next)
            if (b->size >= size && (!best || b->size < best->size))
                best = b;
        if (best)
            return best;
    }
    return NULL;
}

/* ---- live table (lock held) ---- */

static void table_grow(void) {
    size_t size = table_size ? table_size * 2 : 1024;
    block **t = (block **)calloc(size, sizeof *t);
    if (!t)
        return; /* keep the old table: chains get longer, nothing breaks */
    for (size_t i = 0; i < table_size; i++)
        for (block *b = table[i], *next; b; b = next) {
            next = b->hash_next;
            size_t h = hash_of(b->ptr, size);
            b->hash_next = t[h];
            t[h] = b;
        }
    free(table);
    table = t;
    table_size = size;
}

static bool table_insert(block *b) {
    if (table_count >= table_size * 2)
        table_grow();
    if (!table_size)
        return false;
    size_t h = hash_of(b->ptr, table_size);
    b->hash_next = table[h];
    table[h] = b;
    table_count++;
    return true;
}

static block *table_remove(const void *ptr) {
    if (!table_size)
        return NULL;
    for (block **pb = &table[hash_of(ptr, table_size)]; *pb; pb = &(*pb)->hash_next)
        if ((*pb)->ptr == ptr) {
            block *b = *pb;
            *pb = b->hash_next;
            b->hash_next = NULL;
            table_count--;
            return b;
        }
    return NULL;
}

/* ---- segments (lock held) ---- */

/* Returns one whole free segment to the driver. */
static void release_segment(block *b) {
    bin_remove(b);
    cudaError_t e = cudaFree(b->ptr);
    if (e != cudaSuccess) {
        /* The device is in trouble; forget the segment rather than hand it
         * out again. The next checked call reports the state of the device. */
        (void)cudaGetLastError();
        fr_error(FR_ERR_CUDA, "cuda empty cache: cudaFree: %s", cudaGetErrorString(e));
    }
    reserved_bytes -= b->size;
    free(b);
}

/* Returns whole free segments to the driver, the large pool's first and
 * the largest first in each, until at least `want` bytes went back
 * (SIZE_MAX: all of them). */
static void release_free_segments(size_t want) {
    size_t given = 0;
    for (int pool = N_POOLS - 1; pool >= 0; pool--)
        for (int bin = N_BINS - 1; bin >= 0 && given < want; bin--)
            for (block *b = bins[pool][bin], *next; b && given < want; b = next) {
                next = b->bin_next;
                if (b->prev || b->next)
                    continue; /* part of a segment that is still in use */
                given += b->size;
                release_segment(b);
            }
}

/* A new segment of `size` bytes as one free-to-use block (not in a bin), or
 * NULL with *err set to the driver's answer (cudaSuccess when only the host
 * ran out of memory). */
static block *new_segment(int pool, size_t size, cudaError_t *err) {
    block *b = (block *)calloc(1, sizeof *b);
    *err = cudaSuccess;
    if (!b)
        return NULL;
    void *p = NULL;
    *err = cudaMalloc(&p, size);
    if (*err != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it for later checks */
        free(b);
        return NULL;
    }
    n_device_mallocs++;
    reserved_bytes += size;
    b->ptr = (char *)p;
    b->size = size;
    b->pool = pool;
    return b;
}

/* Splits b so that it keeps `size` bytes; the rest becomes a free block. */
static void split(block *b, size_t size) {
    size_t rest = b->size - size;
    bool worth = b->pool == POOL_SMALL ? rest >= ROUND : rest > SMALL_MAX;
    if (!worth)
        return;
    block *r = (block *)calloc(1, sizeof *r);
    if (!r)
        return; /* the caller just gets a bigger block */
    r->ptr = b->ptr + size;
    r->size = rest;
    r->pool = b->pool;
    r->free = true;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->size = size;
    bin_insert(r);
}

/* Marks a block free, merges it with free neighbours of its segment and
 * files the result in its bin, which it returns. */
static block *give_back(block *b) {
    b->free = true;
    block *next = b->next;
    if (next && next->free) {
        bin_remove(next);
        b->size += next->size;
        b->next = next->next;
        if (b->next)
            b->next->prev = b;
        free(next);
    }
    block *prev = b->prev;
    if (prev && prev->free) {
        bin_remove(prev);
        prev->size += b->size;
        prev->next = b->next;
        if (prev->next)
            prev->next->prev = prev;
        free(b);
        b = prev;
    }
    bin_insert(b);
    return b;
}

/* ---- out of memory ---- */

/* Records FR_ERR_OOM for a request of nbytes that the device refused (`why`),
 * followed by the CUDA part of fr_mem_report. Called without the lock: the
 * report reads the cache's statistics. The message buffer holds 1 KiB, which
 * is why only the CUDA part is appended (about 600 bytes). */
static void report_oom(size_t nbytes, const char *why) {
    char want[32], held[32];
    size_t reserved = 0;
    fr_cuda_cache_stats(&reserved, NULL);
    fr_mem_format_bytes(nbytes, want, sizeof want);
    fr_mem_format_bytes(reserved, held, sizeof held);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        fr_mem_report(f);
        fclose(f); /* text and len are valid from here */
    }
    char *part = text ? strstr(text, "memory on cuda") : NULL;
    if (part && len && text[len - 1] == '\n')
        text[len - 1] = '\0';
    fr_error(FR_ERR_OOM,
             "cuda: out of memory: cannot allocate %s (%zu bytes; frugal's cache holds %s "
             "reserved): %s\n%s",
             want, nbytes, held, why,
             part ? part : text ? "frugal holds nothing on cuda" : "(no ledger report: out of host memory)");
    free(text);
}

/* ---- the interface (fr_cuda.h, tensor/cuda.h) ----
 * No extern "C" on the definitions: the declarations in fr_cuda.h and
 * tensor/cuda.h give them C linkage, and without it this file also compiles
 * as C, which the host-only harness tests/test_cuda_alloc_host.c does (a
 * fake cudaMalloc, no GPU). */

void *fr_cuda_alloc(size_t nbytes, size_t peak, size_t limit, size_t *block_bytes) {
    if (fr_cuda_device_count() == 0) {
        fr_error(FR_ERR_DEVICE, "cuda alloc: no CUDA device is available");
        return NULL;
    }
    cudaError_t bind = fr_cuda_bind_thread();
    if (bind != cudaSuccess) {
        fr_error(FR_ERR_CUDA, "cuda alloc: cudaSetDevice: %s", cudaGetErrorString(bind));
        return NULL;
    }
    if (nbytes > SIZE_MAX / 2) {
        report_oom(nbytes, "larger than any device");
        return NULL;
    }
    size_t size = round_up(nbytes ? nbytes : 1, ROUND);
    int pool = size <= SMALL_MAX ? POOL_SMALL : POOL_LARGE;

    pthread_mutex_lock(&lock);
    size_t bound = fr_cache_bound(peak, limit);
    bound_now = bound;
    block *b = best_fit(pool, size);
    if (b) {
        bin_remove(b);
    } else {
        /* the bound first (cache_policy.h): room for the block itself, then
         * the pool's unit only if that fits too */
        release_free_segments(fr_cache_release(reserved_bytes, whole_free, size, bound));
        size_t seg = fr_cache_unit(size, pool == POOL_SMALL ? SMALL_SEGMENT : round_up(size, LARGE_ROUND),
                                   reserved_bytes, bound);
        if (fr_cache_refuse(reserved_bytes, seg, limit)) {
            char lim[32], held[32], why[128];
            fr_mem_format_bytes(limit, lim, sizeof lim);
            fr_mem_format_bytes(reserved_bytes, held, sizeof held);
            snprintf(why, sizeof why, "limit %s on reserved bytes, %s reserved with the cache emptied", lim, held);
            pthread_mutex_unlock(&lock);
            report_oom(nbytes, why);
            return NULL;
        }
        cudaError_t err;
        b = new_segment(pool, seg, &err);
        if (!b && err == cudaErrorMemoryAllocation) {
            /* Cached free segments may be what fills the device: give them
             * back and try once more. */
            release_free_segments(SIZE_MAX);
            b = new_segment(pool, seg, &err);
        }
        if (!b) {
            pthread_mutex_unlock(&lock);
            if (err != cudaSuccess && err != cudaErrorMemoryAllocation) {
                /* Not a refusal but a device in trouble (a sticky error left
                 * by a faulting kernel, a lost device): FR_ERR_CUDA, so that
                 * callers that shrink their request on FR_ERR_OOM do not
                 * retry on a dead context, and the cache is left alone (its
                 * cudaFrees would fail the same way). */
                fr_error(FR_ERR_CUDA, "cuda alloc: cudaMalloc of %zu bytes failed: %s (the device "
                         "is in an error state, not out of memory)", seg, cudaGetErrorString(err));
                return NULL;
            }
            char why[160];
            if (err != cudaSuccess)
                snprintf(why, sizeof why, "%s, also after returning the cached free segments",
                         cudaGetErrorString(err));
            else
                snprintf(why, sizeof why, "host memory exhausted");
            report_oom(nbytes, why);
            return NULL;
        }
    }
    split(b, size);
    b->free = false;
    /* a block from the cache after the peak was reset: the rest of what the
     * cache holds over the new bound goes back */
    if (reserved_bytes > bound && whole_free)
        release_free_segments(fr_cache_release(reserved_bytes, whole_free, 0, bound));
    if (!table_insert(b)) {
        /* No host memory for the table: undo, keeping the block cached. */
        give_back(b);
        pthread_mutex_unlock(&lock);
        fr_error(FR_ERR_OOM, "cuda alloc: out of host memory for the block table");
        return NULL;
    }
    if (block_bytes)
        *block_bytes = b->size;
    void *p = b->ptr;
    pthread_mutex_unlock(&lock);
    return p;
}

void fr_cuda_free(void *ptr) {
    if (!ptr)
        return;
    pthread_mutex_lock(&lock);
    block *b = table_remove(ptr);
    FR_ASSERT(b && !b->free); /* a pointer fr_cuda_alloc did not hand out */
    b = give_back(b);
    if (!b->prev && !b->next && reserved_bytes > bound_now) /* a whole segment over the bound */
        release_segment(b);
    pthread_mutex_unlock(&lock);
}

void fr_cuda_empty_cache(void) {
    pthread_mutex_lock(&lock);
    release_free_segments(SIZE_MAX);
    pthread_mutex_unlock(&lock);
}

void fr_cuda_cache_stats(size_t *reserved, size_t *device_mallocs) {
    pthread_mutex_lock(&lock);
    if (reserved)
        *reserved = reserved_bytes;
    if (device_mallocs)
        *device_mallocs = n_device_mallocs;
    pthread_mutex_unlock(&lock);
}
