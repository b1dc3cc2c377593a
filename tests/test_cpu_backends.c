/* test_cpu_backends.c: the CPU kernels' oneDNN paths against the reference
 * paths. Convolution on oneDNN (cpu/conv_dnnl.c, in both of its layouts)
 * must match the im2col reference (cpu/conv_im2col.c) within 1e-5 of the
 * largest reference value, and give the same bits when a call is repeated;
 * the path the default backend picks for a shape is a fixed rule; and with
 * or without oneDNN, a sample's result from GEMM or convolution does not
 * depend on the batch it is computed in. The oneDNN checks skip when the
 * build has no oneDNN. Then the choice by instruction set (below). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/isa.h"
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

typedef struct {
    fr_tensor *y, *dx, *dw;
} conv_out;

static conv_out run_case(const conv_case *cc, fr_cpu_conv_backend b, const fr_tensor *x,
                         const fr_tensor *w, const fr_tensor *dy) {
    fr_conv_params p = {.stride = cc->stride, .pad = cc->pad};
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

/* A case's random x, w and dy (seeds given) and its shape. */
typedef struct {
    fr_tensor *x, *w, *dy;
    fr_conv_shape s;
} case_data;

static case_data make_case(const conv_case *cc, int seed_x, int seed_w, int seed_dy) {
    case_data d = {.x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), seed_x),
                   .w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), seed_w)};
    CHECK_OK(fr_conv2d_shape(d.x, d.w, (fr_conv_params){.stride = cc->stride, .pad = cc->pad}, &d.s));
    d.dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(d.s.n, d.s.k, d.s.oh, d.s.ow), seed_dy);
    return d;
}

static void free_case(case_data *d) {
    fr_release(d->dy);
    fr_release(d->w);
    fr_release(d->x);
}

static void test_dnnl_matches_im2col(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN");
    static const fr_cpu_conv_backend paths[] = {FR_CPU_CONV_DNNL_PLAIN, FR_CPU_CONV_DNNL_BLOCKED,
                                                FR_CPU_CONV_AUTO};
    static const char *const names[] = {"oneDNN plain", "oneDNN blocked", "auto"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const conv_case *cc = &cases[i];
        case_data d = make_case(cc, 31 + (int)i, 41 + (int)i, 51 + (int)i);
        fr_tensor *x = d.x, *w = d.w, *dy = d.dy;
        fr_conv_shape s = d.s;
        conv_out ref = run_case(cc, FR_CPU_CONV_IM2COL, x, w, dy);
        for (size_t b = 0; b < sizeof paths / sizeof *paths; b++) {
            conv_out got = run_case(cc, paths[b], x, w, dy), again = run_case(cc, paths[b], x, w, dy);
            double ey = fr_t_scaled_diff(got.y, ref.y), edx = fr_t_scaled_diff(got.dx, ref.dx),
                   edw = fr_t_scaled_diff(got.dw, ref.dw);
            if (!(ey <= 1e-5 && edx <= 1e-5 && edw <= 1e-5))
                fprintf(stderr, "    case %zu (%s, %s / %s / %s): y %.2e dx %.2e dw %.2e\n", i,
                        names[b], fr_cpu_conv_impl(&s, 0), fr_cpu_conv_impl(&s, 1),
                        fr_cpu_conv_impl(&s, 2), ey, edx, edw);
            CHECK(ey <= 1e-5);
            CHECK(edx <= 1e-5);
            CHECK(edw <= 1e-5);
            /* the same call twice: the same bits (a plan is fixed per shape) */
            CHECK(fr_t_same_bits(got.y, again.y));
            CHECK(fr_t_same_bits(got.dx, again.dx));
            CHECK(fr_t_same_bits(got.dw, again.dw));
            release_out(&got);
            release_out(&again);
        }
        release_out(&ref);
        free_case(&d);
    }
}

/* The weight gradient in image groups (cpu/conv_dnnl.c) where a group sums
 * several oneDNN calls, whose partials stay in oneDNN's blocked layout until
 * the groups are summed: channel counts that layout pads (3, 12), batches
 * that do not split evenly, against im2col. */
