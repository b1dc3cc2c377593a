/* gan: a DCGAN (Radford et al. 2016) trained on Fashion-MNIST with the
 * alternating loop, two models on one tape, written as PyTorch's DCGAN is
 * (built in gan_model.h, shared with tests/test_examples_torch.c):
 *
 *     G: z (N, 32, 1, 1) -> ConvTranspose2d(32, 64, 7) -> BN-ReLU (64, 7, 7)
 *        -> ConvTranspose2d(64, 32, 4, 2, 1) -> BN-ReLU (32, 14, 14)
 *        -> ConvTranspose2d(32, 1, 4, 2, 1) -> Tanh (1, 28, 28)
 *     D: Conv2d(1, 32, 4, 2, 1) -> LeakyReLU(0.2) (32, 14, 14)
 *        -> Conv2d(32, 64, 4, 2, 1) -> BN-LeakyReLU(0.2) (64, 7, 7)
 *        -> Flatten -> Linear(3136, 1): one logit
 *     losses: BCEWithLogits(D(real), 1) + BCEWithLogits(D(G(z).detach()), 0)
 *             for D, BCEWithLogits(D(G(z)), 1) for G; Adam(2e-4, betas 0.5, 0.999)
 *
 *     gan --steps 1000 --strategy recompute --out gan.png
 *
 * Each step: fake = G(z); D's loss on real images and on fake.detach(),
 * its backward and its Adam step; then G's loss through D(fake) and its
 * backward with inputs = G's parameters, so D's gradients are not
 * computed, and G's Adam step. G's graph stays pending on the tape while
 * D's backward runs: a backward consumes only its own graph
 * (docs/ARCHITECTURE.md, "Graphs on the tape"). Both models are written
 * with nn/build.h and hold no strategy code: --strategy is set on both and
 * the engine applies it (docs/MODELS.md).
 *
 * Sample quality: a small classifier (two conv-BN-ReLU-maxpool stages, a
 * linear layer) trains on the same real batches beside the GAN, at no
 * extra data cost. At the end it classifies 256 samples of G and 256 held
 * out real images and the example prints, for each, the mean top-class
 * probability (how much a sample looks like one garment rather than a blur
 * between several: recognisable samples score near the real images) and
 * how many of the ten classes the predictions cover, with the largest
 * class's share (a collapsed generator draws one or two classes only). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <frugal/frugal.h>

#include "gan_model.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#define ZDIM 32
#define WIDTH 32 /* G: ZDIM -> 2 WIDTH -> WIDTH -> 1 channels; D: 1 -> WIDTH -> 2 WIDTH */
#define GRID 8     /* the PNG shows GRID x GRID samples */
#define SAMPLES 256 /* samples the classifier judges */
#define CLASSES 10

typedef struct {
    const char *data, *out, *strategy;
    int64_t steps, batch, seed, limit;
    double lr;
} options;

typedef struct {
    fr_model *g, *d, *c; /* generator, discriminator, the judging classifier */
} models;

static fr_model *classifier_new(uint64_t seed) {
    fr_model *m = fr_model_new("gan_judge", 1, CLASSES, seed);
    fr_module *net = fr_model_root(m);
    fr_pool_params half = {.kernel = 2, .stride = 2};
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 1, .out = 16});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
    fr_max_pool2d_new(net, "pool1", half);
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = 16, .out = 32});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = 32, .act = FR_ACT_RELU});
    fr_max_pool2d_new(net, "pool2", half);
    fr_flatten_new(net, "flatten");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 32 * 7 * 7, .out = CLASSES});
    return fr_model_finish(m);
}

static fr_status models_init(models *ms, fr_strategy s, uint64_t seed) {
    if (!(ms->g = gan_generator_new(seed, ZDIM, WIDTH)) ||
        !(ms->d = gan_discriminator_new(seed + 1, WIDTH)) ||
        !(ms->c = classifier_new(seed + 2)))
        return fr_last_status();
    ms->g->cfg.strategy = ms->d->cfg.strategy = s;
    return FR_OK;
}

static void models_free(models *ms) {
    fr_model_free(ms->g);
    fr_model_free(ms->d);
    fr_model_free(ms->c);
}

