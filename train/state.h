/* state.h: training checkpoints, one safetensors file each.
 *
 * A training checkpoint holds everything a run needs to continue exactly
 * where it stopped:
 *  - the model's parameters and buffers under their registry names
 *    ("conv1.weight", "bn1.running_mean"), so the file is also a plain
 *    weights file that PyTorch's safetensors (and fr_params_load, once the
 *    optimizer entries are ignored) can read;
 *  - the optimizer state under "optim.<slot>.<parameter name>" (slot names as
 *    PyTorch's: momentum_buffer, exp_avg, exp_avg_sq) and the per-parameter
 *    step count under "optim.step.<parameter name>" (0-d i32);
 *  - metadata strings: the format ("frugal.checkpoint") and its version, the
 *    model (name, in_channels, num_classes, strategy, amp.precision), the
 *    optimizer kind and hyperparameters, the LR schedule, the run's position
 *    and settings (fr_train_state) and, when a loss scaler is given, its
 *    state (amp.scale, amp.growth_tracker, amp.skipped). Doubles (and the
 *    f32 scale) are written with 17 significant digits, so they read back bit
 *    for bit. A file without amp.precision (written before mixed precision)
 *    reads as f32 with no scaler state.
 *
 * Why this is enough for an exact resume: the loader's batches are a pure
 * function of (seed, epoch, batch) (data/loader.h) and the schedule a pure
 * function of the step (train/schedule.h), so the position plus the tensors
 * reproduce the run; there is no other random state in a training step.
 *
 * Saving is atomic (temp file, fsync, rename: safetensors.h) and writes the
 * file's checksums (FR_ST_CHECKSUM_KEY). Loading checks every tensor's
 * presence, shape and dtype, every metadata field, every tensor's checksum
 * when the file has them, and BatchNorm's statistics (fr_params_check_stats)
 * before it changes anything, so a failed load leaves the model and the
 * optimizer as they were; errors name the file and the tensor or field. */
#ifndef FR_STATE_H
#define FR_STATE_H

#include "amp.h"
#include "../nn/model.h"
#include "optim.h"
#include "schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FR_STATE_FORMAT "frugal.checkpoint"
#define FR_STATE_VERSION 1

/* Where a run stands and the settings that decide its trajectory. */
typedef struct {
    int64_t epoch;        /* epoch of the next step (0-based) */
    int64_t batch;        /* batches of that epoch already consumed */
    int64_t step;         /* optimizer steps taken in all: the schedule's position */
    uint64_t seed;        /* model initialisation and loader seed */
    int batch_size;       /* images per optimizer step (all processes together) */
    int accum;            /* micro-batches per step (>= 1) */
    int epochs;           /* epochs the run was started for */
    bool augment;
    int64_t limit_train;  /* first N training images only; 0 = all */
    char data[256];       /* the --data spec, for messages */
    /* Data parallelism (dist/dist.h): the processes that trained it, each on
     * batch_size / world_size images of every step (1 alone; files without
     * the dist.* fields read as 1), and whether batch norm was synchronised.
     * epoch and batch count global batches, so they mean the same on every
     * process. */
    int world_size;
    bool sync_bn;
    fr_schedule schedule;
    /* Mixed precision, as the file records it (filled by fr_state_load and
     * fr_state_read_info; fr_state_save writes the model's precision and the
     * scaler it is given instead): the precision trained in (FR_F32 for
     * older files), and the loss scaler's state when the file holds one. */
    fr_dtype precision;
    bool has_scaler;
    fr_loss_scaler_state scaler;
    /* The random streams at this position (autograd.h: dropout's and
     * compression's rounding), so that a resumed run draws the masks and
     * codes the uninterrupted one would: fr_state_save writes them where
     * has_random, fr_state_load reads them (has_random false for files
     * without the fields); the caller applies them. */
    bool has_random;
    uint64_t random_state, compress_random_state;
} fr_train_state;

/* What a checkpoint says about itself, read without touching any model. */
typedef struct {
    bool is_training;     /* false: a plain weights file (no frugal metadata) */
    int version;
    char model[32];
    int in_channels, num_classes;
    fr_strategy strategy;
    bool has_optim;
    fr_optim_kind optim_kind;
    fr_sgd_options sgd;
    fr_adam_options adam;
    fr_train_state state;
} fr_state_info;

/* Writes model, optimizer (may be NULL), loss scaler (may be NULL) and state
 * (may be NULL: a weights file with the model metadata only) to `path`,
 * atomically. amp.precision is m->cfg.precision; a scaler must be made for
 * that precision (FR_ERR_ARG naming both otherwise). */
fr_status fr_state_save(const char *path, const fr_model *m, const fr_optim *opt,
                       const fr_loss_scaler *scaler, const fr_train_state *state);

/* Reads the metadata of `path`. A file without frugal metadata is not an
 * error: info->is_training is false and the rest is zero. FR_ERR_FORMAT
 * naming the file and the field for a malformed or unsupported value
 * (amp.*: an unknown precision, a scale that is not a finite number > 0, a
 * negative or non-integer tracker or skip count, a scale other than 1 for
 * f32 / bf16, scaler fields present only in part). */
fr_status fr_state_read_info(const char *path, fr_state_info *info);

/* Loads `path` into m (and opt, scaler and state when not NULL). Checks
 * first, then copies: the model name (when the file records one), every
 * parameter and buffer (present, same shape and dtype, no unknown model
 * tensor in the file, BatchNorm statistics training can produce), the
 * checksum of every tensor in the file, the optimizer's included even when
 * opt is NULL (FR_ERR_FORMAT naming the file and the tensor), and with opt:
 * the optimizer kind and every state tensor's shape and dtype. With state:
 * the file must be a training checkpoint, and m->cfg.precision must be the precision it was trained in.
 * With a scaler: its dtype must be that precision (FR_ERR_ARG naming both),
 * and the file's scaler state, if it holds one, goes through
 * fr_loss_scaler_set_state (refused values are an FR_ERR_FORMAT naming the
 * file); a file without scaler state leaves the scaler as it is. The
 * optimizer's hyperparameters are left as they are: to continue a run
 * exactly, make the optimizer from fr_state_read_info's options (examples/train
 * does). */
fr_status fr_state_load(const char *path, fr_model *m, fr_optim *opt, fr_loss_scaler *scaler,
                       fr_train_state *state);

#ifdef __cplusplus
}
#endif
#endif
