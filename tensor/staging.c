/* staging.c: f32 blocks of half tensors for the f32 kernels (staging.h). */
#include "staging.h"

#include "kernels.h"
#include "memory.h"
#include "../cpu/cast.h"

/* About 1 MiB of f32 per staged operand: large enough that a block's
 * kernel still spreads over every core, small enough that the scratch of an
 * op's two or three operands is noise next to the activations. */
#define FR_STAGE_BLOCK_BYTES ((size_t)1 << 20)
#define FR_STAGE_BLOCK_BYTES_CUDA ((size_t)16 << 20)

static char *elem_ptr(const fr_tensor *t, size_t off) {
    return (char *)fr_data(t) + off * fr_dtype_size(t->dtype);
}

static fr_status alloc_scratch(fr_stage *s, fr_device dev, size_t n) {
    s->dev = dev;
    s->bytes = (n ? n : 1) * sizeof(float); /* an empty block still gets a valid pointer */
    s->scratch = fr_mem_alloc(dev, s->bytes, FR_TAG_WORKSPACE);
    if (!s->scratch)
        return fr_last_status();
    s->p = s->scratch;
    return FR_OK;
}

fr_status fr_stage_in(fr_stage *s, const fr_tensor *t, size_t off, size_t n) {
    *s = (fr_stage){0};
    if (t->dtype == FR_F32) {
        s->p = (float *)elem_ptr(t, off);
        return FR_OK;
    }
    FR_TRY(alloc_scratch(s, fr_device_of(t), n));
    fr_status st = FR_CALL_KERNEL(s->dev, cast, s->p, FR_F32, elem_ptr(t, off), t->dtype, n);
    if (st != FR_OK)
        fr_stage_free(s);
    return st;
}

fr_status fr_stage_out(fr_stage *s, fr_tensor *t, size_t off, size_t n, bool load,
                       const fr_tensor *alias_t, const fr_stage *alias) {
    *s = (fr_stage){0};
    if (alias && alias_t && fr_data(alias_t) == fr_data(t)) {
        s->p = alias->p;
        return FR_OK;
    }
    if (t->dtype == FR_F32) {
        s->p = (float *)elem_ptr(t, off);
        return FR_OK;
    }
    FR_TRY(alloc_scratch(s, fr_device_of(t), n));
    if (!load)
        return FR_OK;
    fr_status st = FR_CALL_KERNEL(s->dev, cast, s->p, FR_F32, elem_ptr(t, off), t->dtype, n);
    if (st != FR_OK)
        fr_stage_free(s);
    return st;
}

fr_status fr_stage_commit(fr_stage *s, fr_tensor *t, size_t off, size_t n, fr_status st) {
    if (st == FR_OK && t->dtype != FR_F32)
        st = FR_CALL_KERNEL(fr_device_of(t), cast, elem_ptr(t, off), t->dtype, s->p, FR_F32, n);
    fr_stage_free(s);
    return st;
}

void fr_stage_free(fr_stage *s) {
    if (s->scratch)
        fr_mem_free(s->dev, s->scratch, s->bytes, FR_TAG_WORKSPACE);
    *s = (fr_stage){0};
}

size_t fr_stage_block_units(const fr_tensor *const *ts, int count, size_t unit_elems, size_t units) {
    bool any_half = false, on_cuda = false;
    for (int i = 0; i < count; i++)
        if (ts[i]) {
            any_half |= fr_is_half(ts[i]);
            on_cuda |= fr_device_of(ts[i]) == FR_CUDA;
        }
    if (!any_half || units == 0)
        return units ? units : 1;
    size_t budget = on_cuda ? FR_STAGE_BLOCK_BYTES_CUDA : FR_STAGE_BLOCK_BYTES;
    size_t per = budget / sizeof(float) / (unit_elems ? unit_elems : 1);
    if (per < 1)
        per = 1;
    return per < units ? per : units;
}

