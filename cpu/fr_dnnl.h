/* fr_dnnl.h: frugal's glue to oneDNN (C API, dnnl.h), the CPU twin of the
 * cuDNN glue in cuda/conv_cudnn.cu. Internal to cpu/.
 *
 * A *plan* is one oneDNN primitive plus what it takes to run it on frugal's
 * plain row-major (NCHW, OIHW) buffers: for each argument whose layout the
 * primitive wants different (a blocked nChw8c, say), a reorder to or from a
 * buffer in the workspace. Every byte a plan needs at run time (oneDNN's
 * scratchpad, the reordered copies) is one fr_mem_alloc under
 * FR_TAG_WORKSPACE, freed before the call returns, so the ledger stays exact;
 * the primitives are created in user-scratchpad mode for that reason.
 *
 * Plans are cached by a key (the shape, the direction, the dtype, the
 * thread count) for the life of the process, so one shape always runs the
 * same primitive: results are reproducible bit for bit from call to call and
 * from strategy to strategy (docs/ARCHITECTURE.md, "CPU convolution"). */
#ifndef FR_CPU_DNNL_H
#define FR_CPU_DNNL_H

#include "../tensor/fr_base.h"

#ifdef FR_HAVE_DNNL
#include <dnnl.h>

#define FR_DNNL_MAX_ARGS 4

typedef struct {
    int arg;                    /* DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, ... */
    bool output;                /* written by the primitive */
    dnnl_memory_desc_t user;    /* the layout of frugal's buffer */
    dnnl_memory_desc_t prim;    /* the layout the primitive wants */
    dnnl_primitive_t reorder;   /* user -> prim (inputs), prim -> user (outputs); NULL: same */
    size_t offset, bytes;       /* the reordered copy in the workspace */
} fr_dnnl_arg;

typedef struct {
    dnnl_primitive_t prim;      /* NULL: oneDNN has no implementation (use the reference) */
    int nargs;
    fr_dnnl_arg args[FR_DNNL_MAX_ARGS];
    size_t scratch_bytes;       /* oneDNN's scratchpad, at offset 0 of the workspace */
    size_t ws_bytes;            /* scratchpad + reordered copies */
    char impl[48];              /* oneDNN's implementation name, for benchmarks */
} fr_dnnl_plan;

/* The process-wide CPU engine and stream (created on first use). */
dnnl_engine_t fr_dnnl_engine(void);

/* A user-scratchpad attribute, or NULL with the error set. */
dnnl_primitive_attr_t fr_dnnl_attr_new(void);

/* Turns a oneDNN status into an fr_status with a message naming `what`. */
fr_status fr_dnnl_error(dnnl_status_t st, const char *what);

/* Fills `plan` from a primitive descriptor (which it takes over and
 * destroys): creates the primitive and, for each of the `nargs` arguments
 * (ids, frugal's layouts, which are outputs), a reorder where the layouts
 * differ. A descriptor that failed with dnnl_unimplemented leaves
 * plan->prim NULL and returns FR_OK. */
fr_status fr_dnnl_plan_init(fr_dnnl_plan *plan, dnnl_status_t pd_status,
                            dnnl_primitive_desc_t pd, int nargs, const int *ids,
                            const dnnl_memory_desc_t *user, const bool *output);
void fr_dnnl_plan_destroy(fr_dnnl_plan *plan);

/* Runs a plan on frugal buffers ptrs[i] (argument i of the plan). */
fr_status fr_dnnl_plan_run(const fr_dnnl_plan *plan, void *const *ptrs, const char *what);

/* The same in a workspace the caller allocated (plan->ws_bytes, 64-byte
 * aligned), for calls from inside a parallel region: allocating there would
 * make the ledger's peak depend on how the threads interleave. strm: a
 * stream of the caller's (fr_dnnl_stream_new; one per thread, since a
 * stream is not for concurrent use), or NULL for the shared one.
 * raw_outputs: the outputs' buffers are in the primitive's layout
 * (args[i].prim, args[i].bytes of them), not reordered to frugal's; the
 * caller reorders them later with fr_dnnl_plan_reorder_output (the weight
 * gradient's image groups sum their partials that way, cpu/conv_dnnl.c). */
fr_status fr_dnnl_plan_run_in(const fr_dnnl_plan *plan, void *const *ptrs, void *ws,
                              dnnl_stream_t strm, bool raw_outputs, const char *what);

/* A stream on the engine for one thread's calls; destroy with
 * dnnl_stream_destroy. */
fr_status fr_dnnl_stream_new(dnnl_stream_t *out);

/* Reorders output argument i of a plan from the primitive's layout (`from`,
 * as fr_dnnl_plan_run_in's raw_outputs left it) to frugal's (`to`), on the
 * shared stream; a plain copy when the layouts agree. */
fr_status fr_dnnl_plan_reorder_output(const fr_dnnl_plan *plan, int i, const void *from, void *to);

/* The plan cached under (`build`, `key`) (key_len bytes, compared
 * bytewise), built by `build(plan, key)` on first use. Never NULL unless building failed (the
 * error is set); the plan may have prim NULL (no implementation). */
typedef fr_status (*fr_dnnl_build_fn)(fr_dnnl_plan *plan, const void *key);
const fr_dnnl_plan *fr_dnnl_cached_plan(const void *key, size_t key_len, fr_dnnl_build_fn build);

/* How many threads oneDNN will use for a call from here (part of every
 * key: a primitive's work split is fixed when it is created). */
int fr_dnnl_threads(void);
#endif

#endif
