/* test_compress.c: compressed saved activations (compress:B;
 * autograd/compressed.c, cpu/compress.c). The codes: error bounds per bit
 * width, the same bytes on every ISA path and at 1, 2 and 3 threads,
 * unbiased rounding; the strategy: the ledger's exact saved bytes, replay
 * determinism, one step of each built-in model family within a stated
 * tolerance of plain, gradients whose mean over seeds approaches the exact
 * gradient, and every combination with the other strategies. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#include "autograd/checkpoint_log.h"
#include "autograd/node.h"
#include "cpu/compress.h"
#include "tensor/kernels.h"
#include "models/densenet.h"
#include "planner/planner.h"
#include "models/registry.h"

static const int BITS[] = {8, 4, 2};

/* A tensor of n values spread over a few scales (groups differ). */
static fr_tensor *spread(size_t n, uint32_t seed) {
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE((int64_t)n), seed);
    float *v = fr_data(x);
    for (size_t i = 0; i < n; i++)
        v[i] *= (float)(1 + (i / FR_COMPRESS_GROUP) % 5);
    return x;
}

static fr_tensor *packed_for(int bits, size_t n) {
    return fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)fr_compress_nbytes(bits, n)), FR_TAG_SAVED);
}

/* every decoded element within one step of its group's grid of the input */
static void test_round_trip_bounds(void) {
    const size_t n = 5 * FR_COMPRESS_GROUP + 77; /* a partial last group */
    fr_tensor *x = spread(n, 1);
    float *v = fr_data(x);
    for (size_t i = 2 * FR_COMPRESS_GROUP; i < 3 * FR_COMPRESS_GROUP; i++)
        v[i] = 0.25f; /* a constant group: exact */
    for (int b = 0; b < 3; b++) {
        fr_tensor *p = packed_for(BITS[b], n), *y = fr_empty_like(x, FR_TAG_TRANSIENT);
        CHECK_OK(fr_compress_pack_out(p, x, BITS[b], 99));
        CHECK_OK(fr_compress_unpack_out(y, p, BITS[b]));
        const float *d = fr_data(y);
        double worst = 0;
        for (size_t g = 0; g * FR_COMPRESS_GROUP < n; g++) {
            size_t lo_i = g * FR_COMPRESS_GROUP, m = n - lo_i < FR_COMPRESS_GROUP ? n - lo_i : FR_COMPRESS_GROUP;
            float lo = v[lo_i], hi = v[lo_i];
            for (size_t i = lo_i; i < lo_i + m; i++) {
                lo = fminf(lo, v[i]);
                hi = fmaxf(hi, v[i]);
            }
            double step = (hi - lo) / ((1 << BITS[b]) - 1);
            for (size_t i = lo_i; i < lo_i + m; i++) {
                double e = fabs((double)d[i] - v[i]);
                CHECK(e <= step * (1 + 1e-5) + 1e-6 * fabs(v[i]));
                if (step > 0)
                    worst = fmax(worst, e / step);
                if (step == 0)
                    CHECK(d[i] == v[i]);
            }
        }
        printf("    compress:%d: worst error %.3f steps, %zu bytes for %zu floats (%.2f bits each)\n",
               BITS[b], worst, fr_compress_nbytes(BITS[b], n), n,
               8.0 * (double)fr_compress_nbytes(BITS[b], n) / (double)n);
        fr_release(p);
        fr_release(y);
    }
    /* a NaN makes its group NaN, not a silent finite value */
    v[3] = NAN;
    fr_tensor *p = packed_for(4, n), *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    CHECK_OK(fr_compress_pack_out(p, x, 4, 1));
    CHECK_OK(fr_compress_unpack_out(y, p, 4));
    CHECK(isnan(((float *)fr_data(y))[0]) && !isnan(((float *)fr_data(y))[FR_COMPRESS_GROUP]));
    CHECK_ERR(fr_compress_pack_out(p, x, 3, 1), FR_ERR_ARG, "8, 4 or 2");
    CHECK_ERR(fr_compress_pack_out(p, x, 8, 1), FR_ERR_SHAPE, "needs");
    fr_release(p);
    fr_release(y);
    fr_release(x);
}

static void test_sign_mask(void) {
    const size_t n = 1003;
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE((int64_t)n), 3);
    fr_tensor *m = fr_empty(FR_CPU, FR_U8, 1, FR_SHAPE((int64_t)fr_sign_nbytes(n)), FR_TAG_SAVED);
    fr_tensor *y = fr_empty_like(x, FR_TAG_TRANSIENT);
    ((float *)fr_data(x))[5] = 0.0f;
    CHECK_OK(fr_sign_pack_out(m, x));
    CHECK_OK(fr_sign_unpack_out(y, m));
    const float *a = fr_data(x), *b = fr_data(y);
    for (size_t i = 0; i < n; i++)
        CHECK(b[i] == (a[i] > 0.0f ? 1.0f : 0.0f));
    fr_release(x);
    fr_release(m);
    fr_release(y);
}

/* the AVX2 and AVX-512 copies give the scalar reference's bytes and
 * values; so do 1, 2 and 3 threads. Groups whose minimum or maximum is a
 * zero of either sign hold the vector min/max reductions to the
 * reference's choice (the first such element), which the header keeps. */
static void test_paths_and_threads_identical(void) {
    const size_t n = 200 * FR_COMPRESS_GROUP + 5; /* enough groups for the team */
    fr_tensor *x = spread(n, 4);
    float *v = fr_data(x);
    for (size_t i = 0; i < n; i++) {
        size_t g = i / FR_COMPRESS_GROUP;
        float c = v[i] - 2.0f * (float)(1 + g % 5); /* about half below zero */
        float z = (i * 7 + g) % 3 ? 0.0f : -0.0f;
        v[i] = g % 4 == 0 ? (c > 0 ? c : z)                 /* ReLU-like: the minimum is a zero */
               : g % 4 == 1 ? (c < 0 ? c : z)               /* the maximum is a zero */
               : g % 4 == 2 && g % 8 == 6 ? z : v[i];       /* zeros only */
    }
    for (int b = 0; b < 3; b++) {
        size_t nb = fr_compress_nbytes(BITS[b], n);
        uint8_t *ref = malloc(nb), *got = malloc(nb);
        float *dref = malloc(n * sizeof *dref), *dgot = malloc(n * sizeof *dgot);
        CHECK_OK(fr_cpu_compress_pack_isa(FR_ISA_BASELINE, ref, fr_data(x), BITS[b], 7, n));
        CHECK_OK(fr_cpu_compress_unpack_isa(FR_ISA_BASELINE, dref, ref, BITS[b], n));
        for (int isa = FR_ISA_AVX2; isa < FR_ISA_COUNT; isa++) {
            CHECK_OK(fr_cpu_compress_pack_isa((fr_cpu_isa)isa, got, fr_data(x), BITS[b], 7, n));
            CHECK(memcmp(ref, got, nb) == 0);
            CHECK_OK(fr_cpu_compress_unpack_isa((fr_cpu_isa)isa, dgot, ref, BITS[b], n));
            CHECK(memcmp(dref, dgot, n * sizeof *dref) == 0);
        }
        int team = omp_get_max_threads();
        for (int t = 1; t <= 3; t++) {
            omp_set_num_threads(t);
            CHECK_OK(fr_cpu_compress_pack(got, fr_data(x), BITS[b], 7, n));
            CHECK(memcmp(ref, got, nb) == 0);
        }
        omp_set_num_threads(team);
        free(ref);
        free(got);
        free(dref);
        free(dgot);
    }
    /* sign masks, with a tail that is not a whole 16-element block */
    size_t nb = fr_sign_nbytes(n);
    uint8_t *ref = malloc(nb), *got = malloc(nb);
    float *dref = malloc(n * sizeof *dref), *dgot = malloc(n * sizeof *dgot);
    CHECK_OK(fr_cpu_sign_pack_isa(FR_ISA_BASELINE, ref, v, n));
    CHECK_OK(fr_cpu_sign_unpack_isa(FR_ISA_BASELINE, dref, ref, n));
    for (size_t i = 0; i < n; i++)
        CHECK(dref[i] == (v[i] > 0.0f ? 1.0f : 0.0f));
    for (int isa = FR_ISA_AVX2; isa < FR_ISA_COUNT; isa++) {
        CHECK_OK(fr_cpu_sign_pack_isa((fr_cpu_isa)isa, got, v, n));
        CHECK(memcmp(ref, got, nb) == 0);
        CHECK_OK(fr_cpu_sign_unpack_isa((fr_cpu_isa)isa, dgot, ref, n));
        CHECK(memcmp(dref, dgot, n * sizeof *dref) == 0);
    }
    free(ref);
    free(got);
    free(dref);
    free(dgot);
    fr_release(x);
}

