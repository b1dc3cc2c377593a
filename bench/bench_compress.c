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

#include <immintrin.h>
#include <omp.h>

#include "cpu/compress.h"
#include "tensor/kernels.h"
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

/* ------------------------------------------------------------------
 * Issue 23's "fuse decoding into the backward read where it pays
 * (measure)": the engine decodes a saved tensor into a full-width buffer
 * (autograd/compressed.c) that the backward kernel then reads. Two
 * backward reads, each timed both ways: unfused = the library's decode
 * (default path) then the consumer; fused = a prototype here (AVX-512
 * only, not in the library) that decodes in registers inside the
 * consumer's loop, so the decoded tensor is never written nor read back.
 *   relu_bwd    dx = s > 0 ? dy : 0 with s from the 1-bit mask: unfused is
 *               sign_unpack + act_backward (what compress does for ReLU)
 *   mul:B       dx = dy * x with x from B-bit codes: a stand-in for a
 *               pointwise backward that reads its saved input (BN's xhat
 *               term, leaky ReLU); unfused is compress_unpack + the loop
 * The fused and unfused results are compared (they must be equal). */
typedef struct {
    const bufs *b;
    float *dy, *dx;
    uint8_t *mask; /* the sign mask of x */
    int bits;      /* 1: relu_bwd */
} fuse_case;

static void mul_team(float *dx, const float *dy, const float *x, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dx[i] = dy[i] * x[i];
}

static void unfused(const fuse_case *f) {
    const bufs *b = f->b;
    fr_status s = f->bits == 1 ? fr_cpu_sign_unpack(b->y, f->mask, b->n)
                               : fr_cpu_compress_unpack(b->y, b->buf, f->bits, b->n);
    if (s == FR_OK && f->bits == 1)
        s = fr_cpu_act_backward(f->dx, f->dy, b->y, FR_ACT_RELU, 0.0f, b->n);
    else if (s == FR_OK)
        mul_team(f->dx, f->dy, b->y, b->n);
    if (s != FR_OK) {
        fprintf(stderr, "bench_compress: %s\n", fr_last_error());
        exit(1);
    }
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* The vector bodies are functions of their own: clang does not give an
 * OpenMP region the target attribute of the function it sits in. */
AVX512 static void relu_bwd_block(float *dx, const float *dy, const uint8_t *mask) {
    uint16_t m;
    memcpy(&m, mask, 2);
    _mm512_storeu_ps(dx, _mm512_maskz_loadu_ps((__mmask16)m, dy));
}

static void relu_bwd_fused(float *dx, const float *dy, const uint8_t *mask, size_t n) {
    size_t blocks = n / 16;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < blocks; k++)
        relu_bwd_block(dx + 16 * k, dy + 16 * k, mask + 2 * k);
    for (size_t i = 16 * blocks; i < n; i++)
        dx[i] = (mask[i / 8] >> (i % 8)) & 1 ? dy[i] : 0.0f;
}

/* One group: lo + c * step as the library's decoding rounds it, times dy. */
AVX512 static void mul_group(float *dx, const float *dy, const float *hdr, const uint8_t *in,
                             int bits, size_t m) {
    const __m512i sh2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i sh4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i top = _mm512_set1_epi32((1 << bits) - 1);
    const __m512 lo = _mm512_set1_ps(hdr[0]), step = _mm512_set1_ps(hdr[1]);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        const uint8_t *p = in + i * (size_t)bits / 8;
        __m512i c;
        if (bits == 8) {
            c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
        } else if (bits == 4) {
            uint32_t w[2];
            memcpy(w, p, 8);
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)w[0])),
                                           _mm256_set1_epi32((int)w[1]), 1);
            c = _mm512_and_si512(_mm512_srlv_epi32(v, sh4), top);
        } else {
            uint32_t w;
            memcpy(&w, p, 4);
            c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)w), sh2), top);
        }
        __m512 x = _mm512_add_ps(lo, _mm512_mul_ps(_mm512_cvtepi32_ps(c), step));
        _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(dy + i), x));
    }
    for (; i < m; i++) {
        size_t bit = i * (size_t)bits;
        unsigned c = (in[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
        dx[i] = dy[i] * (hdr[0] + (float)c * hdr[1]);
    }
}

static void mul_fused(float *dx, const float *dy, const uint8_t *packed, int bits, size_t n) {
    const size_t G = FR_COMPRESS_GROUP, groups = (n + G - 1) / G, cb = G * (size_t)bits / 8;
    const float *hdr = (const float *)(const void *)packed;
    const uint8_t *codes = packed + groups * 2 * sizeof(float);
#pragma omp parallel for schedule(static)
    for (size_t g = 0; g < groups; g++) {
        size_t base = g * G, m = n - base < G ? n - base : G;
        mul_group(dx + base, dy + base, hdr + 2 * g, codes + g * cb, bits, m);
    }
}

static void fused(const fuse_case *f) {
    if (f->bits == 1)
        relu_bwd_fused(f->dx, f->dy, f->mask, f->b->n);
    else
        mul_fused(f->dx, f->dy, f->b->buf, f->bits, f->b->n);
}

static span timed_fuse(const fuse_case *f, bool fuse, int team) {
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    if (fuse)
        fused(f);
    else
        unfused(f);
    double c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID), w1 = clock_s(CLOCK_MONOTONIC);
    return (span){w1 - w0, (c1 - c0) / team};
}

