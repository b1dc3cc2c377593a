/* program_memreport.c: the memreport program as a library call, fr_memreport_main
 * (programs/programs.h; examples/memreport.c is its main).
 *
 * memreport: how much memory one training step of a model needs under each
 * memory strategy, and where it goes.
 *
 *     memreport --model resnet56 --batch 64 --svg out.svg
 *
 * For every strategy it runs one warm-up step (forward, cross-entropy,
 * backward, SGD-momentum step; the first one creates the optimizer state),
 * then --steps timed steps (on the CPU after one more untimed step, which
 * refills the allocator's cache that resetting the peaks trimmed), and
 * prints one row: the peak bytes of each ledger tag over the timed steps,
 * the total peak, and the median step time. Then,
 * for plain (or the first strategy when plain is not in the list), the bytes
 * per tag at the moment the total peaked: where the peak comes from.
 * With --svg it draws the bytes in use over the first timed step of every
 * strategy on one chart (recorded by a fr_mem_set_trace observer).
 *
 * With --precision f16 or bf16 every strategy runs twice, in f32 and in that
 * precision (the model's autocast policy, nn/model.h), and the table shows
 * both rows and under them the difference by tag: what half activations
 * save.
 *
 * Inputs and labels are random: memory and time do not depend on values. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frugal.h"
#include "programs/cli_impl.h"
#include "programs/programs.h"
#include "programs/memreport.h"
#include "models/densenet.h"
#include "nn/init.h"
#include "train/optim.h"
#include "planner/planner.h"
#include "models/resnet.h"

#define MAX_STRATEGIES 16
#define MAX_ROWS (2 * MAX_STRATEGIES) /* each strategy in f32 and in --precision */
#define DEFAULT_STRATEGIES                                                                   \
    "plain,recompute,abn,checkpoint,recompute+checkpoint,abn+checkpoint,compress:8,"            \
    "abn+checkpoint+compress:4,abn+checkpoint+compress:2"
/* For models whose layers cannot take InPlace-ABN (DenseNet, pre-activation
 * ResNets: an activation's input is still read by someone else). */
#define DEFAULT_STRATEGIES_NO_ABN                                                            \
    "plain,recompute,checkpoint,recompute+checkpoint,compress:8,"                               \
    "recompute+checkpoint+compress:4,recompute+checkpoint+compress:2"
/* Ledger events kept for the plot and the peak's phase; a ResNet-56 step
 * makes a few thousand, a checkpointed DenseNet a few tens of thousands. */
#define TRACE_CAP (1u << 21)

/* The options, the trace and the table rows are in programs/memreport.h, which
 * the plot (programs/memreport_svg.c) shares. The trace is filled from the
 * ledger's observer, which runs with the ledger lock held, so it only writes
 * into memory allocated beforehand. */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void trace_event(void *user, fr_device dev, const fr_mem_stats *now) {
    trace_buf *t = user;
    if (!t->on || dev != t->device)
        return;
    if (t->n == t->cap) {
        t->overflow = true;
        return;
    }
    t->bytes[t->n] = now->total_current;
    t->ms[t->n] = now_ms() - t->t0;
    t->n++;
}

/* ---- one training step ---- */

typedef struct {
    fr_model *model;
    fr_optim *opt;
    fr_tensor *x;       // (N, C, H, W)
    fr_tensor *labels;  // (N)
    trace_buf *trace;
    series *marks;      /* the traced step's phase marks; NULL when untraced */
    int accum;          /* micro-batches (the planner's) */
} trainer;

/* fr_train_step's phase hook: notes where backward (the first
 * micro-batch's) and the optimizer step begin in the trace, and waits for
 * the device at the end so the step's time is the device's. */
static fr_status mark_phase(void *ctx, fr_step_phase phase, int micro, int parts) {
    (void)parts;
    trainer *tr = ctx;
    series *s = tr->marks;
    if (s && phase == FR_STEP_BACKWARD && micro == 0)
        s->backward_at = tr->trace->n - s->start;
    if (s && phase == FR_STEP_OPTIMIZER)
        s->optim_at = tr->trace->n - s->start;
    if (phase == FR_STEP_END && tr->x->storage->device == FR_CUDA)
        return fr_cuda_synchronize();
    return FR_OK;
}

/* forward, loss, backward, SGD step, zero_grad: the library's step
 * (train/train.h) in tr->accum micro-batches. When `s` is given, the trace
 * is on for this step and the phase boundaries are noted in `s`. */
