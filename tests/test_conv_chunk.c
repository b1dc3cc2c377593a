/* test_conv_chunk.c: a convolution's forward and backward (data) passes cut
 * into chunks of images under the workspace cap (cpu/conv_chunk.c). For a
 * pass whose whole-batch workspace is over the cap, the ledger's workspace
 * peak of the pass must be at most the cap (or one image's workspace, when
 * that is over it), and y and dx the same bits as
 * the whole batch's (cap 0); the default cap is the documented 16 MiB, and
 * it chunks ResNet-56's 16-channel layer at batch 160 (20 MiB of oneDNN
 * reorders whole) but not at batch 64. The chunked path is oneDNN's blocked
 * layout: the checks skip without oneDNN. */
#include <omp.h>
#include <stdio.h>

#include "testlib.h"
#include "cpu/conv.h"
#include "cpu/conv_chunk.h"
#include "tensor/memory.h"
#include "tensor/ops.h"

typedef struct {
    int n, c, h, k, r, stride, pad, groups;
} chunk_case;

typedef struct {
    fr_tensor *y, *dx;
    size_t ws_fwd, ws_bwd; /* the ledger's workspace peak of each pass */
} pass_out;

static pass_out run_passes(const chunk_case *cc, const fr_tensor *x, const fr_tensor *w,
                           const fr_tensor *dy) {
    fr_conv_params p = {.stride = cc->stride, .pad = cc->pad, .groups = cc->groups};
    pass_out o = {fr_empty_like(dy, FR_TAG_TRANSIENT), fr_empty_like(x, FR_TAG_TRANSIENT), 0, 0};
    CHECK_OK(fr_fill_(o.y, NAN)); /* a chunk left unwritten fails the comparison */
    CHECK_OK(fr_fill_(o.dx, NAN));
    fr_mem_reset_peak();
    CHECK_OK(fr_conv2d_forward(o.y, x, w, NULL, p));
    o.ws_fwd = fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE);
    fr_mem_reset_peak();
    CHECK_OK(fr_conv2d_backward(o.dx, NULL, NULL, dy, NULL, w, p));
    o.ws_bwd = fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE);
    return o;
}

/* One pass's workspace peaks: whole batch, chunked, one image. */
static bool pass_ok(bool dnnl, size_t whole, size_t chunked, size_t one, size_t cap,
                    bool expect_chunks) {
    if (!dnnl) /* frugal's own kernels: per-thread workspace, never chunked */
        return chunked == whole;
    size_t limit = one > cap ? one : cap; /* one image's, where that is over the cap */
    /* the case must really cut the batch (or really not) */
    return chunked <= limit && (whole > cap) == expect_chunks && (chunked < whole) == expect_chunks;
}

/* Runs cc whole (cap 0) and under `cap`, and checks each pass that runs
 * oneDNN's blocked layout here; returns false when neither does. */
static bool check_case(const chunk_case *cc, size_t cap, bool expect_chunks) {
    int g = cc->groups ? cc->groups : 1;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->n, cc->c, cc->h, cc->h), 91);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(cc->k, cc->c / g, cc->r, cc->r), 92);
    fr_conv_shape s;
    CHECK_OK(fr_conv2d_shape(x, w, (fr_conv_params){.stride = cc->stride, .pad = cc->pad,
                                                    .groups = cc->groups}, &s));
    fr_conv_path fwd_path, bwd_path;
    CHECK_OK(fr_cpu_conv_path(&s, 0, &fwd_path));
    CHECK_OK(fr_cpu_conv_path(&s, 1, &bwd_path));
    bool dnnl_fwd = fwd_path == FR_CONV_PATH_DNNL, dnnl_bwd = bwd_path == FR_CONV_PATH_DNNL;
    fr_tensor *dy = fr_t_rand(FR_CPU, 4, FR_SHAPE(s.n, s.k, s.oh, s.ow), 93);
    chunk_case one_cc = *cc;
    one_cc.n = 1;
    fr_tensor *x1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, cc->c, cc->h, cc->h), 94);
    fr_tensor *dy1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(1, s.k, s.oh, s.ow), 95);
    size_t old = fr_cpu_conv_workspace_cap();
    fr_cpu_conv_set_workspace_cap(0);
    pass_out whole = run_passes(cc, x, w, dy), one = run_passes(&one_cc, x1, w, dy1);
    fr_cpu_conv_set_workspace_cap(cap);
    pass_out chunked = run_passes(cc, x, w, dy);
    fr_cpu_conv_set_workspace_cap(old);
    bool same_y = fr_t_same_bits(whole.y, chunked.y);
    bool same_dx = fr_t_same_bits(whole.dx, chunked.dx);
    bool fwd_ok = pass_ok(dnnl_fwd, whole.ws_fwd, chunked.ws_fwd, one.ws_fwd, cap, expect_chunks);
    bool bwd_ok = pass_ok(dnnl_bwd, whole.ws_bwd, chunked.ws_bwd, one.ws_bwd, cap, expect_chunks);
    if (!same_y || !same_dx || !fwd_ok || !bwd_ok)
        fprintf(stderr, "    conv %d->%d %dx%d /%d g%d @%d, batch %d, cap %zu: workspace whole "
                "%zu / %zu, chunked %zu / %zu, one image %zu / %zu (fwd / bwd data; oneDNN %d / "
                "%d); same y %d, dx %d\n", cc->c, cc->k, cc->r, cc->r, cc->stride, g, cc->h,
                cc->n, cap, whole.ws_fwd, whole.ws_bwd, chunked.ws_fwd, chunked.ws_bwd,
                one.ws_fwd, one.ws_bwd, dnnl_fwd, dnnl_bwd, same_y, same_dx);
    fr_tensor *all[] = {x, w, dy, x1, dy1, whole.y, whole.dx, chunked.y, chunked.dx, one.y, one.dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
    CHECK(same_y);
    CHECK(same_dx);
    CHECK(fwd_ok);
    CHECK(bwd_ok);
    return dnnl_fwd || dnnl_bwd;
}

