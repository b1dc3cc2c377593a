/* broadcast_math.h: the arithmetic of the broadcasting binary ops, shared
 * by cpu/broadcast.c and cuda/broadcast.cu so both compute the same bits.
 * Internal: not installed. */
#ifndef FR_BROADCAST_MATH_H
#define FR_BROADCAST_MATH_H

#include "shapes.h"

#ifdef __CUDACC__
#define FR_BCAST_FN __host__ __device__ static inline
#else
#define FR_BCAST_FN static inline
#endif

/* op(a, b); FR_BINARY_FIRST is a (expanding a) */
FR_BCAST_FN float fr_binary_apply(fr_binary_op op, float a, float b) {
    switch (op) {
    case FR_BINARY_ADD: return a + b;
    case FR_BINARY_SUB: return a - b;
    case FR_BINARY_MUL: return a * b;
    case FR_BINARY_DIV: return a / b;
    case FR_BINARY_EQ: return a == b ? 1.0f : 0.0f;
    default: return a;
    }
}

/* the larger of a and b, a NaN in either winning (PyTorch's max) */
FR_BCAST_FN float fr_max_nan(float a, float b) {
    return a != a || b != b ? a + b : a > b ? a : b;
}

#endif