static fr_status train_step(trainer *tr, series *s) {
    trace_buf *t = tr->trace;
    if (s) {
        s->start = t->n;
        t->t0 = now_ms();
        t->on = true;
    }
    tr->marks = s;
    const fr_step_hooks hooks = {.ctx = tr, .phase = mark_phase};
    tr->model->step_hooks = &hooks;
    fr_status st = fr_train_step(tr->model, tr->opt, NULL, tr->x, tr->labels, tr->accum > 1 ? tr->accum : 1,
                                 NULL, NULL, NULL);
    tr->model->step_hooks = NULL;
    tr->marks = NULL;
    if (s) {
        t->on = false;
        s->count = t->n - s->start;
    }
    return st;
}

/* ---- the model ---- */

static fr_model *create_model(const options *o) {
    /* any registered model (models/registry.h), the built-ins included */
    return fr_model_create(o->model, o->in_channels, o->classes, o->seed);
}

/* Random inputs and labels on the device, tagged as data. */
static fr_status make_batch(const options *o, trainer *tr) {
    size_t n = (size_t)o->batch * (size_t)o->in_channels * (size_t)o->size * (size_t)o->size;
    float *x = malloc(n * sizeof *x);
    int32_t *y = malloc((size_t)o->batch * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return fr_error(FR_ERR_OOM, "memreport: out of host memory for a batch of %d", o->batch);
    }
    fr_rng rng;
    fr_rng_seed(&rng, o->seed + 1);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)fr_rng_normal(&rng);
    for (int i = 0; i < o->batch; i++)
        y[i] = (int32_t)(fr_rng_next(&rng) % (uint64_t)o->classes);
    tr->x = fr_from_host(o->device, FR_F32, 4, FR_SHAPE(o->batch, o->in_channels, o->size, o->size),
                         FR_TAG_DATA, x);
    tr->labels = fr_from_host(o->device, FR_I32, 1, FR_SHAPE(o->batch), FR_TAG_DATA, y);
    free(x);
    free(y);
    return tr->x && tr->labels ? FR_OK : fr_last_status();
}

/* ---- the table ---- */


static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}


/* Where the total peaked in the traced step: forward, backward or the step. */
static const char *peak_phase(const trace_buf *t, const series *s) {
    if (!s->count)
        return "?";
    size_t best = 0;
    for (size_t i = 1; i < s->count; i++)
        if (t->bytes[s->start + i] > t->bytes[s->start + best])
            best = i;
    return best < s->backward_at ? "forward" : best < s->optim_at ? "backward" : "sgd step";
}

static void run_strategy(const options *o, trainer *tr, row *r, const fr_memory_plan *plan) {
    tr->model->cfg.precision = r->precision;
    tr->accum = 1;
    fr_plan_remove(tr->model);
    tr->model->cfg.strategy = r->strategy;
    r->ok = false;
    if (r->planned) {
        if (fr_plan_apply(tr->model, plan) != FR_OK) {
            snprintf(r->error, sizeof r->error, "%s", fr_last_error());
            return;
        }
        tr->accum = plan->accum;
    }
    if (train_step(tr, NULL) != FR_OK) {
        snprintf(r->error, sizeof r->error, "%s", fr_last_error());
        return;
    }
    double *times = malloc((size_t)o->steps * sizeof *times);
    if (!times) {
        snprintf(r->error, sizeof r->error, "out of host memory");
        return;
    }
    fr_mem_reset_peak();
    bool hwm_restarted = fr_mem_process_reset_peak() == FR_OK;
    /* The reset gave back the cached blocks over the new bound (the earlier
     * rows' and most of this one's warm-up step: cpu/allocator.c), so one
     * more untimed step fills the cache again; its peaks are the timed
     * steps' (the same step), and the timings leave out its page faults. */
    if (o->device == FR_CPU && train_step(tr, NULL) != FR_OK) {
        snprintf(r->error, sizeof r->error, "%s", fr_last_error());
        free(times);
        return;
    }
    for (int i = 0; i < o->steps; i++) {
        double t0 = now_ms();
        if (train_step(tr, i == 0 ? &r->trace : NULL) != FR_OK) {
            snprintf(r->error, sizeof r->error, "%s", fr_last_error());
            free(times);
            return;
        }
        times[i] = now_ms() - t0;
    }
    fr_mem_get_stats(o->device, &r->mem);
    size_t rss;
    r->resident = 0;
    if (hwm_restarted)
        fr_mem_process(&rss, &r->resident);
    qsort(times, (size_t)o->steps, sizeof *times, cmp_double);
    r->step_ms = o->steps % 2 ? times[o->steps / 2]
                              : 0.5 * (times[o->steps / 2 - 1] + times[o->steps / 2]);
    free(times);
    r->ok = true;
}

