/* cli.c: helpers of the example programs; see cli.h. */
#include "cli_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../autograd/functions.h"
#include "../models/registry.h"
#include "../planner/planner.h"

/* ---- flag values ---- */

/* Whether text is a plain decimal: an optional '-' (only when `sign` allows
 * it), then digits only. strtoll and strtoull skip leading whitespace and
 * take '+' and '-' (strtoull wraps "-1" to 2^64 - 1), so the text is
 * checked before they see it. */
static bool plain_decimal(const char *text, bool sign) {
    if (!text)
        return false;
    if (sign && *text == '-')
        text++;
    if (!*text)
        return false;
    for (; *text; text++)
        if (*text < '0' || *text > '9')
            return false;
    return true;
}

fr_status fr_cli_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    bool ok = plain_decimal(text, lo < 0);
    long long v = ok ? strtoll(text, &end, 10) : 0;
    if (!ok || *end || errno || v < lo || v > hi)
        return fr_error(FR_ERR_ARG, "%s: \"%s\" is not an integer in [%" PRId64 ", %" PRId64 "] (digits "
                        "only: no spaces, no '+'%s)", flag, text ? text : "", lo, hi,
                        lo < 0 ? "" : ", no '-'");
    *out = v;
    return FR_OK;
}

fr_status fr_cli_double(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    /* strtod skips leading whitespace and reads "nan", "inf" and hex:
     * a flag value starts with a digit, '.' or a '-' before one */
    const char *p = text && *text == '-' ? text + 1 : text;
    bool ok = p && ((*p >= '0' && *p <= '9') || *p == '.') && !strpbrk(text, " \t\n\vxXpP");
    double v = ok ? strtod(text, &end) : 0;
    if (!ok || end == text || *end || errno || !(v >= lo && v <= hi))
        return fr_error(FR_ERR_ARG, "%s: \"%s\" is not a number in [%g, %g]", flag, text ? text : "", lo,
                        hi);
    *out = v;
    return FR_OK;
}

fr_status fr_cli_choice(const char *flag, const char *text, const char *const *choices, int n, int *out) {
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (text && !strcmp(text, choices[i])) {
            *out = i;
            return FR_OK;
        }
        used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                 i ? ", " : "", choices[i]);
    }
    return fr_error(FR_ERR_ARG, "%s: \"%s\" is not one of %s", flag, text ? text : "", list);
}

fr_status fr_cli_precision(const char *flag, const char *text, fr_dtype *out) {
    if (fr_precision_parse(text, out) == FR_OK)
        return FR_OK;
    return fr_error(FR_ERR_ARG, "%s: \"%s\" is not a precision (choose f32, f16 or bf16)", flag,
                    text ? text : "");
}

fr_status fr_cli_size(const char *flag, const char *text, size_t *out) {
    char digits[32];
    size_t len = text ? strlen(text) : 0;
    int shift = 0;
    switch (len ? text[len - 1] : 0) {
    case 'K': case 'k': shift = 10; len--; break;
    case 'M': case 'm': shift = 20; len--; break;
    case 'G': case 'g': shift = 30; len--; break;
    default: break;
    }
    bool ok = len > 0 && len < sizeof digits;
    if (ok) {
        memcpy(digits, text, len);
        digits[len] = '\0';
        ok = plain_decimal(digits, false);
    }
    errno = 0;
    unsigned long long v = ok ? strtoull(digits, NULL, 10) : 0;
    if (!ok || errno || v == 0 || v > (SIZE_MAX >> shift))
        return fr_error(FR_ERR_ARG, "%s: \"%s\" is not a size (a whole number > 0 of bytes, digits "
                        "only, with an optional K, M or G suffix, at most %zu bytes)", flag,
                        text ? text : "", (size_t)SIZE_MAX);
    *out = (size_t)v << shift;
    return FR_OK;
}

fr_status fr_cli_strategy(const char *flag, const char *text, fr_strategy *out) {
    if (fr_strategy_parse(text, out) == FR_OK)
        return FR_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", fr_last_error());
    return fr_error(FR_ERR_ARG, "%s: %s", flag, why);
}

