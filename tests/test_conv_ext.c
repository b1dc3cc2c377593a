/* test_conv_ext.c: grouped, depthwise and dilated convolutions and the
 * transposed convolution against PyTorch (tests/fixtures/gen_conv_ext.py:
 * y, dx, dw, db), on the default path (oneDNN where built) and on the
 * im2col reference; the transposed op against finite differences; bad
 * groups, output padding and channels refused naming op, argument and
 * shapes. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/conv.h"

/* float32 sums of at most 72 products of values in [-1, 1) against
 * PyTorch's own float32 order: 1e-5 relative, and 1e-5 absolute for the
 * elements that cancel to near 0 */
#define ATOL 1e-5
#define RTOL 1e-5

typedef struct {
    const char *name;
    bool transposed;
    int stride, pad, output_pad, groups, dilation;
    bool bias;
} ext_case;

/* the same tables as gen_conv_ext.py */
static const ext_case cases[] = {
    {"grp", false, 1, 1, 0, 2, 1, true},      {"dw", false, 1, 1, 0, 8, 1, false},
    {"dw_s2", false, 2, 1, 0, 6, 1, true},    {"dil2", false, 1, 2, 0, 1, 2, true},
    {"grp_dil", false, 2, 1, 0, 2, 2, false}, {"t_dcgan", true, 2, 1, 0, 1, 1, true},
    {"t_opad", true, 2, 1, 1, 1, 1, false},   {"t_grp", true, 1, 1, 0, 2, 1, true},
    {"t_dil", true, 1, 0, 0, 1, 2, true},     {"t_pw_s2", true, 2, 0, 1, 1, 1, false},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static fr_tensor *run_op(const ext_case *c, fr_tensor *x, fr_tensor *w, fr_tensor *b) {
    if (c->transposed)
        return fr_conv_transpose2d(x, w, b,
                                   (fr_conv_transpose_params){.stride = c->stride, .pad = c->pad,
                                                              .output_pad = c->output_pad,
                                                              .groups = c->groups,
                                                              .dilation = c->dilation});
    return fr_conv2d(x, w, b, (fr_conv_params){.stride = c->stride, .pad = c->pad,
                                               .groups = c->groups, .dilation = c->dilation});
}

static void matches_torch_on(fr_cpu_conv_backend backend) {
    CHECK_OK(fr_cpu_conv_set_backend(backend));
    fr_st_file *f = fr_t_fixture("conv_ext");
    for (int i = 0; f && i < N_CASES; i++) {
        const ext_case *c = &cases[i];
        fr_tensor *x = fr_t_fixture_case(f, c->name, "x"), *w = fr_t_fixture_case(f, c->name, "w");
        fr_tensor *dy = fr_t_fixture_case(f, c->name, "dy");
        fr_tensor *b = c->bias ? fr_t_fixture_case(f, c->name, "b") : NULL;
        if (x && w && dy && (b || !c->bias)) {
            fr_set_requires_grad(x, true);
            fr_set_requires_grad(w, true);
            if (b)
                fr_set_requires_grad(b, true);
            fr_tensor *y = run_op(c, x, w, b);
            CHECK_NOTNULL(y);
            if (y) {
                CHECK(fr_t_fixture_expect(f, c->name, "y", y, ATOL, RTOL));
                CHECK_OK(fr_backward_with(y, dy));
                CHECK(fr_t_fixture_expect(f, c->name, "dx", x->grad, ATOL, RTOL));
                CHECK(fr_t_fixture_expect(f, c->name, "dw", w->grad, ATOL, RTOL));
                if (b)
                    CHECK(fr_t_fixture_expect(f, c->name, "db", b->grad, ATOL, RTOL));
            }
            fr_release(y);
        }
        fr_release(b);
        fr_release(dy);
        fr_release(w);
        fr_release(x);
    }
    fr_st_close(f);
    CHECK_OK(fr_cpu_conv_set_backend(FR_CPU_CONV_AUTO));
}

static void test_matches_torch(void) { matches_torch_on(FR_CPU_CONV_AUTO); }
static void test_reference_matches_torch(void) { matches_torch_on(FR_CPU_CONV_IM2COL); }

/* ---- finite differences (transposed; the grouped and dilated
 * convolutions are in test_conv.c's table) ---- */

typedef struct {
    fr_tensor *x, *w, *b;
    fr_conv_transpose_params p;
} grad_case;

static fr_tensor *transposed_loss(void *ctx) {
    const grad_case *g = ctx;
    fr_tensor *y = fr_conv_transpose2d(g->x, g->w, g->b, g->p);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 37) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    const struct {
        int64_t x[4], w[4];
        fr_conv_transpose_params p;
        bool bias;
    } gc[] = {
        {{2, 3, 3, 4}, {3, 2, 4, 4}, {.stride = 2, .pad = 1}, true},
        {{1, 4, 4, 3}, {4, 1, 3, 3}, {.stride = 2, .pad = 1, .output_pad = 1, .groups = 2}, false},
        {{2, 2, 3, 3}, {2, 2, 3, 2}, {.stride = 1, .pad = 1, .dilation = 2}, true},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        grad_case g = {fr_t_rand(FR_CPU, 4, gc[i].x, 61), fr_t_rand(FR_CPU, 4, gc[i].w, 62),
                       gc[i].bias ? fr_t_rand(FR_CPU, 1, FR_SHAPE(gc[i].w[1] * (gc[i].p.groups ? gc[i].p.groups : 1)), 63)
                                  : NULL,
                       gc[i].p};
        fr_tensor *wrt[3] = {g.x, g.w, g.b};
        int n_wrt = g.b ? 3 : 2;
        for (int j = 0; j < n_wrt; j++)
            fr_set_requires_grad(wrt[j], true);
        fr_tensor *l = transposed_loss(&g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            CHECK(fr_t_gradcheck(transposed_loss, &g, wrt, n_wrt, 1e-2, 2e-3, 5e-3, 60));
        }
        fr_release(l);
        fr_release(g.b);
        fr_release(g.w);
        fr_release(g.x);
    }
}

