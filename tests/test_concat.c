/* test_concat.c: concat along channels: values against the definition (a
 * copy has exactly one right answer, so no PyTorch fixture is needed),
 * gradients routed to the inputs that want them, finite differences,
 * channel-slice views, and bad arguments. */
#include <stdlib.h>

#include "testlib.h"

/* out[n, c0 + c, p] == src[n, c, p] for every element of src (any layout). */
static bool is_slice(const fr_tensor *out, const fr_tensor *src, int64_t c0) {
    int64_t n = src->shape[0], c = src->shape[1], hw = fr_numel(src) / (n * c);
    int64_t oc = out->shape[1];
    size_t count = (size_t)fr_numel(src);
    float *s = malloc(count * sizeof *s);
    bool ok = fr_read_f32(src, s, count) == FR_OK;
    const float *o = fr_data_f32(out);
    for (int64_t i = 0; ok && i < n; i++)
        for (int64_t j = 0; j < c; j++)
            for (int64_t p = 0; p < hw; p++)
                ok = ok && o[(i * oc + c0 + j) * hw + p] == s[(i * c + j) * hw + p];
    free(s);
    return ok;
}

static void test_forward_values(void) {
    /* 4-d and (N, C) */
    const int64_t shapes[2][3][4] = {{{2, 2, 2, 3}, {2, 3, 2, 3}, {2, 1, 2, 3}},
                                     {{3, 4, 0, 0}, {3, 1, 0, 0}, {3, 2, 0, 0}}};
    const int ndims[2] = {4, 2};
    for (int s = 0; s < 2; s++) {
        fr_tensor *in[3];
        for (int i = 0; i < 3; i++)
            in[i] = fr_t_rand(FR_CPU, ndims[s], shapes[s][i], 1 + (uint32_t)i);
        fr_tensor *y = fr_concat(in, 3);
        CHECK_NOTNULL(y);
        if (y) {
            CHECK(y->ndim == ndims[s] && y->shape[0] == shapes[s][0][0]);
            CHECK(y->shape[1] == shapes[s][0][1] + shapes[s][1][1] + shapes[s][2][1]);
            CHECK(is_slice(y, in[0], 0));
            CHECK(is_slice(y, in[1], shapes[s][0][1]));
            CHECK(is_slice(y, in[2], shapes[s][0][1] + shapes[s][1][1]));
            CHECK(!y->grad_fn && fr_tape_size() == 0); /* nothing requires grad */
        }
        fr_release(y);
        for (int i = 0; i < 3; i++)
            fr_release(in[i]);
    }
}

/* Gradients go to the inputs that want them, as their slices of dout; the
 * node saves nothing. */
static void test_backward_routes_slices(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 3, 3), 1);
    fr_tensor *b = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 3, 3), 2);
    fr_tensor *c = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 1, 3, 3), 3);
    fr_set_requires_grad(a, true);
    fr_set_requires_grad(c, true);
    fr_tensor *in[3] = {a, b, c};
    fr_tensor *y = fr_concat(in, 3);
    CHECK_NOTNULL(y);
    if (y) {
        CHECK(y->grad_fn && y->grad_fn->n_saved == 0);
        fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 6, 3, 3), 9);
        CHECK_OK(fr_backward_with(y, dy));
        CHECK(a->grad && !b->grad && c->grad);
        if (a->grad && c->grad) {
            CHECK(is_slice(dy, a->grad, 0));
            CHECK(is_slice(dy, c->grad, 5));
        }
        fr_release(dy);
    }
    fr_release(y);
    fr_release(c);
    fr_release(b);
    fr_release(a);
}

typedef struct {
    fr_tensor *in[3];
} concat_case;

static fr_tensor *concat_loss(void *ctx) {
    concat_case *c = ctx;
    fr_tensor *y = fr_concat(c->in, 3);
    fr_tensor *l = y ? fr_t_weighted_sum(y, 31) : NULL;
    fr_release(y);
    return l;
}

