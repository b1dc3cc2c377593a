/* nccl.c: gradient all-reduce of CUDA models on NCCL (dist/internal.h).
 *
 * The communicator is bootstrapped through MPI: rank 0 makes the unique id
 * and broadcasts it. All-reduces run on a non-blocking side stream, so they
 * overlap the kernels of backward that the main (legacy default) stream
 * still has queued: an event recorded on the main stream after a bucket's
 * copy-in orders the all-reduce after it, and one event recorded on the side
 * stream after the last all-reduce makes the main stream wait before the
 * gradients are written back. The host never blocks on communication. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include "internal.h"

struct fr_nccl {
    ncclComm_t comm;
    cudaStream_t side;
    cudaEvent_t ready, done;
};

static fr_status nccl_fail(const char *what, ncclResult_t r) {
    return fr_error(FR_ERR_CUDA, "dist: %s failed: %s", what, ncclGetErrorString(r));
}

static fr_status cuda_fail(const char *what, cudaError_t e) {
    return fr_error(FR_ERR_CUDA, "dist: %s failed: %s", what, cudaGetErrorString(e));
}

fr_status fr_nccl_select_device(int local_rank) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return fr_error(FR_ERR_DEVICE, "dist: no CUDA device for local rank %d", local_rank);
    e = cudaSetDevice(local_rank % n);
    return e == cudaSuccess ? FR_OK : cuda_fail("cudaSetDevice", e);
}

fr_status fr_nccl_new(fr_nccl **out, MPI_Comm comm, int rank, int world) {
    *out = NULL;
    fr_nccl *n = calloc(1, sizeof *n);
    if (!n)
        return fr_error(FR_ERR_OOM, "dist: out of memory");
    ncclUniqueId id = {{0}};
    ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    /* Every rank enters the broadcast, also when rank 0 failed: it sends the
     * verdict with the id, so nobody waits for a communicator that never comes. */
    struct {
        int ok;
        ncclUniqueId id;
    } msg = {.ok = r == ncclSuccess, .id = id};
    if (MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, comm) != MPI_SUCCESS) {
        free(n);
        return fr_error(FR_ERR_IO, "dist: MPI_Bcast of the NCCL id failed");
    }
    if (!msg.ok) {
        free(n);
        return rank == 0 ? nccl_fail("ncclGetUniqueId", r)
                         : fr_error(FR_ERR_CUDA, "dist: rank 0 could not make an NCCL id");
    }
    if ((r = ncclCommInitRank(&n->comm, world, msg.id, rank)) != ncclSuccess) {
        free(n);
        return nccl_fail("ncclCommInitRank", r);
    }
    cudaError_t e = cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&n->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        fr_nccl_free(n);
        return cuda_fail("creating the communication stream", e);
    }
    *out = n;
    return FR_OK;
}

void fr_nccl_free(fr_nccl *n) {
    if (!n)
        return;
    if (n->side)
        (void)cudaStreamSynchronize(n->side);
    if (n->comm)
        (void)ncclCommDestroy(n->comm);
    if (n->ready)
        (void)cudaEventDestroy(n->ready);
    if (n->done)
        (void)cudaEventDestroy(n->done);
    if (n->side)
        (void)cudaStreamDestroy(n->side);
    free(n);
}

fr_status fr_nccl_allreduce_start(fr_nccl *n, float *buf, size_t count) {
    /* the main stream is the legacy default stream (cuda/fr_cuda.h) */
    cudaError_t e = cudaEventRecord(n->ready, 0);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(n->side, n->ready, 0);
    if (e != cudaSuccess)
        return cuda_fail("ordering the all-reduce after backward", e);
    ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, n->side);
    return r == ncclSuccess ? FR_OK : nccl_fail("ncclAllReduce", r);
}

fr_status fr_nccl_wait(fr_nccl *n) {
    cudaError_t e = cudaEventRecord(n->done, n->side);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(0, n->done, 0);
    return e == cudaSuccess ? FR_OK : cuda_fail("waiting for the all-reduces", e);
}
