/* memory.h: the allocator every tensor byte passes through, and its ledger.
 *
 * Every allocation carries a tag saying what the bytes are for. The ledger
 * keeps, per device and per tag, the bytes in use now and the most ever in use
 * since the last fr_mem_reset_peak(); plus the total and a snapshot of the
 * per-tag bytes at the moment the total peaked, so a report can say where a
 * peak comes from. Counts are of requested bytes (exact); the caching
 * allocators' reserved bytes (blocks held from the driver, or on the CPU from
 * the system) are reported beside them. All functions are thread-safe (the data loader allocates on its own
 * thread). */
#ifndef FR_MEMORY_H
#define FR_MEMORY_H

#include <stdio.h>

#include "fr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FR_TAG_PARAM = 0,  /* model parameters and buffers (BN running stats) */
    FR_TAG_GRAD,       /* .grad of leaves */
    FR_TAG_OPTIM,      /* optimizer state (momentum, Adam moments) */
    FR_TAG_SAVED,      /* activations held by the tape for backward */
    FR_TAG_TRANSIENT,  /* activations and intermediate gradients in flight */
    FR_TAG_WORKSPACE,  /* scratch of a kernel (im2col, cuDNN workspace) */
    FR_TAG_DATA,       /* input batches and labels */
    FR_TAG_COUNT
} fr_mem_tag;

const char *fr_mem_tag_name(fr_mem_tag tag);

typedef struct {
    size_t current[FR_TAG_COUNT];  /* bytes in use now, per tag */
    size_t peak[FR_TAG_COUNT];     /* highest `current` per tag since reset */
    size_t at_peak[FR_TAG_COUNT];  /* per-tag bytes when `total_peak` was hit */
    size_t total_current;
    size_t total_peak;
    size_t live_blocks;            /* allocations not yet freed */
    size_t n_allocs;               /* allocations since program start */
    size_t reserved;               /* bytes the caching allocator holds (in use + cached) */
    size_t reserved_peak;          /* highest `reserved` since the last reset (CPU; on CUDA
                                      `reserved` now) */
    size_t device_mallocs;         /* system allocations since start (cudaMalloc on CUDA,
                                      posix_memalign on the CPU) */
} fr_mem_stats;

/* Allocates `nbytes` (64-byte aligned on the CPU) on `dev`, counted under
 * `tag`. Returns NULL with FR_ERR_OOM (message names the tag, the request and
 * what is in use) when the system refuses or a limit set by fr_mem_set_limit
 * would be passed. nbytes == 0 gives a valid unique pointer. */
void *fr_mem_alloc(fr_device dev, size_t nbytes, fr_mem_tag tag);
/* Frees what fr_mem_alloc returned; `nbytes` and `tag` must be the ones it
 * is counted under now. NULL is ignored. */
void fr_mem_free(fr_device dev, void *ptr, size_t nbytes, fr_mem_tag tag);
/* Moves `nbytes` from one tag to another without allocating (a transient
 * activation becomes saved when the tape keeps it, and back). */
void fr_mem_retag(fr_device dev, size_t nbytes, fr_mem_tag from, fr_mem_tag to);

/* What the process is doing, for out-of-memory messages: `phase` (a string
 * that outlives the call: "planning", "training", "evaluation"; NULL for
 * none) and the step within it (counted from 1; 0 for none). An OOM error
 * then ends "during training step 12", so a run that dies says which part
 * of it asked. Set by the programs; one setting for the whole process. */
void fr_mem_set_phase(const char *phase, int64_t step);
/* The phase set last (NULL for none). */
const char *fr_mem_phase(void);

void fr_mem_get_stats(fr_device dev, fr_mem_stats *out);
size_t fr_mem_current(fr_device dev, fr_mem_tag tag);
size_t fr_mem_peak(fr_device dev, fr_mem_tag tag);
size_t fr_mem_total_current(fr_device dev);
size_t fr_mem_total_peak(fr_device dev);
/* Sets every peak (all devices) to its current value. On the CPU this also
 * gives back cached blocks over the allocator's bound for the new peak
 * (cpu/allocator.c: reserved <= 115% of the ledger's peak since the reset). */
void fr_mem_reset_peak(void);
/* A second high-water mark of the total in use on `dev`, restarted at the
 * current total by fr_mem_watch_start and left alone by fr_mem_reset_peak:
 * for a measurement inside a step whose own peak must stay whole (the
 * checkpoint planner's trial backward, nn/segments.c). One watcher at a
 * time. */
void fr_mem_watch_start(fr_device dev);
size_t fr_mem_watch_peak(fr_device dev);
/* A cap on total bytes in use on `dev` (0 = none); used to test and to
 * simulate small devices. On the CPU the caching allocator's reserved bytes
 * never pass it either (cached blocks are given back first; a request whose
 * block would still pass it is FR_ERR_OOM, "limit ... on reserved bytes"),
 * so the process holds what a device of that size could. */
void fr_mem_set_limit(fr_device dev, size_t max_bytes);
/* The cap fr_mem_set_limit set on `dev` (0 = none): the planner lowers it
 * for its trial steps and puts it back. */
size_t fr_mem_get_limit(fr_device dev);
/* This process's resident memory now and its high-water mark (VmRSS and
 * VmHWM of /proc/self/status), in bytes; 0 and 0 where /proc is not there.
 * Everything counts: the ledger's blocks, the cache, the libraries' code
 * and buffers, thread stacks. */
void fr_mem_process(size_t *rss, size_t *hwm);
/* Restarts VmHWM at VmRSS (/proc/self/clear_refs), so fr_mem_process's
 * peak covers what follows; FR_ERR_IO where the system does not allow it. */
fr_status fr_mem_process_reset_peak(void);
/* Whether the system would give this process `nbytes` more of host
 * address space now (mapped and unmapped at once, never touched): for
 * libraries that allocate outside the ledger and cannot fail cleanly
 * (OpenBLAS 0.3.21 retries a refused buffer forever). FR_ERR_OOM naming
 * `what`, the bytes, what the ledger holds and RLIMIT_AS when refused. */
fr_status fr_mem_probe_host(size_t nbytes, const char *what);
/* Writes a human-readable table of the ledger for every device in use. */
void fr_mem_report(FILE *out);
/* Returns every cached, unused block to the system, on both devices. */
void fr_mem_empty_cache(void);

/* Optional observer called after every change of the ledger, for plots of
 * memory over time (examples/memreport). Called with the ledger lock held:
 * it must not allocate through frugal. NULL removes it. */
typedef void (*fr_mem_trace_fn)(void *user, fr_device dev, const fr_mem_stats *now);
void fr_mem_set_trace(fr_mem_trace_fn fn, void *user);

/* "12.3 MiB" style formatting into buf; returns buf. */
char *fr_mem_format_bytes(size_t bytes, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
