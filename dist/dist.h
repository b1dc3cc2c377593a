/* dist.h: data-parallel training over processes and machines, on MPI (CPU
 * tensors) and NCCL (CUDA tensors, bootstrapped through MPI).
 *
 * Every process holds a whole replica of the model and trains on its own
 * shard of each global batch (data/loader.h: `shards`, `shard`). A step is
 * the step of the global batch:
 *  - fr_dist_attach broadcasts rank 0's parameters and buffers, so every
 *    replica starts the same, and hooks the model's training step
 *    (fr_model.grad_sync, called by fr_train_step);
 *  - gradients are grouped into buckets of about `bucket_bytes` (25 MiB on
 *    GPUs, as PyTorch's DDP, the first bucket 1 MiB, also as DDP; 0.05 MiB
 *    on the CPU, measured over TCP: docs/DISTRIBUTED.md), in reverse
 *    registry order, which is about the order backward finishes them. During
 *    the backward of a step's last micro-batch, the tape reports each
 *    parameter whose gradient is final (autograd.h: fr_set_grad_ready_hook);
 *    a bucket whose parameters are all final is copied into its buffer and
 *    its all-reduce (sum) is started at once (MPI_Iallreduce; ncclAllReduce
 *    on a side stream), so communication overlaps the rest of backward;
 *  - before the optimizer step every bucket is waited for and its sum,
 *    times 1 / world size, written back into the gradients. The optimizer
 *    then makes the same update on every process;
 *  - rank 0's BN running statistics are broadcast after every step, so all
 *    replicas hold the same buffers (evaluation and checkpoints agree);
 *  - with a loss scaler the found-inf flag is OR-ed over processes.
 *
 * Exactness: with per-process batch B and N processes, the gradient is the
 * mean of N per-process mean-loss gradients, which is what one process
 * computes for the global batch with accum N (micro-batch r = process r's
 * shard); batch norm then normalises per process as it does per
 * micro-batch. For N = 2 the sum of two numbers does not depend on order and
 * the 1/2 is exact, so the two agree bit for bit (tests/test_dist.c).
 *
 * Synchronised batch norm (`sync_bn`): batch statistics (forward) and the
 * per-channel sums of backward are summed over processes
 * (tensor/ops.h: fr_batch_norm_set_sync), so BN sees the global batch; every
 * strategy (recompute, abn, checkpoint) goes through those two ops.
 *
 * Errors: MPI's default handler aborts the whole job on a communication
 * error, and mpirun ends every process when one dies. A user-caused error on
 * one process must not leave the others waiting in a collective: programs
 * print it and call fr_dist_abort (examples/train does). The library itself
 * never aborts.
 *
 * Built only when MPI is found (Makefile: mpicc --showme); without it every
 * function below fails with FR_ERR_ARG "frugal was built without MPI", and
 * fr_dist_built() is false. CUDA models go through NCCL, which lives in the
 * CUDA backend (cuda/fr_cuda.h: fr_cuda_nccl_*; built when the toolkit has
 * nccl.h): their gradient buckets, their synchronised-BN sums and the
 * found-inf flag are all-reduced, and their parameters and buffers
 * broadcast, by NCCL; CPU tensors (a CUDA model's num_batches_tracked, the
 * programs' fr_dist_sum) stay on MPI. A backend without NCCL, or no GPU,
 * makes fr_dist_select_gpu and fr_dist_attach of a CUDA model fail saying
 * which. */
#ifndef FR_DIST_H
#define FR_DIST_H

#include "../nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_dist fr_dist;

typedef struct {
    size_t bucket_bytes;       /* 0: 25 MiB for a CUDA model, 0.05 MiB for a CPU model */
    size_t first_bucket_bytes; /* 0: 1 MiB, or bucket_bytes when smaller */
    bool sync_bn;              /* synchronised batch norm */
    bool no_overlap;           /* start every all-reduce after backward (benchmarks) */
} fr_dist_options;

/* What the all-reduces of the steps since attach cost. */
typedef struct {
    int64_t steps;
    int buckets;               /* of the attached model */
    size_t bytes;              /* gradient bytes all-reduced per step */
    double wait_seconds;       /* spent waiting for all-reduces before the optimizer step */
    double started_early;      /* share of bucket bytes started during backward */
    /* The last step, as MPI_Wtime on this process: when its backward ended
     * (the wait began), and when its all-reduces were done (the wait ended;
     * on CUDA the host does not wait for NCCL, so both are about equal).
     * On one machine every process reads the same clock, so the latest
     * backward end and the latest all-reduce end over processes say how
     * long communication held up the step (bench/bench_dist.c). */
    double backward_end, reduced_end;
} fr_dist_stats;

/* Whether this build has MPI. */
bool fr_dist_built(void);
/* Whether the process was started by an MPI launcher (mpirun / srun set
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK); *world gets the size the
 * launcher announced (1 when none). */
bool fr_dist_launched(int *world);

/* Initialises MPI (once per process; MPI_THREAD_FUNNELED: only the thread
 * that calls these functions talks to MPI). */
fr_status fr_dist_init(fr_dist **out);
/* Finalises MPI. NULL-safe. Detach models first. */
void fr_dist_free(fr_dist *d);
int fr_dist_rank(const fr_dist *d);
int fr_dist_world(const fr_dist *d);
/* For CUDA training: checks that NCCL can run (the backend has it, there is
 * a GPU), then selects GPU (local rank mod the GPUs of the machine). Call
 * before any CUDA work. */
fr_status fr_dist_select_gpu(fr_dist *d);

/* Makes m a replica: broadcasts rank 0's registry (parameters and buffers),
 * builds the buckets on the parameters' device and sets m->grad_sync. One
 * model per fr_dist. */
fr_status fr_dist_attach(fr_dist *d, fr_model *m, const fr_dist_options *o);
/* Unhooks the model and frees the buckets. */
void fr_dist_detach(fr_dist *d);
fr_dist_stats fr_dist_get_stats(const fr_dist *d);

/* Sums n doubles over processes, in place. */
fr_status fr_dist_sum(fr_dist *d, double *values, int n);
/* Rank `root`'s status (and message) on every process: FR_OK everywhere
 * when root succeeded, else root's error on every process (e.g. after rank 0
 * wrote a checkpoint the others waited for). */
fr_status fr_dist_share_status(fr_dist *d, int root, fr_status local);
fr_status fr_dist_barrier(fr_dist *d);
/* A limit on every wait for the other processes (collectives, the gradient
 * all-reduces): a wait longer than `seconds` ends this process with exit code
 * FR_DIST_TIMEOUT_EXIT and a message naming the wait, the rank and the
 * machine, since MPI alone waits for ever on a peer whose machine is cut off
 * (docs/DISTRIBUTED.md, "Faults"). 0 turns it off; fr_dist_init sets
 * FR_DIST_DEFAULT_TIMEOUT. */
#define FR_DIST_DEFAULT_TIMEOUT 1800.0
#define FR_DIST_TIMEOUT_EXIT 75
fr_status fr_dist_set_timeout(fr_dist *d, double seconds);
double fr_dist_timeout(const fr_dist *d);
/* Ends every process of the job with `code` (MPI_Abort). For programs. */
void fr_dist_abort(fr_dist *d, int code);

#ifdef __cplusplus
}
#endif
#endif
