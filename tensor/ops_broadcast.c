/* ops_broadcast.c: checked binary ops with NumPy broadcasting, sums over
 * chosen dims, and expanding a tensor to a broadcast shape (see ops.h).
 *
 * Operands may be f32, f16 or bf16, each its own (docs/ARCHITECTURE.md,
 * "Mixed precision: half storage, f32 arithmetic"). An all-f32 call runs
 * the kernel once on the tensors' memory, as before staging existed. With
 * a half operand the op is blocked over the output's leading dims, the
 * longest run along which every operand is either walked (a block of it
 * is staged) or broadcast (it is staged whole, once: it is at most the
 * output's size over the blocked dims' extent). A squeeze-excitation's
 * (N, C, H, W) times (N, C, 1, 1) is N * C units of H * W elements; its
 * gradient's sum over H and W the same units reduced to one element. A
 * unit is never split: a block holds one unit at least, so where the run
 * is N alone ((N, C, H, W) times (N, 1, H, W)) a block is at least one
 * whole image. */
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "memory.h"
#include "ops.h"
#include "staging.h"

fr_status fr_broadcast_shape(const char *op, const fr_tensor *a, const fr_tensor *b, int *ndim,
                             int64_t *shape) {
    FR_TRY(fr_check_defined(op, "a", a));
    FR_TRY(fr_check_defined(op, "b", b));
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int k = 1; k <= nd; k++) {
        int64_t sa = k <= a->ndim ? a->shape[a->ndim - k] : 1;
        int64_t sb = k <= b->ndim ? b->shape[b->ndim - k] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char ba[64], bb[64];
            return fr_error(FR_ERR_SHAPE,
                            "%s: a %s and b %s do not broadcast (dim %d from the end: %lld vs %lld)",
                            op, fr_shape_str(a, ba, sizeof ba), fr_shape_str(b, bb, sizeof bb), k,
                            (long long)sa, (long long)sb);
        }
        shape[nd - k] = sa == 1 ? sb : sa;
    }
    *ndim = nd;
    return FR_OK;
}

/* t's strides against an output of nd dims, right-aligned, 0 where t has
 * size 1 (or no such dim). t is contiguous. */
static void bcast_strides(long long *stride, const fr_tensor *t, int nd) {
    long long st = 1;
    for (int k = 1; k <= nd; k++) {
        int d = t->ndim - k;
        int64_t size = d >= 0 ? t->shape[d] : 1;
        stride[nd - k] = size == 1 ? 0 : st;
        st *= size;
    }
}

/* ---- the staged binary op ---- */

typedef struct {
    fr_bcast_shape s;      /* dim 0 the blocked units; a block sets its count */
    const float *whole[2]; /* an operand broadcast over the units, staged once */
    int slot[2];           /* else its index among the block's staged inputs */
    fr_binary_op op;
} bcast_block_args;

static fr_status bcast_block(fr_device dev, float *out, const float *const *in, size_t count,
                             size_t first, const void *args) {
    (void)first;
    const bcast_block_args *g = args;
    fr_bcast_shape s = g->s;
    s.shape[0] = (long long)count;
    const float *p[2];
    for (int i = 0; i < 2; i++)
        p[i] = g->whole[i] ? g->whole[i] : g->slot[i] >= 0 ? in[g->slot[i]] : NULL;
    return FR_CALL_KERNEL(dev, bcast_binary, out, p[0], p[1], g->op, &s);
}

/* out = a op b (b NULL for FR_BINARY_FIRST) with a half operand or output.
 * s is the full record (out's dims, contiguous operands). */
