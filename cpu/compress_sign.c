/* cpu/compress_sign.c: ReLU masks as bits (kernels.def: sign_pack,
 * sign_unpack, sign_act_backward; docs/ARCHITECTURE.md, "Saved tensors: held, recipe or
 * compressed"), the sign half of cpu/compress.c, on the same three paths
 * chosen by cpu/isa.h's class. */
#include <immintrin.h>
#include <string.h>

#include "../tensor/kernels.h"
#include "compress.h"

#define REF
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* Sign masks: bit k of byte j is x[8j + k] > 0, written 16 elements (two
 * bytes) at a time by each ISA's copy, the tail by the reference. A byte is
 * a function of its own eight elements, so the mask never depends on the
 * path or the team. */
/* The baseline: SSE2 where the build has it (every x86-64), four
 * comparisons to four bits at once; a bit at a time elsewhere. */
#ifdef __SSE2__
REF static uint16_t sign_bits_ref(const float *x) {
    __m128 z = _mm_setzero_ps();
    unsigned b = 0;
    for (unsigned k = 0; k < 16; k += 4)
        b |= (unsigned)_mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(x + k), z)) << k;
    return (uint16_t)b;
}
#else
REF static uint16_t sign_bits_ref(const float *x) {
    unsigned b = 0;
    for (unsigned k = 0; k < 16; k++)
        b |= (unsigned)(x[k] > 0.0f) << k;
    return (uint16_t)b;
}
#endif
AVX2 static uint16_t sign_bits_avx2(const float *x) {
    __m256 z = _mm256_setzero_ps();
    unsigned a = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x), z, _CMP_GT_OQ));
    unsigned b = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + 8), z, _CMP_GT_OQ));
    return (uint16_t)(a | b << 8);
}
AVX512 static uint16_t sign_bits_avx512(const float *x) {
    return (uint16_t)_mm512_cmp_ps_mask(_mm512_loadu_ps(x), _mm512_setzero_ps(), _CMP_GT_OQ);
}

#ifdef __SSE2__
REF static void sign_ones_ref(float *y, uint16_t b) {
    const __m128i bit = _mm_setr_epi32(1, 2, 4, 8);
    const __m128i one = _mm_castps_si128(_mm_set1_ps(1.0f));
    for (unsigned k = 0; k < 16; k += 4) {
        __m128i set = _mm_and_si128(_mm_set1_epi32((b >> k) & 15), bit);
        _mm_storeu_ps(y + k, _mm_castsi128_ps(_mm_and_si128(_mm_cmpeq_epi32(set, bit), one)));
    }
}
#else
REF static void sign_ones_ref(float *y, uint16_t b) {
    for (unsigned k = 0; k < 16; k++)
        y[k] = (float)((b >> k) & 1u);
}
#endif
AVX2 static void sign_ones_avx2(float *y, uint16_t b) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i one = _mm256_castps_si256(_mm256_set1_ps(1.0f));
    for (int h = 0; h < 2; h++) {
        __m256i set = _mm256_and_si256(_mm256_set1_epi32((b >> (8 * h)) & 255), bit);
        __m256i m = _mm256_cmpeq_epi32(set, bit);
        _mm256_storeu_ps(y + 8 * h, _mm256_castsi256_ps(_mm256_and_si256(m, one)));
    }
}
AVX512 static void sign_ones_avx512(float *y, uint16_t b) {
    _mm512_storeu_ps(y, _mm512_maskz_mov_ps((__mmask16)b, _mm512_set1_ps(1.0f)));
}

