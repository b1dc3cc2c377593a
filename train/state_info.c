/* state_info.c: reading a checkpoint's metadata (fr_state_read_info,
 * and the first step of every load); see state.h. Every field is
 * type- and range-checked before anything is allocated from it; keys frugal
 * does not read are noted once and ignored. */
#include "state_impl.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- reading metadata ---- */

typedef struct {
    const fr_st_file *f;
    const char *path;
} meta_src;

static fr_status get_str(meta_src m, const char *key, const char **out) {
    *out = fr_st_metadata(m.f, key);
    const char *kind = fr_st_metadata_kind(m.f, key);
    if (!*out && kind)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is %s, expected a JSON string "
                        "(frugal writes every field as one)", m.path, key, kind);
    if (!*out)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is missing", m.path, key);
    return FR_OK;
}

/* Whether `key` is one a frugal checkpoint's reader takes (fill_writer's). */
static bool known_key(const char *key, bool frugal) {
    static const char *const keys[] = {
        "format", "format_version", "model", "in_channels", "num_classes", "strategy", AMP_PRECISION,
        AMP_SCALE, AMP_TRACKER, AMP_SKIPPED, "optimizer", "optimizer.lr", "optimizer.momentum",
        "optimizer.dampening", "optimizer.weight_decay", "optimizer.nesterov", "optimizer.beta1",
        "optimizer.beta2", "optimizer.eps", "training", "epoch", "batch", "step", "seed", "batch_size",
        "accum", "epochs", "augment", "limit_train", "data", "dist.world_size", "dist.sync_bn", "schedule",
        "schedule.base_lr", "schedule.milestones", "schedule.gamma", "schedule.total_steps",
        "schedule.eta_min", "schedule.warmup_steps", "schedule.warmup_start_factor", "random.dropout",
        "random.compress"};
    if (!strcmp(key, FR_ST_CHECKSUM_KEY)) /* read by io/safetensors.c, in any file */
        return true;
    if (!frugal) /* a weights file: only "format" is read, to tell it from a checkpoint */
        return !strcmp(key, "format");
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(key, keys[i]))
            return true;
    return false;
}

/* One line on stderr naming the metadata keys frugal does not read (and
 * the kind of any value that is not a string), once per file in a row: a
 * run reads a checkpoint's metadata more than once. They are ignored: the
 * format lets every tool add its own (Hugging Face writes "format": "pt"). */
static void note_unknown_keys(const fr_st_file *f, const char *path, bool frugal) {
    static char last[1024];
    char list[900] = "";
    size_t used = 0;
    int n = 0;
    for (int i = 0; i < fr_st_metadata_count(f); i++) {
        const char *key = fr_st_metadata_key(f, i), *kind = fr_st_metadata_kind(f, key);
        if (known_key(key, frugal) && fr_st_metadata(f, key))
            continue;
        if (used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%.100s\"%s%s%s", n ? ", " : "",
                                     key, strcmp(kind, "a string") ? " (" : "",
                                     strcmp(kind, "a string") ? kind : "", strcmp(kind, "a string") ? ")" : "");
        n++;
    }
    if (!n || !strncmp(last, path, sizeof last - 1))
        return;
    snprintf(last, sizeof last, "%s", path);
    fprintf(stderr, "note: %s: ignoring %d __metadata__ key%s frugal does not read: %s%s\n", path, n,
            n == 1 ? "" : "s", list, used >= sizeof list ? "..." : "");
}

static fr_status get_int(meta_src m, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const char *s;
    FR_TRY(get_str(m, key, &s));
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is \"%s\", expected an "
                        "integer in [%" PRId64 ", %" PRId64 "]", m.path, key, s, lo, hi);
    *out = v;
    return FR_OK;
}

/* A number (inf allowed, NaN not). */
static fr_status get_number(meta_src m, const char *key, double *out) {
    const char *s;
    FR_TRY(get_str(m, key, &s));
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || v != v)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is \"%s\", expected a "
                        "number", m.path, key, s);
    *out = v;
    return FR_OK;
}

/* A finite number in [lo, hi] (lo excluded when open_lo). */
static fr_status get_double(meta_src m, const char *key, double lo, double hi, bool open_lo, double *out) {
    double v;
    FR_TRY(get_number(m, key, &v));
    if (!isfinite(v) || v < lo || v > hi || (open_lo && v == lo))
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is \"%s\", expected a "
                        "finite number in %s%g, %g]", m.path, key, fr_st_metadata(m.f, key),
                        open_lo ? "(" : "[", lo, hi);
    *out = v;
    return FR_OK;
}

