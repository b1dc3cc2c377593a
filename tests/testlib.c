/* testlib.c: see testlib.h. */
#include "testlib.h"

#include "autograd/node.h"

#include <ftw.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int fr_t_failed_now;
const char *fr_t_skip_reason;
static int n_passed, n_failed, n_skipped;

void fr_t_run(const char *name, void (*fn)(void)) {
    long tensors = fr_live_tensors(), storages = fr_live_storages();
    size_t bytes[FR_DEVICE_COUNT];
    for (int d = 0; d < FR_DEVICE_COUNT; d++)
        bytes[d] = fr_mem_total_current((fr_device)d);
    fr_t_failed_now = 0;
    fr_t_skip_reason = NULL;
    fr_clear_error();
    fn();
    if (fr_tape_size() != 0) {
        fprintf(stderr, "    %s left %d nodes on the tape\n", name, fr_tape_size());
        fr_tape_clear();
        fr_t_failed_now = 1;
    }
    if (fr_live_tensors() != tensors || fr_live_storages() != storages) {
        fprintf(stderr, "    %s leaked %ld tensors, %ld storages\n", name,
                fr_live_tensors() - tensors, fr_live_storages() - storages);
        fr_t_failed_now = 1;
    }
    for (int d = 0; d < FR_DEVICE_COUNT; d++) {
        size_t now = fr_mem_total_current((fr_device)d);
        if (now != bytes[d]) {
            fprintf(stderr, "    %s leaked %lld bytes on %s\n", name,
                    (long long)now - (long long)bytes[d], fr_device_name((fr_device)d));
            fr_t_failed_now = 1;
        }
    }
    if (fr_t_failed_now) {
        printf("FAIL %s\n", name);
        n_failed++;
    } else if (fr_t_skip_reason) {
        printf("skip %s (%s)\n", name, fr_t_skip_reason);
        n_skipped++;
    } else {
        printf("ok   %s\n", name);
        n_passed++;
    }
    fflush(stdout);
}

int fr_t_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", n_passed, n_failed, n_skipped);
    return n_failed ? 1 : 0;
}

void fr_t_check_err(fr_status got, fr_status code, const char *needle, const char *expr,
                    const char *file, int line) {
    if (got != code || (needle && !strstr(fr_last_error(), needle))) {
        fprintf(stderr, "    %s:%d: %s gave %s \"%s\"; expected %s containing \"%s\"\n", file, line,
                expr, fr_status_name(got), fr_last_error(), fr_status_name(code),
                needle ? needle : "");
        fr_t_failed_now = 1;
    }
}

fr_status fr_t_status_of(fr_tensor *t) {
    if (t) {
        fr_release(t);
        return FR_OK;
    }
    return fr_last_status();
}

void fr_t_fill_rand(float *x, size_t n, uint32_t seed) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

fr_tensor *fr_t_rand(fr_device dev, int ndim, const int64_t *shape, uint32_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    float *host = malloc((size_t)(n ? n : 1) * sizeof *host);
    fr_t_fill_rand(host, (size_t)n, seed);
    fr_tensor *t = fr_from_host(dev, FR_F32, ndim, shape, FR_TAG_DATA, host);
    free(host);
    return t;
}

bool fr_t_allclose(const fr_tensor *got, const float *want, size_t n, double atol, double rtol,
                   const char *what) {
    if (!got) {
        fprintf(stderr, "    %s: tensor is NULL (%s)\n", what, fr_last_error());
        fr_t_failed_now = 1;
        return false;
    }
    if ((size_t)fr_numel(got) != n) {
        fprintf(stderr, "    %s: %lld elements, expected %zu\n", what, (long long)fr_numel(got), n);
        fr_t_failed_now = 1;
        return false;
    }
    float *host = malloc((n ? n : 1) * sizeof *host);
    if (fr_read_f32(got, host, n) != FR_OK) {
        fprintf(stderr, "    %s: cannot read: %s\n", what, fr_last_error());
        free(host);
        fr_t_failed_now = 1;
        return false;
    }
    size_t worst = 0, bad = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)host[i] - want[i]);
        double excess = err - (atol + rtol * fabs(want[i]));
        if (excess > 0 || host[i] != host[i]) {
            bad++;
            if (excess > worst_excess || host[i] != host[i]) {
                worst_excess = excess;
                worst = i;
            }
        }
    }
    if (bad) {
        fprintf(stderr, "    %s: %zu of %zu elements differ; worst [%zu] got %.9g want %.9g\n", what,
                bad, n, worst, host[worst], want[worst]);
        fr_t_failed_now = 1;
    }
    free(host);
    return bad == 0;
}

