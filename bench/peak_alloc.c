/* peak_alloc.c: an LD_PRELOAD shim that counts the heap bytes a process has
 * in use and the most it had at once, so bench/torch_checkpoint.py can
 * measure the peak memory of a PyTorch CPU training step (CPU PyTorch has no
 * torch.cuda.max_memory_allocated; its CPU allocator takes every tensor from
 * posix_memalign and gives it back with free).
 *
 * Built by `make bench` as <build>/bench/peak_alloc.so. Every allocation
 * entry point forwards to glibc's own implementation (__libc_malloc and
 * friends, exported for exactly this purpose) and adds or subtracts the
 * block's malloc_usable_size; dlsym(RTLD_NEXT) is not used because dlsym
 * itself calls calloc, which would recurse into this file. Counters are
 * atomics: PyTorch frees and allocates from several threads.
 *
 * For ctypes: peak_alloc_current() (bytes in use now), peak_alloc_peak()
 * (the most since the last reset), peak_alloc_reset() (peak = current).
 * Blocks allocated before the shim was loaded (none under LD_PRELOAD) would
 * be freed without having been counted, so current may read low, never high. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t alignment, size_t size);

static _Atomic int64_t current_bytes, peak_bytes;

static void *counted(void *p) {
    if (p) {
        int64_t now = atomic_fetch_add(&current_bytes, (int64_t)malloc_usable_size(p)) +
                      (int64_t)malloc_usable_size(p);
        int64_t peak = atomic_load(&peak_bytes);
        while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now)) {
        }
    }
    return p;
}

static void uncount(void *p) {
    if (p)
        atomic_fetch_sub(&current_bytes, (int64_t)malloc_usable_size(p));
}

void *malloc(size_t size) { return counted(__libc_malloc(size)); }

void *calloc(size_t n, size_t size) { return counted(__libc_calloc(n, size)); }

void free(void *p) {
    uncount(p);
    __libc_free(p);
}

void *realloc(void *p, size_t size) {
    size_t old = p ? malloc_usable_size(p) : 0;
    void *q = __libc_realloc(p, size);
    if (!q && size)
        return NULL; /* p is untouched and still counted */
    atomic_fetch_sub(&current_bytes, (int64_t)old);
    return counted(q);
}

void *reallocarray(void *p, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n * size);
}

void *memalign(size_t alignment, size_t size) { return counted(__libc_memalign(alignment, size)); }

void *aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)))
        return EINVAL;
    void *p = memalign(alignment, size);
    if (!p && size)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t size) { return memalign(4096, size); }

int64_t peak_alloc_current(void) { return atomic_load(&current_bytes); }

int64_t peak_alloc_peak(void) { return atomic_load(&peak_bytes); }

void peak_alloc_reset(void) { atomic_store(&peak_bytes, atomic_load(&current_bytes)); }