static void test_weight_groups_sum_calls(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN");
    static const conv_case group_cases[] = {
        {40, 3, 32, 16, 3, 1, 1}, {37, 16, 32, 12, 3, 1, 1}, {70, 12, 16, 16, 3, 1, 1},
        {35, 16, 32, 32, 1, 2, 0},
    };
    for (size_t i = 0; i < sizeof group_cases / sizeof *group_cases; i++) {
        const conv_case *cc = &group_cases[i];
        case_data d = make_case(cc, 61 + (int)i, 62 + (int)i, 63 + (int)i);
        conv_out ref = run_case(cc, FR_CPU_CONV_IM2COL, d.x, d.w, d.dy);
        conv_out got = run_case(cc, FR_CPU_CONV_DNNL_GROUPS, d.x, d.w, d.dy);
        conv_out again = run_case(cc, FR_CPU_CONV_DNNL_GROUPS, d.x, d.w, d.dy);
        double e = fr_t_scaled_diff(got.dw, ref.dw);
        if (!(e <= 1e-5))
            fprintf(stderr, "    groups case %zu: dw %.2e from im2col\n", i, e);
        CHECK(e <= 1e-5);
        CHECK(fr_t_same_bits(got.dw, again.dw));
        release_out(&ref);
        release_out(&got);
        release_out(&again);
        free_case(&d);
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

/* A sample's result must not depend on the batch it is computed in: the
 * rows of linear's forward (x w^T) and input gradient (dy w), and each
 * image of a convolution's forward and input gradient, come out bit for bit
 * the same in a batch of `n` as in its parts. Data parallelism relies on it
 * (2 ranks x 16 images against one process x 32, tests/test_dist.c): with
 * oneDNN's matmul a row at m = 32 rounded differently from the same row at
 * m = 16 (k = 2, the input gradient of a 2-class linear layer), and a step
 * later that last bit put a ReLU input of layer3.0 on the other side of
 * zero (-1.6e-7 against +8e-7), which moved the trained biases by 1.9%.
 * OpenBLAS's sgemm rounds rows differently by row count too (128x10x64). */
static void check_rows(const char *what, int m, int n, int k, bool tb, int part) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, k), 71);
    fr_tensor *b = fr_t_rand(FR_CPU, 2, tb ? FR_SHAPE(n, k) : FR_SHAPE(k, n), 72);
    fr_tensor *whole = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, n), 73);
    fr_tensor *parts = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, n), 74);
    float *pa = fr_data_f32(a), *pb = fr_data_f32(b), *pw = fr_data_f32(whole), *pp = fr_data_f32(parts);
    CHECK_OK(fr_cpu_gemm(pw, pa, pb, m, n, k, false, tb, 1.0f, 0.0f));
    for (int lo = 0; lo < m; lo += part) {
        int rows = m - lo < part ? m - lo : part;
        CHECK_OK(fr_cpu_gemm(pp + (size_t)lo * n, pa + (size_t)lo * k, pb, rows, n, k, false, tb,
                             1.0f, 0.0f));
    }
    if (!fr_t_same_bits(whole, parts))
        fprintf(stderr, "    %s %dx%dx%d: rows differ between m = %d and parts of %d (%.2e)\n",
                what, m, n, k, m, part, fr_t_scaled_diff(parts, whole));
    CHECK(fr_t_same_bits(whole, parts));
    fr_tensor *all[] = {a, b, whole, parts};
    for (int i = 0; i < 4; i++)
        fr_release(all[i]);
}

static void check_images(const conv_case *cc, int part) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), 81);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), 82);
    fr_conv_shape s;
    CHECK_OK(fr_conv2d_shape(x, w, (fr_conv_params){.stride = cc->stride, .pad = cc->pad}, &s));
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), 83);
    fr_tensor *y[2] = {fr_empty_like(dy, FR_TAG_TRANSIENT), fr_empty_like(dy, FR_TAG_TRANSIENT)};
    fr_tensor *dx[2] = {fr_empty_like(x, FR_TAG_TRANSIENT), fr_empty_like(x, FR_TAG_TRANSIENT)};
    CHECK_OK(fr_cpu_conv2d_forward(fr_data_f32(y[0]), fr_data_f32(x), fr_data_f32(w), &s));
    CHECK_OK(fr_cpu_conv2d_backward_data(fr_data_f32(dx[0]), fr_data_f32(dy), fr_data_f32(w), &s));
    size_t x_img = (size_t)s.c * s.h * s.w, y_img = (size_t)s.k * s.oh * s.ow;
    for (int lo = 0; lo < cc->n; lo += part) {
        fr_conv_shape sp = s;
        sp.n = cc->n - lo < part ? cc->n - lo : part;
        CHECK_OK(fr_cpu_conv2d_forward(fr_data_f32(y[1]) + lo * y_img, fr_data_f32(x) + lo * x_img,
                                   fr_data_f32(w), &sp));
        CHECK_OK(fr_cpu_conv2d_backward_data(fr_data_f32(dx[1]) + lo * x_img,
                                        fr_data_f32(dy) + lo * y_img, fr_data_f32(w), &sp));
    }
    bool same_y = fr_t_same_bits(y[0], y[1]), same_dx = fr_t_same_bits(dx[0], dx[1]);
    if (!same_y || !same_dx)
        fprintf(stderr, "    conv %d->%d %dx%d /%d @%d (%s / %s): images differ between n = %d and parts of %d\n",
                cc->c, cc->k, cc->r, cc->r, cc->stride, cc->h, fr_cpu_conv_impl(&s, 0),
                fr_cpu_conv_impl(&s, 1), cc->n, part);
    CHECK(same_y);
    CHECK(same_dx);
    fr_tensor *all[] = {x, w, dy, y[0], y[1], dx[0], dx[1]};
    for (int i = 0; i < 7; i++)
        fr_release(all[i]);
}

