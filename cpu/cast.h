/* cpu/cast.h: the CPU's half <-> f32 conversions on one run of elements,
 * for the CPU code that stages half operands itself (tensor/staging.c's
 * elementwise tiles). Internal to the library. */
#ifndef FR_CPU_CAST_H
#define FR_CPU_CAST_H

#include <stddef.h>

#include "../tensor/fr_base.h"

/* f16 / bf16 -> f32 (exact) or f32 -> f16 / bf16 (round to nearest even),
 * exactly as the cast kernel (fr_cpu_cast), on the calling thread: no
 * parallel region, so it may run inside one. One of the dtypes is f32, the
 * other f16 or bf16. */
void fr_cpu_cast_half_run(void *dst, fr_dtype dst_type, const void *src, fr_dtype src_type,
                          size_t n);

/* How many elements the conversions take at a time under the class in use
 * (FR_CPU_ISA honoured): 16 on avx512, 8 on avx2 (with F16C), 1 below (the
 * scalar definitions). For the tests, which force each class. */
int fr_cpu_cast_lanes(void);

#endif