#define SIGN_PACK_BODY(bits16)                                                                 \
    size_t blocks = n / 16;                                                                    \
    _Pragma("omp parallel for if (n > 65536) schedule(static)")                                \
    for (size_t k = 0; k < blocks; k++) {                                                      \
        uint16_t b = bits16(x + 16 * k);                                                       \
        memcpy(mask + 2 * k, &b, 2);                                                           \
    }                                                                                          \
    for (size_t j = 2 * blocks; j < fr_sign_nbytes(n); j++) {                                  \
        unsigned b = 0;                                                                        \
        for (size_t k = 0; k < 8 && j * 8 + k < n; k++)                                        \
            b |= (unsigned)(x[j * 8 + k] > 0.0f) << k;                                         \
        mask[j] = (uint8_t)b;                                                                  \
    }

#define SIGN_UNPACK_BODY(ones16)                                                               \
    size_t blocks = n / 16;                                                                    \
    _Pragma("omp parallel for if (n > 65536) schedule(static)")                                \
    for (size_t k = 0; k < blocks; k++) {                                                      \
        uint16_t b;                                                                            \
        memcpy(&b, mask + 2 * k, 2);                                                           \
        ones16(y + 16 * k, b);                                                                 \
    }                                                                                          \
    for (size_t i = 16 * blocks; i < n; i++)                                                   \
        y[i] = (float)((mask[i >> 3] >> (i & 7)) & 1u);

REF static void sign_pack_ref(uint8_t *mask, const float *x, size_t n) {
    SIGN_PACK_BODY(sign_bits_ref)
}
AVX2 static void sign_pack_avx2(uint8_t *mask, const float *x, size_t n) {
    SIGN_PACK_BODY(sign_bits_avx2)
}
AVX512 static void sign_pack_avx512(uint8_t *mask, const float *x, size_t n) {
    SIGN_PACK_BODY(sign_bits_avx512)
}
REF static void sign_unpack_ref(float *y, const uint8_t *mask, size_t n) {
    SIGN_UNPACK_BODY(sign_ones_ref)
}
AVX2 static void sign_unpack_avx2(float *y, const uint8_t *mask, size_t n) {
    SIGN_UNPACK_BODY(sign_ones_avx2)
}
AVX512 static void sign_unpack_avx512(float *y, const uint8_t *mask, size_t n) {
    SIGN_UNPACK_BODY(sign_ones_avx512)
}

/* ReLU's / leaky ReLU's gradient from 16 bits (sign_act_backward): where a
 * bit is clear, 0 or dy * slope, the product fr_act_grad_LEAKY_RELU forms,
 * so each path gives the scalar functions' bits. */
#ifdef __SSE2__
REF static void sign_grad16_ref(float *dx, const float *dy, uint16_t b, bool leaky, float slope) {
    const __m128i bit = _mm_setr_epi32(1, 2, 4, 8);
    const __m128 p = _mm_set1_ps(slope);
    for (unsigned k = 0; k < 16; k += 4) {
        __m128 m = _mm_castsi128_ps(
            _mm_cmpeq_epi32(_mm_and_si128(_mm_set1_epi32((b >> k) & 15), bit), bit));
        __m128 g = _mm_loadu_ps(dy + k);
        __m128 off = leaky ? _mm_andnot_ps(m, _mm_mul_ps(g, p)) : _mm_setzero_ps();
        _mm_storeu_ps(dx + k, _mm_or_ps(_mm_and_ps(m, g), off));
    }
}
#else
REF static void sign_grad16_ref(float *dx, const float *dy, uint16_t b, bool leaky, float slope) {
    for (unsigned k = 0; k < 16; k++)
        dx[k] = (b >> k) & 1u ? dy[k] : leaky ? dy[k] * slope : 0.0f;
}
#endif
AVX2 static void sign_grad16_avx2(float *dx, const float *dy, uint16_t b, bool leaky,
                                  float slope) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 p = _mm256_set1_ps(slope);
    for (int h = 0; h < 2; h++) {
        __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32((b >> (8 * h)) & 255), bit), bit));
        __m256 g = _mm256_loadu_ps(dy + 8 * h);
        __m256 off = leaky ? _mm256_mul_ps(g, p) : _mm256_setzero_ps();
        _mm256_storeu_ps(dx + 8 * h, _mm256_blendv_ps(off, g, m));
    }
}
AVX512 static void sign_grad16_avx512(float *dx, const float *dy, uint16_t b, bool leaky,
                                      float slope) {
    __m512 g = _mm512_loadu_ps(dy);
    __m512 off = leaky ? _mm512_mul_ps(g, _mm512_set1_ps(slope)) : _mm512_setzero_ps();
    _mm512_storeu_ps(dx, _mm512_mask_mov_ps(off, (__mmask16)b, g));
}

