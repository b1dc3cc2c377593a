/* test_conv_bf16.c: convolutions computed in bf16 on CPUs with AVX512_BF16
 * (cpu/conv_bf16.c, kernels.def conv2d_half). On bf16 operands the forward
 * and backward (data) passes of 3x3 and 1x1 layers run oneDNN's bf16 kernels (FR_CONV_BF16=on); the
 * result must match the f32 reference on the same (bf16-exact) values
 * within bf16's rounding of the output (2^-8 relative, plus 1e-5 of the
 * tensor's scale for the f32 sums' order); it must not depend on the batch
 * an image is in nor on the thread count; the shapes the rule leaves out
 * (5x5 and other sizes, grouped, dilated), f16 and the weight gradient
 * decline and are staged to f32; and
 * with FR_CPU_ISA below avx512 (a child process) every call declines and
 * the staged result comes out. The bf16 checks skip on CPUs without
 * AVX512_BF16 or in a build without oneDNN, where the rule must say no. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/conv_chunk.h"
#include "cpu/isa.h"
#include "tensor/kernels.h"
#include "tensor/memory.h"
#include "tensor/ops.h"

typedef struct {
    int n, c, h, k, r, stride, pad;
} conv_case;

/* ResNet's 3x3 layers at each width and stride, DenseNet's growth layer, an
 * odd size with no padding, and 1x1 layers (a strided shortcut, a
 * bottleneck). */
static const conv_case cases[] = {
    {4, 16, 32, 16, 3, 1, 1}, {4, 16, 32, 32, 3, 2, 1}, {4, 64, 8, 64, 3, 1, 1},
    {3, 48, 16, 12, 3, 1, 1}, {2, 5, 13, 7, 3, 2, 0},   {4, 32, 16, 64, 1, 2, 0},
    {2, 24, 16, 48, 1, 1, 0},
};

static const char *self_path;

/* A random f32 tensor rounded to bf16 (as bf16) and back (as f32): both
 * hold the same values. */
static void rand_pair(fr_tensor **f32, fr_tensor **bf, int n, int c, int h, int w, uint32_t seed) {
    fr_tensor *r = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, h, w), seed);
    *bf = fr_to_dtype(r, FR_BF16, FR_TAG_TRANSIENT);
    *f32 = fr_to_dtype(*bf, FR_F32, FR_TAG_TRANSIENT);
    fr_release(r);
}

/* got (bf16) against ref (f32): every element within 2^-8 of itself (bf16
 * keeps 8 significant bits and rounds to nearest) plus 1e-5 of the largest. */
static bool close_to(const fr_tensor *got, const fr_tensor *ref, const char *what, const conv_case *cc) {
    fr_tensor *g = fr_to_dtype(got, FR_F32, FR_TAG_TRANSIENT);
    const float *pg = fr_data_f32(g), *pr = fr_data_f32(ref);
    double scale = 0.0, worst = 0.0;
    for (int64_t i = 0; i < fr_numel(ref); i++)
        scale = fabs(pr[i]) > scale ? fabs(pr[i]) : scale;
    bool ok = true;
    for (int64_t i = 0; i < fr_numel(ref); i++) {
        double d = fabs((double)pg[i] - pr[i]), bound = fabs(pr[i]) / 256.0 + 1e-5 * scale;
        ok &= d <= bound; /* NaN fails */
        worst = d / (bound > 0 ? bound : 1) > worst ? d / (bound > 0 ? bound : 1) : worst;
    }
    if (!ok)
        fprintf(stderr, "    %s %d->%d %dx%d /%d @%d: %.2f of the bound\n", what, cc->c, cc->k, cc->r,
                cc->r, cc->stride, cc->h, worst);
    fr_release(g);
    return ok;
}

typedef struct {
    fr_tensor *x, *w, *dy;    /* bf16 */
    fr_tensor *xf, *wf, *dyf; /* the same values, f32 */
    fr_conv_shape s;
    fr_conv_params p;
} operands;

