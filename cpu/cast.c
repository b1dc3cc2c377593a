/* cpu/cast.c: dtype conversion kernel on the host. */
#include <string.h>

#include "../tensor/kernels.h"
#include "cast.h"
#include "isa.h"

/* The eight-lane loops are compiled for AVX2 + F16C whatever the build's
 * flags and chosen at run time (__builtin_cpu_supports), so the installed,
 * portable library (no -march=native) keeps them on CPUs that have them. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define FR_CAST_SIMD 1
#define FR_CAST_TARGET __attribute__((target("avx2,f16c")))

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * has no "f16c". The avx2 check above it covers the OS saving YMM state. */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

/* The class in use (cpu/isa.h), FR_CPU_ISA honoured, so that a forced
 * class runs its own loops: baseline the scalar ones, avx2 eight lanes,
 * avx512 sixteen (the tests force each). A refused FR_CPU_ISA counts as
 * baseline here: the scalar loops give the same bits, and the conv calls
 * report the error. */
static fr_cpu_isa cast_class(void) {
    static int cls = -1; /* benign race: every thread computes the same value */
    if (cls < 0) {
        fr_cpu_isa isa;
        cls = fr_cpu_isa_get(&isa) == FR_OK ? (int)isa : (int)FR_ISA_BASELINE;
    }
    return (fr_cpu_isa)cls;
}

static bool cast_simd_usable(void) {
    static int usable = -1; /* benign race: every thread computes the same value */
    if (usable < 0)
        usable = cast_class() >= FR_ISA_AVX2 && __builtin_cpu_supports("avx2") && cpu_has_f16c();
    return usable;
}
#endif

/* Below this many elements a parallel region costs more than it saves. */
#define FR_CAST_PAR_MIN 32768

static float load_as_f32(const void *src, fr_dtype t, size_t i) {
    switch (t) {
    case FR_F32: return ((const float *)src)[i];
    case FR_F16: return fr_f16_to_f32(((const uint16_t *)src)[i]);
    case FR_BF16: return fr_bf16_to_f32(((const uint16_t *)src)[i]);
    case FR_I32: return (float)((const int32_t *)src)[i];
    case FR_U8: return (float)((const uint8_t *)src)[i];
    default: FR_ASSERT(!"unknown dtype"); return 0;
    }
}

/* Integer targets truncate toward zero and saturate, so a cast never invokes
 * undefined behaviour on out-of-range values. */
static void store_from_f32(void *dst, fr_dtype t, size_t i, float v) {
    switch (t) {
    case FR_F32: ((float *)dst)[i] = v; break;
    case FR_F16: ((uint16_t *)dst)[i] = fr_f32_to_f16(v); break;
    case FR_BF16: ((uint16_t *)dst)[i] = fr_f32_to_bf16(v); break;
    case FR_I32:
        ((int32_t *)dst)[i] = v != v ? 0 : v >= 2147483520.0f ? INT32_MAX
                                       : v <= -2147483648.0f  ? INT32_MIN
                                                              : (int32_t)v;
        break;
    case FR_U8: ((uint8_t *)dst)[i] = v != v ? 0 : v >= 255.0f ? 255 : v <= 0.0f ? 0 : (uint8_t)v; break;
    default: FR_ASSERT(!"unknown dtype");
    }
}

/* Elements per parallel work item (a multiple of 8). */
#define FR_CAST_CHUNK ((size_t)4096)

/* f32 -> f16 / bf16, rounding to nearest even exactly as fr_f32_to_f16 /
 * fr_f32_to_bf16 (tensor/dtype.c), which stay the definition: the vector
 * paths are the hardware's f16 conversion (F16C, round to nearest even,
 * correct subnormals and overflow to inf) and the bf16 rounding in integer
 * lanes; eight lanes holding a NaN go through the scalar functions, which
 * fix the NaN's bits the way the CUDA kernels do. */
#ifdef FR_CAST_SIMD
/* The leading elements done eight at a time: a multiple of 8, <= n. */
FR_CAST_TARGET static size_t narrow_simd(uint16_t *d, const float *s, size_t n, bool f16) {
    size_t i = 0;
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            break; /* a NaN: the rest of the chunk goes the scalar way */
        if (f16) {
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            continue;
        }
        __m256i u = _mm256_castps_si256(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
        /* pack the eight 32-bit lanes (each < 2^16) into 16 bits, in order */
        __m256i packed = _mm256_packus_epi32(r, r);
        packed = _mm256_permute4x64_epi64(packed, 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(packed));
    }
    return i;
}

FR_CAST_TARGET static size_t widen_simd(float *d, const uint16_t *s, size_t n, bool f16) {
    size_t i = 0;
    const __m128i abs_mask = _mm_set1_epi16(0x7fff), f16_inf = _mm_set1_epi16(0x7c00);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        if (f16) {
            if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), f16_inf)))
                break;
            _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
        } else {
            __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_si256((__m256i *)(d + i), w);
        }
    }
    return i;
}

