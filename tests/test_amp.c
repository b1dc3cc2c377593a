/* test_amp.c: the groundwork of mixed precision (docs/MIXED_PRECISION.md).
 *
 *  - f16 / bf16 conversions: every f16 and bf16 bit pattern widens exactly
 *    and round-trips (NaN stays NaN); f32 -> f16 / bf16 rounds to nearest,
 *    ties to even, on ~2.8 million values (every f16 tie and its neighbours,
 *    bf16 ties, random bit patterns, random values over f16's range) against
 *    a reference computed in double from the formats' definitions, as scalars
 *    and through fr_to_dtype; against PyTorch on the fixture of
 *    tests/fixtures/gen_amp.py. All exact (bit for bit).
 *  - a sum of 10^6 f16 values of 1000 through a cast to f32 is exactly 1e9.
 *  - the kernels nonfinite_count and unscale.
 *  - the dynamic loss scaler: an inf / NaN gradient skips the step
 *    (parameters and optimizer state unchanged bit for bit) and halves the
 *    scale; 2000 clean steps double it; unscaled gradients equal those of
 *    the unscaled loss (bit for bit with a power-of-two scale, to f32
 *    round-off, rtol 1e-6, with scale 1000); state get/set; bf16 / f32.
 *  - CUDA against the CPU (skipped without a GPU): casts bit for bit, the
 *    kernels, the sum, a scaler step that skips and one that does not. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "train/amp.h"
#include "nn/layers.h"
#include "testlib.h"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu); }

/* ---- the reference: rounding in double from the formats' definitions ---- */

/* A half format's non-negative patterns 0 .. inf_bits, as exact doubles;
 * the inf pattern gets the value the next pattern would have if the
 * exponent had no ceiling, so that rounding to it means overflow. */
typedef struct {
    uint16_t inf_bits, sign_bit;
    double *value; /* (inf_bits + 1) */
} half_format;

static half_format make_format(bool bf16) {
    half_format f = {bf16 ? 0x7f80 : 0x7c00, 0x8000, NULL};
    int mant_bits = bf16 ? 7 : 10, bias = bf16 ? 127 : 15;
    f.value = malloc(((size_t)f.inf_bits + 1) * sizeof *f.value);
    for (uint32_t b = 0; b <= f.inf_bits; b++) {
        int e = (int)(b >> mant_bits), m = (int)(b & ((1u << mant_bits) - 1));
        /* subnormal: m * 2^(1 - bias - mant_bits); normal: (2^mant_bits + m) * 2^(e - bias - mant_bits) */
        f.value[b] = e == 0 ? ldexp(m, 1 - bias - mant_bits)
                            : ldexp((1 << mant_bits) + m, e - bias - mant_bits);
    }
    return f;
}

/* The nearest pattern to x, ties to the even pattern, overflow to inf; NaN
 * gives 0xffff (callers test NaN separately). */
static uint16_t ref_round(const half_format *f, float x) {
    if (x != x)
        return 0xffff;
    uint16_t sign = (f32_bits(x) >> 31) ? f->sign_bit : 0;
    double ax = fabs((double)x);
    if (ax >= f->value[f->inf_bits])
        return sign | f->inf_bits;
    uint32_t lo = 0, hi = f->inf_bits; /* value[lo] <= ax < value[hi] */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (f->value[mid] <= ax)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = ax - f->value[lo], dhi = f->value[hi] - ax; /* both exact */
    uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
    return (uint16_t)(sign | r);
}

/* xorshift32: random bit patterns */
static uint32_t next_u32(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* The hard and the random cases for f32 -> f16 / bf16; *n set. */
static float *conversion_sample(size_t *n) {
    size_t cap = 2800000, k = 0;
    float *x = malloc(cap * sizeof *x);
    half_format f16 = make_format(false);
    /* every f16 tie (midpoint of neighbours, exact in f32), both signs, and
     * the f32 values one step either side */
    for (uint32_t b = 0; b < 0x7bff; b++) {
        float mid = (float)((f16.value[b] + f16.value[b + 1]) / 2);
        for (int s = 0; s < 2; s++) {
            uint32_t u = f32_bits(s ? -mid : mid);
            x[k++] = bits_f32(u);
            x[k++] = bits_f32(u + 1);
            x[k++] = bits_f32(u - 1);
        }
    }
    free(f16.value);
    uint32_t seed = 12345;
    for (int i = 0; i < 200000; i++) { /* bf16 ties and neighbours */
        uint32_t u = (next_u32(&seed) & 0xffff0000u) | 0x8000u;
        x[k++] = bits_f32(u);
        x[k++] = bits_f32(u + 1);
        x[k++] = bits_f32(u - 1);
    }
    for (int i = 0; i < 1000000; i++) /* any bit pattern: inf, NaN, subnormals included */
        x[k++] = bits_f32(next_u32(&seed));
    for (int i = 0; i < 1000000; i++) { /* f16's range: exponents 2^-27 .. 2^17 */
        uint32_t r = next_u32(&seed);
        uint32_t exp = 100u + (r >> 8) % 45u;
        x[k++] = bits_f32((r & 0x80000000u) | (exp << 23) | (next_u32(&seed) & 0x7fffffu));
    }
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.996f,
                              65520.0f, -65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                              0x1.8p-25f, FLT_MAX, -FLT_MAX, FLT_MIN, 0x1p-149f, 0x1.fefffep127f,
                              0x1.ff0000p127f, 0x1.fe8000p127f};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        x[k++] = specials[i];
    FR_ASSERT(k <= cap);
    *n = k;
    return x;
}