/* Values for test_paths_every_size: groups over several scales, ReLU-like
 * groups (a zero minimum of either sign), and groups the vector copies must
 * treat exactly as the reference does: a constant group, one with a NaN, one
 * with an infinity, one whose range is so small (subnormal) that top / range
 * overflows, one that mixes -0 and +0 only, and one at the edge of the float
 * range. */
static void fill_awkward(float *v, size_t n, uint32_t seed) {
    uint32_t r = seed;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        size_t g = i / FR_COMPRESS_GROUP;
        float u = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.4f;
        float z = (r >> 3) & 1 ? 0.0f : -0.0f;
        switch (g % 9) {
        case 0: v[i] = u * (float)(1 + g % 5); break;
        case 1: v[i] = u > 0 ? u : z; break;
        case 2: v[i] = 0.75f; break;
        case 3: v[i] = i % 97 == 5 ? NAN : u; break;
        case 4: v[i] = i % 89 == 7 ? ((r >> 4) & 1 ? INFINITY : -INFINITY) : u; break;
        case 5: v[i] = (r >> 9) & 1 ? 1e-45f : 0.0f; break;
        case 6: v[i] = z; break;
        case 7: v[i] = u * 3e38f; break;
        default: v[i] = u < 0 ? u : z; break;
        }
    }
}

/* The packed format written out once more, from its definition (tensor/
 * shapes.h, kernels.def: compress_pack) and independently of cpu/compress.c,
 * whose every path, the baseline included, is vectorised: per group the
 * first element attaining the minimum and the maximum, NaN headers and zero
 * codes for a group with a NaN or an infinity, codes floor((x - lo) * inv +
 * u) capped at top (0 where that is not a number), packed from the low bits
 * up; decoding is lo + c * step. */
static void pack_by_definition(uint8_t *packed, float *decoded, const float *x, int bits,
                               uint64_t seed, size_t n) {
    const size_t G = FR_COMPRESS_GROUP, groups = (n + G - 1) / G, cb = G * (size_t)bits / 8;
    uint8_t *codes = packed + groups * 2 * sizeof(float);
    memset(codes, 0, groups * cb);
    for (size_t g = 0; g < groups; g++) {
        size_t base = g * G, m = n - base < G ? n - base : G;
        float lo = x[base], hi = x[base];
        int bad = 0;
        for (size_t i = base; i < base + m; i++) {
            if (x[i] < lo)
                lo = x[i];
            if (x[i] > hi)
                hi = x[i];
            bad |= !(x[i] - x[i] == 0.0f);
        }
        unsigned top = (1u << bits) - 1;
        float range = hi - lo, hdr[2] = {NAN, NAN};
        if (!bad && range - range == 0.0f) {
            hdr[0] = lo;
            hdr[1] = range / (float)top;
        }
        memcpy(packed + g * 2 * sizeof(float), hdr, sizeof hdr);
        float inv = range > 0.0f ? (float)top / range : 0.0f;
        uint32_t key = fr_compress_key(seed, g);
        for (size_t i = 0; i < m; i++) {
            unsigned c = 0;
            if (!isnan(hdr[0])) {
                float q = (x[base + i] - lo) * inv + fr_compress_uniform(key, (uint32_t)i);
                c = q >= 0.0f && q < 1e9f ? (unsigned)q : 0;
                c = c > top ? top : c;
            }
            size_t bit = i * (size_t)bits;
            codes[g * cb + bit / 8] |= (uint8_t)(c << (bit % 8));
            decoded[base + i] = hdr[0] + (float)c * hdr[1];
        }
    }
}

/* Every ISA path (each lowered to what this CPU has), every bit width, at
 * 1, 2 and 3 threads, on sizes with and without a partial last group and a
 * partial 16-element sign block: the reference's bytes and values. */