bool fr_t_allclose_t(const fr_tensor *got, const fr_tensor *want, double atol, double rtol,
                     const char *what) {
    if (!want) {
        fprintf(stderr, "    %s: expected tensor is NULL\n", what);
        fr_t_failed_now = 1;
        return false;
    }
    size_t n = (size_t)fr_numel(want);
    float *host = malloc((n ? n : 1) * sizeof *host);
    bool ok = fr_read_f32(want, host, n) == FR_OK && fr_t_allclose(got, host, n, atol, rtol, what);
    free(host);
    return ok;
}

fr_st_file *fr_t_fixture(const char *name) {
    const char *dir = getenv("FR_FIXTURES");
    char path[512];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir ? dir : "tests/fixtures", name);
    fr_st_file *f = fr_st_open(path);
    if (!f) {
        fprintf(stderr, "    fixture %s: %s\n", path, fr_last_error());
        fr_t_failed_now = 1;
    }
    return f;
}

fr_tensor *fr_t_fixture_tensor(fr_st_file *f, const char *name, fr_device dev) {
    if (!f)
        return NULL;
    fr_tensor *t = fr_st_get(f, name, dev, FR_TAG_DATA);
    if (!t) {
        fprintf(stderr, "    fixture tensor %s: %s\n", name, fr_last_error());
        fr_t_failed_now = 1;
    }
    return t;
}

fr_tensor *fr_t_fixture_case(fr_st_file *f, const char *prefix, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "%s_%s", prefix, name);
    return fr_t_fixture_tensor(f, key, FR_CPU);
}

bool fr_t_fixture_expect(fr_st_file *f, const char *prefix, const char *name, const fr_tensor *got,
                         double atol, double rtol) {
    char key[128];
    snprintf(key, sizeof key, "%s_%s", prefix, name);
    fr_tensor *want = fr_t_fixture_tensor(f, key, FR_CPU);
    bool ok = fr_t_allclose_t(got, want, atol, rtol, key);
    fr_release(want);
    return ok;
}

const char *fr_t_make_tmpdir(const char *tag) {
    static char dirs[8][256];
    static int next;
    char *d = dirs[next++ % 8];
    snprintf(d, sizeof dirs[0], "/tmp/fr_%s_XXXXXX", tag);
    if (!mkdtemp(d)) {
        perror("mkdtemp");
        abort();
    }
    return d;
}

