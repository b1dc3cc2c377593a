/* nccl.cu: the NCCL communicator of data-parallel training and its
 * collectives (cuda/fr_cuda.h). Built only when the toolkit has nccl.h.
 *
 * Collectives run on a non-blocking side stream, so a gradient bucket's
 * all-reduce overlaps the kernels of backward that the main (legacy
 * default) stream still has queued: an event recorded on the main stream
 * when a collective starts orders it after the copy that filled its buffer,
 * and an event recorded on the side stream at fr_cuda_nccl_wait makes the
 * main stream wait before anything reads the results. The host never blocks
 * on communication except in fr_cuda_nccl_free. One communicator, one side
 * stream: collectives run in the order they were issued, which is the same
 * on every rank (dist/ddp.c issues them in graph order). */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static_assert(NCCL_UNIQUE_ID_BYTES == FR_CUDA_NCCL_ID_BYTES, "fr_cuda.h: FR_CUDA_NCCL_ID_BYTES");

struct fr_cuda_nccl {
    ncclComm_t comm;
    cudaStream_t side;
    cudaEvent_t queued, done; /* main stream -> side stream, side -> main */
};

#define FR_NCCL_CHECK(call)                                                              \
    do {                                                                                 \
        ncclResult_t fr_nccl_r_ = (call);                                                \
        if (fr_nccl_r_ != ncclSuccess)                                                   \
            return fr_error(FR_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,     \
                            ncclGetErrorString(fr_nccl_r_));                             \
    } while (0)

extern "C" fr_status fr_cuda_nccl_unique_id(unsigned char id[FR_CUDA_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    FR_NCCL_CHECK(ncclGetUniqueId(&u));
    memcpy(id, u.internal, sizeof u.internal);
    return FR_OK;
}

/* The stream and events of n (comm not yet made). */
static fr_status make_stream(fr_cuda_nccl *n) {
    FR_CUDA_CHECK(cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking));
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&n->queued, cudaEventDisableTiming));
    FR_CUDA_CHECK(cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming));
    return FR_OK;
}

extern "C" fr_status fr_cuda_nccl_new(fr_cuda_nccl **out, const unsigned char id[FR_CUDA_NCCL_ID_BYTES],
                                      int rank, int world) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return fr_error(FR_ERR_ARG, "nccl: rank %d of %d", rank, world);
    fr_cuda_nccl *n = (fr_cuda_nccl *)calloc(1, sizeof *n);
    if (!n)
        return fr_error(FR_ERR_OOM, "nccl: out of host memory");
    ncclUniqueId u;
    memcpy(u.internal, id, sizeof u.internal);
    fr_status st = make_stream(n);
    if (st == FR_OK) {
        ncclResult_t r = ncclCommInitRank(&n->comm, world, u, rank);
        if (r != ncclSuccess) {
            n->comm = NULL;
            st = fr_error(FR_ERR_CUDA, "nccl: ncclCommInitRank (rank %d of %d): %s%s", rank, world,
                          ncclGetErrorString(r),
                          r == ncclInvalidUsage ? " (two processes on one GPU? NCCL needs one GPU per process)"
                                                : "");
        }
    }
    if (st != FR_OK) {
        fr_cuda_nccl_free(n);
        return st;
    }
    *out = n;
    return FR_OK;
}

extern "C" void fr_cuda_nccl_free(fr_cuda_nccl *n) {
    if (!n)
        return;
    /* nothing can be reported from here; the runtime's error is cleared */
    if (n->side && cudaStreamSynchronize(n->side) != cudaSuccess)
        (void)cudaGetLastError();
    if (n->comm)
        (void)ncclCommDestroy(n->comm);
    if (n->queued)
        (void)cudaEventDestroy(n->queued);
    if (n->done)
        (void)cudaEventDestroy(n->done);
    if (n->side)
        (void)cudaStreamDestroy(n->side);
    (void)cudaGetLastError();
    free(n);
}

/* The side stream waits for what the main stream has queued so far. */
static fr_status after_main_stream(fr_cuda_nccl *n) {
    FR_CUDA_CHECK(cudaEventRecord(n->queued, 0));
    FR_CUDA_CHECK(cudaStreamWaitEvent(n->side, n->queued, 0));
    return FR_OK;
}

extern "C" fr_status fr_cuda_nccl_sum_start(fr_cuda_nccl *n, void *buf, size_t count, bool f64) {
    FR_TRY(after_main_stream(n));
    FR_NCCL_CHECK(ncclAllReduce(buf, buf, count, f64 ? ncclFloat64 : ncclFloat32, ncclSum, n->comm, n->side));
    return FR_OK;
}

extern "C" fr_status fr_cuda_nccl_broadcast_start(fr_cuda_nccl *n, void *const *bufs, const size_t *bytes,
                                                  int count, int root) {
    FR_TRY(after_main_stream(n));
    FR_NCCL_CHECK(ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < count && r == ncclSuccess; i++)
        r = ncclBroadcast(bufs[i], bufs[i], bytes[i], ncclUint8, root, n->comm, n->side);
    /* the group is closed whatever happened, so the communicator stays usable */
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess)
        return fr_error(FR_ERR_CUDA, "nccl: ncclBroadcast: %s", ncclGetErrorString(r));
    FR_NCCL_CHECK(end);
    return FR_OK;
}

extern "C" fr_status fr_cuda_nccl_wait(fr_cuda_nccl *n) {
    FR_CUDA_CHECK(cudaEventRecord(n->done, n->side));
    FR_CUDA_CHECK(cudaStreamWaitEvent(0, n->done, 0));
    return FR_OK;
}
