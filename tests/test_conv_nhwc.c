/* test_conv_nhwc.c: channels-last (NHWC) activations on the CPU: the
 * convolution's nhwc entry (fr_cpu_conv2d_nhwc, cpu/conv_dnnl.c), the
 * NCHW <-> NHWC transposes and batch norm + residual + activation on
 * channels-last buffers (cpu/layout.c). Each is held to the NCHW path it
 * stands beside within 1e-5 of the reference's largest value (the sums run
 * in another order), must give the same bits when called again and at 1, 2
 * and 3 threads (the rule is fixed, the sums' groups too), and must leave
 * no workspace behind. On an AVX-512 machine with oneDNN the CIFAR ResNet
 * layers must take oneDNN's nhwc kernels directly, not the transposes. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/isa.h"
#include "cpu/layout.h"
#include "tensor/kernels.h"
#include "tensor/memory.h"

typedef struct {
    int n, c, h, k, r, stride, pad, groups;
    bool resnet; /* a CIFAR ResNet layer: direct on avx512 with oneDNN */
} conv_case;

static const conv_case cases[] = {
    {3, 16, 32, 16, 3, 1, 1, 1, true},  {4, 32, 16, 32, 3, 1, 1, 1, true},
    {5, 64, 8, 64, 3, 1, 1, 1, true},   {3, 16, 32, 32, 3, 2, 1, 1, true},
    {2, 16, 32, 32, 1, 2, 0, 1, true},  {3, 3, 28, 16, 3, 1, 1, 1, true},
    {2, 5, 9, 7, 3, 2, 1, 1, false},    /* odd sizes */
    {2, 96, 8, 32, 1, 1, 0, 1, false},  /* a wide 1x1: the NCHW rule's im2col, by transposes */
    {2, 8, 10, 8, 3, 1, 1, 2, false},   /* grouped: by transposes */
};

static float *rand_buf(size_t n, uint32_t seed) {
    float *p = malloc(n * sizeof(float));
    fr_t_fill_rand(p, n, seed);
    return p;
}

static float *nhwc_of(const float *nchw, int n, int c, int hw) {
    float *p = malloc((size_t)n * c * hw * sizeof(float));
    fr_cpu_nchw_to_nhwc(p, nchw, n, c, hw);
    return p;
}

/* got within 1e-5 of want's largest magnitude, element by element */
static bool close_all(const float *got, const float *want, size_t n, const char *what) {
    double big = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++)
        big = fabs(want[i]) > big ? fabs(want[i]) : big;
    for (size_t i = 0; i < n; i++)
        worst = fabs((double)got[i] - want[i]) > worst ? fabs((double)got[i] - want[i]) : worst;
    if (!(worst <= 1e-5 * (big > 0 ? big : 1.0))) {
        fprintf(stderr, "    %s: largest difference %.3g against largest value %.3g\n", what,
                worst, big);
        return false;
    }
    return true;
}

static void shape_of(const conv_case *cc, fr_conv_shape *s) {
    int oh = (cc->h + 2 * cc->pad - cc->r) / cc->stride + 1;
    *s = (fr_conv_shape){.n = cc->n, .c = cc->c, .h = cc->h, .w = cc->h, .k = cc->k, .r = cc->r,
                         .s = cc->r, .oh = oh, .ow = oh, .stride = cc->stride, .pad = cc->pad,
                         .groups = cc->groups, .dilation = 1};
}

/* The three passes in NHWC, transposed back to NCHW (y, dx) and dw. */
typedef struct {
    float *y, *dx, *dw;
} passes;

static passes run_nhwc(const fr_conv_shape *s, const float *x, const float *w, const float *dy) {
    size_t xn = (size_t)s->n * s->c * s->h * s->w, yn = (size_t)s->n * s->k * s->oh * s->ow;
    size_t wn = (size_t)s->k * (s->c / s->groups) * s->r * s->s;
    float *xl = nhwc_of(x, s->n, s->c, s->h * s->w), *dyl = nhwc_of(dy, s->n, s->k, s->oh * s->ow);
    float *yl = malloc(yn * sizeof(float)), *dxl = malloc(xn * sizeof(float));
    passes p = {malloc(yn * sizeof(float)), malloc(xn * sizeof(float)), malloc(wn * sizeof(float))};
    CHECK_OK(fr_cpu_conv2d_nhwc(0, yl, xl, w, s));
    CHECK_OK(fr_cpu_conv2d_nhwc(1, dxl, dyl, w, s));
    CHECK_OK(fr_cpu_conv2d_nhwc(2, p.dw, dyl, xl, s));
    fr_cpu_nhwc_to_nchw(p.y, yl, s->n, s->k, s->oh * s->ow);
    fr_cpu_nhwc_to_nchw(p.dx, dxl, s->n, s->c, s->h * s->w);
    free(xl), free(dyl), free(yl), free(dxl);
    return p;
}

