/* cpu/isa.c: instruction-set detection and the FR_CPU_ISA override (isa.h).
 *
 * The class is fixed for the process on first use: the conv dispatch
 * (cpu/conv_dnnl.c) and oneDNN's own ISA cap (cpu/dnnl_common.c) read it,
 * and a kernel choice that changed mid-run would change a shape's bits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

static fr_cpu_features features;
static fr_cpu_isa detected = FR_ISA_BASELINE, chosen = FR_ISA_BASELINE;
static bool forced;
static char env_error[160]; /* non-empty: FR_CPU_ISA was refused */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const names[FR_ISA_COUNT] = {"baseline", "avx2", "avx512"};

const char *fr_cpu_isa_name(fr_cpu_isa isa) {
    return (unsigned)isa < FR_ISA_COUNT ? names[isa] : NULL;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

/* XCR0: which register states the OS saves (AVX-512's and AMX's need its
 * consent as well as CPUID's bit). */
static unsigned long long xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect_features(void) {
    __builtin_cpu_init();
    unsigned long long xcr = xcr0();
    bool ymm = (xcr & 0x6) == 0x6, zmm = ymm && (xcr & 0xe0) == 0xe0;
    bool tiles = (xcr & 0x60000ull) == 0x60000ull;
    features.avx2 = ymm && __builtin_cpu_supports("avx2");
    features.fma = ymm && __builtin_cpu_supports("fma");
    features.avx512f = zmm && __builtin_cpu_supports("avx512f");
    features.avx512bw = zmm && __builtin_cpu_supports("avx512bw");
    features.avx512vl = zmm && __builtin_cpu_supports("avx512vl");
    features.avx512dq = zmm && __builtin_cpu_supports("avx512dq");
    features.avx512cd = zmm && __builtin_cpu_supports("avx512cd");
    /* leaf 7 directly: clang 14's __builtin_cpu_supports knows neither
     * avx512bf16 nor avx512fp16 nor AMX */
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        features.avx512_bf16 = features.avx512f && (a & (1u << 5));
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        features.avx512_fp16 = features.avx512f && (d & (1u << 23));
        features.amx = tiles && (d & (1u << 24)) && (d & (1u << 22)); /* AMX-TILE, AMX-BF16 */
    }
    /* the family: base 0xf plus the extended family (CPUID leaf 1) */
    if (__builtin_cpu_is("amd") && __get_cpuid(1, &a, &b, &c, &d)) {
        unsigned family = (a >> 8) & 0xf;
        if (family == 0xf)
            family += (a >> 20) & 0xff;
        features.amd_zen4 = family == 0x19 && features.avx512f;
    }
}
#else
static void detect_features(void) {}
#endif

static void init(void) {
    detect_features();
    const fr_cpu_features *f = &features;
    detected = f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512cd && f->avx2 &&
                       f->fma
                   ? FR_ISA_AVX512
               : f->avx2 && f->fma ? FR_ISA_AVX2
                                   : FR_ISA_BASELINE;
    chosen = detected;
    const char *env = getenv("FR_CPU_ISA");
    if (!env || !*env)
        return;
    int want = -1;
    for (int i = 0; i < FR_ISA_COUNT; i++)
        if (strcmp(env, names[i]) == 0)
            want = i;
    if (want < 0)
        snprintf(env_error, sizeof env_error,
                 "FR_CPU_ISA=%.40s names no ISA class (baseline, avx2, avx512)", env);
    else if (want > (int)detected)
        snprintf(env_error, sizeof env_error,
                 "FR_CPU_ISA=%s: this CPU's class is %s (it lacks %s)", env, names[detected],
                 want == FR_ISA_AVX512 ? "AVX-512 F/BW/VL/DQ/CD" : "AVX2 or FMA");
    else {
        chosen = (fr_cpu_isa)want;
        forced = want != (int)detected;
    }
}

const fr_cpu_features *fr_cpu_features_detected(void) {
    pthread_once(&once, init);
    return &features;
}

fr_cpu_isa fr_cpu_isa_detected(void) {
    pthread_once(&once, init);
    return detected;
}

fr_status fr_cpu_isa_get(fr_cpu_isa *out) {
    pthread_once(&once, init);
    *out = chosen;
    if (env_error[0])
        return fr_error(FR_ERR_ARG, "%s", env_error);
    return FR_OK;
}

bool fr_cpu_isa_has_bf16(void) {
    fr_cpu_isa isa;
    return fr_cpu_isa_get(&isa) == FR_OK && isa == FR_ISA_AVX512 && features.avx512_bf16;
}

void fr_cpu_isa_describe(char *buf, size_t size) {
    pthread_once(&once, init);
    if (env_error[0]) {
        snprintf(buf, size, "error: %s", env_error);
        return;
    }
    const fr_cpu_features *f = &features;
    snprintf(buf, size, "%s%s%s%s%s%s%s%s", names[chosen], forced ? " (forced by FR_CPU_ISA, cpu " : "",
             forced ? names[detected] : "", forced ? ")" : "",
             f->avx512_bf16 ? " +avx512_bf16" : "", f->avx512_fp16 ? " +avx512_fp16" : "",
             f->amx ? " +amx" : "", f->amd_zen4 ? ", AMD Zen 4" : "");
}
