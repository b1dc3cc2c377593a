/* loader.h: mini-batches from a dataset, optionally prepared on a
 * background thread.
 *
 * Each epoch visits every image once, in a seeded Fisher-Yates order when
 * `shuffle` (else in dataset order); the last, smaller batch is dropped when
 * `drop_last`. Each image is augmented and normalised (augment.h) with an rng
 * seeded from (seed, epoch, position in the epoch), so a batch depends only
 * on the seed and its place, never on threading or timing: the batches are
 * the same with and without `prefetch`, and fr_loader_seek resumes a run
 * exactly.
 *
 * With `prefetch`, a thread builds the next batch while the caller works on
 * the current one (one batch ahead, so at most two batches exist beside the
 * dataset). The loader reads the dataset in place; the dataset must outlive
 * it. Batches are returned on `device`, tagged FR_TAG_DATA. On CUDA they are
 * built in two page-locked staging buffers (2 x batch_size images, pinned
 * at fr_loader_new; host memory outside the ledger) and copied
 * asynchronously on the one stream, so the copy overlaps the host's work and
 * the caller's kernels order after it; when memory cannot be pinned they are
 * built as CPU tensors and moved with fr_to_device. The batches are the same
 * either way.
 *
 * Sharding (data parallelism, dist/): with `shards` = N > 1 the loader of
 * process `shard` (0 <= shard < N) returns its part of each GLOBAL batch of
 * N x batch_size images: global batch k covers positions [kG, kG + G) of the
 * epoch's order (G = N x batch_size; the same seed gives every process the
 * same order), and process r takes positions [kG + Gr/N, kG + G(r+1)/N) of
 * it, which is the part fr_train_step gives micro-batch r of that global
 * batch with accum N. The N shards of an epoch are disjoint and, with
 * drop_last, cover N x batch_size x (batches per epoch) images. A short last
 * global batch (R < G images, kept without drop_last) is split the same way,
 * [kG + Rr/N, kG + R(r+1)/N); a process whose part is empty has one batch
 * fewer. Train with drop_last: data-parallel training (dist/) averages the
 * processes' mean gradients with equal weights, which equals fr_train_step's
 * accumulation (each micro-batch weighted by its size) only for equal
 * parts, and a process with one batch fewer leaves the others waiting in
 * the step's all-reduce; the short batch is for evaluation, which sums
 * counts over the processes (train's loaders). Batch indices (fr_loader_seek, fr_loader_batch) count global
 * batches, so a position means the same on every process. Augmentation is
 * seeded by the global position, so image i is augmented the same way
 * whatever the number of processes. */
#ifndef FR_LOADER_H
#define FR_LOADER_H

#include "augment.h"
#include "dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int batch_size;
    bool shuffle;
    bool drop_last;
    uint64_t seed;
    fr_augment aug;     /* crop/flip/normalisation; all zero = pixels / 255 */
    fr_device device;   /* where batches are returned */
    bool prefetch;      /* prepare the next batch on a background thread */
    int shards;         /* processes sharing each epoch (0 or 1: not sharded) */
    int shard;          /* this process, in [0, shards) */
} fr_loader_config;

typedef struct fr_loader fr_loader;

/* Starts at epoch 0, batch 0. NULL with an error on a bad config. */
fr_loader *fr_loader_new(const fr_dataset *ds, const fr_loader_config *cfg);
/* Stops the thread (waiting at most for the batch it is building) and frees
 * everything not handed out. NULL is ignored. */
void fr_loader_free(fr_loader *l);

/* Batches per epoch (this process's, when sharded). */
int64_t fr_loader_num_batches(const fr_loader *l);
/* The epoch and batch index the next fr_loader_next call returns. */
int64_t fr_loader_epoch(const fr_loader *l);
int64_t fr_loader_batch(const fr_loader *l);

/* The next batch: *images (B, C, H, W) f32 and *labels (B,) i32, one
 * reference each for the caller. At the end of an epoch it returns FR_OK
 * with both NULL, and the call after that starts the next epoch. */
fr_status fr_loader_next(fr_loader *l, fr_tensor **images, fr_tensor **labels);

/* Continues from batch `batch` of epoch `epoch` (0 <= batch <= batches per
 * epoch), discarding any prepared batch; for resuming from a checkpoint. */
fr_status fr_loader_seek(fr_loader *l, int64_t epoch, int64_t batch);

#ifdef __cplusplus
}
#endif
#endif
