/* cpu/conv_dnnl.c: the kernel table's CPU convolutions (fr_cpu_conv2d_forward,
 * _bwd_data, _bwd_weight). With oneDNN (FR_HAVE_DNNL) they run oneDNN's
 * direct convolution, whose kernels are picked by CPUID features (AVX2,
 * AVX-512, ...) rather than by CPU model, so they are fast on machines
 * Debian's OpenBLAS does not recognise. Without it, or for a shape oneDNN
 * loses on, frugal's shifted-plane kernels (cpu/conv_shift.c: 3x3 stride-1
 * pad-1 layers on AVX2+FMA CPUs) or the im2col reference
 * (cpu/conv_im2col.c) run.
 *
 * Activations stay NCHW between ops; each oneDNN call reorders its operands
 * to the layout oneDNN prefers and back (docs/ARCHITECTURE.md, "CPU
 * convolution", has the measurements behind that choice). Beside the
 * kernel table's entries, fr_cpu_conv2d_nhwc (conv.h) takes channels-last
 * activations straight into oneDNN's nhwc kernels, with no activation
 * reorder, for the layout-between-ops work that doc describes. Which path a
 * shape takes is a fixed rule over the shape and the CPU's ISA class
 * (cpu/conv_rules.c), never a timing, and each (shape, direction, layout,
 * thread count) gets one plan
 * (fr_dnnl.h), built on first use and kept. So a shape always runs the same
 * kernel, in every process: every memory strategy stays bit for bit equal
 * to plain, and data-parallel ranks agree with one process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "../tensor/memory.h"
#include "conv.h"
#include "conv_chunk.h"
#include "fr_dnnl.h"
#include "isa.h"
#include "layout.h"
#include "threads.h"

static fr_cpu_conv_backend backend = FR_CPU_CONV_AUTO;

bool fr_cpu_have_dnnl(void) {
#ifdef FR_HAVE_DNNL
    return true;
#else
    return false;
#endif
}

fr_status fr_cpu_conv_set_backend(fr_cpu_conv_backend b) {
    if ((unsigned)b >= FR_CPU_CONV_BACKEND_COUNT)
        return fr_error(FR_ERR_ARG, "conv2d: unknown CPU backend %d", (int)b);
    if (!fr_cpu_have_dnnl() && b != FR_CPU_CONV_AUTO && b != FR_CPU_CONV_IM2COL)
        return fr_error(FR_ERR_ARG, "conv2d: this build has no oneDNN (libdnnl-dev was not found)");
    backend = b;
    return FR_OK;
}

fr_cpu_conv_backend fr_cpu_conv_get_backend(void) { return backend; }

enum { DIR_FWD = 0, DIR_BWD_DATA, DIR_BWD_WEIGHT };

/* One call on the caller's buffers, in the kernels' order (output first),
 * which is also the order of every oneDNN plan's arguments. */
typedef struct {
    void *out;
    const void *in0, *in1;
} conv_args;

static fr_status run_reference(const fr_conv_shape *s, int dir, const conv_args *a) {
    if (dir == DIR_FWD)
        return fr_cpu_conv2d_forward_im2col(a->out, a->in0, a->in1, s);
    if (dir == DIR_BWD_DATA)
        return fr_cpu_conv2d_backward_data_im2col(a->out, a->in0, a->in1, s);
    return fr_cpu_conv2d_backward_weight_im2col(a->out, a->in0, a->in1, s);
}

/* Where oneDNN does not run (or is not built): a 3x3 stride-1 pad-1 layer
 * takes the shifted-plane kernels under the AUTO backend where the rule
 * table says so (cpu/conv_rules.c), anything else the im2col reference. */
static bool own_takes_shift(const fr_conv_shape *s, int dir) {
    fr_cpu_isa isa;
    return backend == FR_CPU_CONV_AUTO && fr_cpu_conv_shift_applies(s) &&
           fr_cpu_isa_get(&isa) == FR_OK && fr_cpu_conv_own_shift(dir, isa);
}

static const char *own_impl(const fr_conv_shape *s, int dir) {
    return own_takes_shift(s, dir) ? "shift" : "im2col";
}

