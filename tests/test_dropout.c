/* test_dropout.c: dropout's mask, scaling, gradient, determinism, and its
 * replay under checkpointing; CUDA draws the CPU's mask. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define N 100000

static void test_mask_rate_and_scale(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 1);
    fr_manual_seed(42);
    fr_tensor *y = fr_dropout(x, 0.3f, true);
    CHECK_NOTNULL(y);
    if (!y) {
        fr_release(x);
        return;
    }
    const float *xs = fr_data_f32(x), *ys = fr_data_f32(y);
    int zeros = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        if (ys[i] == 0.0f && xs[i] != 0.0f)
            zeros++;
        else if (ys[i] != xs[i] * (1.0f / 0.7f))
            bad++;
    }
    CHECK(bad == 0);
    /* binomial(1e5, 0.3): std 145, so +-1000 is ~7 std */
    CHECK(abs(zeros - 30000) < 1000);
    /* eval mode and p = 0 are the identity (the same tensor) */
    fr_tensor *e = fr_dropout(x, 0.3f, false), *z = fr_dropout(x, 0.0f, true);
    CHECK(e == x && z == x);
    CHECK_ERR(fr_t_status_of(fr_dropout(x, 1.0f, true)), FR_ERR_ARG, "p must be in [0, 1)");
    CHECK_ERR(fr_t_status_of(fr_dropout(x, -0.1f, true)), FR_ERR_ARG, "got -0.1");
    fr_release(e);
    fr_release(z);
    fr_release(y);
    fr_release(x);
}

static void test_seeded_and_fresh_masks(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(1000), 2);
    fr_manual_seed(7);
    fr_tensor *a = fr_dropout(x, 0.5f, true), *b = fr_dropout(x, 0.5f, true);
    fr_manual_seed(7);
    fr_tensor *c = fr_dropout(x, 0.5f, true);
    CHECK(a && b && c);
    if (a && b && c) {
        CHECK(!memcmp(fr_data(a), fr_data(c), fr_nbytes(a))); /* same seed, same mask */
        CHECK(memcmp(fr_data(a), fr_data(b), fr_nbytes(a)));  /* next call, new mask */
    }
    fr_release(a);
    fr_release(b);
    fr_release(c);
    fr_release(x);
}

/* dy/dx is the mask / (1 - p): with y = dropout(x), loss = sum(y * r),
 * dx = r * mask / (1 - p); and nothing is saved for backward. */
static void test_gradient_and_nothing_saved(void) {
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(4096), 3);
    fr_set_requires_grad(w, true);
    fr_manual_seed(9);
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *h = fr_scale(w, 1.0f);
    fr_tensor *y = fr_dropout(h, 0.25f, true);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == saved0);
    fr_tensor *loss = fr_t_weighted_sum(y, 5);
    float ys[4096], hs[4096], r[4096], want[4096];
    fr_read_f32(y, ys, 4096);
    fr_read_f32(h, hs, 4096);
    CHECK_OK(fr_backward(loss));
    fr_t_fill_rand(r, 4096, 5);
    for (int i = 0; i < 4096; i++)
        want[i] = ys[i] != 0.0f || hs[i] == 0.0f ? r[i] * (1.0f / 0.75f) : 0.0f;
    fr_t_allclose(w->grad, want, 4096, 0, 0, "dx");
    fr_release(loss);
    fr_release(y);
    fr_release(h);
    fr_release(w);
}

/* A segment with dropout replayed by checkpointing draws the same masks: the
 * gradients equal the un-checkpointed run's bit for bit. */
typedef struct {
    fr_tensor *w;
} seg_ctx;

static fr_tensor *segment(void *ctx, fr_tensor *x) {
    seg_ctx *s = ctx;
    fr_tensor *a = fr_mul(x, s->w);
    fr_tensor *b = a ? fr_dropout(a, 0.4f, true) : NULL;
    fr_release(a);
    fr_tensor *c = b ? fr_mul(b, s->w) : NULL;
    fr_release(b);
    fr_tensor *d = c ? fr_dropout(c, 0.2f, true) : NULL;
    fr_release(c);
    return d;
}

static void test_checkpoint_replays_the_masks(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(2048), 4);
    fr_tensor *w = fr_t_rand(FR_CPU, 1, FR_SHAPE(2048), 6);
    fr_set_requires_grad(w, true);
    seg_ctx s = {w};
    float grads[2][2048];
    float losses[2];
    for (int ck = 0; ck < 2; ck++) {
        fr_manual_seed(123);
        fr_tensor *y = ck ? fr_checkpoint(segment, &s, sizeof s, x) : segment(&s, x);
        /* a dropout after the segment moves the stream on before backward */
        fr_tensor *z = y ? fr_dropout(y, 0.1f, true) : NULL;
        fr_tensor *loss = z ? fr_t_weighted_sum(z, 8) : NULL;
        CHECK_NOTNULL(loss);
        losses[ck] = loss ? fr_item(loss) : 0;
        CHECK_OK(fr_backward(loss));
        fr_read_f32(w->grad, grads[ck], 2048);
        fr_zero_grad(w);
        fr_release(loss);
        fr_release(z);
        fr_release(y);
    }
    CHECK(losses[0] == losses[1]);
    CHECK(!memcmp(grads[0], grads[1], sizeof grads[0]));
    fr_release(w);
    fr_release(x);
}

static void test_cuda_draws_the_cpu_mask(void) {
    if (!fr_t_have_cuda())
        SKIP("no CUDA device");
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(N), 7);
    fr_tensor *xd = fr_to_device(x, FR_CUDA, FR_TAG_DATA);
    fr_manual_seed(11);
    fr_tensor *y = fr_dropout(x, 0.3f, true);
    fr_manual_seed(11);
    fr_tensor *yd = xd ? fr_dropout(xd, 0.3f, true) : NULL;
    fr_t_allclose_t(yd, y, 0, 0, "cuda dropout vs cpu");
    fr_release(yd);
    fr_release(y);
    fr_release(xd);
    fr_release(x);
}

int main(void) {
    RUN(test_mask_rate_and_scale);
    RUN(test_seeded_and_fresh_masks);
    RUN(test_gradient_and_nothing_saved);
    RUN(test_checkpoint_replays_the_masks);
    RUN(test_cuda_draws_the_cpu_mask);
    return TEST_SUMMARY();
}