static int remove_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void fr_t_remove_tmpdir(const char *path) { nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

static double loss_value(fr_t_loss_fn loss, void *ctx) {
    fr_no_grad_enter();
    fr_tensor *l = loss(ctx);
    fr_no_grad_exit();
    if (!l) {
        fprintf(stderr, "    gradcheck: loss failed: %s\n", fr_last_error());
        fr_t_failed_now = 1;
        return NAN;
    }
    double v = fr_item(l);
    fr_release(l);
    return v;
}

bool fr_t_gradcheck(fr_t_loss_fn loss, void *ctx, fr_tensor *const *wrt, int n_wrt, double eps,
                    double atol, double rtol, int max_points) {
    bool ok = true;
    for (int w = 0; w < n_wrt; w++) {
        fr_tensor *t = wrt[w];
        if (!t->grad) {
            fprintf(stderr, "    gradcheck: input %d has no gradient\n", w);
            fr_t_failed_now = 1;
            return false;
        }
        size_t n = (size_t)fr_numel(t);
        float *x = fr_data_f32(t), *g = fr_data_f32(t->grad);
        size_t step = n > (size_t)max_points ? n / (size_t)max_points : 1;
        for (size_t i = 0; i < n; i += step) {
            float keep = x[i];
            x[i] = keep + (float)eps;
            double up = loss_value(loss, ctx);
            x[i] = keep - (float)eps;
            double down = loss_value(loss, ctx);
            x[i] = keep;
            double numeric = (up - down) / (2.0 * eps);
            if (!(fabs(g[i] - numeric) <= atol + rtol * fabs(numeric))) {
                fprintf(stderr, "    gradcheck: input %d element %zu: analytic %.7g numeric %.7g\n",
                        w, i, g[i], numeric);
                fr_t_failed_now = 1;
                ok = false;
                break;
            }
        }
    }
    return ok;
}

fr_tensor *fr_t_weighted_sum(fr_tensor *y, uint32_t seed) {
    fr_tensor *r = fr_t_rand(fr_device_of(y), y->ndim, y->shape, seed);
    fr_tensor *p = r ? fr_mul(y, r) : NULL;
    fr_tensor *s = p ? fr_sum(p) : NULL;
    fr_release(r);
    fr_release(p);
    return s;
}

bool fr_t_have_cuda(void) { return fr_cuda_device_count() > 0; }

fr_t_pair fr_t_pair_of(fr_tensor *cpu) {
    fr_t_pair p = {cpu, cpu ? fr_to_device(cpu, FR_CUDA, FR_TAG_DATA) : NULL};
    CHECK_NOTNULL(p.g);
    return p;
}

fr_t_pair fr_t_pair_rand(int ndim, const int64_t *shape, uint32_t seed) {
    fr_tensor *c = fr_t_rand(FR_CPU, ndim, shape, seed);
    CHECK_NOTNULL(c);
    return fr_t_pair_of(c);
}

fr_t_pair fr_t_pair_empty(int ndim, const int64_t *shape) {
    fr_t_pair p = {fr_empty(FR_CPU, FR_F32, ndim, shape, FR_TAG_TRANSIENT),
                   fr_empty(FR_CUDA, FR_F32, ndim, shape, FR_TAG_TRANSIENT)};
    CHECK_NOTNULL(p.c);
    CHECK_NOTNULL(p.g);
    return p;
}

void fr_t_pair_free(fr_t_pair *p) {
    fr_clear(&p->c);
    fr_clear(&p->g);
}

void fr_t_pair_check(fr_t_pair p, double atol, double rtol, const char *what) {
    fr_t_allclose_t(p.g, p.c, atol, rtol, what);
}

/* ---- whole models ---- */

void fr_t_check_state_dict(const fr_params *p, const char *described, const char *model) {
    char *copy = strdup(described), *save = NULL;
    int i = 0;
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save), i++) {
        char *colon = strchr(item, ':');
        FR_ASSERT(colon);
        *colon = '\0';
        if (i >= p->count) {
            fprintf(stderr, "    %s: PyTorch has %s, frugal has only %d entries\n", model, item, p->count);
            fr_t_failed_now = 1;
            break;
        }
        const fr_param *e = &p->items[i];
        char shape[96] = "";
        for (int d = 0; d < e->tensor->ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), d ? ",%lld" : "%lld",
                     (long long)e->tensor->shape[d]);
        if (strcmp(e->name, item) || strcmp(shape, colon + 1)) {
            fprintf(stderr, "    %s entry %d: frugal %s (%s), PyTorch %s (%s)\n", model, i, e->name, shape,
                    item, colon + 1);
            fr_t_failed_now = 1;
            break;
        }
        bool buffer = strstr(item, "running_") || strstr(item, "num_batches_tracked");
        CHECK(e->kind == (buffer ? FR_BUFFER : FR_PARAMETER));
        CHECK(e->tensor->requires_grad == !buffer);
    }
    if (!fr_t_failed_now && i != p->count) {
        fprintf(stderr, "    %s: PyTorch has %d entries, frugal %d\n", model, i, p->count);
        fr_t_failed_now = 1;
    }
    free(copy);
}

void fr_t_check_grad(const fr_tensor *got, const fr_tensor *want, double tol, const char *what) {
    if (!got || !want) {
        fprintf(stderr, "    %s: gradient missing\n", what);
        fr_t_failed_now = 1;
        return;
    }
    int64_t n = fr_numel(want);
    float *w = malloc((size_t)n * sizeof *w);
    fr_read_f32(want, w, (size_t)n);
    double peak = 0;
    for (int64_t i = 0; i < n; i++)
        peak = fmax(peak, fabs(w[i]));
    fr_t_allclose(got, w, (size_t)n, tol * peak, tol, what);
    free(w);
}

