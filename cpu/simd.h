/* cpu/simd.h: an attribute the CPU kernels' vector loops share. Internal. */
#ifndef FR_CPU_SIMD_H
#define FR_CPU_SIMD_H

/* For a loop whose select has a product in one arm (leaky ReLU:
 * `v > 0 ? v : v * slope`). Under GCC's default -ftrapping-math the product
 * stays inside a branch, lest it trap, and the loop runs scalar with a
 * branch per element (10-25% of an abn training step); no-trapping-math
 * lets it become a blend. No value changes: frugal runs with floating-point
 * traps off. Clang already if-converts these selects (its default ignores
 * FP exceptions) and has no `optimize` attribute. */
#if defined(__GNUC__) && !defined(__clang__)
#define FR_SELECT_BLEND __attribute__((optimize("no-trapping-math")))
#else
#define FR_SELECT_BLEND
#endif

#endif