static void test_paths_every_size(void) {
    static const size_t sizes[] = {1, 7, 15, 16, 17, 255, 256, 257, 1000, 9 * FR_COMPRESS_GROUP,
                                   70 * FR_COMPRESS_GROUP + 13, 130 * FR_COMPRESS_GROUP};
    int team = omp_get_max_threads(), cases = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = malloc(n * sizeof *x), *dref = malloc(n * sizeof *dref), *dgot = malloc(n * sizeof *dgot);
        fill_awkward(x, n, (uint32_t)(n * 31 + 1));
        for (int b = 0; b < 4; b++) { /* 8, 4, 2 bits, then the sign mask */
            int sign = b == 3;
            size_t nb = sign ? fr_sign_nbytes(n) : fr_compress_nbytes(BITS[b], n);
            uint8_t *ref = malloc(nb), *got = malloc(nb);
            omp_set_num_threads(1);
            if (sign) {
                CHECK_OK(fr_cpu_sign_pack_isa(FR_ISA_BASELINE, ref, x, n));
                CHECK_OK(fr_cpu_sign_unpack_isa(FR_ISA_BASELINE, dref, ref, n));
            } else {
                CHECK_OK(fr_cpu_compress_pack_isa(FR_ISA_BASELINE, ref, x, BITS[b], 11, n));
                CHECK_OK(fr_cpu_compress_unpack_isa(FR_ISA_BASELINE, dref, ref, BITS[b], n));
            }
            /* the baseline path against the definition */
            uint8_t *def = calloc(nb, 1);
            int def_ok = 1;
            if (sign) {
                for (size_t i = 0; i < n; i++)
                    def[i / 8] |= (uint8_t)((x[i] > 0.0f) << (i % 8));
                for (size_t i = 0; i < n; i++)
                    def_ok &= dref[i] == (x[i] > 0.0f ? 1.0f : 0.0f);
            } else {
                pack_by_definition(def, dgot, x, BITS[b], 11, n);
                def_ok = memcmp(dref, dgot, n * sizeof *dref) == 0;
            }
            def_ok &= memcmp(def, ref, nb) == 0;
            if (!def_ok)
                printf("    baseline differs from the definition: n %zu, %d bits\n", n, sign ? 1 : BITS[b]);
            CHECK(def_ok);
            free(def);
            for (int isa = FR_ISA_BASELINE; isa < FR_ISA_COUNT; isa++)
                for (int t = 1; t <= 3; t++) {
                    omp_set_num_threads(t);
                    memset(got, 0xA5, nb);
                    memset(dgot, 0xA5, n * sizeof *dgot);
                    if (sign) {
                        CHECK_OK(fr_cpu_sign_pack_isa((fr_cpu_isa)isa, got, x, n));
                        CHECK_OK(fr_cpu_sign_unpack_isa((fr_cpu_isa)isa, dgot, ref, n));
                    } else {
                        CHECK_OK(fr_cpu_compress_pack_isa((fr_cpu_isa)isa, got, x, BITS[b], 11, n));
                        CHECK_OK(fr_cpu_compress_unpack_isa((fr_cpu_isa)isa, dgot, ref, BITS[b], n));
                    }
                    int same = memcmp(ref, got, nb) == 0 && memcmp(dref, dgot, n * sizeof *dref) == 0;
                    if (!same)
                        printf("    differs: n %zu, %d bits, path %s, %d threads\n", n,
                               sign ? 1 : BITS[b], fr_cpu_isa_name((fr_cpu_isa)isa), t);
                    CHECK(same);
                    cases++;
                }
            free(ref);
            free(got);
        }
        free(x);
        free(dref);
        free(dgot);
    }
    omp_set_num_threads(team);
    printf("    %d (size, width, path, team) cases against the reference; this CPU: %s\n", cases,
           fr_cpu_isa_name(fr_cpu_isa_detected()));
}

/* E[decoded] = x: the mean over many seeds approaches x (its error shrinks
 * as 1 / sqrt(seeds)); rounding to nearest, which is biased, fails this. */
static void test_rounding_unbiased(void) {
    enum { SEEDS = 2000 };
    const size_t n = FR_COMPRESS_GROUP;
    fr_tensor *x = fr_t_rand(FR_CPU, 1, FR_SHAPE((int64_t)n), 5);
    const float *v = fr_data(x);
    for (int b = 0; b < 3; b++) {
        fr_tensor *p = packed_for(BITS[b], n), *y = fr_empty_like(x, FR_TAG_TRANSIENT);
        double *mean = calloc(n, sizeof *mean);
        for (int s = 0; s < SEEDS; s++) {
            CHECK_OK(fr_compress_pack_out(p, x, BITS[b], 1000u + (uint64_t)s * 7919u));
            CHECK_OK(fr_compress_unpack_out(y, p, BITS[b]));
            for (size_t i = 0; i < n; i++)
                mean[i] += ((const float *)fr_data(y))[i] / SEEDS;
        }
        float lo = v[0], hi = v[0];
        for (size_t i = 0; i < n; i++) {
            lo = fminf(lo, v[i]);
            hi = fmaxf(hi, v[i]);
        }
        double step = (hi - lo) / ((1 << BITS[b]) - 1), worst = 0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs(mean[i] - v[i]));
        /* one decode has sd <= step / 2; the mean's is step / (2 sqrt(SEEDS));
         * 6 of those bound the largest of 256 */
        printf("    compress:%d: largest |mean over %d seeds - x| = %.4f steps\n", BITS[b], SEEDS,
               worst / step);
        CHECK(worst <= 6 * step / (2 * sqrt(SEEDS)));
        free(mean);
        fr_release(p);
        fr_release(y);
    }
    fr_release(x);
}

/* conv -> BN -> ReLU -> conv: compress:B keeps BN's input and the second
 * conv's input as codes and ReLU's output as bits; the ledger's `saved`
 * moves by exactly those sizes against plain. */
static void test_ledger_exact(void) {
    const int64_t N = 2, C = 4, H = 9;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, 3, H, H), 1);
    fr_tensor *w1 = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, 3, 3, 3), 2);
    fr_tensor *w2 = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 3, 3), 3);
    fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 4), *be = fr_t_rand(FR_CPU, 1, FR_SHAPE(C), 5);
    fr_tensor *ws[] = {w1, w2, g, be};
    for (int i = 0; i < 4; i++)
        fr_set_requires_grad(ws[i], true);
    size_t act = (size_t)(N * C * H * H), saved[4] = {0};
    int bits[] = {0, 8, 4, 2};
    for (int k = 0; k < 4; k++) {
        int outer;
        CHECK_OK(fr_compress_enter(bits[k], &outer));
        size_t base = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_conv_params p = {.stride = 1, .pad = 1};
        fr_tensor *a = fr_conv2d(x, w1, NULL, p);
        fr_tensor *b = fr_batch_norm(a, g, be, NULL, NULL, true, 0.1f, 1e-5f);
        fr_tensor *r = fr_relu(b);
        fr_tensor *o = fr_conv2d(r, w2, NULL, p);
        fr_release(a);
        fr_release(b);
        fr_release(r);
        saved[k] = fr_mem_current(FR_CPU, FR_TAG_SAVED) - base;
        fr_compress_restore(outer);
        fr_tensor *l = fr_sum(o);
        CHECK_OK(fr_backward(l));
        fr_release(l);
        fr_release(o);
        for (int i = 0; i < 4; i++)
            fr_zero_grad(ws[i]);
        if (k) /* plain held a (BN's input) and r (ReLU's output, conv's input) */
            CHECK(saved[k] == saved[0] - 2 * act * sizeof(float) +
                                  2 * fr_compress_nbytes(bits[k], act) + fr_sign_nbytes(act));
        printf("    compress:%d: saved %zu bytes (plain %zu)\n", bits[k], saved[k], saved[0]);
    }
    fr_release(x);
    for (int i = 0; i < 4; i++)
        fr_release(ws[i]);
}

/* A channels-last activation (a model's channels-last mode) is packed over
 * its NHWC storage as it lies: the same bytes as a flat tensor of that
 * storage, a group being FR_COMPRESS_GROUP consecutive elements of storage;
 * the saved copy decodes into a channels-last tensor again, whose storage
 * is the flat decode's. */
