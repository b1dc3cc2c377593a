/* test_hardening.c: the findings of the outside audit (issue 13), each as a
 * case that failed before its fix.
 *
 *  - checkpoint metadata: every field's type and range is checked before
 *    anything is allocated (step = INT64_MAX, schedule.base_lr = inf, epoch
 *    past epochs, strategy "abn+abn", training = "0", num_classes = 1e8,
 *    optimizer values out of range), and a good file still loads;
 *  - a checkpoint is never replaced by non-finite weights;
 *  - a FIFO given as a checkpoint is refused at once (the test arms an alarm,
 *    so a blocking open fails it instead of hanging the suite);
 *  - temp files of a dead writer are removed by the next save, a live
 *    writer's are left alone, and a writer killed with SIGKILL leaves none;
 *  - the ledger's limit (--memory-limit): a training step over it fails with
 *    an error naming the tag, the bytes, what is in use and the limit, leaves
 *    nothing allocated, and the same step fits once the caller retries with a
 *    smaller batch;
 *  - the programs: flag errors name the flag and come before any data is
 *    read; an unwritable --save is found before training; a FIFO --resume /
 *    --checkpoint fails at once; training that diverges stops with an error
 *    and writes no checkpoint; under `ulimit -v 300000` train and memreport
 *    end (0 or out of memory) instead of spinning in OpenBLAS. Skipped when
 *    the programs are not built. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "train/state.h"
#include "programs/cli_impl.h"

/* ---- files ---- */

/* Copies the safetensors file `from` to `to` with metadata field `key` set
 * to `value` (the header's length prefix rewritten; data offsets are
 * relative to the header's end, so they stay valid) and without its
 * checksum field (fr_t_st_unseal), which would refuse any edit first. */
static bool patch_metadata(const char *from, const char *to, const char *key, const char *value) {
    size_t n;
    char *b = fr_t_read_file(from, &n);
    if (!b || n < 8)
        return false;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)b[i];
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    char *hdr = b + 8, *at = strstr(hdr, pat);
    if (!at || at >= hdr + hlen) {
        free(b);
        return false;
    }
    char *vstart = at + strlen(pat), *vend = strchr(vstart, '"');
    size_t new_hlen = hlen - (size_t)(vend - vstart) + strlen(value);
    char *out = malloc(n + strlen(value) + 8);
    for (int i = 0; i < 8; i++)
        out[i] = (char)(new_hlen >> (8 * i));
    size_t o = 8;
    memcpy(out + o, hdr, (size_t)(vstart - hdr));
    o += (size_t)(vstart - hdr);
    memcpy(out + o, value, strlen(value));
    o += strlen(value);
    memcpy(out + o, vend, n - (size_t)(vend - b));
    o += n - (size_t)(vend - b);
    bool ok = fr_t_write_file(to, out, o) && fr_t_st_unseal(to);
    free(out);
    free(b);
    return ok;
}

/* ---- a small training checkpoint ---- */

typedef struct {
    fr_model *m;
    fr_optim *opt;
    fr_train_state st;
} small_run;

static bool small_init(small_run *r) {
    memset(r, 0, sizeof *r);
    r->m = fr_cli_model_create("resnet8", 1, 2, 5);
    r->opt = r->m ? fr_sgd_new(r->m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9}) : NULL;
    r->st = (fr_train_state){.seed = 5, .batch_size = 4, .accum = 1, .epochs = 2, .epoch = 1, .step = 3};
    snprintf(r->st.data, sizeof r->st.data, "synthetic");
    return r->opt && fr_schedule_cosine(&r->st.schedule, 0.1, 6, 0.0) == FR_OK;
}

static void small_free(small_run *r) {
    fr_optim_free(r->opt);
    fr_model_free(r->m);
}

