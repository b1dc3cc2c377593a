/* test_bf16_paths.c: the CPU half paths issue 24 changed so that a bf16 step
 * is never slower than f32:
 *
 *  - Elementwise ops (activations, add, mul, axpy) on half operands run in
 *    small tiles on the stack (tensor/staging.c): their result is the f32
 *    kernel's on the widened operands, rounded once, bit for bit, at 1, 2
 *    and 3 threads, in place or not, with f32 operands mixed in, at sizes
 *    with remainders and above the parallel threshold; and no workspace
 *    is allocated (the 1 MiB blocks of before were), which says the tiles
 *    really ran.
 *  - The conversions (cpu/cast.c), sixteen lanes on the avx512 class,
 *    eight on avx2 and the scalar loops on baseline, give the scalar
 *    definitions' bits (tensor/dtype.c) on every f16 and bf16 pattern and
 *    on edge and random f32 values.
 *  - Convolutions: on CPUs with neither AMX nor AMD Zen 4 the rule keeps
 *    bf16 3x3 layers on the staged f32 kernels (cpu/conv_bf16.c: oneDNN's
 *    bf16 kernels measured slower on a Xeon without AMX), so a bf16 conv
 *    gives exactly the f32 kernel's result on the widened operands; on
 *    the others the rule computes in bf16 and FR_CONV_BF16=off stages
 *    (checked in a child); FR_CONV_BF16 with a bad value is refused with
 *    its name.
 *
 * The same checks run in children with FR_CPU_ISA forced to each class
 * below this CPU's, and the conversions follow the forced class (scalar
 * on baseline, eight lanes on avx2), so every path is covered. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "cpu/cast.h"
#include "cpu/conv.h"
#include "cpu/isa.h"
#include "tensor/memory.h"
#include "tensor/ops.h"

static const char *self_path;

static const fr_dtype halves[] = {FR_BF16, FR_F16};

static uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }

/* t (half) has exactly the bits of want (f32) rounded by the scalar
 * definition. */
static bool rounds_to(const fr_tensor *t, const fr_tensor *want, const char *what) {
    const uint16_t *h = fr_data(t);
    const float *w = fr_data_f32(want);
    for (int64_t i = 0; i < fr_numel(want); i++) {
        uint16_t r = t->dtype == FR_F16 ? fr_f32_to_f16(w[i]) : fr_f32_to_bf16(w[i]);
        if (h[i] != r) {
            fprintf(stderr, "    %s (%s): element %lld is 0x%04x, want 0x%04x\n", what,
                    fr_dtype_name(t->dtype), (long long)i, h[i], r);
            return false;
        }
    }
    return true;
}

static bool same_f32(const fr_tensor *a, const fr_tensor *b, const char *what) {
    bool ok = memcmp(fr_data(a), fr_data(b), (size_t)fr_numel(a) * sizeof(float)) == 0;
    if (!ok)
        fprintf(stderr, "    %s: f32 results differ\n", what);
    return ok;
}

static fr_tensor *rand_half(int64_t n, fr_dtype dt, uint32_t seed) {
    fr_tensor *r = fr_t_rand(FR_CPU, 1, FR_SHAPE(n), seed);
    fr_tensor *h = fr_to_dtype(r, dt, FR_TAG_TRANSIENT);
    fr_release(r);
    return h;
}

static fr_tensor *widen(const fr_tensor *h) { return fr_to_dtype(h, FR_F32, FR_TAG_TRANSIENT); }

/* Every elementwise op once on half operands of n elements, against the
 * f32 op on the widened operands; no workspace allowed. */
