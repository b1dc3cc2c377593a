/* test_broadcast.c: the broadcasting ops (fr_add, fr_sub, fr_mul, fr_div),
 * sums, means and maxima (amax, ties split) over dims, softmax and log-softmax, clamp and padding,
 * and a squeeze-excitation block written as PyTorch's: forward and every
 * input's gradient against PyTorch 1.13 (tests/fixtures/gen_broadcast.py,
 * 1e-5 relative), finite differences, and the refusals (shapes that do not
 * broadcast named both, bad dims, reflect padding too wide, clamp bounds). */
#include <stdio.h>
#include <string.h>

#include "testlib.h"
#include "tensor/ops.h"

typedef enum { OP_BINARY, OP_SUM, OP_MEAN, OP_SOFTMAX, OP_LOG_SOFTMAX, OP_CLAMP, OP_PAD, OP_MAX } op_kind;

typedef struct {
    const char *name;
    op_kind kind;
    fr_binary_op bop;
    int ndims, dims[3];
    bool keepdim;
    int pad[4];
    fr_pad_mode mode;
} op_case;

static const op_case CASES[] = {
    {"add_chan", OP_BINARY, FR_BINARY_ADD, 0, {0}, 0, {0}, 0},
    {"add_both", OP_BINARY, FR_BINARY_ADD, 0, {0}, 0, {0}, 0},
    {"sub_chan", OP_BINARY, FR_BINARY_SUB, 0, {0}, 0, {0}, 0},
    {"sub_both", OP_BINARY, FR_BINARY_SUB, 0, {0}, 0, {0}, 0},
    {"mul_chan", OP_BINARY, FR_BINARY_MUL, 0, {0}, 0, {0}, 0},
    {"mul_both", OP_BINARY, FR_BINARY_MUL, 0, {0}, 0, {0}, 0},
    {"div_chan", OP_BINARY, FR_BINARY_DIV, 0, {0}, 0, {0}, 0},
    {"div_both", OP_BINARY, FR_BINARY_DIV, 0, {0}, 0, {0}, 0},
    {"sum_hw_keep", OP_SUM, 0, 2, {2, 3}, true, {0}, 0},
    {"sum_n", OP_SUM, 0, 1, {0}, false, {0}, 0},
    {"mean_hw", OP_MEAN, 0, 2, {2, 3}, false, {0}, 0},
    {"mean_last_c_keep", OP_MEAN, 0, 2, {-1, 1}, true, {0}, 0},
    {"softmax_1", OP_SOFTMAX, 0, 1, {1}, 0, {0}, 0},
    {"softmax_last", OP_SOFTMAX, 0, 1, {-1}, 0, {0}, 0},
    {"log_softmax_1", OP_LOG_SOFTMAX, 0, 1, {1}, 0, {0}, 0},
    {"log_softmax_0", OP_LOG_SOFTMAX, 0, 1, {0}, 0, {0}, 0},
    {"clamp", OP_CLAMP, 0, 0, {0}, 0, {0}, 0},
    {"pad_zero", OP_PAD, 0, 0, {0}, 0, {1, 2, 0, 3}, FR_PAD_ZERO},
    {"pad_reflect", OP_PAD, 0, 0, {0}, 0, {2, 1, 3, 4}, FR_PAD_REFLECT},
    {"amax_hw_keep", OP_MAX, 0, 2, {2, 3}, true, {0}, 0},
    {"amax_c", OP_MAX, 0, 1, {1}, false, {0}, 0},
    {"amax_ties", OP_MAX, 0, 1, {-1}, false, {0}, 0},
};
#define N_CASES (sizeof CASES / sizeof *CASES)