static void passes_free(passes *p) { free(p->y), free(p->dx), free(p->dw); }

static bool passes_equal(const passes *a, const passes *b, const fr_conv_shape *s) {
    size_t xn = (size_t)s->n * s->c * s->h * s->w, yn = (size_t)s->n * s->k * s->oh * s->ow;
    size_t wn = (size_t)s->k * (s->c / s->groups) * s->r * s->s;
    return !memcmp(a->y, b->y, yn * sizeof(float)) && !memcmp(a->dx, b->dx, xn * sizeof(float)) &&
           !memcmp(a->dw, b->dw, wn * sizeof(float));
}

static void test_transposes_round_trip(void) {
    float *a = rand_buf(3 * 17 * 23, 5), *b = malloc(3 * 17 * 23 * sizeof(float));
    float *c = malloc(3 * 17 * 23 * sizeof(float));
    fr_cpu_nchw_to_nhwc(b, a, 3, 17, 23);
    CHECK(b[(1 * 23 + 4) * 17 + 9] == a[(1 * 17 + 9) * 23 + 4]); /* (1, 9, pixel 4) */
    fr_cpu_nhwc_to_nchw(c, b, 3, 17, 23);
    CHECK(!memcmp(a, c, 3 * 17 * 23 * sizeof(float)));
    free(a), free(b), free(c);
}

/* Each case: NHWC against the NCHW path, a second call's bits, 1-3
 * threads' bits, the workspace returned, and (avx512 + oneDNN) the direct
 * kernels on ResNet's layers. */
static void test_conv_matches_nchw(void) {
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    bool expect_direct = fr_cpu_have_dnnl() && isa == FR_ISA_AVX512;
    int team = omp_get_max_threads();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const conv_case *cc = &cases[i];
        fr_conv_shape s;
        shape_of(cc, &s);
        size_t xn = (size_t)s.n * s.c * s.h * s.w, yn = (size_t)s.n * s.k * s.oh * s.ow;
        size_t wn = (size_t)s.k * (s.c / s.groups) * s.r * s.s;
        float *x = rand_buf(xn, 11 + (uint32_t)i), *w = rand_buf(wn, 31 + (uint32_t)i);
        float *dy = rand_buf(yn, 51 + (uint32_t)i);
        passes ref = {malloc(yn * sizeof(float)), malloc(xn * sizeof(float)), malloc(wn * sizeof(float))};
        CHECK_OK(fr_cpu_conv2d_forward(ref.y, x, w, &s));
        CHECK_OK(fr_cpu_conv2d_backward_data(ref.dx, dy, w, &s));
        CHECK_OK(fr_cpu_conv2d_backward_weight(ref.dw, dy, x, &s));
        size_t ws_before = fr_mem_current(FR_CPU, FR_TAG_WORKSPACE);
        passes got = run_nhwc(&s, x, w, dy);
        char what[96];
        snprintf(what, sizeof what, "%d->%d %dx%d /%d @%d g%d", cc->c, cc->k, cc->r, cc->r,
                 cc->stride, cc->h, cc->groups);
        CHECK(close_all(got.y, ref.y, yn, what));
        CHECK(close_all(got.dx, ref.dx, xn, what));
        CHECK(close_all(got.dw, ref.dw, wn, what));
        CHECK(fr_mem_current(FR_CPU, FR_TAG_WORKSPACE) == ws_before);
        passes again = run_nhwc(&s, x, w, dy);
        CHECK(passes_equal(&got, &again, &s));
        passes_free(&again);
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            passes on_t = run_nhwc(&s, x, w, dy);
            if (!passes_equal(&got, &on_t, &s)) {
                fprintf(stderr, "    %s: %d threads differ from %d\n", what, t, team);
                CHECK(false);
            }
            passes_free(&on_t);
        }
        omp_set_num_threads(team);
        for (int d = 0; d < 3; d++) {
            const char *impl = fr_cpu_conv_nhwc_impl(&s, d);
            bool direct = strcmp(impl, "transposes") != 0;
            if (cc->resnet && expect_direct && !direct) {
                fprintf(stderr, "    %s pass %d: ran %s, expected oneDNN's nhwc kernel\n", what,
                        d, impl);
                CHECK(false);
            }
            /* grouped layers, and every layer off avx512, take the transposes */
            CHECK(!direct || (expect_direct && cc->groups == 1));
        }
        passes_free(&ref);
        passes_free(&got);
        free(x), free(w), free(dy);
    }
}

