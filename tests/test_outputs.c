/* test_outputs.c: the output-file routine (io/outfile.h) and what the
 * programs do with it: only regular files are written, never an input, every
 * write atomic with nothing left behind on failure; the advisory lock on
 * train --save; validate and train refuse a non-finite loss naming the
 * tensor. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/state.h"
#include "models/resnet.h"
#include "testlib.h"

/* Entries of dir other than . and .. whose name holds `part`. */
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, part);
    if (d)
        closedir(d);
    return n;
}

static void at(char *buf, size_t len, const char *dir, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
}

/* ---- fr_outfile_check and fr_outfile_open: what may be written ---- */

static void test_only_regular_files(void) {
    const char *dir = fr_t_make_tmpdir("out");
    char fifo[600], sub[600], link_dir[600], link_fifo[600], dangling[600], fresh[600], input[600];
    at(fifo, sizeof fifo, dir, "fifo");
    at(sub, sizeof sub, dir, "sub");
    at(link_dir, sizeof link_dir, dir, "link_dir");
    at(link_fifo, sizeof link_fifo, dir, "link_fifo");
    at(dangling, sizeof dangling, dir, "dangling");
    at(fresh, sizeof fresh, dir, "fresh.bin");
    at(input, sizeof input, dir, "input.bin");
    CHECK(mkfifo(fifo, 0600) == 0 && mkdir(sub, 0700) == 0);
    CHECK(symlink(sub, link_dir) == 0 && symlink(fifo, link_fifo) == 0);
    CHECK(symlink("no-such-target", dangling) == 0);
    struct {
        const char *path, *needle;
    } refused[] = {{fifo, "a FIFO"},        {sub, "a folder"},           {"/dev/null", "a device"},
                   {"/dev/full", "a device"}, {link_dir, "a folder"},   {link_fifo, "a FIFO"},
                   {dangling, "symbolic link"}, {"", "empty"}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        CHECK_ERR(fr_outfile_check("--out", refused[i].path, NULL, 0), FR_ERR_ARG, refused[i].needle);
        CHECK(strstr(fr_last_error(), "--out") != NULL);
        /* opening refuses them too, without blocking on the FIFO */
        if (*refused[i].path) {
            fr_outfile *f = fr_outfile_open(refused[i].path);
            CHECK(f == NULL && fr_last_status() == FR_ERR_IO && strstr(fr_last_error(), refused[i].path));
            fr_outfile_abort(f);
        }
    }
    struct stat sb;
    CHECK(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode)); /* untouched */
    CHECK(count_entries(dir, ".tmp.") == 0);
    char missing[700];
    snprintf(missing, sizeof missing, "%s/nope/x.bin", dir);
    CHECK_ERR(fr_outfile_check("--out", missing, NULL, 0), FR_ERR_IO, "does not exist");
    CHECK_ERR(fr_outfile_write(missing, "x", 1), FR_ERR_IO, missing);
    CHECK_OK(fr_outfile_check("--out", fresh, NULL, 0)); /* a new name */

    /* never an input: the same file, through a link, or a hard link */
    char sym[600], hard[600];
    at(sym, sizeof sym, dir, "sym.bin");
    at(hard, sizeof hard, dir, "hard.bin");
    CHECK(fr_t_write_file(input, "checkpoint", strlen("checkpoint")));
    CHECK(symlink(input, sym) == 0 && link(input, hard) == 0);
    const char *inputs[] = {NULL, input};
    const char *spellings[] = {input, sym, hard};
    for (int i = 0; i < 3; i++)
        CHECK_ERR(fr_outfile_check("--save-logits", spellings[i], inputs, 2), FR_ERR_ARG, "which this program reads");
    CHECK_OK(fr_outfile_check("--save-logits", fresh, inputs, 2));
    fr_t_remove_tmpdir(dir);
}

/* ---- the atomic write ---- */

