/* cpu/compress.c: packing saved activations into per-group codes and back
 * (kernels.def: compress_pack, compress_unpack, sign_pack, sign_unpack;
 * docs/ARCHITECTURE.md, "Saved tensors: held, recipe or compressed").
 *
 * Three paths, chosen by cpu/isa.h's class (so FR_CPU_ISA can force a
 * lower one): the baseline (C, with SSE2 for the per-group min/max and the
 * quantisation of whole groups), AVX2 and AVX-512 (intrinsics for the
 * min/max, the quantisation of whole groups and the decoding; the C loops
 * for a tensor's partial last group and, off x86, for everything). Every
 * path does the same float operations in the same order (-std=c11: no
 * contraction), so all give the same bits; tests/test_compress.c checks
 * every path against the format's definition. Groups are independent and
 * each thread takes whole groups, so the codes never depend on the team
 * size. The sign masks are in cpu/compress_sign.c. */
#include <immintrin.h>
#include <string.h>

#include "../tensor/kernels.h"
#include "compress.h"

#define GROUP FR_COMPRESS_GROUP

#define INLINE static inline __attribute__((always_inline))
#define REF
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

enum { ISA_REF, ISA_AVX2, ISA_AVX512 };

/* The group's minimum and maximum (m >= 1 elements) and whether it holds a
 * NaN or an infinity. The reference keeps the FIRST element that attains
 * each, which fixes the sign of a zero extreme (stored in the header); GCC
 * does not vectorise this select-based reduction without no-trapping-math
 * (that attribute made packing 40x slower), so the AVX copies below use
 * intrinsics and then look up the sign of a zero extreme in one short
 * scan: the same bits as the reference. The baseline runs it where there
 * is no SSE2 (not x86). */
REF __attribute__((unused)) static int minmax_ref(const float *x, size_t m, float *lo_out,
                                                 float *hi_out) {
    float lo = x[0], hi = x[0];
    int bad = 0;
    for (size_t i = 0; i < m; i++) {
        float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        bad |= !(v - v == 0.0f); /* NaN or inf */
    }
    *lo_out = lo;
    *hi_out = hi;
    return bad;
}

/* The first element equal to v (the reference's choice between -0 and +0). */
INLINE float first_equal(const float *x, size_t m, float v) {
    if (v != 0.0f)
        return v;
    for (size_t i = 0; i < m; i++)
        if (x[i] == v)
            return x[i];
    return v;
}

/* Four accumulators each (named variables: arrays of them were kept on
 * the stack): one min (or max) chain would wait on the previous one's
 * latency at every vector. Order does not matter: min and max of non-NaN
 * values are exact, a zero's sign is fixed up afterwards, and any NaN has
 * already made the group bad (the sums of v - v). */
#define MINMAX_STEP(V, MIN, MAX, ADD, SUB, a)                                                  \
    lo##a = MIN(lo##a, V);                                                                     \
    hi##a = MAX(hi##a, V);                                                                     \
    acc##a = ADD(acc##a, SUB(V, V)) /* NaN once any is NaN or inf */

/* The end of the SSE2 and AVX2 copies: the lanes' minima, maxima and sums
 * of v - v (`lanes` of each), then elements i to m one at a time, then the
 * sign of a zero extreme. */
INLINE int minmax_finish(const float *l, const float *h, const float *a, int lanes, const float *x,
                         size_t i, size_t m, float *lo_out, float *hi_out) {
    float lo = l[0], hi = h[0], sum = 0.0f;
    for (int k = 0; k < lanes; k++) {
        lo = l[k] < lo ? l[k] : lo;
        hi = h[k] > hi ? h[k] : hi;
        sum += a[k];
    }
    for (; i < m; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sum += x[i] - x[i];
    }
    *lo_out = first_equal(x, m, lo);
    *hi_out = first_equal(x, m, hi);
    return !(sum == 0.0f);
}

#ifdef __SSE2__
/* The baseline's copy on x86-64 (SSE2 is part of it): the scalar loop
 * above is a chain of compare-and-selects, half of the baseline's packing
 * time; tests/test_compress.c holds this one to the definition. */
