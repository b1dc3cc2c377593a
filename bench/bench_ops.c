/* bench_ops.c: frugal's CPU operators timed, with OpenBLAS called directly
 * beside them; bench/torch_ops.py times PyTorch on the same cases and
 * bench/join.py puts the two side by side (bench/run.sh runs all three).
 *
 * The cases live here only: `bench_ops --list` prints them, and torch_ops.py
 * reads that list, so the two sides can never drift apart.
 *
 * Output: one record per line, tab-separated, so a joiner needs no parsing
 * beyond split('\t'):
 *   # text                                    a note, shown above the tables
 *   S  section  title  unit                   a section (one table)
 *   C  section  case  work  k=v k=v ...       a case to run (--list only)
 *   R  section  case  impl  value  work  [best]  a measurement
 * `value` is in the section's unit (ms: median time per call; lower is
 * better), `work` is the floating-point operations of one call (0: none), so
 * rates are work / value; `best`, optional, is the fastest repetition, which
 * tells how much other work on the machine disturbed the median.
 *
 * A new section is one entry in `sections`: a function that prints its cases
 * and one that runs them; the joiner and run.sh need no change. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FR_HAVE_CBLAS
#include <cblas.h>
#endif

#include "ext.h" /* the tape-free ops it times */

typedef struct {
    int reps;          /* timed repetitions; the median is reported */
    double min_rep_ms; /* a repetition repeats the call until it lasts this long */
    const char *only;  /* run just this section (NULL: all) */
    const char *match; /* run just the cases whose name contains this (NULL: all) */
    double settle_ms;  /* pause between implementations of one case */
} bench_opts;

static bool wanted(const bench_opts *o, const char *case_name) {
    return !o->match || strstr(case_name, o->match);
}

/* ---------------------------------------------------------------- timing */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef fr_status (*bench_call)(void *ctx);

/* One implementation of a case. `enter` and `leave` (may be NULL) run
 * untimed around each of its stretches of calls: they set up and undo
 * process-wide state it needs and the others must not see. */
typedef struct {
    const char *name;
    bench_call call;
    void (*enter)(void);
    void (*leave)(void);
} bench_impl;

enum { MAX_REPS = 64, MAX_IMPLS = 4 };

/* How many calls one repetition makes so that it lasts at least min_rep_ms
 * (a sub-millisecond call timed alone measures the clock). Starts with an
 * untimed warm-up call (first touch of the buffers, OpenBLAS and OpenMP
 * thread start-up), then estimates from one call and again from several:
 * the first estimate is noisy. */