static void test_atomic_replace(void) {
    const char *dir = fr_t_make_tmpdir("out");
    char path[600], target[600], link_path[600];
    at(path, sizeof path, dir, "a.txt");
    CHECK(fr_t_write_file(path, "old", strlen("old")));
    CHECK(chmod(path, 0640) == 0);
    CHECK_OK(fr_outfile_write(path, "new contents", 12));
    char *b = fr_t_read_file(path, NULL);
    CHECK(b && !strcmp(b, "new contents"));
    free(b);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0640); /* permissions kept */
    CHECK(count_entries(dir, ".tmp.") == 0);

    /* a link to a regular file: the file it names is replaced, the link stays */
    at(target, sizeof target, dir, "target.txt");
    at(link_path, sizeof link_path, dir, "link.txt");
    CHECK(fr_t_write_file(target, "t0", strlen("t0")) && symlink(target, link_path) == 0);
    CHECK_OK(fr_outfile_write(link_path, "t1", 2));
    b = fr_t_read_file(target, NULL);
    CHECK(b && !strcmp(b, "t1"));
    free(b);
    CHECK(lstat(link_path, &sb) == 0 && S_ISLNK(sb.st_mode));

    /* the stream interface; abort leaves nothing and the old file */
    fr_outfile *f = fr_outfile_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        fprintf(fr_outfile_stream(f), "never seen");
        fr_outfile_abort(f);
    }
    b = fr_t_read_file(path, NULL);
    CHECK(b && !strcmp(b, "new contents"));
    free(b);
    CHECK(count_entries(dir, ".tmp.") == 0);
    fr_t_remove_tmpdir(dir);
}

/* A write error mid-way (the file size limit makes write() fail with
 * EFBIG, as a full disk fails with ENOSPC): an error naming the path and
 * the errno text, the previous file intact, no temporary file left. Both
 * through fr_outfile_write and through a stream committed later. */
static void test_failed_write_leaves_nothing(void) {
    const char *dir = fr_t_make_tmpdir("out");
    char path[600];
    at(path, sizeof path, dir, "big.bin");
    CHECK(fr_t_write_file(path, "previous", strlen("previous")));
    size_t n = 64 * 1024;
    char *data = malloc(n);
    memset(data, 'x', n);
    struct rlimit old, small;
    getrlimit(RLIMIT_FSIZE, &old);
    small = (struct rlimit){.rlim_cur = 4096, .rlim_max = old.rlim_max};
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    CHECK_ERR(fr_outfile_write(path, data, n), FR_ERR_IO, path);
    CHECK(strstr(fr_last_error(), strerror(EFBIG)) != NULL);
    fr_outfile *f = fr_outfile_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        fwrite(data, 1, n, fr_outfile_stream(f)); /* unchecked, as fprintf's are */
        CHECK_ERR(fr_outfile_commit(f), FR_ERR_IO, "previous file left as it was");
        CHECK(strstr(fr_last_error(), path) && strstr(fr_last_error(), strerror(EFBIG)));
    }
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    char *b = fr_t_read_file(path, NULL);
    CHECK(b && !strcmp(b, "previous"));
    free(b);
    free(data);
    CHECK(count_entries(dir, ".tmp.") == 0);
    fr_t_remove_tmpdir(dir);
}

/* ---- the advisory lock ---- */

static void test_lock(void) {
    const char *dir = fr_t_make_tmpdir("lock");
    char path[600], lockfile[700], pid[32];
    at(path, sizeof path, dir, "run.safetensors");
    snprintf(lockfile, sizeof lockfile, "%s.lock", path);
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    fr_outfile_lock *a = NULL, *b = NULL;
    CHECK_OK(fr_outfile_lock_take("--save", path, &a));
    CHECK(a && access(lockfile, F_OK) == 0);
    /* a second taker (here the same process: the lock is per open file) */
    CHECK_ERR(fr_outfile_lock_take("--save", path, &b), FR_ERR_ARG, "another run writes it");
    CHECK(b == NULL && strstr(fr_last_error(), path) && strstr(fr_last_error(), pid));
    /* from another process too */
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t child = fork();
    if (child == 0) {
        fr_outfile_lock *c = NULL;
        fr_status s = fr_outfile_lock_take("--save", path, &c);
        char verdict = s == FR_ERR_ARG && strstr(fr_last_error(), pid) ? 'y' : 'n';
        _exit(write(pipefd[1], &verdict, 1) == 1 ? 0 : 1);
    }
    char verdict = 0;
    CHECK(read(pipefd[0], &verdict, 1) == 1 && verdict == 'y');
    waitpid(child, NULL, 0);
    close(pipefd[0]);
    close(pipefd[1]);
    fr_outfile_unlock(a);
    CHECK(access(lockfile, F_OK) != 0); /* released and removed */
    CHECK_OK(fr_outfile_lock_take("--save", path, &b));
    fr_outfile_unlock(b);
    fr_outfile_unlock(NULL);
    CHECK_ERR(fr_outfile_lock_take("--save", dir, &b), FR_ERR_ARG, "a folder");
    fr_t_remove_tmpdir(dir);
}

