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
 * bytes held from the system (`reserved`: blocks in use at their rounded
 * size, plus cached ones) never exceed FR_CACHE_RESERVE_PCT percent of the
 * ledger's peak since the last fr_cpu_reset_peak, except by the rounding of
 * blocks in use, and never a limit set by fr_cpu_set_limit (tensor/memory.c
 * holds the ledger's bytes in use under that limit too; a request that
 * would take `reserved` past it with the cache emptied fails, as a device
 * of that size would).
 *  - small blocks (under FR_CPU_MMAP_MIN) take their size rounded up to
 *    64 bytes (size_class says why not classes); a freed one goes to the
 *    free list of its size (reused first);
 *  - large blocks take whole pages from mmap. A freed one joins the cached
 *    pieces right before and after it in memory; a request takes the
 *    smallest cached piece that holds it (best fit) and leaves the rest
 *    cached. Any page range of an anonymous mapping can be unmapped or
 *    resized alone, so pieces need no bookkeeping beyond their size. Why:
 *    with classes only, a step whose large blocks change size (the
 *    activations of one stage, then the next's) found the wrong classes in
 *    the cache and gave blocks back and mapped new ones in every step
 *    (+1.6 s of system CPU in a 40-step ResNet-20 run); split and joined,
 *    the step settles after its first repetitions and makes no system call;
 *  - every cached block is also in one list in the order they were freed;
 *  - a request that no cached block serves and that would take `reserved`
 *    over the bound first gives back the oldest cached blocks. A large
 *    piece given back for a large request is resized with mremap instead
 *    of unmapped: its pages stay in place, so only the difference is
 *    faulted in or released;
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
#define PAGE ((size_t)4096)

/* A cached block's first bytes (every block is at least 64 bytes). A small
 * block sits in its size's free list; a large piece sits in the list of
 * every cached large piece by address (next/prev), which is what lets a
 * piece be split for a smaller request and joined with its free
 * neighbours. */
typedef struct block {
    struct block *next, *prev;   /* in its size's free list, or by address */
    struct block *newer, *older; /* in the list of every cached block */
    size_t size;                 /* its rounded size, or a large piece's bytes */
    bool large;                  /* a piece of a mapping (else a malloc block) */
} block;

typedef struct size_list {
    size_t size;              /* the rounded size */
    block *head;              /* its cached blocks */
    struct size_list *next;   /* chain in the bucket */
} size_list;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_list *buckets[N_BUCKETS];
static block *large_first; /* cached large pieces by address */
static block *oldest, *newest;
static size_t reserved_bytes, cached_bytes, reserved_peak;
static size_t in_use, in_use_peak; /* requested bytes, as the ledger counts them */
static size_t limit_bytes, n_system_allocs;

/* Large iff the request is at least FR_CPU_MMAP_MIN: decided on the request,
 * so fr_cpu_free finds the same answer from the same nbytes. */
static bool is_large(size_t nbytes) { return CACHE_ON && nbytes >= FR_CPU_MMAP_MIN; }

/* A large request takes whole pages (it can be cut from any cached piece);
 * a small one its size rounded up to 64 bytes. Exact sizes, not classes:
 * under fr_cpu_set_limit's cap `reserved` must not pass the limit the
 * ledger holds its requested bytes under, and size classes (up to 12.5%
 * over, on every parameter, gradient and momentum block) made it pass by
 * a few KiB at the smallest budget a plan fits. The same rule with or
 * without a limit, because fr_cpu_free finds a block's size from nbytes
 * alone and a limit may be set between an allocation and its free. A
 * repeated step asks for the same sizes again, so exact lists still serve
 * it. */
static size_t size_class(size_t n) {
    if (is_large(n))
        return (n + PAGE - 1) & ~(PAGE - 1);
    return n ? (n + 63) & ~(size_t)63 : 64;
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

static void *system_alloc(size_t size, bool large) {
    if (large) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0)
        return NULL;
    return p;
}

/* Any page range of an anonymous mapping can be unmapped on its own, so a
 * piece cut from a bigger mapping (or joined from two) goes back alone. */
static void system_free(void *p, size_t size, bool large) {
    if (large)
        munmap(p, size);
    else
        free(p);
}

/* The bound on `reserved` (lock held): tensor/cache_policy.h's. */
static size_t bound(void) { return fr_cache_bound(in_use_peak, limit_bytes); }

/* Age list (lock held). */
static void age_unlink(block *b) {
    if (b->older)
        b->older->newer = b->newer;
    else
        oldest = b->newer;
    if (b->newer)
        b->newer->older = b->older;
    else
        newest = b->older;
}

static void age_push_newest(block *b) {
    b->newer = NULL;
    b->older = newest;
    if (newest)
        newest->newer = b;
    else
        oldest = b;
    newest = b;
}


/* Takes b out of the cache (lock held); its bytes stay reserved. */
static void unlink_cached(block *b) {
    if (b->large) {
        if (b->prev)
            b->prev->next = b->next;
        else
            large_first = b->next;
        if (b->next)
            b->next->prev = b->prev;
    } else {
        size_list *l = list_of(b->size, false);
        FR_ASSERT(l);
        if (b->prev)
            b->prev->next = b->next;
        else
            l->head = b->next;
        if (b->next)
            b->next->prev = b->prev;
    }
    age_unlink(b);
    cached_bytes -= b->size;
}
/* Puts r in b's place in both lists (lock held): the rest of a split piece
 * keeps the piece's place by address and by age. */
static void replace_cached(block *b, block *r) {
    r->next = b->next;
    r->prev = b->prev;
    r->newer = b->newer;
    r->older = b->older;
    if (r->prev)
        r->prev->next = r;
    else
        large_first = r;
    if (r->next)
        r->next->prev = r;
    if (r->older)
        r->older->newer = r;
    else
        oldest = r;
    if (r->newer)
        r->newer->older = r;
    else
        newest = r;
}

/* A cached block for `size` bytes, or NULL (lock held). Small: the head of
 * its size's list. Large: the smallest cached piece that holds it (best
 * fit), cut to size; the rest stays cached where the piece was. */
static void *take_cached(size_t size, bool large) {
    if (!large) {
        size_list *l = CACHE_ON ? list_of(size, false) : NULL;
        if (!l || !l->head)
            return NULL;
        block *b = l->head;
        unlink_cached(b);
        return b;
    }
    block *best = NULL;
    for (block *b = large_first; b; b = b->next)
        if (b->size >= size && (!best || b->size < best->size)) {
            best = b;
            if (b->size == size)
                break;
        }
    if (!best)
        return NULL;
    if (best->size == size) {
        unlink_cached(best);
    } else {
        block *r = (block *)((char *)best + size);
        r->size = best->size - size;
        r->large = true;
        replace_cached(best, r);
        cached_bytes -= size;
    }
    return best;
}

/* Caches a freed large piece (lock held), joined with the cached pieces
 * right before and after it in memory, so the next request of any size
 * can be cut from the whole. The joined piece counts as freed now. */
static void cache_large(block *b, size_t size) {
    b->size = size;
    b->large = true;
    cached_bytes += size;
    block *prev = NULL, *next = large_first;
    while (next && next < b) {
        prev = next;
        next = next->next;
    }
    if (prev && (char *)prev + prev->size == (char *)b) {
        age_unlink(prev);
        prev->size += size;
        b = prev;
    } else {
        b->prev = prev;
        b->next = next;
        if (prev)
            prev->next = b;
        else
            large_first = b;
        if (next)
            next->prev = b;
    }
    if (next && (char *)b + b->size == (char *)next) {
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        age_unlink(next);
        b->size += next->size;
    }
    age_push_newest(b);
}

/* Gives the oldest cached blocks back until `extra` more bytes fit under
 * `cap` or the cache is empty (lock held). When `want` is large, the first
 * large piece given back is resized to it with mremap and returned instead
 * (its bytes counted as reserved); else NULL. */
static void *trim(size_t cap, size_t extra, size_t want, bool want_large) {
    void *got = NULL;
    while (oldest && reserved_bytes + (got ? 0 : extra) > cap) {
        block *b = oldest;
        size_t size = b->size;
        bool large = b->large;
        unlink_cached(b);
        if (!got && want_large && large) {
            void *p = size == want ? b : mremap(b, size, want, MREMAP_MAYMOVE);
            if (p != MAP_FAILED) {
                got = p;
                reserved_bytes = reserved_bytes - size + want;
                n_system_allocs++;
                continue;
            }
        }
        system_free(b, size, large);
        reserved_bytes -= size;
    }
    return got;
}

void *fr_cpu_alloc(size_t nbytes, bool *over_limit) {
    bool large = is_large(nbytes);
    size_t size = size_class(nbytes);
    *over_limit = false;
    pthread_mutex_lock(&lock);
    void *p = take_cached(size, large);
    if (!p) {
        size_t peak = in_use + nbytes > in_use_peak ? in_use + nbytes : in_use_peak;
        size_t saved_peak = in_use_peak;
        in_use_peak = peak; /* the bound counts this request */
        p = trim(bound(), size, size, large);
        in_use_peak = saved_peak;
        /* Under a limit, growing past it is refused once the trim above
         * has given back every cached block it could: what a device of
         * that size could not hold either. */
        if (fr_cache_refuse(reserved_bytes, p ? 0 : size, limit_bytes)) {
            if (p) {
                system_free(p, size, large);
                reserved_bytes -= size;
                p = NULL;
            }
            *over_limit = true;
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        if (!p) {
            p = system_alloc(size, large);
            if (!p && CACHE_ON) {
                trim(0, 0, 0, false);
                p = system_alloc(size, large);
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
    bool large = is_large(nbytes);
    size_t size = size_class(nbytes);
    pthread_mutex_lock(&lock);
    in_use -= nbytes;
    size_list *l = CACHE_ON && !large ? list_of(size, true) : NULL;
    if (large) {
        cache_large(ptr, size);
    } else if (l) {
        block *b = ptr;
        b->size = size;
        b->large = false;
        b->prev = NULL;
        b->next = l->head;
        if (l->head)
            l->head->prev = b;
        l->head = b;
        age_push_newest(b);
        cached_bytes += size;
    } else { /* no cache (sanitizer), or no memory for a new list: give it back */
        system_free(ptr, size, false);
        reserved_bytes -= size;
    }
    pthread_mutex_unlock(&lock);
}

void fr_cpu_empty_cache(void) {
    pthread_mutex_lock(&lock);
    trim(0, 0, 0, false);
    pthread_mutex_unlock(&lock);
}

void fr_cpu_reset_peak(void) {
    pthread_mutex_lock(&lock);
    in_use_peak = in_use;
    trim(bound(), 0, 0, false);
    reserved_peak = reserved_bytes;
    pthread_mutex_unlock(&lock);
}

void fr_cpu_set_limit(size_t max_bytes) {
    pthread_mutex_lock(&lock);
    limit_bytes = max_bytes;
    if (limit_bytes)
        trim(limit_bytes, 0, 0, false);
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