void fr_t_step_vs_fixture(fr_model *m, fr_st_file *f, double atol, double rtol) {
    fr_tensor *x = fr_t_fixture_tensor(f, "input", FR_CPU);
    fr_tensor *labels = fr_t_fixture_tensor(f, "labels", FR_CPU);
    fr_tensor *want = fr_t_fixture_tensor(f, "logits_eval", FR_CPU);
    fr_no_grad_enter();
    fr_tensor *logits = fr_model_forward(m, x, false);
    fr_no_grad_exit();
    CHECK_NOTNULL(logits);
    fr_t_allclose_t(logits, want, atol, rtol, "eval logits");
    fr_release(logits);
    fr_release(want);

    logits = fr_model_forward(m, x, true);
    want = fr_t_fixture_tensor(f, "logits_train", FR_CPU);
    fr_t_allclose_t(logits, want, atol, rtol, "train logits");
    fr_release(want);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    want = fr_t_fixture_tensor(f, "loss", FR_CPU);
    fr_t_allclose_t(loss, want, atol, rtol, "loss");
    fr_release(want);
    CHECK_OK(fr_backward(loss));
    /* The tape is gone and with it everything it saved. */
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    fr_release(loss);
    fr_release(logits);
    fr_release(x);
    fr_release(labels);
}

float **fr_t_snapshot_save(const fr_model *m) {
    float **snap = calloc((size_t)m->params->count, sizeof(float *));
    for (int i = 0; i < m->params->count; i++) {
        const fr_tensor *t = m->params->items[i].tensor;
        if (t->dtype != FR_F32)
            continue;
        snap[i] = malloc(fr_nbytes(t));
        memcpy(snap[i], fr_data(t), fr_nbytes(t));
    }
    return snap;
}

void fr_t_snapshot_restore(const fr_model *m, float **snap) {
    for (int i = 0; i < m->params->count; i++)
        if (snap[i])
            memcpy(fr_data(m->params->items[i].tensor), snap[i], fr_nbytes(m->params->items[i].tensor));
}

void fr_t_snapshot_free(const fr_model *m, float **snap) {
    for (int i = 0; i < m->params->count; i++)
        free(snap[i]);
    free(snap);
}

bool fr_t_tape_any(const fr_tensor *t, bool (*visit)(const fr_node *node, void *ctx), void *ctx) {
    enum { MAX = 4096 };
    fr_node **todo = malloc(MAX * sizeof *todo);
    int n = 0, done = 0;
    bool found = false;
    if (todo && t && t->grad_fn)
        todo[n++] = t->grad_fn;
    while (done < n && !found) {
        fr_node *node = todo[done++];
        found = visit(node, ctx);
        for (int i = 0; i < node->n_inputs && n < MAX; i++) {
            fr_node *p = node->inputs[i].kind == FR_EDGE_NODE ? node->inputs[i].node : NULL;
            bool seen = false;
            for (int j = 0; p && j < n && !seen; j++)
                seen = todo[j] == p;
            if (p && !seen)
                todo[n++] = p;
        }
    }
    free(todo);
    return found;
}

fr_t_step fr_t_model_step(fr_model *m, const char *strategy, float **init, fr_tensor *x,
                          fr_tensor *labels) {
    fr_t_step r = {0};
    CHECK_OK(fr_strategy_parse(strategy, &m->cfg.strategy));
    if (init)
        fr_t_snapshot_restore(m, init);
    fr_mem_reset_peak();
    size_t base = fr_mem_total_current(FR_CPU);
    fr_mem_stats before, after;
    fr_mem_get_stats(FR_CPU, &before);
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_mem_get_stats(FR_CPU, &after);
    r.forward_allocs = after.n_allocs - before.n_allocs;
    r.forward_transient = fr_mem_peak(FR_CPU, FR_TAG_TRANSIENT);
    r.saved_forward = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    fr_tensor *loss = logits ? fr_model_loss(m, logits, x, labels) : NULL; /* m->loss if it has one */
    fr_release(logits);
    r.saved_loss = fr_mem_current(FR_CPU, FR_TAG_SAVED);
    CHECK_NOTNULL(loss);
    r.loss = loss ? fr_item(loss) : NAN;
    CHECK_OK(fr_backward(loss));
    fr_release(loss);
    /* whatever a failed step left on the tape (already reported); the peaks
     * are read after, clearing cannot raise them */
    fr_tape_clear();
    r.peak_saved = fr_mem_peak(FR_CPU, FR_TAG_SAVED);
    r.peak_total = fr_mem_total_peak(FR_CPU) - base;
    r.values = fr_t_step_capture(m, r.loss).values;
    fr_params_zero_grad(m->params);
    return r;
}