/* Compares half results with the reference; NaN in gives a NaN out. */
static void check_rounding(const float *x, const uint16_t *got, size_t n, bool bf16,
                           const char *what) {
    half_format f = make_format(bf16);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ref_round(&f, x[i]);
        bool ok = x[i] != x[i] ? (bf16 ? bf16_is_nan(got[i]) : f16_is_nan(got[i])) : got[i] == want;
        if (!ok && bad++ < 5)
            fprintf(stderr, "    %s: %a (0x%08x) -> 0x%04x, want 0x%04x\n", what, (double)x[i],
                    f32_bits(x[i]), got[i], want);
    }
    CHECK(bad == 0);
    free(f.value);
}

static void test_f32_to_half_rounds_to_nearest_even(void) {
    size_t n;
    float *x = conversion_sample(&n);
    uint16_t *h = calloc(n, sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = fr_f32_to_f16(x[i]);
    check_rounding(x, h, n, false, "fr_f32_to_f16");
    for (size_t i = 0; i < n; i++)
        h[i] = fr_f32_to_bf16(x[i]);
    check_rounding(x, h, n, true, "fr_f32_to_bf16");
    /* the same through tensors (the cast kernel) */
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE((int64_t)n), FR_TAG_DATA, x);
    fr_tensor *t16 = t ? fr_to_dtype(t, FR_F16, FR_TAG_DATA) : NULL;
    fr_tensor *tb16 = t ? fr_to_dtype(t, FR_BF16, FR_TAG_DATA) : NULL;
    CHECK_NOTNULL(t16);
    CHECK_NOTNULL(tb16);
    if (t16 && tb16) {
        CHECK(t16->dtype == FR_F16 && tb16->dtype == FR_BF16);
        check_rounding(x, fr_data(t16), n, false, "fr_to_dtype f16");
        check_rounding(x, fr_data(tb16), n, true, "fr_to_dtype bf16");
    }
    fr_release(tb16);
    fr_release(t16);
    fr_release(t);
    free(h);
    free(x);
}

/* Every pattern widens to its exact value and comes back unchanged. */
static void check_all_patterns(bool bf16) {
    half_format f = make_format(bf16);
    uint16_t *h = malloc(65536 * sizeof *h);
    for (uint32_t b = 0; b < 65536; b++)
        h[b] = (uint16_t)b;
    size_t bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t mag = b & 0x7fff;
        bool nan = bf16 ? bf16_is_nan((uint16_t)b) : f16_is_nan((uint16_t)b);
        float w = bf16 ? fr_bf16_to_f32((uint16_t)b) : fr_f16_to_f32((uint16_t)b);
        uint16_t back = bf16 ? fr_f32_to_bf16(w) : fr_f32_to_f16(w);
        double want = mag == f.inf_bits ? INFINITY : mag < f.inf_bits ? f.value[mag] : NAN;
        if (b & 0x8000)
            want = -want;
        bool ok = nan ? (w != w && (bf16 ? bf16_is_nan(back) : f16_is_nan(back)))
                      : ((double)w == want && (f32_bits(w) >> 31) == (b >> 15) && back == b);
        if (!ok && bad++ < 5)
            fprintf(stderr, "    %s 0x%04x -> %a -> 0x%04x\n", bf16 ? "bf16" : "f16", b, (double)w,
                    back);
    }
    CHECK(bad == 0);
    /* through tensors: half -> f32 -> half */
    fr_dtype dt = bf16 ? FR_BF16 : FR_F16;
    fr_tensor *t = fr_from_host(FR_CPU, dt, 1, FR_SHAPE(65536), FR_TAG_DATA, h);
    fr_tensor *w = t ? fr_to_dtype(t, FR_F32, FR_TAG_DATA) : NULL;
    fr_tensor *back = w ? fr_to_dtype(w, dt, FR_TAG_DATA) : NULL;
    CHECK_NOTNULL(back);
    bad = 0;
    for (uint32_t b = 0; back && b < 65536; b++) {
        uint16_t got = ((const uint16_t *)fr_data(back))[b];
        float wide = fr_data_f32(w)[b];
        float scalar = bf16 ? fr_bf16_to_f32((uint16_t)b) : fr_f16_to_f32((uint16_t)b);
        bool nan = bf16 ? bf16_is_nan((uint16_t)b) : f16_is_nan((uint16_t)b);
        bool ok = nan ? (bf16 ? bf16_is_nan(got) : f16_is_nan(got)) && wide != wide
                      : got == b && f32_bits(wide) == f32_bits(scalar);
        bad += !ok;
    }
    CHECK(bad == 0);
    fr_release(back);
    fr_release(w);
    fr_release(t);
    free(h);
    free(f.value);
}

