/* gan: a small DCGAN-like generator and discriminator trained on
 * Fashion-MNIST with the alternating loop, two models on one tape.
 *
 *     gan --steps 200 --strategy recompute --out gan.png
 *
 * Each step: fake = G(z); the discriminator's loss on real images and on
 * fake.detach(), its backward and its Adam step; then the generator's loss
 * through D(fake) and its backward with inputs = G's parameters, so D's
 * gradients are not computed, and G's Adam step. G's graph stays pending on
 * the tape while D's backward runs: a backward consumes only its own graph
 * (docs/ARCHITECTURE.md, "Graphs on the tape").
 *
 * frugal has no transposed convolution, so the generator upsamples by
 * nearest neighbour written as a matrix product with a constant 0/1 matrix
 * (fr_matmul, differentiable; it saves no activation), followed by 3x3
 * convolutions, and bounds its output with a hardtanh made of ReLUs (frugal
 * has no tanh). Losses are two-class cross-entropy (equal to BCE with logits
 * on the logit difference). --strategy applies to both models' blocks;
 * checkpoint puts each stage of each model in a segment of its own. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frugal.h"
#include "nn/blocks.h"
#include "nn/cli.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#define ZDIM 32
#define GRID 8 /* the PNG shows GRID x GRID samples */

typedef struct {
    const char *data, *out, *strategy;
    int64_t steps, batch, seed, limit;
    double lr;
} options;

/* G: z (N, 32) -> linear -> (N, 16, 7, 7) -> BN-ReLU -> up -> conv-BN-ReLU
 * (16, 14, 14) -> up -> conv (1, 28, 28). D: conv 4x4/2 (16, 14, 14) ->
 * leaky ReLU -> conv-BN-ReLU 4x4/2 (32, 7, 7) -> linear -> 2 logits. */
typedef struct {
    fr_params *params;
    fr_model_cfg cfg;
    fr_linear_layer fc;
    fr_batchnorm2d_layer bn0, bn1;
    fr_conv2d_layer c1, c2;
    fr_tensor *up7, *up14; /* (49, 196), (196, 784) nearest-neighbour maps */
} generator;

typedef struct {
    fr_params *params;
    fr_model_cfg cfg;
    fr_conv2d_layer c1, c2;
    fr_batchnorm2d_layer bn2;
    fr_linear_layer fc;
} discriminator;

/* The 0/1 matrix (s*s, 4*s*s) mapping an s x s map to its 2s x 2s
 * nearest-neighbour enlargement: out = in U. */
static fr_tensor *upsample_matrix(int s) {
    int n = s * s, m = 4 * n;
    float *u = calloc((size_t)n * (size_t)m, sizeof *u);
    if (!u) {
        fr_error(FR_ERR_OOM, "gan: out of memory");
        return NULL;
    }
    for (int y = 0; y < 2 * s; y++)
        for (int x = 0; x < 2 * s; x++)
            u[(size_t)((y / 2) * s + x / 2) * (size_t)m + (size_t)(y * 2 * s + x)] = 1.0f;
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(n, m), FR_TAG_PARAM, u);
    free(u);
    return t;
}

/* (N, C, s, s) -> (N, C, 2s, 2s) */
static fr_tensor *upsample(fr_tensor *x, fr_tensor *u) {
    if (!x)
        return NULL;
    int64_t n = x->shape[0], c = x->shape[1], s = x->shape[2];
    fr_tensor *flat = fr_reshape(x, 2, FR_SHAPE(n * c, s * s));
    fr_tensor *y = flat ? fr_matmul(flat, u) : NULL;
    fr_release(flat);
    return y ? fr_chain(y, fr_reshape(y, 4, FR_SHAPE(n, c, 2 * s, 2 * s))) : NULL;
}

/* hardtanh(x) = relu(x + 1) - relu(x - 1) - 1 from existing ops: keeps the
 * generator's pixels in [-1, 1], where the data are (frugal has no tanh). */
static fr_tensor *hardtanh(fr_tensor *x) {
    if (!x)
        return NULL;
    fr_tensor *one = fr_empty_like(x, FR_TAG_DATA), *minus = fr_empty_like(x, FR_TAG_DATA);
    fr_tensor *r1 = NULL, *r2 = NULL, *d = NULL, *y = NULL;
    if (one && minus && fr_fill_(one, 1.0f) == FR_OK && fr_fill_(minus, -1.0f) == FR_OK) {
        r1 = fr_add(x, one);
        r1 = r1 ? fr_chain(r1, fr_relu(r1)) : NULL;
        r2 = fr_add(x, minus);
        r2 = r2 ? fr_chain(r2, fr_relu(r2)) : NULL;
        r2 = r2 ? fr_chain(r2, fr_scale(r2, -1.0f)) : NULL;
        d = r1 && r2 ? fr_add(r1, r2) : NULL;
        y = d ? fr_add(d, minus) : NULL;
    }
    fr_tensor *all[] = {one, minus, r1, r2, d};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fr_release(all[i]);
    return y;
}

