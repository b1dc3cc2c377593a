/* bench_planner: step time against memory budget for the planner
 * (planner/planner.h), Chen's split and sqrt(N) segments; bench/torch_checkpoint.py
 * measures PyTorch's checkpoint_sequential on the same model and
 * bench/planner_join.py prints both as a table and an SVG plot.
 *
 *     bench_planner [--model resnet56] [--batch 64] [--budgets 10] [--steps 3]
 *     bench_planner --budget BYTES [--allow-compress] [--allow-abn] [--max-accum N] ...
 *
 * With --budget, one plan only (issue 23's "largest batch at a fixed
 * budget": resnet56 --batch 640 --budget 286889984 --allow-compress
 * --max-accum 1): the plan printed (or the planner's refusal), then applied
 * and measured as below, the first step's peak (it creates the momentum)
 * and the timed steps' beside the budget.
 *
 * First the fixed schedules: plain, Chen's split (checkpoint) under plain
 * and under recompute, and checkpoint:K with K = floor(sqrt(steps of
 * the sequence)). Each gets its measured peak and median step time. Then the
 * planner at `--budgets` budgets from its feasible minimum to plain's
 * predicted peak, and at each non-plain fixed schedule's measured peak (equal
 * memory). Each measurement is one warm-up step, then `--steps` timed steps
 * of fr_train_step (forward, cross-entropy, backward, SGD momentum 0.9) on a
 * random normal batch with random labels; the peak is the ledger's
 * fr_mem_total_peak over the timed steps: every byte frugal allocates
 * (parameters, gradients, optimizer state, the batch, activations,
 * workspace). Times are wall-clock on whatever else runs on the machine:
 * the load average is recorded before and after.
 *
 * Records (tab-separated; bench/README.md, "The planner section"):
 *   # text                                    a note
 *   P  model  NAME  BATCH  UNITS  STEPS  THREADS
 *   P  load   before|after  L1  L5  L15
 *   P  fixed  SCHEDULE  PEAK_BYTES  MEDIAN_MS
 *   P  plan   BUDGET_BYTES  PREDICTED_PEAK  MEASURED_PEAK  MEDIAN_MS  ACCUM  EQUAL_TO
 *             EQUAL_TO: the fixed schedule whose measured peak is the budget,
 *             or "-" for the evenly spaced budgets
 * A budget the planner refuses is a "# planner: budget B: why" note. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "frugal.h"
#include "planner/planner.h"

enum { MAX_STEPS = 64, MAX_BUDGETS = 1000 };

typedef struct {
    fr_model *m;
    fr_optim *opt;
    fr_tensor *x, *y;
    int steps;
} bench;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One warm-up step (unless the caller just ran one), then `steps` timed:
 * the median ms and the peak. */
static fr_status measure(bench *b, int accum, bool warm, double *ms, size_t *peak) {
    double loss, t[MAX_STEPS];
    if (!warm)
        FR_TRY(fr_train_step(b->m, b->opt, NULL, b->x, b->y, accum, &loss, NULL, NULL));
    fr_mem_reset_peak();
    for (int i = 0; i < b->steps; i++) {
        double t0 = now_ms();
        FR_TRY(fr_train_step(b->m, b->opt, NULL, b->x, b->y, accum, &loss, NULL, NULL));
        t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)b->steps, sizeof *t, cmp);
    int h = b->steps / 2; /* the median; of an even count, the mean of the middle two */
    *ms = b->steps % 2 ? t[h] : 0.5 * (t[h - 1] + t[h]);
    *peak = fr_mem_total_peak(FR_CPU);
    return FR_OK;
}

static void load(const char *when) {
    double l[3] = {0};
    if (getloadavg(l, 3) == 3)
        printf("P\tload\t%s\t%.2f\t%.2f\t%.2f\n", when, l[0], l[1], l[2]);
    fflush(stdout);
}