static fr_status calibrate(const bench_opts *o, bench_call fn, void *ctx, int *iters) {
    FR_TRY(fn(ctx));
    double t0 = now_ms();
    FR_TRY(fn(ctx));
    double one = now_ms() - t0;
    int n = one >= o->min_rep_ms ? 1 : (int)ceil(o->min_rep_ms / fmax(one, 1e-3));
    if (n > 1) {
        t0 = now_ms();
        for (int i = 0; i < n; i++)
            FR_TRY(fn(ctx));
        double per = (now_ms() - t0) / n;
        n = per >= o->min_rep_ms ? 1 : (int)ceil(o->min_rep_ms / fmax(per, 1e-3));
    }
    *iters = n;
    return FR_OK;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Pauses long enough for spinning worker threads to go to sleep: OpenBLAS's
 * spin for up to 2^28 cycles (~0.1 s) after a call, libgomp's for less.
 * Without it, the tail of one implementation's threads can steal a core from
 * the next one's first repetitions on a two-core machine. */
static void settle(double ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3), .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

/* Milliseconds per call: the median of the repetitions (what the tables
 * show) and the fastest (how much the others were disturbed). */
typedef struct {
    double median, min;
} bench_time;

/* The time per call of each of `count` implementations of one
 * case, one after the other, with a pause between them (settle). They do
 * not take turns rep by rep: implementations with different thread pools
 * would then time each other's idle spinning. */
static fr_status time_impls(const bench_opts *o, int count, const bench_impl *impls, void *ctx,
                            bench_time *t) {
    FR_ASSERT(count >= 1 && count <= MAX_IMPLS);
    double samples[MAX_REPS];
    int reps = o->reps < MAX_REPS ? o->reps : MAX_REPS;
    fr_status st = FR_OK;
    for (int j = 0; j < count && st == FR_OK; j++) {
        const bench_impl *im = &impls[j];
        int iters = 1;
        if (count > 1)
            settle(o->settle_ms);
        if (im->enter)
            im->enter();
        st = calibrate(o, im->call, ctx, &iters);
        for (int r = 0; r < reps && st == FR_OK; r++) {
            double t0 = now_ms();
            for (int i = 0; i < iters && st == FR_OK; i++)
                st = im->call(ctx);
            samples[r] = (now_ms() - t0) / iters;
        }
        if (im->leave)
            im->leave();
        if (st == FR_OK) {
            t[j].median = median(samples, reps); /* sorts them */
            t[j].min = samples[0];
        }
    }
    return st;
}

static fr_status time_call(const bench_opts *o, bench_call fn, void *ctx, bench_time *t) {
    const bench_impl one = {.call = fn};
    return time_impls(o, 1, &one, ctx, t);
}

static void emit(const char *section, const char *name, const char *impl, bench_time t,
                 double work) {
    printf("R\t%s\t%s\t%s\t%.6f\t%.0f\t%.6f\n", section, name, impl, t.median, work, t.min);
    fflush(stdout);
}

/* A CPU f32 tensor of uniform values in [-1, 1) from a fixed seed, so every
 * run (and the torch side, whose values differ but whose range matches)
 * times the same kind of data: no denormals, no zeros to skip. */
static fr_tensor *random_tensor(int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *t = fr_empty(FR_CPU, FR_F32, ndim, shape, FR_TAG_DATA);
    if (!t)
        return NULL;
    float *p = fr_data_f32(t);
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < fr_numel(t); i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    return t;
}

/* ------------------------------------------------- the convolution cases */

/* The convolutions of a CIFAR ResNet (He et al. 2016) at batch 64: the 3x3
 * convs of the three stages, the stride-2 3x3 convs that enter stages 2 and
 * 3, and the 1x1 stride-2 projection shortcuts (option B). The stem conv
 * (3 -> 16) is left out: its share of the step is small. Then the layers
 * of issue 21 on CIFAR shapes: depthwise 3x3 (groups = channels, a
 * MobileNet block's) and a transposed 4x4 stride-2 (a DCGAN / U-Net
 * decoder's upsampling; c, h, w are its input, k its output channels). */
typedef struct {
    const char *name;
    int n, c, h, w, k, r, s, stride, pad;
    int groups;      /* 0: 1 */
    bool transposed;
} conv_case;

static const conv_case conv_cases[] = {
    {"3x3 16->16 s1 @32", 64, 16, 32, 32, 16, 3, 3, 1, 1, 0, false},
    {"3x3 32->32 s1 @16", 64, 32, 16, 16, 32, 3, 3, 1, 1, 0, false},
    {"3x3 64->64 s1 @8", 64, 64, 8, 8, 64, 3, 3, 1, 1, 0, false},
    {"3x3 16->32 s2 @32", 64, 16, 32, 32, 32, 3, 3, 2, 1, 0, false},
    {"3x3 32->64 s2 @16", 64, 32, 16, 16, 64, 3, 3, 2, 1, 0, false},
    {"1x1 16->32 s2 @32", 64, 16, 32, 32, 32, 1, 1, 2, 0, 0, false},
    {"1x1 32->64 s2 @16", 64, 32, 16, 16, 64, 1, 1, 2, 0, 0, false},
    {"dw3x3 32 s1 @32", 64, 32, 32, 32, 32, 3, 3, 1, 1, 32, false},
    {"dw3x3 64 s1 @16", 64, 64, 16, 16, 64, 3, 3, 1, 1, 64, false},
    {"convT4x4 64->32 s2 @16", 64, 64, 16, 16, 32, 4, 4, 2, 1, 0, true},
};
enum { N_CONV = sizeof conv_cases / sizeof conv_cases[0] };

static int conv_out(int size, int k, int stride, int pad) { return (size + 2 * pad - k) / stride + 1; }
static int conv_groups(const conv_case *cc) { return cc->groups ? cc->groups : 1; }
/* the output's height / width (a transposed case's is the larger one) */
static int case_oh(const conv_case *cc) {
    return cc->transposed ? (cc->h - 1) * cc->stride - 2 * cc->pad + cc->r
                          : conv_out(cc->h, cc->r, cc->stride, cc->pad);
}
static int case_ow(const conv_case *cc) {
    return cc->transposed ? (cc->w - 1) * cc->stride - 2 * cc->pad + cc->s
                          : conv_out(cc->w, cc->s, cc->stride, cc->pad);
}

/* Multiply-adds x 2 of one pass; forward, backward-data and backward-weight
 * each do the same number. A transposed case does as many as the
 * convolution it transposes (input and output swapped). */
static double conv_flop(const conv_case *cc) {
    double pixels = cc->transposed ? (double)cc->h * cc->w : (double)case_oh(cc) * case_ow(cc);
    return 2.0 * cc->n * pixels * cc->k * ((double)cc->c / conv_groups(cc)) * cc->r * cc->s;
}

typedef enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_WEIGHT, PASS_ALL, PASS_COUNT } conv_pass;
static const char *const pass_names[] = {"fwd", "bwd_data", "bwd_weight", "all"};
FR_STATIC_ASSERT(sizeof pass_names / sizeof pass_names[0] == PASS_COUNT, "one name per pass");