static fr_status get_choice(meta_src m, const char *key, const char *const *names, int n, int *out) {
    const char *s;
    FR_TRY(get_str(m, key, &s));
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(s, names[i])) {
            *out = i;
            return FR_OK;
        }
    return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" has the unknown value \"%s\"",
                    m.path, key, s);
}

static fr_status get_schedule(meta_src m, fr_schedule *out) {
    int kind = 0;
    double base_lr, gamma, eta_min, factor;
    int64_t total, warmup, milestones[FR_SCHED_MAX_MILESTONES];
    const char *list;
    FR_TRY(get_choice(m, "schedule", sched_kind_names, FR_SCHED_KIND_COUNT, &kind));
    FR_TRY(get_double(m, "schedule.base_lr", 0, MAX_RATE, false, &base_lr));
    FR_TRY(get_double(m, "schedule.gamma", 0, MAX_RATE, false, &gamma));
    FR_TRY(get_double(m, "schedule.eta_min", 0, MAX_RATE, false, &eta_min));
    FR_TRY(get_double(m, "schedule.warmup_start_factor", 0, 1, false, &factor));
    FR_TRY(get_int(m, "schedule.total_steps", 0, MAX_COUNT, &total));
    FR_TRY(get_int(m, "schedule.warmup_steps", 0, MAX_COUNT, &warmup));
    FR_TRY(get_str(m, "schedule.milestones", &list));
    int n = 0;
    for (const char *p = list; *p;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || n == FR_SCHED_MAX_MILESTONES || (*end && *end != ',') || v < 0 ||
            v > MAX_COUNT)
            return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"schedule.milestones\" is "
                            "\"%s\", expected up to %d comma-separated integers", m.path, list,
                            FR_SCHED_MAX_MILESTONES);
        milestones[n++] = v;
        p = *end ? end + 1 : end;
    }
    /* Rebuilt through the constructors, so a file cannot smuggle in a
     * schedule they would refuse. */
    fr_schedule s;
    fr_status st = kind == FR_SCHED_CONSTANT ? fr_schedule_constant(&s, base_lr)
                   : kind == FR_SCHED_STEP   ? fr_schedule_step(&s, base_lr, milestones, n, gamma)
                                             : fr_schedule_cosine(&s, base_lr, total, eta_min);
    if (st == FR_OK && warmup > 0)
        st = fr_schedule_warmup(&s, warmup, factor);
    if (st != FR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", fr_last_error());
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: bad schedule: %s", m.path, why);
    }
    *out = s;
    return FR_OK;
}

static fr_status get_optim(meta_src m, fr_state_info *info) {
    static const char *const with_none[FR_OPTIM_KIND_COUNT + 1] = {"sgd", "adam", "adamw", "none"};
    int kind = 0;
    FR_TRY(get_choice(m, "optimizer", with_none, FR_OPTIM_KIND_COUNT + 1, &kind));
    if (kind == FR_OPTIM_KIND_COUNT)
        return FR_OK;
    info->has_optim = true;
    info->optim_kind = (fr_optim_kind)kind;
    if (kind == FR_OPTIM_SGD) {
        int64_t nesterov;
        FR_TRY(get_double(m, "optimizer.lr", 0, MAX_RATE, false, &info->sgd.lr));
        FR_TRY(get_double(m, "optimizer.momentum", 0, 1, false, &info->sgd.momentum));
        FR_TRY(get_double(m, "optimizer.dampening", 0, 1, false, &info->sgd.dampening));
        FR_TRY(get_double(m, "optimizer.weight_decay", 0, MAX_RATE, false, &info->sgd.weight_decay));
        FR_TRY(get_int(m, "optimizer.nesterov", 0, 1, &nesterov));
        info->sgd.nesterov = nesterov;
        return FR_OK;
    }
    FR_TRY(get_double(m, "optimizer.lr", 0, MAX_RATE, false, &info->adam.lr));
    FR_TRY(get_double(m, "optimizer.beta1", 0, 1, false, &info->adam.beta1));
    FR_TRY(get_double(m, "optimizer.beta2", 0, 1, false, &info->adam.beta2));
    FR_TRY(get_double(m, "optimizer.eps", 0, 1, true, &info->adam.eps));
    if (info->adam.beta1 >= 1 || info->adam.beta2 >= 1)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata fields optimizer.beta1 and beta2 must be "
                        "below 1", m.path);
    return get_double(m, "optimizer.weight_decay", 0, MAX_RATE, false, &info->adam.weight_decay);
}