static const fr_mem_tag table_tags[] = {FR_TAG_SAVED, FR_TAG_TRANSIENT, FR_TAG_PARAM, FR_TAG_GRAD,
                                        FR_TAG_OPTIM, FR_TAG_WORKSPACE, FR_TAG_DATA};
enum { N_TABLE_TAGS = sizeof table_tags / sizeof *table_tags };
FR_STATIC_ASSERT((int)N_TABLE_TAGS == (int)FR_TAG_COUNT, "the table shows every tag");

/* The row of `precision` the others of that precision are compared with:
 * plain when it was run, else the first. */
static const row *reference_row(const row *rows, int n, fr_dtype precision) {
    for (int i = 0; i < n; i++)
        if (rows[i].precision == precision && fr_strategy_equal(rows[i].strategy, FR_STRATEGY_PLAIN))
            return &rows[i];
    for (int i = 0; i < n; i++)
        if (rows[i].precision == precision)
            return &rows[i];
    return &rows[0];
}

static void print_row(const row *r, const row *ref, const trace_buf *t, bool two) {
    printf("%-22s", r->name);
    if (two)
        printf(" %5s", fr_dtype_name(r->precision));
    if (!r->ok) {
        printf(" error: %s\n", r->error);
        return;
    }
    for (int k = 0; k < N_TABLE_TAGS; k++)
        printf(" %10.2f", fr_memreport_mib(r->mem.peak[table_tags[k]]));
    printf(" %10.2f", fr_memreport_mib(r->mem.total_peak));
    if (ref->ok)
        printf(" %9.2fx", (double)r->mem.total_peak / (double)ref->mem.total_peak);
    else
        printf(" %10s", "-");
    printf(" %9s %9.1f%s\n", peak_phase(t, &r->trace), r->step_ms, r->strategy.abn ? " *" : "");
}

/* half minus f32, tag by tag (MiB, signed), and the ratio of the totals */
static void print_difference(const row *half, const row *full) {
    char what[32];
    snprintf(what, sizeof what, "  %s - %s", fr_dtype_name(half->precision), fr_dtype_name(full->precision));
    printf("%-22s %5s", what, "");
    for (int k = 0; k < N_TABLE_TAGS; k++)
        printf(" %+10.2f", fr_memreport_mib(half->mem.peak[table_tags[k]]) - fr_memreport_mib(full->mem.peak[table_tags[k]]));
    printf(" %+10.2f", fr_memreport_mib(half->mem.total_peak) - fr_memreport_mib(full->mem.total_peak));
    printf(" %9.2fx\n", (double)half->mem.total_peak / (double)full->mem.total_peak);
}