static fr_status run_own(const fr_conv_shape *s, int dir, const conv_args *a) {
    if (!own_takes_shift(s, dir))
        return run_reference(s, dir, a);
    if (dir == DIR_FWD)
        return fr_cpu_conv2d_forward_shift(a->out, a->in0, a->in1, s);
    if (dir == DIR_BWD_DATA)
        return fr_cpu_conv2d_backward_data_shift(a->out, a->in0, a->in1, s);
    return fr_cpu_conv2d_backward_weight_shift(a->out, a->in0, a->in1, s);
}

static fr_status run_by_transposes(const fr_conv_shape *s, int dir, const conv_args *a);

#ifdef FR_HAVE_DNNL

/* The activations' layout in frugal's buffers and in the primitive: NCHW
 * as it is (PLAIN, measurements only), NCHW reordered to the primitive's
 * preferred blocked layout and back (BLOCKED), or channels last in both
 * (NHWC: no activation reorder; fr_cpu_conv2d_nhwc). */
enum { LAYOUT_PLAIN = 0, LAYOUT_BLOCKED, LAYOUT_NHWC };

typedef struct {
    fr_conv_shape s;
    int dir, layout, threads;
    dnnl_data_type_t dt; /* of every operand: f32, or bf16 (cpu/conv_bf16.c) */
} conv_key;

static void init_md(dnnl_memory_desc_t *md, int a, int b, int c, int d, dnnl_data_type_t dt,
                    dnnl_format_tag_t tag) {
    dnnl_dims_t dims = {a, b, c, d};
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(md, 4, dims, dt, tag);
    FR_ASSERT(st == dnnl_success);
}

/* The weight's descriptor: (K, C, R, S), or for groups g oneDNN's (g,
 * K/g, C/g, R, S), which is the same bytes as frugal's (K, C/g, R, S). */
static void init_weight_md(dnnl_memory_desc_t *md, const fr_conv_shape *s, dnnl_data_type_t dt,
                           bool any) {
    int g = fr_conv_groups(s);
    if (g == 1) {
        init_md(md, s->k, s->c, s->r, s->s, dt, any ? dnnl_format_tag_any : dnnl_oihw);
        return;
    }
    dnnl_dims_t dims = {g, s->k / g, s->c / g, s->r, s->s};
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(md, 5, dims, dt,
                                                    any ? dnnl_format_tag_any : dnnl_goihw);
    FR_ASSERT(st == dnnl_success);
}

