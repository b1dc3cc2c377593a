/* test_channels_last.c: a model's channels-last mode (nn/model.h,
 * fr_layout_mode; docs/ARCHITECTURE.md, layout between ops). Against the
 * same model run NCHW: loss, every gradient and running statistic within
 * 1e-5 (relative to the tensor's largest value), and no more saved bytes;
 * within the mode, recompute and checkpoint bit-identical to plain, and the
 * bits independent of the thread count. Each run checks that the mode
 * really ran: channels-last activations reach the pool through the
 * to_nchw copy (a walk over the tape), which the NCHW run never makes.
 * compress:B runs in the mode too: against compress:B run NCHW; and so
 * does InPlace-ABN: against abn run NCHW. */
#include "testlib.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/node.h"
#include "cpu/conv.h"
#include "cpu/isa.h"
#include "models/resnet.h"
#include "nn/build.h"
#include "planner/planner.h"

static bool named_to_nchw(const fr_node *node, void *ctx) {
    (void)ctx;
    return !strcmp(node->op, "to_nchw");
}

/* Whether a training forward of m on x runs channels last, by the tape. */
static bool ran_channels_last(fr_model *m, fr_tensor *x) {
    fr_tensor *logits = fr_model_forward(m, x, true);
    CHECK_NOTNULL(logits);
    bool cl = logits && fr_t_tape_any(logits, named_to_nchw, NULL);
    fr_release(logits);
    fr_tape_clear();
    return cl;
}

/* A step under `strategy` from the random stream seeded 3 gives want's
 * bits at 1, 2 and 3 threads. */
static void same_bits_any_team(fr_model *m, const char *strategy, float **init, fr_tensor *x,
                               fr_tensor *labels, const fr_t_step *want) {
    int threads = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        fr_manual_seed(3);
        fr_t_step s = fr_t_model_step(m, strategy, init, x, labels);
        fr_t_compare_steps(m, want, &s, -1, "threads");
        fr_t_step_free(&s, m->params->count);
    }
    omp_set_num_threads(threads);
}

static void check_model(const char *name, int batch, int size) {
    fr_model *m = fr_resnet_create(name, 3, 10, 5);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(batch, 3, size, size), 9);
    int32_t lab[8] = {1, 7, 3, 3, 0, 9, 4, 2};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);

    m->cfg.layout = FR_LAYOUT_NCHW;
    CHECK(!fr_model_channels_last(m, FR_CPU, NULL));
    fr_t_snapshot_restore(m, init);
    CHECK(!ran_channels_last(m, x));
    fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
    fr_t_step ref_rec = fr_t_model_step(m, "recompute", init, x, labels);

    m->cfg.layout = FR_LAYOUT_CHANNELS_LAST;
    CHECK(fr_model_channels_last(m, FR_CPU, NULL));
    fr_t_snapshot_restore(m, init);
    CHECK(ran_channels_last(m, x));
    fr_t_step cl = fr_t_model_step(m, "plain", init, x, labels);
    /* the same function: loss, gradients, running statistics */
    fr_t_compare_steps(m, &ref, &cl, 1e-5, name);
    /* the same activations kept, in another layout */
    CHECK(cl.saved_forward == ref.saved_forward);
    CHECK(cl.peak_saved <= ref.peak_saved);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);

    /* function-preserving strategies within the mode: plain's bits */
    const char *strategies[] = {"recompute", "checkpoint", "checkpoint:2", "recompute+checkpoint"};
    for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++) {
        fr_t_step s = fr_t_model_step(m, strategies[i], init, x, labels);
        fr_t_compare_steps(m, &cl, &s, -1, strategies[i]);
        CHECK(s.peak_saved <= cl.peak_saved);
        if (i == 0)
            CHECK(s.peak_saved <= ref_rec.peak_saved);
        fr_t_step_free(&s, m->params->count);
    }
    CHECK(fr_strategy_parse("plain", &m->cfg.strategy) == FR_OK);

    /* the bits do not depend on the thread count */
    same_bits_any_team(m, "plain", init, x, labels, &cl);

    fr_t_step_free(&ref, m->params->count);
    fr_t_step_free(&ref_rec, m->params->count);
    fr_t_step_free(&cl, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

static void test_resnet20(void) { check_model("resnet20", 4, 16); }

/* What check_compress and check_abn run on: a ResNet of `name` (seed 5),
 * 4 images of 16x16, their labels and the initial weights. */
typedef struct {
    fr_model *m;
    fr_tensor *x, *labels;
    float **init;
} fixture;

static fixture fixture_new(const char *name) {
    fixture f = {.m = fr_resnet_create(name, 3, 10, 5)};
    int32_t lab[4] = {1, 7, 3, 0};
    f.x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 16, 16), 9);
    f.labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(4), FR_TAG_DATA, lab);
    f.init = fr_t_snapshot_save(f.m);
    return f;
}

