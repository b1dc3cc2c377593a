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
 *                 step (momentum 0.9) + zero_grad; best = fastest step
 *
 * `bench_models --gpu` is the GPU section: the same models and strategies
 * trained on the CUDA device (ResNet-56 at batch 128, DenseNet-BC-100 at 64),
 * plus plain under mixed precision ("plain@bf16", "plain@f16": activations
 * in half, f16 with the dynamic loss scaler, as `train --precision` runs),
 * measured for throughput, the ledger's CUDA peak and the cudaMalloc calls
 * of the timed steps; `--gpu --list` prints its cases for torch_saved.py
 * --gpu. Without a usable device both print one `# gpu: skipped: why` note
 * and nothing else, and exit 0. Its records:
 *   C   gpu  model  0  batch=B size=S in_channels=C classes=K warmup=W steps=N
 *   GS  model  title
 *   G   model  strategy  impl  metric  value
 *     images_per_s    batch x timed steps / their time (device synchronised
 *                     before both clock readings)
 *     step_ms         the timed steps' time / their count
 *     peak_bytes      the ledger's CUDA total peak over the timed steps
 *     reserved_bytes  what the caching allocator holds from the driver after
 *                     them (the cache is emptied before each strategy)
 *     device_mallocs  cudaMalloc calls during the timed steps (target 0)
 *     warmup_mallocs  cudaMalloc calls during the warm-up steps
 *     at_peak_<tag>   the ledger's bytes per tag when the peak was reached */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "frugal.h"
#include "train/amp.h"
#include "models/densenet.h"
#include "nn/init.h"
#include "train/optim.h"
#include "models/resnet.h"

#include "examples/mobilenet_model.h"

enum { MAX_STEPS = 32, GPU_SIZE = 32, GPU_IN_CHANNELS = 3, CLASSES = 10 };
enum { GPU_WARMUP = 3, GPU_MAX_STEPS = 1000 };

typedef struct {
    const char *name;        /* as fr_resnet_create / fr_densenet_create take it */
    const char *strategies;  /* comma-separated */
    int steps;               /* timed steps on the CPU; big models get fewer */
    int gpu_batch;           /* the GPU section's batch (the issue's) */
    int gpu_steps;           /* the GPU section's timed steps */
    int batch, size, in_channels; /* the CPU section's images (the GPU's: 3x32x32) */
} model_case;

/* Run after each model's strategies in the GPU section: STRATEGY@PRECISION. */
static const char *const gpu_mixed = "plain@bf16,plain@f16";

/* The issue's models: ResNet-56 and DenseNet-BC-100 at batch 64 on CIFAR
 * shapes. DenseNet takes no abn (models/densenet.h); its "efficient" variant is
 * the recompute strategy. (The inplace strategy, which kept what plain keeps,
 * is folded into recompute: docs/MODELS.md.) */
