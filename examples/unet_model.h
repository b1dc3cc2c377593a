/* unet_model.h: the small U-Net denoising autoencoder of examples/unet.c, in
 * a header so that the example and its test (tests/test_examples.c) build the
 * one definition. Written with the building API (docs/MODELS.md).
 *
 * The model adds Gaussian noise (UNET_NOISE_SIGMA, in the input's normalised
 * units) to its input and is trained, through the loss callback (nn/model.h:
 * m->loss), to give back the clean input: MSE(out, x). The noise is a pure
 * function of each image's pixels (a hash of them seeds it), so a replayed
 * segment, every strategy and an evaluation see the same noisy image.
 *
 *   enc1: conv 3x3 -> GroupNorm+SiLU, twice, 28x28 (skip 1)
 *   max pool 2; enc2: the same at twice the width, 14x14 (skip 2)
 *   max pool 2; mid: conv 3x3 -> GroupNorm+SiLU at 4x the width, 7x7
 *   bilinear x2, concat skip 2, conv -> GroupNorm+SiLU      (14x14)
 *   bilinear x2, concat skip 1, conv -> GroupNorm+SiLU      (28x28)
 *   1x1 conv with bias back to the input's channels. */
#ifndef FRUGAL_EXAMPLES_UNET_MODEL_H
#define FRUGAL_EXAMPLES_UNET_MODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <frugal/frugal.h>

#define UNET_NOISE_SIGMA 1.0f

typedef struct {
    fr_module *enc1[4], *enc2[4], *mid[2], *up2, *dec2[2], *up1, *dec1[2], *out, *pool;
    int width;
} unet_block;

/* Sum of the squared noise added in evaluation (no training) forwards and
 * its element count since the last training forward: the noisy input's MSE
 * on the test set that examples/unet.c prints next to the model's. */
static double unet_eval_noise_sq;
static long long unet_eval_noise_n;

static uint64_t unet_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* x + sigma * N(0, 1), the noise of each image seeded by a hash of its
 * pixels (Box-Muller on splitmix64 draws); not differentiated (x is data). */
static fr_tensor *unet_add_noise(fr_tensor *x, bool training) {
    if (x->dtype != FR_F32 || x->ndim != 4) {
        fr_error(FR_ERR_ARG, "unet: input must be f32 (N, C, H, W)");
        return NULL;
    }
    fr_tensor *h = fr_device_of(x) == FR_CPU ? fr_retain(x) : fr_to_device(x, FR_CPU, FR_TAG_TRANSIENT);
    if (!h)
        return NULL;
    const float *p = fr_data_f32(h);
    size_t per = (size_t)(x->shape[1] * x->shape[2] * x->shape[3]), n = (size_t)x->shape[0];
    float *noisy = malloc(n * per * sizeof *noisy);
    if (!noisy) {
        fr_release(h);
        fr_error(FR_ERR_OOM, "unet: no host memory for the noisy batch");
        return NULL;
    }
    if (training)
        unet_eval_noise_sq = 0, unet_eval_noise_n = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t seed = 1469598103934665603ull;
        for (size_t j = 0; j < per; j++) {
            uint32_t bits;
            memcpy(&bits, &p[i * per + j], sizeof bits);
            seed = (seed ^ bits) * 1099511628211ull;
        }
        for (size_t j = 0; j < per; j++) {
            double u1 = ((double)(unet_mix(seed + 2 * j + 1) >> 11) + 1.0) / 9007199254740993.0;
            double u2 = (double)(unet_mix(seed + 2 * j + 2) >> 11) / 9007199254740992.0;
            float e = UNET_NOISE_SIGMA * (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
            noisy[i * per + j] = p[i * per + j] + e;
            if (!training)
                unet_eval_noise_sq += (double)e * e;
        }
    }
    if (!training)
        unet_eval_noise_n += (long long)(n * per);
    fr_release(h);
    fr_tensor *t = fr_from_host(fr_device_of(x), FR_F32, 4, x->shape, FR_TAG_DATA, noisy);
    free(noisy);
    return t;
}

static fr_tensor *unet_seq(fr_module *const *mods, int count, fr_tensor *x, const fr_run *run) {
    fr_tensor *y = fr_retain(x);
    for (int i = 0; i < count && y; i++)
        y = fr_forward_take(mods[i], y, run);
    return y;
}

