/* bench_conv_layout.c: what keeping activations channels-last (NHWC) between
 * ops would save on a CIFAR ResNet step (issue 24). frugal's CPU
 * convolutions keep activations NCHW and reorder them to oneDNN's blocked
 * layout (nChw16c) and back on every call (cpu/conv_dnnl.c); the profile of
 * a ResNet-56 step put those reorders at a fifth of it (bench/RESULTS.md).
 * This program times, at the ResNet shapes:
 *
 *   conv   oneDNN called directly, whole batch, forward, backward (data)
 *          and backward (weight) with (1) nhwc user memory and an nhwc
 *          primitive (no reorder at all), (2) NCHW user memory reordered to
 *          the primitive's preferred layout and back, (3) the preferred
 *          layout alone (the kernel's floor); then frugal's own entries on
 *          the same pass: the kernel table's fr_cpu_conv2d_* (NCHW, what a
 *          step runs today: reorders, the weight gradient in image groups)
 *          and the channels-last fr_cpu_conv2d_nhwc;
 *   bnact  batch norm + ReLU in training mode (statistics, normalise and
 *          activate; backward: the sums and dx): cpu/batchnorm.c's NCHW
 *          kernels against cpu/layout.c's channels-last ones;
 *
 * and sums frugal's differences over a ResNet's layers (`--depth`, 56 by
 * default): what a channels-last layout between ops could take off a step.
 *
 * Times are the fastest of --reps calls, in CPU time of the process (one
 * thread is what makes that meaningful on a shared machine: run it with
 * OMP_NUM_THREADS=1), in ms. In the direct oneDNN rows the weights are
 * reordered outside the timing (they are small); frugal's entries time
 * everything they do. Output is plain text for bench/RESULTS.md;
 * bench/run.sh does not run this program. Without oneDNN it prints one
 * line and exits 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/conv.h"
#include "cpu/layout.h"
#include "tensor/kernels.h"

#ifdef FR_HAVE_DNNL
#include <dnnl.h>

static dnnl_engine_t eng;
static dnnl_stream_t strm;

#define CK(x)                                                                              \
    do {                                                                                   \
        dnnl_status_t s_ = (x);                                                            \
        if (s_ != dnnl_success) {                                                          \
            fprintf(stderr, "bench_conv_layout: oneDNN failed at line %d (status %d)\n",   \
                    __LINE__, (int)s_);                                                    \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void md4(dnnl_memory_desc_t *m, int a, int b, int c, int d, dnnl_format_tag_t tag) {
    dnnl_dims_t dims = {a, b, c, d};
    CK(dnnl_memory_desc_init_by_tag(m, 4, dims, dnnl_f32, tag));
}

/* A buffer of the descriptor's size, filled with small varied values. */
static dnnl_memory_t filled(const dnnl_memory_desc_t *m) {
    dnnl_memory_t x;
    CK(dnnl_memory_create(&x, m, eng, DNNL_MEMORY_ALLOCATE));
    float *p;
    CK(dnnl_memory_get_data_handle(x, (void **)&p));
    size_t n = dnnl_memory_desc_get_size(m) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 7) % 13) * 0.01f;
    return x;
}

static dnnl_primitive_t reorder_of(dnnl_memory_t from, dnnl_memory_t to) {
    const dnnl_memory_desc_t *a, *b;
    CK(dnnl_memory_get_memory_desc(from, &a));
    CK(dnnl_memory_get_memory_desc(to, &b));
    dnnl_primitive_desc_t pd;
    CK(dnnl_reorder_primitive_desc_create(&pd, a, eng, b, eng, NULL));
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    dnnl_primitive_desc_destroy(pd);
    return p;
}

static void run_reorder(dnnl_primitive_t p, dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    CK(dnnl_primitive_execute(p, strm, 2, a));
    CK(dnnl_stream_wait(strm));
}

typedef struct {
    int c, k, hw, r, stride, count; /* count: layers of this shape in the model */
} conv_case;

enum { NHWC = 0, REORDERED, BLOCKED };
static const char *const dir_name[] = {"fwd", "bwd_data", "bwd_weight"};

/* The fastest of `reps` calls of one pass in one variant; impl: oneDNN's
 * implementation name. */