static void fixture_free(fixture *f) {
    fr_t_snapshot_free(f->m, f->init);
    fr_release(f->x);
    fr_release(f->labels);
    fr_model_free(f->m);
}

/* f's model in `layout` under `strategy` from the initial weights, the mode
 * checked by the tape (it really runs, or really does not) */
static void enter_layout(fixture *f, fr_layout_mode layout, const char *strategy) {
    f->m->cfg.layout = layout;
    CHECK_OK(fr_strategy_parse(strategy, &f->m->cfg.strategy));
    fr_t_snapshot_restore(f->m, f->init);
    CHECK(ran_channels_last(f->m, f->x) == (layout == FR_LAYOUT_CHANNELS_LAST));
}

/* compress:B inside the mode (autograd/compressed.c packs the NHWC storage
 * as it lies and decodes into channels last again). The mode really ran
 * (the tape's to_nchw). Against compress:B run NCHW from the same weights
 * and seed: the same loss up to round-off (the forward is exact), the same
 * saved bytes on the ledger (the codes' size is a function of the element
 * count alone), and gradients as close to plain's as NCHW's are (their
 * relative squared error within 2x of NCHW's; across 6 seeds the two were
 * within 1.25x of each other). The codes themselves differ: a group is
 * FR_COMPRESS_GROUP consecutive elements of storage, other elements in the
 * other layout, so the two runs' rounding noise is independent. `tol`, when
 * >= 0: also every gradient within tol of NCHW's (fr_t_compare_steps; at 8
 * bits a decode into the wrong layout is far outside it). The reference
 * is plain, or abn for a strategy with abn (which changes the function:
 * against plain its own difference would swamp compression's). Within the mode:
 * the same seed gives the same step bit for bit at 1, 2 and 3 threads
 * (checkpointed strategies included, replays and all). */
static void check_compress(const char *name, const char *strategy, double tol) {
    fixture f = fixture_new(name);
    fr_model *m = f.m;
    const char *ref_name = strstr(strategy, "abn") ? "abn" : "plain";
    enter_layout(&f, FR_LAYOUT_NCHW, strategy);
    fr_t_step plain = fr_t_model_step(m, ref_name, f.init, f.x, f.labels);
    fr_manual_seed(3);
    fr_t_step ref = fr_t_model_step(m, strategy, f.init, f.x, f.labels);

    enter_layout(&f, FR_LAYOUT_CHANNELS_LAST, strategy);
    fr_manual_seed(3);
    fr_t_step cl = fr_t_model_step(m, strategy, f.init, f.x, f.labels);
    CHECK_CLOSE(cl.loss, ref.loss, 1e-5);
    if (tol >= 0)
        fr_t_compare_steps(m, &ref, &cl, tol, strategy);
    double e_cl = fr_t_grad_rel_error(m, &plain, &cl, "");
    double e_nchw = fr_t_grad_rel_error(m, &plain, &ref, "");
    CHECK(e_cl > 0 && e_cl * e_cl < 2 * e_nchw * e_nchw);
    CHECK(cl.saved_forward == ref.saved_forward);
    CHECK(cl.peak_saved == ref.peak_saved);
    CHECK(cl.peak_saved * 3 < plain.peak_saved);
    printf("    %s %s: gradients' rel. sq. error against %s %.2e channels last, %.2e NCHW; "
           "saved %zu bytes in both (%s %zu)\n", name, strategy, ref_name, e_cl, e_nchw,
           cl.peak_saved, ref_name, plain.peak_saved);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);

    same_bits_any_team(m, strategy, f.init, f.x, f.labels, &cl);

    fr_t_step_free(&ref, m->params->count);
    fr_t_step_free(&plain, m->params->count);
    fr_t_step_free(&cl, m->params->count);
    fixture_free(&f);
}

