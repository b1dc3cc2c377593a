/* cpu_cast.c: dtype conversion kernel on the host. */
#include <string.h>

#include "kernels.h"

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
    for (size_t i = 0; i < n; i++)
        store_from_f32(dst, dst_type, i, load_as_f32(src, src_type, i));
    return FR_OK;
}