static const model_case cases[] = {
    {"resnet56", "plain,recompute,abn,checkpoint,recompute+checkpoint,abn+checkpoint,"
     "compress:8,abn+compress:8,abn+checkpoint+compress:4,abn+checkpoint+compress:2", 3, 128,
     20, 64, 32, 3},
    {"densenet-bc-100", "plain,recompute,checkpoint,recompute+checkpoint,compress:8,"
     "recompute+checkpoint+compress:4,recompute+checkpoint+compress:2", 2, 64, 10, 64, 32, 3},
    /* the demo's model on Fashion-MNIST's shape (README, `make demo`): the
     * training speed the CPU targets quote against PyTorch */
    {"resnet20", "plain,recompute,checkpoint", 5, 128, 20, 128, 28, 1},
    /* examples/mobilenet.c's MobileNetV2-style net (depthwise 3x3,
     * squeeze-excitation, SiLU / hardswish, dropout 0.2) on CIFAR's shape;
     * bench/torch_models.py builds it from tests/fixtures/example_models.py */
    {"mobilenet_se", "plain,recompute,checkpoint,recompute+checkpoint", 5, 128, 20, 64, 32, 3},
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

static fr_model *create(const char *name, int in_channels) {
    if (!strcmp(name, "mobilenet_se"))
        return mobilenet_create(name, in_channels, CLASSES, 1);
    if (!strncmp(name, "densenet", 8))
        return fr_densenet_create(name, 0, in_channels, CLASSES, 1);
    return fr_resnet_create(name, in_channels, CLASSES, 1);
}

typedef struct {
    fr_model *model;
    fr_optim *opt;
    fr_tensor *x;       // (N, C, H, W)
    fr_tensor *labels;  // (N)
    fr_loss_scaler *scaler; /* mixed precision rows of the GPU section, else NULL */
    size_t *held;           /* where the step's hook notes held_outside_saved, or NULL */
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

/* fr_train_step's phase hook: notes held_outside_saved when the forward
 * (and the loss) is done, before backward frees anything. */
static fr_status note_held(void *ctx, fr_step_phase phase, int micro, int parts) {
    (void)micro;
    (void)parts;
    trainer *tr = ctx;
    if (phase == FR_STEP_BACKWARD)
        *tr->held = held_outside_saved(tr);
    return FR_OK;
}

/* One training step, the library's (train/train.h): forward,
 * cross-entropy, backward, the optimizer (or loss scaler) step, zero_grad;
 * `held` (may be NULL) receives held_outside_saved at the end of the
 * forward. */
static fr_status train_step(trainer *tr, size_t *held) {
    const fr_step_hooks hooks = {.ctx = tr, .phase = note_held};
    tr->held = held;
    tr->model->step_hooks = held ? &hooks : NULL;
    fr_status st = fr_train_step(tr->model, tr->opt, tr->scaler, tr->x, tr->labels, 1, NULL, NULL, NULL);
    tr->model->step_hooks = NULL;
    tr->held = NULL;
    return st;
}

/* Random images and labels, the same for every strategy, on `dev`. */
static fr_status make_batch(trainer *tr, fr_device dev, int batch, int in_channels, int size) {
    size_t n = (size_t)batch * in_channels * size * size;
    float *x = malloc(n * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return fr_error(FR_ERR_OOM, "bench_models: out of host memory for a batch of %d", batch);
    }
    fr_rng rng;
    fr_rng_seed(&rng, 2);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)fr_rng_normal(&rng);
    for (int i = 0; i < batch; i++)
        y[i] = (int32_t)(fr_rng_next(&rng) % CLASSES);
    tr->x = fr_from_host(dev, FR_F32, 4, FR_SHAPE(batch, in_channels, size, size), FR_TAG_DATA, x);
    tr->labels = fr_from_host(dev, FR_I32, 1, FR_SHAPE(batch), FR_TAG_DATA, y);
    free(x);
    free(y);
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
    fr_mem_stats before, after;
    fr_mem_get_stats(FR_CPU, &before);
    for (int i = 0; i < steps; i++) {
        double t0 = now_ms();
        FR_TRY(train_step(tr, i == 0 ? &held : NULL));
        ms[i] = now_ms() - t0;
    }
    /* the CPU caching allocator's system allocations in the timed steps */
    fr_mem_get_stats(FR_CPU, &after);
    printf("# frugal: %s / %s: %zu system allocations in %d timed steps, %.1f MiB reserved\n",
           model, name, after.device_mallocs - before.device_mallocs, steps,
           after.reserved / 1048576.0);
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

/* ---- the GPU section (--gpu) ---- */

/* Why the GPU section cannot run here, or NULL when it can. */
static const char *gpu_unavailable(void) {
    return fr_cuda_device_count() > 0 ? NULL : fr_cuda_unavailable_reason();
}

static void gpu_rate(const char *model, const char *strategy, const char *metric, double value) {
    printf("G\t%s\t%s\tfrugal\t%s\t%.3f\n", model, strategy, metric, value);
}

/* Bytes and counts, exactly. */
static void gpu_count(const char *model, const char *strategy, const char *metric, size_t value) {
    printf("G\t%s\t%s\tfrugal\t%s\t%zu\n", model, strategy, metric, value);
}

/* One strategy on the device: `warmup` untimed steps (the first creates the
 * momentum buffers and lets cuDNN choose its algorithms, the others let the
 * caching allocator reach its steady state), then `steps` timed ones with
 * the device synchronised before each clock reading, so the time is that of
 * the work, not of its enqueueing. The cache is emptied first, so the
 * reserved bytes and the warm-up's cudaMallocs are this strategy's own. */
static fr_status gpu_timed(trainer *tr, const char *model, const char *name, int batch, int warmup,
                           int steps);

static fr_status gpu_strategy(trainer *tr, const char *model, const char *text, int batch,
                              int warmup, int steps) {
    /* "STRATEGY" or "STRATEGY@PRECISION" */
    char strategy[64], name[96];
    const char *at = strchr(text, '@');
    snprintf(strategy, sizeof strategy, "%.*s", at ? (int)(at - text) : (int)strlen(text), text);
    fr_strategy s;
    fr_dtype precision = FR_F32;
    FR_TRY(fr_strategy_parse(strategy, &s));
    if (at)
        FR_TRY(fr_precision_parse(at + 1, &precision));
    fr_strategy_format(s, strategy, sizeof strategy);
    snprintf(name, sizeof name, "%s%s%s", strategy, at ? "@" : "", at ? fr_dtype_name(precision) : "");
    fr_loss_scaler scaler;
    FR_TRY(fr_loss_scaler_init(&scaler, precision));
    tr->model->cfg.strategy = s;
    tr->model->cfg.precision = precision;
    tr->scaler = at ? &scaler : NULL;
    fr_status st = gpu_timed(tr, model, name, batch, warmup, steps);
    tr->model->cfg.precision = FR_F32;
    tr->scaler = NULL;
    return st;
}

/* gpu_strategy's measurement, under the strategy and precision set. */
static fr_status gpu_timed(trainer *tr, const char *model, const char *name, int batch, int warmup,
                           int steps) {
    FR_TRY(fr_cuda_synchronize());
    fr_mem_empty_cache();
    fr_mem_stats start, before, after;
    fr_mem_get_stats(FR_CUDA, &start);
    for (int i = 0; i < warmup; i++)
        FR_TRY(train_step(tr, NULL));
    FR_TRY(fr_cuda_synchronize());
    fr_mem_get_stats(FR_CUDA, &before);
    fr_mem_reset_peak();
    double t0 = now_ms();
    for (int i = 0; i < steps; i++)
        FR_TRY(train_step(tr, NULL));
    FR_TRY(fr_cuda_synchronize());
    double ms = now_ms() - t0;
    fr_mem_get_stats(FR_CUDA, &after);
    gpu_rate(model, name, "images_per_s", ms > 0 ? (double)batch * steps / (ms * 1e-3) : 0);
    gpu_rate(model, name, "step_ms", ms / steps);
    gpu_count(model, name, "peak_bytes", after.total_peak);
    gpu_count(model, name, "reserved_bytes", after.reserved);
    gpu_count(model, name, "device_mallocs", after.device_mallocs - before.device_mallocs);
    gpu_count(model, name, "warmup_mallocs", before.device_mallocs - start.device_mallocs);
    for (int t = 0; t < FR_TAG_COUNT; t++) {
        char metric[48];
        snprintf(metric, sizeof metric, "at_peak_%s", fr_mem_tag_name((fr_mem_tag)t));
        gpu_count(model, name, metric, after.at_peak[t]);
    }
    fflush(stdout);
    return FR_OK;
}

/* ---- both sections ---- */

/* Every strategy of one model case, on the CPU (the models section) or on
 * the device (the GPU section), with `steps` timed steps each. */
static fr_status run_model(const model_case *c, fr_device dev, int warmup, int steps) {
    bool gpu = dev == FR_CUDA;
    const char *who = gpu ? "frugal gpu" : "frugal";
    int batch = gpu ? c->gpu_batch : c->batch;
    int size = gpu ? GPU_SIZE : c->size, in_channels = gpu ? GPU_IN_CHANNELS : c->in_channels;
    trainer tr = {0};
    fr_status st = FR_OK;
    tr.model = create(c->name, in_channels);
    if (!tr.model || (gpu && fr_params_to_device(tr.model->params, dev) != FR_OK) ||
        make_batch(&tr, dev, batch, in_channels, size) != FR_OK ||
        !(tr.opt = fr_sgd_new(tr.model->params, (fr_sgd_options){.lr = 0.01, .momentum = 0.9}))) {
        st = fr_last_status();
        printf("# %s: %s could not be built: %s\n", who, c->name, fr_last_error());
        goto out;
    }
    printf("%s\t%s\t%s (%lld parameters), batch %d, %dx%dx%d, %d classes, %s, SGD momentum 0.9\n",
           gpu ? "GS" : "MS", c->name, tr.model->name, (long long)fr_params_count(tr.model->params),
           batch, in_channels, size, size, CLASSES, gpu ? "CUDA, f32" : "CPU");
    if (!gpu) { /* the activation layout of f32 under every strategy (nn/model.h) */
        const char *layout;
        fr_model_channels_last(tr.model, FR_CPU, &layout);
        printf("# %s: %s: activations %s under every strategy\n", who,
               c->name, layout);
    }
    char all[512];
    snprintf(all, sizeof all, "%s%s%s", c->strategies, gpu ? "," : "", gpu ? gpu_mixed : "");
    const char *p = all;
    while (*p) {
        size_t len = strcspn(p, ",");
        char text[64];
        snprintf(text, sizeof text, "%.*s", (int)len, p);
        double t0 = now_ms();
        fr_status s = gpu ? gpu_strategy(&tr, c->name, text, batch, warmup, steps)
                          : run_strategy(&tr, c->name, text, steps);
        if (s != FR_OK) {
            /* Keep going: one failing strategy should not hide the others
             * (train_step left the tape and the gradients clear). */
            printf("# %s: %s / %s failed: %s\n", who, c->name, text, fr_last_error());
            st = fr_last_status();
        }
        fprintf(stderr, "bench_models: %s%s %s took %.1f s\n", gpu ? "gpu " : "", c->name, text,
                (now_ms() - t0) * 1e-3);
        p += len + (p[len] == ',');
    }
out:
    fr_optim_free(tr.opt);
    fr_release(tr.x);
    fr_release(tr.labels);
    fr_model_free(tr.model);
    if (gpu)
        fr_mem_empty_cache();
    return st;
}

static int usage(FILE *out, const char *prog, int code) {
    fprintf(out,
            "usage: %s [--gpu] [--list] [--match TEXT] [--steps N] [--warmup N]\n"
            "  --list        print the model cases (for bench/torch_saved.py) and exit\n"
            "  --match TEXT  only the models whose name contains TEXT\n"
            "  --steps N     timed steps per strategy (default: 3 for ResNet-56, 2 for\n"
            "                DenseNet-BC-100 on the CPU, after one warm-up step; with --gpu\n"
            "                20 and 10)\n"
            "  --gpu         the GPU section: train on the CUDA device (ResNet-56 at batch\n"
            "                128, DenseNet-BC-100 at 64); without one, say why and exit 0\n"
            "  --warmup N    untimed steps per strategy before the timed ones (--gpu only;\n"
            "                default %d)\n",
            prog, GPU_WARMUP);
    return code;
}

int main(int argc, char **argv) {
    bool list = false, gpu = false;
    const char *match = NULL;
    int steps = 0, warmup = GPU_WARMUP;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help"))
            return usage(stdout, argv[0], 0);
        else if (!strcmp(argv[i], "--list"))
            list = true;
        else if (!strcmp(argv[i], "--match") && i + 1 < argc)
            match = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gpu"))
            gpu = true;
        else
            return usage(stderr, argv[0], 2);
    }
    if (steps < 0 || steps > (gpu ? GPU_MAX_STEPS : MAX_STEPS) || warmup < 1 || warmup > MAX_STEPS)
        return usage(stderr, argv[0], 2);
    const char *who = gpu ? "frugal gpu" : "frugal";
    if (gpu) {
        const char *why = gpu_unavailable();
        if (why) {
            printf("# gpu: skipped: %s\n", why);
            return 0;
        }
    }
    if (!list && gpu) {
        printf("# frugal gpu: cuDNN %s, convolution workspace budget %zu MiB; FP32 math (no TF32); "
               "%d warm-up steps per strategy, then the timed steps\n",
               fr_cuda_cudnn_enabled() ? "on" : "off (FR_CUDNN=0: im2col + cuBLAS)",
               fr_cuda_workspace_budget() >> 20, warmup);
    } else if (!list) {
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
        int n = steps ? steps : gpu ? c->gpu_steps : c->steps;
        if (list && gpu) {
            printf("C\tgpu\t%s\t0\tbatch=%d size=%d in_channels=%d classes=%d warmup=%d steps=%d\n",
                   c->name, c->gpu_batch, GPU_SIZE, GPU_IN_CHANNELS, CLASSES, warmup, n);
            continue;
        } else if (list) {
            printf("C\tmodels\t%s\t0\tbatch=%d size=%d in_channels=%d classes=%d steps=%d\n", c->name,
                   c->batch, c->size, c->in_channels, CLASSES, n);
            continue;
        }
        double t0 = now_ms();
        if (run_model(c, gpu ? FR_CUDA : FR_CPU, warmup, n) != FR_OK)
            failed++;
        fprintf(stderr, "bench_models: %s%s took %.1f s\n", gpu ? "gpu " : "", c->name,
                (now_ms() - t0) * 1e-3);
    }
    if (!list && gpu) {
        size_t cudnn = 0, im2col = 0;
        fr_cuda_conv_counts(&cudnn, &im2col);
        printf("# frugal gpu: convolution calls: %zu by cuDNN, %zu by im2col + cuBLAS\n", cudnn, im2col);
    }
    if (!list && fr_live_tensors() != 0)
        printf("# %s: %ld tensors still alive at exit (a leak in the bench or a model)\n", who,
               fr_live_tensors());
    return failed ? 1 : 0;
}