static void test_all_f16_patterns_round_trip(void) { check_all_patterns(false); }
static void test_all_bf16_patterns_round_trip(void) { check_all_patterns(true); }

/* PyTorch's .half() and .bfloat16() on the fixture's values, bit for bit
 * (NaN: both NaN). */
static void test_conversions_match_pytorch(void) {
    fr_st_file *f = fr_t_fixture("amp");
    if (!f)
        return;
    fr_tensor *x = fr_t_fixture_tensor(f, "f32", FR_CPU);
    fr_tensor *w16 = fr_t_fixture_tensor(f, "to_f16", FR_CPU);
    fr_tensor *wb16 = fr_t_fixture_tensor(f, "to_bf16", FR_CPU);
    fr_tensor *g16 = x ? fr_to_dtype(x, FR_F16, FR_TAG_DATA) : NULL;
    fr_tensor *gb16 = x ? fr_to_dtype(x, FR_BF16, FR_TAG_DATA) : NULL;
    CHECK_NOTNULL(g16);
    CHECK_NOTNULL(gb16);
    if (x && w16 && wb16 && g16 && gb16) {
        CHECK(w16->dtype == FR_F16 && wb16->dtype == FR_BF16);
        size_t n = (size_t)fr_numel(x), bad = 0;
        CHECK(n == 16384);
        const uint16_t *a = fr_data(g16), *b = fr_data(w16), *c = fr_data(gb16), *d = fr_data(wb16);
        for (size_t i = 0; i < n; i++) {
            bool ok16 = f16_is_nan(b[i]) ? f16_is_nan(a[i]) : a[i] == b[i];
            bool okb = bf16_is_nan(d[i]) ? bf16_is_nan(c[i]) : c[i] == d[i];
            if ((!ok16 || !okb) && bad++ < 5)
                fprintf(stderr, "    %a: f16 0x%04x (torch 0x%04x), bf16 0x%04x (torch 0x%04x)\n",
                        (double)fr_data_f32(x)[i], a[i], b[i], c[i], d[i]);
        }
        CHECK(bad == 0);
    }
    fr_release(gb16);
    fr_release(g16);
    fr_release(wb16);
    fr_release(w16);
    fr_release(x);
    fr_st_close(f);
}

/* 10^6 f16 values of 1000 sum to 1e9 (far past f16's 65504) once widened:
 * the sum accumulates in double and 1e9 is exact in f32. */
static void sum_of_halves(fr_device dev) {
    enum { N = 1000000 };
    uint16_t *h = malloc(N * sizeof *h);
    for (size_t i = 0; i < N; i++)
        h[i] = fr_f32_to_f16(1000.0f);
    CHECK(fr_f16_to_f32(h[0]) == 1000.0f);
    fr_tensor *x = fr_from_host(dev, FR_F16, 1, FR_SHAPE(N), FR_TAG_DATA, h);
    fr_tensor *wide = x ? fr_to_dtype(x, FR_F32, FR_TAG_TRANSIENT) : NULL;
    fr_tensor *out = fr_empty(dev, FR_F32, 1, FR_SHAPE(1), FR_TAG_TRANSIENT);
    CHECK_NOTNULL(wide);
    if (wide && out) {
        CHECK_OK(fr_sum_out(out, wide));
        CHECK(fr_item(out) == 1e9f);
    }
    fr_release(out);
    fr_release(wide);
    fr_release(x);
    free(h);
}

static void test_sum_of_million_halves_is_exact(void) { sum_of_halves(FR_CPU); }

/* ---- kernels ---- */

enum { KN = 100003 }; /* above the threading threshold */

/* Random values with inf, -inf and NaNs of several kinds at fixed places,
 * and finite extremes elsewhere; returns how many are not finite. */
static int fill_with_nonfinite(float *x, size_t n) {
    fr_t_fill_rand(x, n, 7);
    const size_t at[] = {0, 17, 40000, 77777, n - 1};
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN, bits_f32(0x7f800001u) /* signalling */};
    for (int i = 0; i < 5; i++)
        x[at[i]] = bad[i];
    x[5] = FLT_MAX;
    x[6] = -FLT_MAX;
    x[7] = 0x1p-149f;
    return 5;
}

