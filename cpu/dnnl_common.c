/* cpu/dnnl_common.c: the oneDNN engine, plans (a primitive plus the reorders
 * around it) and the plan cache of cpu/conv_dnnl.c (see fr_dnnl.h). */
#include "fr_dnnl.h"

#ifdef FR_HAVE_DNNL
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/memory.h"
#include "isa.h"
#include "threads.h"

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static dnnl_status_t engine_status = dnnl_success;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

/* oneDNN's kernels are capped at the ISA class frugal runs (isa.h), so a
 * class forced by FR_CPU_ISA runs oneDNN's kernels of that class too; the
 * cap must come before the first primitive, hence here. It fails only when
 * DNNL_MAX_CPU_ISA or an earlier call already fixed a cap: that one stays. */
static void engine_init(void) {
    static const dnnl_cpu_isa_t cap[FR_ISA_COUNT] = {dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2,
                                                     dnnl_cpu_isa_all};
    fr_cpu_isa isa;
    if (fr_cpu_isa_get(&isa) == FR_OK && isa != fr_cpu_isa_detected())
        dnnl_set_max_cpu_isa(cap[isa]);
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
    if (engine_status == dnnl_success)
        engine_status = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
}

dnnl_engine_t fr_dnnl_engine(void) {
    pthread_once(&engine_once, engine_init);
    return engine_status == dnnl_success ? engine : NULL;
}

static const char *dnnl_status_text(dnnl_status_t st) {
    switch (st) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_runtime_error: return "runtime error";
    default: return "error";
    }
}

fr_status fr_dnnl_error(dnnl_status_t st, const char *what) {
    return fr_error(st == dnnl_out_of_memory ? FR_ERR_OOM : FR_ERR_ARG,
                    "oneDNN: %s failed (%s, status %d)", what, dnnl_status_text(st), (int)st);
}

dnnl_primitive_attr_t fr_dnnl_attr_new(void) {
    dnnl_primitive_attr_t attr = NULL;
    dnnl_status_t st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        fr_dnnl_error(st, "creating a primitive attribute");
        return NULL;
    }
    return attr;
}

int fr_dnnl_threads(void) { return fr_cpu_threads(); }

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

void fr_dnnl_plan_destroy(fr_dnnl_plan *plan) {
    for (int i = 0; i < plan->nargs; i++)
        if (plan->args[i].reorder)
            dnnl_primitive_destroy(plan->args[i].reorder);
    if (plan->prim)
        dnnl_primitive_destroy(plan->prim);
    memset(plan, 0, sizeof *plan);
}

fr_status fr_dnnl_plan_init(fr_dnnl_plan *plan, dnnl_status_t pd_status,
                            dnnl_primitive_desc_t pd, int nargs, const int *ids,
                            const dnnl_memory_desc_t *user, const bool *output) {
    FR_ASSERT(nargs <= FR_DNNL_MAX_ARGS);
    memset(plan, 0, sizeof *plan);
    if (pd_status == dnnl_unimplemented)
        return FR_OK;
    if (pd_status != dnnl_success)
        return fr_dnnl_error(pd_status, "creating a primitive descriptor");
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(plan->impl, sizeof plan->impl, "%s", impl ? impl : "?");
    plan->scratch_bytes = dnnl_memory_desc_get_size(
        dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    size_t off = align64(plan->scratch_bytes);
    dnnl_status_t st = dnnl_primitive_create(&plan->prim, pd);
    plan->nargs = nargs;
    for (int i = 0; i < nargs && st == dnnl_success; i++) {
        fr_dnnl_arg *a = &plan->args[i];
        a->arg = ids[i];
        a->output = output[i];
        a->user = user[i];
        a->prim = *dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, ids[i]);
        if (dnnl_memory_desc_equal(&a->user, &a->prim))
            continue;
        dnnl_primitive_desc_t rpd = NULL;
        dnnl_primitive_attr_t attr = fr_dnnl_attr_new();
        if (!attr) {
            dnnl_primitive_desc_destroy(pd);
            fr_dnnl_plan_destroy(plan);
            return fr_last_status();
        }
        const dnnl_memory_desc_t *from = a->output ? &a->prim : &a->user;
        const dnnl_memory_desc_t *to = a->output ? &a->user : &a->prim;
        st = dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, attr);
        dnnl_primitive_attr_destroy(attr);
        if (st == dnnl_success) {
            /* a reorder between these layouts needs no scratchpad; if one
             * ever did, it would run outside the ledger, so refuse it */
            FR_ASSERT(dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(
                          rpd, dnnl_query_scratchpad_md, 0)) == 0);
            st = dnnl_primitive_create(&a->reorder, rpd);
            dnnl_primitive_desc_destroy(rpd);
        }
        a->offset = off;
        a->bytes = dnnl_memory_desc_get_size(&a->prim);
        off += align64(a->bytes);
    }
    plan->ws_bytes = off;
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) {
        fr_dnnl_plan_destroy(plan);
        return fr_dnnl_error(st, "creating a primitive");
    }
    return FR_OK;
}