static void test_conv_bad_direction(void) {
    fr_conv_shape s;
    shape_of(&cases[0], &s);
    float dummy[1] = {0};
    CHECK_ERR(fr_cpu_conv2d_nhwc(3, dummy, dummy, dummy, &s), FR_ERR_ARG, "direction 3");
}

/* Batch norm + residual + activation: NHWC kernels against cpu/batchnorm.c
 * on the same values (transposed), and their bits at 1-3 threads. */
static void run_bn(bool nhwc, int n, int c, int hw, const float *x, const float *r, const float *dy,
                   const float *gamma, const float *beta, fr_act act, float *mean, float *var,
                   float *y, float *dx, float *dz, float *dgamma, float *dbeta) {
    float invstd[64];
    size_t px = (size_t)n * hw;
    if (nhwc)
        CHECK_OK(fr_cpu_batch_norm_stats_nhwc(mean, var, x, px, c));
    else
        CHECK_OK(fr_cpu_batch_norm_stats(mean, var, x, n, c, hw));
    CHECK_OK(fr_cpu_batch_norm_invstd(invstd, var, 1e-5f, c));
    if (nhwc)
        CHECK_OK(fr_cpu_bn_act_forward_nhwc(y, x, r, mean, invstd, gamma, beta, act, 0.1f, px, c));
    else
        CHECK_OK(fr_cpu_bn_act_forward(y, x, r, mean, invstd, gamma, beta, act, 0.1f, n, c, hw));
    /* the output is kept where the activation's gradient reads it */
    const float *ao = fr_act_needs_of(act) == FR_ACT_NEEDS_OUTPUT ? y : NULL;
    if (nhwc)
        CHECK_OK(fr_cpu_bn_act_backward_nhwc(dx, dz, dgamma, dbeta, dy, ao, x, mean, invstd, gamma,
                                             beta, act, 0.1f, px, c));
    else
        CHECK_OK(fr_cpu_bn_act_backward(dx, dz, dgamma, dbeta, dy, ao, x, mean, invstd, gamma,
                                        beta, act, 0.1f, n, c, hw));
}