/* What sits at "<path>.lock" and is not a lock a run left: a link, a
 * user's file, a second name of one: refused, untouched, not removed. A
 * dead run's lock (a PID) or an empty file is taken over. */
static void test_lock_never_takes_a_foreign_file(void) {
    const char *dir = fr_t_make_tmpdir("lockforeign");
    char path[600], lockfile[700], victim[600], text[64] = {0};
    at(path, sizeof path, dir, "run.safetensors");
    at(victim, sizeof victim, dir, "victim.txt");
    snprintf(lockfile, sizeof lockfile, "%s.lock", path);
    fr_outfile_lock *l = NULL;
    CHECK(fr_t_write_file(victim, "important data\n", 15));
    CHECK(symlink(victim, lockfile) == 0);
    CHECK_ERR(fr_outfile_lock_take("--save", path, &l), FR_ERR_ARG, "symbolic link");
    CHECK(l == NULL && strstr(fr_last_error(), lockfile));
    CHECK(unlink(lockfile) == 0);
    CHECK(link(victim, lockfile) == 0);
    CHECK_ERR(fr_outfile_lock_take("--save", path, &l), FR_ERR_ARG, "hard links");
    CHECK(unlink(lockfile) == 0);
    CHECK(fr_t_write_file(lockfile, "keep me\n", 8));
    CHECK_ERR(fr_outfile_lock_take("--save", path, &l), FR_ERR_ARG, "not a lock this program left");
    FILE *f = fopen(lockfile, "r");
    CHECK(f && fread(text, 1, sizeof text - 1, f) == 8 && !strcmp(text, "keep me\n"));
    if (f)
        fclose(f);
    f = fopen(victim, "r");
    memset(text, 0, sizeof text);
    CHECK(f && fread(text, 1, sizeof text - 1, f) == 15 && !strcmp(text, "important data\n"));
    if (f)
        fclose(f);
    /* a dead run's lock: its PID and a newline */
    CHECK(fr_t_write_file(lockfile, "999999\n", 7));
    CHECK_OK(fr_outfile_lock_take("--save", path, &l));
    fr_outfile_unlock(l);
    CHECK(access(lockfile, F_OK) != 0);
    fr_t_remove_tmpdir(dir);
}

/* ---- the programs ---- */

