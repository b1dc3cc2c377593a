/* test_replay.c: a checkpointed segment replays in backward exactly what its
 * forward ran, whatever happens between the two (issue 10's bug: the replay
 * read the model's segment slots and configuration, which a forward in
 * between rewrote, and gave wrong gradients without an error).
 *
 * Each case runs the same interruption under plain and under checkpoint
 * strategies and asks for bit-identical loss, gradients and BN running
 * statistics: plain keeps its activations, so it is the reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"
#include "programs/cli_impl.h"

#define BATCH 8

typedef enum { NOTHING, EVAL_NO_GRAD, EVAL_FAILS, STRATEGY_CHANGE, OTHER_MODEL } between;

typedef struct {
    float **values; /* per registry entry: grad (parameters) or value (f32 buffers) */
    double loss;
} snapshot;

static snapshot take(const fr_model *m) {
    snapshot s = {.values = calloc((size_t)m->params->count, sizeof(float *))};
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        const fr_tensor *t = e->kind == FR_PARAMETER ? e->tensor->grad : e->tensor;
        if (!t || t->dtype != FR_F32)
            continue;
        s.values[i] = malloc(fr_nbytes(t));
        memcpy(s.values[i], fr_data(t), fr_nbytes(t));
    }
    return s;
}

static void drop(const fr_model *m, snapshot *s) {
    for (int i = 0; i < m->params->count; i++)
        free(s->values[i]);
    free(s->values);
}

/* Bit-identical; buffers only when `buffers` (a failed training forward
 * moves running statistics by an amount that depends on where it failed). */
static void expect_same(const fr_model *m, const snapshot *a, const snapshot *b, bool buffers,
                        const char *what) {
    CHECK(a->loss == b->loss);
    int compared = 0;
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        if (!a->values[i] || !b->values[i] || (e->kind == FR_BUFFER && !buffers))
            continue;
        size_t n = fr_nbytes(e->tensor);
        if (memcmp(a->values[i], b->values[i], n)) {
            fprintf(stderr, "   %s: %s differs\n", what, e->name);
            CHECK(false);
        }
        compared++;
    }
    CHECK(compared > 0);
}

/* One training step of m under `strategy` with `what` happening between
 * its forward (and loss) and its backward; other is a second model stepped
 * interleaved for OTHER_MODEL. */
static snapshot step(fr_model *m, fr_model *other, snapshot *other_out, const char *strategy,
                     float **init, fr_tensor *x, fr_tensor *x2, fr_tensor *labels, between what) {
    CHECK_OK(fr_strategy_parse(strategy, &m->cfg.strategy));
    fr_t_snapshot_restore(m, init);
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    fr_release(logits);
    CHECK_NOTNULL(loss);
    fr_tensor *other_loss = NULL;
    if (what == EVAL_NO_GRAD) {
        fr_no_grad_enter();
        fr_tensor *eval = fr_model_forward(m, x2, false);
        fr_no_grad_exit();
        CHECK_NOTNULL(eval);
        fr_release(eval);
    } else if (what == EVAL_FAILS) {
        /* an eval forward with grad on that runs out of memory part way,
         * after some of its segments (and their descriptions) were made */
        fr_mem_set_limit(FR_CPU, fr_mem_total_current(FR_CPU) + (size_t)700 * 1024);
        fr_tensor *eval = fr_model_forward(m, x2, false);
        fr_mem_set_limit(FR_CPU, 0);
        CHECK(eval == NULL);
        CHECK(fr_last_status() == FR_ERR_OOM);
        fr_release(eval);
    } else if (what == STRATEGY_CHANGE) {
        /* the backward must replay what the forward ran, not the new choice */
        CHECK_OK(fr_strategy_parse("abn+checkpoint:2", &m->cfg.strategy));
    } else if (what == OTHER_MODEL) {
        fr_tensor *o = fr_model_forward(other, x2, true);
        other_loss = o ? fr_cross_entropy(o, labels) : NULL;
        fr_release(o);
        CHECK_NOTNULL(other_loss);
    }
    snapshot s = {0};
    s.loss = loss ? fr_item(loss) : NAN;
    CHECK_OK(fr_backward(loss));
    fr_release(loss);
    if (other_loss) {
        /* One tape per thread: until backward frees only the graph it
         * consumed, the first backward frees the other model's graph too,
         * and the second backward must say so; when it runs, its gradients
         * must be the other model's own. */
        fr_status st = fr_backward(other_loss);
        CHECK(st == FR_OK || st == FR_ERR_GRAPH);
        if (st == FR_OK)
            *other_out = take(other);
        fr_release(other_loss);
        fr_params_zero_grad(other->params);
    }
    fr_tape_clear();
    snapshot t = take(m);
    t.loss = s.loss;
    fr_params_zero_grad(m->params);
    return t;
}