static void conv_case_name(char *buf, size_t len, const conv_case *cc, conv_pass pass) {
    snprintf(buf, len, "%s %s", cc->name, pass_names[pass]);
}

static void conv_list(const bench_opts *o) {
    for (int i = 0; i < N_CONV; i++) {
        const conv_case *cc = &conv_cases[i];
        for (int p = 0; p < PASS_COUNT; p++) {
            char name[96];
            conv_case_name(name, sizeof name, cc, (conv_pass)p);
            if (!wanted(o, name))
                continue;
            printf("C\tconv\t%s\t%.0f\tn=%d c=%d h=%d w=%d k=%d r=%d s=%d stride=%d pad=%d "
                   "groups=%d transposed=%d pass=%s\n",
                   name, conv_flop(cc) * (p == PASS_ALL ? 3 : 1), cc->n, cc->c, cc->h, cc->w, cc->k,
                   cc->r, cc->s, cc->stride, cc->pad, conv_groups(cc), cc->transposed,
                   pass_names[p]);
        }
    }
}

typedef struct {
    fr_tensor *x, *w, *y, *dy, *dx, *dw; // x (N,C,H,W), w (K,C/g,R,S) or (C,K/g,R,S), y dy (N,K,OH,OW)
    fr_conv_params p;
    fr_conv_transpose_params tp;
    bool transposed;
} conv_ctx;

static fr_status conv_forward_call(conv_ctx *c) {
    return c->transposed ? fr_conv_transpose2d_forward(c->y, c->x, c->w, NULL, c->tp)
                         : fr_conv2d_forward(c->y, c->x, c->w, NULL, c->p);
}
static fr_status conv_backward_call(conv_ctx *c, fr_tensor *dx, fr_tensor *dw) {
    return c->transposed ? fr_conv_transpose2d_backward(dx, dw, NULL, c->dy, c->x, c->w, c->tp)
                         : fr_conv2d_backward(dx, dw, NULL, c->dy, c->x, c->w, c->p);
}