static void test_bn_matches_nchw(void) {
    const struct {
        int n, c, hw;
        fr_act act;
        bool residual;
    } bcs[] = {{4, 16, 64, FR_ACT_RELU, false}, {3, 32, 49, FR_ACT_RELU, true},
               {2, 64, 16, FR_ACT_IDENTITY, false}, {5, 7, 9, FR_ACT_SILU, false},
               {2, 24, 36, FR_ACT_LEAKY_RELU, true}, {1, 3, 5, FR_ACT_HARDSWISH, false}};
    int team = omp_get_max_threads();
    for (size_t i = 0; i < sizeof bcs / sizeof bcs[0]; i++) {
        int n = bcs[i].n, c = bcs[i].c, hw = bcs[i].hw;
        size_t len = (size_t)n * c * hw;
        float *x = rand_buf(len, 71 + (uint32_t)i), *dy = rand_buf(len, 81 + (uint32_t)i);
        float *r = bcs[i].residual ? rand_buf(len, 91 + (uint32_t)i) : NULL;
        for (size_t j = 0; j < len; j++)
            x[j] = 3.0f + 2.0f * x[j]; /* a mean far from 0, as the shift is for */
        float gamma[64], beta[64];
        fr_t_fill_rand(gamma, (size_t)c, 7);
        fr_t_fill_rand(beta, (size_t)c, 8);
        float m0[64], v0[64], g0[64], b0[64], m1[64], v1[64], g1[64], b1[64];
        float *y0 = malloc(len * 4), *dx0 = malloc(len * 4), *dz0 = malloc(len * 4);
        float *y1 = malloc(len * 4), *dx1 = malloc(len * 4), *dz1 = malloc(len * 4);
        run_bn(false, n, c, hw, x, r, dy, gamma, beta, bcs[i].act, m0, v0, y0, dx0, dz0, g0, b0);
        float *xl = nhwc_of(x, n, c, hw), *dyl = nhwc_of(dy, n, c, hw);
        float *rl = r ? nhwc_of(r, n, c, hw) : NULL;
        size_t ws_before = fr_mem_current(FR_CPU, FR_TAG_WORKSPACE);
        run_bn(true, n, c, hw, xl, rl, dyl, gamma, beta, bcs[i].act, m1, v1, y1, dx1, dz1, g1, b1);
        CHECK(fr_mem_current(FR_CPU, FR_TAG_WORKSPACE) == ws_before);
        char what[64];
        snprintf(what, sizeof what, "bn_act %d x %d x %d act %d", n, c, hw, (int)bcs[i].act);
        CHECK(close_all(m1, m0, (size_t)c, what) && close_all(v1, v0, (size_t)c, what));
        CHECK(close_all(g1, g0, (size_t)c, what) && close_all(b1, b0, (size_t)c, what));
        float *back = malloc(len * 4);
        fr_cpu_nhwc_to_nchw(back, y1, n, c, hw);
        CHECK(close_all(back, y0, len, what));
        fr_cpu_nhwc_to_nchw(back, dx1, n, c, hw);
        CHECK(close_all(back, dx0, len, what));
        fr_cpu_nhwc_to_nchw(back, dz1, n, c, hw);
        CHECK(close_all(back, dz0, len, what));
        /* the same bits at any team size */
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            float m2[64], v2[64], g2[64], b2[64];
            float *y2 = malloc(len * 4), *dx2 = malloc(len * 4), *dz2 = malloc(len * 4);
            run_bn(true, n, c, hw, xl, rl, dyl, gamma, beta, bcs[i].act, m2, v2, y2, dx2, dz2, g2,
                   b2);
            CHECK(!memcmp(m2, m1, (size_t)c * 4) && !memcmp(v2, v1, (size_t)c * 4));
            CHECK(!memcmp(g2, g1, (size_t)c * 4) && !memcmp(b2, b1, (size_t)c * 4));
            CHECK(!memcmp(y2, y1, len * 4) && !memcmp(dx2, dx1, len * 4) &&
                  !memcmp(dz2, dz1, len * 4));
            free(y2), free(dx2), free(dz2);
        }
        omp_set_num_threads(team);
        /* dx over dy (the op reuses a dy nobody else holds), and no dx at
         * all (only the parameters' gradients): the same bits */
        float invstd[64], ga[64], be[64];
        CHECK_OK(fr_cpu_batch_norm_invstd(invstd, v1, 1e-5f, c));
        const float *ao = fr_act_needs_of(bcs[i].act) == FR_ACT_NEEDS_OUTPUT ? y1 : NULL;
        memcpy(back, dyl, len * 4);
        CHECK_OK(fr_cpu_bn_act_backward_nhwc(back, NULL, ga, be, back, ao, xl, m1, invstd, gamma,
                                             beta, bcs[i].act, 0.1f, (size_t)n * hw, c));
        CHECK(!memcmp(back, dx1, len * 4) && !memcmp(ga, g1, (size_t)c * 4) &&
              !memcmp(be, b1, (size_t)c * 4));
        CHECK_OK(fr_cpu_bn_act_backward_nhwc(NULL, NULL, ga, be, dyl, ao, xl, m1, invstd, gamma,
                                             beta, bcs[i].act, 0.1f, (size_t)n * hw, c));
        CHECK(!memcmp(ga, g1, (size_t)c * 4) && !memcmp(be, b1, (size_t)c * 4));
        CHECK(fr_mem_current(FR_CPU, FR_TAG_WORKSPACE) == ws_before);
        free(back), free(x), free(dy), free(r), free(xl), free(dyl), free(rl);
        free(y0), free(dx0), free(dz0), free(y1), free(dx1), free(dz1);
    }
}

int main(void) {
    RUN(test_transposes_round_trip);
    RUN(test_conv_matches_nchw);
    RUN(test_conv_bad_direction);
    RUN(test_bn_matches_nchw);
    return TEST_SUMMARY();
}
