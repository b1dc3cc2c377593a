/* test_train.c: training end to end (nn/cli.h's step and evaluation, the
 * train and validate programs).
 *
 *  - a few steps of ResNet-8 on separable synthetic images lower the loss
 *    and fit the data;
 *  - gradient accumulation: a batch split into 2 (and an uneven 3)
 *    micro-batches gives the gradients and the update of the whole batch,
 *    to float round-off, for a model without BN (a linear classifier);
 *  - the built programs (found next to this test's binary: <build>/tests/..
 *    -> <build>/examples/train) train and validate on a tiny IDX data set,
 *    and exit non-zero with a clear message on a missing data directory, a
 *    bad flag value and an unknown flag. Skipped when the programs are not
 *    built (`make tests` alone builds no examples). */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "nn/checkpoint.h"
#include "nn/cli.h"
#include "nn/resnet.h"

static char build_dir[512];

/* ---- synthetic data ---- */

/* Class 0: a bright upper half, class 1: a bright lower half, plus noise. */
static void separable(uint8_t *px, int32_t *labels, int n, int hw) {
    uint32_t s = 99;
    for (int i = 0; i < n; i++) {
        labels[i] = i % 2;
        for (int y = 0; y < hw; y++)
            for (int x = 0; x < hw; x++) {
                s = s * 1664525u + 1013904223u;
                int bright = (y < hw / 2) == (labels[i] == 0);
                px[(i * hw + y) * hw + x] = (uint8_t)((bright ? 150 : 40) + (s >> 26));
            }
    }
}

static void test_loss_decreases(void) {
    enum { N = 64, HW = 8 };
    uint8_t px[N * HW * HW];
    int32_t labels[N];
    separable(px, labels, N, HW);
    fr_dataset *ds = fr_dataset_from_host("separable", N, 1, HW, HW, px, labels, 2);
    fr_model *m = fr_resnet_create("resnet8", 1, 2, 3);
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9});
    fr_loader_config lc = {.batch_size = 8, .shuffle = true, .drop_last = true, .seed = 1,
                           .aug = {.mean = {0.5f}, .std = {0.25f}}};
    fr_loader *ld = fr_loader_new(ds, &lc);
    CHECK_NOTNULL(ld);
    double first = 0, last = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        CHECK_OK(fr_loader_seek(ld, epoch, 0));
        for (int b = 0; b < N / 8; b++) {
            fr_tensor *x, *y;
            double loss = 0;
            CHECK_OK(fr_loader_next(ld, &x, &y));
            CHECK_OK(fr_train_step(m, opt, x, y, 1, &loss, NULL));
            fr_release(x);
            fr_release(y);
            if (epoch == 0 && b < 2)
                first += loss / 2;
            if (epoch == 2 && b >= N / 8 - 2)
                last += loss / 2;
        }
    }
    /* chance is ln 2 = 0.69; a separable set is fitted well within 24 steps */
    CHECK(first > 0.4);
    CHECK(last < 0.5 * first);
    lc.shuffle = false;
    fr_loader *eval = fr_loader_new(ds, &(fr_loader_config){.batch_size = 16, .aug = lc.aug});
    double acc = 0, loss = 0;
    int64_t seen = 0;
    CHECK_OK(fr_evaluate(m, eval, &loss, &acc, &seen));
    CHECK(seen == N && acc >= 0.9);
    fr_loader_free(eval);
    fr_loader_free(ld);
    fr_optim_free(opt);
    fr_model_free(m);
    fr_dataset_free(ds);
}

/* ---- accumulation ---- */

/* logits = flatten(x) W^T + b: no BN, so micro-batches are independent. */
static fr_tensor *linear_forward(fr_model *m, fr_tensor *x, bool training) {
    (void)training;
    fr_tensor *flat = fr_flatten(x);
    fr_tensor *y = flat ? fr_linear(flat, fr_params_get(m->params, "fc.weight"),
                                    fr_params_get(m->params, "fc.bias"))
                        : NULL;
    fr_release(flat);
    return y;
}

static fr_model *linear_model(int in, int classes) {
    fr_model *m = fr_model_alloc("linear", 1, classes);
    m->forward = linear_forward;
    fr_tensor *w =
        fr_params_new_tensor(m->params, "fc.weight", FR_PARAMETER, FR_F32, 2, FR_SHAPE(classes, in));
    fr_tensor *b = fr_params_new_tensor(m->params, "fc.bias", FR_PARAMETER, FR_F32, 1, FR_SHAPE(classes));
    fr_t_fill_rand(fr_data_f32(w), (size_t)fr_numel(w), 11);
    fr_t_fill_rand(fr_data_f32(b), (size_t)fr_numel(b), 12);
    return m;
}

