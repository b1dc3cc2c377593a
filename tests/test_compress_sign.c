/* test_compress_sign.c: ReLU's gradient read from its sign mask's bits
 * (kernels.def: sign_act_backward; autograd/fn_bn_act.c). The kernel gives
 * act_backward's bits over the unpacked mask on every ISA path, in place
 * and not; the fused BN + ReLU backward of a block output under compress:B
 * gives the gradients of the decode-then-multiply path bit for bit, and its
 * backward's peak no longer holds the f32 mask of 1 and 0 an unpack made
 * (bench/RESULTS.md, issue 23), in NCHW and in a model's channels-last
 * mode (the bits in NHWC storage order, read against a channels-last dy). */
#include <math.h>
#include <string.h>

#include "testlib.h"
#include "cpu/compress.h"
#include "tensor/kernels.h"

/* dy with the values whose products and selections differ in their bits:
 * negatives (-0 from dy * 0), a zero of each sign, an inf and a NaN */
static void fill_dy(float *dy, size_t n, uint32_t seed) {
    fr_t_fill_rand(dy, n, seed);
    for (size_t i = 0; i < n; i++)
        dy[i] -= 0.5f;
    static const float odd[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < n && i < 5 * 7; i += 7)
        dy[i] = odd[i / 7];
}

/* every size from 0 to 80 and one over the threads' bound, ReLU and leaky
 * ReLU, each ISA path, out of place and in place: the bytes of
 * fr_act_backward over the f32 mask sign_unpack writes */
static void test_kernel_matches_unpacked(void) {
    static const size_t sizes[] = {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 80, 70001};
    static const fr_act acts[] = {FR_ACT_RELU, FR_ACT_LEAKY_RELU};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        int64_t len = (int64_t)(n ? n : 1);
        fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE(len), 11 + (uint32_t)s);
        fr_tensor *dy = fr_empty_like(x, FR_TAG_TRANSIENT), *ones = fr_empty_like(x, FR_TAG_TRANSIENT);
        fr_tensor *want = fr_empty_like(x, FR_TAG_TRANSIENT), *got = fr_empty_like(x, FR_TAG_TRANSIENT);
        fr_tensor *m = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)fr_sign_nbytes((size_t)len)),
                                FR_TAG_SAVED);
        float *xv = fr_data(x);
        for (size_t i = 0; i < (size_t)len; i++)
            xv[i] -= 0.5f; /* both signs */
        fill_dy(fr_data(dy), (size_t)len, 99 + (uint32_t)s);
        CHECK_OK(fr_sign_pack_out(m, x));
        CHECK_OK(fr_sign_unpack_out(ones, m));
        for (size_t a = 0; a < 2; a++) {
            float slope = acts[a] == FR_ACT_LEAKY_RELU ? 0.01f : 0.0f;
            CHECK_OK(fr_act_backward(want, dy, ones, acts[a], slope));
            for (int isa = FR_ISA_BASELINE; isa <= FR_ISA_AVX512; isa++) {
                memset(fr_data(got), 0xA5, (size_t)len * sizeof(float));
                CHECK_OK(fr_cpu_sign_act_backward_isa((fr_cpu_isa)isa, fr_data(got), fr_data(dy),
                                                      fr_data(m), acts[a], slope, n));
                CHECK(memcmp(fr_data(got), fr_data(want), n * sizeof(float)) == 0);
                /* in place */
                CHECK_OK(fr_copy_(got, dy));
                CHECK_OK(fr_cpu_sign_act_backward_isa((fr_cpu_isa)isa, fr_data(got), fr_data(got),
                                                      fr_data(m), acts[a], slope, n));
                CHECK(memcmp(fr_data(got), fr_data(want), n * sizeof(float)) == 0);
            }
            if (n == (size_t)len) { /* the checked op, on the machine's path */
                CHECK_OK(fr_sign_act_backward(got, dy, m, acts[a], slope));
                CHECK(memcmp(fr_data(got), fr_data(want), n * sizeof(float)) == 0);
            }
        }
        fr_tensor *tensors[] = {x, dy, ones, want, got, m};
        for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++)
            fr_release(tensors[i]);
    }
}