REF static int minmax_sse2(const float *x, size_t m, float *lo_out, float *hi_out) {
    __m128 lo0 = _mm_set1_ps(x[0]), lo1 = lo0, lo2 = lo0, lo3 = lo0;
    __m128 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;
    __m128 acc0 = _mm_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        __m128 v0 = _mm_loadu_ps(x + i), v1 = _mm_loadu_ps(x + i + 4);
        __m128 v2 = _mm_loadu_ps(x + i + 8), v3 = _mm_loadu_ps(x + i + 12);
        MINMAX_STEP(v0, _mm_min_ps, _mm_max_ps, _mm_add_ps, _mm_sub_ps, 0);
        MINMAX_STEP(v1, _mm_min_ps, _mm_max_ps, _mm_add_ps, _mm_sub_ps, 1);
        MINMAX_STEP(v2, _mm_min_ps, _mm_max_ps, _mm_add_ps, _mm_sub_ps, 2);
        MINMAX_STEP(v3, _mm_min_ps, _mm_max_ps, _mm_add_ps, _mm_sub_ps, 3);
    }
    __m128 vlo = _mm_min_ps(_mm_min_ps(lo0, lo1), _mm_min_ps(lo2, lo3));
    __m128 vhi = _mm_max_ps(_mm_max_ps(hi0, hi1), _mm_max_ps(hi2, hi3));
    __m128 acc = _mm_add_ps(_mm_add_ps(acc0, acc1), _mm_add_ps(acc2, acc3));
    float l[4], h[4], a[4];
    _mm_storeu_ps(l, vlo);
    _mm_storeu_ps(h, vhi);
    _mm_storeu_ps(a, acc);
    return minmax_finish(l, h, a, 4, x, i, m, lo_out, hi_out);
}
#define minmax_base minmax_sse2
#else
#define minmax_base minmax_ref
#endif

AVX2 static int minmax_avx2(const float *x, size_t m, float *lo_out, float *hi_out) {
    __m256 lo0 = _mm256_set1_ps(x[0]), lo1 = lo0, lo2 = lo0, lo3 = lo0;
    __m256 hi0 = lo0, hi1 = lo0, hi2 = lo0, hi3 = lo0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    size_t i = 0;
    for (; i + 32 <= m; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        MINMAX_STEP(v0, _mm256_min_ps, _mm256_max_ps, _mm256_add_ps, _mm256_sub_ps, 0);
        MINMAX_STEP(v1, _mm256_min_ps, _mm256_max_ps, _mm256_add_ps, _mm256_sub_ps, 1);
        MINMAX_STEP(v2, _mm256_min_ps, _mm256_max_ps, _mm256_add_ps, _mm256_sub_ps, 2);
        MINMAX_STEP(v3, _mm256_min_ps, _mm256_max_ps, _mm256_add_ps, _mm256_sub_ps, 3);
    }
    for (; i + 8 <= m; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        MINMAX_STEP(v, _mm256_min_ps, _mm256_max_ps, _mm256_add_ps, _mm256_sub_ps, 0);
    }
    __m256 vlo = _mm256_min_ps(_mm256_min_ps(lo0, lo1), _mm256_min_ps(lo2, lo3));
    __m256 vhi = _mm256_max_ps(_mm256_max_ps(hi0, hi1), _mm256_max_ps(hi2, hi3));
    __m256 acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    float l[8], h[8], a[8];
    _mm256_storeu_ps(l, vlo);
    _mm256_storeu_ps(h, vhi);
    _mm256_storeu_ps(a, acc);
    return minmax_finish(l, h, a, 8, x, i, m, lo_out, hi_out);
}

