/* bench_planner: step time against memory budget for the planner
 * (nn/planner.h), Chen's split and sqrt(N) segments.
 *
 *     bench_planner [--model resnet56] [--batch 64] [--budgets 10] [--steps 2]
 *
 * First the fixed schedules: plain, Chen's split (checkpoint) under plain
 * and under inplace+recompute, and checkpoint:K with K = sqrt(steps of the
 * sequence). Each gets its measured peak and median step time. Then the
 * planner at `--budgets` budgets from its feasible minimum to plain's peak,
 * and at each fixed schedule's measured peak (equal memory). Rows: budget,
 * planner's predicted and measured peak, measured step ms and its overhead
 * over plain's. Times are wall-clock on whatever else runs on the machine:
 * the load average is printed before and after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frugal.h"
#include "nn/planner.h"

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

/* One warm-up step, then `steps` timed: the median ms and the peak. */
static fr_status measure(bench *b, int accum, double *ms, size_t *peak) {
    double loss, t[64];
    FR_TRY(fr_train_step(b->m, b->opt, NULL, b->x, b->y, accum, &loss, NULL, NULL));
    fr_mem_reset_peak();
    for (int i = 0; i < b->steps; i++) {
        double t0 = now_ms();
        FR_TRY(fr_train_step(b->m, b->opt, NULL, b->x, b->y, accum, &loss, NULL, NULL));
        t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)b->steps, sizeof *t, cmp);
    *ms = t[b->steps / 2];
    *peak = fr_mem_total_peak(FR_CPU);
    return FR_OK;
}

static void load(const char *when) {
    double l[3] = {0};
    if (getloadavg(l, 3) == 3)
        printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

static double mib(double b) { return b / 1048576.0; }

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
    const char *fixed[] = {"plain", "checkpoint", "inplace+recompute+checkpoint", sqrt_k};
    enum { N_FIXED = sizeof fixed / sizeof *fixed };
    double fixed_ms[N_FIXED], plain_ms = 0;
    size_t fixed_peak[N_FIXED];
    printf("%s, batch %lld, %d steps in its sequence\n\n", b->m->name, (long long)n, units);
    printf("%-30s %12s %10s %9s\n", "fixed schedule", "peak MiB", "step ms", "overhead");
    for (int i = 0; i < N_FIXED; i++) {
        fr_plan_remove(b->m);
        FR_TRY(fr_strategy_parse(fixed[i], &b->m->cfg.strategy));
        FR_TRY(measure(b, 1, &fixed_ms[i], &fixed_peak[i]));
        if (i == 0)
            plain_ms = fixed_ms[0];
        printf("%-30s %12.2f %10.1f %+8.1f%%\n", fixed[i], mib((double)fixed_peak[i]), fixed_ms[i],
               100 * (fixed_ms[i] - plain_ms) / plain_ms);
    }
    printf("\n%-30s %12s %12s %10s %9s %6s %s\n", "planner at budget (MiB)", "predicted", "measured",
           "step ms", "overhead", "accum", "");
    for (int i = 0; i < budgets + N_FIXED - 1; i++) {
        bool equal = i >= budgets;
        size_t budget = equal ? fixed_peak[i - budgets + 1]
                              : (size_t)(lo + (hi - lo) * i / (budgets > 1 ? budgets - 1 : 1)) + 1;
        fr_status st = fr_plan_memory(b->m, b->x->shape, budget, &o, &plan);
        if (st != FR_OK) {
            printf("%-30.2f %s\n", mib((double)budget), fr_last_error());
            continue;
        }
        FR_TRY(fr_plan_apply(b->m, &plan));
        double ms;
        size_t peak;
        st = measure(b, plan.accum, &ms, &peak);
        if (st == FR_OK) {
            char label[64];
            snprintf(label, sizeof label, "%.2f%s%s", mib((double)budget), equal ? " = " : "",
                     equal ? fixed[i - budgets + 1] : "");
            printf("%-30.30s %12.2f %12.2f %10.1f %+8.1f%% %6d\n", label, mib(plan.predicted_peak),
                   mib((double)peak), ms, 100 * (ms - plain_ms) / plain_ms, plan.accum);
        }
        fr_memory_plan_free(&plan);
        FR_TRY(st);
    }
    return FR_OK;
}

int main(int argc, char **argv) {
    const char *model = "resnet56";
    int batch = 64, budgets = 10, steps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--batch"))
            batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--budgets"))
            budgets = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
    }
    if (batch < 1 || budgets < 1 || steps < 1 || steps > 64) {
        fprintf(stderr, "bench_planner: --batch, --budgets >= 1, --steps in [1, 64]\n");
        return 2;
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
    b.x = h ? fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(batch, 3, 32, 32), FR_TAG_DATA, h) : NULL;
    b.y = l ? fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, l) : NULL;
    free(h);
    free(l);
    load("before");
    fr_status st = b.opt && b.x && b.y ? run(&b, budgets) : fr_last_status();
    load("after");
    if (st != FR_OK)
        fprintf(stderr, "bench_planner: %s\n", fr_last_error());
    fr_release(b.x);
    fr_release(b.y);
    fr_optim_free(b.opt);
    fr_model_free(b.m);
    return st == FR_OK ? 0 : 1;
}