static operands make(const conv_case *cc, uint32_t seed) {
    operands o;
    o.p = (fr_conv_params){.stride = cc->stride, .pad = cc->pad};
    rand_pair(&o.xf, &o.x, cc->n, cc->c, cc->h, cc->h, seed);
    rand_pair(&o.wf, &o.w, cc->k, cc->c, cc->r, cc->r, seed + 1);
    CHECK_OK(fr_conv2d_shape(o.x, o.w, o.p, &o.s));
    rand_pair(&o.dyf, &o.dy, o.s.n, o.s.k, o.s.oh, o.s.ow, seed + 2);
    return o;
}

static void drop(operands *o) {
    fr_release(o->x), fr_release(o->w), fr_release(o->dy);
    fr_release(o->xf), fr_release(o->wf), fr_release(o->dyf);
}

/* y and dx through the public ops (bf16 in, bf16 out), dw (f32) beside dx */
static void run_ops(const operands *o, fr_tensor **y, fr_tensor **dx, fr_tensor **dw) {
    *y = fr_empty_like(o->dy, FR_TAG_TRANSIENT);
    *dx = fr_empty_like(o->x, FR_TAG_TRANSIENT);
    *dw = fr_empty_like(o->wf, FR_TAG_TRANSIENT);
    CHECK_OK(fr_fill_(*dw, NAN));
    CHECK_OK(fr_conv2d_forward(*y, o->x, o->w, NULL, o->p));
    CHECK_OK(fr_conv2d_backward(*dx, *dw, NULL, o->dy, o->x, o->w, o->p));
}

/* The f32 reference on the same values (im2col) */
static void run_reference(const operands *o, fr_tensor **y, fr_tensor **dx, fr_tensor **dw) {
    *y = fr_empty_like(o->dyf, FR_TAG_TRANSIENT);
    *dx = fr_empty_like(o->xf, FR_TAG_TRANSIENT);
    *dw = fr_empty_like(o->wf, FR_TAG_TRANSIENT);
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_IM2COL));
    CHECK_OK(fr_conv2d_forward(*y, o->xf, o->wf, NULL, o->p));
    CHECK_OK(fr_conv2d_backward(*dx, *dw, NULL, o->dyf, o->xf, o->wf, o->p));
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_AUTO));
}

static bool machine_has_bf16(void) {
    return fr_cpu_have_dnnl() && fr_cpu_isa_has_bf16();
}

/* The rule under FR_CONV_BF16=on: 3x3 and 1x1 forward and backward (data) only, and only where the CPU
 * has the instructions and the build has oneDNN. */
static void test_rule(void) {
    bool bf = machine_has_bf16();
    fr_conv_shape s3 = {.n = 8, .c = 16, .h = 32, .w = 32, .k = 16, .r = 3, .s = 3, .oh = 32, .ow = 32,
                        .stride = 1, .pad = 1};
    fr_conv_shape s1 = s3;
    s1.r = s1.s = 1;
    s1.pad = 0;
    CHECK(fr_cpu_conv_bf16_applies(&s3, 0) == bf);
    CHECK(fr_cpu_conv_bf16_applies(&s3, 1) == bf);
    CHECK(!fr_cpu_conv_bf16_applies(&s3, 2));
    fr_conv_shape sg = s3; /* grouped and dilated shapes were not measured: f32 */
    sg.groups = 4;
    CHECK(!fr_cpu_conv_bf16_applies(&sg, 0));
    sg = s3;
    sg.dilation = 2;
    CHECK(!fr_cpu_conv_bf16_applies(&sg, 0));
    CHECK(fr_cpu_conv_bf16_applies(&s1, 0) == bf);
    CHECK(fr_cpu_conv_bf16_applies(&s1, 1) == bf);
    fr_conv_shape s5 = s3; /* other sizes were not measured: f32 */
    s5.r = s5.s = 5;
    s5.pad = 2;
    CHECK(!fr_cpu_conv_bf16_applies(&s5, 0));
}

/* Every case against the f32 reference; where the rule says bf16, the
 * kernel runs (done) and its result is what the op returns. */