static fr_status build_conv(fr_dnnl_plan *plan, const void *key_) {
    const conv_key *key = key_;
    const fr_conv_shape *s = &key->s;
    dnnl_memory_desc_t x_user, w_user, y_user, x_md, w_md, y_md;
    dnnl_data_type_t dt = key->dt;
    dnnl_format_tag_t user = key->layout == LAYOUT_NHWC ? dnnl_nhwc : dnnl_nchw;
    init_md(&x_user, s->n, s->c, s->h, s->w, dt, user);
    init_weight_md(&w_user, s, dt, false);
    init_md(&y_user, s->n, s->k, s->oh, s->ow, dt, user);
    dnnl_format_tag_t act = key->layout == LAYOUT_BLOCKED ? dnnl_format_tag_any : user;
    init_md(&x_md, s->n, s->c, s->h, s->w, dt, act);
    init_weight_md(&w_md, s, dt, key->layout != LAYOUT_PLAIN);
    init_md(&y_md, s->n, s->k, s->oh, s->ow, dt, act);
    /* OH = (H + 2 pad - d (R - 1) - 1) / stride + 1 rounds down; oneDNN
     * wants the right padding that makes the division exact (at most pad).
     * Its dilation counts the gaps between taps (frugal's minus one). */
    int d = fr_conv_dilation(s);
    dnnl_dims_t strides = {s->stride, s->stride}, pad_l = {s->pad, s->pad}, dil = {d - 1, d - 1};
    dnnl_dims_t pad_r = {(s->oh - 1) * s->stride + (s->r - 1) * d + 1 - s->h - s->pad,
                         (s->ow - 1) * s->stride + (s->s - 1) * d + 1 - s->w - s->pad};
    dnnl_convolution_desc_t fwd_d, bwd_d;
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(
        &fwd_d, dnnl_forward_training, dnnl_convolution_direct, &x_md, &w_md, NULL, &y_md, strides,
        dil, pad_l, pad_r);
    if (st != dnnl_success)
        return fr_dnnl_error(st, "describing a convolution");
    dnnl_primitive_attr_t attr = fr_dnnl_attr_new();
    if (!attr)
        return fr_last_status();
    dnnl_primitive_desc_t fwd_pd = NULL, pd = NULL;
    st = dnnl_primitive_desc_create(&fwd_pd, &fwd_d, attr, fr_dnnl_engine(), NULL);
    fr_status out;
    if (key->dir == DIR_FWD) {
        out = fr_dnnl_plan_init(plan, st, fwd_pd, 3,
                                (int[]){DNNL_ARG_DST, DNNL_ARG_SRC, DNNL_ARG_WEIGHTS},
                                (dnnl_memory_desc_t[]){y_user, x_user, w_user},
                                (bool[]){true, false, false});
        dnnl_primitive_attr_destroy(attr);
        return out;
    }
    if (st != dnnl_success) { /* no forward hint: the backward passes go the reference way */
        dnnl_primitive_attr_destroy(attr);
        return fr_dnnl_plan_init(plan, st, NULL, 0, NULL, NULL, NULL);
    }
    if (key->dir == DIR_BWD_DATA) {
        st = dnnl_dilated_convolution_backward_data_desc_init(
            &bwd_d, dnnl_convolution_direct, &x_md, &w_md, &y_md, strides, dil, pad_l, pad_r);
        if (st == dnnl_success)
            st = dnnl_primitive_desc_create(&pd, &bwd_d, attr, fr_dnnl_engine(), fwd_pd);
        out = fr_dnnl_plan_init(plan, st, pd, 3,
                                (int[]){DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS},
                                (dnnl_memory_desc_t[]){x_user, y_user, w_user},
                                (bool[]){true, false, false});
    } else {
        st = dnnl_dilated_convolution_backward_weights_desc_init(
            &bwd_d, dnnl_convolution_direct, &x_md, &w_md, NULL, &y_md, strides, dil, pad_l, pad_r);
        if (st == dnnl_success)
            st = dnnl_primitive_desc_create(&pd, &bwd_d, attr, fr_dnnl_engine(), fwd_pd);
        out = fr_dnnl_plan_init(plan, st, pd, 3,
                                (int[]){DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST, DNNL_ARG_SRC},
                                (dnnl_memory_desc_t[]){w_user, y_user, x_user},
                                (bool[]){true, false, false});
    }
    dnnl_primitive_desc_destroy(fwd_pd);
    dnnl_primitive_attr_destroy(attr);
    return out;
}

/* The plan of a layout for a shape and direction, for oneDNN running on
 * `threads` threads; NULL with *failed FR_OK when oneDNN has no kernel for
 * it. */
static const fr_dnnl_plan *plan_typed(const fr_conv_shape *s, int dir, int layout, int threads,
                                      dnnl_data_type_t dt, fr_status *failed) {
    conv_key key;
    memset(&key, 0, sizeof key);
    key.s = *s;
    key.dir = dir;
    key.layout = layout;
    key.threads = threads;
    key.dt = dt;
    const fr_dnnl_plan *p = fr_dnnl_cached_plan(&key, sizeof key, build_conv);
    *failed = p ? FR_OK : fr_last_status();
    return p && p->prim ? p : NULL;
}

static const fr_dnnl_plan *plan_on(const fr_conv_shape *s, int dir, int layout, int threads,
                                   fr_status *failed) {
    return plan_typed(s, dir, layout, threads, dnnl_f32, failed);
}

static const fr_dnnl_plan *plan_of(const fr_conv_shape *s, int dir, int layout, fr_status *failed) {
    return plan_on(s, dir, layout, fr_dnnl_threads(), failed);
}

static fr_status run_plan(const fr_dnnl_plan *p, int dir, const conv_args *a) {
    static const char *const what[] = {"conv2d forward", "conv2d backward (data)",
                                       "conv2d backward (weight)"};
    return fr_dnnl_plan_run(p, (void *[]){a->out, (void *)a->in0, (void *)a->in1}, what[dir]);
}

