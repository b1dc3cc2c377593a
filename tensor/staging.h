/* staging.h: f32 views of f32 / f16 / bf16 tensors, for the ops layer.
 *
 * Every kernel in kernels.def computes in f32. Mixed precision keeps
 * activations (and what backward saves) in f16 or bf16, so an op whose
 * operands are half converts them to f32 on the way into its kernel and
 * rounds its outputs back on the way out. It does so in blocks (a run of
 * elements, a few images), never as full-size f32 copies of its operands:
 * the f32 scratch of a block is FR_TAG_WORKSPACE in the ledger and is freed
 * before the op returns. For an f32 operand a stage is the tensor's own
 * memory: no copy, no allocation, so f32 training runs exactly as before.
 *
 *     fr_stage sx, sy;
 *     FR_TRY(fr_stage_in(&sx, x, off, n));              // x[off, off+n) as f32
 *     fr_status st = fr_stage_out(&sy, y, off, n, false, x, &sx);
 *     if (st == FR_OK) st = kernel(sy.p, sx.p, n);
 *     st = fr_stage_commit(&sy, y, off, n, st);        // rounds into y, frees
 *     fr_stage_free(&sx);
 *
 * Each op keeps its own blocking (elements, images, rows), because what a
 * block is depends on the op; fr_stage_block_units says how big one is. */
#ifndef FR_STAGING_H
#define FR_STAGING_H

#include "kernels.h"
#include "tensor.h"

typedef struct {
    float *p;       /* the block's elements as f32 */
    void *scratch;  /* owned f32 copy, or NULL when p is the tensor's memory or another stage's */
    size_t bytes;
    fr_device dev;
} fr_stage;

static inline bool fr_is_half(const fr_tensor *t) { return t->dtype == FR_F16 || t->dtype == FR_BF16; }

/* Elements [off, off + n) of t as f32 (read only). */
fr_status fr_stage_in(fr_stage *s, const fr_tensor *t, size_t off, size_t n);

/* Somewhere to write elements [off, off + n) of t as f32. With `load` the
 * current values are copied in first (outputs that accumulate). When t
 * shares its memory with `alias_t` (an inplace op: y is x) the stage is
 * `alias`, already staged from alias_t, so the kernel's in-place write lands
 * in one f32 block; alias / alias_t may be NULL. */
fr_status fr_stage_out(fr_stage *s, fr_tensor *t, size_t off, size_t n, bool load,
                       const fr_tensor *alias_t, const fr_stage *alias);

/* When st is FR_OK, rounds the block into t (nothing to do for f32); then
 * frees the stage. Returns st, or the conversion's error. */
fr_status fr_stage_commit(fr_stage *s, fr_tensor *t, size_t off, size_t n, fr_status st);

/* Frees the stage's scratch (if any). Idempotent. */
void fr_stage_free(fr_stage *s);

/* How many of `units` units (elements, images, rows) of `unit_elems`
 * elements each one block holds: all of them when every one of the `count`
 * tensors is f32 (f32 ops then run in one block, with no copies), else
 * about 1 MiB of f32 per operand on the CPU (16 MiB on CUDA, where a launch
 * costs more than the scratch), at least one unit. NULL entries are
 * ignored. */
size_t fr_stage_block_units(const fr_tensor *const *ts, int count, size_t unit_elems, size_t units);

/* Reductions over blocks (a weight gradient, BN's sums, a total). The
 * kernels overwrite their reduction output, so the first block writes the
 * total itself and every later block writes a partial that is added on:
 *
 *     float *dst = fr_stage_partial_dst(dw, part, first);
 *     st = fr_stage_add_partial(dev, dw, part, n, first, kernel(dst, ...));
 */
static inline float *fr_stage_partial_dst(float *total, float *part, bool first) {
    return first ? total : part;
}
/* After a block's kernel returned k: total += part (n floats) unless the
 * block was the first or k is an error. Returns k or the addition's status. */
fr_status fr_stage_add_partial(fr_device dev, float *total, const float *part, size_t n, bool first,
                               fr_status k);

/* A kernel on one block of units (elements, images, planes): out and in[i]
 * hold `count` units as f32, units [first, first + count) of the op's
 * tensors. */
typedef fr_status (*fr_block_kernel)(fr_device dev, float *out, const float *const *in, size_t count,
                                     size_t first, const void *args);

/* Runs `fn` over `units` units, block by block (one block, no copies, when
 * every operand is f32). A unit is out_unit elements of `out` and
 * in_units[i] elements of in[i] (n_in <= 4); in_units NULL means every
 * input's unit is out_unit. `load_out` for kernels that accumulate into
 * out. out may be one of the inputs (inplace) when their units agree. */
fr_status fr_stage_run_units(fr_tensor *out, size_t out_unit, bool load_out,
                             const fr_tensor *const *in, const size_t *in_units, int n_in,
                             size_t units, fr_block_kernel fn, const void *args);

/* A reduction over blocks of `units` units (in_unit elements of each of
 * in[0..n_in), n_in <= 4): fn writes a block's n_total results to its out,
 * the first block into `total` (f32 on dev), every later one into a
 * workspace partial added on (fr_stage_add_partial). At least one block
 * runs, so an empty input still writes its total. */
fr_status fr_stage_reduce_units(fr_device dev, float *total, size_t n_total,
                                const fr_tensor *const *in, size_t in_unit, int n_in, size_t units,
                                fr_block_kernel fn, const void *args);

/* Elementwise: fr_stage_run_units with one-element units, n of them. */
static inline fr_status fr_stage_run(fr_tensor *out, bool load_out, const fr_tensor *const *in,
                                     int n_in, size_t n, fr_block_kernel fn, const void *args) {
    return fr_stage_run_units(out, 1, load_out, in, NULL, n_in, n, fn, args);
}

#endif
