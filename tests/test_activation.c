/* test_activation.c: ReLU and leaky ReLU: forward and backward against
 * PyTorch (tests/fixtures/gen_activation.py), finite differences, the inplace
 * forms with their version checks, and bad arguments. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define SHAPE4 FR_SHAPE(4, 3, 5, 5)

/* Values of fixture tensor `name`, compared with `got`. */
static void expect_fixture(fr_st_file *f, const char *name, const fr_tensor *got, double atol,
                           double rtol) {
    fr_tensor *want = fr_t_fixture_tensor(f, name, FR_CPU);
    fr_t_allclose_t(got, want, atol, rtol, name);
    fr_release(want);
}

/* A leaf that requires grad, holding a fixture tensor's values. */
static fr_tensor *fixture_leaf(fr_st_file *f, const char *name) {
    fr_tensor *t = fr_t_fixture_tensor(f, name, FR_CPU);
    if (t)
        fr_set_requires_grad(t, true);
    return t;
}

/* Random values moved at least 0.05 away from 0, where the kink is, so a
 * central difference never straddles it. */
static fr_tensor *rand_off_kink(int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *t = fr_t_rand(FR_CPU, ndim, shape, seed);
    float *x = fr_data_f32(t);
    for (int64_t i = 0; i < fr_numel(t); i++)
        x[i] += x[i] >= 0 ? 0.05f : -0.05f;
    return t;
}

/* ---- against PyTorch ---- */

static void test_relu_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
    fr_tensor *y = x ? fr_relu(x) : NULL;
    CHECK_NOTNULL(y);
    if (y) {
        expect_fixture(f, "relu_y", y, 0, 0); /* exact: max(x, 0) */
        CHECK_OK(fr_backward_with(y, dy));
        expect_fixture(f, "relu_dx", x->grad, 0, 0);
    }
    fr_release(y);
    fr_release(dy);
    fr_release(x);
    fr_st_close(f);
}

static void test_leaky_relu_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    const struct {
        const char *prefix;
        float slope;
    } cases[] = {{"leaky01", 0.1f}, {"leaky001", 0.01f}};
    for (size_t c = 0; c < 2; c++) {
        char name[64];
        fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
        fr_tensor *y = x ? fr_leaky_relu(x, cases[c].slope) : NULL;
        CHECK_NOTNULL(y);
        if (y) {
            /* one float multiplication each, as in PyTorch: 1 ulp */
            snprintf(name, sizeof name, "%s_y", cases[c].prefix);
            expect_fixture(f, name, y, 1e-7, 1e-6);
            CHECK_OK(fr_backward_with(y, dy));
            snprintf(name, sizeof name, "%s_dx", cases[c].prefix);
            expect_fixture(f, name, x->grad, 1e-7, 1e-6);
        }
        fr_release(y);
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* y = 2x; y.relu_() (resp. leaky_relu_); gradient to x from PyTorch. */
static void test_inplace_after_scale_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("activation");
    for (int leaky = 0; leaky < 2; leaky++) {
        fr_tensor *x = fixture_leaf(f, "x"), *dy = fr_t_fixture_tensor(f, "dy", FR_CPU);
        fr_tensor *y = x ? fr_scale(x, 2.0f) : NULL;
        CHECK_NOTNULL(y);
        if (!y) {
            fr_release(dy);
            fr_release(x);
            continue;
        }
        uint64_t v = y->storage->version;
        fr_tensor *r = leaky ? fr_leaky_relu_(y, 0.1f) : fr_relu_(y);
        CHECK(r == y);
        CHECK(y->storage->version == v + 1);
        CHECK(fr_tape_size() == 2);
        fr_release(r);
        expect_fixture(f, leaky ? "inplace_leaky01_y" : "inplace_relu_y", y, 1e-7, 1e-6);
        CHECK_OK(fr_backward_with(y, dy));
        expect_fixture(f, leaky ? "inplace_leaky01_dx" : "inplace_relu_dx", x->grad, 1e-7, 1e-6);
        fr_release(y);
        fr_release(dy);
        fr_release(x);
    }
    fr_st_close(f);
}