static fr_status execute(dnnl_stream_t strm, dnnl_primitive_t prim, int n,
                         const dnnl_exec_arg_t *args, const char *what) {
    dnnl_status_t st = dnnl_primitive_execute(prim, strm, n, args);
    if (st == dnnl_success)
        st = dnnl_stream_wait(strm);
    return st == dnnl_success ? FR_OK : fr_dnnl_error(st, what);
}

fr_status fr_dnnl_plan_run(const fr_dnnl_plan *plan, void *const *ptrs, const char *what) {
    FR_ASSERT(plan->prim && fr_dnnl_engine());
    char *ws = NULL;
    if (plan->ws_bytes && !(ws = fr_mem_alloc(FR_CPU, plan->ws_bytes, FR_TAG_WORKSPACE)))
        return fr_last_status();
    fr_status out = fr_dnnl_plan_run_in(plan, ptrs, ws, NULL, false, what);
    if (ws)
        fr_mem_free(FR_CPU, ws, plan->ws_bytes, FR_TAG_WORKSPACE);
    return out;
}

fr_status fr_dnnl_stream_new(dnnl_stream_t *out) {
    *out = NULL;
    if (!fr_dnnl_engine())
        return fr_dnnl_error(engine_status, "creating the engine");
    dnnl_status_t st = dnnl_stream_create(out, engine, dnnl_stream_default_flags);
    return st == dnnl_success ? FR_OK : fr_dnnl_error(st, "creating a stream");
}

fr_status fr_dnnl_plan_run_in(const fr_dnnl_plan *plan, void *const *ptrs, void *ws_,
                              dnnl_stream_t strm, bool raw_outputs, const char *what) {
    FR_ASSERT(plan->prim && fr_dnnl_engine());
    char *ws = ws_;
    if (!strm)
        strm = stream;
    /* user[i]: frugal's buffer; prim[i]: what the primitive reads or writes
     * (the same memory object when no reorder is needed). */
    dnnl_memory_t user[FR_DNNL_MAX_ARGS] = {0}, prim[FR_DNNL_MAX_ARGS] = {0}, scratch = NULL;
    dnnl_exec_arg_t args[FR_DNNL_MAX_ARGS + 1];
    fr_status out = FR_OK;
    /* the scratchpad's descriptor: a flat byte array of its size */
    dnnl_memory_desc_t scratch_md;
    dnnl_dims_t sdims = {(dnnl_dim_t)plan->scratch_bytes};
    dnnl_status_t st = dnnl_success;
    if (plan->scratch_bytes) {
        st = dnnl_memory_desc_init_by_tag(&scratch_md, 1, sdims, dnnl_u8, dnnl_a);
        if (st == dnnl_success)
            st = dnnl_memory_create(&scratch, &scratch_md, engine, ws);
    }
    bool reorders[FR_DNNL_MAX_ARGS];
    for (int i = 0; i < plan->nargs && st == dnnl_success; i++) {
        const fr_dnnl_arg *a = &plan->args[i];
        bool raw = a->reorder && a->output && raw_outputs;
        reorders[i] = a->reorder && !raw;
        st = dnnl_memory_create(&user[i], raw ? &a->prim : &a->user, engine, ptrs[i]);
        if (st == dnnl_success && reorders[i])
            st = dnnl_memory_create(&prim[i], &a->prim, engine, ws + a->offset);
        args[i] = (dnnl_exec_arg_t){a->arg, reorders[i] ? prim[i] : user[i]};
    }
    if (st != dnnl_success)
        out = fr_dnnl_error(st, "creating memory objects");
    for (int i = 0; i < plan->nargs && out == FR_OK; i++)
        if (reorders[i] && !plan->args[i].output)
            out = execute(strm, plan->args[i].reorder, 2,
                          (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, user[i]}, {DNNL_ARG_TO, prim[i]}},
                          "a reorder");
    if (out == FR_OK) {
        args[plan->nargs] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, scratch};
        out = execute(strm, plan->prim, plan->nargs + (scratch ? 1 : 0), args, what);
    }
    for (int i = 0; i < plan->nargs && out == FR_OK; i++)
        if (reorders[i] && plan->args[i].output)
            out = execute(strm, plan->args[i].reorder, 2,
                          (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, prim[i]}, {DNNL_ARG_TO, user[i]}},
                          "a reorder");
    for (int i = 0; i < plan->nargs; i++) {
        dnnl_memory_destroy(user[i]);
        dnnl_memory_destroy(prim[i]);
    }
    dnnl_memory_destroy(scratch);
    return out;
}

