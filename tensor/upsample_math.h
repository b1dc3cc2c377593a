/* upsample_math.h: where an output pixel of bilinear upsampling reads,
 * written once for cpu/upsample.c and cuda/upsample.cu (internal). PyTorch
 * 1.13's rule along one axis (area_pixel_compute_source_index), in f32:
 *   align_corners  src = o * (in - 1) / (out - 1)    (0 when out == 1)
 *   otherwise      src = max((o + 0.5) / scale - 0.5, 0), 1 / scale rounded to f32
 * then i0 = floor(src), i1 = min(i0 + 1, in - 1), and the weights are
 * 1 - l and l with l = src - i0. Nearest reads o / scale (PyTorch's
 * floor(o * f32(1 / scale)) for every integer scale). */
#ifndef FR_UPSAMPLE_MATH_H
#define FR_UPSAMPLE_MATH_H

#include "shapes.h"

#ifdef __CUDACC__
#define FR_UPSAMPLE_FN static __host__ __device__ __forceinline__
#else
#define FR_UPSAMPLE_FN static inline
#endif

FR_UPSAMPLE_FN void fr_upsample_src(int o, int in, int out, int scale, int align_corners, int *i0,
                                    int *i1, float *l) {
    float src;
    if (align_corners) {
        float r = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
        src = r * (float)o;
    } else {
        float r = (float)(1.0 / scale);
        src = r * ((float)o + 0.5f) - 0.5f;
        if (src < 0.0f)
            src = 0.0f;
    }
    *i0 = (int)src;
    if (*i0 > in - 1)
        *i0 = in - 1;
    *i1 = *i0 < in - 1 ? *i0 + 1 : *i0;
    *l = src - (float)*i0;
}

#endif
