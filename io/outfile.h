/* outfile.h: how every file a program writes is written (checkpoints,
 * validate --save-logits, gan --out, memreport --svg), and the advisory
 * lock that keeps two trainings off one --save destination.
 *
 * An output:
 *  - is a regular file or a new name: a folder, FIFO, device or socket (or a
 *    symbolic link to one) is refused; a link to a regular file is followed,
 *    and the file it names is replaced;
 *  - is none of the input files the program names (same device and inode,
 *    so links and other spellings of a path count);
 *  - is written atomically: into "<path>.tmp.<pid>" beside it (unnamed until
 *    complete where the filesystem has O_TMPFILE), fsync, rename over the
 *    path, fsync of the folder. On any failure (a write error, a full disk)
 *    the temporary file is removed and the previous file is left as it was;
 *    the error names the path and the errno text.
 * docs/TRAINING.md, "Output files, locks and non-finite values", is the
 * user's view.
 *
 * Like the rest of the library these return fr_status / NULL with
 * fr_last_error() set and never exit. */
#ifndef FR_OUTFILE_H
#define FR_OUTFILE_H

#include <stdio.h>

#include "../tensor/fr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether `path` can be written as an output, found before any work is
 * done: not empty, not a folder or other non-regular file, none of the
 * `n_inputs` files in `inputs` (NULL entries and paths that are not
 * regular files are skipped), and its folder exists and is writable.
 * FR_ERR_ARG / FR_ERR_IO naming `flag` and the path. */
fr_status fr_outfile_check(const char *flag, const char *path, const char *const *inputs, int n_inputs);

typedef struct fr_outfile fr_outfile;

/* Starts writing `path` (after the type checks of fr_outfile_check): the
 * stream is a temporary file beside it. NULL with FR_ERR_IO naming the
 * path (a folder, FIFO or device is refused here too). */
fr_outfile *fr_outfile_open(const char *path);
/* The stream to write into; owned by f. */
FILE *fr_outfile_stream(fr_outfile *f);
/* Flushes, syncs and renames the temporary file over the path, then syncs
 * the folder. Frees f, also on failure, which removes the temporary file
 * and leaves the previous file as it was; FR_ERR_IO naming the path, what
 * failed and the errno text. A stream error seen earlier (ferror) fails it
 * too. */
fr_status fr_outfile_commit(fr_outfile *f);
/* Gives up: removes the temporary file, frees f. NULL-safe. */
void fr_outfile_abort(fr_outfile *f);
/* The whole of `n` bytes at `data` as the file `path`: open, write,
 * commit. */
fr_status fr_outfile_write(const char *path, const void *data, size_t n);

/* An advisory lock on an output's destination: an fcntl write lock on
 * "<path>.lock", taken by a process for as long as it may write `path` (a
 * training run and its --save checkpoints), so that a second process asking
 * for the same destination is refused instead of both writing it. */
typedef struct fr_outfile_lock fr_outfile_lock;
/* *out is the lock, held until fr_outfile_unlock or the process ends.
 * FR_ERR_ARG naming the path, the lock file and the PID of the process
 * holding it when another holds it; FR_ERR_IO when the lock file cannot be
 * made. `flag` names the flag in errors. */
fr_status fr_outfile_lock_take(const char *flag, const char *path, fr_outfile_lock **out);
/* Releases the lock and removes its file. NULL-safe. */
void fr_outfile_unlock(fr_outfile_lock *l);

#ifdef __cplusplus
}
#endif
#endif
