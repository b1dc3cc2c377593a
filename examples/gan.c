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
 * on the logit difference). Both models are written with nn/build.h and
 * hold no strategy code: --strategy is set on both and the engine applies
 * it (norm layers for inplace/recompute/abn, segments of the root's
 * sequence for checkpoint; docs/MODELS.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <frugal/frugal.h>

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

/* G: z (N, 32) -> fc -> (N, 16, 7, 7) -> bn0 (BN-ReLU) -> up7 ->
 * conv1 -> bn1 (BN-ReLU) (16, 14, 14) -> up14 -> conv2 (1, 28, 28) ->
 * hardtanh. D: conv1 4x4/2 (16, 14, 14) -> leaky ReLU 0.2 -> conv2 4x4/2 ->
 * bn2 (BN-ReLU) (32, 7, 7) -> flatten -> fc -> 2 logits. Each is an
 * fr_model (nn/build.h); the pieces that are not layers are blocks without
 * layers of their own, so they are steps of the root's sequence that the
 * engine can put in checkpoint segments like any other. */
typedef struct {
    fr_model *g, *d;
    fr_tensor *up7, *up14; /* (49, 196), (196, 784) nearest-neighbour maps; owned here */
} models;

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

/* The state of the upsampling block: its matrix, borrowed from `models`
 * (which outlives the model's forwards and their replays). */
typedef struct {
    fr_tensor *u;
} upsample_block;

/* (N, C, s, s) -> (N, C, 2s, 2s) */
static fr_tensor *upsample_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)run;
    fr_tensor *u = ((upsample_block *)fr_block_state(self))->u;
    int64_t n = x->shape[0], c = x->shape[1], s = x->shape[2];
    fr_tensor *flat = fr_reshape(x, 2, FR_SHAPE(n * c, s * s));
    fr_tensor *y = flat ? fr_matmul(flat, u) : NULL;
    fr_release(flat);
    return y ? fr_chain(y, fr_reshape(y, 4, FR_SHAPE(n, c, 2 * s, 2 * s))) : NULL;
}

static void upsample_new(fr_module *parent, const char *name, fr_tensor *u) {
    upsample_block *b = fr_block_state(fr_block_new(parent, name, upsample_forward, sizeof *b));
    if (b)
        b->u = u;
}

/* The generator's stem: z -> fc -> (N, 16, 7, 7) -> bn0 (BN-ReLU). One block
 * rather than fc, a reshape block and bn0 in the sequence, so that bn0's
 * input is a tensor of the block's own and never the input of a checkpoint
 * segment, which the engine holds and abn could not write over. */
typedef struct {
    fr_module *fc, *bn0;
} stem_block;

static fr_tensor *stem_forward(fr_module *self, fr_tensor *z, const fr_run *run) {
    stem_block *b = fr_block_state(self);
    fr_tensor *h = fr_forward(b->fc, z, run);
    h = h ? fr_chain(h, fr_reshape(h, 4, FR_SHAPE(z->shape[0], 16, 7, 7))) : NULL;
    return fr_chain(h, fr_forward(b->bn0, h, run));
}

/* Named "" so that its layers are "fc" and "bn0", not "stem.fc". */
static void stem_new(fr_module *parent) {
    fr_module *blk = fr_block_new(parent, "", stem_forward, sizeof(stem_block));
    stem_block *b = fr_block_state(blk);
    if (!b)
        return;
    b->fc = fr_linear_new(blk, "fc", (fr_linear_opts){.in = ZDIM, .out = 16 * 7 * 7});
    b->bn0 = fr_norm_new(blk, "bn0", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
}

/* hardtanh(x) = relu(x + 1) - relu(x - 1) - 1 from existing ops: keeps the
 * generator's pixels in [-1, 1], where the data are (frugal has no tanh). */
static fr_tensor *hardtanh_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)self;
    (void)run;
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

/* The DCGAN discriminator's leaky ReLU (slope 0.2; the norm layers only
 * have ReLU). */
static fr_tensor *leaky_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    (void)self;
    (void)run;
    return fr_leaky_relu(x, 0.2f);
}

static fr_model *generator_new(fr_tensor *up7, fr_tensor *up14, uint64_t seed) {
    /* "in channels" and "classes" are only recorded: z's features, one grey channel out */
    fr_model *m = fr_model_new("gan_g", ZDIM, 1, seed);
    fr_module *net = fr_model_root(m);
    stem_new(net);
    upsample_new(net, "up7", up7);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 16, .out = 16});
    fr_norm_new(net, "bn1", (fr_norm_opts){.channels = 16, .act = FR_ACT_RELU});
    upsample_new(net, "up14", up14);
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = 16, .out = 1, .bias = true});
    fr_block_new(net, "hardtanh", hardtanh_forward, 0);
    return fr_model_finish(m);
}