static void samples_do_not_depend_on_batch(void) {
    /* linear forward (b, out, in) and input gradient (b, in, out) */
    static const int lin[][3] = {{32, 2, 64}, {128, 10, 64}, {64, 10, 342}, {256, 100, 64}};
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++)
        for (int part = 16; part >= 5; part -= 11) {
            check_rows("linear forward", lin[i][0], lin[i][1], lin[i][2], true, part);
            check_rows("linear input gradient", lin[i][0], lin[i][2], lin[i][1], false, part);
        }
    /* the ResNet-8 layers of tests/test_dist.c at batch 32, and the cases above */
    static const conv_case resnet8[] = {{32, 1, 8, 16, 3, 1, 1}, {32, 16, 8, 16, 3, 1, 1},
                                        {32, 16, 8, 32, 3, 2, 1}, {32, 32, 4, 64, 3, 2, 1},
                                        {32, 64, 2, 64, 3, 1, 1}, {32, 16, 8, 32, 1, 2, 0}};
    for (size_t i = 0; i < sizeof resnet8 / sizeof *resnet8; i++) {
        check_images(&resnet8[i], 16);
        check_images(&resnet8[i], 5);
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_images(&cases[i], cases[i].n / 2 > 0 ? cases[i].n / 2 : 1);
}

/* on one thread and on more threads than some parts have images */
static void test_samples_do_not_depend_on_batch(void) {
    int team = omp_get_max_threads();
    omp_set_num_threads(1);
    samples_do_not_depend_on_batch();
    omp_set_num_threads(3);
    samples_do_not_depend_on_batch();
    omp_set_num_threads(team);
}

/* Nor on the team size: cpu/threads.c sizes the team by the load average
 * when the process starts, so two runs of one training on a shared machine
 * get different thread counts. The im2col weight gradient summed one
 * partial per thread, and 5 steps of tests/test_dist.c's ResNet-8 ended
 * 1.1% apart (layer3.0.bn1.bias) between 1 and 2 threads. */