static double time_conv(int n, const conv_case *cc, int dir, int variant, int reps, char *impl,
                        size_t impl_len) {
    int pad = cc->r / 2, oh = (cc->hw + 2 * pad - cc->r) / cc->stride + 1;
    dnnl_format_tag_t user = variant == NHWC ? dnnl_nhwc : dnnl_nchw;
    dnnl_format_tag_t prim = variant == NHWC ? dnnl_nhwc : dnnl_format_tag_any;
    dnnl_memory_desc_t xu, yu, wu, xm, ym, wm;
    md4(&xu, n, cc->c, cc->hw, cc->hw, user);
    md4(&yu, n, cc->k, oh, oh, user);
    md4(&wu, cc->k, cc->c, cc->r, cc->r, dnnl_oihw);
    md4(&xm, n, cc->c, cc->hw, cc->hw, prim);
    md4(&ym, n, cc->k, oh, oh, prim);
    md4(&wm, cc->k, cc->c, cc->r, cc->r, dnnl_format_tag_any);
    int pr = (oh - 1) * cc->stride + cc->r - cc->hw - pad;
    dnnl_dims_t st = {cc->stride, cc->stride}, pl = {pad, pad}, prr = {pr, pr};
    dnnl_convolution_desc_t fd, bd;
    CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                          &xm, &wm, NULL, &ym, st, pl, prr));
    dnnl_primitive_desc_t fpd, pd;
    CK(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
    if (dir == 0) {
        pd = fpd;
    } else {
        if (dir == 1)
            CK(dnnl_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &xm, &wm,
                                                        &ym, st, pl, prr));
        else
            CK(dnnl_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct, &xm,
                                                           &wm, NULL, &ym, st, pl, prr));
        CK(dnnl_primitive_desc_create(&pd, &bd, NULL, eng, fpd));
    }
    const char *name = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    snprintf(impl, impl_len, "%s", name ? name : "?");
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    /* arguments in the order output, input 0, input 1 */
    static const int ids[3][3] = {{DNNL_ARG_DST, DNNL_ARG_SRC, DNNL_ARG_WEIGHTS},
                                  {DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS},
                                  {DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST, DNNL_ARG_SRC}};
    const dnnl_memory_desc_t *users[3][3] = {{&yu, &xu, &wu}, {&xu, &yu, &wu}, {&wu, &yu, &xu}};
    dnnl_memory_t mu[3], mp[3], scratch;
    dnnl_primitive_t re[3];
    for (int i = 0; i < 3; i++) {
        mu[i] = filled(users[dir][i]);
        mp[i] = filled(dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, ids[dir][i]));
        re[i] = i == 0 ? reorder_of(mp[i], mu[i]) : reorder_of(mu[i], mp[i]);
    }
    scratch = filled(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    /* the weights (or the weight gradient) are not activations: reordered
     * outside the timing in every variant */
    bool is_w[3] = {dir == 2, false, dir != 2};
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = cpu_now();
        for (int i = 1; i < 3; i++)
            if (variant == REORDERED && !is_w[i])
                run_reorder(re[i], mu[i], mp[i]);
        dnnl_exec_arg_t a[4] = {{ids[dir][0], mp[0]}, {ids[dir][1], mp[1]},
                                {ids[dir][2], mp[2]}, {DNNL_ARG_SCRATCHPAD, scratch}};
        CK(dnnl_primitive_execute(p, strm, 4, a));
        CK(dnnl_stream_wait(strm));
        if (variant == REORDERED && !is_w[0])
            run_reorder(re[0], mp[0], mu[0]);
        double t = cpu_now() - t0;
        best = t < best ? t : best;
    }
    for (int i = 0; i < 3; i++) {
        dnnl_primitive_destroy(re[i]);
        dnnl_memory_destroy(mu[i]);
        dnnl_memory_destroy(mp[i]);
    }
    dnnl_memory_destroy(scratch);
    dnnl_primitive_destroy(p);
    if (pd != fpd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(fpd);
    return best * 1e3;
}

static fr_conv_shape frugal_shape(int n, const conv_case *cc) {
    int pad = cc->r / 2, oh = (cc->hw + 2 * pad - cc->r) / cc->stride + 1;
    return (fr_conv_shape){.n = n, .c = cc->c, .h = cc->hw, .w = cc->hw, .k = cc->k, .r = cc->r,
                           .s = cc->r, .oh = oh, .ow = oh, .stride = cc->stride, .pad = pad,
                           .groups = 1, .dilation = 1};
}

/* One pass through frugal's kernel-table entry (NCHW) or its channels-last
 * entry, fastest of reps after a first call (which builds the plans). */
