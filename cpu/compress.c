/* cpu/compress.c: packing saved activations into per-group codes and back
 * (kernels.def: compress_pack, compress_unpack, sign_pack, sign_unpack;
 * docs/ARCHITECTURE.md, "Saved tensors: held, recipe or compressed").
 *
 * One C body per direction, compiled three times: as it is (the scalar
 * reference, what SSE2 gives), for AVX2 and for AVX-512, the copy chosen by
 * cpu/isa.h's class (so FR_CPU_ISA can force a lower one). Every copy does
 * the same float operations in the same order (-std=c11: no contraction), so
 * all three give the same bits; tests/test_compress.c checks it. Groups are
 * independent and each thread takes whole groups, so the codes never depend
 * on the team size. */
#include <string.h>

#include "../tensor/kernels.h"
#include "compress.h"

#define GROUP FR_COMPRESS_GROUP

#define INLINE static inline __attribute__((always_inline))
#define REF
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

/* Group g (m <= GROUP elements at x, element index base in the tensor):
 * lo and step into hdr, codes into out. */
INLINE void pack_group(float *hdr, uint8_t *out, const float *x, size_t m, int bits,
                       uint32_t key) {
    float lo = x[0], hi = x[0];
    int bad = 0;
    /* scalar: GCC vectorises this select-based reduction only without
     * trapping math, and that attribute (optimize) here made packing 40x slower */
    for (size_t i = 0; i < m; i++) {
        float v = x[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        bad |= !(v - v == 0.0f); /* NaN or inf */
    }
    unsigned top = (1u << bits) - 1;
    float range = hi - lo;
    if (bad || !(range - range == 0.0f)) {
        hdr[0] = hdr[1] = __builtin_nanf("");
        memset(out, 0, (size_t)GROUP * (size_t)bits / 8);
        return;
    }
    float inv = range > 0.0f ? (float)top / range : 0.0f;
    hdr[0] = lo;
    hdr[1] = range / (float)top;
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

INLINE void unpack_group(float *x, const float *hdr, const uint8_t *in, size_t m, int bits) {
    float lo = hdr[0], step = hdr[1];
    if (bits == 8) {
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            x[i] = lo + (float)in[i] * step;
    } else {
        /* codes widened to bytes first: a loop over bytes vectorises, one
         * that shifts by the element's position in its byte does not */
        uint8_t c[GROUP];
        if (bits == 4) {
            for (size_t j = 0; j < GROUP / 2; j++) {
                c[2 * j] = in[j] & 15u;
                c[2 * j + 1] = in[j] >> 4;
            }
        } else {
            for (size_t j = 0; j < GROUP / 4; j++) {
                c[4 * j] = in[j] & 3u;
                c[4 * j + 1] = (in[j] >> 2) & 3u;
                c[4 * j + 2] = (in[j] >> 4) & 3u;
                c[4 * j + 3] = in[j] >> 6;
            }
        }
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            x[i] = lo + (float)c[i] * step;
    }
}

/* The per-ISA copies: the whole tensor, groups split over the team. */
#define PACK_BODY                                                                              \
    size_t groups = (n + GROUP - 1) / GROUP, code_bytes = (size_t)GROUP * (size_t)bits / 8;    \
    float *hdr = (float *)(void *)packed;                                                      \
    uint8_t *codes = packed + groups * 2 * sizeof(float);                                      \
    _Pragma("omp parallel for if (groups > 64) schedule(static)")                              \
    for (size_t g = 0; g < groups; g++) {                                                      \
        size_t base = g * GROUP, m = n - base < GROUP ? n - base : GROUP;                       \
        pack_group(hdr + 2 * g, codes + g * code_bytes, x + base, m, bits,                     \
                   fr_compress_key(seed, g));                                                  \
    }

#define UNPACK_BODY                                                                            \
    size_t groups = (n + GROUP - 1) / GROUP, code_bytes = (size_t)GROUP * (size_t)bits / 8;    \
    const float *hdr = (const float *)(const void *)packed;                                    \
    const uint8_t *codes = packed + groups * 2 * sizeof(float);                                \
    _Pragma("omp parallel for if (groups > 64) schedule(static)")                              \
    for (size_t g = 0; g < groups; g++) {                                                      \
        size_t base = g * GROUP, m = n - base < GROUP ? n - base : GROUP;                       \
        unpack_group(x + base, hdr + 2 * g, codes + g * code_bytes, m, bits);                  \
    }

REF static void pack_ref(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY
}
AVX2 static void pack_avx2(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY
}
AVX512 static void pack_avx512(uint8_t *packed, const float *x, int bits, uint64_t seed, size_t n) {
    PACK_BODY
}
REF static void unpack_ref(float *x, const uint8_t *packed, int bits, size_t n) { UNPACK_BODY }
AVX2 static void unpack_avx2(float *x, const uint8_t *packed, int bits, size_t n) { UNPACK_BODY }
AVX512 static void unpack_avx512(float *x, const uint8_t *packed, int bits, size_t n) {
    UNPACK_BODY
}

static fr_cpu_isa usable(fr_cpu_isa isa) {
    fr_cpu_isa have = fr_cpu_isa_detected();
    return isa > have ? have : isa;
}

fr_status fr_cpu_compress_pack_isa(fr_cpu_isa isa, uint8_t *packed, const float *x, int bits,
                                   uint64_t seed, size_t n) {
    switch (usable(isa)) {
    case FR_ISA_AVX512: pack_avx512(packed, x, bits, seed, n); break;
    case FR_ISA_AVX2: pack_avx2(packed, x, bits, seed, n); break;
    default: pack_ref(packed, x, bits, seed, n); break;
    }
    return FR_OK;
}

fr_status fr_cpu_compress_unpack_isa(fr_cpu_isa isa, float *x, const uint8_t *packed, int bits,
                                     size_t n) {
    switch (usable(isa)) {
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

fr_status fr_cpu_sign_pack(uint8_t *mask, const float *x, size_t n) {
    size_t bytes = fr_sign_nbytes(n);
#pragma omp parallel for if (n > 65536) schedule(static)
    for (size_t j = 0; j < bytes; j++) {
        unsigned b = 0;
        for (size_t k = 0; k < 8 && j * 8 + k < n; k++)
            b |= (unsigned)(x[j * 8 + k] > 0.0f) << k;
        mask[j] = (uint8_t)b;
    }
    return FR_OK;
}

fr_status fr_cpu_sign_unpack(float *y, const uint8_t *mask, size_t n) {
#pragma omp parallel for if (n > 65536) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] = (float)((mask[i >> 3] >> (i & 7)) & 1u);
    return FR_OK;
}
