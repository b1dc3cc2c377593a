/* fr_cuda.h: the CUDA backend's entry points, internal to frugal.
 *
 * cuda/ *.cu build into their own shared object, libfrugal_cuda.so, which
 * exports every name declared here; the core (tensor/cuda_backend.c) opens
 * it at run time and looks each one up by name (see tensor/cuda.h for what a
 * program sees). The device functions of tensor/cuda.h have the same names
 * and signatures on both sides: the core's forward to the backend's (the
 * backend links with -Bsymbolic, so its own calls stay inside it).
 *
 * The backend calls back into the core (fr_error, the ledger's fr_mem_*),
 * resolved at dlopen() time from the process: from libfrugal.so, or from a
 * program linked with libfrugal.a and -rdynamic (--export-dynamic). */
#ifndef FR_CUDA_H
#define FR_CUDA_H

#include "../tensor/cuda.h"
#include "../tensor/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Caching allocator. *block_bytes receives the size of the block actually
 * held (>= nbytes). NULL + FR_ERR_OOM on failure. Only the ledger
 * (tensor/memory.c) calls these, so every byte is counted. */
void *fr_cuda_alloc(size_t nbytes, size_t *block_bytes);
void fr_cuda_free(void *ptr);

/* ---- exported by the backend only ---- */

/* Bumped when the entry points above or in tensor/cuda.h change; the
 * kernels are checked by their names and parameter lists. */
#define FR_CUDA_BACKEND_ABI 1
/* The backend's FR_CUDA_BACKEND_ABI, and every line of the kernels.def it
 * was built from as "name(params)\n": the core refuses a backend built from
 * another kernels.def. */
extern const int fr_cuda_backend_abi;
extern const char fr_cuda_backend_kernels[];
/* The number of usable GPUs; when 0, why (the CUDA runtime's message) in
 * why[0..len). */
int fr_cuda_backend_probe(char *why, size_t len);

#define FR_KERNEL(name, params) fr_status fr_cuda_##name params;
#include "../tensor/kernels.def"
#undef FR_KERNEL

#ifdef __cplusplus
}
#endif
#endif