static fr_status conv_fwd(void *v) { return conv_forward_call(v); }
static fr_status conv_bwd_data(void *v) {
    conv_ctx *c = v;
    return conv_backward_call(c, c->dx, NULL);
}
static fr_status conv_bwd_weight(void *v) {
    conv_ctx *c = v;
    return conv_backward_call(c, NULL, c->dw);
}
/* What a training step does per conv layer: forward, then both gradients in
 * one backward call (which may share work between them). */
static fr_status conv_all(void *v) {
    conv_ctx *c = v;
    FR_TRY(conv_forward_call(c));
    return conv_backward_call(c, c->dx, c->dw);
}

static void conv_ctx_free(conv_ctx *c) {
    fr_clear(&c->x);
    fr_clear(&c->w);
    fr_clear(&c->y);
    fr_clear(&c->dy);
    fr_clear(&c->dx);
    fr_clear(&c->dw);
}

static fr_status conv_run(const bench_opts *o) {
    static const bench_call calls[PASS_COUNT] = {conv_fwd, conv_bwd_data, conv_bwd_weight, conv_all};
    for (int i = 0; i < N_CONV; i++) {
        const conv_case *cc = &conv_cases[i];
        int oh = case_oh(cc), ow = case_ow(cc), g = conv_groups(cc);
        conv_ctx c = {.p = {.stride = cc->stride, .pad = cc->pad, .groups = g},
                      .tp = {.stride = cc->stride, .pad = cc->pad, .groups = g},
                      .transposed = cc->transposed};
        c.x = random_tensor(4, FR_SHAPE(cc->n, cc->c, cc->h, cc->w), 1);
        c.w = cc->transposed ? random_tensor(4, FR_SHAPE(cc->c, cc->k / g, cc->r, cc->s), 2)
                             : random_tensor(4, FR_SHAPE(cc->k, cc->c / g, cc->r, cc->s), 2);
        c.dy = random_tensor(4, FR_SHAPE(cc->n, cc->k, oh, ow), 3);
        c.y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(cc->n, cc->k, oh, ow), FR_TAG_TRANSIENT);
        c.dx = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->w), FR_TAG_TRANSIENT);
        c.dw = c.w ? fr_empty(FR_CPU, FR_F32, 4, c.w->shape, FR_TAG_GRAD) : NULL;
        fr_status st = c.x && c.w && c.dy && c.y && c.dx && c.dw ? FR_OK : fr_last_status();
        for (int p = 0; p < PASS_COUNT && st == FR_OK; p++) {
            char name[96];
            conv_case_name(name, sizeof name, cc, (conv_pass)p);
            bench_time t;
            if (wanted(o, name) && (st = time_call(o, calls[p], &c, &t)) == FR_OK)
                emit("conv", name, "frugal", t, conv_flop(cc) * (p == PASS_ALL ? 3 : 1));
        }
        conv_ctx_free(&c);
        FR_TRY(st);
    }
    return FR_OK;
}

/* ------------------------------------------------------- the GEMM cases */

typedef struct {
    char name[96];
    int m, n, k;
    bool ta, tb;
} gemm_case;

enum { MAX_GEMM = 64 };

/* Square sizes, then the GEMMs an im2col convolution makes of each conv
 * case, one image at a time: its P = OH*OW output pixels unrolled into
 * cols (CRS, P), and
 *   fwd         y(K, P)      = w(K, CRS) . cols(CRS, P)
 *   bwd_data    dcols(CRS, P) = w^T . dy(K, P)         (A transposed)
 *   bwd_weight  dw(K, CRS)   = dy(K, P) . cols^T       (B transposed)
 * That is what cpu/conv_im2col.c does for CIFAR shapes (a band of rows is a
 * whole image when its columns fit the budget there, and 1x1 stride-1 convs,
 * which skip the unrolling, do not occur in ResNet's stages). cpu/conv_im2col.c
 * currently runs such a GEMM single-threaded, one image per OpenMP thread;
 * here fr_gemm_out runs each on all threads. */
