/* test_cpu_backends.c: the CPU kernels' oneDNN paths against the reference
 * paths. Convolution on oneDNN (cpu/conv_dnnl.c, in both of its layouts)
 * must match the im2col reference (cpu/conv_im2col.c), and GEMM on oneDNN's
 * matmul (cpu/gemm_dnnl.c) the reference GEMM (cpu/gemm.c), within 1e-5 of
 * the largest reference value, and give the same bits when a call is
 * repeated. The oneDNN checks skip when the build has no oneDNN. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"

typedef struct {
    int n, c, h, k, r, stride, pad;
} conv_case;

/* CIFAR ResNet and DenseNet layers (3 -> 16 stem, 3x3 at every width,
 * stride-2 3x3 and 1x1 shortcuts, DenseNet's 1x1 bottleneck and 3x3 growth
 * layer), plus odd sizes, no padding and a rounded-down output size. */
static const conv_case cases[] = {
    {8, 3, 32, 16, 3, 1, 1},  {8, 16, 32, 16, 3, 1, 1}, {8, 16, 32, 32, 3, 2, 1},
    {8, 32, 16, 32, 1, 2, 0}, {8, 64, 8, 64, 3, 1, 1},  {4, 24, 16, 48, 1, 1, 0},
    {4, 48, 16, 12, 3, 1, 1}, {3, 5, 13, 7, 3, 2, 0},   {2, 9, 11, 6, 5, 2, 2},
};

/* max |a - b| over max |ref|: the error relative to the tensor's scale, the
 * measure that stays meaningful for gradients that are sums of thousands of
 * products (an element near 0 can lose every digit to round-off). */
static double scaled_diff(const fr_tensor *a, const fr_tensor *ref) {
    const float *pa = fr_data_f32(a), *pr = fr_data_f32(ref);
    double worst = 0.0, scale = 0.0;
    for (int64_t i = 0; i < fr_numel(ref); i++) {
        double d = fabs((double)pa[i] - pr[i]);
        worst = d > worst || d != d ? d : worst;
        scale = fabs(pr[i]) > scale ? fabs(pr[i]) : scale;
    }
    return scale > 0.0 ? worst / scale : worst;
}

static bool same_bits(const fr_tensor *a, const fr_tensor *b) {
    return memcmp(fr_data(a), fr_data(b), (size_t)fr_numel(a) * sizeof(float)) == 0;
}

typedef struct {
    fr_tensor *y, *dx, *dw;
} conv_out;

static conv_out run_case(const conv_case *cc, fr_cpu_conv_backend b, const fr_tensor *x,
                         const fr_tensor *w, const fr_tensor *dy) {
    fr_conv_params p = {cc->stride, cc->pad};
    conv_out o = {fr_empty_like(dy, FR_TAG_TRANSIENT), fr_empty_like(x, FR_TAG_TRANSIENT),
                  fr_empty_like(w, FR_TAG_TRANSIENT)};
    /* NaN-filled first: a path that leaves an element unwritten fails */
    CHECK_OK(fr_fill_(o.y, NAN));
    CHECK_OK(fr_fill_(o.dx, NAN));
    CHECK_OK(fr_fill_(o.dw, NAN));
    CHECK_OK(fr_cpu_conv_set_backend(b));
    CHECK_OK(fr_conv2d_forward(o.y, x, w, NULL, p));
    CHECK_OK(fr_conv2d_backward(o.dx, o.dw, NULL, dy, x, w, p));
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_AUTO));
    return o;
}

static void release_out(conv_out *o) {
    fr_release(o->y);
    fr_release(o->dx);
    fr_release(o->dw);
}

static void test_dnnl_matches_im2col(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN");
    static const fr_cpu_conv_backend paths[] = {FR_CPU_CONV_DNNL_PLAIN, FR_CPU_CONV_DNNL_BLOCKED,
                                                FR_CPU_CONV_AUTO};
    static const char *const names[] = {"oneDNN plain", "oneDNN blocked", "auto"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const conv_case *cc = &cases[i];
        fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), 31 + (int)i);
        fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), 41 + (int)i);
        fr_conv_shape s;
        CHECK_OK(fr_conv2d_shape(x, w, (fr_conv_params){cc->stride, cc->pad}, &s));
        fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), 51 + (int)i);
        conv_out ref = run_case(cc, FR_CPU_CONV_IM2COL, x, w, dy);
        for (size_t b = 0; b < sizeof paths / sizeof *paths; b++) {
            conv_out got = run_case(cc, paths[b], x, w, dy), again = run_case(cc, paths[b], x, w, dy);
            double ey = scaled_diff(got.y, ref.y), edx = scaled_diff(got.dx, ref.dx),
                   edw = scaled_diff(got.dw, ref.dw);
            if (!(ey <= 1e-5 && edx <= 1e-5 && edw <= 1e-5))
                fprintf(stderr, "    case %zu (%s, %s / %s / %s): y %.2e dx %.2e dw %.2e\n", i,
                        names[b], fr_cpu_conv_impl(&s, 0), fr_cpu_conv_impl(&s, 1),
                        fr_cpu_conv_impl(&s, 2), ey, edx, edw);
            CHECK(ey <= 1e-5);
            CHECK(edx <= 1e-5);
            CHECK(edw <= 1e-5);
            /* the same call twice: the same bits (a plan is fixed per shape) */
            CHECK(same_bits(got.y, again.y));
            CHECK(same_bits(got.dx, again.dx));
            CHECK(same_bits(got.dw, again.dw));
            release_out(&got);
            release_out(&again);
        }
        release_out(&ref);
        fr_release(dy);
        fr_release(w);
        fr_release(x);
    }
}

