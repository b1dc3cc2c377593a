/* cli.h: what a program of one's own borrows from the programs (public, in
 * libfrugal_programs): reading integer and real flag values, the --help /
 * bad flag / exit status skeleton, opening a dataset from a --data spec, and
 * a clock. examples/custom_model.c and examples/gan.c use it. What only the
 * programs share (the other flag kinds, the progress line, model creation
 * by name) is programs/cli_impl.h, internal. The training step and
 * evaluation are in train/train.h.
 *
 * Like the rest of the library these return fr_status / NULL with
 * fr_last_error() set and never exit; the programs print the message and
 * exit non-zero. */
#ifndef FR_CLI_H
#define FR_CLI_H

#include <stdio.h>

#include "../data/loader.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- flag values ---- */
/* Each parses all of `text` or fails with FR_ERR_ARG naming the flag. */
fr_status fr_cli_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out);
fr_status fr_cli_double(const char *flag, const char *text, double lo, double hi, double *out);

/* ---- program skeleton ---- */
/* Whether argv holds --help or -h (anywhere: the usage wins over errors). */
bool fr_cli_wants_help(int argc, char *const *argv);
/* The FR_ERR_ARG for an argv entry `arg` that program `prog` cannot take:
 * unknown (!known), or a flag that takes a value given last. */
fr_status fr_cli_bad_flag(const char *prog, const char *arg, bool known);
/* The exit status for a program's outcome: 0 if s is FR_OK, else 1 after
 * printing "prog: <last error>" on stderr. */
int fr_cli_exit_status(const char *prog, fr_status s);

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

/* ---- clock ---- */
/* Seconds on a monotonic clock. */
double fr_cli_now(void);
#ifdef __cplusplus
}
#endif
#endif