static double time_frugal(int n, const conv_case *cc, int dir, bool nhwc, int reps) {
    fr_conv_shape s = frugal_shape(n, cc);
    size_t xn = (size_t)n * cc->c * cc->hw * cc->hw, yn = (size_t)n * cc->k * s.oh * s.ow;
    size_t wn = (size_t)cc->k * cc->c * cc->r * cc->r;
    float *x = calloc(xn, sizeof(float)), *y = calloc(yn, sizeof(float));
    float *w = calloc(wn, sizeof(float));
    if (!x || !y || !w) {
        fprintf(stderr, "bench_conv_layout: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < xn; i++)
        x[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < yn; i++)
        y[i] = (float)((i * 5) % 11) * 0.01f;
    for (size_t i = 0; i < wn; i++)
        w[i] = (float)((i * 3) % 7) * 0.01f;
    /* operands in the kernels' order: (y, x, w), (dx, dy, w), (dw, dy, x) */
    float *ops[3][3] = {{y, x, w}, {x, y, w}, {w, y, x}};
    double best = 1e30;
    for (int rep = 0; rep <= reps; rep++) {
        double t0 = cpu_now();
        fr_status st;
        if (nhwc)
            st = fr_cpu_conv2d_nhwc(dir, ops[dir][0], ops[dir][1], ops[dir][2], &s);
        else if (dir == 0)
            st = fr_cpu_conv2d_forward(y, x, w, &s);
        else if (dir == 1)
            st = fr_cpu_conv2d_backward_data(x, y, w, &s);
        else
            st = fr_cpu_conv2d_backward_weight(w, y, x, &s);
        double t = cpu_now() - t0;
        if (st != FR_OK) {
            fprintf(stderr, "bench_conv_layout: %s\n", fr_last_error());
            exit(1);
        }
        if (rep > 0) /* the first call builds the plans */
            best = t < best ? t : best;
    }
    free(x), free(y), free(w);
    return best * 1e3;
}

typedef struct {
    int c, hw, count;
} bn_case;

/* fwd (statistics + normalise + ReLU) and bwd (sums + dx) of one layout,
 * fastest of reps each. */
static void time_bn(int n, const bn_case *bc, bool nhwc, int reps, double *fwd, double *bwd) {
    size_t px = (size_t)n * (size_t)bc->hw * (size_t)bc->hw, len = px * (size_t)bc->c;
    int c = bc->c, hw = bc->hw * bc->hw;
    float *x = malloc(len * sizeof(float)), *y = malloc(len * sizeof(float));
    float *dy = malloc(len * sizeof(float)), *dx = malloc(len * sizeof(float));
    float ch[6][256];
    if (!x || !y || !dy || !dx) {
        fprintf(stderr, "bench_conv_layout: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < len; i++) {
        x[i] = (float)((i * 7) % 13) * 0.1f - 0.5f;
        dy[i] = (float)((i * 5) % 11) * 0.01f - 0.05f;
    }
    for (int k = 0; k < c; k++)
        ch[2][k] = 1.0f, ch[3][k] = 0.1f; /* gamma, beta */
    *fwd = *bwd = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = cpu_now();
        if (nhwc)
            fr_cpu_batch_norm_stats_nhwc(ch[0], ch[1], x, px, c);
        else
            fr_cpu_batch_norm_stats(ch[0], ch[1], x, n, c, hw);
        fr_cpu_batch_norm_invstd(ch[4], ch[1], 1e-5f, c);
        if (nhwc)
            fr_cpu_bn_act_forward_nhwc(y, x, NULL, ch[0], ch[4], ch[2], ch[3], FR_ACT_RELU, 0.0f,
                                       px, c);
        else
            fr_cpu_bn_act_forward(y, x, NULL, ch[0], ch[4], ch[2], ch[3], FR_ACT_RELU, 0.0f, n, c,
                                  hw);
        double t1 = cpu_now();
        if (nhwc)
            fr_cpu_bn_act_backward_nhwc(dx, NULL, ch[5], ch[1], dy, y, x, ch[0], ch[4], ch[2],
                                        ch[3], FR_ACT_RELU, 0.0f, px, c);
        else
            fr_cpu_bn_act_backward(dx, NULL, ch[5], ch[1], dy, y, x, ch[0], ch[4], ch[2], ch[3],
                                   FR_ACT_RELU, 0.0f, n, c, hw);
        double t2 = cpu_now();
        *fwd = t1 - t0 < *fwd ? t1 - t0 : *fwd;
        *bwd = t2 - t1 < *bwd ? t2 - t1 : *bwd;
    }
    *fwd *= 1e3;
    *bwd *= 1e3;
    free(x), free(y), free(dy), free(dx);
}

int main(int argc, char **argv) {
    int n = 64, reps = 6, depth = 56;
    const char *only = "";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = argv[i + 1];
        else if (!strcmp(argv[i], "--depth"))
            depth = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_conv_layout [--batch N] [--reps R] [--depth 6k+2] [--only conv|bn]\n");
            return 2;
        }
    }
    if (n < 1 || reps < 1 || depth < 8 || (depth - 2) % 6) {
        fprintf(stderr, "bench_conv_layout: --batch and --reps must be >= 1, --depth 6k+2 >= 8\n");
        return 2;
    }
    int b = (depth - 2) / 6; /* blocks per stage of a CIFAR ResNet */
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    /* the convolutions of a CIFAR ResNet-depth with option-B shortcuts */
    const conv_case convs[] = {
        {3, 16, 32, 3, 1, 1},           {16, 16, 32, 3, 1, 2 * b},
        {16, 32, 32, 3, 2, 1},          {32, 32, 16, 3, 1, 2 * b - 1},
        {16, 32, 32, 1, 2, 1},          {32, 64, 16, 3, 2, 1},
        {64, 64, 8, 3, 1, 2 * b - 1},   {32, 64, 16, 1, 2, 1},
    };
    printf("# bench_conv_layout: batch %d, ResNet-%d's layer counts, fastest of %d, CPU ms\n", n,
           depth, reps);
    printf("%-22s %-10s %8s %8s %8s  %-24s %-24s\n", "conv", "pass", "nhwc", "nchw+reo", "blocked",
           "nhwc impl", "blocked impl");
    double saved = 0.0, conv_now = 0.0;
    for (size_t i = 0; i < sizeof convs / sizeof convs[0] && strcmp(only, "bn"); i++) {
        const conv_case *cc = &convs[i];
        for (int dir = 0; dir < 3; dir++) {
            if (cc->c == 3 && dir == 1) /* the stem's input needs no gradient */
                continue;
            char in_impl[48], bl_impl[48], ro_impl[48];
            double t_n = time_conv(n, cc, dir, NHWC, reps, in_impl, sizeof in_impl);
            double t_r = time_conv(n, cc, dir, REORDERED, reps, ro_impl, sizeof ro_impl);
            double t_b = time_conv(n, cc, dir, BLOCKED, reps, bl_impl, sizeof bl_impl);
            char name[40];
            snprintf(name, sizeof name, "%dx%d %d->%d s%d @%d x%d", cc->r, cc->r, cc->c, cc->k,
                     cc->stride, cc->hw, cc->count);
            printf("%-22s %-10s %8.3f %8.3f %8.3f  %-24s %-24s\n", name, dir_name[dir], t_n, t_r,
                   t_b, in_impl, bl_impl);
            /* frugal's entries: what a step runs today (NCHW, reorders
             * around oneDNN, the weight gradient in image groups) and
             * the channels-last entry on the same shapes */
            double f_c = time_frugal(n, cc, dir, false, reps);
            double f_n = time_frugal(n, cc, dir, true, reps);
            fr_conv_shape fs = frugal_shape(n, cc);
            printf("%-22s %-10s %8.3f %8.3f %8s  %-24s %-24s\n", "  frugal's entries", dir_name[dir],
                   f_n, f_c, "", fr_cpu_conv_nhwc_impl(&fs, dir), fr_cpu_conv_impl(&fs, dir));
            t_n = f_n;
            t_r = f_c;
            saved += cc->count * (t_r - t_n);
            conv_now += cc->count * t_r;
        }
    }
    /* every conv has a BN after it; the stem's and the blocks' with ReLU */
    const bn_case bns[] = {{16, 32, 2 * b + 1}, {32, 16, 2 * b + 1}, {64, 8, 2 * b + 1}};
    printf("%-22s %-10s %8s %8s\n", "bn+relu", "pass", "nhwc", "nchw");
    double bn_delta = 0.0, bn_now = 0.0;
    for (size_t i = 0; i < sizeof bns / sizeof bns[0] && strcmp(only, "conv"); i++) {
        double fn, bn, fc, bc;
        time_bn(n, &bns[i], true, reps, &fn, &bn);
        time_bn(n, &bns[i], false, reps, &fc, &bc);
        char name[40];
        snprintf(name, sizeof name, "%d ch @%d x%d", bns[i].c, bns[i].hw, bns[i].count);
        printf("%-22s %-10s %8.3f %8.3f\n", name, "fwd", fn, fc);
        printf("%-22s %-10s %8.3f %8.3f\n", name, "bwd", bn, bc);
        bn_delta += bns[i].count * ((fn + bn) - (fc + bc));
        bn_now += bns[i].count * (fc + bc);
    }
    printf("# ResNet-%d step, conv passes through frugal's entries: %.1f ms NCHW (reorders "
           "around oneDNN), %.1f ms channels last (-%.1f)\n", depth, conv_now, conv_now - saved,
           saved);
    printf("# ResNet-%d step, BN + ReLU: %.1f ms NCHW, %.1f ms channels last (%+.1f)\n", depth,
           bn_now, bn_now + bn_delta, bn_delta);
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}

#else

int main(void) {
    printf("# bench_conv_layout: this build has no oneDNN (libdnnl-dev): nothing to measure\n");
    return 0;
}

#endif