static void test_channels_last_storage_order(void) {
    const int64_t shape[4] = {2, 5, 9, 11}; /* 990 elements: a partial last group */
    fr_tensor *x = fr_t_rand(FR_CPU, 4, shape, 31);
    fr_tensor *cl = fr_layout_copy(x, true);
    CHECK(cl && fr_is_channels_last(cl));
    size_t n = (size_t)fr_numel(x);
    fr_tensor *flat = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE((int64_t)n), FR_TAG_TRANSIENT,
                                   fr_data(cl));
    for (int b = 0; b < 3; b++) {
        fr_tensor *pc = packed_for(BITS[b], n), *pf = packed_for(BITS[b], n);
        CHECK_OK(fr_compress_pack_out(pc, cl, BITS[b], 17));
        CHECK_OK(fr_compress_pack_out(pf, flat, BITS[b], 17));
        CHECK(memcmp(fr_data(pc), fr_data(pf), fr_compress_nbytes(BITS[b], n)) == 0);
        fr_tensor *dc = fr_empty_channels_last(FR_CPU, shape, FR_TAG_TRANSIENT);
        fr_tensor *df = fr_empty_like(flat, FR_TAG_TRANSIENT);
        CHECK_OK(fr_compress_unpack_out(dc, pc, BITS[b]));
        CHECK_OK(fr_compress_unpack_out(df, pf, BITS[b]));
        CHECK(memcmp(fr_data(dc), fr_data(df), n * sizeof(float)) == 0);
        /* the saved form: its recipe decodes into channels last */
        int outer;
        CHECK_OK(fr_compress_enter(BITS[b], &outer));
        fr_recipe *r = NULL;
        CHECK_OK(fr_compressed_of(cl, &r));
        fr_compress_restore(outer);
        CHECK(r != NULL);
        fr_tensor *y = r ? r->make(r) : NULL;
        CHECK(y && fr_is_channels_last(y) && !memcmp(y->shape, shape, sizeof shape));
        /* within one step of the whole tensor's range (a group's is less) */
        const float *yv = y ? fr_data(y) : NULL, *cv = fr_data(cl);
        float lo = cv[0], hi = cv[0];
        for (size_t i = 0; i < n; i++) {
            lo = fminf(lo, cv[i]);
            hi = fmaxf(hi, cv[i]);
        }
        double step = (hi - lo) / ((1 << BITS[b]) - 1) * (1 + 1e-5);
        for (size_t i = 0; yv && i < n; i++)
            if (!(fabs((double)yv[i] - cv[i]) <= step)) {
                CHECK(false);
                break;
            }
        fr_release(y);
        fr_recipe_release(r);
        fr_release(dc);
        fr_release(df);
        fr_release(pc);
        fr_release(pf);
    }
    fr_release(flat);
    fr_release(cl);
    fr_release(x);
}

/* A recomputable concatenation (DenseNet under recompute) keeps its
 * activation inputs as codes under compress:B: the ledger's saved bytes are
 * the codes of both features, not their full width, and backward through
 * the recipe's decoded concatenation matches plain within the rounding. */
static void test_concat_recipe_compressed(void) {
    const int64_t N = 2, C = 3, H = 8;
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(N, C, H, H), 11);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(C, C, 1, 1), 12);
    fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(2 * C), 13), *be = fr_t_rand(FR_CPU, 1, FR_SHAPE(2 * C), 14);
    fr_tensor *ws[] = {w, g, be};
    for (int i = 0; i < 3; i++)
        fr_set_requires_grad(ws[i], true);
    size_t feat = (size_t)(N * C * H * H), saved[2] = {0};
    fr_tensor *grad_plain = NULL;
    int bits[] = {0, 8};
    for (int k = 0; k < 2; k++) {
        int outer;
        CHECK_OK(fr_compress_enter(bits[k], &outer));
        fr_conv_params p = {.stride = 1, .pad = 0};
        fr_tensor *a = fr_conv2d(x, w, NULL, p); /* two activations */
        fr_tensor *b = fr_conv2d(x, w, NULL, p);
        size_t before = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_tensor *f[] = {a, b};
        fr_tensor *cat = fr_concat_recomputable(f, 2);
        fr_tensor *y = fr_batch_norm(cat, g, be, NULL, NULL, true, 0.1f, 1e-5f);
        fr_release(cat);
        saved[k] = fr_mem_current(FR_CPU, FR_TAG_SAVED) - before;
        fr_release(a);
        fr_release(b);
        fr_compress_restore(outer);
        fr_tensor *r = fr_relu(y);
        fr_tensor *l = fr_sum(r);
        fr_release(r);
        CHECK_OK(fr_backward(l));
        fr_release(l);
        fr_release(y);
        if (!k)
            grad_plain = fr_retain(w->grad);
        else
            CHECK(fr_t_allclose_t(w->grad, grad_plain, 2e-2, 5e-2, "conv weight gradient"));
        for (int i = 0; i < 3; i++)
            fr_zero_grad(ws[i]);
    }
    /* plain: the recipe holds both features at full width, BN its mean and
     * inverse deviation per channel; at 8 bits the features are codes */
    size_t stats = 2 * (size_t)(2 * C) * sizeof(float);
    CHECK(saved[0] == 2 * feat * sizeof(float) + stats);
    CHECK(saved[1] == 2 * fr_compress_nbytes(8, feat) + stats);
    printf("    concat recipe: saved %zu bytes at 8 bits (plain %zu)\n", saved[1], saved[0]);
    fr_release(grad_plain);
    fr_release(x);
    for (int i = 0; i < 3; i++)
        fr_release(ws[i]);
}

static fr_tensor *batch(int n, int hw, uint32_t seed, fr_tensor **labels) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(n, 3, hw, hw), seed);
    int32_t lab[16];
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)((seed + (uint32_t)i * 3u) % 10);
    *labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, lab);
    return x;
}

static fr_model *make(const char *name) {
    if (!strncmp(name, "densenet", 8))
        return fr_densenet_create(name, 0, 3, 10, 1);
    return fr_model_create(name, 3, 10, 1);
}

/* Counts the fused norms on a tape, and those that keep their input as a
 * concatenation's recipe (fr_t_tape_any's visitor). */
typedef struct {
    int norms, as_concat;
} norm_count;

static bool count_norm(const fr_node *node, void *ctx) {
    norm_count *c = ctx;
    if (strcmp(node->op, "bn_act"))
        return false;
    c->norms++;
    bool concat = false;
    for (int i = 0; i < node->n_saved; i++)
        concat |= node->saved[i].recipe && !strcmp(node->saved[i].recipe->op, "concat");
    c->as_concat += concat;
    return false;
}

/* A dense block under compress:B: each layer's norm keeps its input, the
 * concatenation of the features so far, as the recipe over the features'
 * codes (each packed once), not as codes of the whole concatenation packed
 * again by every layer (nn/segments.c, autograd/fn_bn_act.c); plain keeps
 * the concatenations themselves. */