static int gemm_cases(gemm_case *out) {
    static const int squares[] = {256, 512, 1024, 2048};
    int count = 0;
    for (size_t i = 0; i < sizeof squares / sizeof squares[0]; i++) {
        gemm_case *g = &out[count++];
        *g = (gemm_case){.m = squares[i], .n = squares[i], .k = squares[i]};
        snprintf(g->name, sizeof g->name, "square %d", squares[i]);
    }
    for (int i = 0; i < N_CONV; i++) {
        const conv_case *cc = &conv_cases[i];
        if (cc->groups || cc->transposed) /* oneDNN's own kernels, no im2col GEMM */
            continue;
        int pix = conv_out(cc->h, cc->r, cc->stride, cc->pad) *
                  conv_out(cc->w, cc->s, cc->stride, cc->pad);
        int crs = cc->c * cc->r * cc->s;
        const gemm_case per_pass[3] = {
            {.m = cc->k, .n = pix, .k = crs},
            {.m = crs, .n = pix, .k = cc->k, .ta = true},
            {.m = cc->k, .n = crs, .k = pix, .tb = true},
        };
        for (int p = 0; p < 3; p++) {
            FR_ASSERT(count < MAX_GEMM);
            gemm_case *g = &out[count++];
            *g = per_pass[p];
            snprintf(g->name, sizeof g->name, "%s %s %dx%dx%d %c%c", cc->name, pass_names[p], g->m,
                     g->n, g->k, g->ta ? 'T' : 'N', g->tb ? 'T' : 'N');
        }
    }
    return count;
}

static double gemm_flop(const gemm_case *g) { return 2.0 * g->m * g->n * (double)g->k; }

static void gemm_list(const bench_opts *o) {
    gemm_case cases[MAX_GEMM];
    int count = gemm_cases(cases);
    for (int i = 0; i < count; i++)
        if (wanted(o, cases[i].name))
            printf("C\tgemm\t%s\t%.0f\tm=%d n=%d k=%d ta=%d tb=%d\n", cases[i].name,
                   gemm_flop(&cases[i]), cases[i].m, cases[i].n, cases[i].k, cases[i].ta, cases[i].tb);
}

typedef struct {
    fr_tensor *a, *b, *c; // a (M,K) or (K,M), b (K,N) or (N,K), c (M,N)
    const gemm_case *g;
} gemm_ctx;

static fr_status gemm_frugal(void *v) {
    gemm_ctx *x = v;
    return fr_gemm_out(x->c, x->a, x->b, x->g->ta, x->g->tb, 1.0f, 0.0f);
}

#if defined(FR_HAVE_CBLAS) && defined(OPENBLAS_VERSION)
/* OpenBLAS's thread count as the environment set it, read before frugal's
 * first GEMM: frugal may change it for its own calls (cpu/gemm.c runs
 * OpenBLAS single-threaded under its OpenMP split), and the direct call
 * below should measure OpenBLAS as a user would get it. */
static int blas_env_threads, blas_saved_threads;
static void blas_env_enter(void) {
    blas_saved_threads = openblas_get_num_threads();
    openblas_set_num_threads(blas_env_threads);
}
static void blas_env_leave(void) { openblas_set_num_threads(blas_saved_threads); }
#endif

#ifdef FR_HAVE_CBLAS
/* The ceiling for fr_gemm_out: one BLAS call with no frugal in between. */
static fr_status gemm_openblas(void *v) {
    gemm_ctx *x = v;
    const gemm_case *g = x->g;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                g->m, g->n, g->k, 1.0f, fr_data_f32(x->a), g->ta ? g->m : g->k, fr_data_f32(x->b),
                g->tb ? g->k : g->n, 0.0f, fr_data_f32(x->c), g->n);
    return FR_OK;
}
#endif

static const bench_impl gemm_impls[] = {
    {"frugal", gemm_frugal, NULL, NULL},
#if defined(FR_HAVE_CBLAS) && defined(OPENBLAS_VERSION)
    {"openblas", gemm_openblas, blas_env_enter, blas_env_leave},
#elif defined(FR_HAVE_CBLAS)
    {"openblas", gemm_openblas, NULL, NULL},
#endif
};
enum { N_GEMM_IMPLS = sizeof gemm_impls / sizeof gemm_impls[0] };

