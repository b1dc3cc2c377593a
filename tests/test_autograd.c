/* test_autograd.c: the tape engine: eager freeing (exact ledger bytes),
 * no_grad, gradient routing and accumulation, version checks, recipes, and
 * graph errors. Op-specific gradients are tested in each op family's file. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define N 256

/* x * w * w * ... (k factors of w); each product saves both its inputs. */
static fr_tensor *power_chain(fr_tensor *x, fr_tensor *w, int k) {
    fr_tensor *h = fr_retain(x);
    for (int i = 0; i < k && h; i++) {
        fr_tensor *next = fr_mul(h, w);
        fr_release(h);
        h = next;
    }
    return h;
}

static size_t saved_trace[8192];
static int n_trace;
static void trace_saved(void *user, fr_device dev, const fr_mem_stats *now) {
    (void)user;
    if (dev == FR_CPU && n_trace < 8192)
        saved_trace[n_trace++] = now->current[FR_TAG_SAVED];
}

static void test_backward_frees_eagerly_and_completely(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 1);
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 2);
    fr_set_requires_grad(w, true);
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    size_t trans0 = fr_mem_current(FR_CPU, FR_TAG_TRANSIENT);
    fr_tensor *h = power_chain(x, w, 5);
    fr_tensor *loss = fr_sum(h);
    fr_release(h);
    /* h1..h4 are held for backward (x and w stay data/parameters); the only
     * transient left is the loss itself. */
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) - saved0 == 4 * N * sizeof(float));
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) - trans0 == sizeof(float));
    CHECK(fr_tape_size() == 6);
    n_trace = 0;
    fr_mem_set_trace(trace_saved, NULL);
    CHECK_OK(fr_backward(loss));
    fr_mem_set_trace(NULL, NULL);
    /* eager: saved bytes only ever fall during backward */
    CHECK(n_trace > 4);
    for (int i = 1; i < n_trace; i++)
        CHECK(saved_trace[i] <= saved_trace[i - 1]);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) - trans0 == sizeof(float)); /* loss */
    CHECK(fr_mem_current(FR_CPU, FR_TAG_GRAD) == N * sizeof(float));
    CHECK(fr_tape_size() == 0);
    /* d/dw sum(x w^5) = 5 x w^4 */
    float want[N], xs[N], ws[N];
    fr_read_f32(x, xs, N);
    fr_read_f32(w, ws, N);
    for (int i = 0; i < N; i++)
        want[i] = 5.0f * xs[i] * ws[i] * ws[i] * ws[i] * ws[i];
    fr_t_allclose(w->grad, want, N, 1e-6, 1e-5, "dw");
    fr_release(loss);
    fr_release(x);
    fr_release(w);
}

static void test_no_grad_records_nothing(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 3);
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 4);
    fr_set_requires_grad(w, true);
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_no_grad_enter();
    fr_no_grad_enter(); /* nestable */
    fr_no_grad_exit();
    CHECK(!fr_grad_enabled());
    fr_tensor *h = power_chain(x, w, 5);
    CHECK(fr_tape_size() == 0);
    CHECK(h && !h->requires_grad);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0);
    fr_no_grad_exit();
    CHECK(fr_grad_enabled());
    fr_tensor *loss = fr_sum(h);
    CHECK_ERR(fr_backward(loss), FR_ERR_GRAPH, "does not require grad");
    fr_release(loss);
    fr_release(h);
    fr_release(x);
    fr_release(w);
}

/* p = 2w, q = 3w, z = p + q: z's gradient reaches p and q as the same tensor;
 * q then receives a second contribution, which must not leak into p's. */