static void test_dense_join_kept_as_recipe(void) {
    fr_model *m = make("densenet-bc-40");
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *labels, *x = batch(2, 8, 12, &labels);
    const char *strategies[] = {"plain", "compress:8"};
    size_t saved[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        CHECK_OK(fr_strategy_parse(strategies[s], &m->cfg.strategy));
        fr_tensor *logits = fr_model_forward(m, x, true);
        CHECK_NOTNULL(logits);
        norm_count c = {0};
        if (logits)
            fr_t_tape_any(logits, count_norm, &c);
        int norms = c.norms, as_concat = c.as_concat;
        printf("    %s: %d of %d fused norms keep a concatenation's recipe\n", strategies[s],
               as_concat, norms);
        CHECK(norms > 0);
        /* DenseNet-BC-40: 3 blocks of 6 layers, 2 norms each, 2
         * transitions and the last norm (39); every layer's first norm
         * reads a join but each block's first layer's (one tensor): 15 */
        CHECK(norms == 39);
        CHECK(as_concat == (s == 0 ? 0 : 15));
        saved[s] = fr_mem_current(FR_CPU, FR_TAG_SAVED);
        fr_release(logits);
        fr_tape_clear();
    }
    /* the bytes: with codes of each layer's whole concatenation this
     * forward kept 0.291 of plain's, now 0.246 (a quarter is what 8-bit
     * codes of everything plain keeps would take) */
    printf("    saved after the forward: %zu bytes plain, %zu compress:8 (%.3f)\n", saved[0],
           saved[1], (double)saved[1] / (double)saved[0]);
    CHECK(saved[1] * 100 < saved[0] * 27);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_SAVED) == 0);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* A concatenation's rebuild under compress:8 (fn_concat.c): the first
 * input decoded into the output's own buffer and moved into place image by
 * image, the others decoded one at a time: the bits of the concatenation
 * of each input's own decoding, at 1 and 3 images (the move is a no-op at
 * 1), with a held input among them; and the bytes in use while it runs stay
 * below the concatenation plus the second input's decoding (the first one's
 * decoding beside the output had held it twice). */
static void test_concat_rebuild_in_place(void) {
    /* (N, C, 8, 8) at N = 1 and 3, and (N, C) at N = 3 (one element an
     * image's channel: the move's blocks are a row each) */
    for (int k = 0; k < 3; k++) {
        int64_t n = k == 0 ? 1 : 3, hw = k == 2 ? 1 : 8;
        int nd = k == 2 ? 2 : 4;
        fr_tensor *f[3] = {fr_t_rand(FR_CPU, nd, FR_SHAPE(n, 40, hw, hw), 21),
                           fr_t_rand(FR_CPU, nd, FR_SHAPE(n, 3, hw, hw), 22),
                           fr_t_rand(FR_CPU, nd, FR_SHAPE(n, 2, hw, hw), 23)};
        fr_tensor *h[3];
        for (int i = 0; i < 3; i++) {
            fr_set_requires_grad(f[i], i < 2); /* a recorded concatenation carries the recipe */
            h[i] = i < 2 ? fr_scale(f[i], 2.0f) : fr_retain(f[i]); /* f[2]: a leaf, held */
        }
        int previous = 0;
        CHECK_OK(fr_compress_enter(8, &previous));
        fr_tensor *cat = fr_concat_recomputable(h, 3);
        fr_compress_restore(previous);
        fr_recipe *r = cat ? fr_live_recipe(cat) : NULL;
        CHECK_NOTNULL(r);
        fr_tensor *dec[3];
        for (int i = 0; i < 3; i++)
            dec[i] = i < 2 && h[i]->packed ? h[i]->packed->make(h[i]->packed) : fr_retain(h[i]);
        CHECK(h[0]->packed && h[1]->packed && !h[2]->packed);
        fr_tensor *want = fr_concat(dec, 3);
        for (int i = 0; i < 3; i++)
            fr_release(dec[i]);
        size_t base = fr_mem_total_current(FR_CPU);
        fr_mem_reset_peak();
        fr_tensor *got = r ? r->make(r) : NULL;
        size_t held = fr_mem_total_peak(FR_CPU) - base;
        CHECK(got && want && fr_t_same_bits(want, got));
        size_t out = (size_t)fr_numel(want) * sizeof(float),
               second = (size_t)(n * 3 * hw * hw) * sizeof(float);
        CHECK(held <= out + second + 4096);
        fr_release(got);
        fr_release(want);
        fr_release(cat);
        for (int i = 0; i < 3; i++) {
            fr_release(h[i]);
            fr_release(f[i]);
        }
        fr_tape_clear();
    }
}

/* An inplace write drops the recipe of the tensor it writes
 * (fr_bump_version; fr_live_recipe): a norm that saves a recomputable
 * concatenation after `cat += shift` keeps the current values (their
 * codes under compress:8), not the recipe, which rebuilds the values from
 * before the add. Against the exact gradients (no compression, a plain
 * concatenation): 0.009-0.010 relative error as codes either way; through
 * the stale recipe it had been 0.90, with no error raised. */
static double inputs_grad_error(int bits, bool recomputable, fr_tensor **want) {
    fr_tensor *g = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 3), *b = fr_t_rand(FR_CPU, 1, FR_SHAPE(5), 4);
    fr_tensor *shift = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 5, 6, 6), 5);
    fr_tensor *f[2] = {fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 2, 6, 6), 6),
                       fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 3, 6, 6), 7)};
    fr_tensor *h[2];
    for (int i = 0; i < 2; i++) {
        fr_set_requires_grad(f[i], true);
        h[i] = fr_scale(f[i], 1.5f); /* activations, which compression takes */
    }
    int previous = 0;
    CHECK_OK(fr_compress_enter(bits, &previous));
    fr_manual_seed(7);
    fr_tensor *cat = recomputable ? fr_concat_recomputable(h, 2) : fr_concat(h, 2);
    CHECK(cat && (fr_live_recipe(cat) != NULL) == recomputable);
    fr_tensor *added = cat ? fr_add_(cat, shift) : NULL;
    CHECK(added && !fr_live_recipe(cat));
    fr_bn_state s = {.gamma = g, .beta = b, .training = true, .momentum = 0.1f, .eps = 1e-5f};
    fr_tensor *y = added ? fr_bn_act(cat, NULL, &s, FR_ACT_RELU, 0.0f, FR_BNACT_KEEP) : NULL;
    fr_compress_restore(previous);
    fr_tensor *loss = y ? fr_sum(y) : NULL;
    CHECK_NOTNULL(loss);
    if (loss)
        CHECK_OK(fr_backward(loss));
    double num = 0, den = 0;
    for (int i = 0; i < 2; i++) {
        if (!want[i])
            want[i] = fr_retain(f[i]->grad);
        const float *a = fr_data_f32(f[i]->grad), *e = fr_data_f32(want[i]);
        for (int64_t j = 0; j < fr_numel(want[i]); j++) {
            num += ((double)a[j] - e[j]) * ((double)a[j] - e[j]);
            den += (double)e[j] * e[j];
        }
        fr_release(h[i]);
        fr_release(f[i]);
    }
    fr_tensor *objs[] = {loss, y, added, cat, shift, g, b};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        fr_release(objs[i]);
    return sqrt(num / den);
}