static void print_table(const options *o, const row *rows, int n, const trace_buf *t) {
    bool two = o->precision != FR_F32;
    printf("%-22s", "strategy");
    if (two)
        printf(" %5s", "prec");
    for (int k = 0; k < N_TABLE_TAGS; k++)
        printf(" %10s", fr_mem_tag_name(table_tags[k]));
    const row *ref = reference_row(rows, n, FR_F32);
    char vs[32];
    snprintf(vs, sizeof vs, "vs %.*s", 10, ref->name);
    printf(" %10s %10s %9s %9s\n", "total", vs, "peak in", "step ms");
    bool any_abn = false;
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        any_abn |= r->ok && r->strategy.abn;
        print_row(r, reference_row(rows, n, r->precision), t, two);
        /* rows come in pairs (f32, half) when two precisions run */
        if (two && r->precision != FR_F32 && i > 0 && rows[i - 1].ok && r->ok)
            print_difference(r, &rows[i - 1]);
    }
    printf("\nMiB; each tag column is that tag's own peak during the step (forward, backward, SGD\n"
           "step), so the tags need not add up to the total, which is the most bytes in use at\n"
           "once on %s. \"peak in\": the phase in which the total peaked. step ms: median of %d\n"
           "timed step(s) after one warm-up, forward + cross-entropy + backward + SGD step.\n",
           fr_device_name(o->device), o->steps);
    if (two)
        printf("%s rows: activations in %s under autocast, weights and optimizer state in f32, no\n"
               "loss scaling. \"%s - f32\": the %s row minus the f32 row, tag by tag (negative: %s\n"
               "saves); its \"vs\" column is the %s total over the f32 total. Other rows compare with\n"
               "the %s row of their own precision.\n",
               fr_dtype_name(o->precision), fr_dtype_name(o->precision), fr_dtype_name(o->precision),
               fr_dtype_name(o->precision), fr_dtype_name(o->precision), fr_dtype_name(o->precision),
               ref->name);
    if (any_abn)
        printf("* abn (InPlace-ABN) replaces ReLU by leaky ReLU (slope %g) and BN's scale gamma by\n"
               "  |gamma| + eps: a different function from the other rows (same shapes and cost).\n",
               (double)FR_ABN_SLOPE);
    for (int i = 0; i < n; i++)
        if (rows[i].ok && rows[i].strategy.checkpoint < 0) {
            printf("checkpoint: segments chosen from the bytes each block was measured to keep\n"
                   "  (nn/seg_split.h); checkpoint:K puts K blocks in a segment.\n");
            break;
        }
}

/* What the process really held beside what the ledger counted (CPU). */
static void print_real_memory(const row *rows, int n) {
    printf("\nreal memory over the timed steps (MiB): allocated = the ledger's peak, reserved = the\n"
           "caching allocator's peak (blocks in use at their rounded size + cached ones), resident =\n"
           "the process's peak resident set (VmHWM, restarted for each row; code, libraries and\n"
           "thread stacks included)\n");
    printf("%-22s %10s %10s %8s %10s\n", "strategy", "allocated", "reserved", "res/all", "resident");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        if (!r->ok)
            continue;
        printf("%-22s %10.2f %10.2f %7.2fx", r->label, fr_memreport_mib(r->mem.total_peak), fr_memreport_mib(r->mem.reserved_peak),
               r->mem.total_peak ? (double)r->mem.reserved_peak / (double)r->mem.total_peak : 0.0);
        if (r->resident)
            printf(" %10.2f\n", fr_memreport_mib(r->resident));
        else
            printf(" %10s\n", "-");
    }
}

static void print_peak_breakdown(const row *r) {
    if (!r->ok)
        return;
    char b[32];
    printf("\nwhere the %s peak of %s comes from (bytes in use per tag when it was reached):\n",
           r->label, fr_mem_format_bytes(r->mem.total_peak, b, sizeof b));
    for (int k = 0; k < N_TABLE_TAGS; k++) {
        size_t v = r->mem.at_peak[table_tags[k]];
        printf("  %-11s %12s  %5.1f%%\n", fr_mem_tag_name(table_tags[k]),
               fr_mem_format_bytes(v, b, sizeof b),
               r->mem.total_peak ? 100.0 * (double)v / (double)r->mem.total_peak : 0.0);
    }
}

/* ---- the program ---- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: memreport [options]\n"
            "  --model NAME        resnet<6n+2>, preresnet<9n+2>, densenet-bc-<L>[-k<K>]\n"
            "                      (default resnet56)\n"
            "  --batch N           batch size (default 64)\n"
            "  --size N            image height and width (default 32)\n"
            "  --in-channels N     image channels (default 3)\n"
            "  --classes N         classes (default 10)\n"
            "  --strategies LIST   comma-separated strategies, each plain or a '+'-joined set of\n"
            "                      recompute, abn, checkpoint[:K], compress[:8|4|2]\n"
            "                      (default %s;\n"
            "                      for DenseNets and pre-activation ResNets, without abn)\n"
            "  --device cpu|cuda   (default cpu)\n"
            "  --precision P       f32 (default), f16 or bf16: with f16 or bf16 each strategy runs\n"
            "                      in f32 and in P, and the table shows the difference by tag\n"
            "  --steps N           timed steps per strategy after one warm-up (default 1)\n"
            "  --svg FILE          write memory over one step, all strategies, as SVG\n"
            "  --svg-x events|time the plot's x axis (default events)\n"
            "  --seed N            weights and data (default 1)\n"
            "  --memory-limit SIZE cap the memory ledger of each device (K, M or G suffix): a\n"
            "                      strategy that needs more fails with an out-of-memory error\n"
            "  --memory-budget SIZE  will it fit? first, per strategy (--strategies, or a default\n"
            "                      list) and for the planner, the largest batch whose measured step\n"
            "                      fits SIZE and the budget --batch needs (planner/fit.c); then\n"
            "                      plan the fastest step that fits SIZE (planner/planner.h), print\n"
            "                      the plan and add its row (\"planned\"; with --svg also its\n"
            "                      predicted curve); without --strategies the other row is plain\n"
            "  --allow-compress    with --memory-budget: blocks may keep their saved activations\n"
            "                      compressed (compress:8/4/2: it changes the gradients)\n",
            DEFAULT_STRATEGIES);
}

/* fr_cli_int's digits-only integer (no blanks, signs or wrap-around). */
static bool parse_int(const char *flag, const char *text, int min, int *out) {
    int64_t v;
    if (fr_cli_int(flag, text, min, INT_MAX, &v) != FR_OK) {
        fprintf(stderr, "memreport: %s\n", fr_last_error());
        return false;
    }
    *out = (int)v;
    return true;
}

