/* cpu/allocator.c: the CPU caching allocator behind fr_mem_alloc(FR_CPU), the
 * twin of cuda/allocator.cu (see allocator.h).
 *
 * glibc serves large requests (from 128 KiB up, adaptively more) with fresh
 * mmap'd pages and unmaps them on free, so each training step used to take a
 * page fault on every 4 KiB of every activation again. Here a freed block is
 * kept in a free list of its size class and handed out again for the next
 * request of that class; in steady state (the same sizes every step) no
 * system allocation happens at all.
 *  - size classes: multiples of 64 bytes up to 4 KiB, then eight classes per
 *    power of two (at most 12.5% rounding); a block is never split or
 *    merged, which keeps the code small and suits the repeating sizes of a
 *    training step;
 *  - the free lists are intrusive (a free block's first bytes link it to
 *    the next), found through a chained hash table keyed by class;
 *  - when the system refuses, the cache is emptied and the request tried
 *    once more;
 *  - fr_cpu_empty_cache returns every cached block.
 * Under AddressSanitizer the cache is bypassed, so a use after free is still
 * caught. One mutex guards everything (the data loader allocates too). */
#include "allocator.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct free_block {
    struct free_block *next;
} free_block;

typedef struct size_list {
    size_t size;              /* the class */
    free_block *head;         /* its cached blocks */
    struct size_list *next;   /* chain in the bucket */
} size_list;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_list *buckets[N_BUCKETS];
static size_t reserved_bytes, n_system_allocs;

static size_t size_class(size_t n) {
    if (n <= 4096)
        return n ? (n + 63) & ~(size_t)63 : 64;
    int lg = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^lg < n <= 2^(lg+1) */
    size_t step = (size_t)1 << (lg - 3);                        /* eight steps per power of two */
    return (n + step - 1) & ~(step - 1);
}

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
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0)
        return NULL;
    return p;
}

/* With the lock held. */
static void empty_locked(void) {
    for (int b = 0; b < N_BUCKETS; b++) {
        size_list *l = buckets[b];
        while (l) {
            while (l->head) {
                free_block *f = l->head;
                l->head = f->next;
                free(f);
                reserved_bytes -= l->size;
            }
            size_list *next = l->next;
            free(l);
            l = next;
        }
        buckets[b] = NULL;
    }
}

void *fr_cpu_alloc(size_t nbytes) {
    size_t size = size_class(nbytes);
    pthread_mutex_lock(&lock);
    size_list *l = CACHE_ON ? list_of(size, false) : NULL;
    void *p = NULL;
    if (l && l->head) {
        p = l->head;
        l->head = l->head->next;
    } else {
        p = system_alloc(size);
        if (!p && CACHE_ON) {
            empty_locked();
            p = system_alloc(size);
        }
        if (p) {
            n_system_allocs++;
            reserved_bytes += size;
        }
    }
    pthread_mutex_unlock(&lock);
    return p;
}

void fr_cpu_free(void *ptr, size_t nbytes) {
    if (!ptr)
        return;
    size_t size = size_class(nbytes);
    pthread_mutex_lock(&lock);
    size_list *l = CACHE_ON ? list_of(size, true) : NULL;
    if (l) {
        free_block *f = ptr;
        f->next = l->head;
        l->head = f;
    } else { /* no cache (sanitizer), or no memory for a new list: give it back */
        free(ptr);
        reserved_bytes -= size;
    }
    pthread_mutex_unlock(&lock);
}

void fr_cpu_empty_cache(void) {
    pthread_mutex_lock(&lock);
    empty_locked();
    pthread_mutex_unlock(&lock);
}

void fr_cpu_cache_stats(size_t *reserved, size_t *system_allocs) {
    pthread_mutex_lock(&lock);
    *reserved = reserved_bytes;
    *system_allocs = n_system_allocs;
    pthread_mutex_unlock(&lock);
}