static void test_nonfinite_count_accumulates(void) {
    float *h = malloc(KN * sizeof *h);
    int want = fill_with_nonfinite(h, KN);
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(KN), FR_TAG_DATA, h);
    fr_tensor *clean = fr_t_rand(FR_CPU, 2, FR_SHAPE(30, 40), 3);
    fr_tensor *count = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(1), FR_TAG_WORKSPACE);
    CHECK_OK(fr_nonfinite_count_(count, clean));
    CHECK(fr_item(count) == 0.0f);
    CHECK_OK(fr_nonfinite_count_(count, x));
    CHECK(fr_item(count) == (float)want);
    CHECK_OK(fr_nonfinite_count_(count, x)); /* accumulates */
    CHECK(fr_item(count) == (float)(2 * want));
    fr_tensor *two = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(2), FR_TAG_WORKSPACE);
    CHECK_ERR(fr_nonfinite_count_(two, x), FR_ERR_SHAPE, "count must have one element");
    fr_tensor *half = fr_to_dtype(clean, FR_F16, FR_TAG_DATA);
    CHECK_ERR(fr_nonfinite_count_(count, half), FR_ERR_DTYPE, "nonfinite_count");
    CHECK_ERR(fr_unscale_(half, 0.5f), FR_ERR_DTYPE, "unscale");
    fr_release(half);
    fr_release(two);
    fr_release(count);
    fr_release(clean);
    fr_release(x);
    free(h);
}

static void test_unscale_in_place(void) {
    float *h = malloc(KN * sizeof *h);
    fill_with_nonfinite(h, KN);
    fr_tensor *x = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(KN), FR_TAG_DATA, h);
    uint64_t v0 = x->storage->version;
    CHECK_OK(fr_unscale_(x, 1.0f / 1024.0f));
    CHECK(x->storage->version > v0);
    size_t bad = 0;
    for (size_t i = 0; i < KN; i++) {
        float want = h[i] * (1.0f / 1024.0f);
        float got = fr_data_f32(x)[i];
        bad += want != want ? got == got : f32_bits(got) != f32_bits(want);
    }
    CHECK(bad == 0);
    fr_release(x);
    free(h);
}

/* ---- the loss scaler on a tiny model: one linear layer 4 -> 2 ---- */

typedef struct {
    fr_params *params;
    fr_linear_layer fc;
    fr_tensor *x, *labels; /* (8, 4), (8) */
} tiny;

static tiny tiny_new(fr_device dev) {
    tiny m = {fr_params_new(), {0}, NULL, NULL};
    fr_rng rng;
    fr_rng_seed(&rng, 5);
    CHECK_OK(fr_linear_layer_init(&m.fc, m.params, "fc", 4, 2, true, &rng));
    CHECK_OK(fr_params_to_device(m.params, dev));
    fr_tensor *x = fr_t_rand(FR_CPU, 2, FR_SHAPE(8, 4), 11);
    const int32_t labels[8] = {0, 1, 1, 0, 1, 0, 0, 1};
    m.x = fr_to_device(x, dev, FR_TAG_DATA);
    m.labels = fr_from_host(dev, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA, labels);
    fr_release(x);
    return m;
}

static void tiny_free(tiny *m) {
    fr_clear(&m->x);
    fr_clear(&m->labels);
    fr_params_free(m->params);
}

/* Forward, loss, and backward of the loss scaled by `s` (unscaled: NULL). */
static void tiny_backward(tiny *m, const fr_loss_scaler *s) {
    fr_tensor *y = fr_linear_layer_forward(&m->fc, m->x);
    fr_tensor *loss = y ? fr_cross_entropy(y, m->labels) : NULL;
    fr_tensor *scaled = !loss ? NULL : s ? fr_loss_scaler_scale(s, loss) : fr_retain(loss);
    CHECK_NOTNULL(scaled);
    if (scaled)
        CHECK_OK(fr_backward(scaled));
    fr_release(scaled);
    fr_release(loss);
    fr_release(y);
}

/* One scaler step after a backward; returns whether the optimizer stepped. */
static bool tiny_step(tiny *m, fr_loss_scaler *s, fr_optim *opt) {
    bool stepped = false;
    tiny_backward(m, s);
    CHECK_OK(fr_loss_scaler_step(s, opt, m->params, &stepped));
    fr_optim_zero_grad(opt);
    return stepped;
}

/* Writes `value` into element i of a gradient, on any device. */
static void poke(fr_tensor *g, size_t i, float value) {
    size_t n = (size_t)fr_numel(g);
    float *h = malloc(n * sizeof *h);
    CHECK_OK(fr_read_f32(g, h, n));
    h[i] = value;
    fr_tensor *src = fr_from_host(FR_CPU, FR_F32, g->ndim, g->shape, FR_TAG_TRANSIENT, h);
    CHECK_OK(fr_copy_(g, src));
    fr_release(src);
    free(h);
}

/* The bytes of every parameter and every optimizer state tensor, and the
 * step counts, in one host buffer (to compare bit for bit). */