static fr_tensor *run_case(const op_case *c, fr_tensor *a, fr_tensor *b) {
    switch (c->kind) {
    case OP_BINARY:
        return c->bop == FR_BINARY_ADD   ? fr_add(a, b)
               : c->bop == FR_BINARY_SUB ? fr_sub(a, b)
               : c->bop == FR_BINARY_MUL ? fr_mul(a, b)
                                         : fr_div(a, b);
    case OP_SUM:
        return fr_sum_dims(a, c->ndims, c->dims, c->keepdim);
    case OP_MEAN:
        return fr_mean_dims(a, c->ndims, c->dims, c->keepdim);
    case OP_SOFTMAX:
        return fr_softmax(a, c->dims[0]);
    case OP_LOG_SOFTMAX:
        return fr_log_softmax(a, c->dims[0]);
    case OP_CLAMP:
        return fr_clamp(a, -0.5f, 0.8f);
    case OP_MAX:
        return fr_amax_dims(a, c->ndims, c->dims, c->keepdim);
    default:
        return fr_pad(a, c->pad, c->mode);
    }
}

static fr_tensor *leaf(fr_st_file *f, const char *prefix, const char *name) {
    fr_tensor *t = fr_t_fixture_case(f, prefix, name);
    if (t)
        fr_set_requires_grad(t, true);
    return t;
}

static void test_ops_match_torch(void) {
    fr_st_file *f = fr_t_fixture("broadcast");
    for (size_t i = 0; i < N_CASES; i++) {
        const op_case *c = &CASES[i];
        bool binary = c->kind == OP_BINARY;
        fr_tensor *a = leaf(f, c->name, binary ? "a" : "x");
        fr_tensor *b = binary ? leaf(f, c->name, "b") : NULL;
        fr_tensor *dy = fr_t_fixture_case(f, c->name, "dy");
        fr_tensor *y = a && dy && (b || !binary) ? run_case(c, a, b) : NULL;
        CHECK_NOTNULL(y);
        if (y) {
            fr_t_fixture_expect(f, c->name, "y", y, 1e-6, 1e-5);
            CHECK_OK(fr_backward_with(y, dy));
            fr_t_fixture_expect(f, c->name, binary ? "da" : "dx", a->grad, 1e-6, 1e-5);
            if (b)
                fr_t_fixture_expect(f, c->name, "db", b->grad, 1e-6, 1e-5);
        }
        fr_release(y);
        fr_release(dy);
        fr_release(a);
        fr_release(b);
    }
    fr_st_close(f);
}

/* x * sigmoid(fc2(relu(fc1(mean(x, (2, 3)))))) viewed (N, C, 1, 1): the
 * block as torchvision writes it, one op per PyTorch call. */
static fr_tensor *squeeze_excite(fr_tensor *x, fr_tensor *w1, fr_tensor *b1, fr_tensor *w2,
                                 fr_tensor *b2) {
    fr_tensor *s = fr_mean_dims(x, 2, (int[]){2, 3}, false);   // (N, C)
    fr_tensor *h = fr_chain(s, fr_linear(s, w1, b1));
    h = fr_chain(h, fr_relu(h));
    h = fr_chain(h, fr_linear(h, w2, b2));
    h = fr_chain(h, fr_sigmoid(h));
    h = fr_chain(h, fr_reshape(h, 4, FR_SHAPE(x->shape[0], x->shape[1], 1, 1)));
    return fr_chain(h, fr_mul(x, h));
}

static void test_squeeze_excitation_matches_torch(void) {
    fr_st_file *f = fr_t_fixture("broadcast");
    const char *names[5] = {"x", "w1", "b1", "w2", "b2"};
    fr_tensor *in[5];
    for (int i = 0; i < 5; i++)
        in[i] = leaf(f, "se", names[i]);
    fr_tensor *dy = fr_t_fixture_case(f, "se", "dy");
    fr_tensor *y = squeeze_excite(in[0], in[1], in[2], in[3], in[4]);
    CHECK_NOTNULL(y);
    if (y) {
        fr_t_fixture_expect(f, "se", "y", y, 1e-6, 1e-5);
        CHECK_OK(fr_backward_with(y, dy));
        for (int i = 0; i < 5; i++) {
            char key[8];
            snprintf(key, sizeof key, "d%s", names[i]);
            fr_t_fixture_expect(f, "se", key, in[i]->grad, 1e-6, 1e-5);
        }
    }
    fr_release(y);
    fr_release(dy);
    for (int i = 0; i < 5; i++)
        fr_release(in[i]);
    fr_st_close(f);
}

