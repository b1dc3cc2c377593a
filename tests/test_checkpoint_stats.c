/* test_checkpoint_stats.c: a checkpointed segment's replay takes each fused
 * BN's batch statistics from the segment's first forward
 * (autograd/checkpoint_log.h) instead of computing them again, and the
 * step is bit for bit the one without checkpointing: outputs, every
 * gradient and the running statistics (updated once). Also when one
 * checkpoint runs inside another's segment, whose replay then runs the
 * inner checkpoint's forward from the outer log.
 *
 * Tolerance: none; same bits (the same kernels on the same values). */
#include "testlib.h"

#include "autograd/checkpoint_log.h"

enum { N = 4, C = 6, H = 8 };

typedef struct {
    fr_tensor *w1, *w2; /* (C, C, 3, 3) */
    fr_tensor *gamma[2], *beta[2], *rmean[2], *rvar[2]; /* (C) each */
} net;

static void net_new(net *t) {
    t->w1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 3, 3), 11);
    t->w2 = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 3, 3), 12);
    fr_set_requires_grad(t->w1, true);
    fr_set_requires_grad(t->w2, true);
    for (int i = 0; i < 2; i++) {
        t->gamma[i] = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 20 + (uint32_t)i);
        t->beta[i] = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 30 + (uint32_t)i);
        fr_set_requires_grad(t->gamma[i], true);
        fr_set_requires_grad(t->beta[i], true);
        t->rmean[i] = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
        t->rvar[i] = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
    }
}

static void net_free(net *t) {
    fr_release(t->w1);
    fr_release(t->w2);
    for (int i = 0; i < 2; i++) {
        fr_tensor *all[] = {t->gamma[i], t->beta[i], t->rmean[i], t->rvar[i]};
        for (int j = 0; j < 4; j++)
            fr_release(all[j]);
    }
}

static fr_tensor *norm(net *t, int i, fr_tensor *x) {
    fr_bn_state s = {.gamma = t->gamma[i], .beta = t->beta[i], .running_mean = t->rmean[i],
                     .running_var = t->rvar[i], .momentum = 0.1f, .eps = 1e-5f,
                     .training = true};
    return fr_bn_act(x, NULL, &s, FR_ACT_RELU, 0.0f, FR_BNACT_KEEP);
}

