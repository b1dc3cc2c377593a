/* dataset.c: the dataset container and the IDX and CIFAR readers (image
 * folders are in image_folder.c). See dataset.h. */
#include "dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* A compressed stream cannot inflate to more than about 1032 times its size
 * (deflate's best case); a header that claims more is corrupt, and is caught
 * before it becomes a huge allocation. */
#define FR_GZ_MAX_RATIO 1032
#define FR_CIFAR_PIXELS 3072

fr_dataset *fr_dataset_new(const char *name, int64_t n, int64_t c, int64_t h, int64_t w,
                           int num_classes) {
    if (n < 0 || c < 1 || h < 1 || w < 1 || num_classes < 1) {
        fr_error(FR_ERR_ARG, "dataset %s: bad size n=%lld c=%lld h=%lld w=%lld classes=%d",
                 name ? name : "?", (long long)n, (long long)c, (long long)h, (long long)w,
                 num_classes);
        return NULL;
    }
    fr_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        fr_error(FR_ERR_OOM, "dataset: out of memory");
        return NULL;
    }
    snprintf(ds->name, sizeof ds->name, "%s", name ? name : "dataset");
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->num_classes = num_classes;
    ds->images = fr_empty(FR_CPU, FR_U8, 4, FR_SHAPE(n, c, h, w), FR_TAG_DATA);
    ds->labels = ds->images ? fr_empty(FR_CPU, FR_I32, 1, FR_SHAPE(n), FR_TAG_DATA) : NULL;
    if (!ds->labels) {
        fr_dataset_free(ds);
        return NULL;
    }
    return ds;
}

void fr_dataset_free(fr_dataset *ds) {
    if (!ds)
        return;
    fr_release(ds->images);
    fr_release(ds->labels);
    if (ds->class_names)
        for (int i = 0; i < ds->num_classes; i++)
            free(ds->class_names[i]);
    free(ds->class_names);
    free(ds);
}

fr_dataset *fr_dataset_from_host(const char *name, int64_t n, int64_t c, int64_t h, int64_t w,
                                 const uint8_t *images, const int32_t *labels, int num_classes) {
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= num_classes) {
            fr_error(FR_ERR_ARG, "dataset %s: label %d of image %lld is outside [0, %d)",
                     name ? name : "?", labels[i], (long long)i, num_classes);
            return NULL;
        }
    fr_dataset *ds = fr_dataset_new(name, n, c, h, w, num_classes);
    if (!ds)
        return NULL;
    memcpy(fr_data(ds->images), images, fr_nbytes(ds->images));
    memcpy(fr_data(ds->labels), labels, fr_nbytes(ds->labels));
    return ds;
}

