/* test_state.c: training checkpoints (train/state.h).
 *
 * Exact resume: N steps, save, load into a fresh model and optimizer, M more
 * steps gives bit for bit the weights, buffers and optimizer state of N + M
 * steps in one run (ResNet-8 on 8x8 synthetic images, batch 4, shuffling and
 * augmentation on, prefetching loader, crossing an epoch boundary). Then the
 * failure paths: an interrupted save leaves the previous file; a file of
 * another model, a wrong shape, dtype, a missing or unknown tensor, and
 * malformed metadata are refused with the file and the tensor or field
 * named, and the model is left exactly as it was; so are a byte changed
 * after the save (the file's checksums: a weight's bit, a buffer's, the
 * optimizer's, a metadata value, the field itself; without the field, as an
 * older frugal wrote it, the file loads as before) and BatchNorm statistics
 * no training produces (a negative or non-finite running variance, a
 * non-finite running mean, a negative batch count).
 *
 * Mixed precision (amp.* metadata): the precision and the loss scaler's
 * state round-trip exactly (the scale bit for bit); a file without them (an
 * older one) loads as f32 with no scaler state; a precision mismatch names
 * both precisions; malformed amp fields are refused naming the field. Exact
 * resume also runs with the loss scaler (the f32 guard), and in f16 and bf16
 * with a short growth interval so the scale moves (those need the
 * half-precision ops). */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "testlib.h"
#include "train/state.h"
#include "programs/cli_impl.h"
#include "models/resnet.h"

#define N_IMG 24
#define IMG_C 3
#define IMG_HW 8
#define CLASSES 3
#define BATCH 4

/* ---- a tiny training run ---- */

static fr_dataset *make_data(void) {
    uint8_t px[N_IMG * IMG_C * IMG_HW * IMG_HW];
    int32_t labels[N_IMG];
    uint32_t s = 12345;
    for (size_t i = 0; i < sizeof px; i++) {
        s = s * 1664525u + 1013904223u;
        px[i] = (uint8_t)(s >> 24);
    }
    for (int i = 0; i < N_IMG; i++)
        labels[i] = i % CLASSES;
    return fr_dataset_from_host("synthetic", N_IMG, IMG_C, IMG_HW, IMG_HW, px, labels, CLASSES);
}

typedef struct {
    fr_model *m;
    fr_optim *opt;
    fr_loader *ld;
    fr_loss_scaler scaler;
    fr_train_state st;
} trainer;

/* Growth interval of the f16 runs: short, so the scale grows (and backs
 * off) within the run and the tracker matters at the resume. */
#define SHORT_INTERVAL 3

static bool trainer_init(trainer *t, const fr_dataset *ds, uint64_t model_seed, fr_optim_kind kind,
                         fr_dtype precision) {
    memset(t, 0, sizeof *t);
    t->m = fr_resnet_create("resnet8", IMG_C, CLASSES, model_seed);
    if (!t->m || fr_loss_scaler_init(&t->scaler, precision) != FR_OK)
        return false;
    t->m->cfg.precision = precision;
    if (precision == FR_F16)
        t->scaler.growth_interval = SHORT_INTERVAL;
    if (kind == FR_OPTIM_SGD)
        t->opt = fr_sgd_new(t->m->params, (fr_sgd_options){.lr = 0.05, .momentum = 0.9,
                                                            .weight_decay = 5e-4, .nesterov = true});
    else
        t->opt = fr_adamw_new(t->m->params, fr_adam_defaults(0.01, 1e-2));
    fr_loader_config lc = {.batch_size = BATCH, .shuffle = true, .drop_last = true, .seed = 7,
                           .aug = {.pad = 1, .flip = true, .mean = {0.5f, 0.5f, 0.5f},
                                   .std = {0.25f, 0.25f, 0.25f}},
                           .prefetch = true};
    t->ld = fr_loader_new(ds, &lc);
    t->st = (fr_train_state){.seed = 7, .batch_size = BATCH, .accum = 1, .epochs = 2, .augment = true};
    snprintf(t->st.data, sizeof t->st.data, "synthetic");
    fr_status s = fr_schedule_cosine(&t->st.schedule, t->opt ? t->opt->lr : 0, 12, 0.0);
    if (s == FR_OK)
        s = fr_schedule_warmup(&t->st.schedule, 2, 0.1);
    return t->opt && t->ld && s == FR_OK;
}

static void trainer_free(trainer *t) {
    fr_loader_free(t->ld);
    fr_optim_free(t->opt);
    fr_model_free(t->m);
}

/* `steps` optimizer steps from t->st's position, the way examples/train
 * walks epochs. */
static fr_status train_steps(trainer *t, int steps) {
    int64_t per_epoch = fr_loader_num_batches(t->ld);
    FR_TRY(fr_loader_seek(t->ld, t->st.epoch, t->st.batch));
    for (int i = 0; i < steps; i++) {
        if (t->st.batch == per_epoch) {
            t->st.epoch++;
            t->st.batch = 0;
            FR_TRY(fr_loader_seek(t->ld, t->st.epoch, 0));
        }
        fr_tensor *x, *y;
        FR_TRY(fr_loader_next(t->ld, &x, &y));
        t->opt->lr = fr_schedule_lr(&t->st.schedule, t->st.step);
        fr_status s = fr_train_step(t->m, t->opt, &t->scaler, x, y, 1, NULL, NULL, NULL);
        fr_release(x);
        fr_release(y);
        FR_TRY(s);
        t->st.batch++;
        t->st.step++;
    }
    return FR_OK;
}