static void test_checkpoint_metadata_validated(void) {
    const char *dir = fr_t_make_tmpdir("meta");
    char good[600], bad[600];
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    small_run r;
    CHECK(small_init(&r));
    CHECK_OK(fr_state_save(good, r.m, r.opt, NULL, &r.st));
    fr_state_info info;
    CHECK_OK(fr_state_read_info(good, &info));
    CHECK(info.is_training && info.state.step == 3 && info.num_classes == 2);
    static const struct {
        const char *key, *value, *needle;
    } cases[] = {
        {"step", "9223372036854775807", "\"step\""},
        {"step", "-1", "\"step\""},
        {"batch", "9223372036854775807", "\"batch\""},
        {"epoch", "5", "past the run's 2 epochs"},
        {"schedule.base_lr", "inf", "\"schedule.base_lr\""},
        {"schedule.base_lr", "nan", "\"schedule.base_lr\""},
        {"schedule.base_lr", "1e300", "\"schedule.base_lr\""},
        {"schedule.eta_min", "-1", "\"schedule.eta_min\""},
        {"schedule.total_steps", "9223372036854775807", "\"schedule.total_steps\""},
        {"optimizer.lr", "-0.1", "\"optimizer.lr\""},
        {"optimizer.momentum", "2", "\"optimizer.momentum\""},
        {"optimizer.weight_decay", "inf", "\"optimizer.weight_decay\""},
        {"strategy", "abn+abn", "given twice"},
        {"strategy", "recompute+", "ends with '+'"},
        {"training", "0", "\"training\""},
        {"training", "yes", "\"training\""},
        {"num_classes", "100000000", "\"num_classes\""},
        {"in_channels", "100000000", "\"in_channels\""},
        {"augment", "2", "\"augment\""},
        {"accum", "0", "\"accum\""},
        {"seed", "-3", "\"seed\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(patch_metadata(good, bad, cases[i].key, cases[i].value));
        fr_status st = fr_state_read_info(bad, &info);
        if (st == FR_OK || !strstr(fr_last_error(), cases[i].needle) || !strstr(fr_last_error(), bad)) {
            fprintf(stderr, "    %s = %s: %s (%s)\n", cases[i].key, cases[i].value, fr_status_name(st),
                    st == FR_OK ? "accepted" : fr_last_error());
            fr_t_failed_now = 1;
        }
        /* and the load refuses it before touching the model */
        CHECK(fr_state_load(bad, r.m, r.opt, NULL, &r.st) != FR_OK);
    }
    /* the unpatched copy still loads: the patcher itself changes nothing else */
    CHECK(patch_metadata(good, bad, "data", "synthetic"));
    CHECK_OK(fr_state_load(bad, r.m, r.opt, NULL, &r.st));
    /* epoch == epochs is a finished run, not an error */
    CHECK(patch_metadata(good, bad, "epoch", "2"));
    CHECK_OK(fr_state_read_info(bad, &info));
    small_free(&r);
    fr_t_remove_tmpdir(dir);
}

static void test_nonfinite_weights_never_saved(void) {
    const char *dir = fr_t_make_tmpdir("nan");
    char path[600];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    small_run r;
    CHECK(small_init(&r));
    CHECK_OK(fr_state_save(path, r.m, r.opt, NULL, &r.st));
    size_t n_before, n_after;
    char *before = fr_t_read_file(path, &n_before);
    fr_tensor *w = r.m->params->items[0].tensor;
    ((float *)fr_data(w))[3] = NAN;
    CHECK_ERR(fr_state_save(path, r.m, r.opt, NULL, &r.st), FR_ERR_ARG, "NaN");
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, r.m->params->items[0].name);
    ((float *)fr_data(w))[3] = INFINITY;
    CHECK_ERR(fr_state_save(path, r.m, r.opt, NULL, &r.st), FR_ERR_ARG, "inf");
    char *after = fr_t_read_file(path, &n_after);
    CHECK(before && after && n_before == n_after && !memcmp(before, after, n_before));
    free(before);
    free(after);
    small_free(&r);
    fr_t_remove_tmpdir(dir);
}

static void test_fifo_refused_without_blocking(void) {
    const char *dir = fr_t_make_tmpdir("fifo");
    char path[600];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    CHECK(mkfifo(path, 0600) == 0);
    alarm(60); /* a blocking open ends the test program instead of the suite */
    fr_state_info info;
    CHECK_ERR(fr_state_read_info(path, &info), FR_ERR_IO, "not a readable regular file");
    CHECK(fr_st_open(path) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_IO, path);
    alarm(0);
    fr_t_remove_tmpdir(dir);
}

/* ---- temp files ---- */

static int count_temps(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -c '\\.tmp\\.'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1)
        n = -1;
    if (p)
        pclose(p);
    return n;
}