typedef struct {
    const op_case *c;
    fr_tensor *a, *b;
} fd_ctx;

static fr_tensor *fd_loss(void *ctx) {
    fd_ctx *g = ctx;
    fr_tensor *y = run_case(g->c, g->a, g->b);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 99) : NULL;
    fr_release(y);
    return l;
}

static void test_finite_differences(void) {
    for (size_t i = 0; i < N_CASES; i++) {
        const op_case *c = &CASES[i];
        bool binary = c->kind == OP_BINARY;
        /* shapes of the fixture's cases, fresh values */
        fr_tensor *a = binary && strstr(c->name, "both")
                           ? fr_t_rand(FR_CPU, 3, FR_SHAPE(2, 1, 4), 5 + (uint32_t)i)
                           : fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 5, 6), 5 + (uint32_t)i);
        fr_tensor *b = NULL;
        if (binary) {
            b = strstr(c->name, "both") ? fr_t_rand(FR_CPU, 2, FR_SHAPE(3, 1), 50 + (uint32_t)i)
                                        : fr_t_rand(FR_CPU, 3, FR_SHAPE(3, 1, 1), 50 + (uint32_t)i);
            float *v = fr_data_f32(b);
            for (int64_t k = 0; k < fr_numel(b); k++)
                v[k] += v[k] >= 0 ? 0.5f : -0.5f; /* away from div's pole */
            fr_set_requires_grad(b, true);
        }
        if (c->kind == OP_CLAMP) { /* away from the bounds, where clamp kinks */
            float *v = fr_data_f32(a);
            for (int64_t k = 0; k < fr_numel(a); k++)
                if (fabsf(v[k] + 0.5f) < 0.02f || fabsf(v[k] - 0.8f) < 0.02f)
                    v[k] += 0.05f;
        }
        fr_set_requires_grad(a, true);
        fd_ctx g = {c, a, b};
        fr_tensor *l = fd_loss(&g);
        CHECK_NOTNULL(l);
        if (l)
            CHECK_OK(fr_backward(l));
        fr_release(l);
        fr_tensor *wrt[2] = {a, b};
        if (!fr_t_gradcheck(fd_loss, &g, wrt, binary ? 2 : 1, 1e-3, 2e-3, 2e-2, 40))
            fprintf(stderr, "    finite differences failed for %s\n", c->name);
        fr_release(a);
        fr_release(b);
    }
}

static void test_refusals(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 3, FR_SHAPE(2, 3, 4), 1);
    fr_tensor *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(5, 4), 2);
    CHECK_ERR(fr_t_status_of(fr_add(a, b)), FR_ERR_SHAPE, "(2, 3, 4)");
    CHECK_ERR(fr_t_status_of(fr_mul(a, b)), FR_ERR_SHAPE, "(5, 4)");
    CHECK_ERR(fr_t_status_of(fr_div(a, b)), FR_ERR_SHAPE, "div: a (2, 3, 4) and b (5, 4)");
    CHECK_ERR(fr_t_status_of(fr_sum_dims(a, 1, (int[]){3}, false)), FR_ERR_ARG, "dim 3");
    CHECK_ERR(fr_t_status_of(fr_mean_dims(a, 2, (int[]){1, -2}, false)), FR_ERR_ARG, "repeated");
    CHECK_ERR(fr_t_status_of(fr_softmax(a, -4)), FR_ERR_ARG, "softmax: dim -4");
    fr_tensor *r = fr_empty(FR_CPU, FR_F32, 3, FR_SHAPE(2, 3, 1), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_reduce_sum_prod_out(r, a, b, 1.0f), FR_ERR_SHAPE, "reduce_sum_prod");
    fr_release(r);
    CHECK_ERR(fr_t_status_of(fr_clamp(a, 1.0f, 0.0f)), FR_ERR_ARG, "clamp: min 1");
    CHECK_ERR(fr_t_status_of(fr_pad(a, (int[]){4, 0, 0, 0}, FR_PAD_REFLECT)), FR_ERR_SHAPE,
              "reflect padding 4");
    CHECK_ERR(fr_t_status_of(fr_pad(a, (int[]){0, -1, 0, 0}, FR_PAD_ZERO)), FR_ERR_ARG,
              "negative");
    fr_release(a);
    fr_release(b);
}