/* ---- finite differences ---- */

typedef struct {
    fr_tensor *x;
    int kind; /* 0 relu, 1 leaky relu, 2 scale + relu_, 3 scale + leaky_relu_ */
} act_case;

static fr_tensor *act_loss(void *ctx) {
    const act_case *c = ctx;
    fr_tensor *y;
    if (c->kind < 2) {
        y = c->kind == 0 ? fr_relu(c->x) : fr_leaky_relu(c->x, 0.2f);
    } else {
        y = fr_scale(c->x, 2.0f);
        fr_tensor *r = !y ? NULL : c->kind == 2 ? fr_relu_(y) : fr_leaky_relu_(y, 0.2f);
        if (!r)
            fr_clear(&y);
        fr_release(r);
    }
    fr_tensor *l = y ? fr_t_weighted_sum(y, 99) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    for (int kind = 0; kind < 4; kind++) {
        act_case c = {rand_off_kink(4, FR_SHAPE(2, 3, 4, 4), 5 + (uint32_t)kind), kind};
        fr_set_requires_grad(c.x, true);
        fr_tensor *l = act_loss(&c);
        CHECK_NOTNULL(l);
        if (l) {
            CHECK_OK(fr_backward(l));
            /* float32 loss of ~100 terms, eps 1e-2: numeric error ~1e-4 */
            CHECK(fr_t_gradcheck(act_loss, &c, &c.x, 1, 1e-2, 1e-3, 1e-3, 96));
        }
        fr_release(l);
        fr_release(c.x);
    }
}

/* ---- what backward keeps ---- */

static void test_saves_only_the_output(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 1);
    fr_set_requires_grad(a, true);
    fr_tensor *h = fr_scale(a, 1.0f); /* a transient activation */
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *y = fr_relu(h);
    CHECK_NOTNULL(y);
    if (y) {
        CHECK(y->grad_fn && y->grad_fn->n_saved == 1);
        CHECK(y->grad_fn && y->grad_fn->saved[0].held->storage == y->storage);
        /* only y's bytes moved to "saved"; h stays transient */
        CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0 + fr_nbytes(y));
    }
    /* inplace: nothing new is allocated at all */
    size_t total0 = fr_mem_total_current(FR_CPU);
    fr_tensor *r = fr_leaky_relu_(h, 0.1f);
    CHECK(r == h);
    CHECK(fr_mem_total_current(FR_CPU) == total0);
    fr_release(r);
    fr_release(y);
    fr_release(h);
    fr_release(a);
    fr_tape_clear();
}

/* ---- inplace and versions ---- */

/* y = relu(a) saves y; an inplace write to y afterwards must make backward
 * fail naming both ops, and leave a's gradient untouched. */
static void test_write_to_saved_output_fails(void) {
    const char *writers[] = {"scale_", "relu_", "leaky_relu_"};
    for (int w = 0; w < 3; w++) {
        fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 2);
        fr_set_requires_grad(a, true);
        fr_tensor *y = fr_relu(a);
        fr_tensor *r = w == 0 ? fr_scale_(y, 2.0f) : w == 1 ? fr_relu_(y) : fr_leaky_relu_(y, 0.1f);
        CHECK_NOTNULL(r);
        fr_release(r);
        fr_tensor *l = fr_t_weighted_sum(y, 3);
        CHECK_NOTNULL(l);
        if (l) {
            char needle[64];
            fr_status st = fr_backward(l);
            CHECK_ERR(st, FR_ERR_VERSION, "backward of relu:");
            snprintf(needle, sizeof needle, "modified inplace by %s", writers[w]);
            CHECK_ERR(st, FR_ERR_VERSION, needle);
        }
        CHECK(a->grad == NULL); /* never a wrong gradient */
        CHECK(fr_tape_size() == 0);
        fr_release(l);
        fr_release(y);
        fr_release(a);
    }
}

