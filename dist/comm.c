/* comm.c: the MPI process group and its small collectives (see dist.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tensor/memory.h"
#include "internal.h"

bool fr_dist_built(void) { return true; }

const char *fr_dist_mpi_error(int code, char *buf, int len) {
    int n = 0;
    if (MPI_Error_string(code, buf, &n) != MPI_SUCCESS || n <= 0)
        snprintf(buf, (size_t)len, "MPI error %d", code);
    return buf;
}

/* `call` waits on the other processes: the watchdog bounds it. */
#define MPI_TRY(call, what)                                                                  \
    do {                                                                                     \
        fr_dist_wait_begin(d, what);                                                         \
        int rc_ = (call);                                                                    \
        fr_dist_wait_end(d);                                                                 \
        if (rc_ != MPI_SUCCESS) {                                                            \
            char msg_[MPI_MAX_ERROR_STRING];                                                 \
            return fr_error(FR_ERR_IO, "dist: %s failed: %s", what,                          \
                            fr_dist_mpi_error(rc_, msg_, (int)sizeof msg_));                 \
        }                                                                                    \
    } while (0)

fr_status fr_dist_init(fr_dist **out) {
    *out = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            return fr_error(FR_ERR_IO, "dist: MPI_Init_thread failed: %s",
                            fr_dist_mpi_error(rc, msg, (int)sizeof msg));
        }
    }
    fr_dist *d = calloc(1, sizeof *d);
    if (!d)
        return fr_error(FR_ERR_OOM, "dist: out of memory");
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->world);
    /* Separate communicators keep the gradient all-reduces in flight apart
     * from the control messages and the BN sums issued meanwhile. */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &d->grads) != MPI_SUCCESS ||
        MPI_Comm_dup(MPI_COMM_WORLD, &d->ctl) != MPI_SUCCESS ||
        MPI_Comm_dup(MPI_COMM_WORLD, &d->bn) != MPI_SUCCESS) {
        free(d);
        return fr_error(FR_ERR_IO, "dist: MPI_Comm_dup failed");
    }
    fr_dist_watchdog_start(d);
    *out = d;
    return FR_OK;
}

void fr_dist_free(fr_dist *d) {
    if (!d)
        return;
    fr_dist_detach(d);
    MPI_Comm_free(&d->grads);
    MPI_Comm_free(&d->ctl);
    MPI_Comm_free(&d->bn);
    fr_dist_watchdog_stop(d);
    free(d);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}

int fr_dist_rank(const fr_dist *d) { return d ? d->rank : 0; }
int fr_dist_world(const fr_dist *d) { return d ? d->world : 1; }

/* GPUs go through NCCL, which this checks first: a build without it stops
 * here, before the model is made, with a message that says so. */
fr_status fr_dist_select_gpu(fr_dist *d) {
    FR_TRY(fr_cuda_nccl_ready("dist: CUDA training across processes needs NCCL"));
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!v)
        v = getenv("MPI_LOCALRANKID");
    if (!v)
        v = getenv("SLURM_LOCALID");
    int chosen = 0;
    (void)d;
    return fr_cuda_select_device(v ? atoi(v) : 0, &chosen);
}

fr_status fr_dist_nccl_connect(fr_dist *d) {
    unsigned char id[FR_CUDA_NCCL_ID_BYTES] = {0};
    fr_status local = fr_cuda_nccl_ready("dist");
    if (local == FR_OK && d->rank == 0)
        local = fr_cuda_nccl_unique_id(id);
    int ok = local == FR_OK, all = 0;
    MPI_TRY(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, d->ctl), "MPI_Allreduce (NCCL readiness)");
    if (!all)
        return local != FR_OK ? local
                              : fr_error(FR_ERR_DEVICE, "dist: another process cannot use NCCL (its own "
                                         "message says why), so no process starts it");
    MPI_TRY(MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, d->ctl), "MPI_Bcast (NCCL id)");
    return fr_cuda_nccl_new(&d->nccl, id, d->rank, d->world);
}

/* values (host) summed over processes through NCCL: a device copy, the
 * all-reduce on the side stream, and back (the copy back waits for it). */
static fr_status nccl_sum_host(fr_dist *d, double *values, int n) {
    size_t bytes = (size_t)n * sizeof *values;
    double *dev = fr_mem_alloc(FR_CUDA, bytes, FR_TAG_WORKSPACE); // (n)
    if (!dev)
        return fr_last_status();
    fr_status st = fr_cuda_memcpy(dev, values, bytes, FR_COPY_H2D);
    if (st == FR_OK)
        st = fr_cuda_nccl_sum_start(d->nccl, dev, (size_t)n, true);
    if (st == FR_OK) {
        fr_dist_wait_begin(d, "NCCL wait (sum)");
        st = fr_cuda_nccl_wait(d->nccl);
        fr_dist_wait_end(d);
    }
    if (st == FR_OK)
        st = fr_cuda_memcpy(values, dev, bytes, FR_COPY_D2H);
    fr_mem_free(FR_CUDA, dev, bytes, FR_TAG_WORKSPACE);
    return st;
}

fr_status fr_dist_sum(fr_dist *d, double *values, int n) {
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, d->ctl), "MPI_Allreduce");
    return FR_OK;
}

/* The BN sums go on their own communicator (tensor/ops.h's hook), or on
 * NCCL for a CUDA model (in the order of its gradient all-reduces, which
 * every process issues alike). */
fr_status fr_dist_bn_sum(double *values, int n, void *ctx) {
    fr_dist *d = ctx;
    if (d->nccl)
        return nccl_sum_host(d, values, n);
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, d->bn), "MPI_Allreduce (batch norm)");
    return FR_OK;
}

fr_status fr_dist_any(fr_dist *d, bool *flag) {
    if (d->nccl) {
        double v = *flag;
        FR_TRY(nccl_sum_host(d, &v, 1));
        *flag = v > 0;
        return FR_OK;
    }
    int v = *flag;
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, d->ctl), "MPI_Allreduce (flag)");
    *flag = v != 0;
    return FR_OK;
}

fr_status fr_dist_share_status(fr_dist *d, int root, fr_status local) {
    struct {
        int status;
        char message[1024];
    } m = {.status = (int)local};
    if (d->rank == root && local != FR_OK)
        snprintf(m.message, sizeof m.message, "%s", fr_last_error());
    MPI_TRY(MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, root, d->ctl), "MPI_Bcast (status)");
    if (m.status == FR_OK)
        return FR_OK;
    m.message[sizeof m.message - 1] = 0;
    if (d->rank == root)
        return (fr_status)m.status;
    return fr_error((fr_status)m.status, "rank %d: %s", root, m.message);
}

fr_status fr_dist_barrier(fr_dist *d) {
    MPI_TRY(MPI_Barrier(d->ctl), "MPI_Barrier");
    return FR_OK;
}

void fr_dist_abort(fr_dist *d, int code) {
    (void)d;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}