static fr_model *discriminator_new(uint64_t seed) {
    fr_model *m = fr_model_new("gan_d", 1, 2, seed);
    fr_module *net = fr_model_root(m);
    fr_conv2d_new(net, "conv1", (fr_conv2d_opts){.in = 1, .out = 16, .kernel = 4, .stride = 2, .pad = 1,
                                                  .bias = true});
    fr_block_new(net, "leaky", leaky_forward, 0);
    fr_conv2d_new(net, "conv2", (fr_conv2d_opts){.in = 16, .out = 32, .kernel = 4, .stride = 2, .pad = 1});
    fr_norm_new(net, "bn2", (fr_norm_opts){.channels = 32, .act = FR_ACT_RELU});
    fr_flatten_new(net, "flatten");
    fr_linear_new(net, "fc", (fr_linear_opts){.in = 32 * 7 * 7, .out = 2});
    return fr_model_finish(m);
}

static fr_status models_init(models *ms, fr_strategy s, uint64_t seed) {
    if (!(ms->up7 = upsample_matrix(7)) || !(ms->up14 = upsample_matrix(14)) ||
        !(ms->g = generator_new(ms->up7, ms->up14, seed)) || !(ms->d = discriminator_new(seed + 1)))
        return fr_last_status();
    ms->g->cfg.strategy = ms->d->cfg.strategy = s;
    return FR_OK;
}

static void models_free(models *ms) {
    fr_model_free(ms->g);
    fr_model_free(ms->d);
    fr_release(ms->up7);
    fr_release(ms->up14);
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

static fr_tensor *d_loss(fr_model *d, fr_tensor *x, fr_tensor *target) {
    fr_tensor *logits = fr_model_forward(d, x, true);
    return logits ? fr_chain(logits, fr_cross_entropy(logits, target)) : NULL;
}

/* One alternating step; *ld, *lg get the two losses. */
static fr_status gan_step(fr_model *g, fr_model *d, fr_optim *gopt, fr_optim *dopt,
                          fr_tensor *const *g_inputs, int n_g_inputs, fr_tensor *real, fr_tensor *z,
                          fr_tensor *ones, fr_tensor *zeros, double *ld, double *lg) {
    fr_tensor *fake = fr_model_forward(g, z, true);
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
static fr_status write_grid(fr_model *g, const char *path, fr_rng *rng) {
    fr_tensor *z = noise(GRID * GRID, rng);
    fr_no_grad_enter();
    fr_tensor *img = z ? fr_model_forward(g, z, true) : NULL;
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
    int len = 0;
    unsigned char *png = st == FR_OK ? stbi_write_png_to_mem(out, W, W, W, 1, &len) : NULL;
    if (st == FR_OK && !png)
        st = fr_error(FR_ERR_OOM, "gan: --out %s: out of memory encoding the PNG", path);
    if (st == FR_OK)
        st = fr_outfile_write(path, png, (size_t)len); /* its error names the path */
    free(png);
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
    models m;
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
    FR_TRY(fr_outfile_check("--out", o->out, NULL, 0)); /* before any step */
    FR_TRY(fr_strategy_parse(o->strategy, &strategy));
    FR_TRY(models_init(&r->m, strategy, (uint64_t)o->seed));
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
    if (!(r->gopt = fr_adam_new(r->m.g->params, ao)) || !(r->dopt = fr_adam_new(r->m.d->params, ao)) ||
        !(r->ones = labels(o->batch, 1)) || !(r->zeros = labels(o->batch, 0)))
        return fr_last_status();
    int n_g = 0;
    const fr_params *gp = r->m.g->params;
    if (!(r->g_inputs = calloc((size_t)gp->count, sizeof *r->g_inputs)))
        return fr_error(FR_ERR_OOM, "gan: out of memory");
    for (int i = 0; i < gp->count; i++)
        if (gp->items[i].kind == FR_PARAMETER)
            r->g_inputs[n_g++] = gp->items[i].tensor;
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
        fr_status st = z ? gan_step(r->m.g, r->m.d, r->gopt, r->dopt, r->g_inputs, n_g, real, z,
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
    FR_TRY(write_grid(r->m.g, o->out, &rng));
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
        s = fr_error(FR_ERR_ARG, "gan: a leak: %ld tensors and %zu bytes alive at exit", tensors, bytes);
    return fr_cli_exit_status("gan", s);
}