/* The bf16 plan of a data pass (blocked layout, the team's threads) */
static const fr_dnnl_plan *bf16_plan(const fr_conv_shape *s, int dir, fr_status *failed) {
    return plan_typed(s, dir, LAYOUT_BLOCKED, fr_dnnl_threads(), dnnl_bf16, failed);
}

/* The bf16 pass and its workspace, for fr_cpu_conv_in_chunks (conv_chunk.h) */
static fr_status bf16_ws(const fr_conv_shape *s, int dir, size_t *bytes) {
    fr_status failed;
    const fr_dnnl_plan *p = bf16_plan(s, dir, &failed);
    *bytes = p ? p->ws_bytes : 0;
    return failed;
}

static fr_status bf16_pass(const fr_conv_shape *s, int dir, void *out, const void *in0,
                           const void *in1) {
    fr_status failed;
    const fr_dnnl_plan *p = bf16_plan(s, dir, &failed);
    if (failed != FR_OK)
        return failed;
    if (!p) /* the whole batch's plan existed (fr_cpu_conv_dnnl_bf16) */
        return fr_error(FR_ERR_ARG, "conv2d: no bf16 kernel for a chunk of %d images", s->n);
    return run_plan(p, dir, &(conv_args){out, in0, in1});
}

/* conv.h: a forward or backward (data) pass on bf16 buffers, oneDNN in its
 * preferred layout (f32 accumulation inside), in chunks of images under the
 * workspace cap as the f32 passes (an image's bits do not depend on its
 * chunk: tests/test_conv_bf16.c). */
fr_status fr_cpu_conv_dnnl_bf16(void *out, const void *in0, const void *in1, const fr_conv_shape *s,
                                int direction, bool *ran) {
    fr_status failed;
    *ran = false;
    if (direction != DIR_FWD && direction != DIR_BWD_DATA)
        return fr_error(FR_ERR_ARG, "conv2d: bf16 compute has no weight-gradient pass");
    const fr_dnnl_plan *p = bf16_plan(s, direction, &failed);
    if (failed != FR_OK || !p)
        return failed;
    *ran = true;
    return fr_cpu_conv_in_chunks(s, direction, 2, out, in0, in1, bf16_ws, bf16_pass);
}

/* Products per weight that one oneDNN weight-gradient call sums in one
 * f32 chain, at most (unless one image has more): its kernel adds every
 * pixel it is given into one accumulator per weight. */
#define WEIGHT_CHAIN_PIXELS 1024

/* Weights per block of the group sum: a block of every partial (16 x 4
 * KiB) stays in L1/L2 while it is added up. */
#define SUM_BLOCK 1024

/* Images per oneDNN weight-gradient call: as many as keep its chain within
 * WEIGHT_CHAIN_PIXELS. Depends on the shape of one image only. */
static int images_per_call(const fr_conv_shape *s) {
    long long px = (long long)s->oh * s->ow;
    long long m = px > 0 ? WEIGHT_CHAIN_PIXELS / px : 1;
    return m < 1 ? 1 : m > 64 ? 64 : (int)m;
}

/* The single-threaded oneDNN weight-gradient plan for `images` images of
 * s: built while this thread's team is 1, which is what oneDNN sizes a
 * primitive's work split by. NULL with *failed FR_OK when oneDNN has no
 * kernel. */
static const fr_dnnl_plan *weight_plan(const fr_conv_shape *s, int images, int layout,
                                       fr_status *failed) {
    fr_conv_shape part = *s;
    part.n = images;
    int team = omp_get_max_threads();
    omp_set_num_threads(1);
    const fr_dnnl_plan *p = plan_on(&part, DIR_BWD_WEIGHT, layout, 1, failed);
    omp_set_num_threads(team);
    return p;
}

/* The weight gradient on oneDNN, independent of the thread count and
 * within a factor of two of frugal's own kernels' round-off: oneDNN's
 * kernel sums each weight in one f32 chain over every pixel it is given,
 * and its multi-threaded form splits that sum by the team size. So the
 * images are cut into FR_CONV_WEIGHT_GROUPS groups as in frugal's own
 * kernels; within a group, single-threaded oneDNN calls of at most
 * images_per_call images each are added in order into the group's
 * partial; the partials are added in group order (docs/ARCHITECTURE.md,
 * "CPU convolution and GEMM"). */
