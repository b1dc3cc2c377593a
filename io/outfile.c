/* outfile.c: every program output written one way, and the advisory lock
 * on a --save destination; see outfile.h. */
#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a non-regular file is, for the refusal. */
static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* The file the output replaces: `path` itself, or the regular file a
 * symbolic link at `path` names (writing through the link, as an editor
 * does). *exists says whether it is there; *sb is its stat then. A malloc'd
 * path, or NULL with an error `code` naming `flag`. */
static char *destination(fr_status code, const char *flag, const char *path, bool *exists, struct stat *sb) {
    if (!path || !*path) {
        fr_error(code, "%s: the path is empty", flag);
        return NULL;
    }
    size_t len = strlen(path);
    if (path[len - 1] == '/') {
        fr_error(code, "%s %s: names a folder, not a file (not a regular file)", flag, path);
        return NULL;
    }
    struct stat lsb;
    *exists = lstat(path, &lsb) == 0;
    if (!*exists) {
        if (errno != ENOENT) {
            fr_error(FR_ERR_IO, "%s %s: %s", flag, path, strerror(errno));
            return NULL;
        }
        char *copy = strdup(path);
        if (!copy)
            fr_error(FR_ERR_OOM, "%s %s: out of memory", flag, path);
        return copy;
    }
    if (S_ISLNK(lsb.st_mode)) {
        char *target = realpath(path, NULL);
        if (!target) {
            fr_error(code, "%s %s: a symbolic link to nothing usable: %s", flag, path, strerror(errno));
            return NULL;
        }
        if (stat(target, sb) != 0 || !S_ISREG(sb->st_mode)) {
            fr_error(code, "%s %s: a symbolic link to %s, %s (not a regular file)", flag, path, target,
                     kind_of(sb->st_mode));
            free(target);
            return NULL;
        }
        return target;
    }
    *sb = lsb;
    if (!S_ISREG(lsb.st_mode)) {
        fr_error(code, "%s %s: %s (not a regular file): only a regular file or a new name is "
                 "written", flag, path, kind_of(lsb.st_mode));
        return NULL;
    }
    char *copy = strdup(path);
    if (!copy)
        fr_error(FR_ERR_OOM, "%s %s: out of memory", flag, path);
    return copy;
}

/* The folder of `path` ("." for a bare name) into buf. */
static void folder_of(const char *path, char *buf, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, len, ".");
    else
        snprintf(buf, len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

static bool same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

fr_status fr_outfile_check(const char *flag, const char *path, const char *const *inputs, int n_inputs) {
    bool exists;
    struct stat sb;
    char *dst = destination(FR_ERR_ARG, flag, path, &exists, &sb);
    if (!dst)
        return fr_last_status();
    fr_status st = FR_OK;
    for (int i = 0; exists && st == FR_OK && i < n_inputs; i++) {
        struct stat in;
        if (!inputs[i] || stat(inputs[i], &in) != 0 || !S_ISREG(in.st_mode))
            continue;
        if (same_file(&sb, &in))
            st = fr_error(FR_ERR_ARG, "%s %s: is %s, which this program reads: writing it would destroy "
                          "its input (choose another path)", flag, path, inputs[i]);
    }
    char dir[PATH_MAX + 8];
    folder_of(dst, dir, sizeof dir);
    struct stat dsb;
    if (st == FR_OK && (stat(dir, &dsb) != 0 || !S_ISDIR(dsb.st_mode)))
        st = fr_error(FR_ERR_IO, "%s %s: folder %s does not exist", flag, path, dir);
    if (st == FR_OK && access(dir, W_OK | X_OK) != 0)
        st = fr_error(FR_ERR_IO, "%s %s: folder %s is not writable: %s", flag, path, dir, strerror(errno));
    free(dst);
    return st;
}

/* ---- the atomic write ---- */

struct fr_outfile {
    FILE *fp;     /* writes through write_fd (fopencookie) */
    int fd;
    int err;      /* the errno of the first failed write(2), or 0 */
    char *path;   /* the file replaced (a link's target) */
    char *tmp;    /* "<path>.tmp.<pid>" */
    bool unnamed; /* O_TMPFILE: no name until linked as tmp */
};

/* Removes "<base>.tmp.<pid>" files beside `path` whose writer process is
 * gone (a save killed before its rename); a live process's file is left
 * alone, whoever it is. Best effort: a folder that cannot be read is skipped. */
static void remove_dead_temps(const char *path) {
    char dir[PATH_MAX + 8];
    folder_of(path, dir, sizeof dir);
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, base, blen) || strncmp(n + blen, ".tmp.", 5))
            continue;
        char *end;
        errno = 0;
        long pid = strtol(n + blen + 5, &end, 10);
        if (errno || *end || end == n + blen + 5 || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive (or not ours to ask): never touched */
        (void)unlinkat(dirfd(d), n, 0);
    }
    closedir(d);
}

/* The stream's write function: a failed write(2) is remembered with its
 * errno, which stdio would not keep until the commit (ENOSPC for a full
 * disk, EFBIG past the file size limit). */
