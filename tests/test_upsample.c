/* test_upsample.c: nearest and bilinear upsampling and adaptive average
 * pooling against PyTorch (tests/fixtures/gen_upsample.py: y and dx for a
 * given dy), against finite differences, and bad arguments refused naming
 * op, argument and shapes. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* a few products and sums of f32 values in [-1, 1) */
#define ATOL 1e-6
#define RTOL 1e-5

typedef struct {
    const char *name;
    bool adaptive;
    fr_upsample_opts o;
    int out_h, out_w;
} up_case;

/* the same tables as gen_upsample.py */
static const up_case cases[] = {
    {"near2", false, {2, FR_UPSAMPLE_NEAREST, false}, 0, 0},
    {"near3", false, {3, FR_UPSAMPLE_NEAREST, false}, 0, 0},
    {"bil2", false, {2, FR_UPSAMPLE_BILINEAR, false}, 0, 0},
    {"bil3", false, {3, FR_UPSAMPLE_BILINEAR, false}, 0, 0},
    {"bil2_ac", false, {2, FR_UPSAMPLE_BILINEAR, true}, 0, 0},
    {"bil1", false, {2, FR_UPSAMPLE_BILINEAR, true}, 0, 0},
    {"ada_even", true, {0}, 4, 4},
    {"ada_odd", true, {0}, 3, 3},
    {"ada_rect", true, {0}, 2, 4},
    {"ada_up", true, {0}, 5, 4},
    {"ada_global", true, {0}, 1, 1},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static fr_tensor *run_op(const up_case *c, fr_tensor *x) {
    return c->adaptive ? fr_adaptive_avg_pool2d(x, c->out_h, c->out_w) : fr_upsample(x, c->o);
}

static void test_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("upsample");
    for (int i = 0; f && i < N_CASES; i++) {
        const up_case *c = &cases[i];
        fr_tensor *x = fr_t_fixture_case(f, c->name, "x"), *dy = fr_t_fixture_case(f, c->name, "dy");
        if (x && dy) {
            fr_set_requires_grad(x, true);
            fr_tensor *y = run_op(c, x);
            CHECK_NOTNULL(y);
            if (y) {
                CHECK(fr_t_fixture_expect(f, c->name, "y", y, ATOL, RTOL));
                CHECK_OK(fr_backward_with(y, dy));
                CHECK(fr_t_fixture_expect(f, c->name, "dx", x->grad, ATOL, RTOL));
            }
            fr_release(y);
        }
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* The tensor-level ops overwrite every element of their outputs (NaN
 * prefilled), and the f16 path (staged in f32 blocks) agrees with f32. */
static void test_outputs_overwritten_and_half(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 2, 5, 4), 81);
    fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(3, 2, 10, 8), FR_TAG_TRANSIENT);
    fr_tensor *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_upsample_opts o = {.scale = 2, .mode = FR_UPSAMPLE_BILINEAR};
    CHECK_OK(fr_fill_(y, NAN));
    CHECK_OK(fr_fill_(dx, NAN));
    CHECK_OK(fr_upsample_forward(y, x, o));
    CHECK_OK(fr_upsample_backward(dx, y, o));
    const float *py = fr_data_f32(y), *pdx = fr_data_f32(dx);
    bool finite = true;
    for (int64_t i = 0; i < fr_numel(y); i++)
        finite &= isfinite(py[i]) != 0;
    for (int64_t i = 0; i < fr_numel(dx); i++)
        finite &= isfinite(pdx[i]) != 0;
    CHECK(finite);
    fr_tensor *xh = fr_cast(x, FR_F16);
    fr_tensor *yh = xh ? fr_upsample(xh, o) : NULL;
    fr_tensor *back = yh ? fr_cast(yh, FR_F32) : NULL;
    CHECK_NOTNULL(back);
    if (back) /* f16 inputs: the result within f16 rounding of f32's */
        CHECK(fr_t_allclose_t(back, y, 2e-3, 2e-3, "f16 upsample"));
    fr_release(back);
    fr_release(yh);
    fr_release(xh);
    fr_release(dx);
    fr_release(y);
    fr_release(x);
}

typedef struct {
    fr_tensor *x;
    const up_case *c;
} grad_case;

static fr_tensor *loss(void *ctx) {
    const grad_case *g = ctx;
    fr_tensor *y = run_op(g->c, g->x);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 29) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    for (int i = 0; i < N_CASES; i++) {
        grad_case g = {fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 4, 3), 90 + (uint32_t)i), &cases[i]};
        fr_set_requires_grad(g.x, true);
        fr_tensor *l = loss(&g);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* linear in x: central differences are exact but for rounding */
            CHECK(fr_t_gradcheck(loss, &g, &g.x, 1, 1e-2, 1e-3, 5e-3, 48));
        }
        fr_release(l);
        fr_release(g.x);
    }
}

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 4), 71);
    fr_tensor *x3 = fr_t_rand(FR_CPU, 3, FR_SHAPE(3, 4, 4), 72);
    CHECK_ERR(fr_t_status_of(fr_upsample(x, (fr_upsample_opts){.scale = 0})), FR_ERR_ARG,
              "upsample: scale 0 must be an integer >= 1");
    CHECK_ERR(fr_t_status_of(fr_upsample(x, (fr_upsample_opts){.scale = 2, .mode = 7})),
              FR_ERR_ARG, "upsample: unknown mode 7");
    CHECK_ERR(fr_t_status_of(fr_upsample(x, (fr_upsample_opts){.scale = 2, .align_corners = true})),
              FR_ERR_ARG, "align_corners is for bilinear mode only");
    CHECK_ERR(fr_t_status_of(fr_upsample(x3, (fr_upsample_opts){.scale = 2})), FR_ERR_SHAPE,
              "upsample: x has shape (3, 4, 4), expected 4 dimensions");
    fr_tensor *ybad = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 3, 8, 7), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_upsample_forward(ybad, x, (fr_upsample_opts){.scale = 2}), FR_ERR_SHAPE,
              "y has shape (2, 3, 8, 7), expected (2, 3, 8, 8)");
    CHECK_ERR(fr_t_status_of(fr_adaptive_avg_pool2d(x, 0, 2)), FR_ERR_ARG,
              "adaptive_avg_pool2d: output size 0x2 must be positive");
    fr_tensor *y4 = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 4, 2, 2), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_adaptive_avg_pool2d_forward(y4, x), FR_ERR_SHAPE,
              "adaptive_avg_pool2d: x (2, 3, 4, 4) and y (2, 4, 2, 2) must share N and C");
    fr_release(y4);
    fr_release(ybad);
    fr_release(x3);
    fr_release(x);
}

int main(void) {
    RUN(test_matches_torch);
    RUN(test_outputs_overwritten_and_half);
    RUN(test_gradcheck);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