/* 0: run; 1: --help was printed; -1: a bad argument (a message was printed). */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.model = "resnet56", .batch = 64, .size = 32, .in_channels = 3, .classes = 10,
                   .steps = 1, .device = FR_CPU, .seed = 1};
    fr_cli_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--allow-compress")) {
            o->allow_compress = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "memreport: %s needs a value (or unknown option; see --help)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        if (fr_cli_seen_add(&seen, a, v) != FR_OK) {
            fprintf(stderr, "memreport: %s\n", fr_last_error());
            return -1;
        }
        int seed;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--strategies"))
            o->strategies = v;
        else if (!strcmp(a, "--svg"))
            o->svg = v;
        else if (!strcmp(a, "--batch")) {
            if (!parse_int(a, v, 1, &o->batch))
                return -1;
        } else if (!strcmp(a, "--size")) {
            if (!parse_int(a, v, 1, &o->size))
                return -1;
        } else if (!strcmp(a, "--in-channels")) {
            if (!parse_int(a, v, 1, &o->in_channels))
                return -1;
        } else if (!strcmp(a, "--classes")) {
            if (!parse_int(a, v, 1, &o->classes))
                return -1;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(a, v, 1, &o->steps))
                return -1;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_int(a, v, 0, &seed))
                return -1;
            o->seed = (uint64_t)seed;
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu"))
                o->device = FR_CPU;
            else if (!strcmp(v, "cuda"))
                o->device = FR_CUDA;
            else {
                fprintf(stderr, "memreport: --device is cpu or cuda, got \"%s\"\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--precision")) {
            if (fr_precision_parse(v, &o->precision) != FR_OK) {
                fprintf(stderr, "memreport: --precision: \"%s\" is not a precision (choose f32, f16 or "
                        "bf16)\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--memory-limit") || !strcmp(a, "--memory-budget")) {
            if (fr_cli_size(a, v, a[9] == 'l' ? &o->memory_limit : &o->memory_budget) != FR_OK) {
                fprintf(stderr, "memreport: %s\n", fr_last_error());
                return -1;
            }
        } else if (!strcmp(a, "--svg-x")) {
            if (strcmp(v, "events") && strcmp(v, "time")) {
                fprintf(stderr, "memreport: --svg-x is events or time, got \"%s\"\n", v);
                return -1;
            }
            o->svg_time = !strcmp(v, "time");
        } else {
            fprintf(stderr, "memreport: unknown option %s (see --help)\n", a);
            return -1;
        }
    }
    /* Each flag is range-checked alone; their product, the batch's bytes,
     * could still wrap a size_t (--size 1073741824 wrapped to 0 and the fill
     * wrote past a malloc(0)). */
    size_t bytes = sizeof(float);
    if (__builtin_mul_overflow(bytes, (size_t)o->batch, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)o->in_channels, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)o->size, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)o->size, &bytes) || bytes > (size_t)PTRDIFF_MAX) {
        fprintf(stderr, "memreport: a batch of --batch %d x --in-channels %d x --size %d x %d "
                "floats does not fit in the address space\n", o->batch, o->in_channels, o->size,
                o->size);
        return -1;
    }
    /* before any step is measured: memreport reads no file to protect */
    if (o->svg && fr_outfile_check("--svg", o->svg, NULL, 0) != FR_OK) {
        fprintf(stderr, "memreport: %s\n", fr_last_error());
        return -1;
    }
    if (o->allow_compress && !o->memory_budget) {
        fprintf(stderr, "memreport: --allow-compress lets the --memory-budget planner compress "
                "blocks and needs --memory-budget; without a budget name compress:B in "
                "--strategies\n");
        return -1;
    }
    o->strategies_given = o->strategies != NULL;
    if (!o->strategies && o->memory_budget)
        o->strategies = "plain";
    if (!o->strategies)
        o->strategies = !strncmp(o->model, "densenet", 8) || !strncmp(o->model, "preresnet", 9)
                            ? DEFAULT_STRATEGIES_NO_ABN
                            : DEFAULT_STRATEGIES;
    return 0;
}