AVX512 static int minmax_avx512(const float *x, size_t m, float *lo_out, float *hi_out) {
    __m512 first = _mm512_set1_ps(x[0]), lo0 = first, lo1 = first, lo2 = first, lo3 = first;
    __m512 hi0 = first, hi1 = first, hi2 = first, hi3 = first;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    size_t i = 0;
    for (; i + 64 <= m; i += 64) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
        MINMAX_STEP(v0, _mm512_min_ps, _mm512_max_ps, _mm512_add_ps, _mm512_sub_ps, 0);
        MINMAX_STEP(v1, _mm512_min_ps, _mm512_max_ps, _mm512_add_ps, _mm512_sub_ps, 1);
        MINMAX_STEP(v2, _mm512_min_ps, _mm512_max_ps, _mm512_add_ps, _mm512_sub_ps, 2);
        MINMAX_STEP(v3, _mm512_min_ps, _mm512_max_ps, _mm512_add_ps, _mm512_sub_ps, 3);
    }
    for (; i < m; i += 16) {
        /* the tail's missing lanes read x[0], which is in the group */
        __mmask16 k = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        __m512 v = _mm512_mask_loadu_ps(first, k, x + i);
        MINMAX_STEP(v, _mm512_min_ps, _mm512_max_ps, _mm512_add_ps, _mm512_sub_ps, 0);
    }
    __m512 vlo = _mm512_min_ps(_mm512_min_ps(lo0, lo1), _mm512_min_ps(lo2, lo3));
    __m512 vhi = _mm512_max_ps(_mm512_max_ps(hi0, hi1), _mm512_max_ps(hi2, hi3));
    __m512 acc = _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3));
    *lo_out = first_equal(x, m, _mm512_reduce_min_ps(vlo));
    *hi_out = first_equal(x, m, _mm512_reduce_max_ps(vhi));
    return !(_mm512_reduce_add_ps(acc) == 0.0f);
}

/* The codes of a whole group on the AVX paths: the reference's float
 * operations lane by lane (x - lo, times inv, plus the counter's uniform,
 * truncated, capped at top; fr_compress_uniform's hash in 32-bit lanes),
 * narrowed to bytes, then for 4 and 2 bits two or four codes merged into a
 * byte by multiply-adds of the bytes (c0 + 16 c1; c0 + 4 c1 + 16 (c2 + 4 c3)),
 * the reference's nibble and crumb order. q is always a number in
 * [0, top + 1] here (pack_group caps inv), so the truncation is exact and
 * the packs' saturation never bites. */
#define GOLDEN 0x9E3779B9u
#define HASH_CONSTS(W, set1) const W mix1 = set1((int)0x85EBCA6Bu), mix2 = set1((int)0xC2B2AE35u)

/* jg: the lanes' j * 0x9E3779B9 (kept as a running sum: the same 32-bit
 * products without a multiply). */
AVX2 static __m256i quantise8_avx2(const float *x, __m256 lo, __m256 inv, __m256i key, __m256i jg,
                                   __m256i top) {
    HASH_CONSTS(__m256i, _mm256_set1_epi32);
    __m256i h = _mm256_xor_si256(key, jg);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), mix1);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 13)), mix2);
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)),
                             _mm256_set1_ps(1.0f / 16777216.0f));
    __m256 q = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), lo), inv), u);
    return _mm256_min_epi32(_mm256_cvttps_epi32(q), top);
}

