/* internal.h: what the MPI files of dist/ share (not installed). */
#ifndef FR_DIST_INTERNAL_H
#define FR_DIST_INTERNAL_H

#include <mpi.h>
#include <pthread.h>

#include "../cuda/fr_cuda.h"
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

/* The time limit on waits for the other processes (watchdog.c). */
typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool running, stop;
    double timeout;     /* seconds; 0: none */
    const char *what;   /* the wait in progress, NULL when none */
    double since;       /* when it began (CLOCK_REALTIME seconds) */
    unsigned long gen;  /* bumped at every begin and end */
} fr_dist_watchdog;

struct fr_dist {
    int rank, world;
    MPI_Comm grads, ctl, bn; /* duplicates of MPI_COMM_WORLD: one per kind of traffic */
    fr_cuda_nccl *nccl;      /* CUDA models: gradients, BN sums, flags, broadcasts */
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
    fr_dist_watchdog wd;
};

/* OR of *flag over processes. */
fr_status fr_dist_any(fr_dist *d, bool *flag);
/* tensor/ops.h's fr_bn_sum_fn over d->bn (ctx: the fr_dist). */
fr_status fr_dist_bn_sum(double *values, int n, void *ctx);

/* MPI's message for code, for errors. */
const char *fr_dist_mpi_error(int code, char *buf, int len);

/* For a CUDA model: d->nccl, a communicator over the same ranks, its unique
 * id broadcast from rank 0 over MPI; every rank first learns whether all
 * can take part, so none waits in NCCL's set-up for one that cannot. */
fr_status fr_dist_nccl_connect(fr_dist *d);

/* watchdog.c: started by fr_dist_init, stopped by fr_dist_free; every
 * blocking wait on other processes sits between begin and end. */
void fr_dist_watchdog_start(fr_dist *d);
void fr_dist_watchdog_stop(fr_dist *d);
void fr_dist_wait_begin(fr_dist *d, const char *what);
void fr_dist_wait_end(fr_dist *d);

#endif
