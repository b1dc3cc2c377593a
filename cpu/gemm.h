/* cpu/gemm.h: which library runs fr_cpu_gemm_serial (tensor/kernels.h),
 * for tests and benchmarks. Internal to cpu/ and tests. */
#ifndef FR_CPU_GEMM_H
#define FR_CPU_GEMM_H

/* "onednn" (oneDNN's sgemm: the AVX-512 class with oneDNN built in),
 * "openblas" (other classes, with OpenBLAS) or "builtin" (neither); the
 * class is isa.h's, so FR_CPU_ISA=avx2 on an AVX-512 CPU gives
 * "openblas". docs/ARCHITECTURE.md, "CPU convolution and GEMM". */
const char *fr_cpu_gemm_serial_impl(void);

#endif