static void test_matches_f32(void) {
    if (!machine_has_bf16())
        SKIP("no AVX512_BF16 (or no oneDNN): bf16 is storage only here");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const conv_case *cc = &cases[i];
        operands o = make(cc, 40 + (uint32_t)i * 3);
        fr_tensor *y, *dx, *dw, *ry, *rdx, *rdw;
        run_ops(&o, &y, &dx, &dw);
        run_reference(&o, &ry, &rdx, &rdw);
        CHECK(close_to(y, ry, "y", cc));
        CHECK(close_to(dx, rdx, "dx", cc));
        /* dw is f32, staged: the f32 path's 1e-5 */
        CHECK(fr_t_scaled_diff(dw, rdw) < 1e-5);
        bool applies = fr_cpu_conv_bf16_applies(&o.s, 0);
        CHECK(applies);
        fr_tensor *y2 = fr_empty_like(y, FR_TAG_TRANSIENT);
        bool done = false;
        CHECK_OK(fr_cpu_conv2d_half(fr_data(y2), fr_data(o.x), fr_data(o.w), FR_BF16, 0, &o.s, &done));
        CHECK(done == applies);
        if (done) /* the op took the bf16 kernel: the same bits */
            CHECK(fr_t_same_bits(y2, y));
        /* f16 and the weight gradient decline */
        CHECK_OK(fr_cpu_conv2d_half(fr_data(y2), fr_data(o.x), fr_data(o.w), FR_F16, 0, &o.s, &done));
        CHECK(!done);
        CHECK_OK(fr_cpu_conv2d_half(fr_data(o.wf), fr_data(o.dy), fr_data(o.x), FR_BF16, 2, &o.s, &done));
        CHECK(!done);
        fr_release(y2);
        fr_release(y), fr_release(dx), fr_release(dw);
        fr_release(ry), fr_release(rdx), fr_release(rdw);
        drop(&o);
    }
}

/* An image's y and dx are the same bits alone as in a batch of 6, and on
 * 1, 2 or 3 threads. */
static void test_batch_and_threads(void) {
    if (!machine_has_bf16())
        SKIP("no AVX512_BF16 (or no oneDNN)");
    static const conv_case convs[] = {{6, 16, 32, 16, 3, 1, 1}, {6, 32, 16, 64, 3, 2, 1},
                                      {6, 48, 8, 12, 3, 1, 1},   {6, 256, 8, 128, 1, 1, 0},
                                      {6, 32, 16, 64, 1, 2, 0}};
    int team = omp_get_max_threads();
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        const conv_case *cc = &convs[i];
        operands o = make(cc, 70 + (uint32_t)i * 3);
        fr_tensor *y1 = NULL, *dx1 = NULL, *dw;
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            fr_tensor *y, *dx;
            run_ops(&o, &y, &dx, &dw);
            fr_release(dw);
            if (t == 1) {
                y1 = y, dx1 = dx;
                continue;
            }
            CHECK(fr_t_same_bits(y, y1) && fr_t_same_bits(dx, dx1));
            fr_release(y), fr_release(dx);
        }
        omp_set_num_threads(team);
        /* image 4 alone */
        fr_tensor *x4 = fr_narrow(o.x, 0, 4, 1), *dy4 = fr_narrow(o.dy, 0, 4, 1);
        fr_tensor *y4 = fr_narrow(y1, 0, 4, 1), *dx4 = fr_narrow(dx1, 0, 4, 1);
        fr_tensor *ya = fr_empty_like(y4, FR_TAG_TRANSIENT), *dxa = fr_empty_like(dx4, FR_TAG_TRANSIENT);
        CHECK_OK(fr_conv2d_forward(ya, x4, o.w, NULL, o.p));
        CHECK_OK(fr_conv2d_backward(dxa, NULL, NULL, dy4, NULL, o.w, o.p));
        CHECK(fr_t_same_bits(ya, y4) && fr_t_same_bits(dxa, dx4));
        fr_release(x4), fr_release(dy4), fr_release(y4), fr_release(dx4), fr_release(ya), fr_release(dxa);
        fr_release(y1), fr_release(dx1);
        drop(&o);
    }
}

/* In a child with FR_CPU_ISA below avx512: no bf16 compute, and the op's
 * result is the f32 kernels' on staged operands (same bits as the
 * staging the parent does with the oneDNN backend forced). */
