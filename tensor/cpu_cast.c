/* cpu_cast.c: dtype conversion kernel on the host. */
#include <string.h>

#include "kernels.h"

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
    /* The conversions mixed precision runs on every op's operands get their
     * own parallel loops (no per-element dispatch). */
    if (src_type == FR_F32 && (dst_type == FR_F16 || dst_type == FR_BF16)) {
        const float *s = src;
        uint16_t *d = dst;
        bool f16 = dst_type == FR_F16;
#pragma omp parallel for if (n > FR_CAST_PAR_MIN) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = f16 ? fr_f32_to_f16(s[i]) : fr_f32_to_bf16(s[i]);
        return FR_OK;
    }
    if (dst_type == FR_F32 && (src_type == FR_F16 || src_type == FR_BF16)) {
        const uint16_t *s = src;
        float *d = dst;
        bool f16 = src_type == FR_F16;
#pragma omp parallel for if (n > FR_CAST_PAR_MIN) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = f16 ? fr_f16_to_f32(s[i]) : fr_bf16_to_f32(s[i]);
        return FR_OK;
    }
    for (size_t i = 0; i < n; i++)
        store_from_f32(dst, dst_type, i, load_as_f32(src, src_type, i));
    return FR_OK;
}