static void check_model(const char *name, const char *const *strategies, int n_strategies) {
    fr_model *m = fr_cli_model_create(name, 3, 10, 7);
    fr_model *other = fr_cli_model_create(name, 3, 10, 8);
    CHECK_NOTNULL(m);
    CHECK_NOTNULL(other);
    if (!m || !other) {
        fr_model_free(m);
        fr_model_free(other);
        return;
    }
    CHECK_OK(fr_strategy_parse("checkpoint:2", &other->cfg.strategy));
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(BATCH, 3, 32, 32), 11);
    fr_tensor *x2 = fr_t_rand(FR_CPU, 4, FR_SHAPE(BATCH, 3, 32, 32), 12);
    int32_t lab[BATCH] = {3, 1, 4, 1, 5, 9, 2, 6};
    fr_tensor *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(BATCH), FR_TAG_DATA, lab);
    float **init = fr_t_snapshot_save(m);
    float **other_init = fr_t_snapshot_save(other);

    snapshot alone = step(m, NULL, NULL, "plain", init, x, x2, labels, NOTHING);
    fr_tensor *other_logits = fr_model_forward(other, x2, true);
    fr_tensor *other_loss = other_logits ? fr_cross_entropy(other_logits, labels) : NULL;
    fr_release(other_logits);
    CHECK_OK(fr_backward(other_loss));
    snapshot other_alone = take(other);
    other_alone.loss = fr_item(other_loss);
    fr_release(other_loss);
    fr_params_zero_grad(other->params);
    static const between cases[] = {EVAL_NO_GRAD, EVAL_FAILS, STRATEGY_CHANGE, OTHER_MODEL};
    static const char *const case_names[] = {"eval no_grad", "eval fails", "strategy change",
                                             "other model"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fr_t_snapshot_restore(other, other_init);
        snapshot plain_other = {0};
        snapshot plain = step(m, other, &plain_other, "plain", init, x, x2, labels, cases[c]);
        bool buffers = cases[c] != EVAL_FAILS;
        if (cases[c] != EVAL_FAILS)
            expect_same(m, &alone, &plain, true, case_names[c]);
        for (int k = 0; k < n_strategies; k++) {
            fr_t_snapshot_restore(other, other_init);
            snapshot o = {0};
            snapshot ck = step(m, other, &o, strategies[k], init, x, x2, labels, cases[c]);
            char what[96];
            snprintf(what, sizeof what, "%s %s, %s", name, strategies[k], case_names[c]);
            expect_same(m, &plain, &ck, buffers, what);
            if (o.values) {
                o.loss = other_alone.loss;
                expect_same(other, &other_alone, &o, true, what);
                drop(other, &o);
            }
            drop(m, &ck);
        }
        if (plain_other.values)
            drop(other, &plain_other);
        drop(m, &plain);
    }
    drop(m, &alone);
    drop(other, &other_alone);
    fr_t_snapshot_free(m, init);
    fr_t_snapshot_free(other, other_init);
    fr_release(x);
    fr_release(x2);
    fr_release(labels);
    fr_model_free(m);
    fr_model_free(other);
    CHECK(fr_live_tensors() == 0);
}

static void test_resnet20_replay_owns_its_segment(void) {
    static const char *const s[] = {"checkpoint", "checkpoint:3", "recompute+checkpoint",
                                    "recompute+checkpoint:1"};
    check_model("resnet20", s, 4);
}

static void test_densenet_replay_owns_its_segment(void) {
    static const char *const s[] = {"checkpoint", "recompute+checkpoint:2"};
    check_model("densenet-bc-10-k4", s, 2);
}

int main(void) {
    RUN(test_resnet20_replay_owns_its_segment);
    RUN(test_densenet_replay_owns_its_segment);
    return TEST_SUMMARY();
}