/* 32 lanes of four vectors (each 0..255 or negative) to 32 bytes in order. */
AVX2 static __m256i narrow32_avx2(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
    return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static void quantise_avx2(uint8_t *out, const float *x, float lo_s, float inv_s, uint32_t key_s,
                               int bits) {
    const __m256 lo = _mm256_set1_ps(lo_s), inv = _mm256_set1_ps(inv_s);
    const __m256i key = _mm256_set1_epi32((int)key_s), top = _mm256_set1_epi32((1 << bits) - 1);
    const __m256i step = _mm256_set1_epi32((int)(8u * GOLDEN)), step4 = _mm256_slli_epi32(step, 2);
    const __m256i w16 = _mm256_set1_epi16(0x1001), w4 = _mm256_set1_epi16(0x0401);
    const __m256i w16x = _mm256_set1_epi32(0x00100001);
    __m256i j0 = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                    _mm256_set1_epi32((int)GOLDEN));
    __m256i j1 = _mm256_add_epi32(j0, step), j2 = _mm256_add_epi32(j1, step);
    __m256i j3 = _mm256_add_epi32(j2, step);
    for (size_t i = 0; i < GROUP; i += 32) {
        __m256i c = narrow32_avx2(quantise8_avx2(x + i, lo, inv, key, j0, top),
                                  quantise8_avx2(x + i + 8, lo, inv, key, j1, top),
                                  quantise8_avx2(x + i + 16, lo, inv, key, j2, top),
                                  quantise8_avx2(x + i + 24, lo, inv, key, j3, top));
        if (bits == 8) {
            _mm256_storeu_si256((__m256i *)(void *)(out + i), c);
        } else if (bits == 4) { /* 16 words c0 + 16 c1, narrowed to bytes */
            __m256i p = _mm256_maddubs_epi16(c, w16);
            p = _mm256_permute4x64_epi64(_mm256_packus_epi16(p, p), 0x08);
            _mm_storeu_si128((__m128i *)(void *)(out + i / 2), _mm256_castsi256_si128(p));
        } else { /* 8 dwords c0 + 4 c1 + 16 (c2 + 4 c3), narrowed to bytes */
            __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(c, w4), w16x);
            d = narrow32_avx2(d, d, d, d);
            _mm_storel_epi64((__m128i *)(void *)(out + i / 4), _mm256_castsi256_si128(d));
        }
        j0 = _mm256_add_epi32(j0, step4);
        j1 = _mm256_add_epi32(j1, step4);
        j2 = _mm256_add_epi32(j2, step4);
        j3 = _mm256_add_epi32(j3, step4);
    }
}

#ifdef __SSE2__
/* The baseline's copy of the same (x86-64's SSE2): no 32-bit multiply (that
 * is SSE4.1), so two 32x32->64-bit products per vector; no signed 32-bit
 * min, so the cap at top is taken on 16-bit lanes after a saturating pack
 * (q <= top + 1, so nothing saturates); nibbles and crumbs are merged by
 * shifts and ORs within 16- and 32-bit lanes. */
static inline __m128i mullo_sse2(__m128i a, __m128i b) {
    __m128i even = _mm_mul_epu32(a, b), odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), b);
    return _mm_unpacklo_epi32(_mm_shuffle_epi32(even, _MM_SHUFFLE(0, 0, 2, 0)),
                              _mm_shuffle_epi32(odd, _MM_SHUFFLE(0, 0, 2, 0)));
}

static inline __m128i quantise4_sse2(const float *x, __m128 lo, __m128 inv, __m128i key, __m128i jg) {
    const __m128i mix1 = _mm_set1_epi32((int)0x85EBCA6Bu), mix2 = _mm_set1_epi32((int)0xC2B2AE35u);
    __m128i h = _mm_xor_si128(key, jg);
    h = mullo_sse2(_mm_xor_si128(h, _mm_srli_epi32(h, 16)), mix1);
    h = mullo_sse2(_mm_xor_si128(h, _mm_srli_epi32(h, 13)), mix2);
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 16));
    __m128 u = _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(h, 8)), _mm_set1_ps(1.0f / 16777216.0f));
    return _mm_cvttps_epi32(_mm_add_ps(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x), lo), inv), u));
}

/* 16 codes in order, capped at top; jg advanced past them. */
static inline __m128i codes16_sse2(const float *x, __m128 lo, __m128 inv, __m128i key, __m128i *jg,
                                   __m128i top) {
    const __m128i step = _mm_set1_epi32((int)(4u * GOLDEN));
    __m128i k[4];
    for (int v = 0; v < 4; v++) {
        k[v] = quantise4_sse2(x + 4 * v, lo, inv, key, *jg);
        *jg = _mm_add_epi32(*jg, step);
    }
    __m128i a = _mm_min_epi16(_mm_packs_epi32(k[0], k[1]), top);
    __m128i b = _mm_min_epi16(_mm_packs_epi32(k[2], k[3]), top);
    return _mm_packus_epi16(a, b);
}