static fr_status bcast_staged(fr_tensor *out, const fr_tensor *a, const fr_tensor *b,
                              fr_binary_op op, const fr_bcast_shape *s) {
    if (fr_numel(out) == 0)
        return FR_OK;
    const fr_tensor *t[2] = {a, b};
    const long long *stride[2] = {s->stride_a, s->stride_b};
    /* k: the leading dims over which each operand is walked throughout or
     * broadcast throughout (dims of size 1 fit either) */
    int k = 0, pattern = -1;
    for (; k < s->ndim; k++) {
        if (s->shape[k] == 1)
            continue;
        int p = (stride[0][k] == 0) | (b && stride[1][k] == 0) << 1;
        if (pattern >= 0 && p != pattern)
            break;
        pattern = p;
    }
    long long units = 1;
    for (int d = 0; d < k; d++)
        units *= s->shape[d];
    bcast_block_args g = {.op = op, .slot = {-1, -1}};
    g.s.ndim = 1 + s->ndim - k;
    g.s.shape[0] = units;
    for (int d = k; d < s->ndim; d++) {
        g.s.shape[1 + d - k] = s->shape[d];
        g.s.stride_a[1 + d - k] = s->stride_a[d];
        g.s.stride_b[1 + d - k] = s->stride_b[d];
    }
    const fr_tensor *blocked[2];
    size_t unit[2];
    int n_blocked = 0;
    fr_stage whole[2] = {{0}, {0}};
    fr_status st = FR_OK;
    size_t out_unit = units ? (size_t)(fr_numel(out) / units) : 0;
    for (int i = 0; i < 2 && st == FR_OK; i++) {
        if (!t[i])
            continue;
        bool walked = pattern < 0 || !(pattern >> i & 1);
        long long *st0 = i ? g.s.stride_b : g.s.stride_a;
        if (walked && units > 1) {
            unit[n_blocked] = (size_t)(fr_numel(t[i]) / units);
            st0[0] = (long long)unit[n_blocked];
            g.slot[i] = n_blocked;
            blocked[n_blocked++] = t[i];
        } else { /* one unit, or broadcast over the units: staged whole */
            st0[0] = 0;
            st = fr_stage_in(&whole[i], t[i], 0, (size_t)fr_numel(t[i]));
            g.whole[i] = whole[i].p;
        }
    }
    if (st == FR_OK)
        st = fr_stage_run_units(out, out_unit, false, blocked, unit, n_blocked, (size_t)units,
                                bcast_block, &g);
    fr_stage_free(&whole[0]);
    fr_stage_free(&whole[1]);
    return st;
}

/* the operands are all f32 (c may be NULL): the kernels run on them as they are */
static bool all_f32(const fr_tensor *a, const fr_tensor *b, const fr_tensor *c) {
    return a->dtype == FR_F32 && b->dtype == FR_F32 && (!c || c->dtype == FR_F32);
}

fr_status fr_bcast_binary_out(fr_tensor *out, const fr_tensor *a, const fr_tensor *b,
                              fr_binary_op op) {
    static const char *names[FR_BINARY_COUNT] = {"add", "sub", "mul", "div", "expand", "eq"};
    _Static_assert(FR_BINARY_COUNT == 6, "one name per fr_binary_op");
    if ((unsigned)op >= FR_BINARY_COUNT)
        return fr_error(FR_ERR_ARG, "broadcast: unknown op %d", (int)op);
    const char *name = names[op];
    const fr_tensor *bb = op == FR_BINARY_FIRST ? a : b;
    FR_TRY(fr_check_floatc(name, "out", out));
    FR_TRY(fr_check_floatc(name, "a", a));
    FR_TRY(fr_check_floatc(name, "b", bb));
    FR_TRY(fr_check_same_device(name, "out", out, "a", a));
    FR_TRY(fr_check_same_device(name, "a", a, "b", bb));
    int nd;
    int64_t shape[FR_MAX_DIMS];
    FR_TRY(fr_broadcast_shape(name, a, op == FR_BINARY_FIRST ? out : bb, &nd, shape));
    FR_TRY(fr_check_shape(name, "out", out, nd, shape));
    fr_bcast_shape s = {.ndim = nd};
    for (int d = 0; d < nd; d++)
        s.shape[d] = shape[d];
    bcast_strides(s.stride_a, a, nd);
    bcast_strides(s.stride_b, bb, nd);
    if (all_f32(out, a, bb))
        return FR_CALL_KERNEL(fr_device_of(out), bcast_binary, fr_data_f32(out), fr_data_f32(a),
                              op == FR_BINARY_FIRST ? NULL : fr_data_f32(bb), op, &s);
    return bcast_staged(out, a, op == FR_BINARY_FIRST ? NULL : bb, op, &s);
}

