/* cpu/compress.h: the compress and sign kernels of kernels.def on a named ISA path,
 * so tests can hold the AVX2 and AVX-512 paths to the scalar reference.
 * Internal to cpu/ and tests. An isa above the machine's is lowered to it. */
#ifndef FR_CPU_COMPRESS_H
#define FR_CPU_COMPRESS_H

#include "../tensor/shapes.h" /* fr_act */
#include "isa.h"

/* The path an `isa` request runs on: the request, lowered to the machine's
 * class. */
static inline fr_cpu_isa fr_cpu_compress_usable(fr_cpu_isa isa) {
    fr_cpu_isa have = fr_cpu_isa_detected();
    return isa > have ? have : isa;
}

fr_status fr_cpu_compress_pack_isa(fr_cpu_isa isa, uint8_t *packed, const float *x, int bits,
                                   uint64_t seed, size_t n);
fr_status fr_cpu_compress_unpack_isa(fr_cpu_isa isa, float *x, const uint8_t *packed, int bits,
                                     size_t n);
fr_status fr_cpu_sign_pack_isa(fr_cpu_isa isa, uint8_t *mask, const float *x, size_t n);
fr_status fr_cpu_sign_unpack_isa(fr_cpu_isa isa, float *y, const uint8_t *mask, size_t n);
fr_status fr_cpu_sign_act_backward_isa(fr_cpu_isa isa, float *dx, const float *dy,
                                       const uint8_t *mask, fr_act act, float slope, size_t n);

#endif
