/* bench_models.c: whole training steps of CIFAR models under each memory
 * strategy: the bytes the tape keeps for backward, and the step time.
 * bench/torch_saved.py measures the same architectures in PyTorch and
 * bench/join.py prints both side by side with the targets (bench/README.md
 * says exactly what each column counts).
 *
 * `bench_models --list` prints the model cases, which torch_saved.py reads,
 * so both sides build the same models at the same batch.
 *
 * Records (tab-separated, beside bench_ops' # / S / C / R):
 *   C   models  model  0  batch=B size=S in_channels=C classes=K steps=N
 *                                             a model case (--list only)
 *   MS  model   title                         a model's heading
 *   M   model   strategy  impl  metric  value  [best]
 *                                             a measurement; metrics:
 *     saved_act   peak of FR_TAG_SAVED over the timed steps (bytes):
 *                 activations the tape keeps; parameters and the batch keep
 *                 their own tags and are not in it
 *     saved_held  bytes of parameters, buffers, images and labels that the
 *                 tape held at the end of the forward (the loss included)
 *     saved_all   saved_act + saved_held: what PyTorch's saved-tensor hooks
 *                 see
 *     peak_total  the most bytes in use at once, all tags
 *     step_ms     median time of forward + cross-entropy + backward + SGD
 *                 step (momentum 0.9) + zero_grad; best = fastest step */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "frugal.h"
#include "nn/densenet.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/resnet.h"

enum { MAX_STEPS = 32, BATCH = 64, SIZE = 32, IN_CHANNELS = 3, CLASSES = 10 };

typedef struct {
    const char *name;        /* as fr_resnet_create / fr_densenet_create take it */
    const char *strategies;  /* comma-separated */
    int steps;               /* timed steps; big models get fewer */
} model_case;

/* The models: ResNet-56 and DenseNet-BC-100 at batch 64 on CIFAR
 * shapes. DenseNet takes no abn (nn/densenet.h); its "efficient" variant is
 * the recompute strategy; its inplace keeps what plain keeps (memreport shows
 * it) and is left out to keep `make bench` short: a DenseNet-BC-100 step takes
 * seconds here. */
static const model_case cases[] = {
    {"resnet56", "plain,inplace,recompute,abn,checkpoint,recompute+checkpoint,abn+checkpoint", 3},
    {"densenet-bc-100", "plain,recompute,checkpoint,recompute+checkpoint", 2},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static fr_model *create(const char *name) {
    if (!strncmp(name, "densenet", 8))
        return fr_densenet_create(name, 0, IN_CHANNELS, CLASSES, 1);
    return fr_resnet_create(name, IN_CHANNELS, CLASSES, 1);
}

typedef struct {
    fr_model *model;
    fr_optim *opt;
    fr_tensor *x;       // (N, C, H, W)
    fr_tensor *labels;  // (N)
} trainer;

/* Bytes of the registry's tensors and the batch that some tape entry holds
 * now. Parameters are saved under their own tag, so the ledger's SAVED
 * figure leaves them out; this is what it leaves out. */
static size_t held_outside_saved(const trainer *tr) {
    size_t bytes = 0;
    const fr_params *p = tr->model->params;
    for (int i = 0; i < p->count; i++)
        if (p->items[i].tensor->storage->saved_count > 0)
            bytes += p->items[i].tensor->storage->nbytes;
    if (tr->x->storage->saved_count > 0)
        bytes += tr->x->storage->nbytes;
    if (tr->labels->storage->saved_count > 0)
        bytes += tr->labels->storage->nbytes;
    return bytes;
}

/* One training step; `held` (may be NULL) receives held_outside_saved at
 * the end of the forward. */
static fr_status train_step(trainer *tr, size_t *held) {
    fr_tensor *logits = fr_model_forward(tr->model, tr->x, true);
    fr_tensor *loss = logits ? fr_cross_entropy(logits, tr->labels) : NULL;
    fr_release(logits);
    fr_status st = loss ? FR_OK : fr_last_status();
    if (loss && held)
        *held = held_outside_saved(tr);
    if (loss)
        st = fr_backward(loss);
    fr_release(loss);
    if (st == FR_OK)
        st = fr_optim_step(tr->opt);
    fr_tape_clear();
    fr_optim_zero_grad(tr->opt);
    return st;
}

static fr_status make_batch(trainer *tr) {
    enum { N = BATCH * IN_CHANNELS * SIZE * SIZE };
    static float x[N];
    static int32_t y[BATCH];
    fr_rng rng;
    fr_rng_seed(&rng, 2);
    for (int i = 0; i < N; i++)
        x[i] = (float)fr_rng_normal(&rng);
    for (int i = 0; i < BATCH; i++)
        y[i] = (int32_t)(fr_rng_next(&rng) % CLASSES);
    tr->x = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(BATCH, IN_CHANNELS, SIZE, SIZE), FR_TAG_DATA, x);
    tr->labels = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(BATCH), FR_TAG_DATA, y);
    return tr->x && tr->labels ? FR_OK : fr_last_status();
}

/* One strategy: a warm-up step (the first also creates the optimizer
 * state, so every measured step starts with it), then `steps` timed ones. */