static void test_gradcheck(void) {
    concat_case c = {{fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 1, 2, 2), 4),
                      fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 2, 2), 5),
                      fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 2, 2), 6)}};
    for (int i = 0; i < 3; i++)
        fr_set_requires_grad(c.in[i], true);
    fr_tensor *l = concat_loss(&c);
    CHECK_NOTNULL(l);
    if (l) {
        CHECK_OK(fr_backward(l));
        /* linear in the inputs: the difference is exact up to float rounding */
        CHECK(fr_t_gradcheck(concat_loss, &c, c.in, 3, 1e-2, 1e-4, 1e-3, 100));
    }
    fr_release(l);
    for (int i = 0; i < 3; i++)
        fr_release(c.in[i]);
}

/* fr_slice, concat's inverse, on dims 0 and 1: values, finite
 * differences, and the view it replaces refused where a gradient is
 * wanted (fr_narrow's view of a tensor in a graph carried none: a block's
 * channel split lost its gradient silently). */
typedef struct {
    fr_tensor *x;
} slice_case;

static fr_tensor *slice_loss(void *ctx) {
    slice_case *c = ctx;
    fr_tensor *a = fr_slice(c->x, 1, 1, 2), *b = a ? fr_slice(c->x, 0, 1, 2) : NULL;
    fr_tensor *la = b ? fr_t_weighted_sum(a, 41) : NULL, *lb = la ? fr_t_weighted_sum(b, 42) : NULL;
    fr_tensor *l = lb ? fr_add(la, lb) : NULL;
    fr_tensor *all[] = {a, b, la, lb};
    for (int i = 0; i < 4; i++)
        fr_release(all[i]);
    return l;
}

static void test_slice(void) {
    slice_case c = {fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 4, 2, 3), 9)};
    fr_set_requires_grad(c.x, true);
    fr_tensor *s = fr_slice(c.x, 1, 1, 2);
    CHECK(s && s->shape[0] == 3 && s->shape[1] == 2 && s->grad_fn);
    if (s) /* sample 2, channel 1 of the slice = channel 2 of x */
        CHECK(fr_data_f32(s)[(2 * 2 + 1) * 6 + 4] == fr_data_f32(c.x)[(2 * 4 + 2) * 6 + 4]);
    fr_release(s);
    fr_tensor *l = slice_loss(&c);
    CHECK_NOTNULL(l);
    if (l) {
        CHECK_OK(fr_backward(l));
        CHECK(fr_t_gradcheck(slice_loss, &c, &c.x, 1, 1e-2, 1e-4, 1e-3, 100));
    }
    fr_release(l);
    CHECK_ERR(fr_t_status_of(fr_slice(c.x, 2, 0, 1)), FR_ERR_ARG, "narrow: dimension 2");
    /* the view: refused by the first op that would record it */
    fr_tensor *y = fr_scale(c.x, 3.0f);
    fr_tensor *v = fr_narrow(y, 0, 0, 1);
    CHECK_ERR(fr_t_status_of(fr_sum(v)), FR_ERR_GRAPH, "is a view (fr_view or fr_narrow)");
    fr_tensor *d = fr_detach(v); /* a constant on purpose */
    fr_tensor *sd = fr_sum(d);
    CHECK(sd && !sd->requires_grad);
    fr_release(sd);
    fr_release(d);
    fr_release(v);
    fr_release(y);
    fr_tape_clear();
    fr_clear_error();
    fr_release(c.x);
}

/* The tensor-level ops take channel slices of contiguous tensors (what
 * fr_narrow on dim 1 gives) without a copy, and at most one NULL gradient. */