/* InPlace-ABN in the mode (fr_abn_invert_out's channels-last kernel, the
 * NHWC batch-norm kernels): against the same strategy run NCHW, the same
 * function within round-off (the statistics' sums run in another order:
 * cpu/layout.h), the same saved bytes, and within the mode the bits do not
 * depend on the thread count. abn+compress:4 as compress:B is held above. */
static void check_abn(const char *name, const char *strategy) {
    fixture f = fixture_new(name);
    fr_model *m = f.m;
    enter_layout(&f, FR_LAYOUT_NCHW, strategy);
    fr_t_step ref = fr_t_model_step(m, strategy, f.init, f.x, f.labels);
    enter_layout(&f, FR_LAYOUT_CHANNELS_LAST, strategy);
    fr_t_step cl = fr_t_model_step(m, strategy, f.init, f.x, f.labels);
    fr_t_compare_steps(m, &ref, &cl, 1e-5, strategy);
    CHECK(cl.saved_forward == ref.saved_forward);
    CHECK(cl.peak_saved <= ref.peak_saved);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_TRANSIENT) == 0);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    same_bits_any_team(m, strategy, f.init, f.x, f.labels, &cl);
    fr_t_step_free(&ref, m->params->count);
    fr_t_step_free(&cl, m->params->count);
    fixture_free(&f);
}

/* The op: fr_abn_invert_out on channels-last tensors gives the NCHW
 * kernel's bits (the same formula element by element) at 1, 2 and 3
 * threads, with and without a residual, at shapes past the kernel's
 * parallel threshold and with odd channel counts; a tensor of the other
 * layout is refused with a shape error. */
static void test_abn_invert_op(void) {
    static const int64_t shapes[][4] = {{8, 64, 32, 32}, {4, 3, 32, 32}, {2, 4099, 2, 3}};
    int threads = omp_get_max_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t *sh = shapes[s];
        fr_tensor *y = fr_t_rand(FR_CPU, 4, sh, 20 + (uint32_t)s);
        fr_tensor *res = fr_t_rand(FR_CPU, 4, sh, 30 + (uint32_t)s);
        fr_tensor *geff = fr_t_rand(FR_CPU, 1, FR_SHAPE(sh[1]), 40);
        fr_tensor *beta = fr_t_rand(FR_CPU, 1, FR_SHAPE(sh[1]), 41);
        for (int64_t c = 0; c < sh[1]; c++)
            fr_data_f32(geff)[c] = fabsf(fr_data_f32(geff)[c]) + 0.5f;
        fr_tensor *y_cl = fr_layout_copy(y, true), *res_cl = fr_layout_copy(res, true);
        CHECK(fr_is_channels_last(y_cl) && fr_is_channels_last(res_cl));
        for (int r = 0; r < 2; r++) {
            fr_tensor *want = fr_empty_like(y, FR_TAG_TRANSIENT);
            CHECK_OK(fr_abn_invert_out(want, y, geff, beta, r ? res : NULL, 0.01f));
            for (int t = 1; t <= 3; t++) {
                omp_set_num_threads(t);
                fr_tensor *got = fr_empty_like(y_cl, FR_TAG_TRANSIENT);
                CHECK_OK(fr_abn_invert_out(got, y_cl, geff, beta, r ? res_cl : NULL, 0.01f));
                fr_tensor *back = fr_layout_copy(got, false);
                CHECK(back && fr_t_same_bits(want, back));
                fr_release(back);
                fr_release(got);
            }
            omp_set_num_threads(threads);
            fr_release(want);
        }
        fr_tensor *xh = fr_empty_like(y_cl, FR_TAG_TRANSIENT);
        CHECK_ERR(fr_abn_invert_out(xh, y_cl, geff, beta, res, 0.01f), FR_ERR_SHAPE, "residual");
        fr_tensor *xh_nchw = fr_empty_like(y, FR_TAG_TRANSIENT);
        CHECK_ERR(fr_abn_invert_out(xh_nchw, y_cl, geff, beta, NULL, 0.01f), FR_ERR_SHAPE, "xhat");
        fr_release(xh_nchw);
        fr_release(xh);
        fr_tensor *objs[] = {y, res, geff, beta, y_cl, res_cl};
        for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
            fr_release(objs[i]);
    }
}

