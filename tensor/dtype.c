/* dtype.c: dtype sizes and names, and exact scalar f16/bf16 conversions. */
#include "fr_base.h"

#include <string.h>

static const size_t dtype_sizes[] = {4, 2, 2, 4, 1};
static const char *const dtype_names[] = {"f32", "f16", "bf16", "i32", "u8"};
static const char *const device_names[] = {"cpu", "cuda"};
FR_STATIC_ASSERT(sizeof dtype_sizes / sizeof *dtype_sizes == FR_DTYPE_COUNT, "dtype_sizes");
FR_STATIC_ASSERT(sizeof dtype_names / sizeof *dtype_names == FR_DTYPE_COUNT, "dtype_names");
FR_STATIC_ASSERT(sizeof device_names / sizeof *device_names == FR_DEVICE_COUNT, "device_names");

size_t fr_dtype_size(fr_dtype t) {
    FR_ASSERT((unsigned)t < FR_DTYPE_COUNT);
    return dtype_sizes[t];
}
const char *fr_dtype_name(fr_dtype t) {
    return (unsigned)t < FR_DTYPE_COUNT ? dtype_names[t] : "?";
}
const char *fr_device_name(fr_device d) {
    return (unsigned)d < FR_DEVICE_COUNT ? device_names[d] : "?";
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fr_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even on the 16 dropped bits. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fr_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t fr_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below f16's smallest normal: subnormal or 0 */
        if (absu < 0x33000000u) /* below half the smallest subnormal */
            return (uint16_t)sign;
        uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* Normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to even. */
    uint32_t r = absu - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float fr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}