static fr_status run_weight_groups(const fr_conv_shape *s, const conv_args *a, int layout) {
    int groups = s->n < FR_CONV_WEIGHT_GROUPS ? s->n : FR_CONV_WEIGHT_GROUPS;
    int per_call = images_per_call(s);
    /* every call size a group can need, built here, outside the parallel
     * region (plans[i]: i + 1 images) */
    const fr_dnnl_plan *plans[64] = {NULL};
    const fr_dnnl_plan *first_plan = NULL;
    size_t plan_ws = 0;
    bool sums = false; /* a group takes more than one call */
    /* raw: the partials stay in the primitive's weight layout (an
     * ABcd16b16a, say), when every call size has the same one and it pads
     * nothing (so the workspace, and the ledger's peak, stay as they were),
     * and are reordered to frugal's once, after the group sum; a reorder is
     * a permutation, so every weight gets the same sums in the same order
     * as when each call's gradient was reordered (docs/ARCHITECTURE.md,
     * "CPU convolution and GEMM") */
    size_t dw_len = (size_t)s->k * (s->c / fr_conv_groups(s)) * s->r * s->s;
    bool raw = true;
    for (int g = 0; g < groups; g++) {
        int len = (int)((long long)s->n * (g + 1) / groups) - (int)((long long)s->n * g / groups);
        sums |= len > per_call;
        for (int left = len; left > 0; left -= per_call) {
            int m = left < per_call ? left : per_call;
            if (plans[m - 1])
                continue;
            fr_status failed;
            plans[m - 1] = weight_plan(s, m, layout, &failed);
            if (failed != FR_OK)
                return failed;
            if (!plans[m - 1])
                return layout == LAYOUT_NHWC ? run_by_transposes(s, DIR_BWD_WEIGHT, a)
                                             : run_own(s, DIR_BWD_WEIGHT, a);
            plan_ws = plans[m - 1]->ws_bytes > plan_ws ? plans[m - 1]->ws_bytes : plan_ws;
            if (!first_plan)
                first_plan = plans[m - 1];
            raw = raw && plans[m - 1]->args[0].reorder &&
                  plans[m - 1]->args[0].bytes == dw_len * sizeof(float) &&
                  dnnl_memory_desc_equal(&plans[m - 1]->args[0].prim, &first_plan->args[0].prim);
        }
    }
    size_t dw_bytes = (dw_len * sizeof(float) + 63) & ~(size_t)63;
    /* per thread: a plan's workspace and, where a group sums calls, one
     * call's gradient (a group's first call writes its partial directly) */
    size_t per_thread = ((plan_ws + 63) & ~(size_t)63) + (sums ? dw_bytes : 0);
    int threads = fr_cpu_threads() < groups ? fr_cpu_threads() : groups;
    size_t ws_bytes = dw_bytes * (size_t)groups + per_thread * (size_t)threads;
    char *ws = fr_mem_alloc(FR_CPU, ws_bytes, FR_TAG_WORKSPACE);
    if (!ws)
        return fr_last_status();
    size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * s->oh * s->ow;
    fr_status status[FR_CONV_WEIGHT_GROUPS];
    /* the groups' sum, in group order, into group 0's partial when it is
     * reordered afterwards, else straight into dw */
    float *dw = raw ? (float *)ws : a->out;
#pragma omp parallel num_threads(threads)
    {
        char *tws = ws + dw_bytes * (size_t)groups + per_thread * (size_t)omp_get_thread_num();
        float *call_dw = sums ? (float *)(tws + per_thread - dw_bytes) : NULL;
        /* one stream per thread for all its calls (a stream is not for
         * concurrent use; creating one per call cost more than a small
         * call's reorders) */
        dnnl_stream_t strm = NULL;
        fr_status st_strm = fr_dnnl_stream_new(&strm);
#pragma omp for schedule(static)
        for (int g = 0; g < groups; g++) {
            float *part = (float *)(ws + dw_bytes * (size_t)g);
            int first = (int)((long long)s->n * g / groups);
            int end = (int)((long long)s->n * (g + 1) / groups);
            status[g] = st_strm;
            for (int i = first; i < end && status[g] == FR_OK; i += per_call) {
                int m = end - i < per_call ? end - i : per_call;
                void *ptrs[] = {i == first ? part : call_dw,
                                (void *)((const float *)a->in0 + i * y_img),
                                (void *)((const float *)a->in1 + i * x_img)};
                status[g] = fr_dnnl_plan_run_in(plans[m - 1], ptrs, tws, strm, raw,
                                                "conv2d backward (weight)");
                if (i > first)
#pragma omp simd
                    for (size_t j = 0; j < dw_len; j++)
                        part[j] += call_dw[j];
            }
        }
        if (strm)
            dnnl_stream_destroy(strm);
        /* the implicit barrier above: every partial is complete. Then one
         * pass over the weights in blocks, each weight summed over the
         * groups in group order (group 0's partial first, as it was): one
         * barrier, where a loop over the groups with a vector loop inside
         * took one per group, and each block read once */
        bool ok = true;
        for (int g = 0; g < groups; g++)
            ok = ok && status[g] == FR_OK;
#pragma omp for schedule(static)
        for (size_t j0 = 0; j0 < dw_len; j0 += SUM_BLOCK) {
            if (!ok)
                continue;
            size_t len = dw_len - j0 < SUM_BLOCK ? dw_len - j0 : SUM_BLOCK;
            float *d = dw + j0;
            if (d != (float *)ws + j0)
                memcpy(d, ws + j0 * sizeof(float), len * sizeof(float));
            for (int g = 1; g < groups; g++) {
                const float *pg = (const float *)(ws + dw_bytes * (size_t)g) + j0;
#pragma omp simd
                for (size_t j = 0; j < len; j++)
                    d[j] += pg[j];
            }
        }
    }
    fr_status out = FR_OK;
    for (int g = 0; g < groups && out == FR_OK; g++)
        if (status[g] != FR_OK) /* the message was the worker thread's */
            out = fr_error(status[g], "conv2d backward (weight): oneDNN failed on image group %d "
                           "of %d (%d->%d %dx%d at %dx%d)", g, groups, s->c, s->k, s->r, s->s,
                           s->h, s->w);
    if (out == FR_OK && raw)
        out = fr_dnnl_plan_reorder_output(first_plan, 0, ws, a->out);
    fr_mem_free(FR_CPU, ws, ws_bytes, FR_TAG_WORKSPACE);
    return out;
}

