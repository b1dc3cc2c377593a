/* test_bn_act.c: the one-pass batch norm + residual + activation kernels
 * (ops.h: fr_bn_act_forward / fr_bn_act_backward) against the chain of
 * separate ops they replace (fr_batch_norm_apply, fr_add_out, the
 * activation; the activation's backward, fr_batch_norm_backward), bit for
 * bit in f32 for every activation, with and without a residual, with the
 * sign read from the output or recomputed from x, in place; bf16 operands
 * (the chain, rounded step by step) and bf16 backward against f32; bad
 * arguments. The autograd op
 * built on them (fr_bn_act) is checked against plain in test_strategies.c. */
#include <math.h>
#include <string.h>

#include "testlib.h"

#define N 4
#define C 5
#define H 6
#define W 7

typedef struct {
    fr_tensor *x, *res, *dy, *gamma, *beta, *mean, *invstd;
} bn_case;

/* x spread so that a fair share of BN(x) + residual is within an ulp or two
 * of 0 is not needed: the mask must only agree, element for element. */
static bn_case make_case(uint32_t seed) {
    bn_case c;
    c.x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, W), seed);
    c.res = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, W), seed + 1);
    c.dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, W), seed + 2);
    c.gamma = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), seed + 3);
    c.beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), seed + 4);
    c.mean = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    c.invstd = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_TRANSIENT);
    CHECK_NOTNULL(c.x && c.res && c.dy && c.gamma && c.beta && c.mean && c.invstd ? c.x : NULL);
    if (c.x && c.mean && c.invstd)
        CHECK_OK(fr_batch_norm_train_stats(c.mean, c.invstd, c.x, NULL, NULL, 0.1f, 1e-5f));
    return c;
}