static fr_status gemm_run(const bench_opts *o) {
    gemm_case cases[MAX_GEMM];
    int count = gemm_cases(cases);
    for (int i = 0; i < count; i++) {
        const gemm_case *g = &cases[i];
        if (!wanted(o, g->name))
            continue;
        gemm_ctx x = {.g = g};
        // stored shapes: a (K,M) when transposed else (M,K); b (N,K) else (K,N)
        x.a = random_tensor(2, g->ta ? FR_SHAPE(g->k, g->m) : FR_SHAPE(g->m, g->k), 4);
        x.b = random_tensor(2, g->tb ? FR_SHAPE(g->n, g->k) : FR_SHAPE(g->k, g->n), 5);
        x.c = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(g->m, g->n), FR_TAG_TRANSIENT);
        fr_status st = x.a && x.b && x.c ? FR_OK : fr_last_status();
        bench_time t[N_GEMM_IMPLS];
        if (st == FR_OK && (st = time_impls(o, N_GEMM_IMPLS, gemm_impls, &x, t)) == FR_OK)
            for (int j = 0; j < N_GEMM_IMPLS; j++)
                emit("gemm", g->name, gemm_impls[j].name, t[j], gemm_flop(g));
        fr_release(x.a);
        fr_release(x.b);
        fr_release(x.c);
        FR_TRY(st);
    }
    return FR_OK;
}

/* ------------------------------------- batch norm + residual + ReLU */

/* The tail of a residual block, y = relu(BN(x) + r), training mode, at the
 * three CIFAR ResNet stages: "frugal" is the fused op (the statistics, then
 * one pass; backward one kernel, fr_bn_act_backward), "frugal-chain" the
 * separate ops it replaced (BN, add, ReLU; ReLU's backward, then BN's). */
typedef struct {
    const char *name;
    int n, c, hw;
} bnact_case;

static const bnact_case bnact_cases[] = {
    {"bn+add+relu 16 @32", 64, 16, 32},
    {"bn+add+relu 32 @16", 64, 32, 16},
    {"bn+add+relu 64 @8", 64, 64, 8},
};
enum { N_BNACT = sizeof bnact_cases / sizeof bnact_cases[0] };

static void bnact_list(const bench_opts *o) {
    for (int i = 0; i < N_BNACT; i++)
        for (int p = 0; p < 2; p++) {
            const bnact_case *b = &bnact_cases[i];
            char name[96];
            snprintf(name, sizeof name, "%s %s", b->name, p ? "bwd" : "fwd");
            if (wanted(o, name))
                printf("C\tbnact\t%s\t0\tn=%d c=%d h=%d w=%d pass=%s\n", name, b->n, b->c, b->hw,
                       b->hw, p ? "bwd" : "fwd");
        }
}

typedef struct {
    fr_tensor *x, *r, *y, *dy, *dx, *dz, *gamma, *beta, *mean, *invstd, *dgamma, *dbeta;
} bnact_ctx;

static fr_status bnact_fused_fwd(void *v) {
    bnact_ctx *c = v;
    FR_TRY(fr_batch_norm_train_stats(c->mean, c->invstd, c->x, NULL, NULL, 0.1f, 1e-5f));
    return fr_bn_act_forward(c->y, c->x, c->r, c->mean, c->invstd, c->gamma, c->beta, FR_ACT_RELU,
                             0.0f);
}
static fr_status bnact_chain_fwd(void *v) {
    bnact_ctx *c = v;
    FR_TRY(fr_batch_norm_train_forward(c->y, c->mean, c->invstd, c->x, c->gamma, c->beta, NULL,
                                       NULL, 0.1f, 1e-5f));
    FR_TRY(fr_add_out(c->y, c->y, c->r));
    return fr_relu_forward(c->y, c->y);
}
/* dz: the residual's gradient, which a block's shortcut wants */
static fr_status bnact_fused_bwd(void *v) {
    bnact_ctx *c = v;
    return fr_bn_act_backward(c->dx, c->dz, c->dgamma, c->dbeta, c->dy, c->y, c->x, c->mean,
                              c->invstd, c->gamma, c->beta, FR_ACT_RELU, 0.0f);
}
static fr_status bnact_chain_bwd(void *v) {
    bnact_ctx *c = v;
    FR_TRY(fr_relu_backward(c->dz, c->dy, c->y));
    return fr_batch_norm_backward(c->dx, c->dgamma, c->dbeta, c->dz, c->x, c->mean, c->invstd,
                                  c->gamma);
}