static void test_accumulation_equals_full_batch(void) {
    enum { B = 8, IN = 12, K = 5 };
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(B, 1, 3, 4), 21);
    int32_t lab[B] = {0, 4, 2, 1, 3, 3, 0, 2};
    fr_tensor *y = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(B), FR_TAG_DATA, lab);
    fr_model *m = linear_model(IN, K);
    fr_tensor *w = fr_params_get(m->params, "fc.weight"), *b = fr_params_get(m->params, "fc.bias");
    double loss_full, loss_acc;
    int64_t hits_full, hits_acc;
    CHECK_OK(fr_train_step(m, NULL, x, y, 1, &loss_full, &hits_full));
    fr_tensor *dw = fr_retain(w->grad), *db = fr_retain(b->grad);
    fr_params_zero_grad(m->params);
    for (int accum = 2; accum <= 3; accum++) {
        /* 8 = 4 + 4, and 8 = 2 + 3 + 3: each part's loss weighted by its size */
        CHECK_OK(fr_train_step(m, NULL, x, y, accum, &loss_acc, &hits_acc));
        CHECK_CLOSE(loss_acc, loss_full, 1e-6);
        CHECK(hits_acc == hits_full);
        CHECK(fr_t_allclose_t(w->grad, dw, 1e-7, 1e-5, "dW accumulated"));
        CHECK(fr_t_allclose_t(b->grad, db, 1e-7, 1e-5, "db accumulated"));
        fr_params_zero_grad(m->params);
    }
    /* and the update: one SGD step from the same weights both ways */
    fr_model *m2 = linear_model(IN, K);
    fr_optim *o1 = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.5, .momentum = 0.9});
    fr_optim *o2 = fr_sgd_new(m2->params, (fr_sgd_options){.lr = 0.5, .momentum = 0.9});
    CHECK_OK(fr_train_step(m, o1, x, y, 1, NULL, NULL));
    CHECK_OK(fr_train_step(m2, o2, x, y, 2, NULL, NULL));
    CHECK(w->grad == NULL); /* the step zeroes the gradients */
    CHECK(fr_t_allclose_t(fr_params_get(m2->params, "fc.weight"), w, 1e-7, 1e-5, "W after a step"));
    CHECK(fr_t_allclose_t(fr_params_get(m2->params, "fc.bias"), b, 1e-7, 1e-5, "b after a step"));
    /* more micro-batches than images: one image each */
    CHECK_OK(fr_train_step(m2, NULL, x, y, 100, &loss_acc, NULL));
    fr_params_zero_grad(m2->params);
    CHECK_ERR(fr_train_step(m2, NULL, x, y, 0, NULL, NULL), FR_ERR_ARG, "accum 0");
    fr_optim_free(o1);
    fr_optim_free(o2);
    fr_model_free(m2);
    fr_release(dw);
    fr_release(db);
    fr_model_free(m);
    fr_release(x);
    fr_release(y);
}

/* ---- the programs ---- */