static size_t snapshot(const tiny *m, const fr_optim *opt, float *out) {
    size_t k = 0;
    for (int i = 0; i < m->params->count; i++) {
        const fr_tensor *t[3] = {m->params->items[i].tensor, opt->state[0][i], opt->state[1][i]};
        for (int j = 0; j < 3; j++) {
            if (!t[j])
                continue;
            size_t n = (size_t)fr_numel(t[j]);
            CHECK_OK(fr_read_f32(t[j], out + k, n));
            k += n;
        }
        out[k++] = (float)opt->steps[i];
    }
    return k;
}

/* An inf or NaN gradient: the step is skipped, parameters and optimizer
 * state stay as they were bit for bit, the scale halves, the tracker
 * restarts; the next clean step runs. */
static void overflow_case(fr_device dev, fr_optim_kind kind) {
    tiny m = tiny_new(dev);
    fr_optim *opt = kind == FR_OPTIM_SGD
                        ? fr_sgd_new(m.params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9})
                        : fr_adam_new(m.params, fr_adam_defaults(1e-2, 0.0));
    fr_loss_scaler s;
    CHECK_OK(fr_loss_scaler_init(&s, FR_F16));
    CHECK(s.scale == 65536.0f && s.growth_interval == 2000 && s.dynamic);
    CHECK(tiny_step(&m, &s, opt)); /* creates the optimizer state */
    CHECK(s.growth_tracker == 1 && s.skipped == 0);
    float before[64], after[64];
    const float poison[] = {INFINITY, NAN, -INFINITY};
    for (int k = 0; k < 3; k++) {
        size_t n = snapshot(&m, opt, before);
        tiny_backward(&m, &s);
        poke(k == 1 ? m.fc.bias->grad : m.fc.weight->grad, k == 1 ? 0 : 3 - k, poison[k]);
        bool stepped = true;
        CHECK_OK(fr_loss_scaler_step(&s, opt, NULL, &stepped));
        fr_optim_zero_grad(opt);
        CHECK(!stepped);
        CHECK(snapshot(&m, opt, after) == n);
        CHECK(memcmp(before, after, n * sizeof *before) == 0);
        CHECK(s.scale == 65536.0f / (float)(2 << k));
        CHECK(s.growth_tracker == 0 && s.skipped == k + 1);
    }
    size_t n = snapshot(&m, opt, before);
    CHECK(tiny_step(&m, &s, opt));
    CHECK(snapshot(&m, opt, after) == n && memcmp(before, after, n * sizeof *before) != 0);
    CHECK(s.scale == 8192.0f && s.growth_tracker == 1 && s.skipped == 3);
    fr_optim_free(opt);
    tiny_free(&m);
}

static void test_overflow_skips_step_sgd(void) { overflow_case(FR_CPU, FR_OPTIM_SGD); }
static void test_overflow_skips_step_adam(void) { overflow_case(FR_CPU, FR_OPTIM_ADAM); }

/* The default: 2000 consecutive clean steps double the scale (not
 * 1999); then a configurable interval with an overflow in the middle. */
static void test_growth_after_clean_steps(void) {
    tiny m = tiny_new(FR_CPU);
    fr_optim *opt = fr_sgd_new(m.params, (fr_sgd_options){.lr = 1e-3});
    fr_loss_scaler s;
    CHECK_OK(fr_loss_scaler_init(&s, FR_F16));
    int stepped = 0;
    for (int i = 0; i < 1999; i++)
        stepped += tiny_step(&m, &s, opt);
    CHECK(stepped == 1999 && s.scale == 65536.0f && s.growth_tracker == 1999);
    CHECK(tiny_step(&m, &s, opt));
    CHECK(s.scale == 131072.0f && s.growth_tracker == 0 && s.skipped == 0);

    /* interval 3: clean, clean, overflow (back off, restart), 3 clean (grow) */
    s.growth_interval = 3;
    const float want[] = {131072, 131072, 65536, 65536, 65536, 131072};
    for (int i = 0; i < 6; i++) {
        tiny_backward(&m, &s);
        if (i == 2)
            poke(m.fc.weight->grad, 0, NAN);
        bool st;
        CHECK_OK(fr_loss_scaler_step(&s, opt, m.params, &st));
        fr_optim_zero_grad(opt);
        CHECK(st == (i != 2));
        CHECK(s.scale == want[i]);
    }
    CHECK(s.skipped == 1 && s.growth_tracker == 0);

    /* growth that would overflow the scale to inf is not taken */
    s.growth_interval = 1;
    CHECK_OK(fr_loss_scaler_set_state(&s, (fr_loss_scaler_state){.scale = 0x1p127f}));
    CHECK(tiny_step(&m, &s, opt));
    CHECK(s.scale == 0x1p127f && s.growth_tracker == 0);

    s.growth_interval = 0;
    tiny_backward(&m, &s);
    CHECK_ERR(fr_loss_scaler_step(&s, opt, NULL, NULL), FR_ERR_ARG, "growth_interval");
    fr_optim_zero_grad(opt);
    fr_optim_free(opt);
    tiny_free(&m);
}