static void test_dead_writers_temps_removed(void) {
    const char *dir = fr_t_make_tmpdir("temps");
    char path[600], dead[700], live[700], other[700];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    waitpid(gone, NULL, 0);
    pid_t alive = fork();
    if (alive == 0) {
        pause();
        _exit(0);
    }
    snprintf(dead, sizeof dead, "%s.tmp.%ld", path, (long)gone);
    snprintf(live, sizeof live, "%s.tmp.%ld", path, (long)alive);
    snprintf(other, sizeof other, "%s/other.safetensors.tmp.%ld", dir, (long)gone);
    CHECK(fr_t_write_file(dead, "x", 1) && fr_t_write_file(live, "y", 1) && fr_t_write_file(other, "z", 1));
    small_run r;
    CHECK(small_init(&r));
    CHECK_OK(fr_state_save(path, r.m, r.opt, NULL, &r.st));
    CHECK(access(dead, F_OK) != 0);  /* its writer is gone: removed */
    CHECK(access(live, F_OK) == 0);  /* a live writer's: untouched */
    CHECK(access(other, F_OK) == 0); /* another file's temps are not this save's business */
    kill(alive, SIGKILL);
    waitpid(alive, NULL, 0);

    /* writers killed with SIGKILL at random moments of their saves */
    remove(live);
    remove(other);
    for (int round = 0; round < 8; round++) {
        pid_t w = fork();
        if (w == 0) {
            for (;;)
                (void)fr_state_save(path, r.m, r.opt, NULL, &r.st);
        }
        usleep(20000 + 7000 * round);
        kill(w, SIGKILL);
        waitpid(w, NULL, 0);
    }
    CHECK_OK(fr_state_save(path, r.m, r.opt, NULL, &r.st));
    CHECK(count_temps(dir) == 0);
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    small_free(&r);
    fr_t_remove_tmpdir(dir);
}

/* ---- the ledger's limit ---- */

static void test_memory_limit_step_retry_smaller(void) {
    small_run r;
    CHECK(small_init(&r));
    enum { B = 32, HW = 16 };
    fr_tensor *x = fr_empty(FR_CPU, FR_F32, 4, FR_SHAPE(B, 1, HW, HW), FR_TAG_DATA);
    fr_tensor *y = fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA);
    CHECK_NOTNULL(x);
    CHECK_NOTNULL(y);
    for (int i = 0; i < B * HW * HW; i++)
        ((float *)fr_data(x))[i] = (float)((i * 37) % 11) / 11.0f;
    for (int i = 0; i < B; i++)
        ((int32_t *)fr_data(y))[i] = i % 2;
    size_t base = fr_mem_total_current(FR_CPU);
    size_t limit = base + ((size_t)1 << 20);
    fr_mem_set_limit(FR_CPU, limit);
    fr_status st = fr_train_step(r.m, r.opt, NULL, x, y, 1, NULL, NULL, NULL);
    CHECK(st == FR_ERR_OOM);
    char lim[32];
    fr_mem_format_bytes(limit, lim, sizeof lim);
    CHECK(strstr(fr_last_error(), "limit") && strstr(fr_last_error(), lim) &&
          strstr(fr_last_error(), "in use"));
    bool names_tag = false;
    for (int t = 0; t < FR_TAG_COUNT; t++)
        names_tag |= strstr(fr_last_error(), fr_mem_tag_name((fr_mem_tag)t)) != NULL;
    CHECK(names_tag);
    /* nothing left behind by the failed step: gradients are not counted as
     * leaked, so compare after zeroing them */
    fr_optim_zero_grad(r.opt);
    CHECK(fr_mem_total_current(FR_CPU) == base);
    /* the caller retries smaller: a quarter of the batch fits */
    fr_tensor *xs = fr_narrow(x, 0, 0, 2), *ys = fr_narrow(y, 0, 0, 2);
    CHECK_OK(fr_train_step(r.m, r.opt, NULL, xs, ys, 1, NULL, NULL, NULL));
    fr_mem_set_limit(FR_CPU, 0);
    fr_release(xs);
    fr_release(ys);
    fr_release(x);
    fr_release(y);
    small_free(&r);
}