static void test_ops_views_and_null_gradients(void) {
    fr_tensor *base = fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 5, 2, 2), 7);
    fr_tensor *v = fr_narrow(base, 1, 1, 3); /* channels 1..3 of each sample */
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 2, 2, 2), 8);
    fr_tensor *out = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(3, 5, 2, 2), FR_TAG_TRANSIENT);
    fr_tensor *in[2] = {v, w};
    CHECK(!fr_is_contiguous(v));
    CHECK_OK(fr_concat_forward(out, in, 2));
    CHECK(is_slice(out, v, 0));
    CHECK(is_slice(out, w, 3));
    /* backward into a slice view of another tensor, with one NULL slot */
    fr_tensor *dbase = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(3, 5, 2, 2), FR_TAG_TRANSIENT);
    fr_tensor *dv = fr_narrow(dbase, 1, 2, 3);
    fr_tensor *dx[2] = {dv, NULL};
    CHECK_OK(fr_concat_backward(dx, 2, out));
    CHECK(is_slice(dbase, v, 2));
    fr_tensor *dw = fr_empty_like(w, FR_TAG_TRANSIENT);
    fr_tensor *dx2[2] = {NULL, dw};
    CHECK_OK(fr_concat_backward(dx2, 2, out)); /* the NULL slot's channels: 5 - 2 */
    fr_t_allclose_t(dw, w, 0, 0, "dw after a NULL slot");
    fr_tensor *dx3[3] = {NULL, dw, NULL};
    CHECK_ERR(fr_concat_backward(dx3, 3, out), FR_ERR_ARG, "dx[0] and dx[2] are both NULL");
    fr_release(dw);
    fr_release(dv);
    fr_release(dbase);
    fr_release(out);
    fr_release(w);
    fr_release(v);
    fr_release(base);
}

/* A dense block's pattern: features a and b made by ops (so their gradients
 * collect in the tape's slots) and read by two concatenations, y1 = (a, b)
 * and y2 = (b, a), summed. y2's backward runs first and gives a and b their
 * first gradients (copies of its slices); y1's backward then finds both
 * held and adds its slices straight into them, with no copy in between.
 * The gradients are exact (two terms, then a scale by 2), and the transient
 * bytes the backward adds never pass 3 features' worth: a's and b's
 * gradients and one leaf gradient being made (copying y1's slices out
 * first, as the parent did, reached 4). */
static void test_dense_reuse_adds_in_place(void) {
    const int64_t n = 2, c = 2, hw = 3 * 3;
    const size_t feature = (size_t)(n * c * hw) * sizeof(float);
    fr_tensor *x[2], *f[2];
    for (int i = 0; i < 2; i++) {
        x[i] = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, c, 3, 3), 11 + (uint32_t)i);
        fr_set_requires_grad(x[i], true);
        f[i] = fr_scale(x[i], 2.0f);
    }
    fr_tensor *y1 = fr_concat((fr_tensor *[]){f[0], f[1]}, 2);
    fr_tensor *y2 = fr_concat((fr_tensor *[]){f[1], f[0]}, 2);
    fr_tensor *out = y1 && y2 ? fr_add(y1, y2) : NULL;
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, 2 * c, 3, 3), 17);
    CHECK_NOTNULL(out);
    if (out && dy) {
        size_t before = fr_mem_current(FR_CPU, FR_TAG_TRANSIENT);
        fr_mem_reset_peak();
        CHECK_OK(fr_backward_with(out, dy));
        CHECK(fr_mem_peak(FR_CPU, FR_TAG_TRANSIENT) - before == 3 * feature);
        const float *g = fr_data_f32(dy);
        for (int i = 0; i < 2; i++) {
            CHECK_NOTNULL(x[i]->grad);
            if (!x[i]->grad)
                continue;
            const float *d = fr_data_f32(x[i]->grad);
            bool exact = true;
            for (int64_t s = 0; s < n; s++)
                for (int64_t k = 0; k < c * hw; k++) {
                    /* x[i] sits at channel i * c in y1 and (1 - i) * c in y2 */
                    float t = g[(s * 2 * c + (1 - i) * c) * hw + k] + g[(s * 2 * c + i * c) * hw + k];
                    exact = exact && d[s * c * hw + k] == 2.0f * t;
                }
            CHECK(exact);
        }
    }
    fr_release(dy);
    fr_release(out);
    fr_release(y2);
    fr_release(y1);
    for (int i = 0; i < 2; i++) {
        fr_release(f[i]);
        fr_release(x[i]);
    }
}