static void free_case(bn_case *c) {
    fr_tensor *all[] = {c->x, c->res, c->dy, c->gamma, c->beta, c->mean, c->invstd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
}

static bool same_bits(const fr_tensor *a, const fr_tensor *b, const char *what) {
    size_t bytes = (size_t)fr_numel(a) * fr_dtype_size(a->dtype);
    bool ok = fr_numel(a) == fr_numel(b) && a->dtype == b->dtype &&
              memcmp(fr_data(a), fr_data(b), bytes) == 0;
    if (!ok)
        fprintf(stderr, "  %s: the fused result differs from the chain's\n", what);
    return ok;
}

static fr_status act_inplace(fr_tensor *y, fr_act act, float slope) {
    return act == FR_ACT_IDENTITY ? FR_OK : fr_act_forward(y, y, act, slope);
}

/* every activation (leaky ReLU's slope, ELU's alpha) */
#define SLOPE 0.01f

static void test_forward_equals_chain(void) {
    bn_case c = make_case(10);
    for (size_t a = 0; a < FR_ACT_COUNT; a++) {
        for (int with_res = 0; with_res < 2; with_res++) {
            fr_tensor *res = with_res ? c.res : NULL;
            fr_tensor *fused = fr_empty_like(c.x, FR_TAG_TRANSIENT);
            fr_tensor *chain = fr_empty_like(c.x, FR_TAG_TRANSIENT);
            CHECK_OK(fr_bn_act_forward(fused, c.x, res, c.mean, c.invstd, c.gamma, c.beta, (fr_act)a,
                                       SLOPE));
            CHECK_OK(fr_batch_norm_apply(chain, c.x, c.mean, c.invstd, c.gamma, c.beta));
            if (res)
                CHECK_OK(fr_add_out(chain, chain, res));
            CHECK_OK(act_inplace(chain, (fr_act)a, SLOPE));
            CHECK(same_bits(fused, chain, "forward"));
            /* in place over x, and over the residual */
            fr_tensor *over_x = fr_to_dtype(c.x, FR_F32, FR_TAG_TRANSIENT);
            CHECK_OK(fr_bn_act_forward(over_x, over_x, res, c.mean, c.invstd, c.gamma, c.beta,
                                       (fr_act)a, SLOPE));
            CHECK(same_bits(over_x, chain, "forward in place over x"));
            if (res) {
                fr_tensor *over_r = fr_to_dtype(res, FR_F32, FR_TAG_TRANSIENT);
                CHECK_OK(fr_bn_act_forward(over_r, c.x, over_r, c.mean, c.invstd, c.gamma, c.beta,
                                           (fr_act)a, SLOPE));
                CHECK(same_bits(over_r, chain, "forward in place over the residual"));
                fr_release(over_r);
            }
            fr_release(over_x);
            fr_release(fused);
            fr_release(chain);
        }
    }
    free_case(&c);
}

/* The chain's backward: g = act'(sign) dy, then batch norm's. */
static void chain_backward(bn_case *c, fr_tensor *sign, fr_act act, fr_tensor *g, fr_tensor *dx,
                           fr_tensor *dgamma, fr_tensor *dbeta) {
    if (act == FR_ACT_IDENTITY)
        CHECK_OK(fr_copy_(g, c->dy));
    else
        CHECK_OK(fr_act_backward(g, c->dy, sign, act, SLOPE));
    CHECK_OK(fr_batch_norm_backward(dx, dgamma, dbeta, g, c->x, c->mean, c->invstd, c->gamma));
}

static void test_backward_equals_chain(void) {
    bn_case c = make_case(20);
    for (size_t a = 0; a < FR_ACT_COUNT; a++) {
        for (int with_res = 0; with_res < 2; with_res++) {
            fr_tensor *res = with_res ? c.res : NULL;
            /* an activation that needs its input is fused without a
             * residual only (ops.h; fn_bn_act.c splits the other case) */
            bool needs_input = fr_act_needs_input((fr_act)a);
            if (needs_input && res)
                continue;
            fr_tensor *y = fr_empty_like(c.x, FR_TAG_TRANSIENT);
            CHECK_OK(fr_bn_act_forward(y, c.x, res, c.mean, c.invstd, c.gamma, c.beta, (fr_act)a,
                                       SLOPE));
            fr_tensor *pre = fr_empty_like(c.x, FR_TAG_TRANSIENT);
            CHECK_OK(fr_batch_norm_apply(pre, c.x, c.mean, c.invstd, c.gamma, c.beta));
            fr_tensor *g = fr_empty_like(c.x, FR_TAG_TRANSIENT), *dx = fr_empty_like(c.x, FR_TAG_TRANSIENT);
            fr_tensor *dg = fr_empty_like(c.gamma, FR_TAG_TRANSIENT);
            fr_tensor *db = fr_empty_like(c.gamma, FR_TAG_TRANSIENT);
            chain_backward(&c, needs_input ? pre : y, (fr_act)a, g, dx, dg, db);
            /* the sign from y; then (no residual only) recomputed from x */
            for (int from_x = 0; from_x < 1 + !with_res; from_x++) {
                /* every combination of wanted outputs */
                for (int want = 0; want < 4; want++) {
                    bool want_dx = want & 1, want_dz = want & 2;
                    fr_tensor *fdx = want_dx ? fr_empty_like(c.x, FR_TAG_TRANSIENT) : NULL;
                    fr_tensor *fdz = want_dz ? fr_empty_like(c.x, FR_TAG_TRANSIENT) : NULL;
                    fr_tensor *fdg = fr_empty_like(c.gamma, FR_TAG_TRANSIENT);
                    fr_tensor *fdb = fr_empty_like(c.gamma, FR_TAG_TRANSIENT);
                    CHECK_OK(fr_bn_act_backward(fdx, fdz, fdg, fdb, c.dy, from_x ? NULL : y, c.x,
                                                c.mean, c.invstd, c.gamma, c.beta, (fr_act)a, SLOPE));
                    CHECK(same_bits(fdg, dg, "dgamma"));
                    CHECK(same_bits(fdb, db, "dbeta"));
                    if (fdx)
                        CHECK(same_bits(fdx, dx, "dx"));
                    if (fdz)
                        CHECK(same_bits(fdz, g, "dz"));
                    fr_release(fdx);
                    fr_release(fdz);
                    fr_release(fdg);
                    fr_release(fdb);
                }
            }
            fr_release(y);
            fr_release(pre);
            fr_release(g);
            fr_release(dx);
            fr_release(dg);
            fr_release(db);
        }
    }
    free_case(&c);
}

/* bf16 operands take the chain, each step rounded to bf16 as the separate
 * ops round it (so strategies keep plain's bits under autocast), in place
 * over x and over the residual too. */
static void test_bf16_forward_equals_chain(void) {
    bn_case c = make_case(30);
    fr_tensor *xh = fr_to_dtype(c.x, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *rh = fr_to_dtype(c.res, FR_BF16, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(xh && rh ? xh : NULL);
    for (size_t a = 0; a < FR_ACT_COUNT && xh && rh; a++) {
        fr_tensor *fused = fr_empty_like(xh, FR_TAG_TRANSIENT);
        fr_tensor *chain = fr_empty_like(xh, FR_TAG_TRANSIENT);
        CHECK_OK(fr_bn_act_forward(fused, xh, rh, c.mean, c.invstd, c.gamma, c.beta, (fr_act)a, SLOPE));
        CHECK_OK(fr_batch_norm_apply(chain, xh, c.mean, c.invstd, c.gamma, c.beta));
        CHECK_OK(fr_add_out(chain, chain, rh));
        CHECK_OK(act_inplace(chain, (fr_act)a, SLOPE));
        CHECK(same_bits(fused, chain, "bf16 forward"));
        fr_tensor *over_x = fr_to_dtype(xh, FR_BF16, FR_TAG_TRANSIENT);
        fr_tensor *over_r = fr_to_dtype(rh, FR_BF16, FR_TAG_TRANSIENT);
        CHECK_OK(fr_bn_act_forward(over_x, over_x, rh, c.mean, c.invstd, c.gamma, c.beta, (fr_act)a,
                                   SLOPE));
        CHECK_OK(fr_bn_act_forward(over_r, xh, over_r, c.mean, c.invstd, c.gamma, c.beta, (fr_act)a,
                                   SLOPE));
        CHECK(same_bits(over_x, chain, "bf16 forward in place over x"));
        CHECK(same_bits(over_r, chain, "bf16 forward in place over the residual"));
        fr_release(over_x);
        fr_release(over_r);
        fr_release(fused);
        fr_release(chain);
    }
    fr_release(xh);
    fr_release(rh);
    free_case(&c);
}

/* bf16 backward takes the chained path (batch norm's staged blocks): it
 * must agree with the f32 one to bf16's precision. */
static void test_bf16_backward_close_to_f32(void) {
    bn_case c = make_case(40);
    fr_tensor *y = fr_empty_like(c.x, FR_TAG_TRANSIENT);
    CHECK_OK(fr_bn_act_forward(y, c.x, NULL, c.mean, c.invstd, c.gamma, c.beta, FR_ACT_RELU, 0));
    fr_tensor *dyh = fr_to_dtype(c.dy, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *dxh = fr_empty_like(dyh, FR_TAG_TRANSIENT), *dx = fr_empty_like(c.x, FR_TAG_TRANSIENT);
    fr_tensor *dg[2] = {fr_empty_like(c.gamma, FR_TAG_TRANSIENT), fr_empty_like(c.gamma, FR_TAG_TRANSIENT)};
    fr_tensor *db[2] = {fr_empty_like(c.gamma, FR_TAG_TRANSIENT), fr_empty_like(c.gamma, FR_TAG_TRANSIENT)};
    CHECK_OK(fr_bn_act_backward(dx, NULL, dg[0], db[0], c.dy, y, c.x, c.mean, c.invstd, c.gamma,
                                c.beta, FR_ACT_RELU, 0));
    CHECK_OK(fr_bn_act_backward(dxh, NULL, dg[1], db[1], dyh, y, c.x, c.mean, c.invstd, c.gamma,
                                c.beta, FR_ACT_RELU, 0));
    fr_tensor *dxw = fr_to_dtype(dxh, FR_F32, FR_TAG_TRANSIENT);
    /* dy rounded to bf16 (8 bits): relative error ~2^-8 per element */
    CHECK(fr_t_allclose_t(dxw, dx, 2e-2, 2e-2, "bf16 dx"));
    CHECK(fr_t_allclose_t(dg[1], dg[0], 5e-2, 2e-2, "bf16 dgamma"));
    CHECK(fr_t_allclose_t(db[1], db[0], 5e-2, 2e-2, "bf16 dbeta"));
    fr_tensor *all[] = {y, dyh, dxh, dx, dg[0], dg[1], db[0], db[1], dxw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
    free_case(&c);
}

/* The autograd op in plain training's mode (FR_BNACT_KEEP, nn/norm.c)
 * against fr_batch_norm then fr_activation, between two 1x1 convs (the
 * second to one channel, so the head's tensors are small and the peak is
 * BN's backward): the same gradients bit for bit, the same saved bytes (an
 * activation that reads its input keeps the pre-activation, as the chain
 * does), and a backward peak no higher but for two channel vectors (dgamma
 * and dbeta, made while the activation's output is still kept). Without dx
 * written over dy it was a tensor higher. */
static void bn_act_step(bool fused, fr_act act, fr_tensor *const *src, fr_tensor **grads,
                        size_t *peak, size_t *saved) {
    fr_tensor *w = fr_empty_like(src[4], FR_TAG_PARAM), *g = fr_empty_like(src[1], FR_TAG_PARAM);
    fr_tensor *b = fr_empty_like(src[2], FR_TAG_PARAM), *w2 = fr_empty_like(src[3], FR_TAG_PARAM);
    fr_tensor *rm = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
    fr_tensor *rv = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(C), FR_TAG_PARAM);
    CHECK_NOTNULL(w && g && b && w2 && rm && rv ? w : NULL);
    if (!w || !g || !b || !w2 || !rm || !rv)
        return;
    CHECK_OK(fr_copy_(w, src[4]));
    CHECK_OK(fr_copy_(w2, src[3]));
    CHECK_OK(fr_copy_(g, src[1]));
    CHECK_OK(fr_copy_(b, src[2]));
    /* w2's gradient makes the conv above keep the activation's output, so
     * the fused op must keep the pre-activation beside it, as the chain */
    fr_tensor *leaves[4] = {w, g, b, w2};
    for (int i = 0; i < 4; i++)
        fr_set_requires_grad(leaves[i], true);
    /* BN's input from a 1x1 conv (C -> C), as in a network: its dx goes on
     * to the conv's backward, not into a leaf's .grad */
    fr_conv_params p = {.stride = 1, .pad = 0};
    fr_tensor *x = fr_conv2d(src[0], w, NULL, p), *z = NULL;
    CHECK_NOTNULL(x);
    if (x && fused) {
        fr_bn_state st = {.gamma = g, .beta = b, .running_mean = rm, .running_var = rv,
                          .momentum = 0.1f, .eps = 1e-5f, .training = true};
        z = fr_bn_act(x, NULL, &st, act, 0.0f, FR_BNACT_KEEP);
    } else if (x) {
        fr_tensor *y = fr_batch_norm(x, g, b, rm, rv, true, 0.1f, 1e-5f);
        z = y ? fr_activation(y, act, 0.0f) : NULL;
        fr_release(y);
    }
    fr_release(x);
    fr_tensor *m = z ? fr_conv2d(z, w2, NULL, p) : NULL;
    fr_release(z);
    fr_tensor *loss = m ? fr_sum(m) : NULL;
    fr_release(m);
    CHECK_NOTNULL(loss);
    *saved = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    *peak = fr_t_backward_peak(loss);
    for (int i = 0; i < 4; i++) {
        CHECK_NOTNULL(leaves[i]->grad);
        grads[i] = leaves[i]->grad ? fr_retain(leaves[i]->grad) : NULL;
        fr_release(leaves[i]);
    }
    fr_release(loss);
    fr_release(rm);
    fr_release(rv);
}

static void keep_as_chain(fr_act act) {
    bn_case c = make_case(40);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, C, 1, 1), 44);
    fr_tensor *w0 = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 1, 1), 45);
    fr_tensor *src[5] = {c.x, c.gamma, c.beta, w, w0};
    fr_tensor *chain[4] = {NULL, NULL, NULL, NULL}, *fused[4] = {NULL, NULL, NULL, NULL};
    size_t peak_chain = 0, peak_fused = 0, saved_chain = 0, saved_fused = 0;
    bn_act_step(false, act, src, chain, &peak_chain, &saved_chain);
    bn_act_step(true, act, src, fused, &peak_fused, &saved_fused);
    printf("    %s: saved chain %zu, fused %zu bytes\n", fr_act_name(act), saved_chain, saved_fused);
    CHECK(saved_fused == saved_chain);
    static const char *const names[4] = {"dw (the conv below)", "dgamma", "dbeta",
                                         "dw (the conv above)"};
    for (int i = 0; i < 4; i++) {
        if (chain[i] && fused[i])
            CHECK(same_bits(fused[i], chain[i], names[i]));
        fr_release(chain[i]);
        fr_release(fused[i]);
    }
    printf("    backward peak above the loss: chain %zu, fused %zu bytes\n", peak_chain, peak_fused);
    CHECK(peak_chain > 0);
    /* the fused op makes dgamma and dbeta while the activation's output is
     * still kept (the chain has freed it by then): two channel vectors
     * more, never a tensor */
    CHECK(peak_fused <= peak_chain + 2 * C * sizeof(float));
    fr_release(w);
    fr_release(w0);
    free_case(&c);
}