/* A same-shape add keeps its old path (any float dtype); the broadcast
 * path gives the same bits on f32. */
static void test_same_shape_agrees(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 2, FR_SHAPE(7, 9), 3);
    fr_tensor *b = fr_t_rand(FR_CPU, 2, FR_SHAPE(7, 9), 4);
    fr_tensor *y1 = fr_add(a, b), *y2 = fr_broadcast_op(FR_BINARY_ADD, a, b);
    CHECK(y1 && y2 && !memcmp(fr_data_f32(y1), fr_data_f32(y2), 63 * sizeof(float)));
    fr_release(y1);
    fr_release(y2);
    fr_release(a);
    fr_release(b);
}

/* The CPU kernels fold dims together (cpu/broadcast.c); each result must be
 * the unfolded definition's to the bit: every sum, sum of products (the
 * gradient of a broadcast factor) and maximum over each
 * subset of a 4-D shape's dims (sizes 1 among them, so folds skip dims), in
 * the definition's order (row-major over the reduced dims, in double), and
 * each binary op with b broadcast along each subset of the dims. */
static void test_folded_kernels_exact(void) {
    static const int64_t shapes[][4] = {{3, 5, 4, 7}, {2, 1, 6, 5}, {4, 3, 1, 1}, {2, 300, 1, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t *sh = shapes[si];
        int64_t n = sh[0] * sh[1] * sh[2] * sh[3];
        fr_tensor *x = fr_t_rand(FR_CPU, 4, sh, 11 + (int)si);
        fr_tensor *w = fr_t_rand(FR_CPU, 4, sh, 21 + (int)si);
        const float *xv = fr_data_f32(x), *wv = fr_data_f32(w);
        for (int mask = 0; mask < 16; mask++) {
            int64_t os[4];
            for (int d = 0; d < 4; d++)
                os[d] = mask >> d & 1 ? 1 : sh[d];
            fr_tensor *sum = fr_empty(FR_CPU, FR_F32, 4, os, FR_TAG_TRANSIENT);
            fr_tensor *mx = fr_empty(FR_CPU, FR_F32, 4, os, FR_TAG_TRANSIENT);
            fr_tensor *sp = fr_empty(FR_CPU, FR_F32, 4, os, FR_TAG_TRANSIENT);
            fr_tensor *b = fr_t_rand(FR_CPU, 4, os, 40 + mask);
            fr_tensor *y = fr_empty(FR_CPU, FR_F32, 4, sh, FR_TAG_TRANSIENT);
            CHECK_OK(fr_reduce_sum_out(sum, x, 0.25f));
            CHECK_OK(fr_reduce_max_out(mx, x));
            CHECK_OK(fr_reduce_sum_prod_out(sp, x, w, 0.5f));
            CHECK_OK(fr_bcast_binary_out(y, x, b, FR_BINARY_DIV));
            int64_t n_out = os[0] * os[1] * os[2] * os[3], bad = 0;
            for (int64_t o = 0; o < n_out; o++) {
                int64_t oi[4], rest = o;
                for (int d = 3; d >= 0; d--) {
                    oi[d] = rest % os[d];
                    rest /= os[d];
                }
                double acc = 0.0, accp = 0.0;
                float m = -INFINITY;
                for (int64_t i = 0; i < n; i++) {
                    int64_t ii[4];
                    rest = i;
                    for (int d = 3; d >= 0; d--) {
                        ii[d] = rest % sh[d];
                        rest /= sh[d];
                    }
                    bool in = true;
                    for (int d = 0; d < 4; d++)
                        in = in && (os[d] == 1 || ii[d] == oi[d]);
                    if (in) {
                        acc += xv[i];
                        accp += (float)(xv[i] * wv[i]);
                        m = xv[i] > m ? xv[i] : m;
                    }
                }
                bad += fr_data_f32(sum)[o] != (float)(acc * 0.25f) || fr_data_f32(mx)[o] != m ||
                       fr_data_f32(sp)[o] != (float)(accp * 0.5f);
            }
            for (int64_t i = 0; i < n; i++) {
                int64_t bo = 0, rest = i, st = 1;
                for (int d = 3; d >= 0; d--) {
                    int64_t k = rest % sh[d];
                    rest /= sh[d];
                    bo += (os[d] == 1 ? 0 : k) * st;
                    st *= os[d];
                }
                bad += fr_data_f32(y)[i] != xv[i] / fr_data_f32(b)[bo];
            }
            if (bad)
                fprintf(stderr, "  shape %zu, reduced/broadcast dims mask %d: %lld wrong\n", si,
                        mask, (long long)bad);
            CHECK(bad == 0);
            fr_release(sum);
            fr_release(mx);
            fr_release(sp);
            fr_release(b);
            fr_release(y);
        }
        fr_release(x);
        fr_release(w);
    }
}

/* Every case on CUDA against the CPU: output and input gradients. */
static void test_cuda_matches_cpu(void) {
    NEED_CUDA();
    fr_st_file *f = fr_t_fixture("broadcast");
    for (size_t i = 0; i < N_CASES; i++) {
        const op_case *c = &CASES[i];
        bool binary = c->kind == OP_BINARY;
        fr_tensor *h[3] = {fr_t_fixture_case(f, c->name, binary ? "a" : "x"),
                           binary ? fr_t_fixture_case(f, c->name, "b") : NULL,
                           fr_t_fixture_case(f, c->name, "dy")};
        fr_tensor *g[3] = {NULL, NULL, NULL}, *y[2] = {NULL, NULL};
        for (int k = 0; k < 3; k++)
            if (h[k])
                g[k] = fr_to_device(h[k], FR_CUDA, FR_TAG_DATA);
        for (int dev = 0; dev < 2; dev++) {
            fr_tensor **t = dev ? g : h;
            fr_set_requires_grad(t[0], true);
            if (t[1])
                fr_set_requires_grad(t[1], true);
            y[dev] = run_case(c, t[0], t[1]);
            CHECK_NOTNULL(y[dev]);
            if (y[dev])
                CHECK_OK(fr_backward_with(y[dev], t[2]));
        }
        if (y[0] && y[1]) {
            fr_tensor *w = fr_to_device(y[1], FR_CPU, FR_TAG_DATA);
            fr_t_allclose_t(w, y[0], 1e-6, 1e-5, c->name);
            fr_release(w);
            for (int k = 0; k < 2; k++)
                if (h[k]) {
                    w = fr_to_device(g[k]->grad, FR_CPU, FR_TAG_DATA);
                    fr_t_allclose_t(w, h[k]->grad, 1e-6, 1e-5, c->name);
                    fr_release(w);
                }
        }
        for (int k = 0; k < 3; k++) {
            fr_release(h[k]);
            fr_release(g[k]);
        }
        fr_release(y[0]);
        fr_release(y[1]);
    }
    fr_st_close(f);
}

int main(void) {
    RUN(test_ops_match_torch);
    RUN(test_squeeze_excitation_matches_torch);
    RUN(test_finite_differences);
    RUN(test_refusals);
    RUN(test_same_shape_agrees);
    RUN(test_folded_kernels_exact);
    RUN(test_cuda_matches_cpu);
    return TEST_SUMMARY();
}