/* The same graph without the inplace write runs, with the right gradient:
 * d/da sum(2 relu(a) * r) = 2 r [a > 0]. */
static void test_unchanged_version_succeeds(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, SHAPE4, 2);
    fr_set_requires_grad(a, true);
    fr_tensor *y = fr_relu(a);
    fr_tensor *z = fr_scale(y, 2.0f); /* out of place: y keeps its version */
    fr_tensor *l = fr_t_weighted_sum(z, 3);
    CHECK_NOTNULL(l);
    if (l) {
        CHECK_OK(fr_backward(l));
        fr_tensor *r = fr_t_rand(FR_CPU, 4, SHAPE4, 3); /* the weights weighted_sum used */
        size_t n = (size_t)fr_numel(a);
        float *want = malloc(n * sizeof *want);
        const float *av = fr_data_f32(a), *rv = fr_data_f32(r);
        for (size_t i = 0; i < n; i++)
            want[i] = av[i] > 0 ? 2.0f * rv[i] : 0.0f;
        fr_t_allclose(a->grad, want, n, 0, 0, "2 r [a > 0]");
        free(want);
        fr_release(r);
    }
    fr_release(l);
    fr_release(z);
    fr_release(y);
    fr_release(a);
}

static void test_inplace_refuses_leaf_that_requires_grad(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 4);
    fr_set_requires_grad(a, true);
    uint64_t v = a->storage->version;
    CHECK_ERR(fr_t_status_of(fr_relu_(a)), FR_ERR_ARG, "in-place relu on a leaf that requires grad");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu_(a, 0.1f)), FR_ERR_ARG,
              "in-place leaky_relu on a leaf that requires grad");
    CHECK(a->storage->version == v); /* refused before writing */
    CHECK(fr_tape_size() == 0);
    /* under no_grad the write is allowed (initialising a parameter) */
    fr_no_grad_enter();
    fr_tensor *r = fr_relu_(a);
    fr_no_grad_exit();
    CHECK(r == a);
    CHECK(a->storage->version == v + 1);
    CHECK(fr_tape_size() == 0);
    fr_release(r);
    fr_release(a);
}

static void test_inplace_without_recording(void) {
    float xs[4] = {-2.0f, -0.5f, 0.0f, 3.0f};
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(4), FR_TAG_DATA, xs);
    uint64_t v = x->storage->version;
    fr_tensor *r = fr_leaky_relu_(x, 0.5f);
    CHECK(r == x);
    CHECK(fr_tape_size() == 0);
    CHECK(x->storage->version == v + 1);
    CHECK(x->storage->last_writer && strcmp(x->storage->last_writer, "leaky_relu_") == 0);
    const float want[4] = {-1.0f, -0.25f, 0.0f, 3.0f};
    fr_t_allclose(x, want, 4, 0, 0, "leaky_relu_ in place");
    fr_release(r);
    r = fr_relu_(x);
    const float want2[4] = {0.0f, 0.0f, 0.0f, 3.0f};
    fr_t_allclose(x, want2, 4, 0, 0, "relu_ in place");
    CHECK(x->storage->version == v + 2);
    fr_release(r);
    fr_release(x);
}

/* ---- tensor-level ops ---- */

static void test_ops_alias_outputs(void) {
    float xs[6] = {-3, -1, 0, 0.5f, 2, -0.25f}, gs[6] = {1, 2, 3, 4, 5, 6};
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA, xs);
    fr_tensor *g = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_DATA, gs);
    CHECK_OK(fr_leaky_relu_forward(x, x, 0.25f)); /* y == x */
    const float y[6] = {-0.75f, -0.25f, 0, 0.5f, 2, -0.0625f};
    fr_t_allclose(x, y, 6, 0, 0, "leaky_relu y == x");
    CHECK_OK(fr_leaky_relu_backward(g, g, x, 0.25f)); /* dx == dy */
    const float dx[6] = {0.25f, 0.5f, 0.75f, 4, 5, 1.5f};
    fr_t_allclose(g, dx, 6, 0, 0, "leaky_relu dx == dy");
    CHECK_OK(fr_relu_forward(x, x));
    CHECK_OK(fr_relu_backward(g, g, x));
    const float dx2[6] = {0, 0, 0, 4, 5, 0};
    fr_t_allclose(g, dx2, 6, 0, 0, "relu dx == dy");
    fr_release(g);
    fr_release(x);
}