/* An unsigned 64-bit field written in decimal ("seed", the random streams). */
static fr_status get_u64(meta_src m, const char *key, uint64_t *out) {
    const char *s;
    FR_TRY(get_str(m, key, &s));
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || *s == '-' || *s == ' ' || *s == '+')
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"%s\" is \"%s\", expected an "
                        "unsigned integer", m.path, key, s);
    *out = v;
    return FR_OK;
}

static fr_status get_state(meta_src m, fr_train_state *st) {
    int64_t v;
    const char *s;
    FR_TRY(get_int(m, "epoch", 0, INT32_MAX, &st->epoch));
    FR_TRY(get_int(m, "batch", 0, MAX_COUNT, &st->batch));
    FR_TRY(get_int(m, "step", 0, MAX_COUNT, &st->step));
    FR_TRY(get_u64(m, "seed", &st->seed));
    /* both random streams or neither (files before them) */
    st->has_random = fr_st_metadata(m.f, "random.dropout") || fr_st_metadata(m.f, "random.compress");
    if (st->has_random) {
        FR_TRY(get_u64(m, "random.dropout", &st->random_state));
        FR_TRY(get_u64(m, "random.compress", &st->compress_random_state));
    }
    FR_TRY(get_int(m, "batch_size", 1, INT32_MAX, &v));
    st->batch_size = (int)v;
    FR_TRY(get_int(m, "accum", 1, INT32_MAX, &v));
    st->accum = (int)v;
    FR_TRY(get_int(m, "epochs", 0, INT32_MAX, &v));
    st->epochs = (int)v;
    if (st->epoch > st->epochs || (st->epoch == st->epochs && st->batch > 0))
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"epoch\" is %" PRId64 " (batch %"
                        PRId64 "), past the run's %d epochs", m.path, st->epoch, st->batch, st->epochs);
    FR_TRY(get_int(m, "augment", 0, 1, &v));
    st->augment = v;
    FR_TRY(get_int(m, "limit_train", 0, INT64_MAX, &st->limit_train));
    FR_TRY(get_str(m, "data", &s));
    if (strlen(s) >= sizeof st->data)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"data\" is longer than %zu bytes",
                        m.path, sizeof st->data - 1);
    snprintf(st->data, sizeof st->data, "%s", s);
    st->world_size = 1;
    st->sync_bn = false;
    if (fr_st_metadata(m.f, "dist.world_size")) {
        FR_TRY(get_int(m, "dist.world_size", 1, INT32_MAX, &v));
        st->world_size = (int)v;
        FR_TRY(get_int(m, "dist.sync_bn", 0, 1, &v));
        st->sync_bn = v;
    }
    return get_schedule(m, &st->schedule);
}

/* amp.*: the precision (f32 when absent: files from before mixed
 * precision) and, all three or none, the scaler's fields. Checked here as
 * far as the file alone allows; the tracker against the scaler's growth
 * interval is checked at load, by fr_loss_scaler_set_state. */
static fr_status get_amp(meta_src m, fr_train_state *st) {
    const char *s = fr_st_metadata(m.f, AMP_PRECISION);
    st->precision = FR_F32;
    if (s && fr_precision_parse(s, &st->precision) != FR_OK)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"" AMP_PRECISION "\" is \"%s\", "
                        "expected f32, f16 or bf16", m.path, s);
    const char *keys[3] = {AMP_SCALE, AMP_TRACKER, AMP_SKIPPED};
    int present = 0;
    for (int k = 0; k < 3; k++)
        present += fr_st_metadata(m.f, keys[k]) != NULL;
    st->has_scaler = present > 0;
    if (!present)
        return FR_OK;
    if (!s)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: loss scaler state without metadata field "
                        "\"" AMP_PRECISION "\"", m.path);
    double scale;
    int64_t tracker, skipped;
    FR_TRY(get_number(m, AMP_SCALE, &scale));
    /* as an f32 (what the scaler holds): not 0 after rounding, not inf */
    if (!(scale > 0 && scale <= FLT_MAX && (float)scale > 0))
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"" AMP_SCALE "\" is \"%s\", "
                        "expected a finite number > 0", m.path, fr_st_metadata(m.f, AMP_SCALE));
    FR_TRY(get_int(m, AMP_TRACKER, 0, INT32_MAX, &tracker));
    FR_TRY(get_int(m, AMP_SKIPPED, 0, INT64_MAX, &skipped));
    if (st->precision != FR_F16 && scale != 1.0)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"" AMP_SCALE "\" is \"%s\", "
                        "but training in %s keeps the loss scale at 1", m.path,
                        fr_st_metadata(m.f, AMP_SCALE), fr_dtype_name(st->precision));
    st->scaler = (fr_loss_scaler_state){.scale = (float)scale, .growth_tracker = (int)tracker,
                                        .skipped = skipped};
    return FR_OK;
}

