/* dataset.h: image classification datasets held once in memory.
 *
 * A dataset is N images of C x H x W u8 pixels in ONE tensor (N, C, H, W)
 * and N i32 labels in [0, num_classes), both tagged FR_TAG_DATA so the
 * ledger shows what the data costs. Readers decode straight into those
 * buffers: nothing is held twice. Loaders (loader.h) and augmentation read
 * from it; they never copy it.
 *
 * Readers:
 *  - IDX (MNIST, Fashion-MNIST, EMNIST...): an images file (magic 0x00000803,
 *    u8, N x H x W) and a labels file (0x00000801, u8, N), plain or gzip
 *    (zlib reads both); C = 1. The class count is the dataset's definition
 *    (10 for MNIST and Fashion-MNIST, given for other sets), never derived
 *    from the labels: a label outside it is an error naming the record.
 *  - CIFAR-10 binary: data_batch_1..5.bin (train) or test_batch.bin, records
 *    of 1 label byte + 3072 pixel bytes (planes R, G, B of 32 x 32).
 *  - CIFAR-100 binary: train.bin or test.bin, records of coarse label, fine
 *    label, 3072 pixel bytes; the fine label (100 classes) is used.
 *  - image folders: one sub-folder per class, classes numbered in name order
 *    (a test split: in the training split's name order, by name);
 *    PNG, JPEG or BMP files of one common size, decoded by libpng,
 *    libjpeg-turbo or data/image_bmp.c after the checks of data/image.h.
 *
 * Every error (missing file, truncated or oversized data, wrong magic,
 * image/label count mismatch, label out of range, mixed image sizes, a file
 * that is not an image) returns NULL with FR_ERR_IO or FR_ERR_FORMAT and a
 * message naming the file and the field. */
#ifndef FR_DATASET_H
#define FR_DATASET_H

#include <stdbool.h>

#include "../tensor/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fields are read-only for users. */
typedef struct fr_dataset {
    char name[64];       /* "fashion-mnist-t10k", "cifar10-train", a folder name ... */
    int64_t n, c, h, w;
    int num_classes;
    fr_tensor *images;   /* (N, C, H, W) u8, CPU */
    fr_tensor *labels;   /* (N,) i32, CPU */
    char **class_names;  /* image folders only (num_classes names), else NULL */
} fr_dataset;

#define FR_IDX_MNIST_CLASSES 10
/* MNIST / Fashion-MNIST: FR_IDX_MNIST_CLASSES classes. */
fr_dataset *fr_dataset_load_idx(const char *images_path, const char *labels_path);
/* Any IDX set: labels must lie in [0, num_classes), num_classes in [1, 256]. */
fr_dataset *fr_dataset_load_idx_classes(const char *images_path, const char *labels_path, int num_classes);
fr_dataset *fr_dataset_load_cifar10(const char *dir, bool train);
fr_dataset *fr_dataset_load_cifar100(const char *dir, bool train);
/* channels: 1 (grey) or 3 (RGB), every image converted to it; or 0 for 3
 * when any image of the folder has colour, else 1 (decided from every file,
 * so the order of names cannot change it). Errors name the file. */
fr_dataset *fr_dataset_load_folder(const char *dir, int channels);
/* One split of a folder data set, as fr_dataset_load_folder, with:
 * classes_dir (or NULL: dir itself) the folder whose sorted class
 * sub-folder names number the labels: a test split takes the training
 * split's, so the same name is the same label in both, and a class of dir
 * that classes_dir lacks is an error naming it; num_classes is then
 * classes_dir's count. limit > 0 keeps that many images, a stratified
 * prefix (the first image of every class, then the second of every class,
 * ...), only they decoded. */
fr_dataset *fr_dataset_load_folder_split(const char *dir, int channels, const char *classes_dir,
                                         int64_t limit);

/* An empty dataset to fill in place: images and labels allocated, contents
 * undefined; class_names NULL. */
fr_dataset *fr_dataset_new(const char *name, int64_t n, int64_t c, int64_t h, int64_t w,
                           int num_classes);
/* A dataset from host buffers (copied once): images (N, C, H, W) u8 and N
 * labels, each in [0, num_classes). */
fr_dataset *fr_dataset_from_host(const char *name, int64_t n, int64_t c, int64_t h, int64_t w,
                                 const uint8_t *images, const int32_t *labels, int num_classes);

void fr_dataset_free(fr_dataset *ds);

/* FR_OK when `dir` is a folder; else an error saying that the data folder
 * is missing (or is not a folder), prefixed by `what`. */
fr_status fr_dataset_check_dir(const char *what, const char *dir);

/* The pixels of image i, (C, H, W). */
static inline const uint8_t *fr_dataset_image(const fr_dataset *ds, int64_t i) {
    return (const uint8_t *)fr_data(ds->images) + i * ds->c * ds->h * ds->w;
}
static inline int32_t fr_dataset_label(const fr_dataset *ds, int64_t i) {
    return ((const int32_t *)fr_data(ds->labels))[i];
}

#ifdef __cplusplus
}
#endif
#endif