static void test_bad_arguments(void) {
    fr_tensor *dy = fr_t_rand(FR_CPU, 1, FR_SHAPE(40), 1);
    fr_tensor *dx = fr_empty_like(dy, FR_TAG_TRANSIENT);
    fr_tensor *m = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE(5), FR_TAG_SAVED);
    fr_tensor *short_m = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE(4), FR_TAG_SAVED);
    fr_tensor *dx_short = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(39), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_sign_act_backward(dx, dy, m, FR_ACT_SIGMOID, 0.0f), FR_ERR_ARG, "sigmoid");
    CHECK_ERR(fr_sign_act_backward(dx, dy, short_m, FR_ACT_RELU, 0.0f), FR_ERR_SHAPE, "packed");
    CHECK_ERR(fr_sign_act_backward(dx_short, dy, m, FR_ACT_RELU, 0.0f), FR_ERR_SHAPE, "dx");
    /* dx and dy in two layouts: the bits follow one storage order */
    fr_tensor *a = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 5), 2), *a_cl = fr_layout_copy(a, true);
    fr_tensor *m_a = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)fr_sign_nbytes(120)), FR_TAG_SAVED);
    CHECK_OK(fr_sign_pack_out(m_a, a_cl));
    CHECK_ERR(fr_sign_act_backward(a, a_cl, m_a, FR_ACT_RELU, 0.0f), FR_ERR_SHAPE, "layout");
    CHECK_OK(fr_sign_act_backward(a_cl, a_cl, m_a, FR_ACT_RELU, 0.0f));
    fr_release(a);
    fr_release(a_cl);
    fr_release(m_a);
    fr_release(dy);
    fr_release(dx);
    fr_release(m);
    fr_release(short_m);
    fr_release(dx_short);
}

enum { N = 4, C = 3, H = 8 };

/* x, r, w (the loss's weights; dy in the reference), gamma, beta: r moved
 * down so that y takes both signs; x and r channels last when cl (w stays
 * NCHW: the loss reads an NCHW copy of y, as a model's pool does) */
static void block_inputs(fr_tensor **in, bool cl) {
    for (int i = 0; i < 3; i++)
        in[i] = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 21 + (uint32_t)i);
    for (int i = 3; i < 5; i++)
        in[i] = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 21 + (uint32_t)i);
    float *rv = fr_data(in[1]);
    for (size_t i = 0; i < (size_t)(N * C * H * H); i++)
        rv[i] -= 1.2f;
    for (int i = 0; i < 2 && cl; i++) { /* data, as fr_t_rand's: held, not coded */
        fr_tensor *t = fr_empty_channels_last(FR_CPU, in[i]->shape, FR_TAG_DATA);
        CHECK_OK(fr_copy_(t, in[i]));
        fr_release(in[i]);
        in[i] = t;
    }
}

/* A block output y = act(BN(x) + r) under compress:2, its mask kept as
 * bits (the fused op's residual case), then loss = sum(y * w) or sum(y)
 * (channels last: of y's NCHW copy, whose backward hands the fused op a
 * channels-last dy, as in a model's channels-last mode): the gradients of
 * x, gamma, beta and r, and the backward's peak above the loss. x and r are
 * leaves (held, not coded), so the reference below reads what the backward
 * read. */
static void block_step(fr_act act, float slope, bool weighted, bool cl, fr_tensor **grads,
                       size_t *peak) {
    fr_tensor *in[5];
    block_inputs(in, cl);
    fr_tensor *x = in[0], *r = in[1], *w = in[2], *g = in[3], *b = in[4];
    fr_tensor *leaves[4] = {x, g, b, r};
    /* unweighted, x takes no gradient: its leaf .grad would be a copy of
     * dx, a tensor more after the fused backward, above its peak */
    for (int i = 0; i < 4; i++)
        fr_set_requires_grad(leaves[i], i > 0 || weighted);
    int outer;
    CHECK_OK(fr_compress_enter(2, &outer));
    fr_bn_state st = {.gamma = g, .beta = b, .momentum = 0.1f, .eps = 1e-5f, .training = true};
    fr_tensor *y = fr_bn_act(x, r, &st, act, slope, FR_BNACT_RECOMPUTE);
    fr_compress_restore(outer);
    CHECK(!y || fr_is_channels_last(y) == cl);
    if (y && cl)
        y = fr_chain(y, fr_to_nchw(y));
    fr_tensor *p = !y ? NULL : weighted ? fr_mul(y, w) : fr_retain(y);
    fr_tensor *loss = p ? fr_sum(p) : NULL;
    fr_release(y);
    fr_release(p);
    CHECK_NOTNULL(loss);
    *peak = fr_t_backward_peak(loss);
    for (int i = 0; i < 4; i++) {
        if (i > 0 || weighted)
            CHECK_NOTNULL(leaves[i]->grad);
        grads[i] = leaves[i]->grad ? fr_retain(leaves[i]->grad) : NULL;
        fr_release(leaves[i]);
    }
    fr_release(w);
    fr_release(loss);
}

/* The parent's path, spelt out: the mask unpacked to f32 (y > 0 as 1 and
 * 0, what sign_unpack writes) and passed to the fused kernel as the kept
 * output, dy = w (or ones). */