static fr_status run(bench *b, int budgets) {
    int64_t n = b->x->shape[0];
    fr_plan_options o = {.optim_bytes = fr_plan_optim_bytes(b->opt)};
    fr_memory_plan plan;
    FR_TRY(fr_plan_memory(b->m, b->x->shape, SIZE_MAX / 2, &o, &plan));
    double lo = plan.leanest_peak, hi = plan.plain_peak;
    int units = plan.n_units;
    fr_memory_plan_free(&plan);
    char sqrt_k[32];
    int k = 1;
    while ((k + 1) * (k + 1) <= units)
        k++;
    snprintf(sqrt_k, sizeof sqrt_k, "checkpoint:%d", k);
    const char *fixed[] = {"plain", "checkpoint", "recompute+checkpoint", sqrt_k};
    enum { N_FIXED = sizeof fixed / sizeof *fixed };
    size_t fixed_peak[N_FIXED];
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("P\tmodel\t%s\t%lld\t%d\t%d\t%d\n", b->m->name, (long long)n, units, b->steps, threads);
    printf("# planner: %s batch %lld, %d steps in its sequence, OpenMP threads %d; per measurement "
           "1 warm-up step, median of %d timed; peaks: the ledger's total peak\n",
           b->m->name, (long long)n, units, threads, b->steps);
    fflush(stdout);
    for (int i = 0; i < N_FIXED; i++) {
        double ms;
        fr_plan_remove(b->m);
        FR_TRY(fr_strategy_parse(fixed[i], &b->m->cfg.strategy));
        FR_TRY(measure(b, 1, false, &ms, &fixed_peak[i]));
        printf("P\tfixed\t%s\t%zu\t%.3f\n", fixed[i], fixed_peak[i], ms);
        fflush(stdout);
    }
    for (int i = 0; i < budgets + N_FIXED - 1; i++) {
        bool equal = i >= budgets;
        size_t budget = equal ? fixed_peak[i - budgets + 1]
                              : (size_t)(lo + (hi - lo) * i / (budgets > 1 ? budgets - 1 : 1)) + 1;
        fr_status st = fr_plan_memory(b->m, b->x->shape, budget, &o, &plan);
        if (st != FR_OK) {
            printf("# planner: budget %zu: %s\n", budget, fr_last_error());
            continue;
        }
        st = fr_plan_apply(b->m, &plan);
        double ms = 0;
        size_t peak = 0;
        if (st == FR_OK)
            st = measure(b, plan.accum, false, &ms, &peak);
        if (st == FR_OK)
            printf("P\tplan\t%zu\t%.0f\t%zu\t%.3f\t%d\t%s\n", budget, plan.predicted_peak, peak, ms,
                   plan.accum, equal ? fixed[i - budgets + 1] : "-");
        fflush(stdout);
        fr_memory_plan_free(&plan);
        FR_TRY(st);
    }
    return FR_OK;
}

/* --budget: one plan, printed and measured. */
static fr_status run_one(bench *b, size_t budget, fr_plan_options o) {
    o.optim_bytes = fr_plan_optim_bytes(b->opt);
    fr_memory_plan plan;
    printf("# planner: %s batch %lld, budget %zu bytes, allow_compress %d, allow_abn %d, max_accum %d\n",
           b->m->name, (long long)b->x->shape[0], budget, o.allow_compress, o.allow_abn, o.max_accum);
    fflush(stdout);
    fr_status st = fr_plan_memory(b->m, b->x->shape, budget, &o, &plan);
    if (st != FR_OK) {
        printf("# planner: refused: %s\n# planner: min_budget %.0f\n", fr_last_error(), plan.min_budget);
        return FR_OK;
    }
    fr_plan_print(&plan, stdout);
    fflush(stdout);
    st = fr_plan_apply(b->m, &plan);
    double loss, ms = 0;
    size_t first = 0, peak = 0;
    if (st == FR_OK) {
        fr_mem_reset_peak();
        st = fr_train_step(b->m, b->opt, NULL, b->x, b->y, plan.accum, &loss, NULL, NULL);
        first = fr_mem_total_peak(FR_CPU);
    }
    if (st == FR_OK) /* the first step was the warm-up */
        st = measure(b, plan.accum, true, &ms, &peak);
    if (st == FR_OK) {
        fr_plan_print_measured(&plan, peak, 0, stdout);
        printf("P\tone\t%zu\t%.0f\t%.0f\t%zu\t%zu\t%.3f\t%d\n", budget, plan.predicted_peak,
               plan.verified_peak, first, peak, ms, plan.accum);
        printf("# planner: first step %zu bytes (%s), timed steps %zu (%s) against the budget %zu\n", first,
               first <= budget ? "fits" : "OVER", peak, peak <= budget ? "fits" : "OVER", budget);
    }
    fr_memory_plan_free(&plan);
    return st;
}