/* The blocked layout's pass and its workspace, for fr_cpu_conv_in_chunks
 * (conv_chunk.h). */
static fr_status blocked_ws(const fr_conv_shape *s, int dir, size_t *bytes) {
    fr_status failed;
    const fr_dnnl_plan *p = plan_of(s, dir, LAYOUT_BLOCKED, &failed);
    *bytes = p ? p->ws_bytes : 0;
    return failed;
}

static fr_status blocked_pass(const fr_conv_shape *s, int dir, void *out, const void *in0,
                              const void *in1) {
    fr_status failed;
    const fr_dnnl_plan *p = plan_of(s, dir, LAYOUT_BLOCKED, &failed);
    conv_args a = {out, in0, in1};
    if (failed != FR_OK)
        return failed;
    return p ? run_plan(p, dir, &a) : run_reference(s, dir, &a);
}

static fr_status run(const fr_conv_shape *s, int dir, const conv_args *a) {
    fr_status failed;
    const fr_dnnl_plan *p = NULL;
    if (backend == FR_CPU_CONV_IM2COL || s->n <= 0 || s->c <= 0 || s->k <= 0 || s->oh <= 0 ||
        s->ow <= 0)
        return run_reference(s, dir, a);
    fr_conv_path path;
    FR_TRY(fr_cpu_conv_path(s, dir, &path));
    if (backend == FR_CPU_CONV_DNNL_GROUPS)
        path = dir == DIR_BWD_WEIGHT ? FR_CONV_PATH_DNNL_GROUPS : FR_CONV_PATH_DNNL;
    else if (backend != FR_CPU_CONV_AUTO) {
        p = plan_of(s, dir, backend == FR_CPU_CONV_DNNL_PLAIN ? LAYOUT_PLAIN : LAYOUT_BLOCKED,
                    &failed);
        if (failed != FR_OK)
            return failed;
        return p ? run_plan(p, dir, a) : run_reference(s, dir, a);
    }
    if (path == FR_CONV_PATH_DNNL_GROUPS)
        return run_weight_groups(s, a, LAYOUT_BLOCKED);
    if (path == FR_CONV_PATH_DNNL) /* data passes: chunks of images under the cap */
        return fr_cpu_conv_in_chunks(s, dir, sizeof(float), a->out, a->in0, a->in1, blocked_ws,
                                     blocked_pass);
    return run_own(s, dir, a);
}

