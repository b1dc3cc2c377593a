/* cast.cu: dtype conversion of n elements on the GPU, every pair of dtypes,
 * with the same results as cpu/cast.c bit for bit:
 *  - same dtype: a device-to-device copy;
 *  - u8 -> i32: exact, no float detour (labels);
 *  - otherwise through f32: f16/bf16 widen exactly (bf16 is the top half of
 *    an f32); i32 rounds to nearest
 *    even; f32 -> f16/bf16 rounds to nearest even (cuda_fp16.h / cuda_bf16.h
 *    *_rn intrinsics), overflowing to inf, keeping inf and NaN; the NaN bit
 *    pattern is the CPU's (quiet, sign kept), not the intrinsics' canonical
 *    one, so both backends store identical bytes;
 *  - integer targets truncate toward zero and saturate, NaN -> 0. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "internal.h"

/* f16 -> f32 is exact; a NaN is widened by hand (sign, quiet bit and payload
 * shifted into place, as on the CPU) rather than trusting the conversion
 * instruction to keep its payload. */
__device__ inline float f16_bits_to_f32(uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu))
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(h & 0x03ffu) << 13));
    return __half2float(__ushort_as_half(h));
}

__device__ inline float load_as_f32(const void *src, fr_dtype t, size_t i) {
    switch (t) {
    case FR_F32: return ((const float *)src)[i];
    case FR_F16: return f16_bits_to_f32(((const uint16_t *)src)[i]);
    case FR_BF16: return __uint_as_float((uint32_t)((const uint16_t *)src)[i] << 16); /* exact */
    case FR_I32: return __int2float_rn(((const int32_t *)src)[i]);
    case FR_U8: return (float)((const uint8_t *)src)[i];
    default: return 0.0f; /* unreachable: the host checks the dtype */
    }
}

__device__ inline uint16_t f32_to_f16_bits(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN */
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(v));
}

__device__ inline uint16_t f32_to_bf16_bits(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, payload's top bits kept */
        return (uint16_t)((u >> 16) | 0x0040u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ inline void store_from_f32(void *dst, fr_dtype t, size_t i, float v) {
    switch (t) {
    case FR_F32: ((float *)dst)[i] = v; break;
    case FR_F16: ((uint16_t *)dst)[i] = f32_to_f16_bits(v); break;
    case FR_BF16: ((uint16_t *)dst)[i] = f32_to_bf16_bits(v); break;
    case FR_I32:
        /* 2147483520 is the largest float below 2^31. */
        ((int32_t *)dst)[i] = v != v                 ? 0
                              : v >= 2147483520.0f   ? INT32_MAX
                              : v <= -2147483648.0f  ? INT32_MIN
                                                     : (int32_t)v;
        break;
    case FR_U8: ((uint8_t *)dst)[i] = v != v ? 0 : v >= 255.0f ? 255 : v <= 0.0f ? 0 : (uint8_t)v; break;
    default: break; /* unreachable: the host checks the dtype */
    }
}

__global__ void cast_kernel(void *dst, fr_dtype dst_type, const void *src, fr_dtype src_type,
                            size_t n) {
    FR_CUDA_FOR(i, n) store_from_f32(dst, dst_type, i, load_as_f32(src, src_type, i));
}

__global__ void u8_to_i32_kernel(int32_t *dst, const uint8_t *src, size_t n) {
    FR_CUDA_FOR(i, n) dst[i] = src[i];
}

extern "C" fr_status fr_cuda_cast(void *dst, fr_dtype dst_type, const void *src, fr_dtype src_type,
                                  size_t n) {
    if ((unsigned)dst_type >= FR_DTYPE_COUNT || (unsigned)src_type >= FR_DTYPE_COUNT)
        return fr_error(FR_ERR_DTYPE, "cast: unknown dtype (%d -> %d)", (int)src_type,
                        (int)dst_type);
    if (n == 0)
        return FR_OK;
    if (dst_type == src_type) {
        FR_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * fr_dtype_size(src_type),
                                      cudaMemcpyDeviceToDevice, 0));
        return FR_OK;
    }
    if (dst_type == FR_I32 && src_type == FR_U8)
        u8_to_i32_kernel<<<fr_cuda_grid(n), FR_CUDA_THREADS>>>((int32_t *)dst,
                                                               (const uint8_t *)src, n);
    else
        cast_kernel<<<fr_cuda_grid(n), FR_CUDA_THREADS>>>(dst, dst_type, src, src_type, n);
    FR_CUDA_LAUNCH_CHECK();
    return FR_OK;
}