/* Returns the number of cases whose fused and unfused results differ. */
static int fuse_table(const bufs *b, const char *threads, int reps, const char *match) {
    if (fr_cpu_isa_detected() < FR_ISA_AVX512) {
        printf("\n# compress: the fused prototypes need AVX-512; not measured on this CPU\n");
        return 0;
    }
    fuse_case f = {.b = b};
    f.dy = aligned_alloc(64, b->n * sizeof(float));
    f.dx = aligned_alloc(64, b->n * sizeof(float));
    float *ref = aligned_alloc(64, b->n * sizeof(float));
    f.mask = aligned_alloc(64, (fr_sign_nbytes(b->n) + 63) / 64 * 64);
    if (!f.dy || !f.dx || !ref || !f.mask) {
        fprintf(stderr, "bench_compress: cannot allocate the fusion buffers\n");
        exit(1);
    }
    for (size_t i = 0; i < b->n; i++)
        f.dy[i] = b->x[(i * 7919) % b->n];
    if (fr_cpu_sign_pack(f.mask, b->x, b->n) != FR_OK)
        exit(1);
    printf("\n| threads | backward read | unfused ms | fused ms | fused / unfused | unfused cpu ms | "
           "fused cpu ms | fused / unfused (cpu) |\n");
    printf("|--:|---|--:|--:|--:|--:|--:|--:|\n");
    static const int widths[] = {1, 8, 4, 2};
    int wrong = 0;
    for (const char *t = threads; t && *t; t = strchr(t, ',') ? strchr(t, ',') + 1 : NULL) {
        int team = atoi(t);
        omp_set_num_threads(team);
        for (int w = 0; w < 4; w++) {
            char name[32];
            snprintf(name, sizeof name, widths[w] == 1 ? "relu_bwd" : "mul:%d", widths[w]);
            if (match && !strstr(name, match))
                continue;
            f.bits = widths[w];
            if (f.bits > 1)
                run_op(b, OP_PACK, f.bits, fr_cpu_isa_detected());
            unfused(&f);
            memcpy(ref, f.dx, b->n * sizeof(float));
            fused(&f);
            int same = memcmp(ref, f.dx, b->n * sizeof(float)) == 0;
            wrong += !same;
            span bu = {1e30, 1e30}, bf = {1e30, 1e30};
            for (int k = 0; k < reps; k++) {
                keep_best(&bu, timed_fuse(&f, false, team));
                keep_best(&bf, timed_fuse(&f, true, team));
            }
            printf("| %d | %s | %.3g | %.3g | %.2f%s | %.3g | %.3g | %.2f |\n", team, name,
                   bu.wall * 1e3, bf.wall * 1e3, bf.wall / bu.wall, same ? "" : " (RESULTS DIFFER)",
                   bu.cpu * 1e3, bf.cpu * 1e3, bf.cpu / bu.cpu);
            fflush(stdout);
        }
    }
    free(f.dy);
    free(f.dx);
    free(ref);
    free(f.mask);
    return wrong;
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
    int wrong = fuse_table(&b, threads, reps, match);
    free(b.x);
    free(b.y);
    free(b.buf);
    return wrong ? 1 : 0;
}