double fr_t_grad_rel_error(const fr_model *m, const fr_t_step *ref, const fr_t_step *got,
                           const char *prefix) {
    double num = 0, den = 0;
    for (int i = 0; i < m->params->count; i++) {
        if (m->params->items[i].kind != FR_PARAMETER ||
            strncmp(m->params->items[i].name, prefix, strlen(prefix)) != 0)
            continue;
        if (!ref->values[i] != !got->values[i])
            return INFINITY;
        for (int64_t j = 0; ref->values[i] && j < fr_numel(m->params->items[i].tensor); j++) {
            double d = (double)got->values[i][j] - ref->values[i][j];
            num += d * d;
            den += (double)ref->values[i][j] * ref->values[i][j];
        }
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

fr_t_step fr_t_step_capture(const fr_model *m, float loss) {
    fr_t_step r = {.loss = loss, .values = calloc((size_t)m->params->count, sizeof(float *))};
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        const fr_tensor *t = e->kind == FR_PARAMETER ? e->tensor->grad : e->tensor;
        if (!t || t->dtype != FR_F32)
            continue;
        r.values[i] = malloc(fr_nbytes(t));
        memcpy(r.values[i], fr_data(t), fr_nbytes(t));
    }
    return r;
}

void fr_t_step_free(fr_t_step *r, int n) {
    for (int i = 0; i < n; i++)
        free(r->values[i]);
    free(r->values);
}

void fr_t_compare_steps(const fr_model *m, const fr_t_step *ref, const fr_t_step *got, double tol,
                        const char *what) {
    if (tol < 0) {
        if (ref->loss != got->loss) {
            fprintf(stderr, "    %s: loss %.9g vs %.9g\n", what, got->loss, ref->loss);
            fr_t_failed_now = 1;
        }
    } else {
        CHECK_CLOSE(got->loss, ref->loss, tol * (1 + fabs(ref->loss)));
    }
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *e = &m->params->items[i];
        if (!ref->values[i] || !got->values[i]) {
            if (ref->values[i] != got->values[i] || e->kind == FR_PARAMETER) {
                fprintf(stderr, "    %s: %s missing in %s\n", what, e->name,
                        ref->values[i] || got->values[i] ? "one run" : "both runs");
                fr_t_failed_now = 1;
            }
            continue;
        }
        size_t n = (size_t)fr_numel(e->tensor);
        double scale = 0, worst = 0;
        for (size_t j = 0; j < n; j++)
            scale = fmax(scale, fabs(ref->values[i][j]));
        for (size_t j = 0; j < n; j++)
            worst = fmax(worst, fabs((double)ref->values[i][j] - got->values[i][j]));
        bool ok = tol < 0 ? !memcmp(ref->values[i], got->values[i], n * sizeof(float))
                          : worst <= tol * (1 + scale);
        if (!ok) {
            fprintf(stderr, "    %s: %s differs (max abs diff %.3g, scale %.3g)\n", what, e->name,
                    worst, scale);
            fr_t_failed_now = 1;
        }
    }
}

void fr_t_check_strategies(fr_model *m, float **init, fr_tensor *x, fr_tensor *labels,
                           const char *ref_strategy, const char *const *strategies, int n,
                           double tol, uint64_t seed) {
    fr_manual_seed(seed);
    fr_t_step ref = fr_t_model_step(m, ref_strategy, init, x, labels);
    for (int i = 0; i < n; i++) {
        fr_manual_seed(seed);
        fr_t_step r = fr_t_model_step(m, strategies[i], init, x, labels);
        fr_t_compare_steps(m, &ref, &r, tol, strategies[i]);
        if (tol < 0) {
            CHECK(r.peak_saved <= ref.peak_saved);
            if (strstr(strategies[i], "checkpoint"))
                CHECK(r.peak_saved < ref.peak_saved);
        } else {
            CHECK(r.peak_saved < ref.peak_saved);
        }
        fr_t_step_free(&r, m->params->count);
    }
    fr_t_step_free(&ref, m->params->count);
}

