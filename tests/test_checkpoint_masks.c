/* test_checkpoint_masks.c: under compress:B a checkpointed segment whose
 * input is kept as codes replays on their decoding; its ReLU masks are the
 * ones its forward kept (autograd/checkpoint_log.h), not rebuilt from the
 * decoded values, where every element near zero could flip. Segments of
 * sign-only activations and exact ops (scaling, adding a constant) then
 * give plain's input gradient bit for bit at compress:2, the coarsest
 * codes, also when a checkpoint runs inside another's segment; the ledger
 * holds exactly the codes and the masks between forward and backward.
 *
 * Tolerance: none (the masks are exact; everything else in the segments
 * is exact arithmetic on them). */
#include "testlib.h"

#include "autograd/checkpoint_log.h"
#include "models/resnet.h"

enum { N = 2, C = 3, H = 10 };

static fr_tensor *shift; /* a constant (-0.25 everywhere) added inside a segment */
static bool use_sigmoid; /* the replay of test_replay_of_other_ops runs another op */

/* relu(3 * leaky_relu(x, 0.1)): two masks */
static fr_tensor *two_masks(void *ctx, fr_tensor *x) {
    (void)ctx;
    if (use_sigmoid)
        return fr_sigmoid(x);
    fr_tensor *h = fr_leaky_relu(x, 0.1f);
    h = h ? fr_chain(h, fr_scale(h, 3.0f)) : NULL;
    return h ? fr_chain(h, fr_relu(h)) : NULL;
}

/* relu(x + shift): one mask */
static fr_tensor *inner(void *ctx, fr_tensor *x) {
    (void)ctx;
    fr_tensor *h = fr_add(x, shift);
    return h ? fr_chain(h, fr_relu(h)) : NULL;
}

/* inner(relu(x)), the inner part checkpointed when *ctx */
static fr_tensor *outer(void *ctx, fr_tensor *x) {
    bool nested = *(const bool *)ctx;
    fr_tensor *h = fr_relu(x);
    if (!h)
        return NULL;
    return fr_chain(h, nested ? fr_checkpoint(inner, NULL, 0, h) : inner(NULL, h));
}

/* sum(fn(2 x)) for a new leaf x (*leaf) of x0's values (2 x: a computed
 * tensor, which compression takes), fn checkpointed under compress:bits
 * when bits > 0 (entered for the forward only: the replay runs under its
 * forward's bits). */
static fr_tensor *forward_loss(fr_segment_fn fn, const void *ctx, size_t size, int bits,
                               fr_tensor *x0, fr_tensor **leaf) {
    fr_tensor *x = fr_detach(x0);
    fr_set_requires_grad(x, true);
    fr_tensor *in = fr_scale(x, 2.0f);
    int previous = 0;
    CHECK_OK(fr_compress_enter(bits, &previous));
    fr_tensor *y = !in ? NULL : bits ? fr_checkpoint(fn, ctx, size, in) : fn((void *)ctx, in);
    fr_compress_restore(previous);
    fr_release(in);
    CHECK_NOTNULL(y);
    fr_tensor *loss = y ? fr_sum(y) : NULL;
    fr_release(y);
    *leaf = x;
    return loss;
}

/* Backward from loss: how many masks the replays took. */
static long backward_taking(fr_tensor *loss, bool retain) {
    long before = fr_checkpoint_masks_taken();
    if (loss)
        CHECK_OK(fr_backward_with_options(loss, NULL, &(fr_backward_options){.retain_graph = retain}));
    return fr_checkpoint_masks_taken() - before;
}

/* x's gradient from forward_loss; *taken: masks the replays took. */
static fr_tensor *input_grad(fr_segment_fn fn, const void *ctx, size_t size, int bits,
                             fr_tensor *x0, long *taken) {
    fr_tensor *x, *loss = forward_loss(fn, ctx, size, bits, x0, &x);
    *taken = backward_taking(loss, false);
    fr_tensor *dx = fr_retain(x->grad);
    fr_release(loss);
    fr_release(x);
    return dx;
}