/* The weight gradient's name in image groups: oneDNN's kernel for one
 * call's images, else what runs instead (`fallback`). */
static const char *groups_impl(const fr_conv_shape *s, int layout, const char *fallback) {
    static _Thread_local char name[64];
    fr_status failed;
    int m = images_per_call(s);
    const fr_dnnl_plan *p = weight_plan(s, m < s->n ? m : s->n, layout, &failed);
    snprintf(name, sizeof name, "%s/groups", p ? p->impl : fallback);
    return name;
}

const char *fr_cpu_conv_impl(const fr_conv_shape *s, int direction) {
    fr_status failed;
    fr_conv_path path = FR_CONV_PATH_OWN;
    if (backend == FR_CPU_CONV_IM2COL ||
        (backend == FR_CPU_CONV_AUTO &&
         (fr_cpu_conv_path(s, direction, &path) != FR_OK || path == FR_CONV_PATH_OWN)))
        return own_impl(s, direction);
    if (backend == FR_CPU_CONV_DNNL_GROUPS && direction == DIR_BWD_WEIGHT)
        path = FR_CONV_PATH_DNNL_GROUPS;
    if (path == FR_CONV_PATH_DNNL_GROUPS)
        return groups_impl(s, LAYOUT_BLOCKED, own_impl(s, DIR_BWD_WEIGHT));
    const fr_dnnl_plan *p =
        plan_of(s, direction, backend == FR_CPU_CONV_DNNL_PLAIN ? LAYOUT_PLAIN : LAYOUT_BLOCKED,
                &failed);
    return p ? p->impl : "im2col";
}

/* A channels-last pass (fr_cpu_conv2d_nhwc, below): oneDNN's nhwc kernels
 * where the rule says direct, else the transposes. */
static fr_status run_nhwc(const fr_conv_shape *s, int dir, const conv_args *a) {
    bool direct = false;
    FR_TRY(fr_cpu_conv_nhwc_path(s, dir, &direct));
    if (!direct || backend != FR_CPU_CONV_AUTO || s->n <= 0 || s->c <= 0 || s->k <= 0 ||
        s->oh <= 0 || s->ow <= 0)
        return run_by_transposes(s, dir, a);
    if (dir == DIR_BWD_WEIGHT)
        return run_weight_groups(s, a, LAYOUT_NHWC);
    fr_status failed;
    const fr_dnnl_plan *p = plan_of(s, dir, LAYOUT_NHWC, &failed);
    if (failed != FR_OK)
        return failed;
    return p ? run_plan(p, dir, a) : run_by_transposes(s, dir, a);
}

const char *fr_cpu_conv_nhwc_impl(const fr_conv_shape *s, int direction) {
    bool direct = false;
    if (fr_cpu_conv_nhwc_path(s, direction, &direct) != FR_OK || !direct ||
        backend != FR_CPU_CONV_AUTO)
        return "transposes";
    if (direction == DIR_BWD_WEIGHT)
        return groups_impl(s, LAYOUT_NHWC, "transposes");
    fr_status failed;
    const fr_dnnl_plan *p = plan_of(s, direction, LAYOUT_NHWC, &failed);
    return p ? p->impl : "transposes";
}

#else /* no oneDNN: frugal's own kernels only */

static fr_status run_nhwc(const fr_conv_shape *s, int dir, const conv_args *a) {
    return run_by_transposes(s, dir, a);
}

const char *fr_cpu_conv_nhwc_impl(const fr_conv_shape *s, int direction) {
    (void)s, (void)direction;
    return "transposes";
}