/* ---- comparing bits ---- */

static bool same_bits(const fr_tensor *a, const fr_tensor *b) {
    return a && b && fr_nbytes(a) == fr_nbytes(b) && !memcmp(fr_data(a), fr_data(b), fr_nbytes(a));
}

static bool models_equal(const fr_model *a, const fr_model *b) {
    if (a->params->count != b->params->count)
        return false;
    for (int i = 0; i < a->params->count; i++)
        if (!same_bits(a->params->items[i].tensor, b->params->items[i].tensor)) {
            fprintf(stderr, "    tensor %s differs\n", a->params->items[i].name);
            return false;
        }
    return true;
}

static bool optims_equal(const fr_optim *a, const fr_optim *b) {
    for (int i = 0; i < a->n; i++) {
        if (a->steps[i] != b->steps[i])
            return false;
        for (int s = 0; s < 2; s++)
            if ((a->state[s][i] || b->state[s][i]) && !same_bits(a->state[s][i], b->state[s][i])) {
                fprintf(stderr, "    optimizer state %d of %s differs\n", s, a->params->items[i].name);
                return false;
            }
    }
    return true;
}

/* A deep copy of a model's tensors (a second model with the same
 * architecture whose values are copied in). */
static fr_model *snapshot(const fr_model *m) {
    fr_model *c = fr_resnet_create(m->name, m->in_channels, m->num_classes, 0);
    for (int i = 0; c && i < m->params->count; i++)
        fr_copy_(c->params->items[i].tensor, m->params->items[i].tensor);
    return c;
}

/* Field by field (exact: the file keeps 17 digits), not memcmp: padding. */
static bool same_schedule(const fr_schedule *a, const fr_schedule *b) {
    bool same = a->kind == b->kind && a->base_lr == b->base_lr && a->n_milestones == b->n_milestones &&
                a->gamma == b->gamma && a->total_steps == b->total_steps && a->eta_min == b->eta_min &&
                a->warmup_steps == b->warmup_steps && a->warmup_start_factor == b->warmup_start_factor;
    for (int i = 0; same && i < a->n_milestones; i++)
        same = a->milestones[i] == b->milestones[i];
    return same;
}

static bool same_scaler(const fr_loss_scaler *a, const fr_loss_scaler *b) {
    fr_loss_scaler_state x = fr_loss_scaler_get_state(a), y = fr_loss_scaler_get_state(b);
    return a->dtype == b->dtype && !memcmp(&x.scale, &y.scale, sizeof x.scale) &&
           x.growth_tracker == y.growth_tracker && x.skipped == y.skipped;
}

/* ---- exact resume ---- */

static void resume_case(fr_optim_kind kind, fr_dtype precision) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    fr_dataset *ds = make_data();
    CHECK_NOTNULL(ds);
    trainer whole, first, second;
    /* 10 steps = one epoch of 6 and 4 of the next */
    CHECK(trainer_init(&whole, ds, 1, kind, precision));
    CHECK_OK(train_steps(&whole, 10));
    CHECK(trainer_init(&first, ds, 1, kind, precision));
    CHECK_OK(train_steps(&first, 4));
    CHECK_OK(fr_state_save(path, first.m, first.opt, &first.scaler, &first.st));
    /* a fresh run started from other weights: the load must replace them all */
    CHECK(trainer_init(&second, ds, 99, kind, precision));
    fr_train_state loaded;
    CHECK_OK(fr_state_load(path, second.m, second.opt, &second.scaler, &loaded));
    CHECK(loaded.precision == precision && loaded.has_scaler);
    CHECK(same_scaler(&first.scaler, &second.scaler));
    CHECK(loaded.epoch == 0 && loaded.batch == 4 && loaded.step == 4 && loaded.seed == 7);
    CHECK(loaded.batch_size == BATCH && loaded.epochs == 2 && loaded.augment);
    CHECK(same_schedule(&loaded.schedule, &first.st.schedule));
    CHECK(models_equal(first.m, second.m) && optims_equal(first.opt, second.opt));
    second.st = loaded;
    CHECK_OK(train_steps(&second, 6));
    CHECK(second.st.epoch == 1 && second.st.step == 10);
    CHECK(models_equal(whole.m, second.m));
    CHECK(optims_equal(whole.opt, second.opt));
    CHECK(same_scaler(&whole.scaler, &second.scaler));
    if (precision == FR_F16) /* 10 steps past an interval of 3: the scale moved */
        CHECK(whole.scaler.scale != FR_LOSS_SCALE_INIT || whole.scaler.skipped > 0);
    trainer_free(&whole);
    trainer_free(&first);
    trainer_free(&second);
    fr_dataset_free(ds);
    fr_t_remove_tmpdir(dir);
}

static void test_exact_resume_sgd(void) { resume_case(FR_OPTIM_SGD, FR_F32); }
static void test_exact_resume_adamw(void) { resume_case(FR_OPTIM_ADAMW, FR_F32); }
/* These two need the half-precision ops (issue 6). */
static void test_exact_resume_f16(void) { resume_case(FR_OPTIM_SGD, FR_F16); }
static void test_exact_resume_bf16(void) { resume_case(FR_OPTIM_ADAMW, FR_BF16); }