#define SIGN_GRAD_BODY(grad16)                                                                 \
    size_t blocks = n / 16;                                                                    \
    _Pragma("omp parallel for if (n > 65536) schedule(static)")                                \
    for (size_t k = 0; k < blocks; k++) {                                                      \
        uint16_t b;                                                                            \
        memcpy(&b, mask + 2 * k, 2);                                                           \
        grad16(dx + 16 * k, dy + 16 * k, b, leaky, slope);                                     \
    }                                                                                          \
    for (size_t i = 16 * blocks; i < n; i++)                                                   \
        dx[i] = (mask[i >> 3] >> (i & 7)) & 1u ? dy[i] : leaky ? dy[i] * slope : 0.0f;

REF static void sign_grad_ref(float *dx, const float *dy, const uint8_t *mask, bool leaky,
                              float slope, size_t n) {
    SIGN_GRAD_BODY(sign_grad16_ref)
}
AVX2 static void sign_grad_avx2(float *dx, const float *dy, const uint8_t *mask, bool leaky,
                                float slope, size_t n) {
    SIGN_GRAD_BODY(sign_grad16_avx2)
}
AVX512 static void sign_grad_avx512(float *dx, const float *dy, const uint8_t *mask, bool leaky,
                                    float slope, size_t n) {
    SIGN_GRAD_BODY(sign_grad16_avx512)
}

fr_status fr_cpu_sign_act_backward_isa(fr_cpu_isa isa, float *dx, const float *dy,
                                       const uint8_t *mask, fr_act act, float slope, size_t n) {
    bool leaky = act == FR_ACT_LEAKY_RELU;
    switch (fr_cpu_compress_usable(isa)) {
    case FR_ISA_AVX512: sign_grad_avx512(dx, dy, mask, leaky, slope, n); break;
    case FR_ISA_AVX2: sign_grad_avx2(dx, dy, mask, leaky, slope, n); break;
    default: sign_grad_ref(dx, dy, mask, leaky, slope, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_sign_act_backward(float *dx, const float *dy, const uint8_t *mask, fr_act act,
                                   float slope, size_t n) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa));
    return fr_cpu_sign_act_backward_isa(isa, dx, dy, mask, act, slope, n);
}

fr_status fr_cpu_sign_pack_isa(fr_cpu_isa isa, uint8_t *mask, const float *x, size_t n) {
    switch (fr_cpu_compress_usable(isa)) {
    case FR_ISA_AVX512: sign_pack_avx512(mask, x, n); break;
    case FR_ISA_AVX2: sign_pack_avx2(mask, x, n); break;
    default: sign_pack_ref(mask, x, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_sign_unpack_isa(fr_cpu_isa isa, float *y, const uint8_t *mask, size_t n) {
    switch (fr_cpu_compress_usable(isa)) {
    case FR_ISA_AVX512: sign_unpack_avx512(y, mask, n); break;
    case FR_ISA_AVX2: sign_unpack_avx2(y, mask, n); break;
    default: sign_unpack_ref(y, mask, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_sign_pack(uint8_t *mask, const float *x, size_t n) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa));
    return fr_cpu_sign_pack_isa(isa, mask, x, n);
}

fr_status fr_cpu_sign_unpack(float *y, const uint8_t *mask, size_t n) {
    fr_cpu_isa isa;
    FR_TRY(fr_cpu_isa_get(&isa));
    return fr_cpu_sign_unpack_isa(isa, y, mask, n);
}