static void test_inplace_write_drops_the_recipe(void) {
    /* through a view: the write bumps the storage, so cat's recipe (still
     * attached) is stale by its version */
    {
        fr_tensor *f[2] = {fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 2, 3, 3), 8),
                           fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 1, 3, 3), 9)};
        fr_set_requires_grad(f[0], true);
        fr_tensor *cat = fr_concat_recomputable(f, 2);
        CHECK(cat && fr_live_recipe(cat));
        fr_tensor *view = cat ? fr_narrow(cat, 0, 0, 1) : NULL;
        CHECK_OK(view ? fr_fill_(view, 0.5f) : FR_ERR_ARG);
        CHECK(cat && cat->recipe && !fr_live_recipe(cat));
        fr_release(view);
        fr_release(cat);
        fr_release(f[0]);
        fr_release(f[1]);
        fr_tape_clear();
    }
    fr_tensor *exact[2] = {NULL, NULL};
    CHECK(inputs_grad_error(0, false, exact) == 0);
    double codes = inputs_grad_error(8, false, exact), via = inputs_grad_error(8, true, exact);
    printf("    after cat += shift, compress:8: %.4f (a plain concatenation), %.4f (a recomputable "
           "one)\n", codes, via);
    CHECK(codes > 0 && codes < 0.05 && via > 0 && via < 0.05);
    fr_release(exact[0]);
    fr_release(exact[1]);
}

/* compress:8 against plain, one step of a model of every built-in family:
 * loss within 1e-3, every gradient within 5% of its tensor's largest. With
 * recompute too, all gradients as one vector within 3% of plain's, as
 * compress:8 alone is: the fused BN+ReLU keeps its mask as bits rather than
 * rebuilding it from decoded codes (autograd/fn_bn_act.c), which had given
 * 0.18 on ResNet-20 and 0.26 on DenseNet-BC-40. With checkpoint:1 too,
 * whose replays run on their inputs' decoded codes but save the ReLU masks
 * their forwards kept (autograd/checkpoint_log.h): rebuilt there, they
 * had given 0.13 (resnet8), 0.18 (preresnet11) and 0.28 (densenet-bc-40). */
static void test_models_close_to_plain(void) {
    const char *names[] = {"resnet8", "preresnet11", "densenet-bc-40"};
    for (size_t i = 0; i < 3; i++) {
        fr_model *m = make(names[i]);
        CHECK_NOTNULL(m);
        if (!m)
            continue;
        fr_tensor *labels, *x = batch(4, 8, 11, &labels);
        float **init = fr_t_snapshot_save(m);
        fr_manual_seed(1);
        fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
        fr_t_step got = fr_t_model_step(m, "compress:8", init, x, labels);
        CHECK_CLOSE(got.loss, ref.loss, 1e-3);
        fr_t_compare_steps(m, &ref, &got, 0.05, names[i]);
        fr_t_step rc = fr_t_model_step(m, "recompute+compress:8", init, x, labels);
        long taken = fr_checkpoint_masks_taken();
        fr_t_step ck = fr_t_model_step(m, "checkpoint:1+compress:8", init, x, labels);
        taken = fr_checkpoint_masks_taken() - taken;
        double e = fr_t_grad_rel_error(m, &ref, &got, ""), erc = fr_t_grad_rel_error(m, &ref, &rc, ""),
               eck = fr_t_grad_rel_error(m, &ref, &ck, "");
        printf("    %s: saved %zu -> %zu bytes at compress:8; gradient error %.4f, with recompute "
               "%.4f, with checkpoint:1 %.4f (%ld masks from the forward)\n",
               names[i], ref.peak_saved, got.peak_saved, e, erc, eck, taken);
        CHECK(e < 0.03 && erc < 0.03 && eck < 0.03);
        CHECK(taken > 0);
        fr_t_step_free(&rc, m->params->count);
        fr_t_step_free(&ck, m->params->count);
        CHECK(got.peak_saved * 3 < ref.peak_saved);
        fr_t_step_free(&ref, m->params->count);
        fr_t_step_free(&got, m->params->count);
        fr_t_snapshot_free(m, init);
        fr_release(x);
        fr_release(labels);
        fr_model_free(m);
    }
}

/* InPlace-ABN under compress:8 against abn, one step of ResNet-8 (batch
 * 4, 8x8): all gradients within 3%, alone and with checkpoint:1. ABN's
 * backward inverts its output; inverted from y's codes, leaky ReLU's
 * 1/slope multiplied a negative value's error by 100 and the gradients came
 * out 1.3x their size off; the codes are now of the pre-activation
 * (autograd/fn_bn_act.c): 0.011 and 0.013. */