fr_status fr_dataset_check_dir(const char *what, const char *dir) {
    struct stat sb;
    if (!dir || !*dir)
        return fr_error(FR_ERR_ARG, "%s: no data folder given", what);
    if (stat(dir, &sb) != 0)
        return fr_error(FR_ERR_IO, "%s: data folder %s is missing (%s)", what, dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return fr_error(FR_ERR_IO, "%s: data folder %s is not a folder", what, dir);
    return FR_OK;
}

static void base_name(char *out, size_t len, const char *path) {
    const char *slash = strrchr(path, '/');
    snprintf(out, len, "%s", slash ? slash + 1 : path);
    char *dot = strstr(out, ".gz");
    if (dot && !dot[3])
        *dot = '\0';
}

/* ---- IDX ---- */

typedef struct {
    const char *path;
    gzFile gz;
    int64_t dims[3];
    int64_t data_bytes;  /* what the header says follows it */
} idx_file;

/* gzread in int-sized pieces; returns the bytes read or -1 on a zlib error. */
static int64_t gz_read_all(gzFile gz, void *dst, int64_t n) {
    int64_t done = 0;
    while (done < n) {
        int64_t part = n - done > (1 << 30) ? (1 << 30) : n - done;
        int got = gzread(gz, (char *)dst + done, (unsigned)part);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        done += got;
    }
    return done;
}

static fr_status idx_error_read(const idx_file *f, const char *field, int64_t want, int64_t got) {
    int zerr = 0;
    const char *msg = gzerror(f->gz, &zerr);
    if (got < 0 || (zerr != Z_OK && zerr != Z_BUF_ERROR))
        return fr_error(FR_ERR_FORMAT, "idx: %s: cannot decode the %s: %s", f->path, field, msg);
    return fr_error(FR_ERR_FORMAT, "idx: %s: truncated %s: expected %lld bytes, the file ends after %lld",
                    f->path, field, (long long)want, (long long)got);
}

/* Opens an IDX file and reads its header: magic 0x000008<ndim> (u8 data)
 * then ndim big-endian u32 sizes. */
static fr_status idx_open(idx_file *f, const char *path, int ndim, const char *what) {
    memset(f, 0, sizeof *f);
    f->path = path;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fr_error(FR_ERR_IO, "idx: cannot open %s file %s: %s", what, path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return fr_error(FR_ERR_IO, "idx: %s file %s is not a regular file", what, path);
    f->gz = gzopen(path, "rb");
    if (!f->gz)
        return fr_error(FR_ERR_IO, "idx: cannot open %s file %s: %s", what, path, strerror(errno));
    gzbuffer(f->gz, 1 << 17);
    /* the magic first, so a wrong kind of file is named as such */
    unsigned char head[16];
    int64_t hbytes = 4 + 4 * (int64_t)ndim;
    int64_t got = gz_read_all(f->gz, head, 4);
    if (got == 4)
        got += gz_read_all(f->gz, head + 4, hbytes - 4);
    if (got != hbytes && got < 4)
        return idx_error_read(f, "header", hbytes, got);
    uint32_t magic = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
    if (magic != (0x800u | (uint32_t)ndim))
        return fr_error(FR_ERR_FORMAT, "idx: %s: magic number is 0x%08x, expected 0x%08x (%s: u8, %d "
                        "dimension%s)", path, magic, 0x800u | (uint32_t)ndim, what, ndim,
                        ndim > 1 ? "s" : "");
    if (got != hbytes)
        return idx_error_read(f, "header", hbytes, got);
    f->data_bytes = 1;
    for (int d = 0; d < ndim; d++) {
        const unsigned char *b = head + 4 + 4 * d;
        f->dims[d] = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
        if (f->dims[d] == 0 && d > 0)
            return fr_error(FR_ERR_FORMAT, "idx: %s: dimension %d of the header is 0", path, d);
        if (f->dims[d] && f->data_bytes > ((int64_t)1 << 40) / f->dims[d])
            return fr_error(FR_ERR_FORMAT, "idx: %s: header sizes claim more than 1 TiB of data", path);
        f->data_bytes *= f->dims[d];
    }
    /* Plain files must hold exactly the data; gzip files can be checked only
     * against the best compression ratio before decoding. */
    int64_t avail = (int64_t)sb.st_size - hbytes;
    if (gzdirect(f->gz) ? f->data_bytes != avail : f->data_bytes > (int64_t)sb.st_size * FR_GZ_MAX_RATIO)
        return fr_error(FR_ERR_FORMAT, "idx: %s: header sizes say %lld data bytes, the file %s %lld",
                        path, (long long)f->data_bytes, gzdirect(f->gz) ? "holds" : "cannot hold",
                        (long long)(gzdirect(f->gz) ? avail : f->data_bytes));
    return FR_OK;
}

static fr_status idx_read(idx_file *f, void *dst, const char *field) {
    int64_t got = gz_read_all(f->gz, dst, f->data_bytes);
    if (got != f->data_bytes)
        return idx_error_read(f, field, f->data_bytes, got);
    char extra;
    if (gzread(f->gz, &extra, 1) != 0)
        return fr_error(FR_ERR_FORMAT, "idx: %s: trailing bytes after the %lld bytes of %s", f->path,
                        (long long)f->data_bytes, field);
    return FR_OK;
}

static void idx_close(idx_file *f) {
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

fr_dataset *fr_dataset_load_idx(const char *images_path, const char *labels_path) {
    return fr_dataset_load_idx_classes(images_path, labels_path, FR_IDX_MNIST_CLASSES);
}

fr_dataset *fr_dataset_load_idx_classes(const char *images_path, const char *labels_path, int num_classes) {
    if (!images_path || !labels_path || num_classes < 1 || num_classes > 256) {
        fr_error(FR_ERR_ARG, "idx: images_path or labels_path is NULL, or num_classes %d is outside "
                 "[1, 256]", num_classes);
        return NULL;
    }
    idx_file im, lb;
    fr_dataset *ds = NULL;
    memset(&lb, 0, sizeof lb);
    if (idx_open(&im, images_path, 3, "images") != FR_OK || idx_open(&lb, labels_path, 1, "labels") != FR_OK)
        goto done;
    if (im.dims[0] != lb.dims[0]) {
        fr_error(FR_ERR_FORMAT, "idx: count mismatch: images file %s holds %lld images, labels file %s "
                 "holds %lld labels", images_path, (long long)im.dims[0], labels_path,
                 (long long)lb.dims[0]);
        goto done;
    }
    char name[64];
    base_name(name, sizeof name, images_path);
    ds = fr_dataset_new(name, im.dims[0], 1, im.dims[1], im.dims[2], num_classes);
    if (!ds)
        goto done;
    int32_t *labels = fr_data(ds->labels);
    if (idx_read(&im, fr_data(ds->images), "pixel data") != FR_OK ||
        idx_read(&lb, labels, "labels") != FR_OK) {
        fr_dataset_free(ds);
        ds = NULL;
        goto done;
    }
    /* The u8 labels were read into the front of the i32 buffer; widen them
     * from the back so no byte is overwritten before it is read. The class
     * count is the dataset's definition, never the largest label seen: a
     * stray 255 must not make a 256-class model. */
    const uint8_t *raw = (const uint8_t *)labels;
    int64_t bad = -1;
    for (int64_t i = ds->n - 1; i >= 0; i--) {
        labels[i] = raw[i];
        if (labels[i] >= num_classes)
            bad = i;
    }
    if (bad >= 0) {
        fr_error(FR_ERR_FORMAT, "idx: %s: record %lld: label %d is outside [0, %d)", labels_path,
                 (long long)bad, labels[bad], num_classes);
        fr_dataset_free(ds);
        ds = NULL;
    }
done:
    idx_close(&im);
    idx_close(&lb);
    return ds;
}

/* ---- CIFAR ---- */

typedef struct {
    const char *tag;      /* "cifar10" / "cifar100" */
    int label_bytes;      /* bytes before the pixels */
    int label_index;      /* which of them is the label */
    int num_classes;
    int n_files;
    const char *files[5];
} cifar_spec;

static fr_dataset *cifar_load(const cifar_spec *sp, const char *dir, bool train) {
    if (!dir) {
        fr_error(FR_ERR_ARG, "%s: dir is NULL", sp->tag);
        return NULL;
    }
    if (fr_dataset_check_dir(sp->tag, dir) != FR_OK)
        return NULL;
    const int64_t rec = sp->label_bytes + FR_CIFAR_PIXELS;
    char paths[5][1024];
    int64_t counts[5], total = 0;
    for (int k = 0; k < sp->n_files; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/%s", dir, sp->files[k]);
        struct stat sb;
        if (stat(paths[k], &sb) != 0) {
            fr_error(FR_ERR_IO, "%s: cannot open %s: %s", sp->tag, paths[k], strerror(errno));
            return NULL;
        }
        if (!S_ISREG(sb.st_mode)) {
            fr_error(FR_ERR_IO, "%s: %s is not a regular file", sp->tag, paths[k]);
            return NULL;
        }
        if (sb.st_size == 0 || sb.st_size % rec != 0) {
            fr_error(FR_ERR_FORMAT, "%s: %s: %lld bytes is not a whole number of %lld-byte records "
                     "(truncated or trailing bytes)", sp->tag, paths[k], (long long)sb.st_size,
                     (long long)rec);
            return NULL;
        }
        counts[k] = (int64_t)sb.st_size / rec;
        total += counts[k];
    }
    char name[64];
    snprintf(name, sizeof name, "%s-%s", sp->tag, train ? "train" : "test");
    fr_dataset *ds = fr_dataset_new(name, total, 3, 32, 32, sp->num_classes);
    if (!ds)
        return NULL;
    uint8_t *px = fr_data(ds->images);
    int32_t *labels = fr_data(ds->labels);
    int64_t i = 0;
    for (int k = 0; k < sp->n_files; k++) {
        FILE *fp = fopen(paths[k], "rb");
        if (!fp) {
            fr_error(FR_ERR_IO, "%s: cannot open %s: %s", sp->tag, paths[k], strerror(errno));
            goto fail;
        }
        setvbuf(fp, NULL, _IOFBF, 1 << 18);
        for (int64_t r = 0; r < counts[k]; r++, i++) {
            unsigned char lab[2];
            if (fread(lab, 1, (size_t)sp->label_bytes, fp) != (size_t)sp->label_bytes ||
                fread(px + i * FR_CIFAR_PIXELS, 1, FR_CIFAR_PIXELS, fp) != FR_CIFAR_PIXELS) {
                fr_error(FR_ERR_IO, "%s: %s: cannot read record %lld (file changed or unreadable)",
                         sp->tag, paths[k], (long long)r);
                fclose(fp);
                goto fail;
            }
            labels[i] = lab[sp->label_index];
            if (labels[i] >= sp->num_classes) {
                fr_error(FR_ERR_FORMAT, "%s: %s: record %lld: label %d is outside [0, %d)", sp->tag,
                         paths[k], (long long)r, labels[i], sp->num_classes);
                fclose(fp);
                goto fail;
            }
        }
        fclose(fp);
    }
    return ds;
fail:
    fr_dataset_free(ds);
    return NULL;
}

fr_dataset *fr_dataset_load_cifar10(const char *dir, bool train) {
    static const cifar_spec train_spec = {
        "cifar10", 1, 0, 10, 5,
        {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"}};
    static const cifar_spec test_spec = {"cifar10", 1, 0, 10, 1, {"test_batch.bin"}};
    return cifar_load(train ? &train_spec : &test_spec, dir, train);
}

fr_dataset *fr_dataset_load_cifar100(const char *dir, bool train) {
    static const cifar_spec train_spec = {"cifar100", 2, 1, 100, 1, {"train.bin"}};
    static const cifar_spec test_spec = {"cifar100", 2, 1, 100, 1, {"test.bin"}};
    return cifar_load(train ? &train_spec : &test_spec, dir, train);
}