static fr_tensor *noise(int64_t n, fr_rng *rng) {
    float *z = malloc((size_t)n * ZDIM * sizeof *z);
    if (!z) {
        fr_error(FR_ERR_OOM, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n * ZDIM; i++)
        z[i] = (float)fr_rng_normal(rng);
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(n, ZDIM, 1, 1), FR_TAG_DATA, z);
    free(z);
    return t;
}

/* One step of the judging classifier on a real batch (cross-entropy). */
static fr_status classifier_step(fr_model *c, fr_optim *opt, fr_tensor *real, fr_tensor *y) {
    fr_tensor *logits = fr_model_forward(c, real, true);
    fr_tensor *l = logits ? fr_cross_entropy(logits, y) : NULL;
    fr_release(logits);
    fr_status st = l ? fr_backward(l) : fr_last_status();
    fr_release(l);
    if (st == FR_OK)
        st = fr_optim_step(opt);
    fr_optim_zero_grad(opt);
    if (st != FR_OK)
        fr_tape_clear();
    return st;
}

/* One alternating step; *ld, *lg get the two losses. */
static fr_status gan_step(fr_model *g, fr_model *d, fr_optim *gopt, fr_optim *dopt,
                          fr_tensor *const *g_inputs, int n_g_inputs, fr_tensor *real, fr_tensor *z,
                          fr_tensor *ones, fr_tensor *zeros, double *ld, double *lg) {
    fr_tensor *fake = fr_model_forward(g, z, true);
    fr_tensor *detached = fake ? fr_detach(fake) : NULL;
    fr_tensor *l_real = detached ? gan_d_loss(d, real, ones) : NULL;
    fr_tensor *l_fake = l_real ? gan_d_loss(d, detached, zeros) : NULL;
    fr_tensor *l_d = l_fake ? fr_add(l_real, l_fake) : NULL;
    fr_release(detached);
    fr_release(l_real);
    fr_release(l_fake);
    fr_status st = l_d ? fr_backward(l_d) : fr_last_status();
    if (st == FR_OK) {
        *ld = fr_item(l_d);
        st = fr_optim_step(dopt);
    }
    fr_optim_zero_grad(dopt);
    fr_release(l_d);
    /* G's graph is still pending: D's backward did not reach it */
    fr_tensor *l_g = st == FR_OK ? gan_d_loss(d, fake, ones) : NULL;
    fr_release(fake);
    if (st == FR_OK && !l_g)
        st = fr_last_status();
    fr_backward_options only_g = {.n_inputs = n_g_inputs, .inputs = g_inputs};
    if (st == FR_OK)
        st = fr_backward_with_options(l_g, NULL, &only_g);
    if (st == FR_OK) {
        *lg = fr_item(l_g);
        st = fr_optim_step(gopt);
    }
    fr_optim_zero_grad(gopt);
    fr_release(l_g);
    if (st != FR_OK)
        fr_tape_clear();
    return st;
}

/* SAMPLES samples of G (batch statistics, no_grad): (SAMPLES, 1, 28, 28). */
static fr_tensor *samples(fr_model *g, fr_rng *rng) {
    fr_tensor *z = noise(SAMPLES, rng);
    fr_no_grad_enter();
    fr_tensor *img = z ? fr_model_forward(g, z, true) : NULL;
    fr_no_grad_exit();
    fr_release(z);
    return img;
}

/* The first GRID x GRID images of img (N, 1, 28, 28) in [-1, 1] as a grey PNG. */
static fr_status write_grid(const fr_tensor *img, const char *path) {
    enum { S = 28, W = GRID * S };
    size_t n = (size_t)fr_numel(img);
    float *px = malloc(n * sizeof *px);
    unsigned char *out = malloc(W * W);
    fr_status st = px && out ? fr_read_f32(img, px, n) : fr_error(FR_ERR_OOM, "out of memory");
    for (int i = 0; st == FR_OK && i < GRID * GRID; i++)
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                float v = (px[(i * S + y) * S + x] + 1.0f) * 127.5f; /* [-1, 1] -> [0, 255] */
                v = v < 0 ? 0 : v > 255 ? 255 : v;
                out[((i / GRID) * S + y) * W + (i % GRID) * S + x] = (unsigned char)lrintf(v);
            }
    int len = 0;
    unsigned char *png = st == FR_OK ? stbi_write_png_to_mem(out, W, W, W, 1, &len) : NULL;
    if (st == FR_OK && !png)
        st = fr_error(FR_ERR_OOM, "--out %s: out of memory encoding the PNG", path);
    if (st == FR_OK)
        st = fr_outfile_write(path, png, (size_t)len); /* its error names the path */
    free(png);
    free(px);
    free(out);
    return st;
}