/* Past the kernels' OpenMP threshold, against the definition. */
static void test_ops_large(void) {
    const int64_t n = 100000;
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(n), 12), *dy = fr_t_rand(FR_CPU, 1, FR_SHAPE(n), 13);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT), *dx = fr_empty_like(x, FR_TAG_TRANSIENT);
    float *want = malloc((size_t)n * sizeof *want), *want_dx = malloc((size_t)n * sizeof *want);
    const float *xv = fr_data_f32(x), *dyv = fr_data_f32(dy);
    for (int64_t i = 0; i < n; i++) {
        want[i] = xv[i] > 0 ? xv[i] : xv[i] * 0.3f;
        want_dx[i] = xv[i] > 0 ? dyv[i] : dyv[i] * 0.3f;
    }
    CHECK_OK(fr_leaky_relu_forward(y, x, 0.3f));
    CHECK_OK(fr_leaky_relu_backward(dx, dy, y, 0.3f));
    fr_t_allclose(y, want, (size_t)n, 0, 0, "large leaky_relu y");
    fr_t_allclose(dx, want_dx, (size_t)n, 0, 0, "large leaky_relu dx");
    free(want_dx);
    free(want);
    fr_release(dx);
    fr_release(y);
    fr_release(dy);
    fr_release(x);
}

/* ---- bad arguments ---- */

static void test_bad_arguments(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 4), 6);
    fr_tensor *other = fr_t_rand(FR_CPU, 2, FR_SHAPE(4, 3), 6);
    fr_tensor *ints = fr_zeros(FR_CPU, FR_I32, 2, FR_SHAPE(3, 4), FR_TAG_DATA);
    fr_tensor *strided = fr_narrow(x, 1, 1, 2);
    CHECK_ERR(fr_t_status_of(fr_relu(NULL)), FR_ERR_ARG, "relu: x is NULL");
    CHECK_ERR(fr_t_status_of(fr_relu_(NULL)), FR_ERR_ARG, "relu_: x is NULL");
    CHECK_ERR(fr_t_status_of(fr_relu(ints)), FR_ERR_DTYPE, "must be f32, f16 or bf16, got i32");
    CHECK_ERR(fr_t_status_of(fr_relu_(strided)), FR_ERR_SHAPE, "not contiguous");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu(x, 0.0f)), FR_ERR_ARG, "slope must be > 0");
    CHECK_ERR(fr_t_status_of(fr_leaky_relu_(x, -0.1f)), FR_ERR_ARG, "slope must be > 0");
    CHECK_ERR(fr_relu_forward(other, x), FR_ERR_SHAPE, "must have the same shape");
    CHECK_ERR(fr_relu_backward(x, x, other), FR_ERR_SHAPE, "dy (3, 4) and y (4, 3)");
    CHECK_ERR(fr_leaky_relu_backward(x, x, x, 0.0f), FR_ERR_ARG, "slope must be > 0");
    CHECK(fr_tape_size() == 0);
    fr_release(strided);
    fr_release(ints);
    fr_release(other);
    fr_release(x);
}

int main(void) {
    RUN(test_relu_matches_torch);
    RUN(test_leaky_relu_matches_torch);
    RUN(test_inplace_after_scale_matches_torch);
    RUN(test_gradcheck);
    RUN(test_saves_only_the_output);
    RUN(test_write_to_saved_output_fails);
    RUN(test_unchanged_version_succeeds);
    RUN(test_inplace_refuses_leaf_that_requires_grad);
    RUN(test_inplace_without_recording);
    RUN(test_ops_alias_outputs);
    RUN(test_ops_large);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
