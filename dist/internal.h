/* internal.h: what the MPI files of dist/ share (not installed). */
#ifndef FR_DIST_INTERNAL_H
#define FR_DIST_INTERNAL_H

#include <mpi.h>

#include "dist.h"

/* A run of parameters whose gradients are all-reduced together. */
typedef struct {
    int first, count;   /* entries order[first .. first + count) */
    size_t numel;
    float *buf;         // (numel) on the parameters' device, FR_TAG_GRAD
    int pending;        /* parameters not yet final in this step */
    bool started;
    bool early;         /* started during backward */
    MPI_Request req;    /* CPU: the MPI_Iallreduce */
} fr_bucket;

typedef struct fr_nccl fr_nccl;

struct fr_dist {
    int rank, world;
    MPI_Comm grads, ctl, bn; /* duplicates of MPI_COMM_WORLD: one per kind of traffic */
    fr_nccl *nccl;           /* CUDA models */
    /* the attached model */
    fr_model *model;
    fr_dist_options opt;
    fr_grad_sync sync;
    fr_device dev;
    int n_buckets;
    fr_bucket *buckets;
    int n_order;
    int *order;              /* registry indices of the parameters, reverse registry order */
    int *bucket_of;          /* per registry entry: its bucket, -1 for buffers */
    size_t *offset;          /* per registry entry: elements into its bucket's buffer */
    bool *ready;             /* per registry entry: final in this step */
    bool *had_grad;          /* per registry entry: had a gradient when it became final */
    int last_hit;            /* where the last ready parameter was found in the registry */
    bool armed;              /* in the backward of a step's last micro-batch */
    fr_dist_stats stats;
    size_t early_bytes, all_bytes;
};

/* OR of *flag over processes. */
fr_status fr_dist_any(fr_dist *d, bool *flag);
/* tensor/ops.h's fr_bn_sum_fn over d->bn (ctx: the fr_dist). */
fr_status fr_dist_bn_sum(double *values, int n, void *ctx);

/* MPI's message for code, for errors. */
const char *fr_dist_mpi_error(int code, char *buf, int len);

/* ---- NCCL (dist/nccl.c), for CUDA models ---- */
#ifdef FR_HAVE_NCCL
/* One communicator over MPI_COMM_WORLD's ranks (the unique id broadcast from
 * rank 0 through `comm`) and a non-blocking side stream. */
fr_status fr_nccl_new(fr_nccl **out, MPI_Comm comm, int rank, int world);
void fr_nccl_free(fr_nccl *n);
/* Sums buf (count floats, device) over ranks on the side stream, after the
 * work queued so far on the main stream (which wrote buf). */
fr_status fr_nccl_allreduce_start(fr_nccl *n, float *buf, size_t count);
/* Makes the main stream wait for every all-reduce started; the host does
 * not wait. */
fr_status fr_nccl_wait(fr_nccl *n);
/* cudaSetDevice(local_rank % devices). */
fr_status fr_nccl_select_device(int local_rank);
#else
static inline fr_status fr_no_nccl(void) {
    return fr_error(FR_ERR_DEVICE, "dist: this frugal was built without NCCL (nccl.h not found), so "
                    "CUDA models cannot train data-parallel; rebuild with the CUDA toolkit's NCCL");
}
static inline fr_status fr_nccl_new(fr_nccl **out, MPI_Comm comm, int rank, int world) {
    (void)out, (void)comm, (void)rank, (void)world;
    return fr_no_nccl();
}
static inline void fr_nccl_free(fr_nccl *n) { (void)n; }
static inline fr_status fr_nccl_allreduce_start(fr_nccl *n, float *buf, size_t count) {
    (void)n, (void)buf, (void)count;
    return fr_no_nccl();
}
static inline fr_status fr_nccl_wait(fr_nccl *n) {
    (void)n;
    return fr_no_nccl();
}
static inline fr_status fr_nccl_select_device(int local_rank) {
    (void)local_rank;
    return FR_OK;
}
#endif

#endif