static fr_tensor *g_stage0(void *ctx, fr_tensor *z) {
    generator *g = ctx;
    fr_tensor *h = fr_linear_layer_forward(&g->fc, z);
    h = h ? fr_chain(h, fr_reshape(h, 4, FR_SHAPE(z->shape[0], 16, 7, 7))) : NULL;
    return h ? fr_chain(h, fr_bn_relu(&g->bn0, h, true, &g->cfg)) : NULL;
}

static fr_tensor *g_stage1(void *ctx, fr_tensor *x) {
    generator *g = ctx;
    fr_tensor *h = upsample(x, g->up7);
    h = h ? fr_chain(h, fr_conv_bn_relu(&g->c1, &g->bn1, h, true, &g->cfg)) : NULL;
    h = h ? fr_chain(h, upsample(h, g->up14)) : NULL;
    h = h ? fr_chain(h, fr_conv2d_layer_forward(&g->c2, h)) : NULL;
    return fr_chain(h, hardtanh(h));
}

static fr_tensor *d_stage0(void *ctx, fr_tensor *x) {
    discriminator *d = ctx;
    fr_tensor *h = fr_conv2d_layer_forward(&d->c1, x);
    return h ? fr_chain(h, fr_leaky_relu(h, 0.2f)) : NULL;
}

static fr_tensor *d_stage1(void *ctx, fr_tensor *x) {
    discriminator *d = ctx;
    fr_tensor *h = fr_conv_bn_relu(&d->c2, &d->bn2, x, true, &d->cfg);
    h = h ? fr_chain(h, fr_flatten(h)) : NULL;
    return h ? fr_chain(h, fr_linear_layer_forward(&d->fc, h)) : NULL;
}

/* Runs the stages in order, each as a checkpointed segment under
 * checkpoint. Takes x borrowed. */
static fr_tensor *run_stages(fr_segment_fn const *stages, int n, void *ctx, const fr_model_cfg *cfg,
                             fr_tensor *x) {
    fr_tensor *h = fr_retain(x);
    for (int i = 0; i < n && h; i++)
        h = fr_chain(h, cfg->strategy.checkpoint ? fr_checkpoint(stages[i], ctx, h) : stages[i](ctx, h));
    return h;
}

static fr_tensor *g_forward(generator *g, fr_tensor *z) {
    static fr_segment_fn const stages[2] = {g_stage0, g_stage1};
    return run_stages(stages, 2, g, &g->cfg, z);
}

static fr_tensor *d_forward(discriminator *d, fr_tensor *x) {
    static fr_segment_fn const stages[2] = {d_stage0, d_stage1};
    return run_stages(stages, 2, d, &d->cfg, x);
}

static fr_status models_init(generator *g, discriminator *d, fr_strategy s, uint64_t seed) {
    fr_rng rng;
    fr_rng_seed(&rng, seed);
    g->cfg = d->cfg = (fr_model_cfg){.strategy = s};
    if (!(g->params = fr_params_new()) || !(d->params = fr_params_new()))
        return fr_last_status();
    FR_TRY(fr_linear_layer_init(&g->fc, g->params, "fc", ZDIM, 16 * 7 * 7, true, &rng));
    FR_TRY(fr_batchnorm2d_layer_init(&g->bn0, g->params, "bn0", 16));
    FR_TRY(fr_conv2d_layer_init(&g->c1, g->params, "conv1", 16, 16, 3, 1, 1, false, &rng));
    FR_TRY(fr_batchnorm2d_layer_init(&g->bn1, g->params, "bn1", 16));
    FR_TRY(fr_conv2d_layer_init(&g->c2, g->params, "conv2", 16, 1, 3, 1, 1, true, &rng));
    if (!(g->up7 = upsample_matrix(7)) || !(g->up14 = upsample_matrix(14)))
        return fr_last_status();
    FR_TRY(fr_conv2d_layer_init(&d->c1, d->params, "conv1", 1, 16, 4, 2, 1, true, &rng));
    FR_TRY(fr_conv2d_layer_init(&d->c2, d->params, "conv2", 16, 32, 4, 2, 1, false, &rng));
    FR_TRY(fr_batchnorm2d_layer_init(&d->bn2, d->params, "bn2", 32));
    return fr_linear_layer_init(&d->fc, d->params, "fc", 32 * 7 * 7, 2, true, &rng);
}