static fr_status run_strategy(trainer *tr, const char *model, const char *text, int steps) {
    fr_strategy s;
    FR_TRY(fr_strategy_parse(text, &s));
    char name[64];
    fr_strategy_format(s, name, sizeof name);
    tr->model->cfg.strategy = s;
    FR_TRY(train_step(tr, NULL));
    fr_mem_reset_peak();
    double ms[MAX_STEPS];
    size_t held = 0;
    for (int i = 0; i < steps; i++) {
        double t0 = now_ms();
        FR_TRY(train_step(tr, i == 0 ? &held : NULL));
        ms[i] = now_ms() - t0;
    }
    size_t saved = fr_mem_peak(FR_CPU, FR_TAG_SAVED);
    qsort(ms, (size_t)steps, sizeof ms[0], cmp_double);
    double median = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);
    printf("M\t%s\t%s\tfrugal\tsaved_act\t%zu\n", model, name, saved);
    printf("M\t%s\t%s\tfrugal\tsaved_held\t%zu\n", model, name, held);
    printf("M\t%s\t%s\tfrugal\tsaved_all\t%zu\n", model, name, saved + held);
    printf("M\t%s\t%s\tfrugal\tpeak_total\t%zu\n", model, name, fr_mem_total_peak(FR_CPU));
    printf("M\t%s\t%s\tfrugal\tstep_ms\t%.3f\t%.3f\n", model, name, median, ms[0]);
    fflush(stdout);
    return FR_OK;
}

static fr_status run_model(const model_case *c, int steps) {
    trainer tr = {0};
    fr_status st = FR_OK;
    tr.model = create(c->name);
    if (!tr.model || make_batch(&tr) != FR_OK ||
        !(tr.opt = fr_sgd_new(tr.model->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9}))) {
        st = fr_last_status();
        printf("# frugal: %s could not be built: %s\n", c->name, fr_last_error());
        goto out;
    }
    printf("MS\t%s\t%s (%lld parameters), batch %d, %dx%dx%d, %d classes, CPU, SGD momentum 0.9\n",
           c->name, tr.model->name, (long long)fr_params_count(tr.model->params), BATCH, IN_CHANNELS,
           SIZE, SIZE, CLASSES);
    const char *p = c->strategies;
    while (*p) {
        size_t len = strcspn(p, ",");
        char text[64];
        snprintf(text, sizeof text, "%.*s", (int)len, p);
        double t0 = now_ms();
        if (run_strategy(&tr, c->name, text, steps) != FR_OK) {
            /* Keep going: one failing strategy should not hide the others. */
            printf("# frugal: %s / %s failed: %s\n", c->name, text, fr_last_error());
            st = fr_last_status();
        }
        fprintf(stderr, "bench_models: %s %s took %.1f s\n", c->name, text, (now_ms() - t0) * 1e-3);
        p += len + (p[len] == ',');
    }
out:
    fr_optim_free(tr.opt);
    fr_release(tr.x);
    fr_release(tr.labels);
    fr_model_free(tr.model);
    return st;
}

static int usage(FILE *out, const char *prog, int code) {
    fprintf(out,
            "usage: %s [--list] [--match TEXT] [--steps N]\n"
            "  --list        print the model cases (for bench/torch_saved.py) and exit\n"
            "  --match TEXT  only the models whose name contains TEXT\n"
            "  --steps N     timed steps per strategy (default: 3 for ResNet-56, 2 for\n"
            "                DenseNet-BC-100), after one warm-up step\n",
            prog);
    return code;
}

int main(int argc, char **argv) {
    bool list = false;
    const char *match = NULL;
    int steps = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help"))
            return usage(stdout, argv[0], 0);
        else if (!strcmp(argv[i], "--list"))
            list = true;
        else if (!strcmp(argv[i], "--match") && i + 1 < argc)
            match = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else
            return usage(stderr, argv[0], 2);
    }
    if (steps < 0 || steps > MAX_STEPS)
        return usage(stderr, argv[0], 2);
    if (!list) {
        int omp = 1;
#ifdef _OPENMP
        omp = omp_get_max_threads();
#endif
        printf("# frugal models: OpenMP threads %d; one warm-up step per strategy, then the timed "
               "steps\n", omp);
    }
    int failed = 0;
    for (int i = 0; i < N_CASES; i++) {
        const model_case *c = &cases[i];
        if (match && !strstr(c->name, match))
            continue;
        int n = steps ? steps : c->steps;
        if (list) {
            printf("C\tmodels\t%s\t0\tbatch=%d size=%d in_channels=%d classes=%d steps=%d\n", c->name,
                   BATCH, SIZE, IN_CHANNELS, CLASSES, n);
            continue;
        }
        double t0 = now_ms();
        if (run_model(c, n) != FR_OK)
            failed++;
        fprintf(stderr, "bench_models: %s took %.1f s\n", c->name, (now_ms() - t0) * 1e-3);
    }
    if (fr_live_tensors() != 0)
        printf("# frugal: %ld tensors still alive at exit (a leak in the bench or a model)\n",
               fr_live_tensors());
    return failed ? 1 : 0;
}