/* Small caps on CIFAR ResNet and DenseNet layers, a chunk size that does
 * not divide the batch, strided and depthwise layers, one image per chunk
 * (caps below one image's workspace: the reordered input and output and,
 * independent of the batch, the reordered weight). */
static void chunks_under_small_caps(void) {
    static const struct {
        chunk_case cc;
        size_t cap;
    } cases[] = {
        {{40, 16, 32, 16, 3, 1, 1, 0}, (size_t)1 << 20},   /* ResNet layer1: 7 images a chunk */
        {{23, 16, 32, 32, 3, 2, 1, 0}, (size_t)600 << 10}, /* stride 2, 23 = 3 x 7 + 2 */
        {{16, 64, 8, 64, 3, 1, 1, 0}, (size_t)300 << 10},  /* ResNet layer3 (144 KiB of w) */
        {{12, 128, 8, 12, 3, 1, 1, 0}, (size_t)200 << 10}, /* DenseNet growth layer */
        {{9, 32, 16, 32, 3, 1, 1, 32}, (size_t)70 << 10},  /* depthwise */
        {{6, 16, 32, 16, 3, 1, 1, 0}, (size_t)1},          /* below one image: 1 a chunk */
        {{16, 64, 8, 64, 3, 1, 1, 0}, (size_t)100 << 10},  /* below its weight's reorder */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (!check_case(&cases[i].cc, cases[i].cap, true))
            SKIP("a case takes oneDNN's data passes in neither direction on this CPU");
}

static void test_chunks_under_small_caps(void) {
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN (the chunked path is oneDNN's)");
    int team = omp_get_max_threads();
    omp_set_num_threads(1);
    chunks_under_small_caps();
    omp_set_num_threads(3);
    chunks_under_small_caps();
    omp_set_num_threads(team);
}

/* The default: 16 MiB, which ResNet-56's layer1 passes (16 -> 16 at 32x32:
 * oneDNN reorders x and y, 128 KiB an image) exceed at batch 160 and not at
 * batch 64, plain's batch in bench/RESULTS.md. */
static void test_default_cap(void) {
    CHECK(fr_cpu_conv_workspace_cap() == FR_CONV_WORKSPACE_CAP_DEFAULT);
    CHECK(FR_CONV_WORKSPACE_CAP_DEFAULT == (size_t)16 << 20);
    if (!fr_cpu_have_dnnl())
        SKIP("built without oneDNN (the chunked path is oneDNN's)");
    chunk_case b160 = {160, 16, 32, 16, 3, 1, 1, 0}, b64 = {64, 16, 32, 16, 3, 1, 1, 0};
    if (!check_case(&b160, FR_CONV_WORKSPACE_CAP_DEFAULT, true) ||
        !check_case(&b64, FR_CONV_WORKSPACE_CAP_DEFAULT, false))
        SKIP("ResNet's 16-channel layer does not take oneDNN's data passes on this CPU");
}

int main(void) {
    RUN(test_default_cap);
    RUN(test_chunks_under_small_caps);
    return TEST_SUMMARY();
}