/* Unscaled gradients equal those of the unscaled loss: exactly for a
 * power-of-two scale (scaling by 2^k commutes with rounding), to f32
 * round-off (rtol 1e-6) for scale 1000. */
static void test_unscale_matches_unscaled_loss(void) {
    tiny a = tiny_new(FR_CPU), b = tiny_new(FR_CPU);
    tiny_backward(&a, NULL);
    const float scales[] = {65536.0f, 1000.0f};
    for (int k = 0; k < 2; k++) {
        fr_loss_scaler s;
        CHECK_OK(fr_loss_scaler_init(&s, FR_F16));
        CHECK_OK(fr_loss_scaler_set_state(&s, (fr_loss_scaler_state){.scale = scales[k]}));
        tiny_backward(&b, &s);
        float scaled0 = fr_data_f32(b.fc.weight->grad)[0];
        CHECK(fabsf(scaled0) > 100.0f * fabsf(fr_data_f32(a.fc.weight->grad)[0]));
        CHECK_OK(fr_loss_scaler_unscale(&s, b.params));
        CHECK(s.unscaled && !s.found_nonfinite);
        CHECK_ERR(fr_loss_scaler_unscale(&s, b.params), FR_ERR_ARG, "unscaled already");
        for (int i = 0; i < a.params->count; i++) {
            fr_tensor *ga = a.params->items[i].tensor->grad, *gb = b.params->items[i].tensor->grad;
            double tol = k == 0 ? 0.0 : 1e-6;
            fr_t_allclose_t(gb, ga, tol * 1e-3, tol, a.params->items[i].name);
        }
        /* step after an explicit unscale does not divide again */
        fr_optim *opt = fr_sgd_new(b.params, (fr_sgd_options){.lr = 0.0});
        bool stepped = false;
        CHECK_OK(fr_loss_scaler_step(&s, opt, NULL, &stepped));
        CHECK(stepped && !s.unscaled);
        fr_t_allclose_t(b.fc.weight->grad, a.fc.weight->grad, k == 0 ? 0.0 : 1e-9,
                        k == 0 ? 0.0 : 1e-6, "grad after step");
        fr_optim_zero_grad(opt);
        fr_optim_free(opt);
    }
    tiny_free(&b);
    tiny_free(&a);
}