static void models_free(generator *g, discriminator *d) {
    fr_params_free(g->params);
    fr_params_free(d->params);
    fr_release(g->up7);
    fr_release(g->up14);
}

static fr_tensor *noise(int64_t n, fr_rng *rng) {
    float *z = malloc((size_t)n * ZDIM * sizeof *z);
    if (!z) {
        fr_error(FR_ERR_OOM, "gan: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n * ZDIM; i++)
        z[i] = (float)fr_rng_normal(rng);
    fr_tensor *t = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(n, ZDIM), FR_TAG_DATA, z);
    free(z);
    return t;
}

static fr_tensor *labels(int64_t n, int32_t value) {
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        fr_error(FR_ERR_OOM, "gan: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = value;
    fr_tensor *t = fr_from_host(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA, v);
    free(v);
    return t;
}

static fr_tensor *d_loss(discriminator *d, fr_tensor *x, fr_tensor *target) {
    fr_tensor *logits = d_forward(d, x);
    return logits ? fr_chain(logits, fr_cross_entropy(logits, target)) : NULL;
}

/* One alternating step; *ld, *lg get the two losses. */
static fr_status gan_step(generator *g, discriminator *d, fr_optim *gopt, fr_optim *dopt,
                          fr_tensor *const *g_inputs, int n_g_inputs, fr_tensor *real, fr_tensor *z,
                          fr_tensor *ones, fr_tensor *zeros, double *ld, double *lg) {
    fr_tensor *fake = g_forward(g, z);
    fr_tensor *detached = fake ? fr_detach(fake) : NULL;
    fr_tensor *l_real = detached ? d_loss(d, real, ones) : NULL;
    fr_tensor *l_fake = l_real ? d_loss(d, detached, zeros) : NULL;
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
    fr_tensor *l_g = st == FR_OK ? d_loss(d, fake, ones) : NULL;
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

/* GRID x GRID samples of G (batch statistics, no_grad) as a grey PNG. */
static fr_status write_grid(generator *g, const char *path, fr_rng *rng) {
    fr_tensor *z = noise(GRID * GRID, rng);
    fr_no_grad_enter();
    fr_tensor *img = z ? g_forward(g, z) : NULL;
    fr_no_grad_exit();
    fr_release(z);
    if (!img)
        return fr_last_status();
    enum { S = 28, W = GRID * S };
    float *px = malloc(GRID * GRID * S * S * sizeof *px);
    unsigned char *out = malloc(W * W);
    fr_status st = px && out ? fr_read_f32(img, px, GRID * GRID * S * S) : fr_error(FR_ERR_OOM, "gan: out of memory");
    fr_release(img);
    for (int i = 0; st == FR_OK && i < GRID * GRID; i++)
        for (int y = 0; y < S; y++)
            for (int x = 0; x < S; x++) {
                float v = (px[(i * S + y) * S + x] + 1.0f) * 127.5f; /* [-1, 1] -> [0, 255] */
                v = v < 0 ? 0 : v > 255 ? 255 : v;
                out[((i / GRID) * S + y) * W + (i % GRID) * S + x] = (unsigned char)lrintf(v);
            }
    if (st == FR_OK && !stbi_write_png(path, W, W, 1, out, W))
        st = fr_error(FR_ERR_IO, "gan: cannot write %s", path);
    free(px);
    free(out);
    return st;
}

static fr_status parse_args(int argc, char **argv, options *o) {
    *o = (options){.data = "fashion-mnist", .out = "gan.png", .strategy = "plain", .steps = 200,
                   .batch = 32, .seed = 1, .limit = 10000, .lr = 2e-4};
    for (int i = 1; i < argc; i++) {
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
        i++;
    }
    return FR_OK;
}

static void usage(FILE *out) {
    fprintf(out, "usage: gan [flags]\n"
                 "  --data SPEC      fashion-mnist[:DIR] (default) or mnist:DIR\n"
                 "  --steps N        alternating steps (200)\n"
                 "  --batch N        real images per step, and as many fakes (32)\n"
                 "  --strategy S     memory strategy of both models (plain; see train --help)\n"
                 "  --lr X           Adam learning rate, betas (0.5, 0.999) (0.0002)\n"
                 "  --limit N        first N training images (10000; 0 = all)\n"
                 "  --seed N         weights, noise and shuffling (1)\n"
                 "  --out PATH       PNG of %dx%d samples (gan.png)\n", GRID, GRID);
}

typedef struct {
    generator g;
    discriminator d;
    fr_dataset *ds;
    fr_loader *ld;
    fr_optim *gopt, *dopt;
    fr_tensor **g_inputs;
    fr_tensor *ones, *zeros;
} run;

static fr_status train(const options *o, run *r) {
    fr_data_spec spec;
    fr_strategy strategy;
    FR_TRY(fr_data_spec_parse(o->data, &spec));
    FR_TRY(fr_strategy_parse(o->strategy, &strategy));
    FR_TRY(models_init(&r->g, &r->d, strategy, (uint64_t)o->seed));
    if (!(r->ds = fr_data_open(&spec, true, o->limit)))
        return fr_last_status();
    if (r->ds->c != 1 || r->ds->h != 28 || r->ds->w != 28 || r->ds->n < o->batch)
        return fr_error(FR_ERR_SHAPE, "gan: --data %s holds %lld images of %lldx%lldx%lld; the models "
                        "take 1x28x28 grey images and at least --batch (%lld) of them", o->data,
                        (long long)r->ds->n, (long long)r->ds->c, (long long)r->ds->h,
                        (long long)r->ds->w, (long long)o->batch);
    fr_loader_config lc = {.batch_size = (int)o->batch, .shuffle = true, .drop_last = true,
                           .seed = (uint64_t)o->seed, .aug = {.mean = {0.5f}, .std = {0.5f}}};
    if (!(r->ld = fr_loader_new(r->ds, &lc)))
        return fr_last_status();
    fr_adam_options ao = fr_adam_defaults(o->lr, 0);
    ao.beta1 = 0.5;
    if (!(r->gopt = fr_adam_new(r->g.params, ao)) || !(r->dopt = fr_adam_new(r->d.params, ao)) ||
        !(r->ones = labels(o->batch, 1)) || !(r->zeros = labels(o->batch, 0)))
        return fr_last_status();
    int n_g = 0;
    if (!(r->g_inputs = calloc((size_t)r->g.params->count, sizeof *r->g_inputs)))
        return fr_error(FR_ERR_OOM, "gan: out of memory");
    for (int i = 0; i < r->g.params->count; i++)
        if (r->g.params->items[i].kind == FR_PARAMETER)
            r->g_inputs[n_g++] = r->g.params->items[i].tensor;
    char buf[64];
    printf("gan: %lld steps of batch %lld on %s, strategy %s\n", (long long)o->steps,
           (long long)o->batch, o->data, fr_strategy_format(strategy, buf, sizeof buf));
    fr_rng rng;
    fr_rng_seed(&rng, (uint64_t)o->seed + 1);
    fr_mem_reset_peak();
    double t0 = fr_cli_now();
    for (int64_t step = 1; step <= o->steps; step++) {
        fr_tensor *real, *y;
        FR_TRY(fr_loader_next(r->ld, &real, &y));
        if (!real) { /* epoch over: the next call starts another */
            FR_TRY(fr_loader_next(r->ld, &real, &y));
        }
        fr_release(y);
        fr_tensor *z = noise(o->batch, &rng);
        double ld = 0, lg = 0;
        fr_status st = z ? gan_step(&r->g, &r->d, r->gopt, r->dopt, r->g_inputs, n_g, real, z,
                                    r->ones, r->zeros, &ld, &lg)
                         : fr_last_status();
        fr_release(real);
        fr_release(z);
        FR_TRY(st);
        if (!isfinite(ld) || !isfinite(lg))
            return fr_error(FR_ERR_ARG, "gan: step %lld: loss is not finite (D %g, G %g); try a "
                            "smaller --lr",
                            (long long)step, ld, lg);
        printf("step %lld/%lld: loss D %.4f  G %.4f\n", (long long)step, (long long)o->steps, ld, lg);
        fflush(stdout);
    }
    printf("trained in %.1f s\n", fr_cli_now() - t0);
    FR_TRY(write_grid(&r->g, o->out, &rng));
    printf("wrote %s (%dx%d samples)\nmemory ledger (peaks over training):\n", o->out, GRID, GRID);
    fr_mem_report(stdout);
    return FR_OK;
}

static void run_free(run *r) {
    fr_release(r->ones);
    fr_release(r->zeros);
    free(r->g_inputs);
    fr_optim_free(r->gopt);
    fr_optim_free(r->dopt);
    fr_loader_free(r->ld);
    fr_dataset_free(r->ds);
    models_free(&r->g, &r->d);
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
        s = fr_error(FR_ERR_ARG, "gan: a leak: %ld tensors and %zu bytes alive at exit", tensors, bytes);
    return fr_cli_exit_status("gan", s);
}