static fr_status bnact_run(const bench_opts *o) {
    static const bench_impl fwd[] = {{"frugal", bnact_fused_fwd, NULL, NULL},
                                      {"frugal-chain", bnact_chain_fwd, NULL, NULL}};
    static const bench_impl bwd[] = {{"frugal", bnact_fused_bwd, NULL, NULL},
                                      {"frugal-chain", bnact_chain_bwd, NULL, NULL}};
    for (int i = 0; i < N_BNACT; i++) {
        const bnact_case *b = &bnact_cases[i];
        const int64_t *shape = FR_SHAPE(b->n, b->c, b->hw, b->hw);
        bnact_ctx c = {.x = random_tensor(4, shape, 11), .r = random_tensor(4, shape, 12),
                       .dy = random_tensor(4, shape, 13), .gamma = random_tensor(1, FR_SHAPE(b->c), 14),
                       .beta = random_tensor(1, FR_SHAPE(b->c), 15)};
        fr_tensor **out[] = {&c.y, &c.dx, &c.dz};
        for (int k = 0; k < 3; k++)
            *out[k] = fr_empty(FR_CPU, FR_F32, 4, shape, FR_TAG_TRANSIENT);
        fr_tensor **chan[] = {&c.mean, &c.invstd, &c.dgamma, &c.dbeta};
        for (int k = 0; k < 4; k++)
            *chan[k] = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(b->c), FR_TAG_TRANSIENT);
        fr_tensor *all[] = {c.x, c.r, c.y, c.dy, c.dx, c.dz, c.gamma, c.beta, c.mean, c.invstd,
                            c.dgamma, c.dbeta};
        fr_status st = FR_OK;
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            if (!all[k])
                st = fr_last_status();
        /* y, mean and invstd for the backward cases */
        if (st == FR_OK)
            st = bnact_fused_fwd(&c);
        for (int p = 0; p < 2 && st == FR_OK; p++) {
            char name[96];
            snprintf(name, sizeof name, "%s %s", b->name, p ? "bwd" : "fwd");
            bench_time t[2];
            if (wanted(o, name) && (st = time_impls(o, 2, p ? bwd : fwd, &c, t)) == FR_OK)
                for (int j = 0; j < 2; j++)
                    emit("bnact", name, (p ? bwd : fwd)[j].name, t[j], 0);
        }
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            fr_release(all[k]);
        FR_TRY(st);
    }
    return FR_OK;
}

/* ---------------------------------------------------------- the sections */

typedef struct {
    const char *name;
    const char *title;
    const char *unit;
    void (*list)(const bench_opts *o);
    fr_status (*run)(const bench_opts *o);
} bench_section;

static const bench_section sections[] = {
    {"gemm", "SGEMM, row-major f32, C(M,N) = op(A) op(B); case = MxNxK, N/T = op of A and B", "ms",
     gemm_list, gemm_run},
    {"conv", "conv2d f32, batch 64, no bias; fwd, bwd_data (dx), bwd_weight (dw), all = fwd + dx + dw",
     "ms", conv_list, conv_run},
    {"bnact", "batch norm (training) + residual add + ReLU f32, batch 64; fwd = statistics + "
              "normalise + add + ReLU, bwd = dx, dgamma, dbeta and the residual's gradient",
     "ms", bnact_list, bnact_run},
};
enum { N_SECTIONS = sizeof sections / sizeof sections[0] };