void fr_t_check_allocator_reuse(fr_device dev, const size_t *sizes, int k, int rounds) {
    enum { MAX_BLOCKS = 16 };
    FR_ASSERT(k >= 1 && k <= MAX_BLOCKS);
    void *p[MAX_BLOCKS];
    bool cpu = dev == FR_CPU;
    for (int i = 0; i < k; i++) /* warm up: the cache now holds these sizes */
        p[i] = fr_mem_alloc(dev, sizes[i], FR_TAG_TRANSIENT);
    for (int i = 0; i < k; i++) {
        CHECK_NOTNULL(p[i]);
        if (cpu)
            CHECK(((uintptr_t)p[i] & 63) == 0);
        fr_mem_free(dev, p[i], sizes[i], FR_TAG_TRANSIENT);
    }
    fr_mem_stats before, now, after;
    fr_mem_get_stats(dev, &before);
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < k; i++) {
            p[i] = fr_mem_alloc(dev, sizes[i], FR_TAG_TRANSIENT);
            CHECK_NOTNULL(p[i]);
            if (cpu && p[i])
                memset(p[i], 0xab, sizes[i]); /* the whole request is usable */
        }
        fr_mem_get_stats(dev, &now);
        CHECK(now.reserved >= now.total_current);
        for (int i = 0; i < k; i++)
            fr_mem_free(dev, p[i], sizes[i], FR_TAG_TRANSIENT);
    }
    fr_mem_get_stats(dev, &after);
    CHECK(after.device_mallocs == before.device_mallocs);
    CHECK(after.reserved == before.reserved);
    /* two 0-byte requests still get distinct pointers */
    void *a = fr_mem_alloc(dev, 0, FR_TAG_TRANSIENT), *b = fr_mem_alloc(dev, 0, FR_TAG_TRANSIENT);
    CHECK(a && b && a != b);
    fr_mem_free(dev, a, 0, FR_TAG_TRANSIENT);
    fr_mem_free(dev, b, 0, FR_TAG_TRANSIENT);
}

float fr_t_train_step(fr_model *m, fr_optim *opt, fr_tensor *x, fr_tensor *y) {
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, y) : NULL;
    fr_release(logits);
    CHECK_NOTNULL(loss);
    if (!loss)
        return NAN;
    CHECK_OK(fr_backward(loss));
    CHECK_OK(fr_optim_step(opt));
    fr_optim_zero_grad(opt);
    float v = fr_item(loss);
    fr_release(loss);
    return v;
}

/* ---- files ---- */

char *fr_t_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *b = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (!b)
        return NULL;
    b[n] = '\0';
    if (len)
        *len = (size_t)n;
    return b;
}

bool fr_t_write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b, 1, n, f) == n;
    return f && fclose(f) == 0 && ok;
}

bool fr_t_st_unseal(const char *path) {
    size_t n;
    char *b = fr_t_read_file(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; b && n >= 8 && i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)b[i];
    if (!b || n < 8 || hlen > n - 8) {
        free(b);
        return false;
    }
    size_t klen = strlen(FR_ST_CHECKSUM_KEY) + 4; /* "key":" */
    char *hdr = b + 8, *key = memmem(hdr, hlen, "\"" FR_ST_CHECKSUM_KEY "\":\"", klen);
    char *end = key ? memchr(key + klen, '"', (size_t)(hdr + hlen - (key + klen))) : NULL;
    bool ok = true;
    if (key && end) {
        char *from = key[-1] == ',' ? key - 1 : key; /* its comma too, when other fields precede it */
        size_t cut = (size_t)(end + 1 - from);
        memmove(from, end + 1, (size_t)(hdr + hlen - (end + 1)));
        memset(hdr + hlen - cut, ' ', cut);
        ok = fr_t_write_file(path, b, n);
    }
    free(b);
    return ok;
}

bool fr_t_st_flip(const char *path, const char *name, size_t at) {
    size_t n;
    char *b = fr_t_read_file(path, &n), key[300];
    uint64_t hlen = 0;
    for (int i = 7; b && n >= 8 && i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)b[i];
    snprintf(key, sizeof key, "\"%s\":{", name);
    /* the entry's fields follow its name; strstr stops at the 0 byte fr_t_read_file ends with */
    char *entry = b && n >= 8 && hlen <= n - 8 ? memmem(b + 8, hlen, key, strlen(key)) : NULL;
    char *offs = entry ? strstr(entry, "\"data_offsets\":[") : NULL;
    unsigned long long begin, end;
    bool ok = offs && sscanf(offs, "\"data_offsets\":[%llu,%llu]", &begin, &end) == 2 && at < end - begin &&
              8 + hlen + end <= n;
    if (ok) {
        b[8 + hlen + begin + at] ^= 1;
        ok = fr_t_write_file(path, b, n);
    }
    free(b);
    return ok;
}