static void unpacked_reference(fr_act act, float slope, bool weighted, bool cl, fr_tensor **want) {
    fr_tensor *in[5];
    block_inputs(in, cl);
    fr_tensor *x = in[0], *r = in[1], *dy = in[2], *g = in[3], *b = in[4];
    fr_tensor *mean = fr_empty_like(g, FR_TAG_TRANSIENT), *invstd = fr_empty_like(g, FR_TAG_TRANSIENT);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT), *ones = fr_empty_like(x, FR_TAG_TRANSIENT);
    fr_tensor *m = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)fr_sign_nbytes(N * C * H * H)),
                            FR_TAG_SAVED);
    if (!weighted)
        CHECK_OK(fr_fill_(dy, 1.0f));
    if (cl) /* what to_nchw's backward hands on */
        dy = fr_chain(dy, fr_layout_copy(dy, true));
    CHECK_OK(fr_batch_norm_train_stats(mean, invstd, x, NULL, NULL, 0.1f, 1e-5f));
    CHECK_OK(fr_bn_act_forward(y, x, r, mean, invstd, g, b, act, slope));
    CHECK_OK(fr_sign_pack_out(m, y));
    CHECK_OK(fr_sign_unpack_out(ones, m));
    want[0] = fr_empty_like(x, FR_TAG_TRANSIENT);
    want[1] = fr_empty_like(g, FR_TAG_TRANSIENT);
    want[2] = fr_empty_like(g, FR_TAG_TRANSIENT);
    want[3] = fr_empty_like(x, FR_TAG_TRANSIENT);
    CHECK_OK(fr_bn_act_backward(want[0], want[3], want[1], want[2], dy, ones, x, mean, invstd, g, b,
                                act, slope));
    fr_tensor *tensors[] = {x, r, dy, g, b, mean, invstd, y, ones, m};
    for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++)
        fr_release(tensors[i]);
}

static void block_output(fr_act act, float slope, bool cl) {
    for (int weighted = 0; weighted < 2; weighted++) {
        fr_tensor *got[4] = {NULL}, *want[4] = {NULL};
        size_t peak = 0;
        block_step(act, slope, weighted, cl, got, &peak);
        unpacked_reference(act, slope, weighted, cl, want);
        static const char *const names[4] = {"dx", "dgamma", "dbeta", "dr (the residual)"};
        for (int i = 0; i < 4; i++) {
            if (got[i] && want[i] && !fr_t_same_bits(got[i], want[i])) {
                fprintf(stderr, "    %s differs from the unpacked path's\n", names[i]);
                CHECK(false);
            }
            fr_release(got[i]);
            fr_release(want[i]);
        }
        if (weighted) /* the peak is mul's backward: only the bits are tested */
            continue;
        /* Exact ledger bytes of the backward above loss = sum(y), whose
         * peak is the fused backward's: two tensors of y's size (dy, sum's
         * gradient, masked in place, and dz, the residual's gradient) and
         * dgamma and dbeta. The parent's
         * unpacked f32 mask of 1 and 0 was a third: 3 T + 2 C floats.
         * Channels last: dy is to_nchw's channels-last copy (whose making
         * held two tensors, its source and it, below this peak); the mask's
         * bits follow y's NHWC storage, which dy shares, so they are read
         * as bits there too: 2 T, dgamma and dbeta and the NHWC kernel's
         * per-group sums (cpu/layout.c; under a tensor here), where an
         * unpacked mask would be a third T. */
        size_t T = (size_t)(N * C * H * H) * sizeof(float);
        printf("    %s%s: backward peak above the loss %zu bytes (T = %zu)\n", fr_act_name(act),
               cl ? " (channels last)" : "", peak, T);
        if (cl)
            CHECK(peak > 2 * T + 2 * C * sizeof(float) && peak < 3 * T);
        else
            CHECK(peak == 2 * T + 2 * C * sizeof(float));
    }
}

static void test_block_output_relu(void) { block_output(FR_ACT_RELU, 0.0f, false); }
static void test_block_output_leaky(void) { block_output(FR_ACT_LEAKY_RELU, 0.01f, false); }
static void test_block_output_channels_last(void) {
    block_output(FR_ACT_RELU, 0.0f, true);
    block_output(FR_ACT_LEAKY_RELU, 0.01f, true);
}

int main(void) {
    RUN(test_kernel_matches_unpacked);
    RUN(test_bad_arguments);
    RUN(test_block_output_relu);
    RUN(test_block_output_leaky);
    RUN(test_block_output_channels_last);
    return fr_t_summary();
}