static void test_shared_gradients_do_not_alias(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 5);
    fr_set_requires_grad(w, true);
    fr_tensor *r1 = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 6), *r2 = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 7);
    fr_tensor *p = fr_scale(w, 2.0f), *q = fr_scale(w, 3.0f);
    fr_tensor *z = fr_add(p, q);
    fr_tensor *a = fr_mul(z, r1), *b = fr_mul(q, r2);
    fr_tensor *la = fr_sum(a), *lb = fr_sum(b);
    fr_tensor *loss = fr_add(la, lb);
    CHECK_OK(fr_backward(loss));
    float g1[N], g2[N], want[N];
    fr_read_f32(r1, g1, N);
    fr_read_f32(r2, g2, N);
    for (int i = 0; i < N; i++)
        want[i] = 5.0f * g1[i] + 3.0f * g2[i];
    fr_t_allclose(w->grad, want, N, 1e-6, 1e-6, "dw");
    fr_tensor *all[] = {w, r1, r2, p, q, z, a, b, la, lb, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void test_gradients_accumulate_across_backwards(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(8), 8);
    fr_set_requires_grad(w, true);
    for (int step = 0; step < 2; step++) {
        fr_tensor *l = fr_sum(w);
        CHECK_OK(fr_backward(l));
        fr_release(l);
    }
    float want[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    fr_t_allclose(w->grad, want, 8, 0, 0, "accumulated grad");
    fr_zero_grad(w);
    CHECK(w->grad == NULL);
    fr_release(w);
}

static void test_version_check_names_both_ops(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 9);
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 10);
    fr_set_requires_grad(w, true);
    fr_tensor *a = fr_scale(w, 1.5f);       /* non-leaf */
    fr_tensor *y = fr_mul(a, w);            /* saves a for w's gradient */
    fr_tensor *a2 = fr_scale_(a, 2.0f);     /* overwrites what mul saved */
    fr_tensor *loss = fr_sum(y);
    CHECK_ERR(fr_backward(loss), FR_ERR_VERSION, "backward of mul");
    CHECK(strstr(fr_last_error(), "scale_") != NULL);
    CHECK(strstr(fr_last_error(), "saved at version 0, now version 1") != NULL);
    CHECK(w->grad == NULL); /* no silent wrong gradient */
    /* the loss's graph is gone; scale_'s node (a2's graph, which the loss
     * does not reach) is still pending */
    CHECK(fr_tape_size() == 1);
    fr_tape_clear();
    fr_tensor *all[] = {x, w, a, y, a2, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static void test_inplace_on_leaf_is_refused(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 11);
    fr_set_requires_grad(w, true);
    CHECK_ERR(fr_t_status_of(fr_scale_(w, 2.0f)), FR_ERR_ARG, "leaf that requires grad");
    /* under no_grad it is an ordinary write (an optimizer step) */
    fr_no_grad_enter();
    fr_tensor *same = fr_scale_(w, 2.0f);
    fr_no_grad_exit();
    CHECK(same == w);
    fr_release(same);
    fr_release(w);
}

/* An in-place write through a view (or into the base of one) while
 * recording: refused. It had been recorded against the written tensor only,
 * and sum(y) after scaling a reshape of y by 2 gave dL/dw 3 instead of 6. */
static void test_inplace_through_a_view_is_refused(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 2), 12);
    fr_set_requires_grad(w, true);
    fr_tensor *y = fr_scale(w, 3.0f);
    fr_tensor *r = fr_reshape(y, 1, FR_SHAPE(4));
    CHECK_NOTNULL(r);
    uint64_t v = y->storage->version;
    CHECK_ERR(fr_t_status_of(fr_scale_(r, 2.0f)), FR_ERR_ARG, "another tensor shares");
    CHECK_ERR(fr_t_status_of(fr_relu_(y)), FR_ERR_ARG, "another tensor shares");
    CHECK_ERR(fr_t_status_of(fr_add_(y, y)), FR_ERR_ARG, "another tensor shares");
    CHECK(y->storage->version == v); /* refused before writing */
    fr_release(r);
    /* alone again: the write is recorded, and the gradient is 6 */
    fr_tensor *same = fr_scale_(y, 2.0f);
    CHECK(same == y);
    fr_release(same);
    fr_tensor *loss = fr_sum(y);
    CHECK_OK(fr_backward(loss));
    CHECK(w->grad && fr_data_f32(w->grad)[0] == 6.0f);
    fr_release(loss);
    fr_release(y);
    fr_release(w);
    fr_tape_clear();
}

static void test_graph_errors(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(4), 12);
    fr_set_requires_grad(w, true);
    fr_tensor *y = fr_scale(w, 2.0f);
    CHECK_ERR(fr_backward(y), FR_ERR_GRAPH, "one element");
    fr_tensor *l = fr_sum(y);
    CHECK_OK(fr_backward(l));
    CHECK_ERR(fr_backward(l), FR_ERR_GRAPH, "already freed");
    /* a tensor from the freed graph cannot feed a new recorded op */
    CHECK_ERR(fr_t_status_of(fr_scale(y, 1.0f)), FR_ERR_GRAPH, "already");
    fr_tensor *d = fr_detach(y);
    fr_tensor *ok = d ? fr_scale(d, 1.0f) : NULL;
    CHECK(ok && !ok->requires_grad);
    fr_release(ok);
    fr_release(d);
    fr_release(l);
    fr_release(y);
    fr_release(w);
}

/* A hand-written op y = x^2 whose saved input is a recipe: it keeps only a
 * pointer to a leaf and rebuilds x in backward. */
typedef struct {
    fr_recipe base;
    fr_tensor *source;
    int *calls;
} square_recipe;

static fr_tensor *rebuild_x(fr_recipe *self) {
    square_recipe *r = (square_recipe *)self;
    (*r->calls)++;
    return fr_scale(r->source, 1.0f);
}

static void free_recipe(fr_recipe *self) {
    square_recipe *r = (square_recipe *)self;
    fr_release(r->source);
    free(r);
}

static fr_status square_backward(fr_node *node, fr_tensor *const *dout, fr_tensor **din) {
    fr_tensor *x = fr_node_unpack(node, 0);
    if (!x)
        return fr_last_status();
    fr_tensor *two_x = fr_empty_like(x, FR_TAG_TRANSIENT);
    din[0] = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_status st = fr_scale_out(two_x, x, 2.0f);
    if (st == FR_OK)
        st = fr_mul_out(din[0], dout[0], two_x);
    fr_release(two_x);
    fr_release(x);
    return st;
}