static void test_results_do_not_depend_on_threads(void) {
    int team = omp_get_max_threads();
    static const conv_case convs[] = {{32, 16, 8, 16, 3, 1, 1}, {8, 16, 32, 32, 3, 2, 1},
                                      {3, 64, 8, 64, 3, 1, 1},  {4, 128, 16, 12, 3, 1, 1},
                                      {5, 24, 16, 48, 1, 1, 0}, {2, 9, 11, 6, 5, 2, 2},
                                      {20, 64, 8, 64, 3, 1, 1}, {6, 48, 8, 12, 3, 1, 1}};
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        const conv_case *cc = &convs[i];
        fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), 91);
        fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), 92);
        fr_conv_shape s;
        CHECK_OK(fr_conv2d_shape(x, w, (fr_conv_params){.stride = cc->stride, .pad = cc->pad}, &s));
        fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), 93);
        conv_out one = {NULL, NULL, NULL};
        for (int threads = 1; threads <= 3; threads++) {
            omp_set_num_threads(threads);
            conv_out o = run_case(cc, FR_CPU_CONV_AUTO, x, w, dy);
            if (threads == 1) {
                one = o;
                continue;
            }
            bool same = fr_t_same_bits(o.y, one.y) && fr_t_same_bits(o.dx, one.dx) &&
                        fr_t_same_bits(o.dw, one.dw);
            if (!same)
                fprintf(stderr, "    conv %d->%d %dx%d /%d @%d, batch %d: %d threads differ from 1 (y %d dx %d dw %d)\n",
                        cc->c, cc->k, cc->r, cc->r, cc->stride, cc->h, cc->n, threads,
                        !fr_t_same_bits(o.y, one.y), !fr_t_same_bits(o.dx, one.dx), !fr_t_same_bits(o.dw, one.dw));
            CHECK(same);
            release_out(&o);
        }
        release_out(&one);
        fr_release(dy);
        fr_release(w);
        fr_release(x);
    }
    static const int prods[][3] = {{128, 10, 64}, {10, 64, 128}, {300, 200, 100}};
    for (size_t i = 0; i < sizeof prods / sizeof *prods; i++) {
        int m = prods[i][0], n = prods[i][1], k = prods[i][2];
        fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(m, k), 94), *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(k, n), 95);
        fr_tensor *c[3];
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(t + 1);
            c[t] = fr_empty(FR_CPU, FR_F32, 2, FR_SHAPE(m, n), FR_TAG_TRANSIENT);
            CHECK_OK(fr_cpu_gemm(fr_data_f32(c[t]), fr_data_f32(a), fr_data_f32(b), m, n, k, false, false,
                                 1.0f, 0.0f));
        }
        CHECK(fr_t_same_bits(c[0], c[1]) && fr_t_same_bits(c[0], c[2]));
        for (int t = 0; t < 3; t++)
            fr_release(c[t]);
        fr_release(a);
        fr_release(b);
    }
    omp_set_num_threads(team);
}

/* The shifted-plane kernels (cpu/conv_shift.c), which the default backend
 * runs for 3x3 stride-1 pad-1 layers on AVX2+FMA CPUs (the weight gradient
 * always, forward and backward (data) where oneDNN does not run), against
 * the im2col reference, and the weight gradient against a double sum: channel counts off
 * its 4-channel block, planes from 1x1 to 33x20 (rows shorter and longer
 * than its 8 lanes, images per chunk from 1 to 16), batches off the
 * 16-group split. */