/* conv2 then norm 1: the inner part (ctx: a pointer to the net) */
static fr_tensor *inner(void *ctx, fr_tensor *x) {
    net *t = *(net **)ctx;
    fr_tensor *h = fr_conv2d(x, t->w2, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    return h ? fr_chain(h, norm(t, 1, h)) : NULL;
}

typedef enum { PLAIN, CHECKPOINT, NESTED } form;

typedef struct {
    net *t;
    form f;
} seg_ctx;

/* conv1, norm 0, then the inner part: itself checkpointed under NESTED */
static fr_tensor *segment(void *ctx, fr_tensor *x) {
    const seg_ctx *s = ctx;
    net *t = s->t;
    fr_tensor *h = fr_conv2d(x, t->w1, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    h = h ? fr_chain(h, norm(t, 0, h)) : NULL;
    if (h && s->f == NESTED)
        return fr_chain(h, fr_checkpoint(inner, &t, sizeof t, h));
    return h ? fr_chain(h, inner(&t, h)) : NULL;
}

typedef struct {
    fr_tensor *y, *dx, *grads[6], *rstats[4];
    long taken;
} result;

static result run(form f, fr_tensor *x0) {
    net t;
    net_new(&t);
    result r = {0};
    fr_tensor *x = fr_detach(x0);
    fr_set_requires_grad(x, true);
    long before = fr_checkpoint_stats_taken();
    seg_ctx s = {.t = &t, .f = f};
    fr_tensor *y = f == PLAIN ? segment(&s, x) : fr_checkpoint(segment, &s, sizeof s, x);
    CHECK_NOTNULL(y);
    fr_tensor *loss = y ? fr_sum(y) : NULL;
    if (loss)
        CHECK_OK(fr_backward(loss));
    r.taken = fr_checkpoint_stats_taken() - before;
    r.y = y ? fr_detach(y) : NULL;
    r.dx = fr_retain(x->grad);
    fr_tensor *leaves[6] = {t.w1, t.w2, t.gamma[0], t.beta[0], t.gamma[1], t.beta[1]};
    for (int i = 0; i < 6; i++)
        r.grads[i] = fr_retain(leaves[i]->grad);
    for (int i = 0; i < 2; i++) {
        r.rstats[2 * i] = fr_retain(t.rmean[i]);
        r.rstats[2 * i + 1] = fr_retain(t.rvar[i]);
    }
    fr_release(loss);
    fr_release(y);
    fr_release(x);
    net_free(&t);
    return r;
}

static void result_free(result *r) {
    fr_release(r->y);
    fr_release(r->dx);
    for (int i = 0; i < 6; i++)
        fr_release(r->grads[i]);
    for (int i = 0; i < 4; i++)
        fr_release(r->rstats[i]);
}

static void same(const result *a, const result *b) {
    CHECK(a->y && b->y && fr_t_same_bits(a->y, b->y));
    CHECK(a->dx && b->dx && fr_t_same_bits(a->dx, b->dx));
    for (int i = 0; i < 6; i++)
        CHECK(a->grads[i] && b->grads[i] && fr_t_same_bits(a->grads[i], b->grads[i]));
    for (int i = 0; i < 4; i++)
        CHECK(fr_t_same_bits(a->rstats[i], b->rstats[i]));
}

/* The step under form f against the plain one on the same input: the same
 * bits, and the statistics the replays took (plain: none). */
static void against_plain(form f, uint32_t seed, long want_taken) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), seed);
    result plain = run(PLAIN, x), other = run(f, x);
    same(&plain, &other);
    CHECK(plain.taken == 0);
    CHECK(other.taken == want_taken);
    result_free(&plain);
    result_free(&other);
    fr_release(x);
}

/* Both norms of the segment take their statistics in the replay. */
static void test_replay_takes_the_forward_statistics(void) { against_plain(CHECKPOINT, 7, 2); }

/* The outer replay takes both (norm 1 inside the inner checkpoint's
 * forward, which keeps it again), the inner replay norm 1 once more. */
static void test_nested_checkpoint(void) { against_plain(NESTED, 8, 3); }

/* Two forwards before one backward each keep their own statistics: the
 * second batch's must not reach the first one's replay. */
static void test_two_forwards_keep_their_own(void) {
    fr_tensor *xa = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 9);
    fr_tensor *xb = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 10);
    result pa = run(PLAIN, xa);
    net t;
    net_new(&t);
    seg_ctx s = {.t = &t, .f = CHECKPOINT};
    fr_tensor *a = fr_detach(xa), *b = fr_detach(xb);
    fr_set_requires_grad(a, true);
    fr_tensor *ya = fr_checkpoint(segment, &s, sizeof s, a);
    fr_tensor *yb = fr_checkpoint(segment, &s, sizeof s, b);
    CHECK_NOTNULL(ya);
    CHECK_NOTNULL(yb);
    fr_tensor *loss = ya ? fr_sum(ya) : NULL;
    long before = fr_checkpoint_stats_taken();
    if (loss)
        CHECK_OK(fr_backward(loss));
    CHECK(fr_checkpoint_stats_taken() - before == 2);
    CHECK(a->grad && pa.dx && fr_t_same_bits(a->grad, pa.dx));
    fr_tensor *mine[6] = {t.w1, t.w2, t.gamma[0], t.beta[0], t.gamma[1], t.beta[1]};
    for (int i = 0; i < 6; i++)
        CHECK(mine[i]->grad && fr_t_same_bits(mine[i]->grad, pa.grads[i]));
    fr_release(loss);
    fr_release(ya);
    fr_release(yb);
    fr_tape_clear();
    fr_release(a);
    fr_release(b);
    net_free(&t);
    result_free(&pa);
    fr_release(xa);
    fr_release(xb);
}

