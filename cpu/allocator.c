/* cpu/allocator.c: the CPU caching allocator behind fr_mem_alloc(FR_CPU), the
 * twin of cuda/allocator.cu (see allocator.h).
 *
 * Why a cache: glibc serves large requests with fresh mmap'd pages and
 * unmaps them on free, so each training step used to take a page fault on
 * every 4 KiB of every activation again. Why a bounded one: an unbounded
 * cache of size classes kept every block any phase had ever freed (the whole
 * data set read before --limit-train cut it, the blocks of other sizes of
 * every earlier step), so the process held twice what the ledger said.
 *
 * The rule (docs/ARCHITECTURE.md, "Memory: the bounded CPU cache"): the
 * bytes held from the system (`reserved`: blocks in use at their class
 * size, plus cached ones) never exceed FR_CPU_RESERVE_PCT percent of the
 * ledger's peak since the last fr_cpu_reset_peak, nor a limit set by
 * fr_cpu_set_limit (tensor/memory.c holds the ledger's bytes in use under
 * that limit too), except by the size-class rounding of blocks in use.
 *  - size classes: multiples of 64 bytes up to 4 KiB, then eight classes per
 *    power of two (at most 12.5% rounding);
 *  - a freed block goes to the free list of its class (reused first) and to
 *    the tail of one list of every cached block in the order they were
 *    freed;
 *  - a request that no cached block of its class serves and that would take
 *    `reserved` over the bound first gives back the oldest cached blocks.
 *    A large block (from FR_CPU_MMAP_MIN up, mapped with mmap) given back
 *    for a large request is resized with mremap instead of unmapped: its
 *    pages stay in place, so only the difference is faulted in or released
 *    (this is the "splitting" that size classes otherwise lack);
 *  - small blocks come from malloc (posix_memalign), large ones straight
 *    from mmap, so a block given back is really gone from the process
 *    (glibc keeps freed heap memory and raises its mmap threshold after
 *    each large free, which is where much of the old excess lived);
 *  - when the system refuses, the cache is emptied and the request tried
 *    once more.
 * Under AddressSanitizer the cache is bypassed and everything comes from
 * malloc, so a use after free or an overflow is still caught. One mutex
 * guards everything (the data loader allocates too). */
/* mremap needs _GNU_SOURCE, which the Makefile defines */
#include "allocator.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CACHE_ON 0
#endif
#endif
#ifndef CACHE_ON
#define CACHE_ON 1
#endif

#define N_BUCKETS 1024

/* A cached block's first bytes (every class is at least 64 bytes). */
typedef struct block {
    struct block *next, *prev;   /* in its class's free list */
    struct block *newer, *older; /* in the list of every cached block */
    size_t size;                 /* its class */
} block;

typedef struct size_list {
    size_t size;              /* the class */
    block *head;              /* its cached blocks */
    struct size_list *next;   /* chain in the bucket */
} size_list;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_list *buckets[N_BUCKETS];
static block *oldest, *newest;
static size_t reserved_bytes, cached_bytes, reserved_peak;
static size_t in_use, in_use_peak; /* requested bytes, as the ledger counts them */
static size_t limit_bytes, n_system_allocs;

static size_t size_class(size_t n) {
    if (n <= 4096)
        return n ? (n + 63) & ~(size_t)63 : 64;
    int lg = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^lg < n <= 2^(lg+1) */
    size_t step = (size_t)1 << (lg - 3);                        /* eight steps per power of two */
    return (n + step - 1) & ~(step - 1);
}

static bool is_large(size_t size) { return CACHE_ON && size >= FR_CPU_MMAP_MIN; }

/* With the lock held; NULL when a list cannot be created. */
static size_list *list_of(size_t size, bool create) {
    size_t b = (size / 64) % N_BUCKETS;
    for (size_list *l = buckets[b]; l; l = l->next)
        if (l->size == size)
            return l;
    if (!create)
        return NULL;
    size_list *l = calloc(1, sizeof *l);
    if (l) {
        l->size = size;
        l->next = buckets[b];
        buckets[b] = l;
    }
    return l;
}

static void *system_alloc(size_t size) {
    if (is_large(size)) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0)
        return NULL;
    return p;
}

static void system_free(void *p, size_t size) {
    if (is_large(size))
        munmap(p, size);
    else
        free(p);
}

/* The bound on `reserved` (lock held): FR_CPU_RESERVE_PCT of the peak,
 * capped by the limit. */
static size_t bound(void) {
    size_t b = in_use_peak / 100 * FR_CPU_RESERVE_PCT + in_use_peak % 100 * FR_CPU_RESERVE_PCT / 100;
    return limit_bytes && limit_bytes < b ? limit_bytes : b;
}