REF static void quantise_sse2(uint8_t *out, const float *x, float lo_s, float inv_s, uint32_t key_s,
                              int bits) {
    const __m128 lo = _mm_set1_ps(lo_s), inv = _mm_set1_ps(inv_s);
    const __m128i key = _mm_set1_epi32((int)key_s), top = _mm_set1_epi16((short)((1 << bits) - 1));
    const __m128i byte16 = _mm_set1_epi16(0xFF), byte32 = _mm_set1_epi32(0xFF);
    __m128i jg = _mm_setr_epi32(0, (int)GOLDEN, (int)(2u * GOLDEN), (int)(3u * GOLDEN));
    if (bits == 8) {
        for (size_t i = 0; i < GROUP; i += 16)
            _mm_storeu_si128((__m128i *)(void *)(out + i), codes16_sse2(x + i, lo, inv, key, &jg, top));
    } else if (bits == 4) { /* c0 | c1 << 4 in each 16-bit lane's low byte */
        for (size_t i = 0; i < GROUP; i += 32) {
            __m128i w[2];
            for (int v = 0; v < 2; v++) {
                __m128i c = codes16_sse2(x + i + 16 * v, lo, inv, key, &jg, top);
                w[v] = _mm_and_si128(_mm_or_si128(c, _mm_srli_epi16(c, 4)), byte16);
            }
            _mm_storeu_si128((__m128i *)(void *)(out + i / 2), _mm_packus_epi16(w[0], w[1]));
        }
    } else { /* c0 | c1 << 2 | c2 << 4 | c3 << 6 in each 32-bit lane's low byte */
        for (size_t i = 0; i < GROUP; i += 64) {
            __m128i w[4];
            for (int v = 0; v < 4; v++) {
                __m128i c = codes16_sse2(x + i + 16 * v, lo, inv, key, &jg, top);
                __m128i t = _mm_or_si128(c, _mm_srli_epi32(c, 6));
                w[v] = _mm_and_si128(_mm_or_si128(t, _mm_srli_epi32(t, 12)), byte32);
            }
            __m128i r = _mm_packus_epi16(_mm_packs_epi32(w[0], w[1]), _mm_packs_epi32(w[2], w[3]));
            _mm_storeu_si128((__m128i *)(void *)(out + i / 4), r);
        }
    }
}
#endif

AVX512 static __m512i quantise16_avx512(const float *x, __m512 lo, __m512 inv, __m512i key,
                                        __m512i jg, __m512i top) {
    HASH_CONSTS(__m512i, _mm512_set1_epi32);
    __m512i h = _mm512_xor_si512(key, jg);
    h = _mm512_mullo_epi32(_mm512_xor_si512(h, _mm512_srli_epi32(h, 16)), mix1);
    h = _mm512_mullo_epi32(_mm512_xor_si512(h, _mm512_srli_epi32(h, 13)), mix2);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)),
                             _mm512_set1_ps(1.0f / 16777216.0f));
    __m512 q = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x), lo), inv), u);
    return _mm512_min_epi32(_mm512_cvttps_epi32(q), top);
}

AVX512 static void quantise_avx512(uint8_t *out, const float *x, float lo_s, float inv_s,
                                   uint32_t key_s, int bits) {
    const __m512 lo = _mm512_set1_ps(lo_s), inv = _mm512_set1_ps(inv_s);
    const __m512i key = _mm512_set1_epi32((int)key_s), top = _mm512_set1_epi32((1 << bits) - 1);
    const __m512i step = _mm512_set1_epi32((int)(16u * GOLDEN)), step2 = _mm512_add_epi32(step, step);
    const __m512i step3 = _mm512_add_epi32(step2, step), step4 = _mm512_add_epi32(step2, step2);
    const __m512i w16 = _mm512_set1_epi16(0x1001), w4 = _mm512_set1_epi16(0x0401);
    const __m512i w16x = _mm512_set1_epi32(0x00100001);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i jg = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                    _mm512_set1_epi32((int)GOLDEN));
    for (size_t i = 0; i < GROUP; i += 64) {
        __m512i k0 = quantise16_avx512(x + i, lo, inv, key, jg, top);
        __m512i k1 = quantise16_avx512(x + i + 16, lo, inv, key, _mm512_add_epi32(jg, step), top);
        __m512i k2 = quantise16_avx512(x + i + 32, lo, inv, key, _mm512_add_epi32(jg, step2), top);
        __m512i k3 = quantise16_avx512(x + i + 48, lo, inv, key, _mm512_add_epi32(jg, step3), top);
        /* 64 codes to bytes with three packs (each lane's chunks of four
         * interleaved) and one permute back to element order */
        __m512i w = _mm512_packus_epi16(_mm512_packus_epi32(k0, k1), _mm512_packus_epi32(k2, k3));
        __m512i c = _mm512_permutexvar_epi32(order, w);
        if (bits == 8)
            _mm512_storeu_si512((void *)(out + i), c);
        else if (bits == 4)
            _mm256_storeu_si256((__m256i *)(void *)(out + i / 2),
                                _mm512_cvtepi16_epi8(_mm512_maddubs_epi16(c, w16)));
        else
            _mm_storeu_si128((__m128i *)(void *)(out + i / 4),
                             _mm512_cvtepi32_epi8(_mm512_madd_epi16(_mm512_maddubs_epi16(c, w4), w16x)));
        jg = _mm512_add_epi32(jg, step4);
    }
}