static void test_shift_kernels(void) {
    fr_conv_shape probe = {.n = 1, .c = 1, .h = 8, .w = 8, .k = 1, .r = 3, .s = 3,
                           .oh = 8, .ow = 8, .stride = 1, .pad = 1};
    if (!fr_cpu_conv_shift_applies(&probe))
        SKIP("this CPU has no AVX2+FMA (the shifted-plane kernel does not apply)");
    /* what it does not take */
    fr_conv_shape other = probe;
    other.stride = 2;
    other.oh = other.ow = 4;
    CHECK(!fr_cpu_conv_shift_applies(&other));
    other = probe;
    other.r = other.s = 1;
    other.pad = 0;
    CHECK(!fr_cpu_conv_shift_applies(&other));
    other = probe;
    other.pad = 0;
    other.oh = other.ow = 6;
    CHECK(!fr_cpu_conv_shift_applies(&other));
    CHECK_ERR(fr_cpu_conv2d_backward_weight_shift(NULL, NULL, NULL, &other), FR_ERR_ARG, "3x3");
    static const int shapes[][5] = {/* n, c, k, h, w */
                                    {1, 1, 1, 1, 1},   {2, 1, 16, 28, 28}, {3, 5, 7, 13, 13},
                                    {17, 16, 16, 8, 8}, {40, 3, 6, 4, 9},  {2, 33, 9, 33, 20},
                                    {5, 48, 12, 7, 7},  {64, 64, 64, 8, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int n = shapes[i][0], c = shapes[i][1], k = shapes[i][2], h = shapes[i][3], w = shapes[i][4];
        fr_conv_shape s = {.n = n, .c = c, .h = h, .w = w, .k = k, .r = 3, .s = 3,
                           .oh = h, .ow = w, .stride = 1, .pad = 1};
        CHECK(fr_cpu_conv_shift_applies(&s));
        fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, h, w), 61 + (int)i);
        fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, k, h, w), 71 + (int)i);
        fr_tensor *got = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(k, c, 3, 3), FR_TAG_TRANSIENT);
        fr_tensor *ref = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(k, c, 3, 3), FR_TAG_TRANSIENT);
        CHECK_OK(fr_fill_(got, NAN)); /* every element written */
        CHECK_OK(fr_cpu_conv2d_backward_weight_shift(fr_data_f32(got), fr_data_f32(dy),
                                                     fr_data_f32(x), &s));
        CHECK_OK(fr_cpu_conv2d_backward_weight_im2col(fr_data_f32(ref), fr_data_f32(dy),
                                                      fr_data_f32(x), &s));
        double e = fr_t_scaled_diff(got, ref);
        if (!(e <= 1e-5))
            fprintf(stderr, "    shift %dx%d->%d @%dx%d: %.2e from im2col\n", n, c, k, h, w, e);
        CHECK(e <= 1e-5);
        /* and a double-precision sum, element by element */
        const float *px = fr_data_f32(x), *pd = fr_data_f32(dy), *pg = fr_data_f32(got);
        double worst = 0, scale = 0;
        for (int kk = 0; kk < k; kk++)
            for (int cc = 0; cc < c; cc++)
                for (int r = 0; r < 3; r++)
                    for (int t = 0; t < 3; t++) {
                        double sum = 0;
                        for (int b = 0; b < n; b++)
                            for (int oh = 0; oh < h; oh++)
                                for (int ow = 0; ow < w; ow++) {
                                    int ih = oh + r - 1, iw = ow + t - 1;
                                    if (ih < 0 || ih >= h || iw < 0 || iw >= w)
                                        continue;
                                    sum += (double)pd[(((size_t)b * k + kk) * h + oh) * w + ow] *
                                           px[(((size_t)b * c + cc) * h + ih) * w + iw];
                                }
                        double d = fabs(sum - pg[((kk * c + cc) * 3 + r) * 3 + t]);
                        worst = d > worst || d != d ? d : worst;
                        scale = fabs(sum) > scale ? fabs(sum) : scale;
                    }
        CHECK(worst <= 1e-5 * (scale > 0 ? scale : 1));
        /* forward and backward (data), the direct kernels, against im2col
         * (NaN-filled first: every element written) */
        fr_tensor *wt = fr_t_rand(FR_CPU, 4, FR_SHAPE(k, c, 3, 3), 81 + (int)i);
        fr_tensor *y = fr_empty_like(dy, FR_TAG_TRANSIENT), *y_ref = fr_empty_like(dy, FR_TAG_TRANSIENT);
        fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT), *dx_ref = fr_empty_like(x, FR_TAG_TRANSIENT);
        CHECK_OK(fr_fill_(y, NAN));
        CHECK_OK(fr_fill_(dx, NAN));
        CHECK_OK(fr_cpu_conv2d_forward_shift(fr_data_f32(y), fr_data_f32(x), fr_data_f32(wt), &s));
        CHECK_OK(fr_cpu_conv2d_forward_im2col(fr_data_f32(y_ref), fr_data_f32(x), fr_data_f32(wt), &s));
        CHECK_OK(fr_cpu_conv2d_backward_data_shift(fr_data_f32(dx), fr_data_f32(dy), fr_data_f32(wt), &s));
        CHECK_OK(fr_cpu_conv2d_backward_data_im2col(fr_data_f32(dx_ref), fr_data_f32(dy),
                                                    fr_data_f32(wt), &s));
        double ey = fr_t_scaled_diff(y, y_ref), edx = fr_t_scaled_diff(dx, dx_ref);
        if (!(ey <= 1e-5 && edx <= 1e-5))
            fprintf(stderr, "    shift %dx%d->%d @%dx%d: y %.2e dx %.2e from im2col\n", n, c, k, h, w,
                    ey, edx);
        CHECK(ey <= 1e-5);
        CHECK(edx <= 1e-5);
        fr_release(wt);
        fr_release(y);
        fr_release(y_ref);
        fr_release(dx);
        fr_release(dx_ref);
        fr_release(got);
        fr_release(ref);
        fr_release(dy);
        fr_release(x);
    }
}

/* ---- the choice by instruction set (cpu/isa.c, cpu/conv_rules.c) ----
 * The rule table is a function of one image's shape and the ISA class
 * only; every class this CPU can run, forced with FR_CPU_ISA, gives the
 * im2col reference's results within 1e-5 of the largest reference value in
 * every pass and takes the kernels of that class (oneDNN's included); a
 * class the CPU lacks, or a name that is no class, is refused with an error
 * naming FR_CPU_ISA. FR_CPU_ISA is read once per process and caps oneDNN
 * before its first primitive, so each class runs in a child process: this
 * program re-runs itself as `test_cpu_backends --child MODE CLASS` with the
 * variable set. */

static const char *self_path;

/* ResNet's 3x3 layers, the strided and 1x1 transitions, DenseNet's wide
 * bottleneck and growth layers, a 5x5 and odd sizes */