static int usage(FILE *out, const char *prog, int code) {
    fprintf(out,
            "usage: %s [--model NAME] [--batch N] [--budgets N] [--steps N]\n"
            "  --model NAME  a registered model (default resnet56)\n"
            "  --batch N     images per step, >= 1 (default 64)\n"
            "  --budgets N   evenly spaced budgets from the planner's feasible minimum to\n"
            "                plain's peak, 1 to %d (default 10); the equal-memory budgets\n"
            "                (each fixed schedule's measured peak) come on top\n"
            "  --steps N     timed steps per measurement, 1 to %d (default 3)\n"
            "  --budget B    one plan at B bytes, printed and measured (record: P one BUDGET\n"
            "                PREDICTED VERIFIED FIRST_STEP_PEAK PEAK MEDIAN_MS ACCUM)\n"
            "  --allow-compress, --allow-abn  with --budget: the planner may choose them\n"
            "  --max-accum N with --budget: at most N micro-batches (default: the batch)\n",
            prog, MAX_BUDGETS, MAX_STEPS);
    return code;
}

/* A whole decimal integer in [lo, hi], else false. */
static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv) {
    const char *model = "resnet56";
    int batch = 64, budgets = 10, steps = 3;
    long long one_budget = 0;
    fr_plan_options one = {0};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (!strcmp(flag, "--help"))
            return usage(stdout, argv[0], 0);
        if (!strcmp(flag, "--allow-compress") || !strcmp(flag, "--allow-abn")) {
            *(flag[8] == 'c' ? &one.allow_compress : &one.allow_abn) = true;
            continue;
        }
        bool known = !strcmp(flag, "--model") || !strcmp(flag, "--batch") ||
                     !strcmp(flag, "--budgets") || !strcmp(flag, "--steps") ||
                     !strcmp(flag, "--budget") || !strcmp(flag, "--max-accum");
        if (!known) {
            fprintf(stderr, "bench_planner: unknown argument '%s'\n", flag);
            return usage(stderr, argv[0], 2);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_planner: %s needs a value\n", flag);
            return 2;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(flag, "--model"))
            model = v;
        else if (!strcmp(flag, "--batch"))
            ok = parse_int(v, 1, INT_MAX / (3 * 32 * 32), &batch);
        else if (!strcmp(flag, "--budgets"))
            ok = parse_int(v, 1, MAX_BUDGETS, &budgets);
        else if (!strcmp(flag, "--max-accum"))
            ok = parse_int(v, 1, INT_MAX, &one.max_accum);
        else if (!strcmp(flag, "--budget")) {
            char *end;
            errno = 0;
            one_budget = strtoll(v, &end, 10);
            ok = !errno && end != v && !*end && one_budget > 0;
        }
        else
            ok = parse_int(v, 1, MAX_STEPS, &steps);
        if (!ok) {
            fprintf(stderr, "bench_planner: bad value '%s' for %s (see --help for its range)\n", v,
                    flag);
            return 2;
        }
    }
    bench b = {.steps = steps, .m = fr_model_create(model, 3, 10, 1)};
    if (!b.m) {
        fprintf(stderr, "bench_planner: %s\n", fr_last_error());
        return 1;
    }
    b.opt = fr_sgd_new(b.m->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9});
    size_t count = (size_t)batch * 3 * 32 * 32;
    float *h = malloc(count * sizeof *h);
    int32_t *l = calloc((size_t)batch, sizeof *l);
    fr_rng rng;
    fr_rng_seed(&rng, 1);
    for (size_t i = 0; h && i < count; i++)
        h[i] = (float)fr_rng_normal(&rng);
    for (int i = 0; l && i < batch; i++)
        l[i] = (int32_t)(fr_rng_next(&rng) % 10);
    b.x = h ? fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(batch, 3, 32, 32), FR_TAG_DATA, h) : NULL;
    b.y = l ? fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, l) : NULL;
    free(h);
    free(l);
    load("before");
    fr_status st = !(b.opt && b.x && b.y) ? fr_last_status()
                   : one_budget  ? run_one(&b, (size_t)one_budget, one)
                                 : run(&b, budgets);
    load("after");
    if (st != FR_OK)
        fprintf(stderr, "bench_planner: %s\n", fr_last_error());
    fr_release(b.x);
    fr_release(b.y);
    fr_optim_free(b.opt);
    fr_model_free(b.m);
    return st == FR_OK ? 0 : 1;
}
