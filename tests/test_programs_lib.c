/* test_programs_lib.c: the train, validate and memreport programs as library
 * calls (programs/programs.h) on a model this program registers itself, the way a
 * user who writes a model in C runs the library's loop on it (issue 10):
 * train saves a checkpoint that names the model, validate rebuilds it from
 * the registry and evaluates it, memreport measures it under two
 * strategies and draws the SVG. Every call returns the program's exit
 * status; a model nobody registered is refused with a non-zero one. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testlib.h"

/* conv-BN-ReLU twice, a residual block, global pool, linear: small enough
 * for 8 x 8 images, with a block for checkpoint to cut around */
typedef struct {
    fr_module *conv, *bn;
} tiny_block;

static fr_tensor *tiny_block_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    tiny_block *b = fr_block_state(self);
    fr_tensor *y = fr_forward(b->conv, x, run);
    return fr_norm_add_take(b->bn, y, x, run);
}

static fr_model *tiny_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "stem", (fr_conv2d_opts){.in = in_channels, .out = 8});
    fr_norm_new(net, "stem_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    for (int i = 0; i < 2; i++) {
        fr_module *blk = fr_block_new(net, i ? "b1" : "b0", tiny_block_forward, sizeof(tiny_block));
        tiny_block *b = fr_block_state(blk);
        if (!b)
            break;
        b->conv = fr_conv2d_new(blk, "conv", (fr_conv2d_opts){.in = 8, .out = 8});
        b->bn = fr_norm_new(blk, "bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_RELU});
    }
    fr_global_avg_pool_new(net, "gap");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 8, .out = num_classes});
    return fr_model_finish(m);
}

/* An autoencoder: its output is the image again, not class logits, so it
 * brings its own loss (MSE against the input; nn/model.h: m->loss). */
static fr_tensor *reconstruction_loss(fr_model *m, fr_tensor *out, fr_tensor *x, fr_tensor *y) {
    (void)m, (void)y;
    return fr_mse_loss(out, x);
}

static fr_model *tiny_ae_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "enc", (fr_conv2d_opts){.in = in_channels, .out = 8});
    fr_norm_new(net, "enc_bn", (fr_norm_opts){.channels = 8, .act = FR_ACT_SILU});
    fr_conv2d_new(net, "dec", (fr_conv2d_opts){.in = 8, .out = in_channels, .bias = true});
    m = fr_model_finish(m);
    if (m)
        m->loss = reconstruction_loss;
    return m;
}

static void put_be32(FILE *f, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8)
        fputc((int)(v >> s) & 255, f);
}

/* An MNIST-layout IDX pair of n 8 x 8 images whose class sets the
 * brightness of one row, so a few steps learn something. */
static void write_idx(const char *dir, const char *prefix, int n) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(path, "wb");
    put_be32(f, 0x803), put_be32(f, (uint32_t)n), put_be32(f, 8), put_be32(f, 8);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < 64; p++)
            fputc(p / 8 == i % 8 ? 250 : (p * 7 + i) % 40, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(path, "wb");
    put_be32(f, 0x801), put_be32(f, (uint32_t)n);
    for (int i = 0; i < n; i++)
        fputc(i % 8, f);
    fclose(f);
}

static const char *dir;

static void test_train_validate_memreport_on_a_registered_model(void) {
    char line[2048], path[700];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(line, sizeof line,
             "train --model tiny --data mnist:%s --batch 16 --epochs 1 --lr 0.05 --threads 1 "
             "--strategy checkpoint --save %s/tiny.safetensors", dir, dir);
    CHECK(fr_t_run_main(fr_train_main, line) == 0);
    snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size > 0);
    /* the checkpoint names the model; validate rebuilds it from the registry */
    snprintf(line, sizeof line, "validate --checkpoint %s --data mnist:%s --batch 8 --threads 1", path, dir);
    CHECK(fr_t_run_main(fr_validate_main, line) == 0);
    snprintf(line, sizeof line,
             "memreport --model tiny --in-channels 1 --size 8 --batch 8 --steps 1 --strategies plain,checkpoint "
             "--svg %s/tiny.svg", dir);
    CHECK(fr_t_run_main(fr_memreport_main, line) == 0);
    snprintf(path, sizeof path, "%s/tiny.svg", dir);
    CHECK(stat(path, &sb) == 0 && sb.st_size > 0);
}