/* What the classifier makes of SAMPLES images x: the mean top-class
 * probability, the predicted classes' histogram, and (labels given) the
 * accuracy. */
typedef struct {
    double mean_top, accuracy;
    int hist[CLASSES];
} judgement;

static fr_status judge(fr_model *c, const fr_tensor *x, const int32_t *labels, judgement *j) {
    *j = (judgement){0};
    fr_no_grad_enter();
    fr_tensor *logits = fr_model_forward(c, (fr_tensor *)x, false);
    fr_no_grad_exit();
    if (!logits)
        return fr_last_status();
    float v[SAMPLES * CLASSES];
    fr_status st = fr_read_f32(logits, v, SAMPLES * CLASSES);
    fr_release(logits);
    int correct = 0;
    for (int i = 0; st == FR_OK && i < SAMPLES; i++) {
        const float *l = v + i * CLASSES;
        int best = 0;
        for (int k = 1; k < CLASSES; k++)
            best = l[k] > l[best] ? k : best;
        double sum = 0;
        for (int k = 0; k < CLASSES; k++)
            sum += exp((double)l[k] - l[best]);
        j->mean_top += 1.0 / sum / SAMPLES; /* softmax of the top class */
        j->hist[best]++;
        correct += labels && labels[i] == best;
    }
    j->accuracy = (double)correct / SAMPLES;
    return st;
}

static void print_judgement(const char *what, const judgement *j) {
    int covered = 0, largest = 0;
    for (int k = 0; k < CLASSES; k++) {
        covered += j->hist[k] > 0;
        largest = j->hist[k] > largest ? j->hist[k] : largest;
    }
    printf("  %-22s mean top-class probability %.3f, %d of %d classes predicted, largest %4.1f%%  [",
           what, j->mean_top, covered, CLASSES, 100.0 * largest / SAMPLES);
    for (int k = 0; k < CLASSES; k++)
        printf("%s%d", k ? " " : "", j->hist[k]);
    printf("]\n");
}

/* SAMPLES held-out real images in [-1, 1], as the loader normalises them,
 * and their labels. */
static fr_status held_out(const fr_data_spec *spec, fr_tensor **x, int32_t *labels) {
    fr_dataset *ds = fr_data_open(spec, false, SAMPLES);
    if (!ds)
        return fr_last_status();
    fr_status st = ds->n == SAMPLES ? FR_OK
                                    : fr_error(FR_ERR_SHAPE, "the test set has %lld images, "
                                               "fewer than %d", (long long)ds->n, SAMPLES);
    enum { PX = 28 * 28 };
    float *f = st == FR_OK ? malloc((size_t)SAMPLES * PX * sizeof *f) : NULL;
    if (st == FR_OK && !f)
        st = fr_error(FR_ERR_OOM, "out of memory");
    if (st == FR_OK) {
        const uint8_t *u = fr_data(ds->images);
        for (size_t i = 0; i < (size_t)SAMPLES * PX; i++)
            f[i] = (u[i] / 255.0f - 0.5f) / 0.5f;
        memcpy(labels, fr_data(ds->labels), SAMPLES * sizeof *labels);
        if (!(*x = fr_from_host(FR_CPU, FR_F32, 4, FR_SHAPE(SAMPLES, 1, 28, 28), FR_TAG_DATA, f)))
            st = fr_last_status();
    }
    free(f);
    fr_dataset_free(ds);
    return st;
}