/* ---- bad arguments ---- */

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 6, 8, 8), 71);
    fr_tensor *w4 = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 3, 3), 72);  /* 6 -> 4 in 2 groups */
    fr_tensor *w5 = fr_t_rand(FR_CPU, 4, FR_SHAPE(5, 2, 3, 3), 73);  /* 5 outputs, 3 groups */
    fr_tensor *wt = fr_t_rand(FR_CPU, 4, FR_SHAPE(6, 2, 4, 4), 74);  /* transposed 6 -> 2 */
    fr_tensor *wt5 = fr_t_rand(FR_CPU, 4, FR_SHAPE(5, 2, 4, 4), 75); /* transposed, 5 in */
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w4, NULL, (fr_conv_params){.stride = 1, .groups = 4})),
              FR_ERR_SHAPE, "conv2d: groups 4 must divide the 6 input and 4 output channels "
              "(x (2, 6, 8, 8), w (4, 3, 3, 3))");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w5, NULL, (fr_conv_params){.stride = 1, .groups = 3})),
              FR_ERR_SHAPE, "groups 3 must divide the 6 input and 5 output channels");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w4, NULL, (fr_conv_params){.stride = 1, .groups = 1})),
              FR_ERR_SHAPE, "x (2, 6, 8, 8) has 6 channels but w (4, 3, 3, 3) expects 3");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w4, NULL, (fr_conv_params){.stride = 1, .groups = -2})),
              FR_ERR_ARG, "conv2d: groups and dilation must be >= 1, got groups -2");
    CHECK_ERR(fr_t_status_of(fr_conv2d(x, w4, NULL, (fr_conv_params){.stride = 1, .groups = 2,
                                                                     .dilation = 4})),
              FR_ERR_SHAPE, "w (4, 3, 3, 3) with dilation 4 does not fit the input");
    fr_conv_transpose_params tp = {.stride = 2, .pad = 1, .output_pad = 2};
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x, wt, NULL, tp)), FR_ERR_ARG,
              "conv_transpose2d: output_pad 2 must be smaller than stride 2");
    tp.output_pad = 1;
    tp.stride = 1;
    tp.dilation = 2; /* PyTorch takes output_pad < dilation; frugal refuses it */
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x, wt, NULL, tp)), FR_ERR_ARG,
              "output_pad 1 must be smaller than stride 1 (dilation 2)");
    tp = (fr_conv_transpose_params){.stride = 2, .pad = 1};
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x, wt5, NULL, tp)), FR_ERR_SHAPE,
              "conv_transpose2d: x (2, 6, 8, 8) has 6 channels but w (5, 2, 4, 4) expects 5");
    tp.groups = 4;
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x, wt, NULL, tp)), FR_ERR_SHAPE,
              "conv_transpose2d: groups 4 must divide the 6 input and 8 output channels");
    tp = (fr_conv_transpose_params){.stride = 1, .pad = 3};
    fr_tensor *x1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, 6, 1, 1), 76);
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x1, wt, NULL, tp)), FR_ERR_SHAPE,
              "gives no output (-2x-2)");
    /* the tensor-level op checks its output and bias */
    tp = (fr_conv_transpose_params){.stride = 2, .pad = 1};
    fr_tensor *ybad = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 2, 15, 15), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv_transpose2d_forward(ybad, x, wt, NULL, tp), FR_ERR_SHAPE,
              "y has shape (2, 2, 15, 15), expected (2, 2, 16, 16)");
    fr_tensor *b6 = fr_t_rand(FR_CPU, 1, FR_SHAPE(6), 77);
    CHECK_ERR(fr_t_status_of(fr_conv_transpose2d(x, wt, b6, tp)), FR_ERR_SHAPE,
              "b has shape (6,), expected (2)");
    fr_release(b6);
    fr_release(ybad);
    fr_release(x1);
    fr_release(wt5);
    fr_release(wt);
    fr_release(w5);
    fr_release(w4);
    fr_release(x);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_reference_matches_torch);
    RUN(test_gradcheck);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
