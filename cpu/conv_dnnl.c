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
 * convolution", has the measurements behind that choice). Which path a
 * shape takes is a fixed rule over the shape (dnnl_wins), never a timing,
 * and each (shape, direction, layout, thread count) gets one plan
 * (fr_dnnl.h), built on first use and kept. So a shape always runs the same
 * kernel, in every process: every memory strategy stays bit for bit equal
 * to plain, and data-parallel ranks agree with one process. */
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "fr_dnnl.h"

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
    if (!fr_cpu_have_dnnl() && (b == FR_CPU_CONV_DNNL_PLAIN || b == FR_CPU_CONV_DNNL_BLOCKED))
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
 * takes the shifted-plane kernels under the AUTO backend, anything else the
 * im2col reference. */
static bool own_takes_shift(const fr_conv_shape *s) {
    return backend == FR_CPU_CONV_AUTO && fr_cpu_conv_shift_applies(s);
}

static const char *own_impl(const fr_conv_shape *s) { return own_takes_shift(s) ? "shift" : "im2col"; }

static fr_status run_own(const fr_conv_shape *s, int dir, const conv_args *a) {
    if (!own_takes_shift(s))
        return run_reference(s, dir, a);
    if (dir == DIR_FWD)
        return fr_cpu_conv2d_forward_shift(a->out, a->in0, a->in1, s);
    if (dir == DIR_BWD_DATA)
        return fr_cpu_conv2d_backward_data_shift(a->out, a->in0, a->in1, s);
    return fr_cpu_conv2d_backward_weight_shift(a->out, a->in0, a->in1, s);
}

#ifdef FR_HAVE_DNNL

enum { LAYOUT_PLAIN = 0, LAYOUT_BLOCKED };

/* The AUTO backend's rule (dnnl_wins) */
#define DNNL_MAX_IN_CHANNELS 64
#define DNNL_MIN_OUT_CHANNELS 16

typedef struct {
    fr_conv_shape s;
    int dir, layout, threads;
} conv_key;

static void init_md(dnnl_memory_desc_t *md, int a, int b, int c, int d, dnnl_format_tag_t tag) {
    dnnl_dims_t dims = {a, b, c, d};
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, tag);
    FR_ASSERT(st == dnnl_success);
}