static void check_elementwise(int64_t n, fr_dtype dt, uint32_t seed) {
    fr_tensor *a = rand_half(n, dt, seed), *b = rand_half(n, dt, seed + 1);
    fr_tensor *fa = widen(a), *fb = widen(b);
    fr_tensor *y = fr_empty_like(a, FR_TAG_TRANSIENT), *fy = fr_empty_like(fa, FR_TAG_TRANSIENT);
    fr_mem_reset_peak();
    static const fr_act acts[] = {FR_ACT_RELU, FR_ACT_LEAKY_RELU, FR_ACT_SILU};
    for (size_t k = 0; k < sizeof acts / sizeof *acts; k++) {
        float p = acts[k] == FR_ACT_LEAKY_RELU ? 0.1f : 0.0f;
        CHECK_OK(fr_act_forward(y, a, acts[k], p));
        CHECK_OK(fr_act_forward(fy, fa, acts[k], p));
        CHECK(rounds_to(y, fy, fr_act_name(acts[k])));
        /* backward, from the output (or input) the activation needs */
        const fr_tensor *s = fr_act_needs_input(acts[k]) ? a : y;
        fr_tensor *fs = widen(s), *dx = fr_empty_like(a, FR_TAG_TRANSIENT),
                  *fdx = fr_empty_like(fa, FR_TAG_TRANSIENT);
        CHECK_OK(fr_act_backward(dx, b, s, acts[k], p));
        CHECK_OK(fr_act_backward(fdx, fb, fs, acts[k], p));
        CHECK(rounds_to(dx, fdx, "activation backward"));
        fr_release(fs), fr_release(dx), fr_release(fdx);
    }
    CHECK_OK(fr_add_out(y, a, b));
    CHECK_OK(fr_add_out(fy, fa, fb));
    CHECK(rounds_to(y, fy, "add"));
    CHECK_OK(fr_mul_out(y, a, b));
    CHECK_OK(fr_mul_out(fy, fa, fb));
    CHECK(rounds_to(y, fy, "mul"));
    /* in place: y is x */
    fr_tensor *yi = fr_to_dtype(a, dt, FR_TAG_TRANSIENT), *fyi = widen(a);
    CHECK_OK(fr_act_forward(yi, yi, FR_ACT_RELU, 0.0f));
    CHECK_OK(fr_act_forward(fyi, fyi, FR_ACT_RELU, 0.0f));
    CHECK(rounds_to(yi, fyi, "relu in place"));
    /* axpy loads its output: y += 0.5 b */
    fr_release(yi), fr_release(fyi);
    yi = fr_to_dtype(a, dt, FR_TAG_TRANSIENT), fyi = widen(a);
    CHECK_OK(fr_axpy_(yi, 0.5f, b));
    CHECK_OK(fr_axpy_(fyi, 0.5f, fb));
    CHECK(rounds_to(yi, fyi, "axpy"));
    /* an f32 operand with a half one: the output is f32 */
    fr_tensor *m = fr_empty_like(fa, FR_TAG_TRANSIENT);
    CHECK_OK(fr_add_out(m, fa, b));
    CHECK_OK(fr_add_out(fy, fa, fb));
    CHECK(same_f32(m, fy, "f32 + half"));
    size_t ws = fr_mem_peak(FR_CPU, FR_TAG_WORKSPACE);
    if (ws != 0)
        fprintf(stderr, "    n %lld %s: %zu bytes of workspace\n", (long long)n, fr_dtype_name(dt), ws);
    CHECK(ws == 0);
    fr_release(m), fr_release(yi), fr_release(fyi);
    fr_release(a), fr_release(b), fr_release(fa), fr_release(fb), fr_release(y), fr_release(fy);
}

/* Sizes: one partial tile, tiles with a remainder, and enough for the
 * tiles to be shared between threads; at 1, 2 and 3 threads. */
static void test_elementwise_tiles(void) {
    static const int64_t sizes[] = {1, 17, 3 * 4096 + 17, 40000 + 5, 300000 + 3};
    int team = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        for (size_t d = 0; d < sizeof halves / sizeof *halves; d++)
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
                check_elementwise(sizes[i], halves[d], 7u + (uint32_t)i);
    }
    omp_set_num_threads(team);
}

/* Every half pattern widens to the scalar definition's f32 (NaN bits
 * included), and f32 values round to the scalar definition's half: edge
 * values, ties and their neighbours, random bit patterns. */
static void test_conversions(void) {
    const int64_t n = 65536;
    for (size_t d = 0; d < sizeof halves / sizeof *halves; d++) {
        fr_dtype dt = halves[d];
        fr_tensor *h = fr_empty(FR_CPU, dt, 1, FR_SHAPE(n), FR_TAG_TRANSIENT);
        uint16_t *ph = fr_data(h);
        for (int64_t i = 0; i < n; i++)
            ph[i] = (uint16_t)i;
        fr_tensor *f = widen(h);
        const float *pf = fr_data_f32(f);
        bool ok = true;
        for (int64_t i = 0; i < n; i++) {
            float want = dt == FR_F16 ? fr_f16_to_f32((uint16_t)i) : fr_bf16_to_f32((uint16_t)i);
            ok &= memcmp(&pf[i], &want, sizeof want) == 0;
        }
        CHECK(ok);
        /* f32 values: around every half value (ties, +-1 ulp of f32) and
         * random patterns */
        fr_tensor *x = fr_empty(FR_CPU, FR_F32, 1, FR_SHAPE(4 * n), FR_TAG_TRANSIENT);
        uint32_t *px = fr_data(x), seed = 99;
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &pf[i], sizeof bits);
            uint32_t half_ulp = dt == FR_BF16 ? 0x8000u : 0x1000u;
            px[4 * i] = bits + half_ulp;
            px[4 * i + 1] = bits + half_ulp - 1;
            px[4 * i + 2] = bits + half_ulp + 1;
            px[4 * i + 3] = lcg(&seed);
        }
        fr_tensor *r = fr_to_dtype(x, dt, FR_TAG_TRANSIENT);
        CHECK(rounds_to(r, x, "narrowing"));
        fr_release(h), fr_release(f), fr_release(x), fr_release(r);
    }
}