static void test_keep_backward_peak_as_chain(void) {
    static const fr_act acts[] = {FR_ACT_RELU, FR_ACT_SILU, FR_ACT_HARDSWISH};
    for (size_t a = 0; a < sizeof acts / sizeof *acts; a++)
        keep_as_chain(acts[a]);
}

static void test_bad_arguments(void) {
    bn_case c = make_case(50);
    fr_tensor *y = fr_empty_like(c.x, FR_TAG_TRANSIENT);
    fr_tensor *small = fr_zeros(FR_CPU, FR_F32, 4, FR_SHAPE(N, C, H, W - 1), FR_TAG_TRANSIENT);
    fr_tensor *dg = fr_empty_like(c.gamma, FR_TAG_TRANSIENT), *db = fr_empty_like(c.gamma, FR_TAG_TRANSIENT);
    CHECK_ERR(fr_bn_act_forward(y, c.x, NULL, c.mean, c.invstd, c.gamma, c.beta, FR_ACT_COUNT, 0),
              FR_ERR_ARG, "unknown activation");
    CHECK_ERR(fr_bn_act_forward(y, c.x, NULL, c.mean, c.invstd, c.gamma, c.beta,
                                FR_ACT_LEAKY_RELU, 0.0f),
              FR_ERR_ARG, "slope must be > 0");
    CHECK_ERR(fr_bn_act_forward(y, c.x, small, c.mean, c.invstd, c.gamma, c.beta, FR_ACT_RELU, 0),
              FR_ERR_SHAPE, "residual");
    CHECK_ERR(fr_bn_act_forward(y, c.x, NULL, c.mean, c.invstd, c.x, c.beta, FR_ACT_RELU, 0),
              FR_ERR_SHAPE, "gamma");
    /* the sign recomputed from x needs beta */
    fr_clear_error();
    CHECK_ERR(fr_bn_act_backward(NULL, NULL, dg, db, c.dy, NULL, c.x, c.mean, c.invstd, c.gamma,
                                 NULL, FR_ACT_RELU, 0),
              FR_ERR_ARG, "beta");
    CHECK_ERR(fr_bn_act_backward(NULL, small, dg, db, c.dy, y, c.x, c.mean, c.invstd, c.gamma,
                                 c.beta, FR_ACT_RELU, 0),
              FR_ERR_SHAPE, "dz");
    fr_release(y);
    fr_release(small);
    fr_release(dg);
    fr_release(db);
    free_case(&c);
}

int main(void) {
    RUN(test_forward_equals_chain);
    RUN(test_backward_equals_chain);
    RUN(test_bf16_forward_equals_chain);
    RUN(test_bf16_backward_close_to_f32);
    RUN(test_keep_backward_peak_as_chain);
    RUN(test_bad_arguments);
    return TEST_SUMMARY();
}