/* A segment whose input was kept as compressed codes (compress:8) replays
 * on their decoding, whose statistics are not the forward's: none is taken
 * (taking them changed every gradient of checkpoint+compress:8). The input
 * is a computed (transient) tensor, which compression takes. */
static void test_compressed_input_computes_again(void) {
    fr_tensor *x0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 13);
    net t;
    net_new(&t);
    seg_ctx s = {.t = &t, .f = CHECKPOINT};
    fr_tensor *x = fr_detach(x0);
    fr_set_requires_grad(x, true);
    fr_tensor *in = fr_scale(x, 2.0f);
    CHECK_NOTNULL(in);
    int previous;
    CHECK_OK(fr_compress_enter(8, &previous));
    size_t saved0 = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *y = in ? fr_checkpoint(segment, &s, sizeof s, in) : NULL;
    /* the segment's input is held as 8-bit codes, not as its f32 bytes */
    size_t kept = fr_mem_current(FR_CPU, FR_TAG_SAVED) - saved0;
    fr_compress_restore(previous);
    CHECK_NOTNULL(y);
    CHECK(kept > 0 && kept < (size_t)fr_nbytes(x0) / 2);
    fr_tensor *loss = y ? fr_sum(y) : NULL;
    long before = fr_checkpoint_stats_taken();
    if (loss)
        CHECK_OK(fr_backward(loss));
    CHECK(fr_checkpoint_stats_taken() == before);
    CHECK(x->grad != NULL);
    fr_release(loss);
    fr_release(y);
    fr_release(in);
    fr_release(x);
    net_free(&t);
    fr_release(x0);
}

/* A norm the segment runs twice (one gamma, one shape) computes its
 * statistics again in the replay: which call an entry belongs to is not
 * certain once the replay passes one over. The step stays plain's. */
static fr_tensor *shared_segment(void *ctx, fr_tensor *x) {
    net *t = *(net **)ctx;
    fr_tensor *h = fr_conv2d(x, t->w1, NULL, (fr_conv_params){.stride = 1, .pad = 1});
    h = h ? fr_chain(h, norm(t, 0, h)) : NULL;
    h = h ? fr_chain(h, fr_conv2d(h, t->w2, NULL, (fr_conv_params){.stride = 1, .pad = 1})) : NULL;
    return h ? fr_chain(h, norm(t, 0, h)) : NULL;
}

static void test_norm_run_twice_computes_again(void) {
    fr_tensor *x0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 14);
    fr_tensor *grads[2][3] = {{0}};
    for (int ck = 0; ck < 2; ck++) {
        net t;
        net_new(&t);
        net *tp = &t;
        fr_tensor *x = fr_detach(x0);
        fr_set_requires_grad(x, true);
        long before = fr_checkpoint_stats_taken();
        fr_tensor *y = ck ? fr_checkpoint(shared_segment, &tp, sizeof tp, x) : shared_segment(&tp, x);
        CHECK_NOTNULL(y);
        fr_tensor *loss = y ? fr_sum(y) : NULL;
        if (loss)
            CHECK_OK(fr_backward(loss));
        CHECK(fr_checkpoint_stats_taken() == before);
        grads[ck][0] = fr_retain(x->grad);
        grads[ck][1] = fr_retain(t.w2->grad);
        grads[ck][2] = fr_retain(t.gamma[0]->grad);
        fr_release(loss);
        fr_release(y);
        fr_release(x);
        net_free(&t);
    }
    for (int i = 0; i < 3; i++) {
        CHECK(grads[0][i] && grads[1][i] && fr_t_same_bits(grads[0][i], grads[1][i]));
        fr_release(grads[0][i]);
        fr_release(grads[1][i]);
    }
    fr_release(x0);
}

int main(void) {
    RUN(test_replay_takes_the_forward_statistics);
    RUN(test_nested_checkpoint);
    RUN(test_two_forwards_keep_their_own);
    RUN(test_compressed_input_computes_again);
    RUN(test_norm_run_twice_computes_again);
    return TEST_SUMMARY();
}