static const conv_case isa_cases[] = {
    {8, 3, 32, 16, 3, 1, 1},  {8, 16, 32, 16, 3, 1, 1}, {8, 16, 32, 32, 3, 2, 1},
    {8, 32, 16, 32, 1, 2, 0}, {6, 64, 8, 64, 3, 1, 1},  {4, 96, 8, 32, 1, 1, 0},
    {4, 128, 8, 12, 3, 1, 1}, {3, 5, 13, 7, 3, 2, 0},   {2, 9, 11, 6, 5, 2, 2},
    {17, 16, 8, 16, 3, 1, 1}, /* 17 images: groups of one and two */
};

static fr_conv_shape shape_of(const conv_case *cc) {
    fr_conv_shape s = {.n = cc->n, .c = cc->c, .h = cc->h, .w = cc->h, .k = cc->k, .r = cc->r,
                       .s = cc->r, .stride = cc->stride, .pad = cc->pad};
    s.oh = s.ow = (cc->h + 2 * cc->pad - cc->r) / cc->stride + 1;
    return s;
}

/* The table depends on one image's shape and the class: never on the
 * batch; and what it routes to oneDNN needs oneDNN. */
static void test_rule_table(void) {
    for (int isa = 0; isa < FR_ISA_COUNT; isa++)
        for (size_t i = 0; i < sizeof isa_cases / sizeof *isa_cases; i++)
            for (int d = 0; d < 3; d++) {
                fr_conv_shape s = shape_of(&isa_cases[i]), one = s, many = s;
                one.n = 1;
                many.n = 256;
                fr_conv_path p = fr_cpu_conv_rule(&s, d, (fr_cpu_isa)isa);
                CHECK(p == fr_cpu_conv_rule(&one, d, (fr_cpu_isa)isa));
                CHECK(p == fr_cpu_conv_rule(&many, d, (fr_cpu_isa)isa));
                if (!fr_cpu_have_dnnl())
                    CHECK(p == FR_CONV_PATH_OWN);
                CHECK(p != FR_CONV_PATH_DNNL_GROUPS || d == 2);
            }
    if (!fr_cpu_have_dnnl())
        return;
    /* the rows as docs/ARCHITECTURE.md states them */
    fr_conv_shape s3 = shape_of(&isa_cases[1]), s3s2 = shape_of(&isa_cases[2]), s1x1 = shape_of(&isa_cases[3]);
    fr_conv_shape wide = shape_of(&isa_cases[6]), k5 = shape_of(&isa_cases[8]);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_BASELINE) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_BASELINE) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_AVX2) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_AVX2) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s1x1, 2, FR_ISA_AVX2) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s3, 2, FR_ISA_AVX512) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&s3s2, 2, FR_ISA_AVX512) == FR_CONV_PATH_DNNL_GROUPS);
    CHECK(fr_cpu_conv_rule(&k5, 2, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    fr_conv_shape b1x1 = shape_of(&isa_cases[5]); /* 1x1 stride 1: im2col is one GEMM there */
    CHECK(fr_cpu_conv_rule(&b1x1, 2, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&wide, 0, FR_ISA_AVX2) == FR_CONV_PATH_OWN);
    CHECK(fr_cpu_conv_rule(&wide, 0, FR_ISA_AVX512) == FR_CONV_PATH_DNNL);
    CHECK(fr_cpu_conv_rule(&b1x1, 0, FR_ISA_AVX512) == FR_CONV_PATH_OWN); /* 96 -> 32 1x1 */
    CHECK(fr_cpu_conv_rule(&wide, 1, FR_ISA_AVX512) == FR_CONV_PATH_OWN);
    for (int isa = 0; isa < FR_ISA_COUNT; isa++)
        CHECK(fr_cpu_conv_rule(&s3, 0, (fr_cpu_isa)isa) == FR_CONV_PATH_DNNL);
}

/* Which of frugal's own kernels a 3x3 stride-1 pass takes where the table
 * says OWN: the shifted planes from the avx2 class up, but the avx512
 * class's backward (data) (DenseNet's growth layers: 48->12, 128->12),
 * which runs im2col on oneDNN's sgemm in a oneDNN build. */
static void test_own_rule(void) {
    for (int d = 0; d < 3; d++) {
        CHECK(!fr_cpu_conv_own_shift(d, FR_ISA_BASELINE));
        CHECK(fr_cpu_conv_own_shift(d, FR_ISA_AVX2));
        CHECK(fr_cpu_conv_own_shift(d, FR_ISA_AVX512) == (d != 1 || !fr_cpu_have_dnnl()));
    }
    CHECK(!fr_cpu_conv_own_shift(1, FR_ISA_COUNT));
    fr_conv_shape growth = shape_of(&isa_cases[6]); /* 128 -> 12 3x3 @8 */
    for (int isa = 0; isa < FR_ISA_COUNT; isa++)
        CHECK(fr_cpu_conv_rule(&growth, 1, (fr_cpu_isa)isa) == FR_CONV_PATH_OWN);
}

/* ---- the child: one forced class ---- */

static fr_cpu_isa child_isa;

static void check_case(const conv_case *cc, int seed) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), seed);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c, cc->r, cc->r), seed + 1);
    fr_conv_shape s;
    fr_conv_params p = {.stride = cc->stride, .pad = cc->pad};
    CHECK_OK(fr_conv2d_shape(x, w, p, &s));
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), seed + 2);
    fr_tensor *out[2][3];
    for (int b = 0; b < 2; b++) {
        out[b][0] = fr_empty_like(dy, FR_TAG_TRANSIENT);
        out[b][1] = fr_empty_like(x, FR_TAG_TRANSIENT);
        out[b][2] = fr_empty_like(w, FR_TAG_TRANSIENT);
        for (int d = 0; d < 3; d++)
            CHECK_OK(fr_fill_(out[b][d], NAN)); /* every element written */
        CHECK_OK(fr_cpu_conv_set_backend(b ? FR_CPU_CONV_AUTO : FR_CPU_CONV_IM2COL));
        CHECK_OK(fr_conv2d_forward(out[b][0], x, w, NULL, p));
        CHECK_OK(fr_conv2d_backward(out[b][1], out[b][2], NULL, dy, x, w, p));
    }
    for (int d = 0; d < 3; d++) {
        double e = fr_t_scaled_diff(out[1][d], out[0][d]);
        const char *impl = fr_cpu_conv_impl(&s, d);
        if (!(e <= 1e-5))
            fprintf(stderr, "    %s: %d->%d %dx%d /%d @%d pass %d (%s): %.2e from im2col\n",
                    fr_cpu_isa_name(child_isa), cc->c, cc->k, cc->r, cc->r, cc->stride, cc->h, d,
                    impl, e);
        CHECK(e <= 1e-5);
        /* the kernels of the class: oneDNN's capped at it, the shifted
         * planes from AVX2 up */
        if (child_isa < FR_ISA_AVX512)
            CHECK(strstr(impl, "avx512") == NULL);
        if (child_isa < FR_ISA_AVX2)
            CHECK(strstr(impl, "avx2") == NULL && strcmp(impl, "shift") != 0);
        fr_conv_path path;
        CHECK_OK(fr_cpu_conv_path(&s, d, &path));
        CHECK(path == fr_cpu_conv_rule(&s, d, child_isa));
        CHECK((path == FR_CONV_PATH_OWN) ==
              (strcmp(impl, "im2col") == 0 || strcmp(impl, "shift") == 0));
        /* which own kernel, written out rather than asked of the table
         * (fr_cpu_conv_own_shift is what picks it): the shifted planes
         * from avx2 up, but im2col for the avx512 class's backward (data)
         * in a oneDNN build; im2col on baseline */
        bool want_shift = child_isa >= FR_ISA_AVX2 &&
                          !(child_isa == FR_ISA_AVX512 && d == 1 && fr_cpu_have_dnnl());
        if (path == FR_CONV_PATH_OWN && fr_cpu_conv_shift_applies(&s))
            CHECK(strcmp(impl, want_shift ? "shift" : "im2col") == 0);
        /* DenseNet's growth layer (128->12 3x3): backward (data) is frugal's
         * own on every class, im2col on avx512 (with oneDNN) and baseline,
         * the shifted planes on avx2 */
        if (d == 1 && cc->c == 128 && cc->k == 12 && cc->r == 3 && cc->stride == 1) {
            const char *want = child_isa == FR_ISA_AVX2 ||
                                       (child_isa == FR_ISA_AVX512 && !fr_cpu_have_dnnl())
                                   ? "shift"
                                   : "im2col";
            if (strcmp(impl, want) != 0)
                fprintf(stderr, "    %s: 128->12 backward (data) ran %s, want %s\n",
                        fr_cpu_isa_name(child_isa), impl, want);
            CHECK(strcmp(impl, want) == 0);
        }
        if (path == FR_CONV_PATH_DNNL_GROUPS)
            CHECK(strstr(impl, "/groups") != NULL);
    }
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            fr_release(out[b][d]);
    fr_release(dy);
    fr_release(w);
    fr_release(x);
}