/* Splits the comma-separated list into rows, each strategy in f32 and,
 * when `precision` is a half dtype, in it too; false with a message. */
static bool parse_strategies(const char *list, fr_dtype precision, row *rows, int *n) {
    *n = 0;
    int per = precision != FR_F32 ? 2 : 1; /* rows per strategy */
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char word[64];
        if (len == 0 || len >= sizeof word || *n / per == MAX_STRATEGIES) {
            fprintf(stderr, "memreport: bad --strategies \"%s\" (at most %d, comma-separated)\n", list,
                    MAX_STRATEGIES);
            return false;
        }
        memcpy(word, p, len);
        word[len] = '\0';
        row *r = &rows[(*n)++];
        memset(r, 0, sizeof *r);
        if (fr_strategy_parse(word, &r->strategy) != FR_OK) {
            fprintf(stderr, "memreport: --strategies: %s\n", fr_last_error());
            return false;
        }
        fr_strategy_format(r->strategy, r->name, sizeof r->name);
        snprintf(r->label, sizeof r->label, "%s", r->name);
        if (precision != FR_F32) {
            row *h = &rows[(*n)++];
            *h = *r;
            h->precision = precision;
            snprintf(h->label, sizeof h->label, "%s %s", r->name, fr_dtype_name(precision));
            snprintf(r->label, sizeof r->label, "%s f32", r->name);
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (*n == 0) {
        fprintf(stderr, "memreport: --strategies is empty\n");
        return false;
    }
    return true;
}

/* --memory-budget: will it fit? (planner/fit.c) For the strategies of
 * --strategies (f32 rows; without it the library's list) and the planner:
 * the largest batch whose measured step fits, and what --batch needs. */
static fr_status will_it_fit(const options *o, trainer *tr, const row *rows, int n_rows) {
    fr_strategy s[MAX_STRATEGIES];
    int n = 0;
    for (int i = 0; o->strategies_given && i < n_rows && n < MAX_STRATEGIES; i++)
        if (rows[i].precision == FR_F32)
            s[n++] = rows[i].strategy;
    tr->model->cfg.precision = o->precision;
    fr_fit_options fo = {.optim_bytes = fr_plan_optim_bytes(tr->opt), .strategies = n ? s : NULL,
                         .n_strategies = n, .planner = true,
                         .plan = {.allow_compress = o->allow_compress}};
    fr_fit_report fit;
    FR_TRY(fr_fit(tr->model, FR_SHAPE(o->batch, o->in_channels, o->size, o->size), o->memory_budget, &fo,
                  &fit));
    fr_fit_print(&fit, stdout);
    printf("\n");
    fr_fit_report_free(&fit);
    tr->model->cfg.strategy = FR_STRATEGY_PLAIN;
    return FR_OK;
}

static int memreport_main(int argc, char **argv);

int fr_memreport_main(int argc, char **argv) {
    return fr_cli_exit("memreport", memreport_main(argc, argv));
}

static int memreport_main(int argc, char **argv) {
    options o;
    static row rows[MAX_ROWS + 1]; /* + the planner's */
    int n_rows;
    fr_memory_plan plan = {0};
    int args = parse_args(argc, argv, &o);
    if (args != 0)
        return args > 0 ? 0 : 2;
    if (!parse_strategies(o.strategies, o.precision, rows, &n_rows))
        return 2;
    fr_cli_apply_limits(0, o.memory_limit); /* memreport takes no --threads */
    if (o.device == FR_CUDA && fr_cuda_device_count() == 0) {
        fprintf(stderr, "memreport: --device cuda, but %s\n", fr_cuda_unavailable_reason());
        return 1;
    }
    trace_buf trace = {.cap = TRACE_CAP, .device = o.device};
    trace.bytes = malloc(trace.cap * sizeof *trace.bytes);
    trace.ms = malloc(trace.cap * sizeof *trace.ms);
    trainer tr = {.trace = &trace};
    int rc = 1;
    if (!trace.bytes || !trace.ms) {
        fprintf(stderr, "memreport: out of host memory for the trace\n");
        goto out;
    }
    tr.model = create_model(&o);
    if (!tr.model || (o.device != FR_CPU && fr_params_to_device(tr.model->params, o.device) != FR_OK) ||
        !(tr.opt = fr_sgd_new(tr.model->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9}))) {
        fprintf(stderr, "memreport: %s\n", fr_last_error());
        goto out;
    }
    char pbytes[32];
    printf("memreport: %s, %lld parameters (%s with buffers); batch %d of %dx%dx%d, %d classes; "
           "%s; SGD momentum 0.9; precision %s\n\n",
           tr.model->name, (long long)fr_params_count(tr.model->params),
           fr_mem_format_bytes(fr_params_bytes(tr.model->params), pbytes, sizeof pbytes), o.batch,
           o.in_channels, o.size, o.size, o.classes, fr_device_name(o.device),
           o.precision == FR_F32 ? "f32" : o.precision == FR_F16 ? "f32 and f16" : "f32 and bf16");
    /* before the batch and the optimizer state exist: the trials hold their own */
    if (o.memory_budget && will_it_fit(&o, &tr, rows, n_rows) != FR_OK) {
        fprintf(stderr, "memreport: --memory-budget: %s\n", fr_last_error());
        goto out;
    }
    if (make_batch(&o, &tr) != FR_OK) {
        fprintf(stderr, "memreport: %s\n", fr_last_error());
        goto out;
    }
    if (o.memory_budget) {
        /* the planner's row: one more, in --precision */
        tr.model->cfg.precision = o.precision;
        fr_plan_options po = {.optim_bytes = fr_plan_optim_bytes(tr.opt),
                              .allow_compress = o.allow_compress};
        if (fr_plan_memory(tr.model, tr.x->shape, o.memory_budget, &po, &plan) != FR_OK) {
            fprintf(stderr, "memreport: --memory-budget: %s\n", fr_last_error());
            goto out;
        }
        fr_plan_print(&plan, stdout);
        printf("\n");
        row *r = &rows[n_rows++];
        *r = (row){.planned = true, .strategy = plan.base, .precision = o.precision};
        snprintf(r->name, sizeof r->name, "planned");
        snprintf(r->label, sizeof r->label, "planned (%s)", fr_mem_format_bytes(o.memory_budget, pbytes, sizeof pbytes));
    }
    fr_mem_set_trace(trace_event, &trace);
    for (int i = 0; i < n_rows; i++)
        run_strategy(&o, &tr, &rows[i], &plan);
    fr_mem_set_trace(NULL, NULL);
    print_table(&o, rows, n_rows, &trace);
    if (o.device == FR_CPU)
        print_real_memory(rows, n_rows);
    if (plan.units && rows[n_rows - 1].ok) {
        printf("\n");
        fr_plan_print_measured(&plan, rows[n_rows - 1].mem.total_peak, 0, stdout);
    }
    print_peak_breakdown(reference_row(rows, n_rows, FR_F32));
    if (o.precision != FR_F32)
        print_peak_breakdown(reference_row(rows, n_rows, o.precision));
    if (trace.overflow)
        printf("note: the trace filled its %u samples; the plot and \"peak in\" miss the rest\n",
               TRACE_CAP);
    rc = 0;
    for (int i = 0; i < n_rows; i++)
        if (!rows[i].ok)
            rc = 1;
    if (o.svg) {
        if (fr_memreport_svg(&o, tr.model, rows, n_rows, &trace, &plan) != 0)
            rc = 1;
        else
            printf("\nwrote %s\n", o.svg);
    }
out:
    fr_memory_plan_free(&plan);
    fr_optim_free(tr.opt);
    fr_release(tr.x);
    fr_release(tr.labels);
    fr_model_free(tr.model);
    free(trace.bytes);
    free(trace.ms);
    return rc;
}
