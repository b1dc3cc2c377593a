/* cpu/simd.h: attributes and thresholds the CPU kernels' vector loops share. Internal. */
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

/* Batch norm's loops (cpu/batchnorm.c over a channel's plane, cpu/layout.c
 * over a pixel's channels) live in small functions built three times, for
 * AVX-512F, AVX2 and the portable baseline, the copy picked at load time by
 * the CPU's features (as cpu/gemm.c's kernel): the baseline's SSE2 has two
 * double lanes, AVX2 four, AVX-512 eight, and the double sums and the
 * f32 <-> f64 conversions are most of the work. The AVX-512 copy took a
 * one-thread DenseNet-BC-100 b64 plain step down by about 3% (BN's backward
 * 10-15%: bench/RESULTS.md, issue 24, dn24). FR_SELECT_BLEND: the leaky
 * ReLU's selects become blends. */
#define FR_BN_VEC __attribute__((target_clones("avx512f", "avx2", "default"))) FR_SELECT_BLEND
/* Below this many elements in total, batch norm's loops run on one thread. */
#define FR_BN_PAR_MIN 32768

#endif
