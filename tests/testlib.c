/* testlib.c: see testlib.h. */
#include "testlib.h"

#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
