/* augment.c: see augment.h. */
#include "augment.h"

/* Channel statistics of the training sets, as commonly quoted. */
const float fr_cifar10_mean[3] = {0.4914f, 0.4822f, 0.4465f};
const float fr_cifar10_std[3] = {0.2470f, 0.2435f, 0.2616f};
const float fr_cifar100_mean[3] = {0.5071f, 0.4865f, 0.4409f};
const float fr_cifar100_std[3] = {0.2673f, 0.2564f, 0.2762f};
const float fr_fashion_mnist_mean[1] = {0.2860f};
const float fr_fashion_mnist_std[1] = {0.3530f};

fr_aug_choice fr_aug_draw(const fr_augment *a, fr_data_rng *rng) {
    fr_aug_choice ch = {a->pad, a->pad, false};
    if (a->pad > 0) {
        ch.off_y = (int)fr_data_rng_below(rng, (uint64_t)(2 * a->pad + 1));
        ch.off_x = (int)fr_data_rng_below(rng, (uint64_t)(2 * a->pad + 1));
    }
    if (a->flip)
        ch.flip = fr_data_rng_next(rng) >> 63;
    return ch;
}

/* Where output column x reads from in src (may be out of range = padding). */
static inline int src_col(int x, int w, int pad, fr_aug_choice ch) {
    return (ch.flip ? w - 1 - x : x) + ch.off_x - pad;
}

void fr_aug_crop_flip_u8(uint8_t *dst, const uint8_t *src, int c, int h, int w, int pad,
                         fr_aug_choice ch) {
    for (int k = 0; k < c; k++)
        for (int y = 0; y < h; y++) {
            int sy = y + ch.off_y - pad;
            for (int x = 0; x < w; x++) {
                int sx = src_col(x, w, pad, ch);
                bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
                dst[((int64_t)k * h + y) * w + x] = inside ? src[((int64_t)k * h + sy) * w + sx] : 0;
            }
        }
}

void fr_aug_normalize(float *dst, const uint8_t *src, int c, int h, int w, const fr_augment *a) {
    const int64_t plane = (int64_t)h * w;
    for (int k = 0; k < c; k++) {
        float sd = a->std[k] != 0.0f ? a->std[k] : 1.0f;
        float m = a->mean[k];
        for (int64_t p = 0; p < plane; p++)
            dst[k * plane + p] = ((float)src[k * plane + p] / 255.0f - m) / sd;
    }
}

fr_status fr_aug_apply(float *dst, const uint8_t *src, int c, int h, int w, const fr_augment *a,
                       fr_data_rng *rng) {
    if (c < 1 || c > FR_AUG_MAX_C || a->pad < 0)
        return fr_error(FR_ERR_ARG, "augment: %d channels (1 to %d supported), pad %d", c,
                        FR_AUG_MAX_C, a->pad);
    fr_aug_choice ch = fr_aug_draw(a, rng);
    for (int k = 0; k < c; k++) {
        float sd = a->std[k] != 0.0f ? a->std[k] : 1.0f;
        float m = a->mean[k];
        /* computed as in fr_aug_normalize so both paths agree bit for bit */
        float padded = (0.0f / 255.0f - m) / sd;
        for (int y = 0; y < h; y++) {
            int sy = y + ch.off_y - a->pad;
            float *out = dst + ((int64_t)k * h + y) * w;  // (W,) row of (C, H, W)
            if (sy < 0 || sy >= h) {
                for (int x = 0; x < w; x++)
                    out[x] = padded;
                continue;
            }
            const uint8_t *row = src + ((int64_t)k * h + sy) * w;
            for (int x = 0; x < w; x++) {
                int sx = src_col(x, w, a->pad, ch);
                out[x] = sx >= 0 && sx < w ? ((float)row[sx] / 255.0f - m) / sd : padded;
            }
        }
    }
    return FR_OK;
}
