/* test_rss.c: the memory the process really holds stays near the ledger
 * (issue 22; cpu/allocator.c's bound): after a mixed-size workload the
 * allocator's reserved bytes stay within 115% of the ledger's peak, a
 * memory limit caps them, and the resident set of a small training run
 * that follows a large, freed staging phase (a data set read in full and
 * then cut, as --limit-train did) stays within 1.15x the ledger's peak plus
 * 64 MiB for code, libraries and thread stacks (VmHWM from /proc, a memory
 * figure, not a timing). Under AddressSanitizer the cache is off and the
 * sanitizer keeps freed memory in quarantine, so these tests skip. */
#include <stdlib.h>
#include <string.h>

#include "train/optim.h"
#include "models/resnet.h"
#include "testlib.h"

#if defined(__SANITIZE_ADDRESS__)
#define NEED_CACHE() SKIP("the CPU cache is off under AddressSanitizer")
#else
#define NEED_CACHE() (void)0
#endif

#define MIB ((size_t)1 << 20)

static fr_mem_stats cpu_stats(void) {
    fr_mem_stats s;
    fr_mem_get_stats(FR_CPU, &s);
    return s;
}

/* A deterministic mixed workload: n live slots, each round frees one and
 * allocates a new size between 100 bytes and max_bytes (log-uniform). */
static void churn(void **p, size_t *n_bytes, int n, int rounds, size_t max_bytes, uint32_t seed) {
    uint32_t r = seed;
    for (int i = 0; i < rounds; i++) {
        r = r * 1664525u + 1013904223u;
        int k = (int)((r >> 8) % (uint32_t)n);
        if (p[k])
            fr_mem_free(FR_CPU, p[k], n_bytes[k], FR_TAG_TRANSIENT);
        r = r * 1664525u + 1013904223u;
        double frac = (double)(r >> 8) / (double)(1u << 24);
        n_bytes[k] = (size_t)(100.0 * pow((double)max_bytes / 100.0, frac));
        p[k] = fr_mem_alloc(FR_CPU, n_bytes[k], FR_TAG_TRANSIENT);
        CHECK_NOTNULL(p[k]);
        if (p[k])
            memset(p[k], 1, n_bytes[k]); /* touched: resident */
    }
}

static void free_all(void **p, size_t *n_bytes, int n) {
    for (int i = 0; i < n; i++) {
        fr_mem_free(FR_CPU, p[i], n_bytes[i], FR_TAG_TRANSIENT);
        p[i] = NULL;
    }
}

/* Reserved bytes after two phases of different sizes: the second phase
 * cannot keep the first one's blocks (an unbounded cache held both). */
static void test_reserved_within_bound(void) {
    NEED_CACHE();
    enum { N = 24 };
    void *p[N] = {0};
    size_t n_bytes[N] = {0};
    fr_mem_empty_cache();
    fr_mem_reset_peak();
    churn(p, n_bytes, N, 400, 6 * MIB, 7);
    free_all(p, n_bytes, N);
    fr_mem_reset_peak(); /* phase 2: other sizes, a new peak */
    churn(p, n_bytes, N, 400, 3 * MIB, 11);
    fr_mem_stats s = cpu_stats();
    fprintf(stderr, "    ledger peak %.2f MiB, reserved %.2f MiB (peak %.2f MiB)\n",
            (double)s.total_peak / MIB, (double)s.reserved / MIB, (double)s.reserved_peak / MIB);
    CHECK(s.reserved >= s.total_current);
    /* 1.15x the peak, plus the 64-byte rounding of what was in use */
    CHECK(s.reserved_peak <= s.total_peak / 100 * 115 + 64 * (size_t)N + 4096);
    free_all(p, n_bytes, N);
    fr_mem_empty_cache();
    CHECK(cpu_stats().reserved == 0 || cpu_stats().reserved < MIB);
}

/* A limit caps what the cache keeps: with blocks of other sizes cached, a
 * new request gives them back first, so reserved stays under the limit. */