static void test_info_roundtrip(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/info.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    CHECK_OK(fr_strategy_parse("recompute+checkpoint:2", &m->cfg.strategy));
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
    fr_train_state st = {.epoch = 3, .batch = 0, .step = 300, .seed = UINT64_MAX, .batch_size = 64,
                         .accum = 2, .epochs = 30, .limit_train = 5000};
    snprintf(st.data, sizeof st.data, "cifar10:/data/c10");
    int64_t ms[2] = {1000, 1500};
    CHECK_OK(fr_schedule_step(&st.schedule, 0.1, ms, 2, 0.1));
    CHECK_OK(fr_schedule_warmup(&st.schedule, 100, 0.25));
    CHECK_OK(fr_state_save(path, m, opt, NULL, &st));
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(info.is_training && info.version == FR_STATE_VERSION);
    CHECK(!strcmp(info.model, "resnet8") && info.in_channels == IMG_C && info.num_classes == CLASSES);
    CHECK(fr_strategy_equal(info.strategy, m->cfg.strategy));
    CHECK(info.has_optim && info.optim_kind == FR_OPTIM_SGD);
    CHECK(info.sgd.lr == opt->sgd.lr && info.sgd.momentum == opt->sgd.momentum &&
          info.sgd.dampening == opt->sgd.dampening && info.sgd.weight_decay == opt->sgd.weight_decay &&
          info.sgd.nesterov == opt->sgd.nesterov);
    CHECK(info.state.seed == UINT64_MAX && info.state.step == 300 && info.state.accum == 2);
    CHECK(info.state.limit_train == 5000 && !strcmp(info.state.data, "cifar10:/data/c10"));
    CHECK(same_schedule(&info.state.schedule, &st.schedule));
    /* a plain weights file: no metadata, loads as weights only */
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    CHECK_OK(fr_params_save(m->params, path));
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(!info.is_training && !info.model[0]);
    CHECK_OK(fr_state_load(path, m, NULL, NULL, NULL));
    CHECK_ERR(fr_state_load(path, m, opt, NULL, NULL), FR_ERR_FORMAT, "holds no optimizer state");
    fr_train_state got;
    CHECK_ERR(fr_state_load(path, m, NULL, NULL, &got), FR_ERR_FORMAT, "not a training checkpoint");
    fr_optim_free(opt);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- atomic save ---- */

static void test_failed_save_keeps_previous(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/run.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    CHECK_OK(fr_state_save(path, m, NULL, NULL, NULL));
    size_t len0 = 0, len1 = 0;
    char *before = fr_t_read_file(path, &len0);
    CHECK_NOTNULL(before);
    fr_fill_(m->params->items[0].tensor, 3.0f);
    /* a disk that fills up mid-write: the file size limit makes write()
     * fail with EFBIG once the temporary file reaches 4 KiB */
    struct rlimit old, small = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    CHECK_ERR(fr_state_save(path, m, NULL, NULL, NULL), FR_ERR_IO, "previous file left as it was");
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    char *after = fr_t_read_file(path, &len1);
    CHECK(after && len0 == len1 && !memcmp(before, after, len0));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0); /* the temporary file was removed */
    free(before);
    free(after);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- refused loads ---- */

/* Writes m's tensors to `path` with checkpoint metadata (as a file from
 * before mixed precision: no amp.* field), except: `drop` is left out,
 * `replace` is written as `with`, `extra` added under its name; metadata key
 * `bad_key` (if any) gets `bad_value`; the `meta` pairs are added. */
typedef struct {
    const char *drop, *replace, *extra, *bad_key, *bad_value;
    fr_tensor *with;
    const char *meta[4][2];
} edit;

static void write_edited(const char *path, const fr_model *m, edit e) {
    static const char *const meta[][2] = {
        {"format", FR_STATE_FORMAT}, {"format_version", "1"}, {"model", "resnet8"}, {"in_channels", "3"},
        {"num_classes", "3"}, {"strategy", "plain"}, {"optimizer", "none"}, {"training", "1"},
        {"epoch", "1"}, {"batch", "0"}, {"step", "6"}, {"seed", "7"}, {"batch_size", "4"}, {"accum", "1"},
        {"epochs", "2"}, {"augment", "1"}, {"limit_train", "0"}, {"data", "synthetic"},
        {"schedule", "cosine"}, {"schedule.base_lr", "0.1"}, {"schedule.milestones", ""},
        {"schedule.gamma", "0"}, {"schedule.total_steps", "12"}, {"schedule.eta_min", "0"},
        {"schedule.warmup_steps", "0"}, {"schedule.warmup_start_factor", "0"}};
    fr_st_writer *w = fr_st_writer_new();
    for (size_t k = 0; k < sizeof meta / sizeof *meta; k++) {
        bool bad = e.bad_key && !strcmp(e.bad_key, meta[k][0]);
        if (!bad || e.bad_value)
            CHECK_OK(fr_st_writer_add_metadata(w, meta[k][0], bad ? e.bad_value : meta[k][1]));
    }
    for (int k = 0; k < 4 && e.meta[k][0]; k++)
        CHECK_OK(fr_st_writer_add_metadata(w, e.meta[k][0], e.meta[k][1]));
    for (int i = 0; i < m->params->count; i++) {
        const fr_param *p = &m->params->items[i];
        if (e.drop && !strcmp(p->name, e.drop))
            continue;
        CHECK_OK(fr_st_writer_add(w, p->name, e.replace && !strcmp(p->name, e.replace) ? e.with : p->tensor));
    }
    if (e.extra)
        CHECK_OK(fr_st_writer_add(w, e.extra, m->params->items[0].tensor));
    CHECK_OK(fr_st_writer_save(w, path));
    fr_st_writer_free(w);
}

/* Loading the edited file into a fresh model must fail with `code` and a
 * message holding the path and `needle`, changing nothing. */
static void expect_refused(const char *path, fr_model *m, fr_optim *opt, edit e, fr_status code,
                           const char *needle) {
    fr_model *donor = fr_resnet_create("resnet8", IMG_C, CLASSES, 5);
    write_edited(path, donor, e);
    fr_model *before = snapshot(m);
    fr_train_state st;
    CHECK_ERR(fr_state_load(path, m, opt, NULL, &st), code, needle);
    if (!strstr(fr_last_error(), path)) {
        fprintf(stderr, "    message does not name the file: %s\n", fr_last_error());
        fr_t_failed_now = 1;
    }
    CHECK(models_equal(before, m));
    fr_model_free(before);
    fr_model_free(donor);
}

static void test_refused_loads(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    fr_model *other = fr_resnet_create("resnet14", IMG_C, CLASSES, 1);
    /* the edited file itself is well formed: it loads */
    write_edited(path, m, (edit){0});
    fr_model *probe = fr_resnet_create("resnet8", IMG_C, CLASSES, 2);
    fr_train_state st;
    CHECK_OK(fr_state_load(path, probe, NULL, NULL, &st));
    CHECK(models_equal(m, probe) && st.epoch == 1 && st.step == 6);
    fr_model_free(probe);

    expect_refused(path, other, NULL, (edit){0}, FR_ERR_FORMAT, "holds model resnet8, not resnet14");
    fr_tensor *wide = fr_zeros(FR_CPU, FR_F32, 2, FR_SHAPE(CLASSES, 32), FR_TAG_PARAM);
    expect_refused(path, m, NULL, (edit){.replace = "fc.weight", .with = wide}, FR_ERR_SHAPE,
                   "tensor fc.weight has shape (3, 32), expected (3, 64)");
    fr_tensor *half = fr_zeros(FR_CPU, FR_F16, 1, FR_SHAPE(16), FR_TAG_PARAM);
    expect_refused(path, m, NULL, (edit){.replace = "bn1.running_var", .with = half}, FR_ERR_DTYPE,
                   "tensor bn1.running_var has dtype f16, expected f32");
    expect_refused(path, m, NULL, (edit){.drop = "layer2.0.conv2.weight"}, FR_ERR_FORMAT,
                   "tensor layer2.0.conv2.weight is missing");
    expect_refused(path, m, NULL, (edit){.extra = "layer9.conv.weight"}, FR_ERR_FORMAT,
                   "tensor layer9.conv.weight is not in model resnet8");
    /* optimizer state that does not fit the optimizer */
    fr_optim *sgd = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
    expect_refused(path, m, sgd, (edit){0}, FR_ERR_FORMAT, "holds no optimizer state");
    expect_refused(path, m, sgd, (edit){.bad_key = "optimizer", .bad_value = "adam"}, FR_ERR_FORMAT,
                   "optimizer.lr\" is missing");
    fr_optim_free(sgd);
    fr_release(wide);
    fr_release(half);
    fr_model_free(other);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

static void test_malformed_metadata(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/meta.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    static const struct {
        const char *key, *value, *needle;
    } cases[] = {
        {"format", "something.else", "\"format\" is \"something.else\""},
        {"format_version", "one", "\"format_version\" is \"one\""},
        {"format_version", "7", "format version 7 is newer"},
        {"model", NULL, "\"model\" is missing"},
        {"in_channels", "-3", "\"in_channels\" is \"-3\""},
        {"strategy", "fast", "\"strategy\": unknown memory strategy"},
        {"optimizer", "rmsprop", "\"optimizer\" has the unknown value \"rmsprop\""},
        {"epoch", "1.5", "\"epoch\" is \"1.5\""},
        {"step", "", "\"step\" is \"\""},
        {"seed", "-1", "\"seed\" is \"-1\""},
        {"schedule", "linear", "\"schedule\" has the unknown value \"linear\""},
        {"schedule.base_lr", "fast", "\"schedule.base_lr\" is \"fast\""},
        {"schedule.total_steps", "0", "bad schedule"},
        {"schedule.milestones", "3,x", "\"schedule.milestones\" is \"3,x\""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fr_state_info info;
        expect_refused(path, m, NULL, (edit){.bad_key = cases[k].key, .bad_value = cases[k].value},
                       FR_ERR_FORMAT, cases[k].needle);
        CHECK_ERR(fr_state_read_info(path, &info), FR_ERR_FORMAT, cases[k].needle);
    }
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- mixed precision: the amp.* fields ---- */

static fr_train_state small_state(void) {
    fr_train_state st = {.epoch = 1, .step = 6, .seed = 7, .batch_size = 4, .accum = 1, .epochs = 2};
    snprintf(st.data, sizeof st.data, "synthetic");
    fr_schedule_constant(&st.schedule, 0.1);
    return st;
}

/* Saves a resnet8 in `precision` with a scaler in state `ss`, reads it back
 * (metadata text, info, load) and checks every amp value exactly. */
static void amp_roundtrip_case(const char *dir, fr_dtype precision, fr_loss_scaler_state ss,
                               const char *scale_text) {
    char path[512];
    snprintf(path, sizeof path, "%s/amp.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    m->cfg.precision = precision;
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, precision));
    CHECK_OK(fr_loss_scaler_set_state(&sc, ss));
    fr_train_state st = small_state();
    CHECK_OK(fr_state_save(path, m, NULL, &sc, &st));
    /* the text: the precision's name, the scale in 17 digits (or fewer when
     * they say the same), the counts as integers */
    char want[64];
    fr_st_file *f = fr_st_open(path);
    CHECK_NOTNULL(f);
    const char *got = fr_st_metadata(f, "amp.precision");
    CHECK(got && !strcmp(got, fr_dtype_name(precision)));
    got = fr_st_metadata(f, "amp.scale");
    CHECK(got && !strcmp(got, scale_text));
    snprintf(want, sizeof want, "%d", ss.growth_tracker);
    got = fr_st_metadata(f, "amp.growth_tracker");
    CHECK(got && !strcmp(got, want));
    snprintf(want, sizeof want, "%lld", (long long)ss.skipped);
    got = fr_st_metadata(f, "amp.skipped");
    CHECK(got && !strcmp(got, want));
    fr_st_close(f);
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(info.state.precision == precision && info.state.has_scaler);
    CHECK(!memcmp(&info.state.scaler.scale, &ss.scale, sizeof ss.scale));
    CHECK(info.state.scaler.growth_tracker == ss.growth_tracker && info.state.scaler.skipped == ss.skipped);
    /* into a fresh model and scaler */
    fr_model *m2 = fr_resnet_create("resnet8", IMG_C, CLASSES, 2);
    m2->cfg.precision = precision;
    fr_loss_scaler sc2;
    CHECK_OK(fr_loss_scaler_init(&sc2, precision));
    fr_train_state st2;
    CHECK_OK(fr_state_load(path, m2, NULL, &sc2, &st2));
    CHECK(same_scaler(&sc, &sc2) && models_equal(m, m2));
    CHECK(st2.precision == precision && st2.has_scaler && st2.step == 6);
    CHECK(!memcmp(&st2.scaler.scale, &ss.scale, sizeof ss.scale));
    /* weights only, in any precision (validate evaluates them so) */
    m2->cfg.precision = FR_F32;
    CHECK_OK(fr_state_load(path, m2, NULL, NULL, NULL));
    fr_model_free(m2);
    fr_model_free(m);
}

static void test_amp_roundtrip(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    /* 1 + 2^-23 times 2^-7: every mantissa bit matters */
    float odd = nextafterf(1.0f, 2.0f) * 0x1p-7f;
    char text[64];
    snprintf(text, sizeof text, "%.17g", (double)odd);
    amp_roundtrip_case(dir, FR_F16,
                       (fr_loss_scaler_state){.scale = odd, .growth_tracker = 1234, .skipped = 987654321012},
                       text);
    amp_roundtrip_case(dir, FR_F16, (fr_loss_scaler_state){.scale = 65536.0f, .growth_tracker = 0},
                       "65536");
    amp_roundtrip_case(dir, FR_F16, (fr_loss_scaler_state){.scale = 0x1p127f, .growth_tracker = 1999},
                       "1.7014118346046923e+38");
    amp_roundtrip_case(dir, FR_BF16, (fr_loss_scaler_state){.scale = 1.0f, .growth_tracker = 0, .skipped = 2},
                       "1");
    amp_roundtrip_case(dir, FR_F32, (fr_loss_scaler_state){.scale = 1.0f, .skipped = 4}, "1");
    /* no scaler: the precision alone, and a scaler given at load stays as it was */
    char path[512];
    snprintf(path, sizeof path, "%s/noscaler.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    m->cfg.precision = FR_BF16;
    fr_train_state st = small_state();
    CHECK_OK(fr_state_save(path, m, NULL, NULL, &st));
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(info.state.precision == FR_BF16 && !info.state.has_scaler);
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, FR_BF16));
    CHECK_OK(fr_loss_scaler_set_state(&sc, (fr_loss_scaler_state){.scale = 1.0f, .skipped = 9}));
    fr_loss_scaler before = sc;
    CHECK_OK(fr_state_load(path, m, NULL, &sc, &st));
    CHECK(same_scaler(&sc, &before) && !st.has_scaler && st.precision == FR_BF16);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* A checkpoint from before mixed precision: f32, no scaler state. */
static void test_amp_older_file(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/old.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    write_edited(path, m, (edit){0});
    fr_state_info info;
    CHECK_OK(fr_state_read_info(path, &info));
    CHECK(info.state.precision == FR_F32 && !info.state.has_scaler);
    fr_loss_scaler sc;
    CHECK_OK(fr_loss_scaler_init(&sc, FR_F32));
    CHECK_OK(fr_loss_scaler_set_state(&sc, (fr_loss_scaler_state){.scale = 1.0f, .skipped = 5}));
    fr_train_state st;
    CHECK_OK(fr_state_load(path, m, NULL, &sc, &st));
    CHECK(sc.skipped == 5 && sc.scale == 1.0f && st.precision == FR_F32 && !st.has_scaler && st.step == 6);
    /* resuming it in another precision names both */
    fr_model *before = snapshot(m);
    fr_loss_scaler half;
    CHECK_OK(fr_loss_scaler_init(&half, FR_F16));
    CHECK_ERR(fr_state_load(path, m, NULL, &half, NULL), FR_ERR_ARG,
              "was trained in f32 (it records no amp.precision), the loss scaler is for f16");
    CHECK(half.scale == FR_LOSS_SCALE_INIT);
    m->cfg.precision = FR_BF16;
    CHECK_ERR(fr_state_load(path, m, NULL, NULL, &st), FR_ERR_ARG,
              "was trained in f32 (it records no amp.precision), the model's precision is bf16");
    CHECK(models_equal(before, m));
    fr_model_free(before);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

static void test_amp_mismatch(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/f16.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    fr_loss_scaler f16;
    CHECK_OK(fr_loss_scaler_init(&f16, FR_F16));
    CHECK_OK(fr_loss_scaler_set_state(&f16, (fr_loss_scaler_state){.scale = 512.0f, .growth_tracker = 1500}));
    fr_train_state st = small_state();
    /* the scaler must be the model's precision's */
    CHECK_ERR(fr_state_save(path, m, NULL, &f16, &st), FR_ERR_ARG,
              "the loss scaler is for f16, model resnet8 trains in f32");
    CHECK(access(path, F_OK) != 0);
    m->cfg.precision = FR_F16;
    CHECK_OK(fr_state_save(path, m, NULL, &f16, &st));

    fr_model *other = fr_resnet_create("resnet8", IMG_C, CLASSES, 2);
    fr_model *before = snapshot(other);
    other->cfg.precision = FR_BF16;
    fr_loss_scaler bf16;
    CHECK_OK(fr_loss_scaler_init(&bf16, FR_BF16));
    CHECK_ERR(fr_state_load(path, other, NULL, &bf16, NULL), FR_ERR_ARG,
              "was trained in f16, the loss scaler is for bf16");
    CHECK_ERR(fr_state_load(path, other, NULL, NULL, &st), FR_ERR_ARG,
              "was trained in f16, the model's precision is bf16");
    CHECK(models_equal(before, other) && bf16.scale == 1.0f);
    /* a tracker past the scaler's own growth interval: refused through
     * fr_loss_scaler_set_state, naming the file and the field */
    other->cfg.precision = FR_F16;
    fr_loss_scaler fast;
    CHECK_OK(fr_loss_scaler_init(&fast, FR_F16));
    fast.growth_interval = 1000;
    CHECK_ERR(fr_state_load(path, other, NULL, &fast, NULL), FR_ERR_FORMAT,
              "metadata fields amp.*: loss scaler set state: growth_tracker 1500, expected in [0, 1000)");
    if (!strstr(fr_last_error(), path)) {
        fprintf(stderr, "    message does not name the file: %s\n", fr_last_error());
        fr_t_failed_now = 1;
    }
    CHECK(models_equal(before, other) && fast.scale == FR_LOSS_SCALE_INIT && fast.growth_tracker == 0);
    /* with the default interval it loads */
    CHECK_OK(fr_loss_scaler_init(&fast, FR_F16));
    CHECK_OK(fr_state_load(path, other, NULL, &fast, &st));
    CHECK(fast.scale == 512.0f && fast.growth_tracker == 1500 && models_equal(m, other));
    fr_model_free(before);
    fr_model_free(other);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

static void test_amp_malformed(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/amp.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
#define AMP(p, s, t, k) \
    {{"amp.precision", p}, {"amp.scale", s}, {"amp.growth_tracker", t}, {"amp.skipped", k}}
    static const struct {
        const char *meta[4][2];
        const char *needle;
    } cases[] = {
        {{{"amp.precision", "f8"}}, "\"amp.precision\" is \"f8\", expected f32, f16 or bf16"},
        {{{"amp.precision", ""}}, "\"amp.precision\" is \"\""},
        {AMP("f16", "big", "0", "0"), "\"amp.scale\" is \"big\", expected a number"},
        {AMP("f16", "-2", "0", "0"), "\"amp.scale\" is \"-2\", expected a finite number > 0"},
        {AMP("f16", "0", "0", "0"), "\"amp.scale\" is \"0\", expected a finite number > 0"},
        {AMP("f16", "inf", "0", "0"), "\"amp.scale\" is \"inf\", expected a finite number > 0"},
        {AMP("f16", "nan", "0", "0"), "\"amp.scale\" is \"nan\", expected a number"},
        {AMP("f16", "1e39", "0", "0"), "\"amp.scale\" is \"1e39\", expected a finite number > 0"},
        {AMP("f16", "1e-50", "0", "0"), "\"amp.scale\" is \"1e-50\", expected a finite number > 0"},
        {AMP("f16", "65536", "-1", "0"), "\"amp.growth_tracker\" is \"-1\", expected an integer in [0,"},
        {AMP("f16", "65536", "2.5", "0"), "\"amp.growth_tracker\" is \"2.5\""},
        {AMP("f16", "65536", "0", "-3"), "\"amp.skipped\" is \"-3\", expected an integer in [0,"},
        {AMP("f16", "65536", "0", ""), "\"amp.skipped\" is \"\""},
        {{{"amp.precision", "f16"}, {"amp.scale", "1024"}, {"amp.growth_tracker", "0"}},
         "\"amp.skipped\" is missing"},
        {{{"amp.scale", "1024"}, {"amp.growth_tracker", "0"}, {"amp.skipped", "0"}},
         "loss scaler state without metadata field \"amp.precision\""},
        {AMP("bf16", "1024", "0", "0"),
         "\"amp.scale\" is \"1024\", but training in bf16 keeps the loss scale at 1"},
        {AMP("f32", "0.5", "0", "0"),
         "\"amp.scale\" is \"0.5\", but training in f32 keeps the loss scale at 1"},
    };
#undef AMP
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        edit e = {0};
        memcpy(e.meta, cases[k].meta, sizeof e.meta);
        fr_state_info info;
        expect_refused(path, m, NULL, e, FR_ERR_FORMAT, cases[k].needle);
        CHECK_ERR(fr_state_read_info(path, &info), FR_ERR_FORMAT, cases[k].needle);
    }
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- checksums (io/safetensors.h) ---- */

/* Whether a load of `path` is refused with FR_ERR_FORMAT naming the file
 * and `needle`, leaving m as it was. */
static void expect_damaged(const char *path, fr_model *m, fr_optim *opt, const char *needle) {
    fr_model *before = snapshot(m);
    fr_train_state st;
    CHECK_ERR(fr_state_load(path, m, opt, NULL, opt ? &st : NULL), FR_ERR_FORMAT, needle);
    if (!strstr(fr_last_error(), path)) {
        fprintf(stderr, "    message does not name the file: %s\n", fr_last_error());
        fr_t_failed_now = 1;
    }
    CHECK(models_equal(before, m));
    fr_model_free(before);
}

/* A byte changed after the save, in a weight, in the optimizer's state or
 * in a metadata value, is refused naming the file (and the tensor); the
 * same file without its checksum field (as an older frugal wrote it) loads
 * as before. */
static void test_checksums_refuse_damage(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/sealed.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
    fr_train_state st = small_state();
    CHECK_OK(fr_state_save(path, m, opt, NULL, &st));
    size_t n = 0;
    char *good = fr_t_read_file(path, &n);
    CHECK_NOTNULL(good);
    /* the field: the metadata's CRC, then one per tensor */
    fr_st_file *f = fr_st_open(path);
    const char *sums = f ? fr_st_metadata(f, FR_ST_CHECKSUM_KEY) : NULL;
    CHECK(sums && strlen(sums) == (size_t)(fr_st_count(f) + 1) * 9 - 1);
    fr_st_close(f);
    fr_model *other = fr_resnet_create("resnet8", IMG_C, CLASSES, 2);
    fr_optim *other_opt = fr_sgd_new(other->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});

    /* one bit of a weight: weights-only (validate) and full (resume) loads */
    CHECK(fr_t_st_flip(path, "layer2.0.conv1.weight", 17));
    expect_damaged(path, other, NULL, "tensor 'layer2.0.conv1.weight': its bytes do not match their checksum");
    expect_damaged(path, other, other_opt, "tensor 'layer2.0.conv1.weight': its bytes do not match");
    /* a buffer, and optimizer state a weights-only load does not use */
    CHECK(fr_t_write_file(path, good, n) && fr_t_st_flip(path, "bn1.running_mean", 0));
    expect_damaged(path, other, NULL, "tensor 'bn1.running_mean': its bytes do not match");
    CHECK(fr_t_write_file(path, good, n) && fr_t_st_flip(path, "optim.step.fc.weight", 3));
    expect_damaged(path, other, NULL, "tensor 'optim.step.fc.weight': its bytes do not match");
    /* a metadata value edited in place: "seed":"7" -> "8"; read_info refuses too */
    char *seed = memmem(good, n, "\"seed\":\"7\"", 10);
    CHECK_NOTNULL(seed);
    if (seed) {
        seed[8] = '8';
        CHECK(fr_t_write_file(path, good, n));
        seed[8] = '7';
        expect_damaged(path, other, other_opt, "the __metadata__ does not match its checksum");
        fr_state_info info;
        CHECK_ERR(fr_state_read_info(path, &info), FR_ERR_FORMAT, "the __metadata__ does not match");
    }
    /* the field itself damaged: refused for its form */
    char *field = memmem(good, n, "\"" FR_ST_CHECKSUM_KEY "\":\"", strlen(FR_ST_CHECKSUM_KEY) + 4);
    CHECK_NOTNULL(field);
    if (field) {
        char *digit = field + strlen(FR_ST_CHECKSUM_KEY) + 4, was = *digit;
        *digit = 'X';
        CHECK(fr_t_write_file(path, good, n));
        *digit = was;
        expect_damaged(path, other, NULL, "metadata field \"" FR_ST_CHECKSUM_KEY "\" is not");
    }
    /* undamaged, it loads; without the field too (an older frugal's file),
     * and then nothing can tell an edit */
    CHECK(fr_t_write_file(path, good, n));
    CHECK_OK(fr_state_load(path, other, other_opt, NULL, &st));
    CHECK(models_equal(m, other));
    CHECK(fr_t_st_unseal(path));
    f = fr_st_open(path);
    CHECK(f && !fr_st_metadata_kind(f, FR_ST_CHECKSUM_KEY));
    fr_st_close(f);
    fr_model_free(other);
    other = fr_resnet_create("resnet8", IMG_C, CLASSES, 3);
    CHECK_OK(fr_state_load(path, other, NULL, NULL, NULL));
    CHECK(models_equal(m, other));
    CHECK(fr_t_st_flip(path, "layer2.0.conv1.weight", 17));
    CHECK_OK(fr_state_load(path, other, NULL, NULL, NULL));
    int k = fr_params_find(m->params, "layer2.0.conv1.weight");
    CHECK(k >= 0 && !same_bits(m->params->items[k].tensor, other->params->items[k].tensor));
    free(good);
    fr_optim_free(other_opt);
    fr_optim_free(opt);
    fr_model_free(other);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

/* ---- BatchNorm statistics ---- */

static fr_tensor *stat_tensor(fr_dtype dtype, int ndim, float value, int at) {
    fr_tensor *t = fr_zeros(FR_CPU, dtype, ndim, FR_SHAPE(16), FR_TAG_PARAM);
    if (t && dtype == FR_I32)
        ((int32_t *)fr_data(t))[0] = (int32_t)value;
    else if (t)
        fr_data_f32(t)[at] = value;
    return t;
}

/* A running variance below 0 or not finite, a running mean not finite, a
 * negative batch count: refused at load naming the file and the tensor,
 * not left for validate to meet as a NaN loss it blames on the input. */
static void test_bn_statistics_checked(void) {
    const char *dir = fr_t_make_tmpdir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/bn.safetensors", dir);
    fr_model *m = fr_resnet_create("resnet8", IMG_C, CLASSES, 1);
    /* a negative variance is finite: the save takes it, the load refuses it */
    fr_tensor *var = m->params->items[fr_params_find(m->params, "layer1.0.bn2.running_var")].tensor;
    fr_fill_(var, 1.0f);
    fr_data_f32(var)[2] = -1.0f;
    fr_train_state st = small_state();
    CHECK_OK(fr_state_save(path, m, NULL, NULL, &st));
    fr_model *other = fr_resnet_create("resnet8", IMG_C, CLASSES, 2);
    expect_damaged(path, other, NULL,
                   "tensor layer1.0.bn2.running_var holds -1 at element 2, expected a finite number >= 0 "
                   "(a variance)");
    /* through the weights loader too, before anything is copied */
    fr_model *before = snapshot(other);
    CHECK_ERR(fr_params_load(other->params, path), FR_ERR_FORMAT, "tensor layer1.0.bn2.running_var holds -1");
    CHECK(models_equal(before, other));
    fr_model_free(before);
    /* a zero variance is a statistic training can produce (a constant channel) */
    fr_data_f32(var)[2] = 0.0f;
    CHECK_OK(fr_state_save(path, m, NULL, NULL, &st));
    CHECK_OK(fr_state_load(path, other, NULL, NULL, NULL));
    static const struct {
        const char *name;
        fr_dtype dtype;
        int ndim, at;
        float value;
        const char *needle;
    } cases[] = {
        {"bn1.running_var", FR_F32, 1, 0, NAN, "tensor bn1.running_var holds nan at element 0"},
        {"bn1.running_var", FR_F32, 1, 15, INFINITY, "tensor bn1.running_var holds inf at element 15"},
        {"bn1.running_mean", FR_F32, 1, 3, -INFINITY, "tensor bn1.running_mean holds -inf at element 3, "
                                                      "expected a finite number: BatchNorm statistics"},
        {"bn1.num_batches_tracked", FR_I32, 0, 0, -5,
         "tensor bn1.num_batches_tracked holds -5, expected a count of batches >= 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fr_tensor *bad = stat_tensor(cases[k].dtype, cases[k].ndim, cases[k].value, cases[k].at);
        expect_refused(path, other, NULL, (edit){.replace = cases[k].name, .with = bad}, FR_ERR_FORMAT,
                       cases[k].needle);
        fr_release(bad);
    }
    fr_model_free(other);
    fr_model_free(m);
    fr_t_remove_tmpdir(dir);
}

int main(void) {
    RUN(test_exact_resume_sgd);
    RUN(test_exact_resume_adamw);
    RUN(test_info_roundtrip);
    RUN(test_failed_save_keeps_previous);
    RUN(test_refused_loads);
    RUN(test_malformed_metadata);
    RUN(test_amp_roundtrip);
    RUN(test_amp_older_file);
    RUN(test_amp_mismatch);
    RUN(test_amp_malformed);
    RUN(test_checksums_refuse_damage);
    RUN(test_bn_statistics_checked);
    /* these need the half-precision ops (issue 6) */
    RUN(test_exact_resume_f16);
    RUN(test_exact_resume_bf16);
    return TEST_SUMMARY();
}
