/* test_checkpoint_user.c: checkpointing of models users write with blocks
 * (docs/MODELS.md) meets what plain does or refuses with an error, never a
 * crash or a silent wrong gradient (docs/ARCHITECTURE.md, "Strategies"):
 * a parameter or BN buffer written inplace between forward and backward is
 * FR_ERR_VERSION naming it; a block that returns its input passes the
 * gradient through and leaves the caller's tensors alone; a replay with no
 * output is an error; a tensor one segment makes and a later one reads is
 * refused. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "frugal.h"

static fr_tensor *labels_of(int n) {
    int32_t v[16];
    for (int i = 0; i < n; i++)
        v[i] = i % 3;
    return fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, v);
}

/* One step: loss into *loss, parameter gi's gradient into g (numel floats);
 * the backward's status. */
static fr_status step(fr_model *m, float **snap, const char *strategy, fr_tensor *x,
                      fr_tensor *labels, int gi, float *g, float *loss) {
    fr_t_snapshot_restore(m, snap);
    fr_strategy_parse(strategy, &m->cfg.strategy);
    fr_params_zero_grad(m->params);
    fr_manual_seed(7);
    fr_tensor *out = fr_model_forward(m, x, true);
    fr_tensor *l = out ? fr_model_loss(m, out, x, labels) : NULL;
    fr_release(out);
    *loss = l ? fr_item(l) : NAN;
    fr_status st = l ? fr_backward(l) : fr_last_status();
    fr_release(l);
    fr_tensor *gt = m->params->items[gi].tensor->grad;
    if (st == FR_OK && gt)
        memcpy(g, fr_data(gt), fr_nbytes(gt));
    if (st != FR_OK)
        fr_tape_clear();
    return st;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- D4: a parameter or buffer written between forward and backward ---- */

static fr_model *flat_model(void) {
    fr_model *m = fr_model_new("flat", 3, 3, 1);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "c0", (fr_conv2d_opts){.in = 3, .out = 4});
    fr_norm_new(net, "n0", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_conv2d_new(net, "c1", (fr_conv2d_opts){.in = 4, .out = 4});
    fr_norm_new(net, "n1", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_conv2d_new(net, "c2", (fr_conv2d_opts){.in = 4, .out = 4});
    fr_norm_new(net, "n2", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 4, .out = 3});
    return fr_model_finish(m);
}

/* Forward under strategy (training or eval, grad on), then `name` scaled
 * inplace (NULL: nothing), then backward: its status. */
static fr_status written_between(const char *strategy, bool training, const char *name) {
    fr_model *m = flat_model();
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 5), *y = labels_of(2);
    fr_strategy_parse(strategy, &m->cfg.strategy);
    fr_tensor *out = fr_model_forward(m, x, training);
    fr_tensor *loss = out ? fr_model_loss(m, out, x, y) : NULL;
    fr_release(out);
    if (name) {
        fr_no_grad_enter();
        fr_release(fr_scale_(fr_params_get(m->params, name), 0.5f));
        fr_no_grad_exit();
    }
    fr_status st = loss ? fr_backward(loss) : fr_last_status();
    fr_release(loss);
    fr_tape_clear();
    fr_release(x);
    fr_release(y);
    fr_model_free(m);
    return st;
}

static void test_written_parameter_refused(void) {
    const char *S[] = {"checkpoint:1", "recompute+checkpoint:1", "abn+checkpoint:1", "checkpoint"};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(written_between(S[i], true, NULL));
        fr_status st = written_between(S[i], true, "c1.weight");
        CHECK(st == FR_ERR_VERSION);
        CHECK(strstr(fr_last_error(), "c1.weight") && strstr(fr_last_error(), "scale_"));
        if (st != FR_ERR_VERSION)
            fprintf(stderr, "    %s: %s\n", S[i], fr_last_error());
        fr_clear_error();
    }
    /* eval mode reads the running statistics: writing them is caught;
     * training mode writes them in the forward, once, and passes */
    CHECK_OK(written_between("checkpoint:1", false, NULL));
    CHECK(written_between("checkpoint:1", false, "n0.running_var") == FR_ERR_VERSION);
    CHECK(strstr(fr_last_error(), "n0.running_var") != NULL);
    fr_clear_error();
}

/* ---- D6: a block that returns its input ---- */

typedef struct {
    fr_module *conv, *bn;
    bool skip;
} skip_blk;

static fr_tensor *skip_fwd(fr_module *self, fr_tensor *x, const fr_run *run) {
    skip_blk *b = fr_block_state(self);
    if (b->skip)
        return fr_retain(x);
    fr_tensor *y = fr_forward(b->conv, x, run);
    return fr_chain(y, fr_forward(b->bn, y, run));
}