static int run_child(const char *name, const char *value, const char *mode);

/* A 3x3 layer in bf16 where the rule stages: declined, so the op's result
 * is the f32 kernel's on the widened operands, rounded once (one staged
 * block: the tensors are small); the conv line contains `why`. */
static void conv_stages(const char *why) {
    fr_conv_shape s = {.n = 4, .c = 16, .h = 16, .w = 16, .k = 16, .r = 3, .s = 3, .oh = 16, .ow = 16,
                       .stride = 1, .pad = 1};
    CHECK(!fr_cpu_conv_bf16_applies(&s, 0));
    CHECK(!fr_cpu_conv_bf16_applies(&s, 1));
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(4, 16, 16, 16), 3);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(16, 16, 3, 3), 4);
    fr_tensor *bx = fr_to_dtype(x, FR_BF16, FR_TAG_TRANSIENT), *bw = fr_to_dtype(w, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *fx = widen(bx), *fw = widen(bw);
    fr_tensor *y = fr_empty(FR_CPU, FR_BF16, 4, FR_SHAPE(4, 16, 16, 16), FR_TAG_TRANSIENT);
    fr_tensor *fy = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(4, 16, 16, 16), FR_TAG_TRANSIENT);
    fr_conv_params p = {.stride = 1, .pad = 1};
    CHECK_OK(fr_conv2d_forward(y, bx, bw, NULL, p));
    CHECK_OK(fr_conv2d_forward(fy, fx, fw, NULL, p));
    CHECK(rounds_to(y, fy, "conv2d bf16, staged"));
    bool done = true;
    CHECK_OK(fr_cpu_conv2d_half(fr_data(y), fr_data(bx), fr_data(bw), FR_BF16, 0, &s, &done));
    CHECK(!done);
    char line[512];
    fr_cpu_conv_describe(line, sizeof line);
    CHECK(strstr(line, "bf16 is storage only") != NULL);
    /* on a class where the bf16 kernels exist, the line names the choice */
    if (fr_cpu_isa_has_bf16() && fr_cpu_have_dnnl())
        CHECK(strstr(line, why) != NULL);
    fr_release(x), fr_release(w), fr_release(bx), fr_release(bw), fr_release(fx), fr_release(fw);
    fr_release(y), fr_release(fy);
}

/* The default rule: where it computes 3x3 layers in bf16 (AMX, or AMD Zen
 * 4) they apply and the conv line says why, and FR_CONV_BF16=off stages
 * them (in a child: the variable is read once); elsewhere it stages. */
static void test_conv_default_rule(void) {
    fr_conv_shape s = {.n = 4, .c = 16, .h = 16, .w = 16, .k = 16, .r = 3, .s = 3, .oh = 16, .ow = 16,
                       .stride = 1, .pad = 1};
    if (!fr_cpu_conv_bf16_default()) {
        conv_stages("bf16 is storage only, convs staged to f32 (auto: neither AMX nor AMD Zen 4)");
        return;
    }
    char line[512];
    fr_cpu_conv_describe(line, sizeof line);
    CHECK(fr_cpu_conv_bf16_applies(&s, 0) && fr_cpu_conv_bf16_applies(&s, 1));
    CHECK(strstr(line, fr_cpu_conv_bf16_amx() ? "(auto: AMX)" : "(auto: AMD Zen 4)") != NULL);
    /* 1x1 layers: in bf16 on Zen 4, staged with AMX (mixed there) */
    fr_conv_shape s1 = s;
    s1.r = s1.s = 1;
    s1.pad = 0;
    CHECK(fr_cpu_conv_bf16_applies(&s1, 0) == !fr_cpu_conv_bf16_amx());
    CHECK(fr_cpu_conv_bf16_amx() || fr_cpu_features_detected()->amd_zen4);
    CHECK(run_child("FR_CONV_BF16", "off", "--child-staged") == 0);
}