static void test_limit_caps_reserved(void) {
    NEED_CACHE();
    fr_mem_empty_cache();
    size_t sizes[] = {5 * MIB, 3 * MIB, 2 * MIB + 4096};
    void *a[3];
    for (int i = 0; i < 3; i++)
        CHECK_NOTNULL(a[i] = fr_mem_alloc(FR_CPU, sizes[i], FR_TAG_TRANSIENT));
    for (int i = 0; i < 3; i++)
        fr_mem_free(FR_CPU, a[i], sizes[i], FR_TAG_TRANSIENT);
    size_t limit = cpu_stats().total_current + 8 * MIB;
    fr_mem_set_limit(FR_CPU, limit);
    CHECK(cpu_stats().reserved <= limit);
    void *b = fr_mem_alloc(FR_CPU, 7 * MIB, FR_TAG_TRANSIENT); /* a class none of them has */
    CHECK_NOTNULL(b);
    CHECK(cpu_stats().reserved <= limit);
    fr_mem_free(FR_CPU, b, 7 * MIB, FR_TAG_TRANSIENT);
    CHECK_ERR(fr_t_status_of(fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE(9 << 20), FR_TAG_DATA)), FR_ERR_OOM,
              "limit");
    fr_mem_set_limit(FR_CPU, 0);
    fr_mem_empty_cache();
}

static size_t status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    size_t v = 0, n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':')
            v = (size_t)strtoull(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

/* A staging phase of 96 MiB (allocated, touched, freed), then a few
 * training steps of a small ResNet: the process's peak resident set over
 * the steps stays within 1.15x the ledger's peak + 64 MiB. */
static void test_training_rss_within_bound(void) {
    NEED_CACHE();
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (!cr)
        SKIP("no /proc/self/clear_refs to restart VmHWM");
    fr_mem_empty_cache();
    enum { N = 48 };
    void *p[N] = {0};
    size_t n_bytes[N];
    for (int i = 0; i < N; i++) {
        n_bytes[i] = 2 * MIB + (size_t)i * 4096;
        CHECK_NOTNULL(p[i] = fr_mem_alloc(FR_CPU, n_bytes[i], FR_TAG_DATA));
        if (p[i])
            memset(p[i], 2, n_bytes[i]);
    }
    for (int i = 0; i < N; i++)
        fr_mem_free(FR_CPU, p[i], n_bytes[i], FR_TAG_DATA);
    fr_mem_reset_peak(); /* the run starts here, as train's does */
    fputs("5", cr);      /* VmHWM restarts at VmRSS */
    fclose(cr);

    fr_model *m = fr_resnet_create("resnet8", 3, 10, 1);
    fr_optim *opt = m ? fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9}) : NULL;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(32, 3, 32, 32), 5);
    int32_t lab[32];
    for (int i = 0; i < 32; i++)
        lab[i] = i % 10;
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(32), FR_TAG_DATA, lab);
    CHECK(m && opt && x && y);
    for (int step = 0; step < 3 && m && opt && x && y; step++)
        if (isnan(fr_t_train_step(m, opt, x, y)))
            break;
    fr_mem_stats s = cpu_stats();
    size_t hwm = status_kib("VmHWM") * 1024;
    fprintf(stderr, "    ledger peak %.2f MiB, reserved peak %.2f MiB, VmHWM %.2f MiB\n",
            (double)s.total_peak / MIB, (double)s.reserved_peak / MIB, (double)hwm / MIB);
    CHECK(hwm > 0);
    CHECK(s.reserved_peak <= s.total_peak / 100 * 115 + 64 * 1024);
    CHECK(hwm <= s.total_peak / 100 * 115 + 64 * MIB);
    fr_tape_clear();
    fr_release(x);
    fr_release(y);
    fr_optim_free(opt);
    fr_model_free(m);
}

int main(void) {
    RUN(test_reserved_within_bound);
    RUN(test_limit_caps_reserved);
    RUN(test_training_rss_within_bound);
    return TEST_SUMMARY();
}