/* upsample y, concatenate the skip along channels, conv + norm */
static fr_tensor *unet_up(fr_module *up, fr_module *const *dec, fr_tensor *y, fr_tensor *skip,
                          const fr_run *run) {
    fr_tensor *u = fr_forward(up, y, run);
    fr_tensor *cat = u ? fr_concat((fr_tensor *[]){u, skip}, 2) : NULL;
    fr_release(u);
    fr_tensor *out = cat ? unet_seq(dec, 2, cat, run) : NULL;
    fr_release(cat);
    return out;
}

static fr_tensor *unet_forward(fr_module *self, fr_tensor *x, const fr_run *run) {
    unet_block *b = fr_block_state(self);
    fr_tensor *noisy = unet_add_noise(x, run->training);
    fr_tensor *s1 = noisy ? unet_seq(b->enc1, 4, noisy, run) : NULL;
    fr_release(noisy);
    fr_tensor *y = s1 ? fr_forward(b->pool, s1, run) : NULL;
    fr_tensor *s2 = y ? unet_seq(b->enc2, 4, y, run) : NULL;
    fr_release(y);
    y = s2 ? fr_forward(b->pool, s2, run) : NULL;
    y = fr_chain(y, y ? unet_seq(b->mid, 2, y, run) : NULL);
    y = fr_chain(y, y ? unet_up(b->up2, b->dec2, y, s2, run) : NULL);
    y = fr_chain(y, y ? unet_up(b->up1, b->dec1, y, s1, run) : NULL);
    fr_release(s1);
    fr_release(s2);
    return fr_chain(y, y ? fr_forward(b->out, y, run) : NULL);
}

/* conv 3x3 (no bias: the norm has one) then GroupNorm(groups of 4) + SiLU */
static void unet_conv_gn(fr_module *blk, fr_module **slot, const char *name, int in, int out) {
    char nm[24];
    snprintf(nm, sizeof nm, "%s_conv", name);
    slot[0] = fr_conv2d_new(blk, nm, (fr_conv2d_opts){.in = in, .out = out});
    snprintf(nm, sizeof nm, "%s_gn", name);
    slot[1] = fr_norm_new(blk, nm, (fr_norm_opts){.channels = out, .kind = FR_NORM_GROUP,
                                                  .groups = out / 4, .act = FR_ACT_SILU});
}

/* The mean squared error of the denoised output against the clean input. */
static fr_tensor *unet_loss(fr_model *m, fr_tensor *out, fr_tensor *x, fr_tensor *y) {
    (void)m, (void)y;
    return fr_mse_loss(out, x);
}

/* width: the first level's channels (a multiple of 4); num_classes unused */
static inline fr_model *unet_create_width(const char *name, int in_channels, int num_classes,
                                          uint64_t seed, int width) {
    fr_model *m = fr_model_new(name, in_channels, num_classes, seed);
    fr_module *blk = fr_block_new(fr_model_root(m), "", unet_forward, sizeof(unet_block));
    unet_block *b = fr_block_state(blk);
    if (b) {
        int w = width;
        unet_conv_gn(blk, b->enc1, "enc1a", in_channels, w);
        unet_conv_gn(blk, b->enc1 + 2, "enc1b", w, w);
        b->pool = fr_max_pool2d_new(blk, "pool", (fr_pool_params){.kernel = 2, .stride = 2});
        unet_conv_gn(blk, b->enc2, "enc2a", w, 2 * w);
        unet_conv_gn(blk, b->enc2 + 2, "enc2b", 2 * w, 2 * w);
        unet_conv_gn(blk, b->mid, "mid", 2 * w, 4 * w);
        fr_upsample_opts bil = {.scale = 2, .mode = FR_UPSAMPLE_BILINEAR};
        b->up2 = fr_upsample_new(blk, "up2", bil);
        unet_conv_gn(blk, b->dec2, "dec2", 4 * w + 2 * w, 2 * w);
        b->up1 = fr_upsample_new(blk, "up1", bil);
        unet_conv_gn(blk, b->dec1, "dec1", 2 * w + w, w);
        b->out = fr_conv2d_new(blk, "out", (fr_conv2d_opts){.in = w, .out = in_channels,
                                                            .kernel = 1, .bias = true});
    }
    m = fr_model_finish(m);
    if (m)
        m->loss = unet_loss;
    return m;
}

static inline fr_model *unet_create(const char *name, int in_channels, int num_classes,
                                    uint64_t seed) {
    return unet_create_width(name, in_channels, num_classes, seed, 16);
}

#endif
