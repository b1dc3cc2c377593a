/* memory.c: the allocator front door and the ledger (see memory.h). */
#include "memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "../cpu/allocator.h"
#include "../cuda/fr_cuda.h"

static const char *const tag_names[] = {
    "parameters", "gradients", "optimizer", "saved", "transient", "workspace", "data",
};
FR_STATIC_ASSERT(sizeof tag_names / sizeof *tag_names == FR_TAG_COUNT,
                 "tag_names must name every fr_mem_tag");

const char *fr_mem_tag_name(fr_mem_tag tag) {
    return (unsigned)tag < FR_TAG_COUNT ? tag_names[tag] : "?";
}

static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static fr_mem_stats ledger[FR_DEVICE_COUNT];
static size_t limits[FR_DEVICE_COUNT];
static size_t watch[FR_DEVICE_COUNT];
static fr_mem_trace_fn trace_fn;
static void *trace_user;

/* Both with the lock held. */
static void note_peaks(fr_device dev) {
    fr_mem_stats *s = &ledger[dev];
    for (int t = 0; t < FR_TAG_COUNT; t++)
        if (s->current[t] > s->peak[t])
            s->peak[t] = s->current[t];
    if (s->total_current > watch[dev])
        watch[dev] = s->total_current;
    if (s->total_current > s->total_peak) {
        s->total_peak = s->total_current;
        memcpy(s->at_peak, s->current, sizeof s->at_peak);
    }
    if (trace_fn)
        trace_fn(trace_user, dev, s);
}

static void count(fr_device dev, fr_mem_tag tag, size_t nbytes, bool add) {
    fr_mem_stats *s = &ledger[dev];
    if (add) {
        s->current[tag] += nbytes;
        s->total_current += nbytes;
        s->live_blocks++;
        s->n_allocs++;
    } else {
        FR_ASSERT(s->current[tag] >= nbytes && s->live_blocks > 0);
        s->current[tag] -= nbytes;
        s->total_current -= nbytes;
        s->live_blocks--;
    }
    note_peaks(dev);
}

static const char *phase_name;
static int64_t phase_step;

void fr_mem_set_phase(const char *phase, int64_t step) {
    pthread_mutex_lock(&ledger_lock);
    phase_name = phase;
    phase_step = step;
    pthread_mutex_unlock(&ledger_lock);
}

void fr_mem_watch_start(fr_device dev) {
    pthread_mutex_lock(&ledger_lock);
    watch[dev] = ledger[dev].total_current;
    pthread_mutex_unlock(&ledger_lock);
}

size_t fr_mem_watch_peak(fr_device dev) {
    pthread_mutex_lock(&ledger_lock);
    size_t w = watch[dev];
    pthread_mutex_unlock(&ledger_lock);
    return w;
}

const char *fr_mem_phase(void) {
    pthread_mutex_lock(&ledger_lock);
    const char *p = phase_name;
    pthread_mutex_unlock(&ledger_lock);
    return p;
}

/* " during training step 12", or "" (lock not held). */
static void phase_text(char *buf, size_t len) {
    pthread_mutex_lock(&ledger_lock);
    if (!phase_name)
        buf[0] = 0;
    else if (phase_step > 0)
        snprintf(buf, len, " during %s step %lld", phase_name, (long long)phase_step);
    else
        snprintf(buf, len, " during %s", phase_name);
    pthread_mutex_unlock(&ledger_lock);
}

static fr_status oom(fr_device dev, size_t nbytes, fr_mem_tag tag, const char *why) {
    char want[32], used[32], during[96];
    fr_mem_format_bytes(nbytes, want, sizeof want);
    fr_mem_format_bytes(fr_mem_total_current(dev), used, sizeof used);
    phase_text(during, sizeof during);
    return fr_error(FR_ERR_OOM, "out of memory on %s: %s for %s (%s in use; %s)%s",
                    fr_device_name(dev), want, fr_mem_tag_name(tag), used, why, during);
}