static void test_forced_class(void) {
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    CHECK(isa == child_isa);
    for (size_t i = 0; i < sizeof isa_cases / sizeof *isa_cases; i++)
        check_case(&isa_cases[i], 100 + 10 * (int)i);
    fr_conv_shape probe = shape_of(&isa_cases[1]);
    CHECK(fr_cpu_conv_shift_applies(&probe) == (child_isa >= FR_ISA_AVX2));
}

/* FR_CPU_ISA names no class or a class above this CPU's: every conv call
 * fails with an error that names the variable. */
static void test_refused(void) {
    fr_cpu_isa isa;
    CHECK_ERR(fr_cpu_isa_get(&isa), FR_ERR_ARG, "FR_CPU_ISA");
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 4, 8, 8), 1);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 4, 3, 3), 2);
    fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 8, 8, 8), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv2d_forward(y, x, w, NULL, (fr_conv_params){.stride = 1, .pad = 1}), FR_ERR_ARG, "FR_CPU_ISA");
    char line[256];
    fr_cpu_conv_describe(line, sizeof line);
    CHECK(strstr(line, "FR_CPU_ISA") != NULL);
    fr_release(y);
    fr_release(w);
    fr_release(x);
}

/* ---- the parent ---- */

/* Runs this program as a child with FR_CPU_ISA=value; its exit status. */
static int run_child(const char *value, const char *mode) {
    return fr_t_run_self(self_path, "FR_CPU_ISA", value,
                         (char *const[]){(char *)self_path, "--child", (char *)mode, (char *)value, NULL});
}