/* values spread over [-2, 2) with many close to zero, where a 2-bit code's
 * step (a quarter of a group's range) flips a rebuilt mask */
static fr_tensor *near_zero(uint32_t seed) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), seed);
    float *v = fr_data_f32(x);
    for (int64_t i = 0; i < fr_numel(x); i++)
        v[i] = (i % 3) ? v[i] * 0.01f : v[i];
    return x;
}

static void test_replay_uses_the_forward_masks(void) {
    fr_tensor *x = near_zero(3);
    long taken;
    fr_tensor *plain = input_grad(two_masks, NULL, 0, 0, x, &taken);
    CHECK(taken == 0);
    for (int b = 8; b >= 2; b /= 2) {
        fr_tensor *got = input_grad(two_masks, NULL, 0, b, x, &taken);
        CHECK(plain && got && fr_t_same_bits(plain, got));
        CHECK(taken == 2);
        fr_release(got);
    }
    fr_release(plain);
    fr_release(x);
}

/* The outer replay takes relu(x)'s mask and inner's, which the inner
 * checkpoint's forward (run inside that replay) keeps for its own replay:
 * three taken in all, and plain's gradient. */
static void test_nested_checkpoint(void) {
    fr_tensor *x = near_zero(4);
    shift = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(N, C, H, H), FR_TAG_DATA);
    for (int64_t i = 0; i < fr_numel(shift); i++)
        fr_data_f32(shift)[i] = -0.25f;
    bool flat = false, nested = true;
    long taken;
    fr_tensor *plain = input_grad(outer, &flat, sizeof flat, 0, x, &taken);
    fr_tensor *got = input_grad(outer, &nested, sizeof nested, 2, x, &taken);
    CHECK(plain && got && fr_t_same_bits(plain, got));
    CHECK(taken == 3);
    fr_release(got);
    fr_release(plain);
    fr_release(shift);
    shift = NULL;
    fr_release(x);
}

/* Between forward and backward the saved tag holds the input's codes and
 * one bit per element of each mask, exactly; after backward, nothing. */
static void test_ledger_holds_codes_and_masks(void) {
    fr_tensor *x0 = near_zero(5), *x;
    size_t n = (size_t)fr_numel(x0), base = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *loss = forward_loss(two_masks, NULL, 0, 4, x0, &x);
    size_t held = fr_mem_current(FR_CPU, FR_TAG_SAVED) - base;
    CHECK(held == fr_compress_nbytes(4, n) + 2 * fr_sign_nbytes(n));
    CHECK(backward_taking(loss, false) == 2);
    fr_release(loss);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == base);
    fr_release(x);
    fr_release(x0);
}

/* A replay that runs other ops than its forward (here a segment function
 * that changed between them) takes no mask: nothing is handed to an op it
 * was not made for, and the unused masks go with the checkpoint. */
static void test_replay_of_other_ops(void) {
    fr_tensor *x0 = near_zero(6), *x;
    size_t base = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *loss = forward_loss(two_masks, NULL, 0, 2, x0, &x);
    use_sigmoid = true;
    CHECK(backward_taking(loss, false) == 0);
    use_sigmoid = false;
    CHECK(x->grad != NULL);
    fr_release(loss);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == base);
    fr_release(x);
    fr_release(x0);
}

/* retain_graph: a second backward replays the segment again and takes the
 * same masks (the first replay shared them with its nodes rather than
 * handing them over): both give plain's gradient. */
static void test_retained_graph_replays_twice(void) {
    fr_tensor *x0 = near_zero(7), *x;
    long taken;
    fr_tensor *plain = input_grad(two_masks, NULL, 0, 0, x0, &taken);
    fr_tensor *loss = forward_loss(two_masks, NULL, 0, 2, x0, &x);
    CHECK_NOTNULL(loss);
    for (int pass = 0; loss && pass < 2; pass++) {
        CHECK(backward_taking(loss, pass == 0) == 2);
        CHECK(plain && x->grad && fr_t_same_bits(plain, x->grad));
        fr_release(x->grad);
        x->grad = NULL;
    }
    fr_release(loss);
    fr_release(x);
    fr_release(plain);
    fr_release(x0);
}