static void test_conv_off_stages(void) { conv_stages("bf16 is storage only (FR_CONV_BF16=off)"); }

/* In a child with FR_CONV_BF16=sometimes: a bf16 conv is refused, naming
 * the variable, and the conv line says so, whatever the class (the child
 * runs on this CPU's and under FR_CPU_ISA=avx2, where bf16 is storage
 * only). */
/* The conversions take the class in use's loops: 16 lanes on avx512, 8 on
 * avx2, the scalar definitions on baseline, FR_CPU_ISA honoured. */
static void test_lanes_follow_class(void) {
    fr_cpu_isa isa;
    CHECK_OK(fr_cpu_isa_get(&isa));
    int want = isa == FR_ISA_AVX512 ? 16 : isa == FR_ISA_AVX2 ? 8 : 1;
    if (fr_cpu_cast_lanes() != want)
        fprintf(stderr, "    class %s: %d lanes, want %d\n", fr_cpu_isa_name(isa),
                fr_cpu_cast_lanes(), want);
    CHECK(fr_cpu_cast_lanes() == want);
}

static void test_child_bad_variable(void) {
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(2, 8, 8, 8), 5);
    fr_tensor *w = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 8, 3, 3), 6);
    fr_tensor *bx = fr_to_dtype(x, FR_BF16, FR_TAG_TRANSIENT), *bw = fr_to_dtype(w, FR_BF16, FR_TAG_TRANSIENT);
    fr_tensor *y = fr_empty(FR_CPU, FR_BF16, 4, FR_SHAPE(2, 8, 8, 8), FR_TAG_TRANSIENT);
    CHECK_ERR(fr_conv2d_forward(y, bx, bw, NULL, (fr_conv_params){.stride = 1, .pad = 1}), FR_ERR_ARG,
              "FR_CONV_BF16");
    char line[512];
    fr_cpu_conv_describe(line, sizeof line);
    CHECK(strstr(line, "bf16 refused: FR_CONV_BF16") != NULL);
    fr_release(x), fr_release(w), fr_release(bx), fr_release(bw), fr_release(y);
}

static int run_child(const char *name, const char *value, const char *mode) {
    return fr_t_run_self(self_path, name, value, (char *const[]){(char *)self_path, (char *)mode, NULL});
}

/* Each class below this CPU's, forced: the same bits (eight-lane and
 * scalar conversions; test_lanes_follow_class checks each child took its
 * class's loops). */
static void test_forced_classes(void) {
    fr_cpu_isa top = fr_cpu_isa_detected();
    for (int isa = 0; isa < (int)top; isa++) {
        int rc = run_child("FR_CPU_ISA", fr_cpu_isa_name((fr_cpu_isa)isa), "--child");
        if (rc != 0)
            fprintf(stderr, "    FR_CPU_ISA=%s: child exited %d\n", fr_cpu_isa_name((fr_cpu_isa)isa), rc);
        CHECK(rc == 0);
    }
    CHECK(run_child("FR_CONV_BF16", "sometimes", "--child-bad") == 0);
    if (top >= FR_ISA_AVX2) { /* the children inherit FR_CPU_ISA; this process read it already */
        setenv("FR_CPU_ISA", "avx2", 1);
        CHECK(run_child("FR_CONV_BF16", "sometimes", "--child-bad") == 0);
        unsetenv("FR_CPU_ISA");
    }
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 2 && strcmp(argv[1], "--child") == 0) {
        RUN(test_lanes_follow_class);
        RUN(test_conversions);
        RUN(test_elementwise_tiles);
        RUN(test_conv_default_rule);
        return TEST_SUMMARY();
    }
    if (argc == 2 && strcmp(argv[1], "--child-staged") == 0) {
        RUN(test_conv_off_stages);
        return TEST_SUMMARY();
    }
    if (argc == 2 && strcmp(argv[1], "--child-bad") == 0) {
        RUN(test_child_bad_variable);
        return TEST_SUMMARY();
    }
    unsetenv("FR_CPU_ISA");
    unsetenv("FR_CONV_BF16");
    RUN(test_lanes_follow_class);
    RUN(test_conversions);
    RUN(test_elementwise_tiles);
    RUN(test_conv_default_rule);
    RUN(test_forced_classes);
    return TEST_SUMMARY();
}