void *fr_mem_alloc(fr_device dev, size_t nbytes, fr_mem_tag tag) {
    FR_ASSERT((unsigned)dev < FR_DEVICE_COUNT && (unsigned)tag < FR_TAG_COUNT);
    pthread_mutex_lock(&ledger_lock);
    bool over = limits[dev] && ledger[dev].total_current + nbytes > limits[dev];
    /* the peak with this request, which bounds the GPU cache (the CPU's
     * keeps its own count) */
    size_t peak = ledger[dev].total_current + nbytes > ledger[dev].total_peak ? ledger[dev].total_current + nbytes
                                                                             : ledger[dev].total_peak;
    pthread_mutex_unlock(&ledger_lock);
    if (over) {
        char lim[32];
        fr_mem_format_bytes(limits[dev], lim, sizeof lim);
        char why[64];
        snprintf(why, sizeof why, "limit %s", lim);
        oom(dev, nbytes, tag, why);
        return NULL;
    }
    void *p = NULL;
    if (dev == FR_CPU) {
        /* 64-byte alignment suits AVX-512 loads and keeps rows off shared
         * cache lines; a 0-byte request still gets a unique pointer. The
         * caching allocator keeps freed blocks for reuse (cpu/allocator.c). */
        bool over_limit = false;
        p = fr_cpu_alloc(nbytes, &over_limit);
        if (!p && over_limit) { /* the ledger fits, the blocks' rounding does not */
            fr_cpu_cache c;
            fr_cpu_cache_info(&c);
            char lim[32], res[32], why[128];
            fr_mem_format_bytes(limits[dev], lim, sizeof lim);
            fr_mem_format_bytes(c.reserved, res, sizeof res);
            snprintf(why, sizeof why, "limit %s on reserved bytes, %s reserved with the cache emptied", lim, res);
            oom(dev, nbytes, tag, why);
            return NULL;
        }
        if (!p) {
            oom(dev, nbytes, tag, "the system refused");
            return NULL;
        }
    } else {
        size_t block = 0;
        p = fr_cuda_alloc(nbytes, peak, fr_mem_get_limit(dev), &block);
        if (!p) { /* fr_cuda_alloc has set the error; an OOM gets the phase too */
            char during[96], msg[1024];
            phase_text(during, sizeof during);
            if (*during && fr_last_status() == FR_ERR_OOM) {
                snprintf(msg, sizeof msg, "%s", fr_last_error());
                fr_error(FR_ERR_OOM, "%s%s", msg, during);
            }
            return NULL;
        }
    }
    pthread_mutex_lock(&ledger_lock);
    count(dev, tag, nbytes, true);
    pthread_mutex_unlock(&ledger_lock);
    return p;
}

void fr_mem_free(fr_device dev, void *ptr, size_t nbytes, fr_mem_tag tag) {
    if (!ptr)
        return;
    if (dev == FR_CPU)
        fr_cpu_free(ptr, nbytes);
    else
        fr_cuda_free(ptr);
    pthread_mutex_lock(&ledger_lock);
    count(dev, tag, nbytes, false);
    pthread_mutex_unlock(&ledger_lock);
}

void fr_mem_retag(fr_device dev, size_t nbytes, fr_mem_tag from, fr_mem_tag to) {
    if (from == to)
        return;
    pthread_mutex_lock(&ledger_lock);
    fr_mem_stats *s = &ledger[dev];
    FR_ASSERT(s->current[from] >= nbytes);
    s->current[from] -= nbytes;
    s->current[to] += nbytes;
    note_peaks(dev);
    pthread_mutex_unlock(&ledger_lock);
}

/* Whether anything was ever allocated on the GPU: asking the CUDA backend
 * about its cache before that would open it (dlopen of cuDNN and cuBLAS
 * maps over 130 MiB of their code into a CPU run). */
static bool cuda_used(void) {
    pthread_mutex_lock(&ledger_lock);
    bool used = ledger[FR_CUDA].n_allocs > 0;
    pthread_mutex_unlock(&ledger_lock);
    return used;
}

void fr_mem_get_stats(fr_device dev, fr_mem_stats *out) {
    FR_ASSERT((unsigned)dev < FR_DEVICE_COUNT);
    pthread_mutex_lock(&ledger_lock);
    *out = ledger[dev];
    pthread_mutex_unlock(&ledger_lock);
    if (dev == FR_CUDA) {
        out->reserved = out->device_mallocs = 0;
        if (out->n_allocs > 0)
            fr_cuda_cache_stats(&out->reserved, &out->device_mallocs);
        out->reserved_peak = out->reserved;
    } else {
        fr_cpu_cache c;
        fr_cpu_cache_info(&c);
        out->reserved = c.reserved;
        out->reserved_peak = c.reserved_peak;
        out->device_mallocs = c.system_allocs;
    }
}

size_t fr_mem_current(fr_device dev, fr_mem_tag tag) {
    fr_mem_stats s;
    fr_mem_get_stats(dev, &s);
    return s.current[tag];
}
size_t fr_mem_peak(fr_device dev, fr_mem_tag tag) {
    fr_mem_stats s;
    fr_mem_get_stats(dev, &s);
    return s.peak[tag];
}
size_t fr_mem_total_current(fr_device dev) {
    fr_mem_stats s;
    fr_mem_get_stats(dev, &s);
    return s.total_current;
}
size_t fr_mem_total_peak(fr_device dev) {
    fr_mem_stats s;
    fr_mem_get_stats(dev, &s);
    return s.total_peak;
}