/* The same conversions sixteen lanes at a time, for the avx512 class
 * (cpu/isa.h; FR_CPU_ISA=avx2 keeps the eight-lane loops, baseline the
 * scalar ones). Every
 * activation of a half step passes through them on its way into and out
 * of the f32 kernels: 2.6e8 widened and 1.1e8 narrowed elements in one
 * bf16 ResNet-20 step at batch 128, 20% of its time (perf, 2026-12-02).
 * The bf16 rounding is the same integer arithmetic, and AVX-512F packs the
 * sixteen results with one truncating move (vpmovdw) instead of AVX2's
 * pack and permute; f16 is the hardware conversion as in F16C. The bits
 * are the eight-lane loops', which are the scalar functions'. */
#define FR_CAST_TARGET512 __attribute__((target("avx512f,f16c")))

FR_CAST_TARGET512 static size_t narrow_simd512(uint16_t *d, const float *s, size_t n, bool f16) {
    size_t i = 0;
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(s + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q))
            break; /* a NaN: the rest of the chunk goes the eight-lane way */
        if (f16) {
            _mm256_storeu_si256((__m256i *)(d + i),
                                _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            continue;
        }
        __m512i u = _mm512_castps_si512(v);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r));
    }
    return i;
}

FR_CAST_TARGET512 static size_t widen_simd512(float *d, const uint16_t *s, size_t n, bool f16) {
    size_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi16(0x7fff), f16_inf = _mm256_set1_epi16(0x7c00);
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
        if (f16) {
            __m256i big = _mm256_cmpgt_epi16(_mm256_and_si256(h, abs_mask), f16_inf);
            if (!_mm256_testz_si256(big, big))
                break;
            _mm512_storeu_ps(d + i, _mm512_cvtph_ps(h));
        } else {
            _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
    }
    return i;
}

/* The class in use is avx512 (FR_CPU_ISA honoured; its error means no). */
static bool cast_avx512(void) { return cast_class() == FR_ISA_AVX512; }
#endif

int fr_cpu_cast_lanes(void) {
#ifdef FR_CAST_SIMD
    if (cast_simd_usable())
        return cast_avx512() ? 16 : 8;
#endif
    return 1;
}

static void narrow_chunk(uint16_t *d, const float *s, size_t n, bool f16) {
    size_t i = 0;
#ifdef FR_CAST_SIMD
    if (cast_simd_usable()) {
        i = cast_avx512() ? narrow_simd512(d, s, n, f16) : 0;
        i += narrow_simd(d + i, s + i, n - i, f16);
    }
#endif
    for (; i < n; i++)
        d[i] = f16 ? fr_f32_to_f16(s[i]) : fr_f32_to_bf16(s[i]);
}

/* f16 / bf16 -> f32, exact. F16C's widening quiets signalling NaNs, so eight
 * lanes holding any NaN go through fr_f16_to_f32, which keeps every bit. */
static void widen_chunk(float *d, const uint16_t *s, size_t n, bool f16) {
    size_t i = 0;
#ifdef FR_CAST_SIMD
    if (cast_simd_usable()) {
        i = cast_avx512() ? widen_simd512(d, s, n, f16) : 0;
        i += widen_simd(d + i, s + i, n - i, f16);
    }
#endif
    for (; i < n; i++)
        d[i] = f16 ? fr_f16_to_f32(s[i]) : fr_bf16_to_f32(s[i]);
}

void fr_cpu_cast_half_run(void *dst, fr_dtype dst_type, const void *src, fr_dtype src_type,
                          size_t n) {
    FR_ASSERT((dst_type == FR_F32) != (src_type == FR_F32));
    if (dst_type == FR_F32)
        widen_chunk(dst, src, n, src_type == FR_F16);
    else
        narrow_chunk(dst, src, n, dst_type == FR_F16);
}

fr_status fr_cpu_cast(void *dst, fr_dtype dst_type, const void *src, fr_dtype src_type, size_t n) {
    if (dst_type == src_type) {
        memmove(dst, src, n * fr_dtype_size(src_type));
        return FR_OK;
    }
    if (dst_type == FR_I32 && src_type == FR_U8) { /* labels: exact, no float detour */
        for (size_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = ((const uint8_t *)src)[i];
        return FR_OK;
    }
    /* The conversions mixed precision runs on every op's operands (tensor/
     * staging.c) get their own loops: parallel, eight or sixteen lanes at
     * a time (the class's). */
    if (src_type == FR_F32 && (dst_type == FR_F16 || dst_type == FR_BF16)) {
        bool f16 = dst_type == FR_F16;
#pragma omp parallel for if (n > FR_CAST_PAR_MIN) schedule(static)
        for (size_t b = 0; b < n; b += FR_CAST_CHUNK)
            narrow_chunk((uint16_t *)dst + b, (const float *)src + b,
                         n - b < FR_CAST_CHUNK ? n - b : FR_CAST_CHUNK, f16);
        return FR_OK;
    }
    if (dst_type == FR_F32 && (src_type == FR_F16 || src_type == FR_BF16)) {
        bool f16 = src_type == FR_F16;
#pragma omp parallel for if (n > FR_CAST_PAR_MIN) schedule(static)
        for (size_t b = 0; b < n; b += FR_CAST_CHUNK)
            widen_chunk((float *)dst + b, (const uint16_t *)src + b,
                        n - b < FR_CAST_CHUNK ? n - b : FR_CAST_CHUNK, f16);
        return FR_OK;
    }
    for (size_t i = 0; i < n; i++)
        store_from_f32(dst, dst_type, i, load_as_f32(src, src_type, i));
    return FR_OK;
}
