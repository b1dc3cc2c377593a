/* cpu/isa.h: the instruction sets of the CPU frugal runs on, detected once
 * (CPUID, through __builtin_cpu_supports), and the ISA class the CPU kernels
 * choose by (docs/ARCHITECTURE.md, "CPU convolution and GEMM"). Internal to
 * cpu/ and to the programs that print it. */
#ifndef FR_CPU_ISA_H
#define FR_CPU_ISA_H

#include <stdbool.h>
#include <stddef.h>

#include "../tensor/fr_base.h"

/* The classes the conv dispatch tells apart, in increasing order: a class
 * implies every one below it. */
typedef enum {
    FR_ISA_BASELINE = 0, /* x86-64 SSE2 (or not x86): im2col + GEMM, oneDNN's SSE4.1 kernels */
    FR_ISA_AVX2,         /* AVX2 + FMA: the shifted-plane kernels, oneDNN's AVX2 kernels */
    FR_ISA_AVX512,       /* AVX-512 F, BW, VL (+ DQ, CD): oneDNN's avx512_core kernels */
    FR_ISA_COUNT
} fr_cpu_isa;

/* What CPUID reports, whatever FR_CPU_ISA says. */
typedef struct {
    bool avx2, fma, avx512f, avx512bw, avx512vl, avx512dq, avx512cd, avx512_bf16, avx512_fp16, amx;
    /* not an instruction set: an AMD CPU of family 19h with AVX-512 (Zen 4),
     * where oneDNN's bf16 kernels measured faster than staged f32 and an
     * Intel Xeon's without AMX slower (cpu/conv_bf16.c) */
    bool amd_zen4;
} fr_cpu_features;

const fr_cpu_features *fr_cpu_features_detected(void);

/* The machine's class (from the features). */
fr_cpu_isa fr_cpu_isa_detected(void);

/* The class the kernels use: the machine's, or the lower one named by the
 * environment variable FR_CPU_ISA (baseline, avx2, avx512), read on the
 * first call. FR_ERR_ARG naming FR_CPU_ISA when it names no class or a
 * class this CPU lacks: a forced class is honoured exactly or refused. */
fr_status fr_cpu_isa_get(fr_cpu_isa *out);

/* "baseline", "avx2", "avx512"; NULL for no class. */
const char *fr_cpu_isa_name(fr_cpu_isa isa);

/* One line for logs: the class in use, whether forced, and the features
 * beyond it the machine has (e.g. "avx512 (+avx512_bf16 +avx512_fp16
 * +amx)"). Writes at most `size` bytes; on FR_CPU_ISA's error, the error. */
void fr_cpu_isa_describe(char *buf, size_t size);

/* True when bf16 dot products run in hardware (AVX512_BF16) and the class
 * in use is avx512: what frugal's bf16 compute would need. */
bool fr_cpu_isa_has_bf16(void);

#endif
