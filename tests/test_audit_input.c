/* test_audit_input.c: the second outside audit's bad-input findings
 * (issue 25) about names, flags, checkpoint fields and safetensors
 * metadata, each as a case that failed before its fix:
 *
 *  - a model name is bounded before anything is allocated: a huge DenseNet
 *    or a huge class count is refused with the ceiling in the message and
 *    the ledger untouched, on the command line and in a checkpoint;
 *  - sizes and integers refuse blanks, signs and wrap-around (" -1M" was
 *    16 EiB, "checkpoint:4294967297" was checkpoint:1);
 *  - a flag given twice, contradicting flags, --accum above --batch, and
 *    validate --strategy abn on weights trained without it are refused;
 *  - a negative optimizer step or an infinite momentum buffer in a
 *    checkpoint is refused naming the tensor;
 *  - __metadata__ values that are not strings and keys frugal does not read
 *    are ignored with one note; {"format": "pt"} loads; a field frugal needs
 *    that is not a string is named with what was expected. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "train/state.h"
#include "data/image.h"
#include "programs/cli_impl.h"
#include "models/registry.h"


/* ---- model names ---- */

static void test_model_names_bounded(void) {
    size_t before = fr_mem_total_current(FR_CPU);
    fr_mem_reset_peak();
    static const struct {
        const char *name;
        int in, classes;
        const char *needle;
    } cases[] = {
        {"densenet-bc-9994-k4096", 3, 10, "268435456"},
        {"densenet-bc-9994", 3, 10, "FR_MODEL_MAX_PARAMS"},
        {"densenet-bc-1000-k400", 3, 10, "ceiling"},
        {"resnet20", 3, 100000000, "parameters"},
        {"densenet-bc-100-k4096", 3, 10, "ceiling"},
        {"resnet20", 100000000, 10, "parameters"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fr_model *m = fr_model_create(cases[i].name, cases[i].in, cases[i].classes, 1);
        CHECK(!m);
        CHECK_ERR(fr_last_status(), FR_ERR_ARG, cases[i].needle);
        CHECK_ERR(fr_last_status(), FR_ERR_ARG, cases[i].name);
        fr_model_free(m);
    }
    /* refused from the numbers alone: the ledger saw no byte */
    CHECK(fr_mem_total_peak(FR_CPU) == before);
    /* the same check where a checkpoint's model name is checked */
    CHECK_ERR(fr_cli_model_check("--checkpoint: the checkpoint's model", "densenet-bc-9994-k4096"),
              FR_ERR_ARG, "ceiling");
    /* the usual models stay well inside */
    const char *fine[] = {"resnet20", "preresnet164", "densenet-bc-100", "densenet-bc-40-k24"};
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
        fr_model *m = fr_model_create(fine[i], 3, 100, 1);
        CHECK_NOTNULL(m);
        fr_model_free(m);
    }
}

/* ---- flag values ---- */

static void test_sizes_and_integers_strict(void) {
    size_t sz;
    const char *bad_sizes[] = {" -1M", "-1M", "+1M", " 1M", "1M ", "1 M", "\t8", "0x10", "1e3", "-0",
                               "18446744073709551616", "17179869184G"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof *bad_sizes; i++)
        CHECK_ERR(fr_cli_size("--memory-limit", bad_sizes[i], &sz), FR_ERR_ARG, "--memory-limit");
    CHECK_OK(fr_cli_size("--memory-limit", "16G", &sz));
    CHECK(sz == (size_t)16 << 30);
    int64_t v;
    const char *bad_ints[] = {" 5", "+5", "5 ", "-0", "-5", "5x", "", "0x5", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_ints / sizeof *bad_ints; i++)
        CHECK_ERR(fr_cli_int("--batch", bad_ints[i], 0, INT64_MAX, &v), FR_ERR_ARG, "--batch");
    CHECK_OK(fr_cli_int("--offset", "-5", -10, 10, &v));
    CHECK(v == -5);
    double d;
    const char *bad_doubles[] = {" 0.1", "0.1 ", "nan", "inf", "0x1p-3", "+0.1", ""};
    for (size_t i = 0; i < sizeof bad_doubles / sizeof *bad_doubles; i++)
        CHECK_ERR(fr_cli_double("--lr", bad_doubles[i], 0, 10, &d), FR_ERR_ARG, "--lr");
    CHECK_OK(fr_cli_double("--lr", "1e-3", 0, 10, &d));
    CHECK(d == 1e-3);
    CHECK_OK(fr_cli_double("--lr", ".5", 0, 10, &d));
    CHECK(d == 0.5);
}