fr_status fr_stage_add_partial(fr_device dev, float *total, const float *part, size_t n, bool first,
                               fr_status k) {
    if (k != FR_OK || first)
        return k;
    return FR_CALL_KERNEL(dev, axpy, total, 1.0f, part, n);
}

enum { MAX_IN = 4 };

/* Elementwise ops on the CPU with a half operand run in tiles of
 * FR_STAGE_TILE elements converted into buffers on the stack (16 KiB of f32 per
 * operand), not in 1 MiB
 * blocks on the heap: the f32 copies stay in L1 or L2 between the widening, the
 * kernel and the rounding, and no block is allocated, entered in the ledger
 * or faulted in. The bf16 ResNet-20 step spent 20% of its time widening and
 * narrowing 1 MiB blocks (perf, 2026-12-02; bench/RESULTS.md). An
 * elementwise kernel computes element i from elements i only, so the bits
 * are those of any other blocking, at any thread count. */
#define FR_STAGE_TILE 4096
/* Below this many elements the tiles run on the calling thread alone. */
#define FR_STAGE_TILE_PAR_MIN 32768

/* One tile: its MAX_IN + 1 = 5 buffers of 16 KiB (80 KiB) live on the
 * calling thread's stack, whichever thread that is (the caller, OpenMP's
 * workers, the loader's threads); default stacks (8 MiB main, OpenMP's
 * and glibc's pthread defaults of 2-8 MiB) hold that easily. */
static fr_status run_tile(fr_tensor *out, bool load_out, const fr_tensor *const *in, int n_in,
                          size_t off, size_t len, fr_block_kernel fn, const void *args) {
    float buf[MAX_IN + 1][FR_STAGE_TILE];
    const float *p[MAX_IN] = {0};
    float *o = NULL;
    for (int i = 0; i < n_in; i++) {
        if (in[i]->dtype == FR_F32) {
            p[i] = (const float *)elem_ptr(in[i], off);
        } else {
            fr_cpu_cast_half_run(buf[i], FR_F32, elem_ptr(in[i], off), in[i]->dtype, len);
            p[i] = buf[i];
        }
        if (fr_data(in[i]) == fr_data(out))
            o = (float *)p[i]; /* inplace: the kernel writes over its input's tile */
    }
    bool half_out = out->dtype != FR_F32;
    if (!o)
        o = half_out ? buf[MAX_IN] : (float *)elem_ptr(out, off);
    if (half_out && load_out && o == buf[MAX_IN])
        fr_cpu_cast_half_run(o, FR_F32, elem_ptr(out, off), out->dtype, len);
    fr_status st = fn(FR_CPU, o, p, len, off, args);
    if (st == FR_OK && half_out)
        fr_cpu_cast_half_run(elem_ptr(out, off), out->dtype, o, FR_F32, len);
    return st;
}

static fr_status run_tiles(fr_tensor *out, bool load_out, const fr_tensor *const *in, int n_in,
                           size_t n, fr_block_kernel fn, const void *args) {
    size_t tiles = (n + FR_STAGE_TILE - 1) / FR_STAGE_TILE;
    size_t failed = tiles; /* the first tile that failed, if any */
#pragma omp parallel for if (n > FR_STAGE_TILE_PAR_MIN) schedule(static)
    for (size_t t = 0; t < tiles; t++) {
        size_t off = t * FR_STAGE_TILE, len = n - off < FR_STAGE_TILE ? n - off : FR_STAGE_TILE;
        if (run_tile(out, load_out, in, n_in, off, len, fn, args) != FR_OK) {
#pragma omp critical(fr_stage_tiles)
            failed = t < failed ? t : failed;
        }
    }
    if (failed == tiles)
        return FR_OK;
    /* errors are per thread (fr_last_error): the failing tile runs again
     * here, so its message is the caller's */
    size_t off = failed * FR_STAGE_TILE;
    return run_tile(out, load_out, in, n_in, off, n - off < FR_STAGE_TILE ? n - off : FR_STAGE_TILE,
                    fn, args);
}