static void test_recipe_saved_tensor_is_recomputed(void) {
    int calls = 0;
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 13);
    fr_set_requires_grad(w, true);
    fr_tensor *y = fr_empty_like(w, FR_TAG_TRANSIENT);
    fr_mul_out(y, w, w);
    fr_node *node = fr_node_new("square", square_backward, 1, &w, 1);
    CHECK_NOTNULL(node);
    square_recipe *r = malloc(sizeof *r);
    r->base = (fr_recipe){.refcount = 1, .op = "test", .make = rebuild_x, .destroy = free_recipe};
    r->source = fr_retain(w);
    r->calls = &calls;
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    CHECK(fr_node_save_recipe(node, &r->base) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0); /* a recipe holds no activation */
    fr_node_set_output(node, 0, y);
    fr_tensor *loss = fr_sum(y);
    CHECK_OK(fr_backward(loss));
    CHECK(calls == 1);
    float ws[N], want[N];
    fr_read_f32(w, ws, N);
    for (int i = 0; i < N; i++)
        want[i] = 2.0f * ws[i];
    fr_t_allclose(w->grad, want, N, 0, 1e-7, "d(x^2)/dx");
    fr_release(loss);
    fr_release(y);
    fr_release(w);
}

/* The foundation issue's ledger test: a no_grad forward through a 20-conv
 * chain peaks at no more than the weights plus the three largest activations,
 * while with grad on every activation is held until backward frees it. */
#define CHAIN 20
static void test_conv_chain_no_grad_vs_grad(void) {
    const int64_t n = 2, c = 8, hw = 16;
    size_t act = (size_t)(n * c * hw * hw) * sizeof(float);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, hw, hw), 20);
    fr_tensor *w[CHAIN];
    size_t weight_bytes = 0;
    for (int i = 0; i < CHAIN; i++) {
        fr_tensor *r = fr_t_rand(FR_CPU, 4, FR_SHAPE(c, c, 3, 3), 100 + (uint32_t)i);
        w[i] = fr_empty_like(r, FR_TAG_PARAM);
        fr_copy_(w[i], r);
        fr_scale_out(w[i], w[i], 0.2f); /* keeps activations O(1) */
        fr_release(r);
        fr_set_requires_grad(w[i], true);
        weight_bytes += fr_nbytes(w[i]);
    }
    fr_conv_params p = {.stride = 1, .pad = 1};
    for (int grad_on = 0; grad_on < 2; grad_on++) {
        size_t base = fr_mem_total_current(FR_CPU);
        size_t act0 = fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) + fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_mem_reset_peak();
        if (!grad_on)
            fr_no_grad_enter();
        fr_tensor *h = fr_retain(x);
        for (int i = 0; i < CHAIN && h; i++) {
            fr_tensor *next = fr_conv2d(h, w[i], NULL, p);
            CHECK_NOTNULL(next);
            fr_release(h);
            h = next;
        }
        if (!grad_on) {
            fr_no_grad_exit();
            fr_mem_stats s;
            fr_mem_get_stats(FR_CPU, &s);
            size_t act_peak = s.peak[FR_TAG_TRANSIENT] + s.peak[FR_TAG_SAVED] - act0;
            CHECK(act_peak <= 3 * act);
            CHECK(s.total_peak - base <= 3 * act + s.peak[FR_TAG_WORKSPACE]);
            CHECK(base >= weight_bytes); /* the weights were already counted */
            CHECK(fr_tape_size() == 0);
        } else {
            /* every conv input but the data batch is held: 19 activations */
            CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == (CHAIN - 1) * act);
            fr_tensor *loss = h ? fr_sum(h) : NULL;
            CHECK_OK(fr_backward(loss));
            fr_release(loss);
            CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
            for (int i = 0; i < CHAIN; i++)
                CHECK(w[i]->grad != NULL);
        }
        fr_release(h);
        CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);
    }
    CHECK(fr_mem_current(FR_CPU, FR_TAG_GRAD) == weight_bytes);
    for (int i = 0; i < CHAIN; i++)
        fr_release(w[i]);
    fr_release(x);
}

int main(void) {
    RUN(test_backward_frees_eagerly_and_completely);
    RUN(test_no_grad_records_nothing);
    RUN(test_shared_gradients_do_not_alias);
    RUN(test_gradients_accumulate_across_backwards);
    RUN(test_version_check_names_both_ops);
    RUN(test_inplace_on_leaf_is_refused);
    RUN(test_inplace_through_a_view_is_refused);
    RUN(test_graph_errors);
    RUN(test_recipe_saved_tensor_is_recomputed);
    RUN(test_conv_chain_no_grad_vs_grad);
    return TEST_SUMMARY();
}
