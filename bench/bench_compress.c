/* bench_compress.c: the compress section of `make bench` (issue 23's
 * "pack+unpack at >= 50% of memory bandwidth"): cpu/compress.c's pack and
 * unpack at 8, 4 and 2 bits and the 1-bit sign mask, on every ISA path this
 * CPU runs (the _isa entry points of cpu/compress.h, as the tests call
 * them), timed against a copy of the same f32 buffer by the same team of
 * threads: the copy is the bandwidth ceiling.
 *
 * Each case alternates its repetitions with the copy's, so both see the same
 * load, and keeps the fastest of each (on shared cores other work only adds
 * time). GB/s counts the bytes read plus the bytes written: pack:B reads 4n
 * and writes fr_compress_nbytes(B, n), unpack the reverse, the sign mask n/8
 * bytes for 4n, the copy 4n and 4n. `of copy` is the case's GB/s over the
 * copy's. On a loaded machine every repetition may lose the core for a
 * while, so the CPU time too (the process's, over the team size; an OpenMP
 * team's wait at the barrier counts, so it errs high) gives a second
 * fraction, `of copy (cpu)`. Output: `#` notes and one markdown table. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "cpu/compress.h"
#include "tensor/shapes.h"

typedef enum { OP_PACK, OP_UNPACK, OP_SIGN_PACK, OP_SIGN_UNPACK } op_kind;

typedef struct {
    size_t n;     /* floats */
    float *x;     /* input, n */
    float *y;     /* decoded / copied, n */
    uint8_t *buf; /* codes, the largest of fr_compress_nbytes(8, n) and the mask */
} bufs;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall time and the process's CPU time per thread of the team, of one call. */
typedef struct {
    double wall, cpu;
} span;

static span timed(const bufs *b, op_kind op, int bits, fr_cpu_isa isa, int team, bool copy);

static void keep_best(span *best, span s) {
    best->wall = s.wall < best->wall ? s.wall : best->wall;
    best->cpu = s.cpu < best->cpu ? s.cpu : best->cpu;
}

/* The ceiling: the team copies x into y, one contiguous chunk per thread
 * (a single memcpy would leave the second core idle). */
static void copy_team(const bufs *b) {
#pragma omp parallel
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t lo = b->n * t / nt, hi = b->n * (t + 1) / nt;
        memcpy(b->y + lo, b->x + lo, (hi - lo) * sizeof(float));
    }
}

static void run_op(const bufs *b, op_kind op, int bits, fr_cpu_isa isa) {
    fr_status s = FR_OK;
    switch (op) {
    case OP_PACK: s = fr_cpu_compress_pack_isa(isa, b->buf, b->x, bits, 7, b->n); break;
    case OP_UNPACK: s = fr_cpu_compress_unpack_isa(isa, b->y, b->buf, bits, b->n); break;
    case OP_SIGN_PACK: s = fr_cpu_sign_pack_isa(isa, b->buf, b->x, b->n); break;
    case OP_SIGN_UNPACK: s = fr_cpu_sign_unpack_isa(isa, b->y, b->buf, b->n); break;
    }
    if (s != FR_OK) {
        fprintf(stderr, "bench_compress: kernel failed\n");
        exit(1);
    }
}

static span timed(const bufs *b, op_kind op, int bits, fr_cpu_isa isa, int team, bool copy) {
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (copy)
        copy_team(b);
    else
        run_op(b, op, bits, isa);
    double c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID), w1 = clock_s(CLOCK_MONOTONIC);
    return (span){w1 - w0, (c1 - c0) / team};
}

static double op_bytes(size_t n, op_kind op, int bits) {
    double full = 4.0 * (double)n;
    switch (op) {
    case OP_PACK:
    case OP_UNPACK: return full + (double)fr_compress_nbytes(bits, n);
    default: return full + (double)fr_sign_nbytes(n);
    }
}