static void test_size_flag(void) {
    size_t v;
    CHECK_OK(fr_cli_size("--memory-limit", "512", &v));
    CHECK(v == 512);
    CHECK_OK(fr_cli_size("--memory-limit", "3K", &v));
    CHECK(v == 3072);
    CHECK_OK(fr_cli_size("--memory-limit", "2M", &v));
    CHECK(v == (size_t)2 << 20);
    CHECK_OK(fr_cli_size("--memory-limit", "1G", &v));
    CHECK(v == (size_t)1 << 30);
    const char *bad[] = {"", "0", "-1", "1.5G", "12Q", "G", "1GB", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_ERR(fr_cli_size("--memory-limit", bad[i], &v), FR_ERR_ARG, "--memory-limit");
}

/* ---- the programs ---- */

static void write_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* A tiny MNIST-layout set in dir; label 255 at record `bad_at` (or none). */
static void write_idx_set(const char *dir, const char *prefix, int n, int bad_at) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(path, "wb");
    write_be32(f, 0x803);
    write_be32(f, (uint32_t)n);
    write_be32(f, 8);
    write_be32(f, 8);
    for (int i = 0; i < n * 64; i++)
        fputc((i * 7 + i / 64 * 13) & 255, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(path, "wb");
    write_be32(f, 0x801);
    write_be32(f, (uint32_t)n);
    for (int i = 0; i < n; i++)
        fputc(i == bad_at ? 255 : i % 2, f);
    fclose(f);
}

static void test_programs_flag_errors_first(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *dir = fr_t_make_tmpdir("flags");
    char args[2048], missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-data", dir);
    /* a data folder that does not exist: the flag error wins, so it came first */
    snprintf(args, sizeof args, "--model resnet7 --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--model resnet7", "6n + 2");
    snprintf(args, sizeof args, "--strategy magic --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--strategy", "magic");
    snprintf(args, sizeof args, "--strategy abn+abn --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--strategy", "given twice");
    snprintf(args, sizeof args, "--save '' --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--save", "empty");
    snprintf(args, sizeof args, "--save %s/sub/run.safetensors --data cifar10:%s", missing, missing);
    fr_t_example_fails("train", args, "--save", "does not exist");
    snprintf(args, sizeof args, "--save %s --data cifar10:%s", dir, missing);
    fr_t_example_fails("train", args, "--save", "not a regular file");
    snprintf(args, sizeof args, "--memory-limit 5Q --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--memory-limit", "5Q");
    snprintf(args, sizeof args, "--data mnist:%s,classes=0", missing);
    fr_t_example_fails("train", args, "classes=", NULL);
    snprintf(args, sizeof args, "--data cifar10:%s", missing);
    fr_t_example_fails("train", args, missing, "is missing");
    snprintf(args, sizeof args, "--checkpoint x --strategy magic --data cifar10:%s", missing);
    fr_t_example_fails("validate", args, "--strategy", "magic");
    snprintf(args, sizeof args, "--checkpoint x --model resnet7 --data cifar10:%s", missing);
    fr_t_example_fails("validate", args, "--model resnet7", NULL);
    /* a strategy the precision cannot run (it failed at the first step,
     * or after validate's whole test pass) */
    snprintf(args, sizeof args, "--precision bf16 --strategy compress --data cifar10:%s", missing);
    fr_t_example_fails("train", args, "--strategy compress cannot be combined with --precision bf16",
                       NULL);
    snprintf(args, sizeof args, "--checkpoint x --precision f16 --strategy compress:4 --data "
             "cifar10:%s", missing);
    fr_t_example_fails("validate", args, "--precision f16", "f32 activations only");
    fr_t_example_fails("memreport", "--strategies magic", "--strategies", "magic");
    fr_t_example_fails("memreport", "--memory-limit 0", "--memory-limit", NULL);
    fr_t_remove_tmpdir(dir);
}

static void test_programs_fifo_and_labels(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *dir = fr_t_make_tmpdir("pfifo");
    char args[2048], fifo[700];
    snprintf(fifo, sizeof fifo, "%s/ckpt.safetensors", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(args, sizeof args, "--resume %s --save %s/out.safetensors", fifo, dir);
    fr_t_example_fails("train", args, fifo, "regular file");
    snprintf(args, sizeof args, "--checkpoint %s", fifo);
    fr_t_example_fails("validate", args, fifo, "regular file");
    /* a 255 among Fashion-MNIST-layout labels: an error naming file and record */
    write_idx_set(dir, "train", 32, 17);
    write_idx_set(dir, "t10k", 16, -1);
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 8 --epochs 1 --threads 1", dir);
    fr_t_example_fails("train", args, "train-labels-idx1-ubyte: record 17: label 255", "[0, 10)");
    /* ... which a custom class count can declare */
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s,classes=256 --batch 8 --epochs 1 "
             "--threads 1 --limit-test 8", dir);
    static char out[65536];
    int rc = fr_t_run_example("", "train", args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "256 classes"));
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    /* a test split of no images: refused naming its file, never "test
     * loss 0.0000 acc 0.00% (0 images)" */
    write_idx_set(dir, "train", 32, -1);
    write_idx_set(dir, "t10k", 0, -1);
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 8 --epochs 1 --threads 1", dir);
    fr_t_example_fails("train", args, "t10k-images-idx3-ubyte holds no images", "test split");
    fr_t_remove_tmpdir(dir);
}