static void test_abn(void) {
    check_abn("resnet20", "abn");
    check_abn("resnet20", "abn+checkpoint:2");
    check_abn("resnet20", "abn+recompute+checkpoint");
    check_abn("resnet20", "abn_reference");
}

static void test_compress(void) {
    check_compress("resnet20", "compress:8", 0.05);
    check_compress("resnet20", "checkpoint:2+compress:4", -1);
    check_compress("preresnet11", "recompute+compress:8", -1);
    check_compress("resnet20", "abn+compress:4", -1);
}
static void test_preresnet11(void) { check_model("preresnet11", 4, 8); }

/* Eval (no tape): the mode gives NCHW's logits within round-off, and NCHW
 * logits come out. */
static void test_eval(void) {
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 5);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 16, 16), 9);
    fr_no_grad_enter();
    m->cfg.layout = FR_LAYOUT_NCHW;
    fr_tensor *want = fr_model_forward(m, x, false);
    m->cfg.layout = FR_LAYOUT_CHANNELS_LAST;
    fr_tensor *got = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    CHECK_NOTNULL(got);
    CHECK(got && !fr_is_channels_last(got) && fr_is_contiguous(got));
    if (got && want)
        fr_t_allclose_t(got, want, 1e-5, 1e-5, "eval logits");
    /* eval with the tape on (a validation that forgot no_grad) */
    fr_tensor *taped = fr_model_forward(m, x, false);
    CHECK_NOTNULL(taped);
    if (taped && want)
        fr_t_allclose_t(taped, want, 1e-5, 1e-5, "eval logits, tape on");
    fr_release(taped);
    fr_tape_clear();
    fr_release(got);
    fr_release(want);
    fr_release(x);
    fr_model_free(m);
}

/* What the mode does not cover runs NCHW, never an error: half precision,
 * another device, a model that did not declare it. compress and abn are
 * covered, alone and with the other switches. */