static void test_state_get_set(void) {
    tiny m = tiny_new(FR_CPU);
    fr_optim *opt = fr_sgd_new(m.params, (fr_sgd_options){.lr = 1e-3});
    fr_loss_scaler s, r;
    CHECK_OK(fr_loss_scaler_init(&s, FR_F16));
    s.growth_interval = 4;
    for (int i = 0; i < 7; i++) { /* 3 clean, 1 overflow, 3 clean */
        tiny_backward(&m, &s);
        if (i == 3)
            poke(m.fc.bias->grad, 1, INFINITY);
        CHECK_OK(fr_loss_scaler_step(&s, opt, NULL, NULL));
        fr_optim_zero_grad(opt);
    }
    fr_loss_scaler_state st = fr_loss_scaler_get_state(&s);
    CHECK(st.scale == 32768.0f && st.growth_tracker == 3 && st.skipped == 1);
    CHECK_OK(fr_loss_scaler_init(&r, FR_F16));
    r.growth_interval = 4;
    CHECK_OK(fr_loss_scaler_set_state(&r, st));
    CHECK(r.scale == s.scale && r.growth_tracker == s.growth_tracker && r.skipped == s.skipped);
    /* both go on alike: the restored one grows on the same step */
    CHECK(tiny_step(&m, &s, opt) && tiny_step(&m, &r, opt));
    CHECK(s.scale == 65536.0f && r.scale == 65536.0f && r.growth_tracker == 0);

    const fr_loss_scaler_state bad[] = {
        {.scale = 0.0f}, {.scale = -1.0f}, {.scale = INFINITY}, {.scale = NAN},
        {.scale = 1.0f, .growth_tracker = -1}, {.scale = 1.0f, .growth_tracker = 4},
        {.scale = 1.0f, .skipped = -2},
    };
    const char *needle[] = {"scale", "scale", "scale", "scale", "growth_tracker", "growth_tracker",
                            "skipped"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_ERR(fr_loss_scaler_set_state(&r, bad[i]), FR_ERR_ARG, needle[i]);
    CHECK(r.scale == 65536.0f && r.skipped == 1); /* unchanged by the refused states */
    fr_loss_scaler b16;
    CHECK_OK(fr_loss_scaler_init(&b16, FR_BF16));
    CHECK_ERR(fr_loss_scaler_set_state(&b16, (fr_loss_scaler_state){.scale = 2.0f}), FR_ERR_ARG,
              "fixed at 1");
    CHECK_OK(fr_loss_scaler_set_state(&b16, (fr_loss_scaler_state){.scale = 1.0f, .skipped = 4}));
    CHECK(b16.skipped == 4);
    fr_optim_free(opt);
    tiny_free(&m);
}

/* bf16 and f32: the scale stays 1 through clean steps past the interval and
 * through an overflow, which is still skipped and counted. */
static void test_fixed_scale_for_bf16_and_f32(void) {
    const fr_dtype types[] = {FR_BF16, FR_F32};
    for (int t = 0; t < 2; t++) {
        tiny m = tiny_new(FR_CPU);
        fr_optim *opt = fr_sgd_new(m.params, (fr_sgd_options){.lr = 1e-3});
        fr_loss_scaler s;
        CHECK_OK(fr_loss_scaler_init(&s, types[t]));
        CHECK(!s.dynamic && s.scale == 1.0f);
        s.growth_interval = 2;
        for (int i = 0; i < 5; i++)
            CHECK(tiny_step(&m, &s, opt));
        CHECK(s.scale == 1.0f && s.skipped == 0);
        tiny_backward(&m, &s);
        poke(m.fc.weight->grad, 2, -INFINITY);
        bool stepped = true;
        CHECK_OK(fr_loss_scaler_step(&s, opt, NULL, &stepped));
        fr_optim_zero_grad(opt);
        CHECK(!stepped && s.scale == 1.0f && s.skipped == 1);
        fr_optim_free(opt);
        tiny_free(&m);
    }
}

static void test_scaler_errors(void) {
    fr_loss_scaler s;
    CHECK_ERR(fr_loss_scaler_init(&s, FR_I32), FR_ERR_DTYPE, "expected f16, bf16 or f32");
    CHECK_OK(fr_loss_scaler_init(&s, FR_F16));
    tiny m = tiny_new(FR_CPU), other = tiny_new(FR_CPU);
    fr_optim *opt = fr_sgd_new(m.params, (fr_sgd_options){.lr = 1e-3});
    CHECK_ERR(fr_loss_scaler_step(&s, opt, NULL, NULL), FR_ERR_ARG, "no parameter has a gradient");
    CHECK_ERR(fr_loss_scaler_step(&s, opt, other.params, NULL), FR_ERR_ARG, "registry");
    CHECK_ERR(fr_loss_scaler_step(&s, NULL, NULL, NULL), FR_ERR_ARG, "optimizer is NULL");
    CHECK(fr_t_status_of(fr_loss_scaler_scale(&s, NULL)) == FR_ERR_ARG);
    CHECK(s.scale == 65536.0f && s.skipped == 0 && s.growth_tracker == 0);
    fr_optim_free(opt);
    tiny_free(&other);
    tiny_free(&m);
}

/* ---- CUDA against the CPU ---- */

static void test_cuda_casts_match_cpu(void) {
    NEED_CUDA();
    size_t n;
    float *x = conversion_sample(&n);
    fr_tensor *c = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE((int64_t)n), FR_TAG_DATA, x);
    fr_tensor *g = fr_to_device(c, FR_CUDA, FR_TAG_DATA);
    const fr_dtype half[] = {FR_F16, FR_BF16};
    for (int k = 0; g && k < 2; k++) {
        fr_tensor *hc = fr_to_dtype(c, half[k], FR_TAG_DATA);
        fr_tensor *hg = fr_to_dtype(g, half[k], FR_TAG_DATA);
        fr_tensor *hg_host = hg ? fr_to_device(hg, FR_CPU, FR_TAG_DATA) : NULL;
        /* and back to f32 on the GPU */
        fr_tensor *wg = hg ? fr_to_dtype(hg, FR_F32, FR_TAG_DATA) : NULL;
        fr_tensor *wc = hc ? fr_to_dtype(hc, FR_F32, FR_TAG_DATA) : NULL;
        fr_tensor *wg_host = wg ? fr_to_device(wg, FR_CPU, FR_TAG_DATA) : NULL;
        CHECK_NOTNULL(hg_host);
        CHECK_NOTNULL(wg_host);
        if (hc && hg_host && wc && wg_host) {
            CHECK(memcmp(fr_data(hc), fr_data(hg_host), n * 2) == 0);
            CHECK(memcmp(fr_data(wc), fr_data(wg_host), n * 4) == 0);
            check_rounding(x, fr_data(hg_host), n, k == 1, "cuda cast");
        }
        fr_release(wg_host);
        fr_release(wc);
        fr_release(wg);
        fr_release(hg_host);
        fr_release(hg);
        fr_release(hc);
    }
    /* every f16 and bf16 pattern, widened on the GPU */
    uint16_t *h = malloc(65536 * sizeof *h);
    for (uint32_t b = 0; b < 65536; b++)
        h[b] = (uint16_t)b;
    for (int k = 0; k < 2; k++) {
        fr_tensor *pc = fr_from_host(FR_CPU, half[k], 1, FR_SHAPE(65536), FR_TAG_DATA, h);
        fr_tensor *pg = fr_from_host(FR_CUDA, half[k], 1, FR_SHAPE(65536), FR_TAG_DATA, h);
        fr_tensor *wc = pc ? fr_to_dtype(pc, FR_F32, FR_TAG_DATA) : NULL;
        fr_tensor *wg = pg ? fr_to_dtype(pg, FR_F32, FR_TAG_DATA) : NULL;
        fr_tensor *wg_host = wg ? fr_to_device(wg, FR_CPU, FR_TAG_DATA) : NULL;
        CHECK_NOTNULL(wg_host);
        if (wc && wg_host)
            CHECK(memcmp(fr_data(wc), fr_data(wg_host), 65536 * 4) == 0);
        fr_release(wg_host);
        fr_release(wg);
        fr_release(wc);
        fr_release(pg);
        fr_release(pc);
    }
    free(h);
    fr_release(g);
    fr_release(c);
    free(x);
}