/* Group g (m <= GROUP elements at x, element index base in the tensor):
 * lo and step into hdr, codes into out. */
INLINE void pack_group(float *hdr, uint8_t *out, const float *x, size_t m, int bits,
                       uint32_t key, int isa) {
    /* The next group's lines, asked for now: this group's quantisation
     * works from L1 and would otherwise leave the memory idle (AVX2 packing
     * 10-15% faster at 64 MiB; a prefetch past the end of x is dropped,
     * never a fault). */
    for (size_t k = 0; k < GROUP; k += 64 / sizeof(float))
        __builtin_prefetch(x + GROUP + k);
    float lo, hi;
    int bad = isa == ISA_AVX512 ? minmax_avx512(x, m, &lo, &hi)
              : isa == ISA_AVX2 ? minmax_avx2(x, m, &lo, &hi)
                                : minmax_base(x, m, &lo, &hi);
    unsigned top = (1u << bits) - 1;
    float range = hi - lo;
    if (bad || !(range - range == 0.0f)) {
        hdr[0] = hdr[1] = __builtin_nanf("");
        memset(out, 0, (size_t)GROUP * (size_t)bits / 8);
        return;
    }
    float inv = range > 0.0f ? (float)top / range : 0.0f;
    /* A subnormal range can make top / range overflow, and then q below
     * inf or NaN (0 * inf), whose conversion to int C leaves undefined: 0
     * instead, so every code of the group is 0, which is what x86's
     * conversion (INT_MIN, cut to a byte) gave before. */
    if (!(inv - inv == 0.0f))
        inv = 0.0f;
    hdr[0] = lo;
    hdr[1] = range / (float)top;
    /* whole groups by each path's intrinsics; a tensor's last, partial
     * group (one per tensor) by the loop below, which is the reference */
    if (m == GROUP && isa == ISA_AVX512) {
        quantise_avx512(out, x, lo, inv, key, bits);
        return;
    }
    if (m == GROUP && isa == ISA_AVX2) {
        quantise_avx2(out, x, lo, inv, key, bits);
        return;
    }
#ifdef __SSE2__
    if (m == GROUP && isa == ISA_REF) {
        quantise_sse2(out, x, lo, inv, key, bits);
        return;
    }
#endif
    uint8_t c[GROUP];
#pragma omp simd
    for (uint32_t i = 0; i < (uint32_t)m; i++) {
        /* x >= lo, so q >= 0; q + u < top + 1 up to rounding, clamped */
        float q = (x[i] - lo) * inv + fr_compress_uniform(key, i);
        int k = (int)q;
        c[i] = (uint8_t)(k > (int)top ? (int)top : k);
    }
    for (size_t i = m; i < GROUP; i++)
        c[i] = 0;
    if (bits == 8) {
        memcpy(out, c, GROUP);
    } else if (bits == 4) {
        for (size_t j = 0; j < GROUP / 2; j++)
            out[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
    } else {
        for (size_t j = 0; j < GROUP / 4; j++)
            out[j] = (uint8_t)(c[4 * j] | c[4 * j + 1] << 2 | c[4 * j + 2] << 4 | c[4 * j + 3] << 6);
    }
}

/* Code i of a group (the scalar tail of the AVX copies below). */
INLINE unsigned code_at(const uint8_t *in, size_t i, int bits) {
    size_t bit = i * (size_t)bits;
    return (in[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
}

/* The AVX copies widen 8 or 16 codes at once with a variable shift of one
 * broadcast word (the scalar loop widens a byte at a time, which ran 2-bit
 * decoding at a quarter of a copy's bandwidth), then compute lo + c * step
 * as the reference does: a product, then a sum, each rounded (no FMA). */
AVX2 static void unpack_group_avx2(float *x, const float *hdr, const uint8_t *in, size_t m,
                                   int bits) {
    const __m256 lo = _mm256_set1_ps(hdr[0]), step = _mm256_set1_ps(hdr[1]);
    const __m256i sh = bits == 2 ? _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)
                                 : _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i top = _mm256_set1_epi32((1 << bits) - 1);
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const uint8_t *b = in + i * (size_t)bits / 8;
        __m256i c;
        if (bits == 8) {
            c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)b));
        } else {
            uint32_t w; /* 8 codes: 4 or 2 bytes, each a fixed-size copy (a
                         * copy of `bits` bytes was a call to memcpy) */
            if (bits == 4) {
                memcpy(&w, b, 4);
            } else {
                uint16_t h;
                memcpy(&h, b, 2);
                w = h;
            }
            c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), top);
        }
        _mm256_storeu_ps(x + i, _mm256_add_ps(lo, _mm256_mul_ps(_mm256_cvtepi32_ps(c), step)));
    }
    for (; i < m; i++)
        x[i] = hdr[0] + (float)code_at(in, i, bits) * hdr[1];
}