/* The record of x reduced to out's shape, after checking both. */
static fr_status reduce_shape(const char *op, const fr_tensor *out, const fr_tensor *x,
                              fr_reduce_shape *s) {
    FR_TRY(fr_check_floatc(op, "out", out));
    FR_TRY(fr_check_floatc(op, "x", x));
    FR_TRY(fr_check_same_device(op, "out", out, "x", x));
    char bo[64], bx[64];
    if (out->ndim > x->ndim)
        return fr_error(FR_ERR_SHAPE, "%s: out %s has more dims than x %s", op,
                        fr_shape_str(out, bo, sizeof bo), fr_shape_str(x, bx, sizeof bx));
    *s = (fr_reduce_shape){.ndim = x->ndim};
    for (int d = 0; d < x->ndim; d++) {
        int od = d - (x->ndim - out->ndim);
        int64_t os = od >= 0 ? out->shape[od] : 1;
        if (os != x->shape[d] && os != 1)
            return fr_error(FR_ERR_SHAPE, "%s: out %s is not x %s with dims of size 1", op,
                            fr_shape_str(out, bo, sizeof bo), fr_shape_str(x, bx, sizeof bx));
        s->shape[d] = x->shape[d];
        s->reduce[d] = os == 1 && x->shape[d] != 1;
    }
    return FR_OK;
}

/* ---- staged reductions ----
 * Blocked over x's leading kept dims when there are some (each block owns
 * its outputs); else over its leading reduced dims, each block's partial
 * sums added to the total in f32 (fr_stage_add_partial). A maximum over
 * leading reduced dims stages x whole: a full-size f32 copy of x, in the
 * ledger as workspace, the one case this file makes one (amax over the
 * batch of a half tensor; nothing in the library does it). */

typedef struct {
    fr_reduce_shape s; /* dim 0 the blocked units; a block sets its count */
    float scale;
    bool max;
} reduce_block_args;

static fr_status reduce_block(fr_device dev, float *out, const float *const *in, size_t count,
                              size_t first, const void *args) {
    (void)first;
    const reduce_block_args *g = args;
    fr_reduce_shape s = g->s;
    s.shape[0] = (long long)count;
    return g->max ? FR_CALL_KERNEL(dev, reduce_max, out, in[0], &s)
                  : FR_CALL_KERNEL(dev, reduce_sum, out, in[0], in[1], g->scale, &s);
}

/* s with its first k dims merged into one of `units`, reduced or not */
static fr_reduce_shape merge_leading(const fr_reduce_shape *s, int k, long long units, bool red) {
    fr_reduce_shape m = {.ndim = 1 + s->ndim - k};
    m.shape[0] = units;
    m.reduce[0] = red && units > 1;
    for (int d = k; d < s->ndim; d++) {
        m.shape[1 + d - k] = s->shape[d];
        m.reduce[1 + d - k] = s->reduce[d];
    }
    return m;
}