/* Takes b out of the cache (lock held); its bytes stay reserved. */
static void unlink_cached(block *b) {
    size_list *l = list_of(b->size, false);
    FR_ASSERT(l);
    if (b->prev)
        b->prev->next = b->next;
    else
        l->head = b->next;
    if (b->next)
        b->next->prev = b->prev;
    if (b->older)
        b->older->newer = b->newer;
    else
        oldest = b->newer;
    if (b->newer)
        b->newer->older = b->older;
    else
        newest = b->older;
    cached_bytes -= b->size;
}

/* Gives the oldest cached blocks back until `extra` more bytes fit under
 * `cap` or the cache is empty (lock held). When `want` is a large class,
 * the first large block given back is resized to it with mremap and
 * returned instead (its bytes counted as reserved); else NULL. */
static void *trim(size_t cap, size_t extra, size_t want) {
    void *got = NULL;
    while (oldest && reserved_bytes + (got ? 0 : extra) > cap) {
        block *b = oldest;
        size_t size = b->size;
        unlink_cached(b);
        if (!got && is_large(want) && is_large(size)) {
            void *p = size == want ? b : mremap(b, size, want, MREMAP_MAYMOVE);
            if (p != MAP_FAILED) {
                got = p;
                reserved_bytes = reserved_bytes - size + want;
                n_system_allocs++;
                continue;
            }
        }
        system_free(b, size);
        reserved_bytes -= size;
    }
    return got;
}

void *fr_cpu_alloc(size_t nbytes) {
    size_t size = size_class(nbytes);
    pthread_mutex_lock(&lock);
    size_list *l = CACHE_ON ? list_of(size, false) : NULL;
    void *p = NULL;
    if (l && l->head) {
        block *b = l->head;
        unlink_cached(b);
        p = b;
    } else {
        size_t peak = in_use + nbytes > in_use_peak ? in_use + nbytes : in_use_peak;
        size_t saved_peak = in_use_peak;
        in_use_peak = peak; /* the bound counts this request */
        p = trim(bound(), size, size);
        in_use_peak = saved_peak;
        if (!p) {
            p = system_alloc(size);
            if (!p && CACHE_ON) {
                trim(0, 0, 0);
                p = system_alloc(size);
            }
            if (p) {
                n_system_allocs++;
                reserved_bytes += size;
            }
        }
    }
    if (p) {
        in_use += nbytes;
        if (in_use > in_use_peak)
            in_use_peak = in_use;
        if (reserved_bytes > reserved_peak)
            reserved_peak = reserved_bytes;
    }
    pthread_mutex_unlock(&lock);
    return p;
}

void fr_cpu_free(void *ptr, size_t nbytes) {
    if (!ptr)
        return;
    size_t size = size_class(nbytes);
    pthread_mutex_lock(&lock);
    in_use -= nbytes;
    size_list *l = CACHE_ON ? list_of(size, true) : NULL;
    if (l) {
        block *b = ptr;
        b->size = size;
        b->prev = NULL;
        b->next = l->head;
        if (l->head)
            l->head->prev = b;
        l->head = b;
        b->newer = NULL;
        b->older = newest;
        if (newest)
            newest->newer = b;
        else
            oldest = b;
        newest = b;
        cached_bytes += size;
    } else { /* no cache (sanitizer), or no memory for a new list: give it back */
        system_free(ptr, size);
        reserved_bytes -= size;
    }
    pthread_mutex_unlock(&lock);
}

void fr_cpu_empty_cache(void) {
    pthread_mutex_lock(&lock);
    trim(0, 0, 0);
    pthread_mutex_unlock(&lock);
}

void fr_cpu_reset_peak(void) {
    pthread_mutex_lock(&lock);
    in_use_peak = in_use;
    trim(bound(), 0, 0);
    reserved_peak = reserved_bytes;
    pthread_mutex_unlock(&lock);
}

void fr_cpu_set_limit(size_t max_bytes) {
    pthread_mutex_lock(&lock);
    limit_bytes = max_bytes;
    if (limit_bytes)
        trim(limit_bytes, 0, 0);
    pthread_mutex_unlock(&lock);
}

void fr_cpu_cache_info(fr_cpu_cache *out) {
    pthread_mutex_lock(&lock);
    out->reserved = reserved_bytes;
    out->reserved_peak = reserved_peak;
    out->cached = cached_bytes;
    out->system_allocs = n_system_allocs;
    pthread_mutex_unlock(&lock);
}

void fr_cpu_cache_stats(size_t *reserved, size_t *system_allocs) {
    fr_cpu_cache c;
    fr_cpu_cache_info(&c);
    *reserved = c.reserved;
    *system_allocs = c.system_allocs;
}