static void test_programs_divergence_and_limits(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *dir = fr_t_make_tmpdir("diverge");
    char args[2048], save[700];
    snprintf(save, sizeof save, "%s/run.safetensors", dir);
    write_idx_set(dir, "train", 64, -1);
    write_idx_set(dir, "t10k", 16, -1);
    /* a learning rate that sends the weights to inf: an error, and no file
     * (the loss turns NaN: the NaN from the inf weights is not erased) */
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 8 --epochs 1 --threads 1 "
             "--lr 1e6 --momentum 0.99 --wd 0 --schedule constant --save %s", dir, save);
    fr_t_example_fails("train", args, "in f32 training", "no checkpoint is written");
    CHECK(access(save, F_OK) != 0);
    /* --memory-limit: the ledger's error, naming the limit */
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 8 --epochs 1 --threads 1 "
             "--memory-limit 64K", dir);
    fr_t_example_fails("train", args, "out of memory", "limit 64.00 KiB");
    fr_t_example_fails("memreport", "--model resnet8 --batch 8 --strategies plain --memory-limit 200K",
                "out of memory", "limit 200.00 KiB");
    fr_t_remove_tmpdir(dir);
}

/* Under an address-space limit too small for OpenBLAS's buffer, the
 * programs end with the ledger's out-of-memory error (or succeed on a
 * machine with more room) instead of spinning in blas_memory_alloc: frugal
 * probes the space before each of its threads' first GEMM (cpu/gemm.c).
 * OPENBLAS_NUM_THREADS=1: OpenBLAS's own worker threads, which its library
 * constructor starts before main (one per further core) and which frugal
 * never uses, take the same 128 MiB buffer as they start and retry forever
 * when it is refused; the process then prints its error and hangs at exit,
 * joining that thread (seen once in ~40 runs here, a gdb backtrace in
 * blas_thread_server -> blas_memory_alloc). frugal cannot reach a thread
 * that runs before it; docs/ARCHITECTURE.md ("Bad input") says so. ASan
 * reserves terabytes of shadow memory, so the case cannot run under it. */
static void test_programs_address_space_limit(void) {
#if defined(__SANITIZE_ADDRESS__)
    SKIP("ulimit -v cannot apply under AddressSanitizer");
#else
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *dir = fr_t_make_tmpdir("ulimit");
    char args[2048];
    static char out[65536];
    write_idx_set(dir, "train", 64, -1);
    write_idx_set(dir, "t10k", 16, -1);
    snprintf(args, sizeof args, "--model resnet8 --data mnist:%s --batch 8 --epochs 1 --threads 1", dir);
    const char *limit = "ulimit -v 300000; OPENBLAS_NUM_THREADS=1";
    int rc = fr_t_run_example(limit, "train", args, out, sizeof out);
    if (rc == 124 || (rc != 0 && !strstr(out, "out of memory"))) {
        fprintf(stderr, "    train under ulimit -v 300000: exit %d\n%s\n", rc, out);
        fr_t_failed_now = 1;
    }
    rc = fr_t_run_example(limit, "memreport", "--model resnet20 --batch 64 --strategies plain", out, sizeof out);
    if (rc == 124 || (rc != 0 && !strstr(out, "out of memory"))) {
        fprintf(stderr, "    memreport under ulimit -v 300000: exit %d\n%s\n", rc, out);
        fr_t_failed_now = 1;
    }
    fr_t_remove_tmpdir(dir);
#endif
}

int main(void) {
    RUN(test_checkpoint_metadata_validated);
    RUN(test_nonfinite_weights_never_saved);
    RUN(test_fifo_refused_without_blocking);
    RUN(test_dead_writers_temps_removed);
    RUN(test_memory_limit_step_retry_smaller);
    RUN(test_size_flag);
    RUN(test_programs_flag_errors_first);
    RUN(test_programs_fifo_and_labels);
    RUN(test_programs_divergence_and_limits);
    RUN(test_programs_address_space_limit);
    return TEST_SUMMARY();
}