fr_status fr_stage_run_units(fr_tensor *out, size_t out_unit, bool load_out,
                             const fr_tensor *const *in, const size_t *in_units, int n_in,
                             size_t units, fr_block_kernel fn, const void *args) {
    FR_ASSERT(n_in >= 0 && n_in <= MAX_IN);
    bool elementwise = out_unit == 1;
    for (int i = 0; i < n_in && in_units; i++)
        elementwise &= in_units[i] == 1;
    bool any_half = fr_is_half(out);
    for (int i = 0; i < n_in; i++)
        any_half |= fr_is_half(in[i]);
    if (elementwise && any_half && fr_device_of(out) == FR_CPU)
        return run_tiles(out, load_out, in, n_in, units, fn, args);
    const fr_tensor *all[MAX_IN + 1] = {out};
    size_t unit[MAX_IN], widest = out_unit;
    for (int i = 0; i < n_in; i++) {
        all[i + 1] = in[i];
        unit[i] = in_units ? in_units[i] : out_unit;
        widest = unit[i] > widest ? unit[i] : widest;
    }
    size_t block = fr_stage_block_units(all, n_in + 1, widest, units);
    fr_device dev = fr_device_of(out);
    fr_status st = FR_OK;
    for (size_t first = 0; first < units && st == FR_OK; first += block) {
        size_t count = units - first < block ? units - first : block;
        fr_stage sin[MAX_IN] = {{0}}, sout;
        const float *p[MAX_IN] = {0};
        const fr_stage *alias = NULL;
        const fr_tensor *alias_t = NULL;
        for (int i = 0; i < n_in && st == FR_OK; i++) {
            st = fr_stage_in(&sin[i], in[i], first * unit[i], count * unit[i]);
            p[i] = sin[i].p;
            if (fr_data(in[i]) == fr_data(out) && unit[i] == out_unit) {
                alias = &sin[i];
                alias_t = in[i];
            }
        }
        size_t off = first * out_unit, len = count * out_unit;
        if (st == FR_OK)
            st = fr_stage_out(&sout, out, off, len, load_out, alias_t, alias);
        if (st == FR_OK)
            st = fr_stage_commit(&sout, out, off, len, fn(dev, sout.p, p, count, first, args));
        for (int i = 0; i < n_in; i++)
            fr_stage_free(&sin[i]);
    }
    return st;
}

fr_status fr_stage_reduce_units(fr_device dev, float *total, size_t n_total,
                                const fr_tensor *const *in, size_t in_unit, int n_in, size_t units,
                                fr_block_kernel fn, const void *args) {
    FR_ASSERT(n_in >= 1 && n_in <= MAX_IN);
    size_t block = fr_stage_block_units(in, n_in, in_unit, units);
    float *part = NULL;
    if (block < units && !(part = fr_mem_alloc(dev, n_total * sizeof(float), FR_TAG_WORKSPACE)))
        return fr_last_status();
    fr_status st = FR_OK;
    for (size_t first = 0; st == FR_OK && (first < units || first == 0); first += block) {
        size_t count = units - first < block ? units - first : block;
        fr_stage sin[MAX_IN] = {{0}};
        const float *p[MAX_IN] = {0};
        for (int i = 0; i < n_in && st == FR_OK; i++) {
            st = fr_stage_in(&sin[i], in[i], first * in_unit, count * in_unit);
            p[i] = sin[i].p;
        }
        if (st == FR_OK)
            st = fr_stage_add_partial(
                dev, total, part, n_total, first == 0,
                fn(dev, fr_stage_partial_dst(total, part, first == 0), p, count, first, args));
        for (int i = 0; i < n_in; i++)
            fr_stage_free(&sin[i]);
    }
    if (part)
        fr_mem_free(dev, part, n_total * sizeof(float), FR_TAG_WORKSPACE);
    return st;
}