static ssize_t write_fd(void *cookie, const char *buf, size_t n) {
    fr_outfile *f = cookie;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(f->fd, buf + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!f->err)
                f->err = w < 0 ? errno : EIO;
            return (ssize_t)done; /* short: stdio marks the stream in error */
        }
        done += (size_t)w;
    }
    return (ssize_t)done;
}

static int close_fd(void *cookie) {
    fr_outfile *f = cookie;
    return close(f->fd);
}

/* The file being written: unnamed (O_TMPFILE) where the filesystem allows,
 * so a writer killed at any moment before it links the data under its temp
 * name leaves nothing behind; else created under the temp name. */
static fr_status create_temp(fr_outfile *f) {
    char dir[PATH_MAX + 8];
    folder_of(f->path, dir, sizeof dir);
    int fd = -1;
#ifdef O_TMPFILE
    fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
    f->unnamed = fd >= 0;
#endif
    if (fd < 0) {
        (void)unlink(f->tmp); /* ours: the pid is this process's */
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    }
    if (fd < 0)
        return fr_error(FR_ERR_IO, "cannot write %s: cannot create %s: %s", f->path, f->tmp, strerror(errno));
    /* a replaced file keeps its permissions */
    struct stat sb;
    if (stat(f->path, &sb) == 0)
        (void)fchmod(fd, sb.st_mode & 07777);
    f->fd = fd;
    if (!(f->fp = fopencookie(f, "wb", (cookie_io_functions_t){.write = write_fd, .close = close_fd}))) {
        int e = errno;
        close(fd);
        if (!f->unnamed)
            unlink(f->tmp);
        return fr_error(FR_ERR_IO, "cannot write %s: %s", f->path, strerror(e));
    }
    return FR_OK;
}

fr_outfile *fr_outfile_open(const char *path) {
    bool exists;
    struct stat sb;
    fr_outfile *f = calloc(1, sizeof *f);
    char *dst = f ? destination(FR_ERR_IO, "cannot write", path, &exists, &sb) : NULL;
    if (!f || !dst) {
        if (!f)
            fr_error(FR_ERR_OOM, "cannot write %s: out of memory", path ? path : "(null)");
        free(f);
        return NULL;
    }
    f->path = dst;
    size_t tlen = strlen(dst) + 32;
    if (!(f->tmp = malloc(tlen))) {
        fr_error(FR_ERR_OOM, "cannot write %s: out of memory", dst);
        fr_outfile_abort(f);
        return NULL;
    }
    snprintf(f->tmp, tlen, "%s.tmp.%ld", dst, (long)getpid());
    remove_dead_temps(dst);
    if (create_temp(f) != FR_OK) {
        free(f->tmp);
        free(f->path);
        free(f);
        return NULL;
    }
    return f;
}

FILE *fr_outfile_stream(fr_outfile *f) {
    return f ? f->fp : NULL;
}

/* Gives an unnamed temp file its temp name, ready for the rename. */
static int link_temp(int fd, const char *tmp) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    (void)unlink(tmp);
    return linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW);
}

/* Makes the rename itself durable; a filesystem that cannot fsync a
 * folder still has the data, so failure here is not an error. */