/* A program that registers its own model trains that model when --model is
 * not given (fr_train_main_model), not train's default resnet20; the
 * checkpoint records which. */
static int train_tiny(int argc, char **argv) { return fr_train_main_model(argc, argv, "tiny"); }

static void test_default_model_of_a_program(void) {
    char line[2048], path[700];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(path, sizeof path, "%s/default.safetensors", dir);
    snprintf(line, sizeof line, "train --data mnist:%s --batch 16 --epochs 1 --lr 0.05 --threads 1 --save %s",
             dir, path);
    CHECK(fr_t_run_main(train_tiny, line) == 0);
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(!strcmp(info.model, "tiny"));
}

/* A model whose output is not logits trains, validates and is measured
 * under the programs' own flags, with its loss and no accuracy ("n/a"). */
static void test_autoencoder_under_the_programs(void) {
    char line[2048], path[700];
    write_idx(dir, "train", 64);
    write_idx(dir, "t10k", 32);
    snprintf(line, sizeof line,
             "train --model tiny_ae --data mnist:%s --batch 16 --epochs 2 --lr 0.05 --threads 1 "
             "--strategy recompute --save %s/ae.safetensors", dir, dir);
    CHECK(fr_t_run_main(fr_train_main, line) == 0);
    snprintf(path, sizeof path, "%s/ae.safetensors", dir);
    snprintf(line, sizeof line, "validate --checkpoint %s --data mnist:%s --batch 8 --threads 1", path, dir);
    CHECK(fr_t_run_main(fr_validate_main, line) == 0);
    snprintf(line, sizeof line,
             "memreport --model tiny_ae --in-channels 1 --size 8 --batch 8 --steps 1 --strategies plain,recompute");
    CHECK(fr_t_run_main(fr_memreport_main, line) == 0);
}

/* The loss falls over a few steps of fr_train_step on one batch, and
 * fr_train_step counts no correct predictions for it. */
static void test_autoencoder_loss_falls(void) {
    fr_model *m = tiny_ae_create("tiny_ae", 1, 8, 3);
    CHECK_NOTNULL(m);
    if (!m)
        return;
    fr_optim *opt = fr_adam_new(m->params, fr_adam_defaults(0.01, 0));
    fr_tensor *x = fr_t_rand(FR_CPU, 4, FR_SHAPE(8, 1, 8, 8), 4);
    fr_tensor *y = fr_zeros(FR_CPU, FR_I32, 1, FR_SHAPE(8), FR_TAG_DATA);
    double first = 0, last = 0;
    int64_t correct = -1;
    for (int i = 0; i < 30; i++) {
        double l = 0;
        CHECK_OK(fr_train_step(m, opt, NULL, x, y, 1, &l, &correct, NULL));
        if (i == 0)
            first = l;
        last = l;
    }
    CHECK(last < 0.5 * first);
    CHECK(correct == 0);
    fr_release(x);
    fr_release(y);
    fr_optim_free(opt);
    fr_model_free(m);
}

static void test_unregistered_model_is_refused(void) {
    char line[1024];
    snprintf(line, sizeof line, "train --model tiny2 --data mnist:%s --epochs 1 --threads 1", dir);
    CHECK(fr_t_run_main(fr_train_main, line) != 0);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "unknown model \"tiny2\"");
    CHECK(strstr(fr_last_error(), "tiny (a test model)") != NULL); /* the registered usage is listed */
    fr_clear_error();
    CHECK(fr_t_run_main(fr_memreport_main, "memreport --model tiny2") != 0);
    CHECK(fr_t_run_main(fr_validate_main, "validate --bogus") != 0);
}

int main(void) {
    dir = fr_t_make_tmpdir("programs");
    CHECK_OK(fr_model_register("tiny", false, tiny_create, "tiny (a test model)"));
    RUN(test_train_validate_memreport_on_a_registered_model);
    RUN(test_unregistered_model_is_refused);
    RUN(test_default_model_of_a_program);
    CHECK_OK(fr_model_register("tiny_ae", false, tiny_ae_create, "tiny_ae (a test autoencoder)"));
    RUN(test_autoencoder_under_the_programs);
    RUN(test_autoencoder_loss_falls);
    fr_t_remove_tmpdir(dir);
    return TEST_SUMMARY();
}