static void flag_text(char *buf, size_t len, const char *flag, const char *value) {
    snprintf(buf, len, value ? "%s %s" : "%s", flag, value ? value : "");
}

fr_status fr_cli_seen_add(fr_cli_seen *s, const char *flag, const char *value) {
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->flag[i], flag))
            continue;
        char first[300], again[300];
        flag_text(first, sizeof first, s->flag[i], s->value[i]);
        flag_text(again, sizeof again, flag, value);
        return fr_error(FR_ERR_ARG, "%s is given twice (\"%s\", then \"%s\"): give it once", flag, first,
                        again);
    }
    if (s->n == FR_CLI_MAX_FLAGS)
        return fr_error(FR_ERR_ARG, "more than %d flags", FR_CLI_MAX_FLAGS);
    s->flag[s->n] = flag;
    s->value[s->n++] = value;
    return FR_OK;
}

const char *fr_cli_seen_get(const fr_cli_seen *s, const char *flag) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->flag[i], flag))
            return s->value[i] ? s->value[i] : "";
    return NULL;
}

fr_status fr_cli_conflict(const fr_cli_seen *s, const char *a, const char *b, const char *why) {
    const char *va = fr_cli_seen_get(s, a), *vb = fr_cli_seen_get(s, b);
    if (!va || !vb)
        return FR_OK;
    return fr_error(FR_ERR_ARG, "%s%s%s conflicts with %s%s%s: %s", a, *va ? " " : "", va, b, *vb ? " " : "",
                    vb, why);
}

/* ---- program skeleton ---- */

bool fr_cli_wants_help(int argc, char *const *argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return true;
    return false;
}

fr_status fr_cli_bad_flag(const char *prog, const char *arg, bool known) {
    if (!known)
        return fr_error(FR_ERR_ARG, "unknown %s \"%s\" (see %s --help)",
                        strncmp(arg, "--", 2) ? "argument" : "flag", arg, prog);
    return fr_error(FR_ERR_ARG, "%s needs a value (see %s --help)", arg, prog);
}

fr_status fr_cli_strategy_precision(const char *text, fr_strategy s, fr_dtype precision) {
    if (s.compress && precision != FR_F32)
        return fr_error(FR_ERR_ARG, "--strategy %s cannot be combined with --precision %s: "
                        "compress:B packs f32 activations only (train in f32, or without "
                        "compress)", text, fr_dtype_name(precision));
    return FR_OK;
}

int fr_cli_exit(const char *prog, int rc) {
    errno = 0;
    bool failed = fflush(stdout) != 0 || ferror(stdout);
    if (failed && rc == 0) {
        fprintf(stderr, "%s: cannot write the results to standard output: %s\n", prog,
                errno ? strerror(errno) : "a write failed");
        return 1;
    }
    return rc;
}

void fr_cli_apply_limits(int64_t threads, size_t memory_limit) {
    if (threads > 0)
        fr_set_num_threads((int)threads);
    for (int d = 0; d < FR_DEVICE_COUNT; d++)
        fr_mem_set_limit((fr_device)d, memory_limit);
}

int fr_cli_exit_status(const char *prog, fr_status s) {
    if (s == FR_OK)
        return 0;
    fprintf(stderr, "%s: %s\n", prog, fr_last_error());
    return 1;
}

/* ---- models ---- */

fr_model *fr_cli_model_create(const char *name, int in_channels, int num_classes, uint64_t seed) {
    fr_model *m = fr_model_create(name, in_channels, num_classes, seed);
    if (!m && fr_last_status() == FR_ERR_ARG && !strncmp(fr_last_error(), "unknown model", 13)) {
        char why[1200];
        snprintf(why, sizeof why, "%s", fr_last_error());
        fr_error(FR_ERR_ARG, "--model: %s", why);
    }
    return m;
}