AVX512 static void unpack_group_avx512(float *x, const float *hdr, const uint8_t *in, size_t m,
                                       int bits) {
    const __m512 lo = _mm512_set1_ps(hdr[0]), step = _mm512_set1_ps(hdr[1]);
    const __m512i sh2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i sh4 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i top = _mm512_set1_epi32((1 << bits) - 1);
    size_t i = 0;
    for (; i + 16 <= m; i += 16) {
        const uint8_t *b = in + i * (size_t)bits / 8;
        __m512i c;
        if (bits == 8) {
            c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)b));
        } else if (bits == 4) {
            uint32_t w[2];
            memcpy(w, b, 8);
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32((int)w[0])),
                                           _mm256_set1_epi32((int)w[1]), 1);
            c = _mm512_and_si512(_mm512_srlv_epi32(v, sh4), top);
        } else {
            uint32_t w;
            memcpy(&w, b, 4);
            c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)w), sh2), top);
        }
        _mm512_storeu_ps(x + i, _mm512_add_ps(lo, _mm512_mul_ps(_mm512_cvtepi32_ps(c), step)));
    }
    for (; i < m; i++)
        x[i] = hdr[0] + (float)code_at(in, i, bits) * hdr[1];
}

INLINE void unpack_group(float *x, const float *hdr, const uint8_t *in, size_t m, int bits,
                         int isa) {
    if (isa == ISA_AVX512) {
        unpack_group_avx512(x, hdr, in, m, bits);
        return;
    }
    if (isa == ISA_AVX2) {
        unpack_group_avx2(x, hdr, in, m, bits);
        return;
    }
    float lo = hdr[0], step = hdr[1];
    if (bits == 8) {
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            x[i] = lo + (float)in[i] * step;
    } else {
        /* codes widened to bytes first: a loop over bytes vectorises, one
         * that shifts by the element's position in its byte does not */
        uint8_t c[GROUP];
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        /* a byte's 2 (4) codes spread to the low bits of 2 (4) bytes of one
         * word with shifts and ORs, the word stored whole: a loop that
         * vectorises, where storing byte by byte ran 2-bit decoding at a
         * fifth of 8-bit's speed */
        if (bits == 4) {
            for (size_t j = 0; j < GROUP / 2; j++) {
                uint16_t w = (uint16_t)((in[j] | in[j] << 4) & 0x0F0Fu);
                memcpy(c + 2 * j, &w, 2);
            }
        } else {
            for (size_t j = 0; j < GROUP / 4; j++) {
                uint32_t b = in[j], w = (b | b << 6 | b << 12 | b << 18) & 0x03030303u;
                memcpy(c + 4 * j, &w, 4);
            }
        }
#else
        for (size_t i = 0; i < GROUP; i++)
            c[i] = (uint8_t)code_at(in, i, bits);
#endif
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            x[i] = lo + (float)c[i] * step;
    }
}