static void sync_folder(const char *path) {
    char dir[PATH_MAX + 8];
    folder_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

fr_status fr_outfile_commit(fr_outfile *f) {
    if (!f)
        return fr_error(FR_ERR_ARG, "outfile: commit of NULL");
    const char *what = NULL;
    int err = 0;
    if (ferror(f->fp) || fflush(f->fp) != 0) { /* an earlier write failed (fprintf's go unchecked) */
        what = "write failed";
        err = f->err ? f->err : errno ? errno : EIO;
    } else if (fsync(f->fd) != 0) {
        what = "write failed";
        err = errno;
    } else if (f->unnamed && link_temp(f->fd, f->tmp) != 0) {
        what = "cannot name the written data";
        err = errno;
    }
    bool named = !f->unnamed || (what == NULL);
    if (fclose(f->fp) != 0 && !what) {
        what = "close failed";
        err = errno;
    }
    f->fp = NULL;
    if (!what && rename(f->tmp, f->path) != 0) {
        what = "rename failed";
        err = errno;
    }
    fr_status st = FR_OK;
    if (what) {
        if (named)
            (void)unlink(f->tmp);
        st = fr_error(FR_ERR_IO, "cannot write %s (previous file left as it was): %s: %s", f->path, what,
                      strerror(err));
    } else {
        sync_folder(f->path);
    }
    free(f->tmp);
    free(f->path);
    free(f);
    return st;
}

void fr_outfile_abort(fr_outfile *f) {
    if (!f)
        return;
    if (f->fp) {
        fclose(f->fp);
        if (!f->unnamed)
            (void)unlink(f->tmp);
    }
    free(f->tmp);
    free(f->path);
    free(f);
}

fr_status fr_outfile_write(const char *path, const void *data, size_t n) {
    fr_outfile *f = fr_outfile_open(path);
    if (!f)
        return fr_last_status();
    if (n && fwrite(data, 1, n, f->fp) != n) {
        int e = f->err ? f->err : EIO;
        fr_outfile_abort(f);
        return fr_error(FR_ERR_IO, "cannot write %s (previous file left as it was): write failed: %s", path,
                        strerror(e));
    }
    return fr_outfile_commit(f);
}

/* ---- the advisory lock ---- */

struct fr_outfile_lock {
    int fd;
    char *path; /* "<path>.lock" */
};

/* The PID the holder wrote into the lock file, or 0 (not written yet). An
 * open-file-description lock (F_OFD_SETLK) reports no PID of its own. */
static long lock_holder(int fd) {
    char buf[32] = {0};
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
    return pid > 0 ? pid : 0;
}

/* Why the file open at fd is not one a lock holder left (what it is), or
 * NULL: a lock is a regular file of one name holding nothing or a PID and a
 * newline (what fr_outfile_lock_take writes; a run that died leaves that
 * behind, and the next takes it over). Anything else at "<path>.lock" is a
 * user's file, which taking the lock would truncate and then remove. */
static const char *not_a_lock(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return "not a regular file";
    if (sb.st_nlink > 1)
        return "a file with other names (hard links)";
    char buf[32];
    if (sb.st_size >= (off_t)sizeof buf)
        return "a file of other contents";
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    if (n < 0 || n != sb.st_size)
        return "a file that cannot be read";
    for (ssize_t i = 0; i < n; i++)
        if (!(buf[i] >= '0' && buf[i] <= '9') && !(buf[i] == '\n' && i == n - 1))
            return "a file of other contents";
    return NULL;
}

fr_status fr_outfile_lock_take(const char *flag, const char *path, fr_outfile_lock **out) {
    *out = NULL;
    bool exists;
    struct stat sb;
    char *dst = destination(FR_ERR_ARG, flag, path, &exists, &sb);
    if (!dst)
        return fr_last_status();
    fr_outfile_lock *l = calloc(1, sizeof *l);
    size_t len = strlen(dst) + 8;
    char *lp = l ? malloc(len) : NULL;
    if (!lp) {
        free(l);
        free(dst);
        return fr_error(FR_ERR_OOM, "%s %s: out of memory", flag, path);
    }
    snprintf(lp, len, "%s.lock", dst);
    free(dst);
    /* The holder removes the lock file when it is done: a file locked here
     * must still be the one at the name, else it was removed between our
     * open and our lock, and we try again on the new one. */
    for (int attempt = 0;; attempt++) {
        /* never through a link: the file is truncated, written and at
         * the end removed, which followed a planted link to any file */
        int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        const char *foreign = fd < 0 ? NULL : not_a_lock(fd);
        if (fd < 0 || foreign) {
            fr_status st = foreign
                               ? fr_error(FR_ERR_ARG, "%s %s: %s exists and is %s, not a lock this "
                                          "program left; it is not touched (remove it or choose "
                                          "another path)", flag, path, lp, foreign)
                           : errno == ELOOP
                               ? fr_error(FR_ERR_ARG, "%s %s: the lock file %s is a symbolic link, "
                                          "which is never followed (remove it or choose another "
                                          "path)", flag, path, lp)
                               : fr_error(FR_ERR_IO, "%s %s: cannot create the lock file %s: %s",
                                          flag, path, lp, strerror(errno));
            if (fd >= 0)
                close(fd);
            free(lp);
            free(l);
            return st;
        }
        /* an OFD lock belongs to this open file, not to the process: a
         * second lock from the same process conflicts too, and closing
         * another descriptor of the file does not drop it */
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
            int e = errno;
            long pid = lock_holder(fd);
            char holder[32] = "(not known yet)";
            if (pid)
                snprintf(holder, sizeof holder, "%ld", pid);
            close(fd);
            fr_status st = e == EACCES || e == EAGAIN
                               ? fr_error(FR_ERR_ARG, "%s %s: another run writes it: process %s holds the lock "
                                          "%s (wait for it to end, or choose another path)", flag, path,
                                          holder, lp)
                               : fr_error(FR_ERR_IO, "%s %s: cannot lock %s: %s", flag, path, lp, strerror(e));
            free(lp);
            free(l);
            return st;
        }
        struct stat at_name, held;
        if (attempt < 8 && (stat(lp, &at_name) != 0 || fstat(fd, &held) != 0 || !same_file(&at_name, &held))) {
            close(fd);
            continue;
        }
        /* the holder's PID in the file, for a person looking at it */
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) == 0 && write(fd, pid, (size_t)n) == n)
            (void)fsync(fd);
        l->fd = fd;
        l->path = lp;
        *out = l;
        return FR_OK;
    }
}

void fr_outfile_unlock(fr_outfile_lock *l) {
    if (!l)
        return;
    /* removed while still locked, so no other process can hold a lock on
     * this file under this name afterwards (fr_outfile_lock_take checks) */
    (void)unlink(l->path);
    close(l->fd);
    free(l->path);
    free(l);
}
