/* cli.h: what the example programs (train, validate) share, kept in the
 * library because every examples/ source file is built into a program of its own:
 * reading flag values, opening a dataset from a --data spec, and the progress
 * line. The training step and evaluation they call are in train/train.h.
 *
 * Like the rest of the library these return fr_status / NULL with
 * fr_last_error() set and never exit; the programs print the message and
 * exit non-zero. */
#ifndef FR_CLI_H
#define FR_CLI_H

#include <stdio.h>

#include "../data/loader.h"
#include "../train/amp.h"
#include "../nn/model.h"
#include "../train/optim.h"
#include "../train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- flag values ---- */
/* Each parses all of `text` or fails with FR_ERR_ARG naming the flag. */
fr_status fr_cli_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out);
fr_status fr_cli_double(const char *flag, const char *text, double lo, double hi, double *out);
/* `name` must be one of `choices` (n entries); *out its index. */
fr_status fr_cli_choice(const char *flag, const char *text, const char *const *choices, int n, int *out);
/* A precision (fr_precision_parse: f32, f16, bf16 and their long names). */
fr_status fr_cli_precision(const char *flag, const char *text, fr_dtype *out);
/* A byte count: digits with an optional K, M or G suffix (powers of 1024),
 * greater than 0. */
fr_status fr_cli_size(const char *flag, const char *text, size_t *out);
/* A memory strategy (fr_strategy_parse), the error naming the flag. */
fr_status fr_cli_strategy(const char *flag, const char *text, fr_strategy *out);

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

/* ---- program skeleton ---- */
/* Whether argv holds --help or -h (anywhere: the usage wins over errors). */
bool fr_cli_wants_help(int argc, char *const *argv);
/* The FR_ERR_ARG for an argv entry `arg` that program `prog` cannot take:
 * unknown (!known), or a flag that takes a value given last. */
fr_status fr_cli_bad_flag(const char *prog, const char *arg, bool known);
/* The exit status for a program's outcome: 0 if s is FR_OK, else 1 after
 * printing "prog: <last error>" on stderr. */
int fr_cli_exit_status(const char *prog, fr_status s);

/* What the programs' --threads and --memory-limit ask for, applied before
 * any kernel: threads > 0 is the CPU team (fr_set_num_threads), and every
 * device's ledger is capped at memory_limit bytes (0: no cap). */
void fr_cli_apply_limits(int64_t threads, size_t memory_limit);

/* ---- models ---- */
/* A registered model (models/registry.h: resnet<6n+2>, preresnet<9n+2>,
 * densenet-bc-<L>[-k<K>] and whatever the program registered), on the CPU
 * with the plain strategy; an unknown name is an FR_ERR_ARG about --model. */
fr_model *fr_cli_model_create(const char *name, int in_channels, int num_classes, uint64_t seed);
/* Whether `name` is a model fr_cli_model_create makes (checked by making a
 * one-channel, two-class copy and freeing it), the error naming `flag`. */
fr_status fr_cli_model_check(const char *flag, const char *name);

/* ---- datasets ---- */
typedef enum {
    FR_DATA_FASHION_MNIST = 0, /* IDX files, 28x28 grey, 10 classes */
    FR_DATA_MNIST,             /* the same files and names */
    FR_DATA_CIFAR10,
    FR_DATA_CIFAR100,
    FR_DATA_FOLDER,            /* DIR/train and DIR/test, one sub-folder per class */
    FR_DATA_KIND_COUNT
} fr_data_kind;

#define FR_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct {
    fr_data_kind kind;
    char dir[1024];
    int num_classes; /* IDX: the class count (10 unless ",classes=K" says otherwise) */
    int channels;    /* folder: 1 or 3, or 0 to decide from the training split's files */
} fr_data_spec;

/* "fashion-mnist[:DIR]", "mnist:DIR", "cifar10:DIR", "cifar100:DIR",
 * "folder:DIR", each optionally followed by ",classes=K" (IDX sets: labels
 * in [0, K)) or ",channels=C" (folders: convert every image to C = 1 or 3). */
fr_status fr_data_spec_parse(const char *text, fr_data_spec *out);
/* The training or test split, keeping the first `limit` images when
 * limit > 0 (folders: a stratified prefix, the i-th image of every class
 * before the (i+1)-th of any). IDX files are looked up as <name>.gz, then
 * <name>. A folder's test split is labelled by DIR/train's class names (a
 * test class that training lacks is an error naming it). */
fr_dataset *fr_data_open(const fr_data_spec *spec, bool train, int64_t limit);
/* The dataset's normalisation; with `augment`, the training augmentation:
 * CIFAR and image folders pad-4 random crop + horizontal flip;
 * (Fashion-)MNIST pad-2 crop + flip (docs/TRAINING.md says why). */
bool fr_data_augment_default(fr_data_kind kind);
fr_augment fr_data_augment(fr_data_kind kind, const fr_dataset *ds, bool augment);

/* ---- progress ---- */
/* Seconds on a monotonic clock. */
double fr_cli_now(void);
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