const char *fr_cpu_conv_impl(const fr_conv_shape *s, int direction) {
    return own_impl(s, direction);
}

fr_status fr_cpu_conv_dnnl_bf16(void *out, const void *in0, const void *in1, const fr_conv_shape *s,
                                int direction, bool *ran) {
    (void)out, (void)in0, (void)in1, (void)s, (void)direction;
    *ran = false;
    return FR_OK;
}

static fr_status run(const fr_conv_shape *s, int dir, const conv_args *a) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa)); /* a refused FR_CPU_ISA fails here too */
    return run_own(s, dir, a);
}

#endif

/* A channels-last pass on NCHW copies of its activations (workspace): the
 * NCHW path's kernels and bits, plus two or three transposes. Operands in
 * the kernels' order: fwd (y, x, w), bwd_data (dx, dy, w), bwd_weight (dw,
 * dy, x). */
static fr_status run_by_transposes(const fr_conv_shape *s, int dir, const conv_args *a) {
    size_t xn = (size_t)s->n * s->c * s->h * s->w, yn = (size_t)s->n * s->k * s->oh * s->ow;
    int xhw = s->h * s->w, yhw = s->oh * s->ow;
    /* out's and in0's sizes and channels, in1's when it is an activation */
    size_t out_n = dir == DIR_FWD ? yn : dir == DIR_BWD_DATA ? xn : 0;
    size_t in0_n = dir == DIR_FWD ? xn : yn;
    size_t in1_n = dir == DIR_BWD_WEIGHT ? xn : 0;
    size_t bytes = (out_n + in0_n + in1_n) * sizeof(float);
    float *ws = bytes ? fr_mem_alloc(FR_CPU, bytes, FR_TAG_WORKSPACE) : NULL;
    if (bytes && !ws)
        return fr_last_status();
    float *out = out_n ? ws : a->out, *in0 = ws + out_n;
    float *in1 = in1_n ? in0 + in0_n : (float *)a->in1;
    /* in0 is x (forward) or dy (both backward passes) */
    if (dir == DIR_FWD)
        fr_cpu_nhwc_to_nchw(in0, a->in0, s->n, s->c, xhw);
    else
        fr_cpu_nhwc_to_nchw(in0, a->in0, s->n, s->k, yhw);
    if (in1_n)
        fr_cpu_nhwc_to_nchw(in1, a->in1, s->n, s->c, xhw);
    fr_status st = run(s, dir, &(conv_args){out, in0, in1});
    if (st == FR_OK && dir == DIR_FWD)
        fr_cpu_nchw_to_nhwc(a->out, out, s->n, s->k, yhw);
    else if (st == FR_OK && dir == DIR_BWD_DATA)
        fr_cpu_nchw_to_nhwc(a->out, out, s->n, s->c, xhw);
    if (ws)
        fr_mem_free(FR_CPU, ws, bytes, FR_TAG_WORKSPACE);
    return st;
}

/* conv.h: channels-last activations straight into oneDNN's nhwc kernels
 * where the rule says so (the weight gradient in the same image groups as
 * the NCHW path: an image's pixels are contiguous in both layouts), else
 * through NCHW copies (run_nhwc, one per build). */
fr_status fr_cpu_conv2d_nhwc(int direction, float *out, const float *in0, const float *in1,
                             const fr_conv_shape *s) {
    if ((unsigned)direction > DIR_BWD_WEIGHT)
        return fr_error(FR_ERR_ARG, "conv2d (nhwc): direction %d is not 0, 1 or 2", direction);
    return run_nhwc(s, direction, &(conv_args){out, in0, in1});
}

fr_status fr_cpu_conv2d_forward(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    return run(s, DIR_FWD, &(conv_args){y, x, w});
}

fr_status fr_cpu_conv2d_backward_data(float *dx, const float *dy, const float *w, const fr_conv_shape *s) {
    return run(s, DIR_BWD_DATA, &(conv_args){dx, dy, w});
}

fr_status fr_cpu_conv2d_backward_weight(float *dw, const float *dy, const float *x, const fr_conv_shape *s) {
    return run(s, DIR_BWD_WEIGHT, &(conv_args){dw, dy, x});
}