static void test_child_declines(void) {
    CHECK(!fr_cpu_isa_has_bf16());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const conv_case *cc = &cases[i];
        operands o = make(cc, 40 + (uint32_t)i * 3);
        CHECK(!fr_cpu_conv_bf16_applies(&o.s, 0) && !fr_cpu_conv_bf16_applies(&o.s, 1));
        fr_tensor *y = fr_empty_like(o.dy, FR_TAG_TRANSIENT);
        bool done = true;
        CHECK_OK(fr_cpu_conv2d_half(fr_data(y), fr_data(o.x), fr_data(o.w), FR_BF16, 0, &o.s, &done));
        CHECK(!done);
        fr_tensor *dx, *dw, *ry, *rdx, *rdw;
        fr_release(y);
        run_ops(&o, &y, &dx, &dw);
        run_reference(&o, &ry, &rdx, &rdw);
        CHECK(close_to(y, ry, "y (staged)", cc));
        CHECK(close_to(dx, rdx, "dx (staged)", cc));
        fr_release(y), fr_release(dx), fr_release(dw);
        fr_release(ry), fr_release(rdx), fr_release(rdw);
        drop(&o);
    }
}

/* Under a workspace cap that lets one image through at a time, the bf16
 * passes run in chunks (cpu/conv_chunk.h) and give the whole batch's bits. */
static void test_chunks_same_bits(void) {
    if (!machine_has_bf16())
        SKIP("no AVX512_BF16 (or no oneDNN)");
    static const conv_case convs[] = {{5, 16, 32, 16, 3, 1, 1}, {5, 256, 8, 128, 1, 1, 0}};
    size_t cap = fr_cpu_conv_workspace_cap();
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        operands o = make(&convs[i], 90 + (uint32_t)i);
        fr_tensor *y, *dx, *dw, *yc, *dxc, *dwc;
        run_ops(&o, &y, &dx, &dw);
        /* the forward's workspace alone, whole batch against chunks: the
         * chunks took less, so they ran */
        size_t ws[2];
        fr_tensor *scratch = fr_empty_like(y, FR_TAG_TRANSIENT);
        for (int c = 0; c < 2; c++) {
            fr_cpu_conv_set_workspace_cap(c ? 1 : cap);
            fr_mem_reset_peak();
            size_t base = fr_mem_current(FR_CPU, FR_TAG_WORKSPACE);
            CHECK_OK(fr_conv2d_forward(scratch, o.x, o.w, NULL, o.p));
            ws[c] = fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE) - base;
        }
        fr_release(scratch);
        CHECK(ws[1] < ws[0]);
        run_ops(&o, &yc, &dxc, &dwc);
        fr_cpu_conv_set_workspace_cap(cap);
        CHECK(fr_t_same_bits(y, yc) && fr_t_same_bits(dx, dxc));
        fr_release(y), fr_release(dx), fr_release(dw), fr_release(yc), fr_release(dxc), fr_release(dwc);
        drop(&o);
    }
}

static int run_child(const char *value) {
    return fr_t_run_self(self_path, "FR_CPU_ISA", value,
                         (char *const[]){(char *)self_path, "--child", NULL});
}

/* Every class below avx512 that this CPU can run falls back. */
static void test_capped_classes_fall_back(void) {
    fr_cpu_isa top = fr_cpu_isa_detected();
    for (int isa = 0; isa <= (int)top && isa < FR_ISA_AVX512; isa++) {
        int rc = run_child(fr_cpu_isa_name((fr_cpu_isa)isa));
        if (rc != 0)
            fprintf(stderr, "    FR_CPU_ISA=%s: child exited %d\n", fr_cpu_isa_name((fr_cpu_isa)isa), rc);
        CHECK(rc == 0);
    }
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 2 && strcmp(argv[1], "--child") == 0) {
        RUN(test_child_declines);
        return TEST_SUMMARY();
    }
    if (getenv("FR_CPU_ISA"))
        unsetenv("FR_CPU_ISA");
    /* on most CPUs the rule leaves the bf16 kernels off unless asked
     * (cpu/conv_bf16.c); these tests ask */
    setenv("FR_CONV_BF16", "on", 1);
    RUN(test_rule);
    RUN(test_matches_f32);
    RUN(test_batch_and_threads);
    RUN(test_chunks_same_bits);
    RUN(test_capped_classes_fall_back);
    return TEST_SUMMARY();
}