fr_status fr_dnnl_plan_reorder_output(const fr_dnnl_plan *plan, int i, const void *from, void *to) {
    FR_ASSERT(i < plan->nargs && plan->args[i].output && fr_dnnl_engine());
    const fr_dnnl_arg *a = &plan->args[i];
    if (!a->reorder) {
        memcpy(to, from, dnnl_memory_desc_get_size(&a->user));
        return FR_OK;
    }
    dnnl_memory_t src = NULL, dst = NULL;
    dnnl_status_t st = dnnl_memory_create(&src, &a->prim, engine, (void *)from);
    if (st == dnnl_success)
        st = dnnl_memory_create(&dst, &a->user, engine, to);
    fr_status out = st == dnnl_success
                        ? execute(stream, a->reorder, 2,
                                  (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}},
                                  "a reorder")
                        : fr_dnnl_error(st, "creating memory objects");
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(dst);
    return out;
}

/* ---- the cache: a fixed hash table of chained entries, filled once per
 * key, never emptied (a few hundred plans for the largest model). ---- */
#define CACHE_BUCKETS 512
#define KEY_MAX 96

typedef struct cache_entry {
    struct cache_entry *next;
    fr_dnnl_build_fn build; /* part of the key: one table serves every kind of plan */
    size_t key_len;
    unsigned char key[KEY_MAX];
    fr_dnnl_plan plan;
} cache_entry;

static cache_entry *buckets[CACHE_BUCKETS];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (size_t)(h % CACHE_BUCKETS);
}

const fr_dnnl_plan *fr_dnnl_cached_plan(const void *key, size_t key_len, fr_dnnl_build_fn build) {
    FR_ASSERT(key_len <= KEY_MAX);
    if (!fr_dnnl_engine()) {
        fr_dnnl_error(engine_status, "creating the CPU engine");
        return NULL;
    }
    size_t b = hash_bytes(key, key_len);
    pthread_mutex_lock(&cache_lock);
    for (cache_entry *e = buckets[b]; e; e = e->next)
        if (e->build == build && e->key_len == key_len && memcmp(e->key, key, key_len) == 0) {
            pthread_mutex_unlock(&cache_lock);
            return &e->plan;
        }
    /* Built with the lock held: plans are built once per shape, and two
     * threads building the same key would waste a primitive. The entry is
     * plain malloc: it is library state like oneDNN's own kernels, not a
     * tensor byte (docs/ARCHITECTURE.md, "CPU convolution"). */
    cache_entry *e = calloc(1, sizeof *e);
    if (!e) {
        pthread_mutex_unlock(&cache_lock);
        fr_error(FR_ERR_OOM, "oneDNN: out of memory for a plan cache entry");
        return NULL;
    }
    e->build = build;
    e->key_len = key_len;
    memcpy(e->key, key, key_len);
    if (build(&e->plan, key) != FR_OK) {
        pthread_mutex_unlock(&cache_lock);
        free(e);
        return NULL;
    }
    e->next = buckets[b];
    buckets[b] = e;
    pthread_mutex_unlock(&cache_lock);
    return &e->plan;
}
#endif