static void test_identity_block(void) {
    fr_model *m = fr_model_new("ident", 3, 3, 1);
    fr_module *net = fr_model_root(m);
    for (int i = 0; i < 3; i++) {
        char nm[4] = {'b', (char)('0' + i), 0};
        fr_module *k = fr_block_new(net, nm, skip_fwd, sizeof(skip_blk));
        skip_blk *b = fr_block_state(k);
        b->conv = fr_conv2d_new(k, "conv", (fr_conv2d_opts){.in = 3, .out = 3});
        b->bn = fr_norm_new(k, "bn", (fr_norm_opts){.channels = 3, .act = FR_ACT_RELU});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 3, .out = 3});
    m = fr_model_finish(m);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 5), *y = labels_of(2);
    float **snap = fr_t_snapshot_save(m);
    /* the gradient of the first block that runs: through every segment */
    for (int skipped = 0; skipped < 2; skipped++) {
        for (int i = 0; i < 3; i++)
            ((skip_blk *)fr_block_state(fr_module_child(fr_model_root(m), i)))->skip =
                i == 1 - skipped;
        int gi = fr_params_find(m->params, skipped ? "b1.conv.weight" : "b0.conv.weight");
        size_t n = (size_t)fr_numel(m->params->items[gi].tensor);
        float *g0 = calloc(n, sizeof *g0), *g = calloc(n, sizeof *g);
        float l0, l;
        CHECK_OK(step(m, snap, "plain", x, y, gi, g0, &l0));
        const char *S[] = {"checkpoint:1", "checkpoint", "recompute+checkpoint:1"};
        for (int s = 0; s < 3; s++) {
            memset(g, 0, n * sizeof *g);
            CHECK_OK(step(m, snap, S[s], x, y, gi, g, &l));
            CHECK(l == l0);
            CHECK(rel_err(g, g0, n) < 1e-5);
            /* the caller's batch stays a tensor without a graph */
            CHECK(!x->requires_grad && !x->grad_fn);
        }
        CHECK_OK(step(m, snap, "plain", x, y, gi, g, &l));
        CHECK(l == l0);
        free(g0);
        free(g);
    }
    fr_t_snapshot_free(m, snap);
    fr_release(x);
    fr_release(y);
    fr_model_free(m);
}

/* ---- D7: a replay that returns NULL without an error ---- */

typedef struct {
    fr_tensor *w;
    int *calls;
} null_ctx;

/* its second call (the replay) returns NULL and sets no error */
static fr_tensor *null_on_replay(void *ctx, fr_tensor *x) {
    null_ctx *c = ctx;
    if ((*c->calls)++ > 0)
        return NULL;
    return fr_mul(x, c->w);
}

static fr_tensor *null_always(void *ctx, fr_tensor *x) {
    (void)ctx;
    (void)x;
    return NULL;
}

static void test_replay_without_output(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 3), 1);
    fr_tensor *w = fr_t_rand(FR_CPU, 2, FR_SHAPE(2, 3), 2);
    fr_set_requires_grad(w, true);
    int calls = 0;
    null_ctx c = {.w = w, .calls = &calls};
    fr_tensor *y = fr_checkpoint(null_on_replay, &c, sizeof c, x);
    fr_tensor *s = y ? fr_sum(y) : NULL;
    CHECK(s != NULL);
    if (s) {
        CHECK(fr_backward(s) != FR_OK);
        CHECK(strstr(fr_last_error(), "replay produced no output") != NULL);
    }
    fr_clear_error();
    fr_release(s);
    fr_release(y);
    fr_tape_clear();
    CHECK(fr_checkpoint(null_always, NULL, 0, x) == NULL);
    CHECK(fr_last_status() != FR_OK && strstr(fr_last_error(), "produced no output"));
    fr_clear_error();
    fr_release(w);
    fr_release(x);
}

/* ---- D8: a tensor that crosses a segment boundary ---- */

static fr_tensor *stash;

typedef struct {
    fr_module *conv, *bn;
    int role; /* 1: keeps its output in stash; 2: adds stash before its ReLU */
} stash_blk;

static fr_tensor *stash_fwd(fr_module *self, fr_tensor *x, const fr_run *run) {
    stash_blk *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv, x, run);
    if (b->role == 2)
        return fr_chain(y, fr_norm_add(b->bn, y, stash, run));
    y = fr_chain(y, fr_forward(b->bn, y, run));
    if (b->role == 1 && y) {
        fr_release(stash);
        stash = fr_retain(y);
    }
    return y;
}

static void test_stash_across_segments(void) {
    fr_model *m = fr_model_new("stash", 3, 3, 1);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = 3, .out = 4});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    int roles[5] = {0, 1, 0, 0, 2};
    for (int i = 0; i < 5; i++) {
        char nm[4] = {'b', (char)('0' + i), 0};
        fr_module *k = fr_block_new(net, nm, stash_fwd, sizeof(stash_blk));
        stash_blk *b = fr_block_state(k);
        b->role = roles[i];
        b->conv = fr_conv2d_new(k, "conv", (fr_conv2d_opts){.in = 4, .out = 4});
        b->bn = fr_norm_new(k, "bn", (fr_norm_opts){.channels = 4, .act = FR_ACT_RELU});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 4, .out = 3});
    m = fr_model_finish(m);
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 3, 6, 6), 5), *y = labels_of(2);
    float **snap = fr_t_snapshot_save(m);
    size_t n = (size_t)fr_numel(m->params->items[0].tensor);
    float *g0 = calloc(n, sizeof *g0), *g = calloc(n, sizeof *g);
    float l0, l;
    CHECK_OK(step(m, snap, "plain", x, y, 0, g0, &l0));
    /* maker and reader in different segments: refused, naming checkpoint */
    const char *refused[] = {"checkpoint:2", "checkpoint:1"};
    for (int s = 0; s < 2; s++) {
        fr_status st = step(m, snap, refused[s], x, y, 0, g, &l);
        CHECK(st == FR_ERR_GRAPH);
        CHECK(strstr(fr_last_error(), "checkpoint") && strstr(fr_last_error(), "segment"));
        fr_clear_error();
    }
    /* in one segment (stem and b0-b4; the last step runs as it is): plain's */
    CHECK_OK(step(m, snap, "checkpoint:6", x, y, 0, g, &l));
    CHECK(l == l0);
    CHECK(rel_err(g, g0, n) < 1e-5);
    fr_clear(&stash);
    free(g0);
    free(g);
    fr_t_snapshot_free(m, snap);
    fr_release(x);
    fr_release(y);
    fr_model_free(m);
}

int main(void) {
    RUN(test_written_parameter_refused);
    RUN(test_identity_block);
    RUN(test_replay_without_output);
    RUN(test_stash_across_segments);
    return TEST_SUMMARY();
}
