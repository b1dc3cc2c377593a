/* pad_math.h: where padding reads from, shared by the CPU and CUDA kernels
 * (cpu/pad.c, cuda/pad.cu) so both pad and unpad with the same indices.
 * Internal: not installed. */
#ifndef FR_PAD_MATH_H
#define FR_PAD_MATH_H

#include "shapes.h"

#ifdef __CUDACC__
#define FR_PAD_FN __host__ __device__ static inline
#else
#define FR_PAD_FN static inline
#endif

/* The input index output index o (of before + n + after) reads, or -1 for
 * a zero. Reflect mirrors about the edge without repeating it (PyTorch's
 * ReflectionPad), which needs before, after < n. */
FR_PAD_FN int fr_pad_source(int o, int n, int before, fr_pad_mode mode) {
    int i = o - before;
    if (i >= 0 && i < n)
        return i;
    if (mode == FR_PAD_ZERO)
        return -1;
    return i < 0 ? -i : 2 * (n - 1) - i;
}

/* The output indices that read input index i, at most three (itself, its
 * mirror before and its mirror after), into out; returns how many. */
FR_PAD_FN int fr_pad_readers(int i, int n, int before, int after, fr_pad_mode mode, int *out) {
    int k = 0;
    out[k++] = i + before;
    if (mode == FR_PAD_REFLECT) {
        if (i >= 1 && i <= before)
            out[k++] = before - i;
        if (i <= n - 2 && i >= n - 1 - after)
            out[k++] = before + 2 * (n - 1) - i;
    }
    return k;
}

#endif