static void test_bad_arguments(void) {
    fr_tensor *a = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 3, 3), 1);
    fr_tensor *n3 = fr_t_rand(FR_CPU, 4, FR_SHAPE(3, 2, 3, 3), 1);
    fr_tensor *h4 = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 4, 3), 1);
    fr_tensor *flat = fr_t_rand(FR_CPU, 1, FR_SHAPE(6), 1);
    fr_tensor *ints = fr_zeros(FR_CPU, FR_I32, 4, FR_SHAPE(2, 2, 3, 3), FR_TAG_DATA);
    fr_tensor *out5 = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(2, 5, 3, 3), FR_TAG_TRANSIENT);

    CHECK_ERR(fr_t_status_of(fr_concat(NULL, 2)), FR_ERR_ARG, "needs at least one input");
    fr_tensor *in0[1] = {a};
    CHECK_ERR(fr_t_status_of(fr_concat(in0, 0)), FR_ERR_ARG, "needs at least one input, got 0");
    fr_tensor *in_null[2] = {a, NULL};
    CHECK_ERR(fr_t_status_of(fr_concat(in_null, 2)), FR_ERR_ARG, "concat: inputs[1] is NULL");
    fr_tensor *in_n[2] = {a, n3};
    CHECK_ERR(fr_t_status_of(fr_concat(in_n, 2)), FR_ERR_SHAPE,
              "inputs[1] (3, 2, 3, 3) and out (2, 4, 3, 3) must agree in every dimension but the "
              "channels");
    fr_tensor *in_h[2] = {a, h4};
    CHECK_ERR(fr_t_status_of(fr_concat(in_h, 2)), FR_ERR_SHAPE, "inputs[1] (2, 2, 4, 3)");
    fr_tensor *in_flat[2] = {a, flat};
    CHECK_ERR(fr_t_status_of(fr_concat(in_flat, 2)), FR_ERR_SHAPE,
              "inputs[1] has shape (6,), expected (N, C, ...)");
    fr_tensor *in_i[2] = {a, ints};
    CHECK_ERR(fr_t_status_of(fr_concat(in_i, 2)), FR_ERR_DTYPE, "inputs[1] must be f32, f16 or bf16, got i32");
    fr_tensor *in_aa[2] = {a, a};
    CHECK_ERR(fr_concat_forward(out5, in_aa, 2), FR_ERR_SHAPE,
              "the inputs have 4 channels in all but out (2, 5, 3, 3) has 5");
    fr_tensor *dx[2] = {a, a};
    CHECK_ERR(fr_concat_backward(dx, 2, out5), FR_ERR_SHAPE,
              "the gradients have 4 channels in all but dout (2, 5, 3, 3) has 5");
    fr_clear_error(); /* none pending: the NULL itself is the error (docs/ARCHITECTURE.md, "Errors") */
    CHECK_ERR(fr_concat_backward(dx, 2, NULL), FR_ERR_ARG, "dout is NULL");
    CHECK(fr_tape_size() == 0);

    fr_release(out5);
    fr_release(ints);
    fr_release(flat);
    fr_release(h4);
    fr_release(n3);
    fr_release(a);
}

int main(void) {
    RUN(test_forward_values);
    RUN(test_backward_routes_slices);
    RUN(test_gradcheck);
    RUN(test_slice);
    RUN(test_ops_views_and_null_gradients);
    RUN(test_dense_reuse_adds_in_place);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