static fr_status parse_args(int argc, char **argv, options *o) {
    *o = (options){.data = "fashion-mnist", .out = "gan.png", .strategy = "plain", .steps = 1000,
                   .batch = 64, .seed = 1, .limit = 10000, .lr = 2e-4};
    for (int i = 1; i < argc; i += 2) { /* every flag takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool known = true;
        fr_status st = FR_OK;
        if (!v)
            known = false;
        else if (!strcmp(a, "--data"))
            o->data = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--strategy"))
            o->strategy = v;
        else if (!strcmp(a, "--steps"))
            st = fr_cli_int(a, v, 1, 1000000, &o->steps);
        else if (!strcmp(a, "--batch"))
            st = fr_cli_int(a, v, 2, 4096, &o->batch);
        else if (!strcmp(a, "--seed"))
            st = fr_cli_int(a, v, 0, INT64_MAX, &o->seed);
        else if (!strcmp(a, "--limit"))
            st = fr_cli_int(a, v, 0, INT64_MAX, &o->limit);
        else if (!strcmp(a, "--lr"))
            st = fr_cli_double(a, v, 0, 1, &o->lr);
        else
            known = false;
        if (!known)
            return fr_cli_bad_flag("gan", a, !strcmp(a, "--data") || !strcmp(a, "--out") ||
                                                 !strcmp(a, "--strategy") || !strcmp(a, "--steps") ||
                                                 !strcmp(a, "--batch") || !strcmp(a, "--seed") ||
                                                 !strcmp(a, "--limit") || !strcmp(a, "--lr"));
        FR_TRY(st);
    }
    return FR_OK;
}

static void usage(FILE *out) {
    fprintf(out, "usage: gan [flags]\n"
                 "  --data SPEC      fashion-mnist[:DIR] (default) or mnist:DIR\n"
                 "  --steps N        alternating steps (1000)\n"
                 "  --batch N        real images per step, and as many fakes (64)\n"
                 "  --strategy S     memory strategy of both models (plain; see train --help)\n"
                 "  --lr X           Adam learning rate, betas (0.5, 0.999) (0.0002)\n"
                 "  --limit N        first N training images (10000; 0 = all)\n"
                 "  --seed N         weights, noise and shuffling (1)\n"
                 "  --out PATH       PNG of %dx%d samples (gan.png)\n", GRID, GRID);
}

typedef struct {
    models m;
    fr_dataset *ds;
    fr_loader *ld;
    fr_optim *gopt, *dopt;
    fr_tensor **g_inputs;
    fr_optim *copt;
    fr_tensor *ones, *zeros, *fake, *real;
} run;

static fr_status train(const options *o, run *r) {
    fr_data_spec spec;
    fr_strategy strategy;
    FR_TRY(fr_data_spec_parse(o->data, &spec));
    FR_TRY(fr_outfile_check("--out", o->out, NULL, 0)); /* before any step */
    FR_TRY(fr_strategy_parse(o->strategy, &strategy));
    FR_TRY(models_init(&r->m, strategy, (uint64_t)o->seed));
    if (!(r->ds = fr_data_open(&spec, true, o->limit)))
        return fr_last_status();
    if (r->ds->c != 1 || r->ds->h != 28 || r->ds->w != 28 || r->ds->n < o->batch)
        return fr_error(FR_ERR_SHAPE, "--data %s holds %lld images of %lldx%lldx%lld; the models "
                        "take 1x28x28 grey images and at least --batch (%lld) of them", o->data,
                        (long long)r->ds->n, (long long)r->ds->c, (long long)r->ds->h,
                        (long long)r->ds->w, (long long)o->batch);
    fr_loader_config lc = {.batch_size = (int)o->batch, .shuffle = true, .drop_last = true,
                           .seed = (uint64_t)o->seed, .aug = {.mean = {0.5f}, .std = {0.5f}}};
    if (!(r->ld = fr_loader_new(r->ds, &lc)))
        return fr_last_status();
    fr_adam_options ao = fr_adam_defaults(o->lr, 0);
    ao.beta1 = 0.5;
    if (!(r->gopt = fr_adam_new(r->m.g->params, ao)) || !(r->dopt = fr_adam_new(r->m.d->params, ao)) ||
        !(r->copt = fr_adam_new(r->m.c->params, fr_adam_defaults(1e-3, 0))) ||
        !(r->ones = gan_targets(o->batch, 1.0f)) || !(r->zeros = gan_targets(o->batch, 0.0f)))
        return fr_last_status();
    int n_g = 0;
    const fr_params *gp = r->m.g->params;
    if (!(r->g_inputs = calloc((size_t)gp->count, sizeof *r->g_inputs)))
        return fr_error(FR_ERR_OOM, "out of memory");
    for (int i = 0; i < gp->count; i++)
        if (gp->items[i].kind == FR_PARAMETER)
            r->g_inputs[n_g++] = gp->items[i].tensor;
    char buf[64];
    printf("gan: %lld steps of batch %lld on %s, strategy %s\n", (long long)o->steps,
           (long long)o->batch, o->data, fr_strategy_format(strategy, buf, sizeof buf));
    fr_rng rng;
    fr_rng_seed(&rng, (uint64_t)o->seed + 1);
    fr_mem_reset_peak();
    double t0 = fr_cli_now(), t_warm = t0; /* t_warm: after WARMUP steps */
    enum { WARMUP = 5 };
    for (int64_t step = 1; step <= o->steps; step++) {
        if (step == WARMUP + 1)
            t_warm = fr_cli_now();
        fr_tensor *real, *y;
        FR_TRY(fr_loader_next(r->ld, &real, &y));
        if (!real) { /* epoch over: the next call starts another */
            FR_TRY(fr_loader_next(r->ld, &real, &y));
        }
        fr_tensor *z = noise(o->batch, &rng);
        double ld = 0, lg = 0;
        fr_status st = z ? gan_step(r->m.g, r->m.d, r->gopt, r->dopt, r->g_inputs, n_g, real, z,
                                    r->ones, r->zeros, &ld, &lg)
                         : fr_last_status();
        if (st == FR_OK)
            st = classifier_step(r->m.c, r->copt, real, y);
        fr_release(y);
        fr_release(real);
        fr_release(z);
        FR_TRY(st);
        if (!isfinite(ld) || !isfinite(lg))
            return fr_error(FR_ERR_ARG, "step %lld: loss is not finite (D %g, G %g); try a "
                            "smaller --lr",
                            (long long)step, ld, lg);
        if (step % 50 == 0 || step == o->steps) {
            printf("step %lld/%lld: loss D %.4f  G %.4f\n", (long long)step, (long long)o->steps, ld,
                   lg);
            fflush(stdout);
        }
    }
    double t1 = fr_cli_now();
    printf("trained in %.1f s", t1 - t0);
    if (o->steps > WARMUP) /* bench/torch_gan.py times the same step in PyTorch */
        printf(", %.1f ms per step after the first %d", 1000.0 * (t1 - t_warm) /
               (double)(o->steps - WARMUP), WARMUP);
    printf("\n");
    /* the peaks of the steps, before the sampling pass (a no_grad forward of
     * the whole grid, which had set the peak under every strategy) */
    printf("memory ledger (peaks over training):\n");
    fr_mem_report(stdout);
    if (!(r->fake = samples(r->m.g, &rng)))
        return fr_last_status();
    FR_TRY(write_grid(r->fake, o->out));
    printf("wrote %s (%dx%d samples)\n", o->out, GRID, GRID);
    int32_t real_labels[SAMPLES];
    judgement jf, jr;
    FR_TRY(held_out(&spec, &r->real, real_labels));
    FR_TRY(judge(r->m.c, r->real, real_labels, &jr));
    FR_TRY(judge(r->m.c, r->fake, NULL, &jf));
    printf("sample quality, by the classifier trained beside the GAN (%.1f%% on %d held-out "
           "images):\n", 100.0 * jr.accuracy, SAMPLES);
    print_judgement("held-out real images", &jr);
    print_judgement("generated samples", &jf);
    return FR_OK;
}

static void run_free(run *r) {
    fr_release(r->ones);
    fr_release(r->zeros);
    fr_release(r->fake);
    fr_release(r->real);
    fr_optim_free(r->copt);
    free(r->g_inputs);
    fr_optim_free(r->gopt);
    fr_optim_free(r->dopt);
    fr_loader_free(r->ld);
    fr_dataset_free(r->ds);
    models_free(&r->m);
}

int main(int argc, char **argv) {
    if (fr_cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    options o;
    run r = {0};
    fr_status s = parse_args(argc, argv, &o);
    if (s == FR_OK)
        s = train(&o, &r);
    fr_tape_clear();
    run_free(&r);
    long tensors = fr_live_tensors();
    size_t bytes = fr_mem_total_current(FR_CPU);
    if (s == FR_OK)
        printf("alive at exit: %ld tensors, %zu bytes\n", tensors, bytes);
    if (s == FR_OK && (tensors || bytes))
        s = fr_error(FR_ERR_ARG, "a leak: %ld tensors and %zu bytes alive at exit", tensors, bytes);
    return fr_cli_exit_status("gan", s);
}