static void test_abn_close_to_abn(void) {
    fr_model *m = make("resnet8");
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *labels, *x = batch(4, 8, 11, &labels);
    float **init = fr_t_snapshot_save(m);
    fr_manual_seed(1);
    fr_t_step ref = fr_t_model_step(m, "abn", init, x, labels);
    const char *with[] = {"abn+compress:8", "abn+checkpoint:1+compress:8"};
    for (int i = 0; i < 2; i++) {
        fr_t_step got = fr_t_model_step(m, with[i], init, x, labels);
        double e = fr_t_grad_rel_error(m, &ref, &got, "");
        printf("    resnet8 %s against abn: gradient error %.4f, saved %zu -> %zu bytes\n", with[i], e,
               ref.peak_saved, got.peak_saved);
        CHECK(e < 0.03);
        CHECK(got.peak_saved * 2 < ref.peak_saved);
        fr_t_step_free(&got, m->params->count);
    }
    fr_t_step_free(&ref, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* the gradient's mean over seeds approaches the exact one: its error falls
 * well below one seed's (as 1 / sqrt(seeds) when unbiased); per-layer
 * variance printed */
static void test_gradients_unbiased(void) {
    enum { SEEDS = 16 };
    fr_model *m = make("resnet8");
    fr_tensor *labels, *x = batch(4, 8, 12, &labels);
    float **init = fr_t_snapshot_save(m);
    fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
    int n = m->params->count;
    double **sum = calloc((size_t)n, sizeof *sum), **sq = calloc((size_t)n, sizeof *sq);
    double err_one = 0, norm = 0;
    for (int s = 0; s < SEEDS; s++) {
        fr_manual_seed(100 + (uint64_t)s);
        fr_t_step got = fr_t_model_step(m, "compress:2", init, x, labels);
        for (int i = 0; i < n; i++) {
            if (!ref.values[i] || m->params->items[i].kind != FR_PARAMETER)
                continue;
            size_t k = (size_t)fr_numel(m->params->items[i].tensor);
            if (!sum[i]) {
                sum[i] = calloc(k, sizeof(double));
                sq[i] = calloc(k, sizeof(double));
            }
            for (size_t j = 0; j < k; j++) {
                double d = got.values[i][j] - ref.values[i][j];
                sum[i][j] += got.values[i][j];
                sq[i][j] += d * d;
                if (s == 0) {
                    err_one += d * d;
                    norm += (double)ref.values[i][j] * ref.values[i][j];
                }
            }
        }
        fr_t_step_free(&got, m->params->count);
    }
    double err_mean = 0;
    for (int i = 0; i < n; i++) {
        if (!sum[i])
            continue;
        size_t k = (size_t)fr_numel(m->params->items[i].tensor);
        double e = 0, v = 0, r = 0;
        for (size_t j = 0; j < k; j++) {
            double d = sum[i][j] / SEEDS - ref.values[i][j];
            e += d * d;
            v += sq[i][j] / SEEDS;
            r += (double)ref.values[i][j] * ref.values[i][j];
        }
        err_mean += e;
        if (strstr(m->params->items[i].name, "weight") && !strstr(m->params->items[i].name, "bn"))
            printf("    %-24s rel. mean sq. error: one seed %.2e, mean of %d %.2e\n",
                   m->params->items[i].name, v / (r + 1e-30), SEEDS, e / (r + 1e-30));
        free(sum[i]);
        free(sq[i]);
    }
    printf("    all: |g - exact|^2 / |exact|^2 one seed %.3e, mean of %d seeds %.3e\n",
           err_one / norm, SEEDS, err_mean / norm);
    CHECK(err_one > 0);
    CHECK(err_mean < err_one / 4); /* unbiased: about err_one / SEEDS */
    free(sum);
    free(sq);
    fr_t_step_free(&ref, m->params->count);
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* with every other strategy: runs, keeps fewer bytes than without
 * compression, at 8 bits stays within 5% of its gradients, and the same
 * seed gives the same step bit for bit (checkpoint replays draw the
 * forward's codes) */
static void test_combinations(void) {
    const char *others[] = {"plain",      "checkpoint:1",   "recompute",
                            "abn",        "checkpoint:2",   "abn+checkpoint",
                            "recompute+checkpoint", "recompute+checkpoint:1"};
    const char *models[] = {"resnet8", "densenet-bc-40"};
    for (size_t mi = 0; mi < 2; mi++) {
        fr_model *m = make(models[mi]);
        fr_tensor *labels, *x = batch(4, 8, 13, &labels);
        float **init = fr_t_snapshot_save(m);
        for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
            if (mi == 1 && strstr(others[i], "abn"))
                continue; /* abn and DenseNet: see test_densenet.c */
            char text[96];
            fr_manual_seed(5);
            fr_t_step base = fr_t_model_step(m, others[i], init, x, labels);
            for (int b = 0; b < 3; b++) {
                snprintf(text, sizeof text, "%s+compress:%d", others[i], BITS[b]);
                if (!strcmp(others[i], "plain"))
                    snprintf(text, sizeof text, "compress:%d", BITS[b]);
                fr_manual_seed(5);
                fr_t_step a = fr_t_model_step(m, text, init, x, labels);
                fr_manual_seed(5);
                fr_t_step again = fr_t_model_step(m, text, init, x, labels);
                fr_t_compare_steps(m, &a, &again, -1, text);
                CHECK(isfinite(a.loss) && fabsf(a.loss - base.loss) < 0.05f);
                CHECK(a.peak_saved < base.peak_saved);
                /* at 8 bits, the gradients within 5% of the same strategy
                 * without compression (abn's had been 130% off) */
                double e = fr_t_grad_rel_error(m, &base, &a, "");
                if (BITS[b] == 8)
                    CHECK(e < 0.05);
                printf("    %s %-36s peak saved %8zu (without: %8zu), gradient error %.4f\n",
                       models[mi], text, a.peak_saved, base.peak_saved, e);
                fr_t_step_free(&a, m->params->count);
                fr_t_step_free(&again, m->params->count);
            }
            fr_t_step_free(&base, m->params->count);
        }
        fr_t_snapshot_free(m, init);
        fr_release(x);
        fr_release(labels);
        fr_model_free(m);
    }
}

/* conv, BN + ReLU, dropout, conv, BN + ReLU, pooled to a linear layer:
 * the model of test_dropout_keeps_plain_forward */
static fr_model *dropout_model(void) {
    fr_model *m = fr_model_new("compress-dropout", 3, 10, 1);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "c0", (fr_conv2d_opts){.in = 3, .out = 8});
    fr_norm_new(net, "n0", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_dropout_new(net, "drop", 0.3f);
    fr_conv2d_new(net, "c1", (fr_conv2d_opts){.in = 8, .out = 8});
    fr_norm_new(net, "n1", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 8, .out = 10});
    return fr_model_finish(m);
}

/* Compression draws its rounding from a stream of its own (autograd.h), so
 * with dropout (p 0.3) compress:8's forward is plain's: the same loss bit
 * for bit, the dropout stream left where plain leaves it. A
 * checkpoint:1+compress:8 replay then draws its forward's dropout masks:
 * its gradients within 5% of plain's, as compress:8's (on the one stream,
 * its replay packed where the no-grad forward had not and drew other masks:
 * 0.69 off, and compress:8's loss was another function's). A seeded step
 * repeats bit for bit; an unseeded second step rounds anew. */
static void test_dropout_keeps_plain_forward(void) {
    fr_model *m = dropout_model();
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_tensor *labels, *x = batch(4, 10, 5, &labels);
    float **init = fr_t_snapshot_save(m);
    const char *names[] = {"plain", "compress:8", "checkpoint:1+compress:8"};
    fr_t_step r[3], again[3];
    uint64_t after[3];
    for (int i = 0; i < 3; i++) {
        fr_manual_seed(7);
        r[i] = fr_t_model_step(m, names[i], init, x, labels);
        after[i] = fr_random_state();
        fr_manual_seed(7);
        again[i] = fr_t_model_step(m, names[i], init, x, labels);
        fr_t_compare_steps(m, &r[i], &again[i], -1, names[i]);
    }
    for (int i = 1; i < 3; i++) {
        CHECK(r[i].loss == r[0].loss);
        CHECK(after[i] == after[0]);
        double e = fr_t_grad_rel_error(m, &r[0], &r[i], "");
        printf("    dropout 0.3, %-24s loss %.7f (plain %.7f), gradient error %.4f\n", names[i],
               (double)r[i].loss, (double)r[0].loss, e);
        CHECK(e < 0.05);
    }
    /* the next step, unseeded, rounds with other seeds */
    fr_manual_seed(7);
    fr_t_step first = fr_t_model_step(m, "compress:8", init, x, labels);
    fr_t_step second = fr_t_model_step(m, "compress:8", init, x, labels);
    CHECK(fr_t_grad_rel_error(m, &first, &second, "") > 0);
    fr_t_step_free(&first, m->params->count);
    fr_t_step_free(&second, m->params->count);
    for (int i = 0; i < 3; i++) {
        fr_t_step_free(&r[i], m->params->count);
        fr_t_step_free(&again[i], m->params->count);
    }
    fr_t_snapshot_free(m, init);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* six convs, each followed by a fused norm + activation of this kind */
static fr_model *norm_act_model(fr_norm_kind kind, fr_act act) {
    fr_model *m = fr_model_new("compress-norm-act", 3, 10, 1);
    fr_module *net = fr_model_root(m);
    for (int i = 0; i < 6; i++) {
        char c[4] = {'c', (char)('0' + i), 0}, n[4] = {'n', (char)('0' + i), 0};
        fr_conv2d_new(net, c, (fr_conv2d_opts){.in = i ? 16 : 3, .out = 16});
        fr_norm_new(net, n, (fr_norm_opts){.channels = 16, .act = act, .kind = kind,
                                           .groups = kind == FR_NORM_GROUP ? 4 : 0});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 16, .out = 10});
    return fr_model_finish(m);
}

/* The fused group, instance and layer norm + ReLU or leaky ReLU keeps its
 * masks for a checkpoint's replay as BN + ReLU does (autograd/fn_norm.c):
 * checkpoint:1+compress:B's gradients within 2x compress:B's error against
 * plain (rebuilt from the decoded input, GroupNorm(4) + ReLU's were 27x at
 * compress:8: 0.060 against 0.0022), and the replay takes its forward's
 * masks. */
static void test_group_norm_masks_from_forward(void) {
    const fr_norm_kind kinds[] = {FR_NORM_GROUP, FR_NORM_INSTANCE, FR_NORM_LAYER, FR_NORM_GROUP};
    const fr_act acts[] = {FR_ACT_RELU, FR_ACT_RELU, FR_ACT_RELU, FR_ACT_LEAKY_RELU};
    const char *names[] = {"GroupNorm(4)+ReLU", "InstanceNorm+ReLU", "LayerNorm+ReLU",
                           "GroupNorm(4)+LeakyReLU"};
    for (int k = 0; k < 4; k++) {
        fr_model *m = norm_act_model(kinds[k], acts[k]);
        CHECK_NOTNULL(m);
        if (!m)
            continue;
        fr_tensor *labels, *x = batch(4, 12, 5, &labels);
        float **init = fr_t_snapshot_save(m);
        fr_manual_seed(3);
        fr_t_step ref = fr_t_model_step(m, "plain", init, x, labels);
        for (int b = 0; b < 2; b++) {
            char alone[32], ck[48];
            snprintf(alone, sizeof alone, "compress:%d", BITS[b]);
            snprintf(ck, sizeof ck, "checkpoint:1+compress:%d", BITS[b]);
            fr_t_step a = fr_t_model_step(m, alone, init, x, labels);
            long taken = fr_checkpoint_masks_taken();
            fr_t_step c = fr_t_model_step(m, ck, init, x, labels);
            taken = fr_checkpoint_masks_taken() - taken;
            double ea = fr_t_grad_rel_error(m, &ref, &a, ""), ec = fr_t_grad_rel_error(m, &ref, &c, "");
            printf("    %-22s %-24s gradient error %.4f (%s alone %.4f; %ld masks from the "
                   "forward)\n", names[k], ck, ec, alone, ea, taken);
            CHECK(ec < 2 * ea);
            CHECK(taken > 0);
            CHECK(c.loss == ref.loss);
            fr_t_step_free(&a, m->params->count);
            fr_t_step_free(&c, m->params->count);
        }
        fr_t_step_free(&ref, m->params->count);
        fr_t_snapshot_free(m, init);
        fr_release(x);
        fr_release(labels);
        fr_model_free(m);
    }
}

/* a budget below the leanest schedule without compression (at the whole
 * batch) is refused, and met with --allow-compress by compressing blocks;
 * the step then runs within it on the ledger */
static void test_planner_compresses(void) {
    fr_model *m = make("resnet8");
    fr_tensor *labels, *x = batch(8, 32, 21, &labels);
    fr_plan_options o = {.max_accum = 1}, oc = {.max_accum = 1, .allow_compress = true};
    fr_memory_plan lean, lean_c;
    CHECK_OK(fr_plan_memory(m, x->shape, (size_t)1 << 30, &o, &lean));
    CHECK_OK(fr_plan_memory(m, x->shape, (size_t)1 << 30, &oc, &lean_c));
    CHECK(lean_c.leanest_peak < 0.8 * lean.leanest_peak);
    size_t budget = (size_t)(0.5 * (lean.leanest_peak + lean_c.leanest_peak));
    fr_memory_plan plan;
    CHECK_ERR(fr_plan_memory(m, x->shape, budget, &o, &plan), FR_ERR_ARG, "too small");
    o.allow_compress = true;
    CHECK_OK(fr_plan_memory(m, x->shape, budget, &o, &plan));
    int compressed = 0;
    for (int u = 0; u < plan.n_units; u++)
        compressed += plan.units[u].strategy.compress != 0;
    CHECK(compressed > 0 && plan.accum == 1);
    CHECK_OK(fr_plan_apply(m, &plan));
    fr_mem_reset_peak();
    size_t base = fr_mem_total_current(FR_CPU);
    fr_tensor *logits = fr_model_forward(m, x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, labels) : NULL;
    CHECK_NOTNULL(loss);
    CHECK_OK(fr_backward(loss));
    size_t peak = fr_mem_total_peak(FR_CPU) - base;
    printf("    leanest without compression %.0f bytes, with %.0f; budget %zu; %d blocks compressed; "
           "predicted %.0f, measured %zu (above the parameters and batch)\n",
           lean.leanest_peak, lean_c.leanest_peak, budget, compressed, plan.predicted_peak, peak);
    CHECK((double)peak + plan.static_bytes <= (double)budget * 1.02);
    fr_release(logits);
    fr_release(loss);
    fr_params_zero_grad(m->params);
    fr_plan_remove(m);
    fr_memory_plan_free(&lean);
    fr_memory_plan_free(&lean_c);
    fr_memory_plan_free(&plan);
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

/* the strategy's name, and what it refuses */
static void test_strategy_text(void) {
    fr_strategy s;
    char buf[96];
    CHECK_OK(fr_strategy_parse("abn+checkpoint+compress:4", &s));
    CHECK(s.compress == 4 && s.abn && s.checkpoint == -1);
    CHECK(!strcmp(fr_strategy_format(s, buf, sizeof buf), "abn+checkpoint+compress:4"));
    CHECK_OK(fr_strategy_parse("compress", &s));
    CHECK(s.compress == 8);
    CHECK_ERR(fr_strategy_parse("compress:3", &s), FR_ERR_ARG, "compress:3");
    CHECK_ERR(fr_strategy_parse("compress+compress:4", &s), FR_ERR_ARG, "twice");
    /* half activations are refused, not kept at full width */
    fr_model *m = make("resnet8");
    fr_tensor *labels, *x = batch(2, 8, 1, &labels);
    CHECK_OK(fr_strategy_parse("compress:4", &m->cfg.strategy));
    m->cfg.precision = FR_BF16;
    fr_tensor *y = fr_model_forward(m, x, true);
    CHECK(!y && fr_last_status() == FR_ERR_DTYPE && strstr(fr_last_error(), "compress:4"));
    fr_clear_error();
    fr_release(y);
    fr_tape_clear();
    fr_release(x);
    fr_release(labels);
    fr_model_free(m);
}

int main(void) {
    RUN(test_round_trip_bounds);
    RUN(test_sign_mask);
    RUN(test_paths_and_threads_identical);
    RUN(test_paths_every_size);
    RUN(test_rounding_unbiased);
    RUN(test_ledger_exact);
    RUN(test_channels_last_storage_order);
    RUN(test_concat_recipe_compressed);
    RUN(test_strategy_text);
    RUN(test_models_close_to_plain);
    RUN(test_abn_close_to_abn);
    RUN(test_planner_compresses);
    RUN(test_gradients_unbiased);
    RUN(test_combinations);
    RUN(test_dropout_keeps_plain_forward);
    RUN(test_group_norm_masks_from_forward);
    RUN(test_dense_join_kept_as_recipe);
    RUN(test_inplace_write_drops_the_recipe);
    RUN(test_concat_rebuild_in_place);
    return TEST_SUMMARY();
}
