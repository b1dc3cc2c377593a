/* cli_impl.h: what the three programs (programs/program_*.c) share beyond
 * the public programs/cli.h: the other flag kinds, refusing a flag given
 * twice or two that contradict, the --threads / --memory-limit limits,
 * models by name, and the progress line. Internal: not installed. */
#ifndef FR_CLI_IMPL_H
#define FR_CLI_IMPL_H

#include <stdio.h>

#include "../dist/dist.h"
#include "../nn/model.h"
#include "../planner/planner.h"
#include "../train/amp.h"
#include "../train/optim.h"
#include "../train/train.h"
#include "cli.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- flag values (see cli.h) ---- */
/* `name` must be one of `choices` (n entries); *out its index. */
fr_status fr_cli_choice(const char *flag, const char *text, const char *const *choices, int n, int *out);
/* A precision (fr_precision_parse: f32, f16, bf16 and their long names). */
fr_status fr_cli_precision(const char *flag, const char *text, fr_dtype *out);
/* A byte count: digits with an optional K, M or G suffix (powers of 1024),
 * greater than 0. */
fr_status fr_cli_size(const char *flag, const char *text, size_t *out);
/* A memory strategy (fr_strategy_parse), the error naming the flag. */
fr_status fr_cli_strategy(const char *flag, const char *text, fr_strategy *out);
/* FR_ERR_ARG naming both flags when --strategy `text` (parsed: s) cannot
 * run in `precision`: compress:B packs f32 activations only. Checked with
 * the other flags, before any data is read. */
fr_status fr_cli_strategy_precision(const char *text, fr_strategy s, fr_dtype precision);

/* The flags a program has read so far, to refuse a flag given twice (the
 * last one would silently win) and two flags that contradict each other. */
enum { FR_CLI_MAX_FLAGS = 64 };
typedef struct {
    const char *flag[FR_CLI_MAX_FLAGS], *value[FR_CLI_MAX_FLAGS]; /* value NULL: a switch */
    int n;
} fr_cli_seen;
/* Records `flag` (with its value, or NULL); FR_ERR_ARG naming both uses
 * when it was given before. */
fr_status fr_cli_seen_add(fr_cli_seen *s, const char *flag, const char *value);
/* The value `flag` was given with ("" for a switch), NULL if not given. */
const char *fr_cli_seen_get(const fr_cli_seen *s, const char *flag);
/* FR_ERR_ARG naming both when flags a and b were both given: `why` says
 * what each would do. */
fr_status fr_cli_conflict(const fr_cli_seen *s, const char *a, const char *b, const char *why);
/* What the programs' --threads and --memory-limit ask for, applied before
 * any kernel: threads > 0 is the CPU team (fr_set_num_threads), and every
 * device's ledger is capped at memory_limit bytes (0: no cap). */
void fr_cli_apply_limits(int64_t threads, size_t memory_limit);
/* A program's exit status once its output is written: rc, or 1 (with a
 * message on stderr naming `prog`) when rc is 0 but standard output could
 * not be written (a full disk, a closed pipe): results that never arrived
 * are not a success. */
int fr_cli_exit(const char *prog, int rc);

/* ---- train --memory-budget (train_budget.c) ---- */
/* The largest batch (at most the training set's images) whose training
 * step the planner fits in `budget` in one micro-batch, each candidate a
 * plan verified by a whole measured step (planner/fit.c, fr_fit_batch),
 * beside what train's loaders will hold (each loader's ready batch and two
 * in the making); the choice, the plans it took and the time are printed.
 * Under data parallelism (`dist` not NULL) each process measures its share
 * of a step and all take the least any found; *batch is the whole step's
 * images (share x processes). FR_ERR_ARG when none fits. */
fr_status fr_cli_batch_auto(fr_model *m, const fr_optim *opt, const fr_dataset *ds, fr_dist *dist, size_t budget,
                            bool allow_compress, int *batch);
/* FR_OK when the ledger's peak since the last reset on the plan's device is
 * within plan->budget; else FR_ERR_OOM naming the model, the phase and
 * step, the tag holding the most at the peak, and the plan's figures, with
 * plan->min_budget raised to that peak (what fr_cli_oom_hint names). */
fr_status fr_cli_plan_check_step(fr_memory_plan *plan, const char *model, int64_t step);
/* After an FR_ERR_OOM in training or evaluation: the error again, saying
 * what would have fitted (the plan's smallest budget, or that
 * --memory-budget plans a step for the --memory-limit); FR_ERR_OOM. */
fr_status fr_cli_oom_hint(const fr_memory_plan *plan, size_t memory_limit, size_t memory_budget);

/* ---- models ---- */
/* A registered model (models/registry.h: resnet<6n+2>, preresnet<9n+2>,
 * densenet-bc-<L>[-k<K>] and whatever the program registered), on the CPU
 * with the plain strategy; an unknown name is an FR_ERR_ARG about --model. */
fr_model *fr_cli_model_create(const char *name, int in_channels, int num_classes, uint64_t seed);
/* Whether `name` is a model fr_cli_model_create makes (checked by making a
 * one-channel, two-class copy and freeing it), the error naming `flag`. */
fr_status fr_cli_model_check(const char *flag, const char *name);

/* "1:02:03" or "2:03" into buf; returns buf. */
char *fr_cli_format_duration(double seconds, char *buf, size_t len);

/* The progress line: on a terminal it is rewritten in place (\r); else a
 * plain line every `every` steps, so logs stay readable. */
typedef struct {
    FILE *out;
    bool tty;
    int every;
    fr_device dev;
    double t_start;        /* of the run */
    int64_t steps_total;   /* steps this run will take */
    int64_t steps_done;    /* steps taken by this run */
    int epochs;
    bool dirty;            /* a \r line is on screen */
    /* Set by the caller after init, may stay NULL: when its dtype is not f32
     * the line shows its scale and skipped steps ("scale 65536 skipped 0"). */
    const fr_loss_scaler *scaler;
} fr_progress;

void fr_progress_init(fr_progress *p, FILE *out, fr_device dev, int64_t steps_total, int epochs, int every);
/* After each step: epoch (0-based), step in epoch (1-based) of `per_epoch`,
 * running mean loss and accuracy of the epoch, images/s of the epoch. */
/* "91.23%" (digits after the point), or "n/a" for a NaN accuracy (a model
 * with its own loss: nn/model.h); returns buf. */
const char *fr_cli_format_acc(double acc, int digits, char *buf, size_t len);
void fr_progress_step(fr_progress *p, int64_t epoch, int64_t step, int64_t per_epoch, double loss,
                      double acc, double images_per_s);
/* Ends an in-place line before other output. */
void fr_progress_break(fr_progress *p);

/* "cur 12.3 MiB  peak 45.6 MiB" of the ledger total on `dev`. */
char *fr_cli_memory(fr_device dev, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