/* ---- the example programs ---- */

static const char *example_dir(void) {
    static char dir[1024];
    if (!dir[0]) {
        char self[900];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        snprintf(dir, sizeof dir, "%s/../examples", n > 0 ? dirname(self) : ".");
    }
    return dir;
}

int fr_t_run_example(const char *prefix, const char *prog, const char *args, char *out, size_t len) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s timeout 300 %s/%s %s 2>&1", prefix, example_dir(), prog, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    int rc = p ? pclose(p) : -1;
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool fr_t_have_example(const char *prog) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", example_dir(), prog);
    return access(path, X_OK) == 0;
}

bool fr_t_have_programs(void) {
    return fr_t_have_example("train") && fr_t_have_example("validate") && fr_t_have_example("memreport");
}

void fr_t_example_fails(const char *prog, const char *args, const char *n1, const char *n2) {
    static char out[65536];
    int rc = fr_t_run_example("", prog, args, out, sizeof out);
    if (rc == 0 || rc == 124 || !strstr(out, n1) || (n2 && !strstr(out, n2))) {
        fprintf(stderr, "    %s %s: exit %d, output lacks \"%s\"/\"%s\":\n%s\n", prog, args, rc, n1,
                n2 ? n2 : "", out);
        fr_t_failed_now = 1;
    }
}

double fr_t_scaled_diff(const fr_tensor *a, const fr_tensor *ref) {
    const float *pa = fr_data_f32(a), *pr = fr_data_f32(ref);
    double worst = 0.0, scale = 0.0;
    for (int64_t i = 0; i < fr_numel(ref); i++) {
        double d = fabs((double)pa[i] - pr[i]);
        worst = d > worst || d != d ? d : worst;
        scale = fabs(pr[i]) > scale ? fabs(pr[i]) : scale;
    }
    return scale > 0.0 ? worst / scale : worst;
}

bool fr_t_same_bits(const fr_tensor *a, const fr_tensor *b) {
    return a->dtype == b->dtype && fr_numel(a) == fr_numel(b) &&
           memcmp(fr_data(a), fr_data(b), (size_t)fr_numel(a) * fr_dtype_size(a->dtype)) == 0;
}

int fr_t_run_self(const char *self, const char *name, const char *value, char *const argv[]) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv(name, value, 1);
        execv(self, argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double fr_t_half_ulp(fr_dtype dt) { return dt == FR_F16 ? 0x1p-10 : 0x1p-7; }

fr_tensor *fr_t_as(const fr_tensor *t, fr_dtype dt) {
    fr_tensor *h = fr_to_dtype(t, dt, FR_TAG_TRANSIENT);
    CHECK_NOTNULL(h);
    return h;
}

void fr_t_round_to(fr_tensor *t, fr_dtype dt) {
    fr_tensor *h = fr_t_as(t, dt);
    CHECK_OK(fr_copy_(t, h));
    fr_release(h);
}

fr_tensor *fr_t_empty_as(const fr_tensor *like, fr_dtype dt) {
    return fr_empty(fr_device_of(like), dt, like->ndim, like->shape, FR_TAG_TRANSIENT);
}

void fr_t_report_off(const char *what, fr_dtype dt, size_t bad, size_t n, size_t first, const float *got,
                     const float *ref) {
    if (!bad)
        return;
    fprintf(stderr, "    %s (%s): %zu of %zu elements off, first [%zu] %.9g vs %.9g\n", what, fr_dtype_name(dt),
            bad, n, first, got[first], ref[first]);
    fr_t_failed_now = 1;
}

size_t fr_t_backward_peak(fr_tensor *loss) {
    size_t base = fr_mem_total_current(FR_CPU);
    fr_mem_reset_peak();
    if (loss)
        CHECK_OK(fr_backward(loss));
    return fr_mem_total_peak(FR_CPU) - base;
}

int fr_t_run_main(int (*prog)(int, char **), const char *line) {
    char buf[2048], *argv[64];
    snprintf(buf, sizeof buf, "%s", line);
    int argc = 0;
    for (char *tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    fflush(stdout);
    int rc = prog(argc, argv);
    fflush(stdout);
    return rc;
}