static fr_status build_conv(fr_dnnl_plan *plan, const void *key_) {
    const conv_key *key = key_;
    const fr_conv_shape *s = &key->s;
    dnnl_memory_desc_t x_user, w_user, y_user, x_md, w_md, y_md;
    init_md(&x_user, s->n, s->c, s->h, s->w, dnnl_nchw);
    init_md(&w_user, s->k, s->c, s->r, s->s, dnnl_oihw);
    init_md(&y_user, s->n, s->k, s->oh, s->ow, dnnl_nchw);
    dnnl_format_tag_t act = key->layout == LAYOUT_BLOCKED ? dnnl_format_tag_any : dnnl_nchw;
    dnnl_format_tag_t wei = key->layout == LAYOUT_BLOCKED ? dnnl_format_tag_any : dnnl_oihw;
    init_md(&x_md, s->n, s->c, s->h, s->w, act);
    init_md(&w_md, s->k, s->c, s->r, s->s, wei);
    init_md(&y_md, s->n, s->k, s->oh, s->ow, act);
    /* OH = (H + 2 pad - R) / stride + 1 rounds down; oneDNN wants the right
     * padding that makes the division exact (at most pad). */
    dnnl_dims_t strides = {s->stride, s->stride}, pad_l = {s->pad, s->pad};
    dnnl_dims_t pad_r = {(s->oh - 1) * s->stride + s->r - s->h - s->pad,
                         (s->ow - 1) * s->stride + s->s - s->w - s->pad};
    dnnl_convolution_desc_t fwd_d, bwd_d;
    dnnl_status_t st = dnnl_convolution_forward_desc_init(
        &fwd_d, dnnl_forward_training, dnnl_convolution_direct, &x_md, &w_md, NULL, &y_md, strides,
        pad_l, pad_r);
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
        st = dnnl_convolution_backward_data_desc_init(&bwd_d, dnnl_convolution_direct, &x_md, &w_md,
                                                      &y_md, strides, pad_l, pad_r);
        if (st == dnnl_success)
            st = dnnl_primitive_desc_create(&pd, &bwd_d, attr, fr_dnnl_engine(), fwd_pd);
        out = fr_dnnl_plan_init(plan, st, pd, 3,
                                (int[]){DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS},
                                (dnnl_memory_desc_t[]){x_user, y_user, w_user},
                                (bool[]){true, false, false});
    } else {
        st = dnnl_convolution_backward_weights_desc_init(&bwd_d, dnnl_convolution_direct, &x_md,
                                                         &w_md, NULL, &y_md, strides, pad_l, pad_r);
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

/* The plan of a layout for a shape and direction; NULL with *failed FR_OK
 * when oneDNN has no kernel for it. */
static const fr_dnnl_plan *plan_of(const fr_conv_shape *s, int dir, int layout, fr_status *failed) {
    conv_key key;
    memset(&key, 0, sizeof key);
    key.s = *s;
    key.dir = dir;
    key.layout = layout;
    key.threads = fr_dnnl_threads();
    const fr_dnnl_plan *p = fr_dnnl_cached_plan(&key, sizeof key, build_conv);
    *failed = p ? FR_OK : fr_last_status();
    return p && p->prim ? p : NULL;
}

/* The AUTO backend's path for a shape and direction: a fixed rule over the
 * shape, so every process, rank and run takes the same path (and gets the
 * same bits), and over the shape of one image only, so an image's result
 * does not depend on the batch it is in (docs/ARCHITECTURE.md, "CPU
 * convolution", has the measurements behind the rule):
 * - forward and backward (data) run oneDNN for C <= 64 input and K >= 16
 *   output channels, where oneDNN's blocked kernels measured 10-40% faster
 *   (every CIFAR ResNet layer, DenseNet's stem); DenseNet's wide-input 1x1
 *   bottlenecks (C up to 342) and 12-channel growth layers measured up to
 *   3x slower on oneDNN and take frugal's own kernels;
 * - backward (weight) never runs oneDNN: its AVX2 kernel sums each weight
 *   gradient in one f32 chain over N*OH*OW products; against a double
 *   reference its error was 20x the blocked GEMM's (1.5e-3 vs 7e-5 absolute
 *   on a 40-image 16->8 3x3 layer at 32x32), for a speed-up of 0-20% where
 *   it won at all;
 * - what oneDNN does not run goes to the shifted-plane kernels
 *   (cpu/conv_shift.c) for 3x3 stride-1 pad-1 layers on AVX2+FMA CPUs (the
 *   weight gradient 1.3-2x faster than the reference on ResNet's layers,
 *   the growth layers' forward and backward (data) about 11% of a
 *   DenseNet-BC-100 step), else to the im2col reference. */
static bool dnnl_wins(const fr_conv_shape *s, int dir) {
    return dir != DIR_BWD_WEIGHT && s->c <= DNNL_MAX_IN_CHANNELS && s->k >= DNNL_MIN_OUT_CHANNELS;
}

static fr_status run_plan(const fr_dnnl_plan *p, int dir, const conv_args *a) {
    static const char *const what[] = {"conv2d forward", "conv2d backward (data)",
                                       "conv2d backward (weight)"};
    return fr_dnnl_plan_run(p, (void *[]){a->out, (void *)a->in0, (void *)a->in1}, what[dir]);
}

static fr_status run(const fr_conv_shape *s, int dir, const conv_args *a) {
    fr_status failed;
    const fr_dnnl_plan *p = NULL;
    if (backend == FR_CPU_CONV_IM2COL || s->n <= 0 || s->c <= 0 || s->k <= 0 || s->oh <= 0 ||
        s->ow <= 0)
        return run_reference(s, dir, a);
    if (backend != FR_CPU_CONV_AUTO) {
        p = plan_of(s, dir, backend == FR_CPU_CONV_DNNL_PLAIN ? LAYOUT_PLAIN : LAYOUT_BLOCKED,
                    &failed);
        if (failed != FR_OK)
            return failed;
        return p ? run_plan(p, dir, a) : run_reference(s, dir, a);
    }
    if (dnnl_wins(s, dir)) {
        p = plan_of(s, dir, LAYOUT_BLOCKED, &failed);
        if (failed != FR_OK)
            return failed;
        return p ? run_plan(p, dir, a) : run_reference(s, dir, a);
    }
    return run_own(s, dir, a);
}

const char *fr_cpu_conv_impl(const fr_conv_shape *s, int direction) {
    fr_status failed;
    if (backend == FR_CPU_CONV_IM2COL ||
        (backend == FR_CPU_CONV_AUTO && !dnnl_wins(s, direction)))
        return own_impl(s);
    const fr_dnnl_plan *p =
        plan_of(s, direction, backend == FR_CPU_CONV_DNNL_PLAIN ? LAYOUT_PLAIN : LAYOUT_BLOCKED,
                &failed);
    return p ? p->impl : "im2col";
}

#else /* no oneDNN: frugal's own kernels only */

const char *fr_cpu_conv_impl(const fr_conv_shape *s, int direction) {
    (void)direction;
    return own_impl(s);
}

static fr_status run(const fr_conv_shape *s, int dir, const conv_args *a) { return run_own(s, dir, a); }

#endif

fr_status fr_cpu_conv2d_forward(float *y, const float *x, const float *w, const fr_conv_shape *s) {
    return run(s, DIR_FWD, &(conv_args){y, x, w});
}

fr_status fr_cpu_conv2d_backward_data(float *dx, const float *dy, const float *w, const fr_conv_shape *s) {
    return run(s, DIR_BWD_DATA, &(conv_args){dx, dy, w});
}

fr_status fr_cpu_conv2d_backward_weight(float *dw, const float *dy, const float *x, const fr_conv_shape *s) {
    return run(s, DIR_BWD_WEIGHT, &(conv_args){dw, dy, x});
}
