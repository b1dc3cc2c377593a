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

#include "../tensor/cache_policy.h"
#include "../tensor/cuda.h"
#include "../tensor/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Caching allocator. *block_bytes receives the size of the block actually
 * held (>= nbytes). `peak`: the ledger's peak since its last reset,
 * counting this request, which bounds the cache (FR_CACHE_NO_LEDGER: no
 * bound); `limit`: the cap on reserved bytes (0: none); the rule is
 * tensor/cache_policy.h's. NULL + FR_ERR_OOM on failure. Only the ledger
 * (tensor/memory.c) calls these, so every byte is counted (and the cuBLAS
 * workspace, with FR_CACHE_NO_LEDGER). */
void *fr_cuda_alloc(size_t nbytes, size_t peak, size_t limit, size_t *block_bytes);
void fr_cuda_free(void *ptr);

/* The GPU this process uses from now on: local_rank mod the GPUs of the
 * machine (data parallelism, one process per GPU: dist/). Call before any
 * CUDA work; *chosen gets the device index. */
fr_status fr_cuda_select_device(int local_rank, int *chosen);

/* ---- NCCL (cuda/nccl.cu), for data parallelism (dist/) ----
 *
 * Built into the backend when the CUDA toolkit has nccl.h; the core looks
 * these names up but does not require them, and fr_cuda_backend_has_nccl()
 * says whether they were found. The core's functions of the same names fail
 * with FR_ERR_DEVICE saying why (no usable GPU, or a backend built without
 * NCCL) when the backend's cannot run. The backend never talks to MPI: the
 * caller moves the unique id from rank 0 to the others (dist/ddp.c, over
 * MPI) and keeps every rank's calls in the same order.
 *
 * All collectives run on the communicator's own non-blocking side stream.
 * A *_start call orders its collective after the work queued so far on the
 * main stream (the legacy default stream, which wrote the buffers); the
 * host does not wait. fr_cuda_nccl_wait makes the main stream wait for
 * every collective started so far, so kernels and copies queued after it
 * see the results; the host still does not wait. */
typedef struct fr_cuda_nccl fr_cuda_nccl;
#define FR_CUDA_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES, checked in nccl.cu */

/* Whether the backend that was opened has the NCCL entry points (false when
 * there is no backend). Does not need a GPU. Core only. */
bool fr_cuda_backend_has_nccl(void);
/* FR_OK when the NCCL entry points can run (a backend with NCCL and a GPU),
 * else FR_ERR_DEVICE saying which is missing, prefixed by `what`. Core only. */
fr_status fr_cuda_nccl_ready(const char *what);
/* Rank 0's part of the bootstrap: a new unique id for the communicator. */
fr_status fr_cuda_nccl_unique_id(unsigned char id[FR_CUDA_NCCL_ID_BYTES]);
/* Every rank, with rank 0's id: the communicator of `world` ranks on the
 * current device, and its side stream. Collective: every rank must call. */
fr_status fr_cuda_nccl_new(fr_cuda_nccl **out, const unsigned char id[FR_CUDA_NCCL_ID_BYTES], int rank,
                           int world);
/* Waits for the side stream, then destroys. NULL-safe. */
void fr_cuda_nccl_free(fr_cuda_nccl *n);
/* Sums buf (count f32, or f64 when `f64`; device memory) over the ranks,
 * in place. */
fr_status fr_cuda_nccl_sum_start(fr_cuda_nccl *n, void *buf, size_t count, bool f64);
/* Rank root's bytes of bufs[i] (bytes[i] each; device memory) on every
 * rank, in place: `count` broadcasts in one NCCL group. */
fr_status fr_cuda_nccl_broadcast_start(fr_cuda_nccl *n, void *const *bufs, const size_t *bytes, int count,
                                       int root);
fr_status fr_cuda_nccl_wait(fr_cuda_nccl *n);

/* ---- exported by the backend only ---- */

/* Bumped when the entry points above or in tensor/cuda.h change; the
 * kernels are checked by their names and parameter lists. */
#define FR_CUDA_BACKEND_ABI 2
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