static void print_setup(void) {
    int omp = 1;
#ifdef _OPENMP
    omp = omp_get_max_threads();
#endif
    const char *env = getenv("OMP_NUM_THREADS");
    printf("# frugal: OpenMP threads %d (OMP_NUM_THREADS=%s)\n", omp, env ? env : "unset");
#if defined(FR_HAVE_CBLAS) && defined(OPENBLAS_VERSION)
    blas_env_threads = openblas_get_num_threads();
    printf("# openblas: %s, core %s; %d threads at start (OPENBLAS_NUM_THREADS=%s); the openblas "
           "column runs with these\n",
           openblas_get_config(), openblas_get_corename(), blas_env_threads,
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset");
#elif defined(FR_HAVE_CBLAS)
    printf("# frugal: GEMM by the system cblas\n");
#else
    printf("# frugal: GEMM built in (no cblas.h at build time); no openblas column\n");
#endif
}

/* Prints the flags to `out`; returns `code`, the exit status. */
static int usage(FILE *out, const char *prog, int code) {
    fprintf(out,
            "usage: %s [--list] [--only SECTION] [--match TEXT] [--reps N] [--min-rep-ms MS]\n"
            "          [--settle-ms MS]\n"
            "  --list        print the sections and cases (for bench/torch_ops.py) and exit\n"
            "  --only S      run one section (gemm, conv, bnact)\n"
            "  --match TEXT  run only the cases whose name contains TEXT\n"
            "  --reps N      timed repetitions per case, median reported (default 7)\n"
            "  --min-rep-ms  a repetition repeats the call until it lasts this long (default 20)\n"
            "  --settle-ms   pause between the implementations of one case (default 100)\n",
            prog);
    return code;
}

int main(int argc, char **argv) {
    bench_opts o = {.reps = 7, .min_rep_ms = 20.0, .settle_ms = 100.0};
    bool list = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help"))
            return usage(stdout, argv[0], 0);
        else if (!strcmp(argv[i], "--list"))
            list = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            o.only = argv[++i];
        else if (!strcmp(argv[i], "--match") && i + 1 < argc)
            o.match = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-rep-ms") && i + 1 < argc)
            o.min_rep_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--settle-ms") && i + 1 < argc)
            o.settle_ms = atof(argv[++i]);
        else
            return usage(stderr, argv[0], 2);
    }
    if (o.reps < 1 || o.reps > MAX_REPS || !(o.min_rep_ms >= 0) || !(o.settle_ms >= 0))
        return usage(stderr, argv[0], 2);
    if (!list)
        print_setup();
    int ran = 0, failed = 0;
    for (int i = 0; i < N_SECTIONS; i++) {
        const bench_section *s = &sections[i];
        if (o.only && strcmp(o.only, s->name))
            continue;
        ran++;
        printf("S\t%s\t%s\t%s\n", s->name, s->title, s->unit);
        if (list) {
            s->list(&o);
            continue;
        }
        double t0 = now_ms();
        if (s->run(&o) != FR_OK) {
            /* Keep going: one missing op should not hide the other tables. */
            printf("# frugal: section %s stopped: %s\n", s->name, fr_last_error());
            failed++;
        }
        fprintf(stderr, "bench_ops: %s took %.1f s\n", s->name, (now_ms() - t0) * 1e-3);
    }
    if (!ran) {
        fprintf(stderr, "bench_ops: no section named %s\n", o.only);
        return 2;
    }
#if defined(FR_HAVE_CBLAS) && defined(OPENBLAS_VERSION)
    if (!list)
        printf("# frugal: GEMM by OpenBLAS, which frugal left at %d threads per call\n",
               openblas_get_num_threads());
#endif
    if (fr_live_tensors() != 0)
        printf("# frugal: %ld tensors still alive at exit (a leak in the bench or an op)\n",
               fr_live_tensors());
    return failed ? 1 : 0;
}