/* The oneDNN path is really taken for the CIFAR shapes (so the test above
 * compares two different computations, not im2col with itself). */
static void test_dnnl_is_used(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN");
    fr_conv_shape s = {.n = 8, .c = 16, .h = 32, .w = 32, .k = 16, .r = 3, .s = 3,
                       .oh = 32, .ow = 32, .stride = 1, .pad = 1};
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_DNNL_BLOCKED));
    for (int d = 0; d < 3; d++)
        CHECK(strcmp(fr_cpu_conv_impl(&s, d), "im2col") != 0);
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_IM2COL));
    CHECK(strcmp(fr_cpu_conv_impl(&s, 0), "im2col") == 0);
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_AUTO));
}

static void test_backend_switch(void) {
    CHECK_ERR(fr_cpu_conv_set_backend(FR_CPU_CONV_BACKEND_COUNT), FR_ERR_ARG, "unknown");
    if (!fr_cpu_have_dnnl())
        CHECK_ERR(fr_cpu_conv_set_backend(FR_CPU_CONV_DNNL_BLOCKED), FR_ERR_ARG, "oneDNN");
    CHECK(fr_cpu_conv_get_backend() == FR_CPU_CONV_AUTO);
}

/* y = alpha op(a) op(b) + beta c for every transpose pair, overwriting
 * (beta 0, over NaN) and accumulating, against the reference GEMM. */
static void test_gemm_matches_reference(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN");
    static const int dims[][3] = {{128, 10, 64}, {10, 64, 128}, {37, 53, 71}, {1, 300, 7}};
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -2.0f}};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        for (int t = 0; t < 4; t++)
            for (size_t j = 0; j < sizeof ab / sizeof *ab; j++) {
                int m = dims[i][0], n = dims[i][1], k = dims[i][2];
                bool ta = t & 1, tb = t & 2;
                fr_tensor *a = fr_t_rand(FR_CPU, 2, ta ? FR_SHAPE(k, m) : FR_SHAPE(m, k), 61);
                fr_tensor *b = fr_t_rand(FR_CPU, 2, tb ? FR_SHAPE(n, k) : FR_SHAPE(k, n), 62);
                fr_tensor *c0 = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, n), 63);
                fr_tensor *want = fr_empty_like(c0, FR_TAG_TRANSIENT);
                fr_tensor *got = fr_empty_like(c0, FR_TAG_TRANSIENT);
                fr_tensor *again = fr_empty_like(c0, FR_TAG_TRANSIENT);
                fr_tensor *outs[] = {want, got, again};
                for (int o = 0; o < 3; o++) {
                    if (ab[j][1] == 0.0f)
                        CHECK_OK(fr_fill_(outs[o], NAN));
                    else
                        memcpy(fr_data(outs[o]), fr_data(c0), (size_t)m * n * sizeof(float));
                }
                CHECK_OK(fr_cpu_gemm_reference(fr_data_f32(want), fr_data_f32(a), fr_data_f32(b), m,
                                               n, k, ta, tb, ab[j][0], ab[j][1]));
                CHECK_OK(fr_cpu_gemm(fr_data_f32(got), fr_data_f32(a), fr_data_f32(b), m, n, k, ta,
                                     tb, ab[j][0], ab[j][1]));
                CHECK_OK(fr_cpu_gemm(fr_data_f32(again), fr_data_f32(a), fr_data_f32(b), m, n, k,
                                     ta, tb, ab[j][0], ab[j][1]));
                double e = scaled_diff(got, want);
                if (!(e <= 1e-5))
                    fprintf(stderr, "    gemm %dx%dx%d ta %d tb %d alpha %g beta %g: %.2e\n", m, n,
                            k, ta, tb, ab[j][0], ab[j][1], e);
                CHECK(e <= 1e-5);
                CHECK(same_bits(got, again));
                fr_tensor *all[] = {a, b, c0, want, got, again};
                for (int o = 0; o < 6; o++)
                    fr_release(all[o]);
            }
}

int main(void) {
    RUN(test_gemm_matches_reference);
    RUN(test_dnnl_matches_im2col);
    RUN(test_dnnl_is_used);
    RUN(test_backend_switch);
    return TEST_SUMMARY();
}