/* a[i] and b[i] have the same bits, or are both NaN: a GPU's arithmetic
 * returns its canonical NaN (0x7fffffff) where the CPU's keeps the operand's
 * sign and payload, and no caller may depend on either. */
static bool same_or_both_nan(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        bool nan_a = a[i] != a[i], nan_b = b[i] != b[i];
        if (nan_a != nan_b || (!nan_a && memcmp(&a[i], &b[i], sizeof a[i]) != 0)) {
            fprintf(stderr, "    element %zu: %a vs %a\n", i, (double)a[i], (double)b[i]);
            return false;
        }
    }
    return true;
}

static void test_cuda_kernels_match_cpu(void) {
    NEED_CUDA();
    float *h = malloc(KN * sizeof *h);
    int want = fill_with_nonfinite(h, KN);
    fr_tensor *x = fr_from_host(FR_CUDA, FR_F32, 1, FR_SHAPE(KN), FR_TAG_DATA, h);
    fr_tensor *clean = fr_t_rand(FR_CPU, 1, FR_SHAPE(3000000), 9); /* several blocks, none bad */
    fr_tensor *clean_g = clean ? fr_to_device(clean, FR_CUDA, FR_TAG_DATA) : NULL;
    fr_tensor *count = fr_zeros(FR_CUDA, FR_F32, 1, FR_SHAPE(1), FR_TAG_WORKSPACE);
    CHECK_NOTNULL(count);
    if (x && clean_g && count) {
        CHECK_OK(fr_nonfinite_count_(count, clean_g));
        CHECK(fr_item(count) == 0.0f);
        CHECK_OK(fr_nonfinite_count_(count, x));
        CHECK_OK(fr_nonfinite_count_(count, x));
        CHECK(fr_item(count) == (float)(2 * want));
        CHECK_OK(fr_unscale_(x, 1.0f / 4096.0f));
        fr_tensor *xc = fr_from_host(FR_CPU, FR_F32, 1, FR_SHAPE(KN), FR_TAG_DATA, h);
        fr_tensor *back = fr_to_device(x, FR_CPU, FR_TAG_DATA);
        CHECK_OK(fr_unscale_(xc, 1.0f / 4096.0f));
        if (back && xc)
            CHECK(same_or_both_nan(fr_data(back), fr_data(xc), KN));
        fr_tensor *cpu_count = fr_zeros(FR_CPU, FR_F32, 1, FR_SHAPE(1), FR_TAG_WORKSPACE);
        CHECK_ERR(fr_nonfinite_count_(cpu_count, x), FR_ERR_DEVICE, "nonfinite_count");
        fr_release(cpu_count);
        fr_release(back);
        fr_release(xc);
    }
    fr_release(count);
    fr_release(clean_g);
    fr_release(clean);
    fr_release(x);
    free(h);
}

static void test_cuda_sum_of_million_halves(void) {
    NEED_CUDA();
    sum_of_halves(FR_CUDA);
}

static void test_cuda_scaler_skips_and_steps(void) {
    NEED_CUDA();
    overflow_case(FR_CUDA, FR_OPTIM_SGD);
    overflow_case(FR_CUDA, FR_OPTIM_ADAM);
}

int main(void) {
    RUN(test_all_f16_patterns_round_trip);
    RUN(test_all_bf16_patterns_round_trip);
    RUN(test_f32_to_half_rounds_to_nearest_even);
    RUN(test_conversions_match_pytorch);
    RUN(test_sum_of_million_halves_is_exact);
    RUN(test_nonfinite_count_accumulates);
    RUN(test_unscale_in_place);
    RUN(test_overflow_skips_step_sgd);
    RUN(test_overflow_skips_step_adam);
    RUN(test_growth_after_clean_steps);
    RUN(test_unscale_matches_unscaled_loss);
    RUN(test_state_get_set);
    RUN(test_fixed_scale_for_bf16_and_f32);
    RUN(test_scaler_errors);
    RUN(test_cuda_casts_match_cpu);
    RUN(test_cuda_kernels_match_cpu);
    RUN(test_cuda_sum_of_million_halves);
    RUN(test_cuda_scaler_skips_and_steps);
    return TEST_SUMMARY();
}