/* The per-ISA copies: the whole tensor, groups split over the team. */
#define PACK_BODY(isa)                                                                         \
    size_t groups = (n + GROUP - 1) / GROUP, code_bytes = (size_t)GROUP * (size_t)bits / 8;    \
    float *hdr = (float *)(void *)packed;                                                      \
    uint8_t *codes = packed + groups * 2 * sizeof(float);                                      \
    _Pragma("omp parallel for if (groups > 64) schedule(static)")                              \
    for (size_t g = 0; g < groups; g++) {                                                      \
        size_t base = g * GROUP, m = n - base < GROUP ? n - base : GROUP;                       \
        pack_group(hdr + 2 * g, codes + g * code_bytes, x + base, m, bits,                     \
                   fr_compress_key(seed, g), isa);                                             \
    }

#define UNPACK_BODY(isa)                                                                       \
    size_t groups = (n + GROUP - 1) / GROUP, code_bytes = (size_t)GROUP * (size_t)bits / 8;    \
    const float *hdr = (const float *)(const void *)packed;                                    \
    const uint8_t *codes = packed + groups * 2 * sizeof(float);                                \
    _Pragma("omp parallel for if (groups > 64) schedule(static)")                              \
    for (size_t g = 0; g < groups; g++) {                                                      \
        size_t base = g * GROUP, m = n - base < GROUP ? n - base : GROUP;                       \
        unpack_group(x + base, hdr + 2 * g, codes + g * code_bytes, m, bits, isa);             \
    }

REF static void pack_ref(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY(ISA_REF)
}
AVX2 static void pack_avx2(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY(ISA_AVX2)
}
AVX512 static void pack_avx512(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY(ISA_AVX512)
}
REF static void unpack_ref(float *x, const uint8_t *packed, int bits, size_t n) {
    UNPACK_BODY(ISA_REF)
}
AVX2 static void unpack_avx2(float *x, const uint8_t *packed, int bits, size_t n) {
    UNPACK_BODY(ISA_AVX2)
}
AVX512 static void unpack_avx512(float *x, const uint8_t *packed, int bits, size_t n) {
    UNPACK_BODY(ISA_AVX512)
}

fr_status fr_cpu_compress_pack_isa(fr_cpu_isa isa, uint8_t *packed, const float *x, int bits,
                                   uint64_t seed, size_t n) {
    switch (fr_cpu_compress_usable(isa)) {
    case FR_ISA_AVX512: pack_avx512(packed, x, bits, seed, n); break;
    case FR_ISA_AVX2: pack_avx2(packed, x, bits, seed, n); break;
    default: pack_ref(packed, x, bits, seed, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_compress_unpack_isa(fr_cpu_isa isa, float *x, const uint8_t *packed, int bits,
                                     size_t n) {
    switch (fr_cpu_compress_usable(isa)) {
    case FR_ISA_AVX512: unpack_avx512(x, packed, bits, n); break;
    case FR_ISA_AVX2: unpack_avx2(x, packed, bits, n); break;
    default: unpack_ref(x, packed, bits, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_compress_pack(uint8_t *packed, const float *x, int bits, uint64_t seed,
                               size_t n) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa));
    return fr_cpu_compress_pack_isa(isa, packed, x, bits, seed, n);
}

fr_status fr_cpu_compress_unpack(float *x, const uint8_t *packed, int bits, size_t n) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa));
    return fr_cpu_compress_unpack_isa(isa, x, packed, bits, n);
}