static bool have_fashion_mnist(void) {
    return access(FR_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) == 0 ||
           access(FR_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte", R_OK) == 0;
}

/* validate --save-logits over the checkpoint it validates, or a FIFO or a
 * device: refused before any work, the checkpoint byte-identical. A
 * checkpoint with one NaN weight: an error naming it, not an accuracy. */
static void test_validate_outputs(void) {
    if (!fr_t_have_example("validate") || !have_fashion_mnist())
        SKIP("validate or " FR_FASHION_MNIST_DIR " missing");
    const char *dir = fr_t_make_tmpdir("val");
    char ck[600], link_path[600], fifo[600], bad[600], args[2048];
    at(ck, sizeof ck, dir, "ck.safetensors");
    at(link_path, sizeof link_path, dir, "link.safetensors");
    at(fifo, sizeof fifo, dir, "fifo");
    at(bad, sizeof bad, dir, "nan.safetensors");
    fr_model *m = fr_resnet_create("resnet8", 1, 10, 3);
    CHECK_OK(fr_state_save(ck, m, NULL, NULL, NULL));
    CHECK(symlink(ck, link_path) == 0 && mkfifo(fifo, 0600) == 0);
    size_t n0, n1;
    char *before = fr_t_read_file(ck, &n0);
    const char *outs[] = {ck, link_path, fifo, "/dev/null"};
    const char *needles[] = {"which this program reads", "which this program reads", "a FIFO", "a device"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "--checkpoint %s --limit-test 16 --batch 16 --threads 1 --save-logits %s",
                 ck, outs[i]);
        fr_t_example_fails("validate", args, "--save-logits", needles[i]);
    }
    char *after = fr_t_read_file(ck, &n1);
    CHECK(before && after && n0 == n1 && !memcmp(before, after, n0));
    free(before);
    free(after);

    int at_w = fr_params_find(m->params, "layer1.0.conv2.weight");
    CHECK(at_w >= 0);
    if (at_w >= 0)
        fr_data_f32(m->params->items[at_w].tensor)[3] = NAN;
    /* as a plain weights file: fr_state_save refuses non-finite weights */
    fr_st_writer *w = fr_st_writer_new();
    CHECK_OK(fr_params_write(m->params, w, NULL));
    CHECK_OK(fr_st_writer_save(w, bad));
    fr_st_writer_free(w);
    snprintf(args, sizeof args, "--checkpoint %s --model resnet8 --limit-test 16 --batch 16 --threads 1", bad);
    fr_t_example_fails("validate", args, "the test loss is NaN", "parameter 'layer1.0.conv2.weight'");
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* memreport --svg and gan --out on a device or FIFO: refused at once. */
static void test_other_outputs(void) {
    if (!fr_t_have_example("memreport"))
        SKIP("memreport not built");
    const char *dir = fr_t_make_tmpdir("svg");
    char fifo[600], args[1024];
    at(fifo, sizeof fifo, dir, "fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(args, sizeof args, "--model resnet8 --batch 2 --size 8 --strategies plain --svg /dev/full");
    fr_t_example_fails("memreport", args, "--svg /dev/full", "a device");
    snprintf(args, sizeof args, "--model resnet8 --batch 2 --size 8 --strategies plain --svg %s", fifo);
    fr_t_example_fails("memreport", args, "--svg", "a FIFO");
    /* the table itself written to a full device: a failure, not exit 0
     * (stderr goes there too, so the status is what is checked) */
    static char out[4096];
    CHECK(fr_t_run_example("", "memreport", "--model resnet8 --batch 2 --size 8 --strategies plain "
                           "> /dev/full", out, sizeof out) == 1);
    if (fr_t_have_example("validate"))
        CHECK(fr_t_run_example("", "validate", "--help > /dev/full", out, sizeof out) == 1);
    if (fr_t_have_example("gan")) {
        snprintf(args, sizeof args, "--steps 1 --out %s", fifo);
        fr_t_example_fails("gan", args, "--out", "a FIFO");
        fr_t_example_fails("gan", "--steps 1 --out /dev/full", "--out /dev/full", "a device");
    }
    fr_t_remove_tmpdir(dir);
}

/* train --save on a destination another process holds: refused at start
 * naming the holder's PID; a run leaves no lock file behind. */
static void test_train_lock(void) {
    if (!fr_t_have_example("train"))
        SKIP("train not built");
    const char *dir = fr_t_make_tmpdir("tlock");
    char save[600], args[2048], pid[32];
    at(save, sizeof save, dir, "run.safetensors");
    snprintf(pid, sizeof pid, "process %ld", (long)getpid());
    fr_outfile_lock *l = NULL;
    CHECK_OK(fr_outfile_lock_take("--save", save, &l));
    snprintf(args, sizeof args, "--model resnet8 --epochs 1 --threads 1 --save %s", save);
    fr_t_example_fails("train", args, "another run writes it", pid);
    snprintf(args, sizeof args, "--resume %s --threads 1", save);
    fr_t_example_fails("train", args, "--resume", pid);
    fr_outfile_unlock(l);
    if (have_fashion_mnist()) {
        static char out[65536];
        snprintf(args, sizeof args, "--model resnet8 --epochs 1 --batch 16 --limit-train 32 --limit-test 16 "
                 "--threads 1 --save %s", save);
        int rc = fr_t_run_example("", "train", args, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "saved"));
        if (rc != 0)
            fprintf(stderr, "%s\n", out);
        CHECK(count_entries(dir, ".lock") == 0 && count_entries(dir, ".tmp.") == 0);
        /* resumed in place: the lock does not stand in its own way */
        snprintf(args, sizeof args, "--resume %s --threads 1", save);
        rc = fr_t_run_example("", "train", args, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "nothing left to train"));
    }
    fr_t_remove_tmpdir(dir);
}

int main(void) {
    RUN(test_only_regular_files);
    RUN(test_atomic_replace);
    RUN(test_failed_write_leaves_nothing);
    RUN(test_lock);
    RUN(test_lock_never_takes_a_foreign_file);
    RUN(test_validate_outputs);
    RUN(test_other_outputs);
    RUN(test_train_lock);
    return TEST_SUMMARY();
}