static void test_checkpoint_k_strict(void) {
    fr_strategy s;
    const char *bad[] = {"checkpoint:4294967297", "checkpoint:2147483648", "checkpoint:+3",
                         "checkpoint: 3", "checkpoint:0", "checkpoint:-1", "checkpoint:3 ",
                         "recompute+checkpoint:4294967297"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_ERR(fr_strategy_parse(bad[i], &s), FR_ERR_ARG, "checkpoint");
    CHECK_OK(fr_strategy_parse("recompute+checkpoint:2147483647", &s));
    CHECK(s.checkpoint == 2147483647 && s.recompute);
}

/* ---- the programs ---- */


static void test_programs_flags(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    /* a data folder that does not exist: each flag error comes before it is read */
    const char *d = "--data cifar10:/nonexistent-frugal-test";
    char args[1024];
    snprintf(args, sizeof args, "--batch 8 --batch 16 %s", d);
    fr_t_example_fails("train", args, "--batch is given twice", "\"--batch 8\", then \"--batch 16\"");
    snprintf(args, sizeof args, "--nesterov --nesterov %s", d);
    fr_t_example_fails("train", args, "--nesterov is given twice", NULL);
    snprintf(args, sizeof args, "--augment --no-augment %s", d);
    fr_t_example_fails("train", args, "--augment conflicts with --no-augment", NULL);
    snprintf(args, sizeof args, "--accum 4 --memory-budget 64M %s", d);
    fr_t_example_fails("train", args, "--accum 4 conflicts with --memory-budget 64M", NULL);
    snprintf(args, sizeof args, "--optimizer adam --momentum 0.5 %s", d);
    fr_t_example_fails("train", args, "--optimizer adam conflicts with --momentum 0.5", NULL);
    snprintf(args, sizeof args, "--batch 8 --accum 9 %s", d);
    fr_t_example_fails("train", args, "--accum 9 is larger than --batch 8", NULL);
    snprintf(args, sizeof args, "--memory-limit ' -1M' %s", d);
    fr_t_example_fails("train", args, "--memory-limit", "\" -1M\" is not a size");
    snprintf(args, sizeof args, "--strategy checkpoint:4294967297 %s", d);
    fr_t_example_fails("train", args, "--strategy", "checkpoint:4294967297");
    snprintf(args, sizeof args, "--model densenet-bc-9994-k4096 %s", d);
    fr_t_example_fails("train", args, "densenet-bc-9994-k4096", "ceiling");
    snprintf(args, sizeof args, "--checkpoint a --checkpoint b %s", d);
    fr_t_example_fails("validate", args, "--checkpoint is given twice", NULL);
    fr_t_example_fails("memreport", "--batch 1 --batch 2", "--batch is given twice", NULL);
    fr_t_example_fails("memreport", "--batch ' 5'", "--batch", "\" 5\"");
    fr_t_example_fails("memreport", "--seed -1", "--seed", NULL);
    fr_t_example_fails("memreport", "--model densenet-bc-9994-k4096", "densenet-bc-9994-k4096", "ceiling");
}

/* ---- files ---- */

/* Rewrites the header of safetensors file `path`: the first occurrence of
 * `from` becomes `to` (the length prefix follows; data offsets are relative
 * to the header's end, so they stay valid), and the checksum field goes
 * (fr_t_st_unseal), which would refuse any edit first. */
static bool patch_header(const char *path, const char *from, const char *to) {
    size_t n;
    char *b = fr_t_read_file(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; b && n >= 8 && i >= 0; i--)
        hlen = hlen << 8 | (unsigned char)b[i];
    char *hdr = b ? b + 8 : NULL;
    char *at = hdr ? memmem(hdr, hlen, from, strlen(from)) : NULL;
    if (!at) {
        free(b);
        return false;
    }
    size_t new_hlen = hlen - strlen(from) + strlen(to);
    char *out = malloc(n + strlen(to) + 8);
    for (int i = 0; i < 8; i++)
        out[i] = (char)(new_hlen >> (8 * i));
    size_t o = 8, head = (size_t)(at - hdr);
    memcpy(out + o, hdr, head);
    o += head;
    memcpy(out + o, to, strlen(to));
    o += strlen(to);
    size_t rest = n - 8 - head - strlen(from);
    memcpy(out + o, at + strlen(from), rest);
    bool ok = fr_t_write_file(path, out, o + rest) && fr_t_st_unseal(path);
    free(out);
    free(b);
    return ok;
}

/* Replaces the 4 bytes of float `from` (once, in the data) by `to`. */
static bool patch_float(const char *path, float from, float to) {
    size_t n;
    char *b = fr_t_read_file(path, &n);
    char *at = b ? memmem(b, n, &from, sizeof from) : NULL;
    if (at)
        memcpy(at, &to, sizeof to);
    bool ok = at && fr_t_write_file(path, b, n);
    free(b);
    return ok;
}

static void test_checkpoint_optimizer_state_checked(void) {
    const char *dir = fr_t_make_tmpdir("optstate");
    char path[600];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    fr_model *m = fr_model_create("resnet8", 1, 2, 5);
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
    fr_train_state ts = {.seed = 5, .batch_size = 4, .accum = 1, .epochs = 2, .epoch = 1, .step = 3};
    snprintf(ts.data, sizeof ts.data, "synthetic");
    CHECK_OK(fr_schedule_cosine(&ts.schedule, 0.1, 6, 0.0));
    struct {
        fr_model *m;
        fr_optim *opt;
        fr_train_state st;
    } r = {m, opt, ts};
    const char *p0 = r.m->params->items[0].name;
    /* a momentum buffer with one recognisable value, then made infinite in the file */
    r.opt->state[0][0] = fr_zeros_like(r.m->params->items[0].tensor, FR_TAG_OPTIM);
    fr_data_f32(r.opt->state[0][0])[5] = 12345.5f;
    r.opt->steps[0] = 1;
    CHECK_OK(fr_state_save(path, r.m, r.opt, NULL, &r.st));
    CHECK_OK(fr_state_load(path, r.m, r.opt, NULL, &r.st));
    CHECK(patch_float(path, 12345.5f, INFINITY));
    /* as saved, the file's checksum refuses the edit, naming the tensor ... */
    fr_status st = fr_state_load(path, r.m, r.opt, NULL, &r.st);
    CHECK_ERR(st, FR_ERR_FORMAT, "its bytes do not match their checksum");
    CHECK_ERR(st, FR_ERR_FORMAT, "optim.momentum_buffer.");
    /* ... and without one (an older file) the value check does */
    CHECK(fr_t_st_unseal(path));
    st = fr_state_load(path, r.m, r.opt, NULL, &r.st);
    CHECK_ERR(st, FR_ERR_FORMAT, "optim.momentum_buffer.");
    CHECK_ERR(st, FR_ERR_FORMAT, p0);
    CHECK_ERR(st, FR_ERR_FORMAT, "inf at element 5");
    /* a negative step count */
    r.opt->steps[0] = -7;
    CHECK_OK(fr_state_save(path, r.m, r.opt, NULL, &r.st));
    st = fr_state_load(path, r.m, r.opt, NULL, &r.st);
    CHECK_ERR(st, FR_ERR_FORMAT, "optim.step.");
    CHECK_ERR(st, FR_ERR_FORMAT, "holds -7");
    fr_optim_free(opt);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- safetensors __metadata__ ---- */

static void test_metadata_other_values_ignored(void) {
    const char *dir = fr_t_make_tmpdir("meta25");
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    fr_model *m = fr_model_create("resnet8", 1, 2, 3);
    /* a plain weights file as PyTorch / Hugging Face write it, plus other
     * tools' keys of every JSON kind */
    fr_st_writer *w = fr_st_writer_new();
    for (int i = 0; i < m->params->count; i++)
        CHECK_OK(fr_st_writer_add(w, m->params->items[i].name, m->params->items[i].tensor));
    CHECK_OK(fr_st_writer_add_metadata(w, "format", "pt"));
    CHECK_OK(fr_st_writer_add_metadata(w, "k_null", "x"));
    CHECK_OK(fr_st_writer_add_metadata(w, "k_true", "x"));
    CHECK_OK(fr_st_writer_add_metadata(w, "k_num", "x"));
    CHECK_OK(fr_st_writer_add_metadata(w, "k_obj", "x"));
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);
    CHECK(patch_header(path, "\"k_null\":\"x\"", "\"k_null\":null"));
    CHECK(patch_header(path, "\"k_true\":\"x\"", "\"k_true\":true"));
    CHECK(patch_header(path, "\"k_num\":\"x\"", "\"k_num\":-1.5e3"));
    CHECK(patch_header(path, "\"k_obj\":\"x\"", "\"k_obj\":{\"a\":[1,false]}"));
    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);
    if (f) {
        CHECK(fr_st_metadata_count(f) == 5);
        CHECK(!fr_st_metadata(f, "k_null") && !strcmp(fr_st_metadata_kind(f, "k_null"), "null"));
        CHECK(!strcmp(fr_st_metadata_kind(f, "k_true"), "a boolean"));
        CHECK(!strcmp(fr_st_metadata_kind(f, "k_num"), "a number"));
        CHECK(!strcmp(fr_st_metadata_kind(f, "k_obj"), "an object"));
        CHECK(!strcmp(fr_st_metadata(f, "format"), "pt"));
        fr_st_close(f);
    }
    /* {"format": "pt"}: a weights file, and it loads */
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(!info.is_training && !info.model[0]);
    fr_model *m2 = fr_model_create("resnet8", 1, 2, 4);
    CHECK_OK(fr_state_load(path, m2, NULL, NULL, NULL));
    CHECK(!memcmp(fr_data(m2->params->items[0].tensor), fr_data(m->params->items[0].tensor),
                  fr_nbytes(m->params->items[0].tensor)));
    fr_model_free(m2);

    /* a frugal checkpoint: an unknown key is ignored, a needed one that is not
     * a string is named with what was expected */
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    CHECK_OK(fr_state_save(path, m, NULL, NULL, NULL));
    CHECK(patch_header(path, "\"format_version\"", "\"hub.note\":null,\"format_version\""));
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(!strcmp(info.model, "resnet8"));
    CHECK(patch_header(path, "\"num_classes\":\"2\"", "\"num_classes\":2"));
    CHECK_ERR(fr_state_read_info(path, &info), FR_ERR_FORMAT,
              "metadata field \"num_classes\" is a number, expected a JSON string");
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

static void test_metadata_note_printed_once(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *dir = fr_t_make_tmpdir("meta25p");
    char path[600], args[1400];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    fr_model *m = fr_model_create("resnet8", 1, 2, 3);
    CHECK_OK(fr_state_save(path, m, NULL, NULL, NULL));
    fr_model_free(m);
    CHECK(patch_header(path, "\"format_version\"", "\"hub.flag\":true,\"format_version\""));
    /* a data set that is not there: validate reads the checkpoint's metadata, then fails on it */
    snprintf(args, sizeof args, "--checkpoint %s --data mnist:%s/none", path, dir);
    static char out[65536];
    int rc = fr_t_run_example("", "validate", args, out, sizeof out);
    char *first = strstr(out, "hub.flag");
    CHECK(rc != 0 && first && strstr(out, "ignoring 1 __metadata__ key") && strstr(out, "(a boolean)"));
    CHECK(!first || !strstr(first + 1, "hub.flag"));
    if (!first)
        fprintf(stderr, "%s\n", out);
    fr_t_remove_tmpdir(dir);
}

int main(void) {
    RUN(test_model_names_bounded);
    RUN(test_sizes_and_integers_strict);
    RUN(test_checkpoint_k_strict);
    RUN(test_programs_flags);
    RUN(test_checkpoint_optimizer_state_checked);
    RUN(test_metadata_other_values_ignored);
    RUN(test_metadata_note_printed_once);
    return TEST_SUMMARY();
}
