/* augment.h: training-time augmentation and normalisation of u8 images.
 *
 * The pipeline is the usual CIFAR one: zero-pad by `pad` pixels and crop a
 * random H x W window, flip horizontally with probability 0.5, then
 * normalise per channel: out = (pixel / 255 - mean[c]) / std[c] (mean and
 * std in [0, 1] units, as torchvision's ToTensor + Normalize). Padding is
 * black in pixel space, so a padded pixel becomes -mean/std.
 *
 * Randomness comes only from the fr_data_rng passed in, drawn in a fixed order
 * per image: the crop's row offset, then its column offset (both in
 * [0, 2*pad], only when pad > 0), then the flip (only when flip is on). The
 * same rng state gives the same image. The explicit-offset functions exist
 * so tests and users can apply exactly one transform. */
#ifndef FR_AUGMENT_H
#define FR_AUGMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "../tensor/fr_base.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FR_AUG_MAX_C 4

typedef struct {
    int pad;                     /* 0 = no random crop */
    bool flip;                   /* random horizontal flip */
    float mean[FR_AUG_MAX_C];    /* per channel; std 0 means 1 (the zero default) */
    float std[FR_AUG_MAX_C];
} fr_augment;

/* Normalisation constants of common datasets (in [0, 1] units). */
extern const float fr_cifar10_mean[3], fr_cifar10_std[3];
extern const float fr_cifar100_mean[3], fr_cifar100_std[3];
extern const float fr_fashion_mnist_mean[1], fr_fashion_mnist_std[1];

/* The randomly chosen transform of one image. */
typedef struct {
    int off_y, off_x;  /* crop window origin in the padded image, in [0, 2*pad] */
    bool flip;
} fr_aug_choice;

/* Draws the choice for one image from `rng` (see the order above). */
fr_aug_choice fr_aug_draw(const fr_augment *a, fr_data_rng *rng);

/* dst = src zero-padded by `pad` and cropped at (off_y, off_x), then
 * mirrored left-right when `flip`. src, dst: (C, H, W) u8, not aliased. */
void fr_aug_crop_flip_u8(uint8_t *dst, const uint8_t *src, int c, int h, int w, int pad,
                         fr_aug_choice ch);
/* dst = (src / 255 - mean[c]) / std[c]; dst (C, H, W) f32. */
void fr_aug_normalize(float *dst, const uint8_t *src, int c, int h, int w, const fr_augment *a);
/* The whole pipeline for one image in one pass: crop, flip, normalise, with
 * the choice drawn from rng (no draws when pad == 0 and !flip). */
fr_status fr_aug_apply(float *dst, const uint8_t *src, int c, int h, int w, const fr_augment *a,
                       fr_data_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