static fr_status reduce_staged(fr_tensor *out, const fr_tensor *x, const fr_tensor *w, float scale,
                               bool max, const fr_reduce_shape *s) {
    if (fr_numel(out) == 0)
        return FR_OK;
    /* k: the leading dims that are all kept, or all reduced (size 1 fits
     * either) */
    int k = 0, kind = -1;
    for (; k < s->ndim; k++) {
        if (s->shape[k] == 1)
            continue;
        if (kind >= 0 && s->reduce[k] != kind)
            break;
        kind = s->reduce[k];
    }
    long long units = 1;
    for (int d = 0; d < k; d++)
        units *= s->shape[d];
    size_t xu = units ? (size_t)(fr_numel(x) / units) : 0;
    const fr_tensor *in[2] = {x, w};
    int n_in = w ? 2 : 1;
    if (kind != 1) { /* kept leading dims: each block its own outputs */
        reduce_block_args g = {merge_leading(s, k, units, false), scale, max};
        return fr_stage_run_units(out, (size_t)(fr_numel(out) / (units ? units : 1)), false, in,
                                  (const size_t[]){xu, xu}, n_in, (size_t)units, reduce_block, &g);
    }
    fr_device dev = fr_device_of(out);
    size_t n_out = (size_t)fr_numel(out);
    if (max || units == 0) { /* x whole (the note above), or an empty sum's zeros */
        fr_stage sx = {0}, so = {0};
        fr_status st = fr_stage_in(&sx, x, 0, (size_t)fr_numel(x));
        if (st == FR_OK)
            st = fr_stage_out(&so, out, 0, n_out, false, NULL, NULL);
        if (st == FR_OK)
            st = fr_stage_commit(&so, out, 0, n_out,
                                 max ? FR_CALL_KERNEL(dev, reduce_max, so.p, sx.p, s)
                                     : FR_CALL_KERNEL(dev, reduce_sum, so.p, sx.p, NULL, scale, s));
        fr_stage_free(&so);
        fr_stage_free(&sx);
        return st;
    }
    /* reduced leading dims: partial sums of blocks of units */
    reduce_block_args g = {merge_leading(s, k, units, true), scale, max};
    fr_stage so;
    FR_TRY(fr_stage_out(&so, out, 0, n_out, false, NULL, NULL));
    return fr_stage_commit(&so, out, 0, n_out,
                           fr_stage_reduce_units(dev, so.p, n_out, in, xu, n_in, (size_t)units,
                                                 reduce_block, &g));
}

fr_status fr_reduce_sum_out(fr_tensor *out, const fr_tensor *x, float scale) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_sum", out, x, &s));
    if (all_f32(out, x, NULL))
        return FR_CALL_KERNEL(fr_device_of(out), reduce_sum, fr_data_f32(out), fr_data_f32(x), NULL,
                              scale, &s);
    return reduce_staged(out, x, NULL, scale, false, &s);
}

fr_status fr_reduce_sum_prod_out(fr_tensor *out, const fr_tensor *x, const fr_tensor *w,
                                 float scale) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_sum_prod", out, x, &s));
    FR_TRY(fr_check_floatc("reduce_sum_prod", "w", w));
    FR_TRY(fr_check_same_device("reduce_sum_prod", "x", x, "w", w));
    FR_TRY(fr_check_shape("reduce_sum_prod", "w", w, x->ndim, x->shape));
    if (all_f32(out, x, w))
        return FR_CALL_KERNEL(fr_device_of(out), reduce_sum, fr_data_f32(out), fr_data_f32(x),
                              fr_data_f32(w), scale, &s);
    return reduce_staged(out, x, w, scale, false, &s);
}

fr_status fr_reduce_max_out(fr_tensor *out, const fr_tensor *x) {
    fr_reduce_shape s;
    FR_TRY(reduce_shape("reduce_max", out, x, &s));
    if (fr_numel(x) == 0)
        return fr_error(FR_ERR_SHAPE, "reduce_max: x is empty (a maximum of nothing)");
    if (all_f32(out, x, NULL))
        return FR_CALL_KERNEL(fr_device_of(out), reduce_max, fr_data_f32(out), fr_data_f32(x), &s);
    return reduce_staged(out, x, NULL, 1.0f, true, &s);
}