static int usage(FILE *out, const char *prog, int code) {
    fprintf(out,
            "usage: %s [--mib N] [--reps N] [--threads LIST] [--match TEXT]\n"
            "  --mib N       the f32 buffer packed, in MiB (default 64)\n"
            "  --reps N      repetitions of each case and of the copy, fastest kept (default 5)\n"
            "  --threads L   comma-separated team sizes (default 1,2)\n"
            "  --match TEXT  only the cases whose name (e.g. \"pack:4 avx2\") contains TEXT\n",
            prog);
    return code;
}

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 5;
    const char *threads = "1,2", *match = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help"))
            return usage(stdout, argv[0], 0);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = argv[++i];
        else if (!strcmp(argv[i], "--match") && i + 1 < argc)
            match = argv[++i];
        else
            return usage(stderr, argv[0], 2);
    }
    if (mib < 1 || mib > 4096 || reps < 1 || reps > 100)
        return usage(stderr, argv[0], 2);

    bufs b = {.n = mib << 18};
    size_t code_bytes = fr_compress_nbytes(8, b.n);
    if (fr_sign_nbytes(b.n) > code_bytes)
        code_bytes = fr_sign_nbytes(b.n);
    b.x = aligned_alloc(64, b.n * sizeof(float));
    b.y = aligned_alloc(64, b.n * sizeof(float));
    b.buf = aligned_alloc(64, (code_bytes + 63) / 64 * 64);
    if (!b.x || !b.y || !b.buf) {
        fprintf(stderr, "bench_compress: cannot allocate %zu MiB buffers\n", mib);
        return 1;
    }
    /* values over several scales, half of them negative (a ReLU input):
     * groups differ, and the sign mask is not all ones or all zeros */
    uint32_t r = 12345;
    for (size_t i = 0; i < b.n; i++) {
        r = r * 1664525u + 1013904223u;
        b.x[i] = ((float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f) * (float)(1 + (i >> 8) % 7);
    }
    memset(b.y, 0, b.n * sizeof(float));
    memset(b.buf, 0, code_bytes);

    fr_cpu_isa top = fr_cpu_isa_detected();
    char desc[160];
    fr_cpu_isa_describe(desc, sizeof desc);
    printf("# compress: %zu MiB of f32 (%zu floats, groups of %d), fastest of %d alternating "
           "repetitions of each case and of a copy of the same buffer; CPU: %s\n",
           mib, b.n, FR_COMPRESS_GROUP, reps, desc);
    FILE *la = fopen("/proc/loadavg", "r");
    char load[64] = "?";
    if (la) {
        if (!fgets(load, sizeof load, la))
            strcpy(load, "?");
        fclose(la);
        load[strcspn(load, "\n")] = 0;
    }
    printf("# compress: load average %s (2 shared cores: treat the times as noisy)\n", load);
    printf("\n| threads | case | path | ms | GB/s | copy GB/s | of copy | cpu ms | of copy (cpu) |\n");
    printf("|--:|---|---|--:|--:|--:|--:|--:|--:|\n");

    static const struct {
        const char *name;
        op_kind op;
        int bits;
    } cases[] = {
        {"pack:8", OP_PACK, 8},        {"unpack:8", OP_UNPACK, 8}, {"pack:4", OP_PACK, 4},
        {"unpack:4", OP_UNPACK, 4},    {"pack:2", OP_PACK, 2},     {"unpack:2", OP_UNPACK, 2},
        {"sign_pack", OP_SIGN_PACK, 1}, {"sign_unpack", OP_SIGN_UNPACK, 1},
    };
    int worst_missed = 0;
    for (const char *t = threads; *t;) {
        int team = atoi(t);
        if (team < 1 || team > 256)
            return usage(stderr, argv[0], 2);
        omp_set_num_threads(team);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            for (fr_cpu_isa isa = FR_ISA_BASELINE; isa <= top; isa++) {
                char name[64];
                snprintf(name, sizeof name, "%s %s", cases[c].name, fr_cpu_isa_name(isa));
                if (match && !strstr(name, match))
                    continue;
                /* unpack decodes what this path's pack wrote */
                if (cases[c].op == OP_UNPACK)
                    run_op(&b, OP_PACK, cases[c].bits, isa);
                if (cases[c].op == OP_SIGN_UNPACK)
                    run_op(&b, OP_SIGN_PACK, 1, isa);
                copy_team(&b); /* warm-up of both */
                run_op(&b, cases[c].op, cases[c].bits, isa);
                span best = {1e30, 1e30}, best_copy = {1e30, 1e30};
                for (int k = 0; k < reps; k++) {
                    keep_best(&best_copy, timed(&b, cases[c].op, cases[c].bits, isa, team, true));
                    keep_best(&best, timed(&b, cases[c].op, cases[c].bits, isa, team, false));
                }
                double bytes = op_bytes(b.n, cases[c].op, cases[c].bits), copied = 8.0 * (double)b.n;
                double gbs = bytes / best.wall * 1e-9, copy_gbs = copied / best_copy.wall * 1e-9;
                double frac = gbs / copy_gbs;
                double frac_cpu = bytes / best.cpu / (copied / best_copy.cpu);
                worst_missed += frac < 0.5;
                printf("| %d | %s | %s | %.3g | %.2f | %.2f | %.2f%s | %.3g | %.2f |\n", team,
                       cases[c].name, fr_cpu_isa_name(isa), best.wall * 1e3, gbs, copy_gbs, frac,
                       frac < 0.5 ? " (< 0.5)" : "", best.cpu * 1e3, frac_cpu);
                fflush(stdout);
            }
        }
        t = strchr(t, ',');
        if (!t)
            break;
        t++;
    }
    printf("\n# compress: %d case(s) below issue 23's 0.5 of the copy\n", worst_missed);
    free(b.x);
    free(b.y);
    free(b.buf);
    return 0;
}