static void write_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* IDX files (uncompressed) of n separable 8x8 images under dir/<prefix>-*. */
static void write_idx(const char *dir, const char *prefix, int n) {
    enum { HW = 8 };
    uint8_t *px = malloc((size_t)n * HW * HW);
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    separable(px, lab, n, HW);
    char path[600];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(path, "wb");
    write_be32(f, 0x803);
    write_be32(f, (uint32_t)n);
    write_be32(f, HW);
    write_be32(f, HW);
    fwrite(px, 1, (size_t)n * HW * HW, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(path, "wb");
    write_be32(f, 0x801);
    write_be32(f, (uint32_t)n);
    for (int i = 0; i < n; i++)
        fputc(lab[i], f);
    fclose(f);
    free(px);
    free(lab);
}

/* Runs `<build>/examples/<prog> args`, returning its exit code and output. */
static int run_prog(const char *prog, const char *args, char *out, size_t len) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/examples/%s %s 2>&1", build_dir, prog, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, len - 1, p) : 0;
    out[n] = '\0';
    int rc = p ? pclose(p) : -1;
    return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static bool programs_built(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/examples/train", build_dir);
    bool train = access(path, X_OK) == 0;
    snprintf(path, sizeof path, "%s/examples/validate", build_dir);
    return train && access(path, X_OK) == 0;
}

static void expect_output(const char *prog, const char *args, int want_rc, const char *needle) {
    static char out[65536];
    int rc = run_prog(prog, args, out, sizeof out);
    if ((want_rc == 0) != (rc == 0) || !strstr(out, needle)) {
        fprintf(stderr, "    %s %s: exit %d (wanted %s), output lacks \"%s\":\n%s\n", prog, args, rc,
                want_rc ? "non-zero" : "0", needle, out);
        fr_t_failed_now = 1;
    }
}

/* Whether two safetensors files hold the same names with the same bytes. */
static bool same_tensors(const char *a_path, const char *b_path) {
    fr_st_file *a = fr_st_open(a_path), *b = fr_st_open(b_path);
    bool same = a && b && fr_st_count(a) == fr_st_count(b);
    for (int i = 0; same && i < fr_st_count(a); i++) {
        const char *name = fr_st_name(a, i);
        fr_tensor *x = fr_st_get(a, name, FR_CPU, FR_TAG_WORKSPACE);
        fr_tensor *y = fr_st_find(b, name) >= 0 ? fr_st_get(b, name, FR_CPU, FR_TAG_WORKSPACE) : NULL;
        same = x && y && fr_nbytes(x) == fr_nbytes(y) && !memcmp(fr_data(x), fr_data(y), fr_nbytes(x));
        if (!same)
            fprintf(stderr, "    %s differs between %s and %s\n", name, a_path, b_path);
        fr_release(x);
        fr_release(y);
    }
    fr_st_close(a);
    fr_st_close(b);
    return same;
}

static void test_programs(void) {
    if (!programs_built())
        SKIP("examples/train or validate not built");
    const char *dir = fr_t_make_tmpdir("train");
    char args[2048];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 2 --lr 0.05 --threads 1 "
             "--save %s/run.safetensors", dir, dir);
    expect_output("train", args, 0, "epoch 2/2: train loss");
    snprintf(args, sizeof args, "--resume %s/run.safetensors --data mnist:%s --threads 1", dir, dir);
    expect_output("train", args, 0, "2 of 2 epochs done"); /* nothing left to train */
    /* the same run stopped after one epoch and resumed: the same file, tensor for tensor */
    snprintf(args, sizeof args,
             "--model resnet8 --data mnist:%s --batch 16 --epochs 2 --lr 0.05 --threads 1 --stop-after 1 "
             "--save %s/half.safetensors", dir, dir);
    expect_output("train", args, 0, "epoch 1/2: train loss");
    snprintf(args, sizeof args, "--resume %s/half.safetensors --threads 1 --data mnist:%s", dir, dir);
    expect_output("train", args, 0, "epoch 2/2: train loss");
    char whole[600], resumed[600];
    snprintf(whole, sizeof whole, "%s/run.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/half.safetensors", dir);
    CHECK(same_tensors(whole, resumed));
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --data mnist:%s --batch 8 --threads 1", dir,
             dir);
    expect_output("validate", args, 0, "accuracy");
    expect_output("validate", args, 0, "one training step (fwd+bwd), plain");

    /* errors: the library's message, non-zero exit */
    expect_output("train", "--data fashion-mnist:/nonexistent/fm --epochs 1", 1,
                  "no train-images-idx3-ubyte or train-images-idx3-ubyte.gz in /nonexistent/fm");
    expect_output("train", "--data cifar10:/nonexistent/c10", 1, "/nonexistent/c10");
    expect_output("train", "--batch many", 1, "--batch: \"many\" is not an integer");
    expect_output("train", "--lr -1", 1, "--lr: \"-1\" is not a number");
    expect_output("train", "--schedule linear", 1,
                  "--schedule: \"linear\" is not one of cosine, step, constant");
    expect_output("train", "--strategy fast", 1, "unknown memory strategy");
    expect_output("train", "--model vgg16", 1, "unknown model \"vgg16\"");
    expect_output("train", "--frobnicate", 1, "unknown flag \"--frobnicate\"");
    expect_output("validate", "--frobnicate", 1, "unknown flag \"--frobnicate\"");
    expect_output("train", "--data", 1, "--data needs a value");
    snprintf(args, sizeof args, "--resume %s/run.safetensors --lr 0.5", dir);
    expect_output("train", args, 1, "--lr cannot be combined with --resume");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --data mnist:/nonexistent/m", dir);
    expect_output("validate", args, 1,
                  "no t10k-images-idx3-ubyte or t10k-images-idx3-ubyte.gz in /nonexistent/m");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --batch 0", dir);
    expect_output("validate", args, 1, "--batch: \"0\" is not an integer in [1,");
    snprintf(args, sizeof args, "--checkpoint %s/missing.safetensors", dir);
    expect_output("validate", args, 1, "missing.safetensors");
    snprintf(args, sizeof args, "--checkpoint %s/run.safetensors --model resnet14 --data mnist:%s", dir, dir);
    expect_output("validate", args, 1, "holds model resnet8, not resnet14");
    expect_output("validate", "--data mnist:/tmp", 1, "--checkpoint PATH is required");
    fr_t_remove_tmpdir(dir);
}

int main(int argc, char **argv) {
    (void)argc;
    /* <build>/tests/test_train -> <build> */
    char self[512];
    snprintf(self, sizeof self, "%s", argv[0]);
    snprintf(build_dir, sizeof build_dir, "%s", dirname(dirname(self)));
    RUN(test_loss_decreases);
    RUN(test_accumulation_equals_full_batch);
    RUN(test_programs);
    return TEST_SUMMARY();
}