fr_status fr_cli_model_check(const char *flag, const char *name) {
    fr_model *m = fr_cli_model_create(name, 1, 2, 0);
    if (m) {
        fr_model_free(m);
        return FR_OK;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", fr_last_error());
    if (!strncmp(why, flag, strlen(flag)))
        return fr_last_status();
    return fr_error(fr_last_status(), "%s %s: %s", flag, name ? name : "", why);
}

/* ---- datasets ---- */

static const char *const data_kind_names[FR_DATA_KIND_COUNT] = {"fashion-mnist", "mnist", "cifar10",
                                                                 "cifar100", "folder"};
FR_STATIC_ASSERT(FR_DATA_KIND_COUNT == 5, "data kind names");

fr_status fr_data_spec_parse(const char *text, fr_data_spec *out) {
    static const char *const forms =
        "fashion-mnist[:DIR], mnist:DIR, cifar10:DIR, cifar100:DIR or folder:DIR";
    if (!text || !*text)
        return fr_error(FR_ERR_ARG, "--data: empty (use %s)", forms);
    /* ",classes=K" / ",channels=C" at the end (folder names may hold commas) */
    char body[1100];
    snprintf(body, sizeof body, "%s", text);
    out->num_classes = 0;
    out->channels = 0;
    for (char *comma; (comma = strrchr(body, ','));) {
        int64_t v;
        /* the suffixes are read right to left: one given twice would
         * silently keep its leftmost value */
        bool classes = !strncmp(comma, ",classes=", 9), channels = !strncmp(comma, ",channels=", 10);
        if ((classes && out->num_classes) || (channels && out->channels))
            return fr_error(FR_ERR_ARG, "--data %s: %s= is given twice", text,
                            classes ? "classes" : "channels");
        if (classes) {
            FR_TRY(fr_cli_int("--data ...,classes=", comma + 9, 1, 256, &v));
            out->num_classes = (int)v;
        } else if (channels) {
            FR_TRY(fr_cli_int("--data ...,channels=", comma + 10, 1, 3, &v));
            if (v == 2)
                return fr_error(FR_ERR_ARG, "--data %s: channels must be 1 or 3", text);
            out->channels = (int)v;
        } else {
            break;
        }
        *comma = '\0';
    }
    size_t len = strcspn(body, ":");
    const char *dir = body[len] ? body + len + 1 : NULL;
    for (int k = 0; k < FR_DATA_KIND_COUNT; k++) {
        if (strlen(data_kind_names[k]) != len || strncmp(body, data_kind_names[k], len))
            continue;
        bool idx = k == FR_DATA_FASHION_MNIST || k == FR_DATA_MNIST;
        if ((out->num_classes && !idx) || (out->channels && k != FR_DATA_FOLDER))
            return fr_error(FR_ERR_ARG, "--data %s: classes= applies to IDX sets (mnist, fashion-mnist) "
                            "and channels= to folders only", text);
        if (!dir && k == FR_DATA_FASHION_MNIST)
            dir = FR_FASHION_MNIST_DIR;
        if (!dir || !*dir)
            return fr_error(FR_ERR_ARG, "--data %s: needs a directory (%s:DIR)", text, data_kind_names[k]);
        if (strlen(dir) >= sizeof out->dir)
            return fr_error(FR_ERR_ARG, "--data: directory name too long");
        out->kind = (fr_data_kind)k;
        snprintf(out->dir, sizeof out->dir, "%s", dir);
        return FR_OK;
    }
    return fr_error(FR_ERR_ARG, "--data: unknown dataset \"%.*s\" in \"%s\" (use %s)", (int)len, body, text,
                    forms);
}

/* Whether path is a regular file; *err: errno of a stat that failed other
 * than for a missing name (a folder it may not search), else kept. */
static bool is_file(const char *path, int *err) {
    struct stat sb;
    if (stat(path, &sb) == 0)
        return S_ISREG(sb.st_mode);
    if (errno != ENOENT && errno != ENOTDIR)
        *err = errno;
    return false;
}

/* DIR/<base>.gz or DIR/<base> into buf; false (with an error) if neither:
 * "no such file" only when neither name exists, else why they could not
 * be seen (a folder without search permission had read as missing). */
static bool find_idx(char *buf, size_t len, const char *dir, const char *base, const char *what) {
    int err = 0;
    snprintf(buf, len, "%s/%s.gz", dir, base);
    if (is_file(buf, &err))
        return true;
    snprintf(buf, len, "%s/%s", dir, base);
    if (is_file(buf, &err))
        return true;
    if (err)
        fr_error(FR_ERR_IO, "%s: cannot look for %s or %s.gz in %s: %s", what, base, base, dir,
                 strerror(err));
    else
        fr_error(FR_ERR_IO, "%s: no %s or %s.gz in %s", what, base, base, dir);
    return false;
}

/* The first `limit` images of ds, as a dataset of their own (ds is freed). */
static fr_dataset *take_first(fr_dataset *ds, int64_t limit) {
    if (!ds || limit <= 0 || limit >= ds->n)
        return ds;
    fr_dataset *sub = fr_dataset_new(ds->name, limit, ds->c, ds->h, ds->w, ds->num_classes);
    if (sub) {
        memcpy(fr_data(sub->images), fr_data(ds->images), (size_t)(limit * ds->c * ds->h * ds->w));
        memcpy(fr_data(sub->labels), fr_data(ds->labels), (size_t)limit * sizeof(int32_t));
    }
    fr_dataset_free(ds);
    return sub;
}

fr_dataset *fr_data_open(const fr_data_spec *spec, bool train, int64_t limit) {
    char images[1100], labels[1100], sub[1100];
    fr_dataset *ds = NULL;
    const char *what = data_kind_names[spec->kind];
    switch (spec->kind) {
    case FR_DATA_FASHION_MNIST:
    case FR_DATA_MNIST:
        if (fr_dataset_check_dir(what, spec->dir) == FR_OK &&
            find_idx(images, sizeof images, spec->dir,
                     train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", what) &&
            find_idx(labels, sizeof labels, spec->dir,
                     train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", what))
            ds = fr_dataset_load_idx_classes(images, labels,
                                             spec->num_classes ? spec->num_classes : FR_IDX_MNIST_CLASSES);
        break;
    case FR_DATA_CIFAR10:
        ds = fr_dataset_load_cifar10(spec->dir, train);
        break;
    case FR_DATA_CIFAR100:
        ds = fr_dataset_load_cifar100(spec->dir, train);
        break;
    case FR_DATA_FOLDER:
        /* the test split's labels are the training split's class names:
         * the same name, the same label, whichever classes each split holds;
         * --limit-* take a stratified prefix (dataset.h) */
        snprintf(sub, sizeof sub, "%s/%s", spec->dir, train ? "train" : "test");
        snprintf(labels, sizeof labels, "%s/train", spec->dir);
        if (fr_dataset_check_dir(what, spec->dir) == FR_OK)
            ds = fr_dataset_load_folder_split(sub, spec->channels, train ? NULL : labels, limit);
        break;
    default:
        fr_error(FR_ERR_ARG, "data: unknown kind %d", (int)spec->kind);
        break;
    }
    /* a split of no images is refused here, where the file is known: it
     * trained nothing or "validated" to a loss and accuracy of 0 */
    if (ds && ds->n == 0) {
        bool idx = spec->kind == FR_DATA_FASHION_MNIST || spec->kind == FR_DATA_MNIST;
        fr_error(FR_ERR_FORMAT, "%s: the %s split %s holds no images", what,
                 train ? "training" : "test", idx ? images : spec->dir);
        fr_dataset_free(ds);
        return NULL;
    }
    return take_first(ds, limit);
}

bool fr_data_augment_default(fr_data_kind kind) {
    return kind != FR_DATA_FASHION_MNIST && kind != FR_DATA_MNIST;
}

/* MNIST's usual normalisation (pixel mean and spread of its training set). */
static const float mnist_mean[1] = {0.1307f}, mnist_std[1] = {0.3081f};

fr_augment fr_data_augment(fr_data_kind kind, const fr_dataset *ds, bool augment) {
    fr_augment a = {0};
    const float *mean = NULL, *std = NULL;
    switch (kind) {
    case FR_DATA_FASHION_MNIST:
        mean = fr_fashion_mnist_mean;
        std = fr_fashion_mnist_std;
        a.pad = augment ? 2 : 0;
        a.flip = augment;
        break;
    case FR_DATA_MNIST:
        mean = mnist_mean;
        std = mnist_std;
        /* digits are not mirror-symmetric: crop only */
        a.pad = augment ? 2 : 0;
        break;
    case FR_DATA_CIFAR10:
        mean = fr_cifar10_mean;
        std = fr_cifar10_std;
        a.pad = augment ? 4 : 0;
        a.flip = augment;
        break;
    case FR_DATA_CIFAR100:
        mean = fr_cifar100_mean;
        std = fr_cifar100_std;
        a.pad = augment ? 4 : 0;
        a.flip = augment;
        break;
    default:
        a.pad = augment ? ds->h / 8 : 0;
        a.flip = augment;
        break;
    }
    for (int c = 0; c < FR_AUG_MAX_C && c < ds->c; c++) {
        /* unknown data: centre [0, 1] pixels on 0.5 with unit-ish spread */
        a.mean[c] = mean ? mean[c] : 0.5f;
        a.std[c] = std ? std[c] : 0.25f;
    }
    return a;
}

/* ---- progress ---- */

double fr_cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

char *fr_cli_format_duration(double seconds, char *buf, size_t len) {
    long s = seconds > 0 && seconds < 1e9 ? lround(seconds) : 0;
    if (s >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, len, "%ld:%02ld", s / 60, s % 60);
    return buf;
}

char *fr_cli_memory(fr_device dev, char *buf, size_t len) {
    char cur[32], peak[32];
    snprintf(buf, len, "mem %s peak %s", fr_mem_format_bytes(fr_mem_total_current(dev), cur, sizeof cur),
             fr_mem_format_bytes(fr_mem_total_peak(dev), peak, sizeof peak));
    return buf;
}

void fr_progress_init(fr_progress *p, FILE *out, fr_device dev, int64_t steps_total, int epochs, int every) {
    *p = (fr_progress){.out = out, .tty = isatty(fileno(out)), .every = every > 0 ? every : 50, .dev = dev,
                       .t_start = fr_cli_now(), .steps_total = steps_total, .epochs = epochs};
}

const char *fr_cli_format_acc(double acc, int digits, char *buf, size_t len) {
    if (isnan(acc))
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%.*f%%", digits, 100.0 * acc);
    return buf;
}

void fr_progress_step(fr_progress *p, int64_t epoch, int64_t step, int64_t per_epoch, double loss,
                      double acc, double images_per_s) {
    p->steps_done++;
    if (!p->tty && step % p->every != 0 && step != per_epoch)
        return;
    double elapsed = fr_cli_now() - p->t_start;
    int64_t left = p->steps_total - p->steps_done;
    double eta = p->steps_done ? elapsed / (double)p->steps_done * (double)left : 0;
    char eta_s[32], mem[96], amp[64] = "";
    if (p->scaler && p->scaler->dtype != FR_F32)
        snprintf(amp, sizeof amp, "  scale %g skipped %lld", (double)p->scaler->scale,
                 (long long)p->scaler->skipped);
    char acc_s[16];
    fprintf(p->out, "%sepoch %lld/%d  step %lld/%lld  loss %.4f  acc %6s  %.0f img/s%s  ETA %s  %s%s",
            p->tty ? "\r" : "", (long long)epoch + 1, p->epochs, (long long)step, (long long)per_epoch, loss,
            fr_cli_format_acc(acc, 1, acc_s, sizeof acc_s), images_per_s, amp, fr_cli_format_duration(eta, eta_s, sizeof eta_s),
            fr_cli_memory(p->dev, mem, sizeof mem), p->tty ? "\033[K" : "\n");
    fflush(p->out);
    p->dirty = p->tty;
}

void fr_progress_break(fr_progress *p) {
    if (p->dirty)
        fputc('\n', p->out);
    p->dirty = false;
    fflush(p->out);
}