fr_status fr_state_read_info_from(const fr_st_file *f, const char *path, fr_state_info *info) {
    memset(info, 0, sizeof *info);
    meta_src m = {f, path};
    const char *format = fr_st_metadata(f, "format");
    /* Another tool's "format" ("pt" from PyTorch / Hugging Face) or none: a
     * plain weights file. A frugal field beside another format is a
     * checkpoint whose "format" was damaged, not a weights file. */
    bool frugal = format && !strcmp(format, FR_STATE_FORMAT);
    if (!frugal && fr_st_metadata_kind(f, "format_version"))
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"format\" is %s%s%s, expected "
                        "\"%s\" (the file has frugal's \"format_version\")", path, format ? "\"" : "",
                        format ? format : fr_st_metadata_kind(f, "format") ? fr_st_metadata_kind(f, "format")
                                                                          : "missing",
                        format ? "\"" : "", FR_STATE_FORMAT);
    note_unknown_keys(f, path, frugal);
    if (!frugal)
        return FR_OK; /* a plain weights file */
    int64_t v;
    const char *s;
    FR_TRY(get_int(m, "format_version", 1, INT32_MAX, &v));
    if (v > FR_STATE_VERSION)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: format version %" PRId64 " is newer than this "
                        "frugal reads (%d)", path, v, FR_STATE_VERSION);
    info->version = (int)v;
    FR_TRY(get_str(m, "model", &s));
    if (!*s || strlen(s) >= sizeof info->model)
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"model\" (\"%s\") is empty or "
                        "too long", path, s);
    snprintf(info->model, sizeof info->model, "%s", s);
    /* The model these describe is made before its tensors can be compared
     * with the file's: bound them by the file first, so a corrupt count
     * cannot become a huge allocation. Each is a dimension of some tensor
     * (first conv, classifier), so neither exceeds the largest one's size. */
    int64_t largest = 1;
    for (int j = 0; j < fr_st_count(f); j++) {
        int64_t numel = 1;
        for (int d = 0; d < fr_st_ndim(f, j); d++)
            numel *= fr_st_shape(f, j)[d];
        largest = numel > largest ? numel : largest;
    }
    FR_TRY(get_int(m, "in_channels", 1, largest < INT32_MAX ? largest : INT32_MAX, &v));
    info->in_channels = (int)v;
    FR_TRY(get_int(m, "num_classes", 1, largest < INT32_MAX ? largest : INT32_MAX, &v));
    info->num_classes = (int)v;
    FR_TRY(get_str(m, "strategy", &s));
    if (fr_strategy_parse(s, &info->strategy) != FR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", fr_last_error());
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"strategy\": %s", path, why);
    }
    FR_TRY(get_amp(m, &info->state));
    FR_TRY(get_optim(m, info));
    const char *training = fr_st_metadata(f, "training");
    if (!training)
        return FR_OK; /* weights with model metadata */
    if (strcmp(training, "1"))
        return fr_error(FR_ERR_FORMAT, "checkpoint %s: metadata field \"training\" is \"%s\", expected \"1\" "
                        "(or no such field, for a weights file)", path, training);
    info->is_training = true;
    return get_state(m, &info->state);
}

fr_status fr_state_read_info(const char *path, fr_state_info *info) {
    if (!path || !info)
        return fr_error(FR_ERR_ARG, "checkpoint: read_info: path or info is NULL");
    fr_st_file *f = fr_st_open(path);
    if (!f)
        return fr_last_status();
    fr_status st = fr_state_read_info_from(f, path, info);
    fr_st_close(f);
    return st;
}