void fr_mem_reset_peak(void) {
    pthread_mutex_lock(&ledger_lock);
    for (int d = 0; d < FR_DEVICE_COUNT; d++) {
        fr_mem_stats *s = &ledger[d];
        memcpy(s->peak, s->current, sizeof s->peak);
        memcpy(s->at_peak, s->current, sizeof s->at_peak);
        s->total_peak = s->total_current;
    }
    pthread_mutex_unlock(&ledger_lock);
    fr_cpu_reset_peak();
}

void fr_mem_set_limit(fr_device dev, size_t max_bytes) {
    pthread_mutex_lock(&ledger_lock);
    limits[dev] = max_bytes;
    pthread_mutex_unlock(&ledger_lock);
    if (dev == FR_CPU)
        fr_cpu_set_limit(max_bytes);
}

size_t fr_mem_get_limit(fr_device dev) {
    FR_ASSERT((unsigned)dev < FR_DEVICE_COUNT);
    pthread_mutex_lock(&ledger_lock);
    size_t l = limits[dev];
    pthread_mutex_unlock(&ledger_lock);
    return l;
}

void fr_mem_empty_cache(void) {
    fr_cpu_empty_cache();
    if (cuda_used())
        fr_cuda_empty_cache();
}

void fr_mem_process(size_t *rss, size_t *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kib;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kib) == 1)
            *rss = (size_t)kib << 10;
        else if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            *hwm = (size_t)kib << 10;
    }
    fclose(f);
}

fr_status fr_mem_probe_host(size_t nbytes, const char *what) {
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        munmap(p, nbytes);
        return FR_OK;
    }
    char want[32], used[32], cap[48] = "none";
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fr_mem_format_bytes((size_t)rl.rlim_cur, cap, sizeof cap);
    return fr_error(FR_ERR_OOM, "out of memory on cpu: %s needs %s of address space outside the ledger "
                    "(%s in use in it) and the system refused (address-space limit, ulimit -v: %s)", what,
                    fr_mem_format_bytes(nbytes, want, sizeof want),
                    fr_mem_format_bytes(fr_mem_total_current(FR_CPU), used, sizeof used), cap);
}

fr_status fr_mem_process_reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return fr_error(FR_ERR_IO, "cannot restart the process's peak resident memory: "
                        "/proc/self/clear_refs cannot be opened");
    bool ok = fputs("5", f) >= 0; /* 5: reset the peak resident set size */
    ok &= fclose(f) == 0;
    return ok ? FR_OK : fr_error(FR_ERR_IO, "cannot restart the process's peak resident memory: "
                                 "writing /proc/self/clear_refs failed");
}

void fr_mem_set_trace(fr_mem_trace_fn fn, void *user) {
    pthread_mutex_lock(&ledger_lock);
    trace_fn = fn;
    trace_user = user;
    pthread_mutex_unlock(&ledger_lock);
}

char *fr_mem_format_bytes(size_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%zu B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

void fr_mem_report(FILE *out) {
    for (int d = 0; d < FR_DEVICE_COUNT; d++) {
        fr_mem_stats s;
        fr_mem_get_stats((fr_device)d, &s);
        if (s.n_allocs == 0)
            continue;
        char a[32], b[32], c[32], e[32];
        fprintf(out, "memory on %s: %s in use, peak %s", fr_device_name((fr_device)d),
                fr_mem_format_bytes(s.total_current, a, sizeof a),
                fr_mem_format_bytes(s.total_peak, b, sizeof b));
        fprintf(out, ", reserved %s", fr_mem_format_bytes(s.reserved, c, sizeof c));
        if (d == FR_CPU)
            fprintf(out, " (peak %s)", fr_mem_format_bytes(s.reserved_peak, e, sizeof e));
        fprintf(out, ", %zu %s calls", s.device_mallocs, d == FR_CUDA ? "cudaMalloc" : "system allocation");
        if (d == FR_CPU) {
            size_t rss, hwm;
            fr_mem_process(&rss, &hwm);
            if (hwm)
                fprintf(out, "; process resident %s (peak %s)", fr_mem_format_bytes(rss, a, sizeof a),
                        fr_mem_format_bytes(hwm, b, sizeof b));
        }
        fprintf(out, "\n  %-11s %14s %14s %14s\n", "tag", "current", "peak", "at peak");
        for (int t = 0; t < FR_TAG_COUNT; t++)
            fprintf(out, "  %-11s %14s %14s %14s\n", tag_names[t],
                    fr_mem_format_bytes(s.current[t], a, sizeof a),
                    fr_mem_format_bytes(s.peak[t], b, sizeof b),
                    fr_mem_format_bytes(s.at_peak[t], c, sizeof c));
    }
}