static void test_every_class_below_the_machine(void) {
    fr_cpu_isa top = fr_cpu_isa_detected();
    for (int isa = 0; isa <= (int)top; isa++) {
        int rc = run_child(fr_cpu_isa_name((fr_cpu_isa)isa), "class");
        if (rc != 0)
            fprintf(stderr, "    FR_CPU_ISA=%s: child exited %d\n", fr_cpu_isa_name((fr_cpu_isa)isa), rc);
        CHECK(rc == 0);
    }
}

static void test_bad_values_refused(void) {
    CHECK(run_child("avx1024", "refused") == 0);
    if (fr_cpu_isa_detected() < FR_ISA_AVX512)
        CHECK(run_child("avx512", "refused") == 0);
}

static void test_describe(void) {
    char line[256];
    fr_cpu_conv_describe(line, sizeof line);
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    CHECK(strncmp(line, "cpu ", 4) == 0 && strstr(line, fr_cpu_isa_name(isa)) != NULL);
    const fr_cpu_features *f = fr_cpu_features_detected();
    CHECK(!f->avx512_bf16 || strstr(line, "avx512_bf16") != NULL);
    /* the class follows the features */
    CHECK((fr_cpu_isa_detected() >= FR_ISA_AVX2) == (f->avx2 && f->fma));
    CHECK((fr_cpu_isa_detected() >= FR_ISA_AVX512) == (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512cd));
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 4 && strcmp(argv[1], "--child") == 0) {
        if (strcmp(argv[2], "refused") == 0) {
            RUN(test_refused);
            return TEST_SUMMARY();
        }
        for (int i = 0; i < FR_ISA_COUNT; i++)
            if (strcmp(argv[3], fr_cpu_isa_name((fr_cpu_isa)i)) == 0)
                child_isa = (fr_cpu_isa)i;
        RUN(test_forced_class);
        return TEST_SUMMARY();
    }
    if (getenv("FR_CPU_ISA")) /* the parent checks the machine's own class */
        unsetenv("FR_CPU_ISA");
    RUN(test_samples_do_not_depend_on_batch);
    RUN(test_results_do_not_depend_on_threads);
    RUN(test_dnnl_matches_im2col);
    RUN(test_weight_groups_sum_calls);
    RUN(test_dnnl_is_used);
    RUN(test_backend_switch);
    RUN(test_shift_kernels);
    RUN(test_rule_table);
    RUN(test_own_rule);
    RUN(test_describe);
    RUN(test_every_class_below_the_machine);
    RUN(test_bad_values_refused);
    return TEST_SUMMARY();
}