static void test_uncovered_run_nchw(void) {
    fr_model *m = fr_resnet_create("resnet20", 3, 10, 5);
    const char *why = NULL;
    /* the default: on by the fixed rule, which an avx512 machine with oneDNN meets */
    CHECK(m->cfg.layout == FR_LAYOUT_AUTO);
    CHECK(fr_model_channels_last(m, FR_CPU, NULL) == fr_cpu_channels_last_default());
    fr_cpu_isa isa;
    if (fr_cpu_have_dnnl() && fr_cpu_isa_get(&isa) == FR_OK && isa == FR_ISA_AVX512)
        CHECK(fr_model_channels_last(m, FR_CPU, NULL));
    m->cfg.layout = FR_LAYOUT_CHANNELS_LAST;
    CHECK(fr_model_channels_last(m, FR_CPU, &why) && !strcmp(why, "channels last"));
    CHECK(!fr_model_channels_last(m, FR_CUDA, &why));
    m->cfg.precision = FR_BF16;
    CHECK(!fr_model_channels_last(m, FR_CPU, &why) && strstr(why, "precision"));
    m->cfg.precision = FR_F32;
    const char *on[] = {"compress", "recompute+compress:4", "checkpoint+compress:2", "abn",
                        "abn_reference", "abn+checkpoint+compress:4"};
    for (size_t i = 0; i < sizeof on / sizeof *on; i++) {
        CHECK_OK(fr_strategy_parse(on[i], &m->cfg.strategy));
        CHECK(fr_model_channels_last(m, FR_CPU, &why) && !strcmp(why, "channels last"));
    }
    /* a memory plan that may compress or use abn runs channels last */
    CHECK_OK(fr_strategy_parse("plain", &m->cfg.strategy));
    fr_memory_plan plan;
    fr_plan_options o = {.max_accum = 1, .allow_compress = true};
    CHECK_OK(fr_plan_memory(m, FR_SHAPE(2, 3, 8, 8), (size_t)1 << 30, &o, &plan));
    CHECK(fr_model_channels_last(m, FR_CPU, NULL));
    fr_memory_plan_free(&plan);
    o.allow_abn = true;
    CHECK_OK(fr_plan_memory(m, FR_SHAPE(2, 3, 8, 8), (size_t)1 << 30, &o, &plan));
    CHECK(fr_model_channels_last(m, FR_CPU, NULL));
    fr_memory_plan_free(&plan);
    fr_plan_remove(m);
    CHECK_OK(fr_strategy_parse("plain", &m->cfg.strategy));
    m->channels_last_capable = false;
    CHECK(!fr_model_channels_last(m, FR_CPU, &why) && strstr(why, "model"));
    fr_model_free(m);
}

/* Public ops on channels-last tensors: the ones that do not take the layout
 * refuse it with an error naming the op (never read its bytes as NCHW);
 * elementwise sums and activations of channels-last tensors keep it. */
static void test_ops_refuse_or_keep(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 4, 5), 1);
    fr_tensor *cl = fr_layout_copy(x, true);
    CHECK(cl && fr_is_channels_last(cl));
    fr_tensor *s = fr_add(cl, cl);
    CHECK(s && fr_is_channels_last(s));
    fr_tensor *back = s ? fr_to_nchw(s) : NULL;
    fr_tensor *want = fr_add(x, x);
    CHECK(back && fr_is_contiguous(back));
    if (back)
        fr_t_allclose_t(back, want, 0, 0, "channels-last add");
    fr_tensor *r = fr_relu(cl);
    CHECK(r && fr_is_channels_last(r));
    fr_release(r);
    CHECK_ERR(fr_t_status_of(fr_relu_(cl)), FR_ERR_SHAPE, "relu");
    CHECK_ERR(fr_t_status_of(fr_add(cl, x)), FR_ERR_SHAPE, "add");
    CHECK_ERR(fr_t_status_of(fr_global_avg_pool(cl)), FR_ERR_SHAPE, NULL);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 3, 3), 2);
    CHECK_ERR(fr_t_status_of(fr_conv2d(cl, w, NULL, (fr_conv_params){.stride = 1})), FR_ERR_SHAPE,
              "conv2d");
    /* the model's conv takes either layout and gives the NCHW op's values */
    fr_tensor *yc = fr_conv2d_channels_last(cl, w, NULL, (fr_conv_params){.stride = 1});
    fr_tensor *yn = fr_conv2d(x, w, NULL, (fr_conv_params){.stride = 1});
    CHECK(yc && fr_is_channels_last(yc));
    fr_tensor *yb = yc ? fr_to_nchw(yc) : NULL;
    if (yb && yn)
        fr_t_allclose_t(yb, yn, 1e-5, 1e-5, "channels-last conv");
    fr_release(yb);
    fr_release(yc);
    fr_release(yn);
    fr_release(w);
    fr_release(back);
    fr_release(want);
    fr_release(s);
    fr_release(cl);
    fr_release(x);
}

int main(void) {
    RUN(test_resnet20);
    RUN(test_preresnet11);
    RUN(test_compress);
    RUN(test_abn);
    RUN(test_abn_invert_op);
    RUN(test_eval);
    RUN(test_uncovered_run_nchw);
    RUN(test_ops_refuse_or_keep);
    return TEST_SUMMARY();
}