/* the fused BN + ReLU in RECOMPUTE mode keeps its mask only under compress,
 * then a ReLU of the same shape: the replay runs under its forward's
 * compress:B whatever is in force when backward runs, so it meets both
 * masks in order (without the forward's bits the fused op kept none in the
 * replay and the ReLU took the fused op's mask) */
static fr_tensor *gamma_, *beta_;
static fr_tensor *bn_then_relu(void *ctx, fr_tensor *x) {
    (void)ctx;
    fr_bn_state bn = {.gamma = gamma_, .beta = beta_, .eps = 1e-5f, .training = true};
    fr_tensor *h = fr_bn_act(x, NULL, &bn, FR_ACT_RELU, 0.0f, FR_BNACT_RECOMPUTE);
    h = h ? fr_chain(h, fr_scale(h, -1.0f)) : NULL;
    return h ? fr_chain(h, fr_relu(h)) : NULL;
}

static void test_replay_runs_under_the_forward_bits(void) {
    gamma_ = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 8);
    beta_ = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 9);
    fr_tensor *x0 = near_zero(10), *x;
    fr_tensor *loss = forward_loss(bn_then_relu, NULL, 0, 8, x0, &x);
    CHECK(backward_taking(loss, false) == 2);
    CHECK(x->grad != NULL);
    fr_release(loss);
    fr_release(x);
    fr_release(x0);
    fr_release(gamma_);
    fr_release(beta_);
}

/* a built-in model's forward, its checkpoint strategy's split made on
 * the first recorded forward: inside a user's checkpoint that is the
 * replay (the first forward runs unrecorded) */
static fr_tensor *model_segment(void *ctx, fr_tensor *x) {
    fr_model *m = *(fr_model **)ctx;
    return fr_model_forward(m, x, true);
}

/* The split's trial (nn/segments.c, measure) runs its steps' ops inside the
 * user's replay. With the logs left in place they took the replay's masks,
 * and the replay's own ops, finding them gone, rebuilt theirs from the
 * decoded input: other gradients than a replay without the trial (the
 * split made already). The trial runs with the logs set aside
 * (fr_checkpoint_logs_suspend): the same bits. (The count of masks taken is
 * 7 either way, with or without the fix: it shows that masks were taken,
 * not whose.) */
static void test_split_trial_inside_a_replay(void) {
    fr_model *m = fr_resnet_create("resnet8", 3, 10, 5);
    CHECK_OK(fr_strategy_parse("checkpoint+compress:8", &m->cfg.strategy));
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 8, 8), 6);
    long taken_first, taken_again;
    fr_manual_seed(11);
    fr_tensor *first = input_grad(model_segment, &m, sizeof m, 8, x, &taken_first);
    fr_params_zero_grad(m->params);
    fr_manual_seed(11);
    fr_tensor *again = input_grad(model_segment, &m, sizeof m, 8, x, &taken_again);
    fr_params_zero_grad(m->params);
    CHECK(first && again && fr_t_same_bits(first, again));
    CHECK(taken_first > 0 && taken_first == taken_again);
    printf("    masks taken: %ld with the split's trial in the replay, %ld without\n", taken_first,
           taken_again);
    fr_release(first);
    fr_release(again);
    fr_release(x);
    fr_model_free(m);
}

int main(void) {
    RUN(test_replay_uses_the_forward_masks);
    RUN(test_nested_checkpoint);
    RUN(test_ledger_holds_codes_and_masks);
    RUN(test_replay_of_other_ops);
    RUN(test_retained_graph_replays_twice);
    RUN(test_replay_runs_under_the_forward_bits);
    RUN(test_split_trial_inside_a_replay);
    return TEST_SUMMARY();
}
