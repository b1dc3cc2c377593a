/* test_data.c: dataset readers (IDX plain and gzip, CIFAR-10/100, image
 * folders) on small files written here, their error cases, augmentation on
 * a known image, and the batch loader with and without its thread. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "testlib.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

/* ---- temp files ---- */

static const char *tmpdir;

static void make_tmpdir(void) { tmpdir = fr_t_make_tmpdir("data"); }
static void remove_tmpdir(void) { fr_t_remove_tmpdir(tmpdir); }

static const char *tmp_path(char *buf, const char *name) {
    snprintf(buf, 512, "%s/%s", tmpdir, name);
    return buf;
}

static void write_file(const char *path, const void *data, size_t n, bool gz) {
    if (gz) {
        gzFile g = gzopen(path, "wb");
        CHECK(g != NULL);
        if (!g)
            return;
        CHECK(n == 0 || gzwrite(g, data, (unsigned)n) == (int)n);
        gzclose(g);
        return;
    }
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp)
        return;
    CHECK(fwrite(data, 1, n, fp) == n);
    fclose(fp);
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* An IDX file: magic, ndim sizes, then `ndata` bytes of data. */
static void write_idx(const char *path, uint32_t magic, int ndim, const uint32_t *dims,
                      const uint8_t *data, size_t ndata, bool gz) {
    size_t hbytes = 4 + 4 * (size_t)ndim;
    unsigned char *buf = malloc(hbytes + ndata + 1);
    put_be32(buf, magic);
    for (int d = 0; d < ndim; d++)
        put_be32(buf + 4 + 4 * d, dims[d]);
    if (ndata)
        memcpy(buf + hbytes, data, ndata);
    write_file(path, buf, hbytes + ndata, gz);
    free(buf);
}

/* The loader returns NULL with an error; check its status and message. */
#define CHECK_LOAD_ERR(expr, code, needle1, needle2)                                           \
    do {                                                                                       \
        fr_clear_error();                                                                      \
        fr_dataset *d_ = (expr);                                                               \
        CHECK(d_ == NULL);                                                                     \
        fr_dataset_free(d_);                                                                   \
        CHECK_ERR(fr_last_status(), code, needle1);                                            \
        CHECK_ERR(fr_last_status(), code, needle2);                                            \
    } while (0)

/* ---- IDX ---- */

static void test_idx(void) {
    char ip[512], lp[512], lgz[512];
    make_tmpdir();
    uint8_t px[5 * 3 * 4], lab[5] = {0, 3, 1, 2, 3};
    for (int i = 0; i < 60; i++)
        px[i] = (uint8_t)(i * 4 + 1);
    write_idx(tmp_path(ip, "img-idx3-ubyte"), 0x803, 3, (uint32_t[]){5, 3, 4}, px, 60, false);
    write_idx(tmp_path(lp, "lab-idx1-ubyte"), 0x801, 1, (uint32_t[]){5}, lab, 5, false);
    write_idx(tmp_path(lgz, "lab-idx1-ubyte.gz"), 0x801, 1, (uint32_t[]){5}, lab, 5, true);
    char igz[512];
    write_idx(tmp_path(igz, "img-idx3-ubyte.gz"), 0x803, 3, (uint32_t[]){5, 3, 4}, px, 60, true);

    size_t before = fr_mem_current(FR_CPU, FR_TAG_DATA);
    const char *pairs[3][2] = {{ip, lp}, {ip, lgz}, {igz, lgz}};
    for (int k = 0; k < 3; k++) {
        fr_dataset *ds = fr_dataset_load_idx(pairs[k][0], pairs[k][1]);
        CHECK_NOTNULL(ds);
        if (!ds)
            continue;
        /* the MNIST layout's 10 classes, not the largest label + 1 */
        CHECK(ds->n == 5 && ds->c == 1 && ds->h == 3 && ds->w == 4 && ds->num_classes == 10);
        CHECK(!strcmp(ds->name, "img-idx3-ubyte"));
        CHECK(!memcmp(fr_data(ds->images), px, 60));
        for (int i = 0; i < 5; i++)
            CHECK(fr_dataset_label(ds, i) == lab[i]);
        CHECK(fr_dataset_image(ds, 2)[0] == px[24]);
        /* held once: pixels + i32 labels, nothing else */
        CHECK(fr_mem_current(FR_CPU, FR_TAG_DATA) - before == 60 + 5 * sizeof(int32_t));
        fr_dataset_free(ds);
    }
    remove_tmpdir();
}

static void test_idx_errors(void) {
    char ip[512], lp[512], bad[512];
    make_tmpdir();
    uint8_t px[4 * 2 * 2] = {0}, lab[4] = {1, 2, 3, 4};
    write_idx(tmp_path(ip, "img"), 0x803, 3, (uint32_t[]){4, 2, 2}, px, 16, false);
    write_idx(tmp_path(lp, "lab"), 0x801, 1, (uint32_t[]){4}, lab, 4, false);

    CHECK_LOAD_ERR(fr_dataset_load_idx(tmp_path(bad, "nope"), lp), FR_ERR_IO, bad, "images");
    CHECK_LOAD_ERR(fr_dataset_load_idx(ip, tmp_path(bad, "nope")), FR_ERR_IO, bad, "labels");
    /* wrong magic: a labels file given as images, and the other way */
    CHECK_LOAD_ERR(fr_dataset_load_idx(lp, lp), FR_ERR_FORMAT, lp, "magic");
    CHECK_LOAD_ERR(fr_dataset_load_idx(ip, ip), FR_ERR_FORMAT, ip, "magic");
    /* header cut short */
    write_file(tmp_path(bad, "short"), "\0\0\x08\x03\0\0", 6, false);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "truncated header");
    /* pixel data cut short / too long, plain and gzip */
    write_idx(tmp_path(bad, "trunc"), 0x803, 3, (uint32_t[]){4, 2, 2}, px, 15, false);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "data bytes");
    write_idx(tmp_path(bad, "trunc.gz"), 0x803, 3, (uint32_t[]){4, 2, 2}, px, 15, true);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "truncated pixel data");
    uint8_t more[17] = {0};
    write_idx(tmp_path(bad, "long"), 0x803, 3, (uint32_t[]){4, 2, 2}, more, 17, false);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "data bytes");
    write_idx(tmp_path(bad, "long.gz"), 0x803, 3, (uint32_t[]){4, 2, 2}, more, 17, true);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "trailing bytes");
    write_idx(tmp_path(bad, "lablong.gz"), 0x801, 1, (uint32_t[]){4}, more, 5, true);
    CHECK_LOAD_ERR(fr_dataset_load_idx(ip, bad), FR_ERR_FORMAT, bad, "trailing bytes after the 4 bytes of labels");
    /* a header claiming absurd sizes never becomes an allocation */
    write_idx(tmp_path(bad, "huge.gz"), 0x803, 3, (uint32_t[]){0xFFFFFFFFu, 0xFFFF, 0xFFFF}, px, 16, true);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "1 TiB");
    write_idx(tmp_path(bad, "big.gz"), 0x803, 3, (uint32_t[]){100000, 28, 28}, px, 16, true);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "cannot hold");
    /* corrupt compressed data */
    unsigned char junk[40] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef};
    write_file(tmp_path(bad, "junk.gz"), junk, sizeof junk, false);
    CHECK_LOAD_ERR(fr_dataset_load_idx(bad, lp), FR_ERR_FORMAT, bad, "header");
    /* counts that disagree */
    write_idx(tmp_path(bad, "lab3"), 0x801, 1, (uint32_t[]){3}, lab, 3, false);
    CHECK_LOAD_ERR(fr_dataset_load_idx(ip, bad), FR_ERR_FORMAT, "count mismatch", bad);
    remove_tmpdir();
}

/* ---- CIFAR ---- */

/* Record r of a file: label bytes, then pixel k = (seed + r + k) mod 251. */
static void write_cifar(const char *path, int n, int label_bytes, const uint8_t *labels, int seed,
                        size_t cut) {
    size_t rec = (size_t)label_bytes + 3072, len = rec * (size_t)n;
    uint8_t *buf = malloc(len);
    for (int r = 0; r < n; r++) {
        for (int b = 0; b < label_bytes; b++)
            buf[rec * (size_t)r + (size_t)b] = labels[r * label_bytes + b];
        for (int k = 0; k < 3072; k++)
            buf[rec * (size_t)r + (size_t)label_bytes + (size_t)k] = (uint8_t)((seed + r + k) % 251);
    }
    write_file(path, buf, len - cut, false);
    free(buf);
}

static void test_cifar(void) {
    char p[512], name[64];
    make_tmpdir();
    for (int b = 1; b <= 5; b++) {
        uint8_t lab[2] = {(uint8_t)(b % 10), (uint8_t)((b + 4) % 10)};
        snprintf(name, sizeof name, "data_batch_%d.bin", b);
        write_cifar(tmp_path(p, name), 2, 1, lab, b * 10, 0);
    }
    write_cifar(tmp_path(p, "test_batch.bin"), 3, 1, (uint8_t[]){9, 0, 5}, 7, 0);
    fr_dataset *ds = fr_dataset_load_cifar10(tmpdir, true);
    CHECK_NOTNULL(ds);
    if (ds) {
        CHECK(ds->n == 10 && ds->c == 3 && ds->h == 32 && ds->w == 32 && ds->num_classes == 10);
        CHECK(!strcmp(ds->name, "cifar10-train"));
        /* image 5 = batch 3, record 1: its G plane starts at pixel 1024 */
        CHECK(fr_dataset_label(ds, 5) == (3 + 4) % 10);
        CHECK(fr_dataset_image(ds, 5)[1024] == (30 + 1 + 1024) % 251);
        CHECK(fr_dataset_image(ds, 9)[3071] == (50 + 1 + 3071) % 251);
        fr_dataset_free(ds);
    }
    ds = fr_dataset_load_cifar10(tmpdir, false);
    CHECK(ds && ds->n == 3 && fr_dataset_label(ds, 0) == 9 && fr_dataset_image(ds, 2)[0] == 9);
    fr_dataset_free(ds);

    write_cifar(tmp_path(p, "data_batch_4.bin"), 2, 1, (uint8_t[]){1, 2}, 0, 100);
    CHECK_LOAD_ERR(fr_dataset_load_cifar10(tmpdir, true), FR_ERR_FORMAT, p, "3073-byte records");
    write_cifar(tmp_path(p, "data_batch_4.bin"), 2, 1, (uint8_t[]){1, 10}, 0, 0);
    CHECK_LOAD_ERR(fr_dataset_load_cifar10(tmpdir, true), FR_ERR_FORMAT, p, "record 1: label 10");
    remove(tmp_path(p, "data_batch_4.bin"));
    CHECK_LOAD_ERR(fr_dataset_load_cifar10(tmpdir, true), FR_ERR_IO, p, "cannot open");

    /* CIFAR-100: coarse then fine label; the fine one is kept */
    write_cifar(tmp_path(p, "train.bin"), 3, 2, (uint8_t[]){1, 99, 2, 42, 19, 0}, 3, 0);
    ds = fr_dataset_load_cifar100(tmpdir, true);
    CHECK_NOTNULL(ds);
    CHECK(ds && ds->n == 3 && ds->num_classes == 100 && fr_dataset_label(ds, 0) == 99 &&
          fr_dataset_label(ds, 1) == 42 && fr_dataset_label(ds, 2) == 0);
    CHECK(ds && fr_dataset_image(ds, 1)[5] == (3 + 1 + 5) % 251);
    fr_dataset_free(ds);
    write_cifar(tmp_path(p, "train.bin"), 2, 2, (uint8_t[]){1, 5, 2, 100}, 3, 0);
    CHECK_LOAD_ERR(fr_dataset_load_cifar100(tmpdir, true), FR_ERR_FORMAT, p, "label 100");
    CHECK_LOAD_ERR(fr_dataset_load_cifar100(tmpdir, false), FR_ERR_IO, "test.bin", tmpdir);
    remove_tmpdir();
}

/* ---- image folders ---- */

/* A w x h RGB image whose pixel (y, x) channel c is base + 10*y + 3*x + c. */
static void write_rgb(const char *path, int w, int h, int base, bool bmp) {
    uint8_t buf[3 * 16 * 16];
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                buf[(y * w + x) * 3 + c] = (uint8_t)(base + 10 * y + 3 * x + c);
    int ok = bmp ? stbi_write_bmp(path, w, h, 3, buf) : stbi_write_png(path, w, h, 3, buf, w * 3);
    CHECK(ok);
}

static void test_image_folder(void) {
    char p[512], root[512];
    make_tmpdir();
    snprintf(root, sizeof root, "%s/pets", tmpdir);
    mkdir(root, 0700);
    mkdir(tmp_path(p, "pets/dog"), 0700);
    mkdir(tmp_path(p, "pets/cat"), 0700);
    write_rgb(tmp_path(p, "pets/dog/1.png"), 3, 2, 100, false);
    write_rgb(tmp_path(p, "pets/cat/b.bmp"), 3, 2, 50, true);
    write_rgb(tmp_path(p, "pets/cat/a.png"), 3, 2, 0, false);
    write_file(tmp_path(p, "pets/cat/.hidden"), "x", 1, false);
    fr_dataset *ds = fr_dataset_load_folder(root, 0);
    CHECK_NOTNULL(ds);
    if (ds) {
        CHECK(ds->n == 3 && ds->c == 3 && ds->h == 2 && ds->w == 3 && ds->num_classes == 2);
        CHECK(!strcmp(ds->name, "pets") && !strcmp(ds->class_names[0], "cat") &&
              !strcmp(ds->class_names[1], "dog"));
        /* order: cat/a.png, cat/b.bmp, dog/1.png; pixels in (C, H, W) */
        CHECK(fr_dataset_label(ds, 0) == 0 && fr_dataset_label(ds, 1) == 0 &&
              fr_dataset_label(ds, 2) == 1);
        const uint8_t *im = fr_dataset_image(ds, 1);
        bool exact = true;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 2; y++)
                for (int x = 0; x < 3; x++)
                    exact &= im[(c * 2 + y) * 3 + x] == 50 + 10 * y + 3 * x + c;
        CHECK(exact);
        CHECK(fr_dataset_image(ds, 2)[2 * 6 + 1 * 3 + 2] == 100 + 10 + 6 + 2);
        fr_dataset_free(ds);
    }
    ds = fr_dataset_load_folder(root, 1);
    CHECK(ds && ds->c == 1 && ds->n == 3);
    fr_dataset_free(ds);

    write_file(tmp_path(p, "pets/dog/notes.txt"), "not an image", 12, false);
    CHECK_LOAD_ERR(fr_dataset_load_folder(root, 0), FR_ERR_FORMAT, p, "not a PNG");
    remove(p);
    write_rgb(tmp_path(p, "pets/dog/2.png"), 4, 2, 0, false);
    CHECK_LOAD_ERR(fr_dataset_load_folder(root, 0), FR_ERR_FORMAT, p, "is 4x2");
    CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, "a.png is 3x2");
    remove(p);
    mkdir(tmp_path(p, "pets/empty"), 0700);
    CHECK_LOAD_ERR(fr_dataset_load_folder(root, 0), FR_ERR_FORMAT, p, "no image files");
    mkdir(tmp_path(p, "nothing"), 0700);
    CHECK_LOAD_ERR(fr_dataset_load_folder(p, 0), FR_ERR_FORMAT, p, "no class sub-folders");
    CHECK_LOAD_ERR(fr_dataset_load_folder(tmp_path(p, "missing"), 0), FR_ERR_IO, p, "is missing");
    CHECK_LOAD_ERR(fr_dataset_load_folder(root, 2), FR_ERR_ARG, "channels", "got 2");
    remove_tmpdir();
}

/* ---- augmentation ---- */

static void test_augment_exact(void) {
    uint8_t src[16], out[16];
    for (int i = 0; i < 16; i++)
        src[i] = (uint8_t)(i + 1);  // (1, 4, 4): rows 1..4, 5..8, 9..12, 13..16
    /* pad 1, window at row 0, column 2: shifted down 1 and left 1 */
    fr_aug_crop_flip_u8(out, src, 1, 4, 4, 1, (fr_aug_choice){0, 2, false});
    const uint8_t want[16] = {0, 0, 0, 0, 2, 3, 4, 0, 6, 7, 8, 0, 10, 11, 12, 0};
    CHECK(!memcmp(out, want, 16));
    fr_aug_crop_flip_u8(out, src, 1, 4, 4, 1, (fr_aug_choice){0, 2, true});
    const uint8_t want_flip[16] = {0, 0, 0, 0, 0, 4, 3, 2, 0, 8, 7, 6, 0, 12, 11, 10};
    CHECK(!memcmp(out, want_flip, 16));
    fr_aug_crop_flip_u8(out, src, 1, 4, 4, 1, (fr_aug_choice){1, 1, false});
    CHECK(!memcmp(out, src, 16));
    fr_aug_crop_flip_u8(out, src, 1, 4, 4, 0, (fr_aug_choice){0, 0, true});
    const uint8_t mirror[16] = {4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13};
    CHECK(!memcmp(out, mirror, 16));
    fr_aug_crop_flip_u8(out, src, 1, 4, 4, 2, (fr_aug_choice){4, 0, false});
    const uint8_t corner[16] = {0, 0, 9, 10, 0, 0, 13, 14, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(!memcmp(out, corner, 16));

    fr_augment a = {.pad = 1, .flip = true, .mean = {0.5f}, .std = {0.25f}};
    float f[16], g[16];
    fr_aug_normalize(f, src, 1, 4, 4, &a);
    CHECK_CLOSE(f[3], (4.0 / 255.0 - 0.5) / 0.25, 1e-6);

    /* fr_aug_apply = the drawn crop/flip followed by normalisation, exactly */
    int seen_y[3] = {0}, flips = 0;
    for (uint64_t seed = 0; seed < 400; seed++) {
        fr_data_rng r, copy;
        fr_data_rng_seed(&r, seed);
        copy = r;
        fr_aug_choice ch = fr_aug_draw(&a, &copy);
        CHECK(ch.off_y >= 0 && ch.off_y <= 2 && ch.off_x >= 0 && ch.off_x <= 2);
        seen_y[ch.off_y]++;
        flips += ch.flip;
        CHECK_OK(fr_aug_apply(f, src, 1, 4, 4, &a, &r));
        CHECK(r.s == copy.s);
        fr_aug_crop_flip_u8(out, src, 1, 4, 4, 1, ch);
        fr_aug_normalize(g, out, 1, 4, 4, &a);
        if (memcmp(f, g, sizeof f)) {
            fprintf(stderr, "    seed %llu: fused augmentation differs from the explicit steps\n",
                    (unsigned long long)seed);
            fr_t_failed_now = 1;
            break;
        }
    }
    CHECK(seen_y[0] > 80 && seen_y[1] > 80 && seen_y[2] > 80);
    CHECK(flips > 150 && flips < 250);
    /* no draws at all without crop and flip */
    fr_augment plain = {.mean = {0}, .std = {0}};
    fr_data_rng r;
    fr_data_rng_seed(&r, 5);
    uint64_t s0 = r.s;
    CHECK_OK(fr_aug_apply(f, src, 1, 4, 4, &plain, &r));
    CHECK(r.s == s0 && f[15] == 16.0f / 255.0f);
}

/* ---- loader ---- */

/* N images (3, 4, 4) with pixels from a hash of (image, k); label = image. */
static fr_dataset *small_dataset(int n) {
    uint8_t *px = malloc((size_t)n * 48);
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    for (int i = 0; i < n; i++) {
        lab[i] = i;
        for (int k = 0; k < 48; k++)
            px[i * 48 + k] = (uint8_t)((i * 131 + k * 29 + (i * k) % 7) & 255);
    }
    fr_dataset *ds = fr_dataset_from_host("small", n, 3, 4, 4, px, lab, n);
    free(px);
    free(lab);
    return ds;
}

typedef struct {
    int n;
    float *x[16];
    int32_t *y[16];
    int64_t bs[16];
} batch_log;

static void log_free(batch_log *b) {
    for (int i = 0; i < b->n; i++) {
        free(b->x[i]);
        free(b->y[i]);
    }
}

/* Runs `epochs` epochs, recording every batch; checks the end markers. */
static void run_loader(const fr_dataset *ds, fr_loader_config cfg, int epochs, batch_log *log) {
    memset(log, 0, sizeof *log);
    fr_loader *l = fr_loader_new(ds, &cfg);
    CHECK_NOTNULL(l);
    if (!l)
        return;
    for (int e = 0; e < epochs; e++) {
        for (;;) {
            fr_tensor *x, *y;
            CHECK_OK(fr_loader_next(l, &x, &y));
            if (!x) {
                CHECK(y == NULL);
                break;
            }
            CHECK(log->n < 16 && x->ndim == 4 && x->shape[1] == 3 && y->shape[0] == x->shape[0]);
            CHECK(fr_device_of(x) == cfg.device && x->dtype == FR_F32 && y->dtype == FR_I32);
            fr_tensor *hx = fr_to_device(x, FR_CPU, FR_TAG_DATA), *hy = fr_to_device(y, FR_CPU, FR_TAG_DATA);
            if (log->n < 16 && hx && hy) {
                log->bs[log->n] = x->shape[0];
                log->x[log->n] = malloc(fr_nbytes(hx));
                log->y[log->n] = malloc(fr_nbytes(hy));
                memcpy(log->x[log->n], fr_data(hx), fr_nbytes(hx));
                memcpy(log->y[log->n], fr_data(hy), fr_nbytes(hy));
                log->n++;
            }
            fr_release(hx);
            fr_release(hy);
            fr_release(x);
            fr_release(y);
        }
        CHECK(fr_loader_epoch(l) == e + 1 && fr_loader_batch(l) == 0);
    }
    fr_loader_free(l);
}

static bool same_logs(const batch_log *a, const batch_log *b) {
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->bs[i] != b->bs[i] || memcmp(a->x[i], b->x[i], (size_t)a->bs[i] * 48 * sizeof(float)) ||
            memcmp(a->y[i], b->y[i], (size_t)a->bs[i] * sizeof(int32_t)))
            return false;
    return true;
}

static fr_loader_config aug_config(void) {
    fr_loader_config cfg = {.batch_size = 4, .shuffle = true, .seed = 42, .device = FR_CPU};
    cfg.aug = (fr_augment){.pad = 1, .flip = true, .mean = {0.5f, 0.4f, 0.3f}, .std = {0.2f, 0.25f, 0.3f}};
    return cfg;
}

static void test_loader_thread_same(void) {
    fr_dataset *ds = small_dataset(11);
    fr_loader_config cfg = aug_config();
    batch_log sync, threaded, other_seed;
    run_loader(ds, cfg, 2, &sync);
    cfg.prefetch = true;
    run_loader(ds, cfg, 2, &threaded);
    CHECK(sync.n == 6 && sync.bs[0] == 4 && sync.bs[2] == 3);
    CHECK(same_logs(&sync, &threaded));
    cfg.seed = 43;
    run_loader(ds, cfg, 2, &other_seed);
    CHECK(!same_logs(&sync, &other_seed));

    /* each epoch is a permutation of the dataset, and the two differ */
    int order[2][11], k = 0;
    for (int b = 0; b < sync.n; b++)
        for (int j = 0; j < sync.bs[b]; j++, k++)
            order[k / 11][k % 11] = sync.y[b][j];
    for (int e = 0; e < 2; e++) {
        int seen[11] = {0};
        for (int i = 0; i < 11; i++)
            seen[order[e][i]]++;
        for (int i = 0; i < 11; i++)
            CHECK(seen[i] == 1);
    }
    CHECK(memcmp(order[0], order[1], sizeof order[0]) != 0);
    log_free(&sync);
    log_free(&threaded);
    log_free(&other_seed);
    fr_dataset_free(ds);
}

static void test_loader_options(void) {
    fr_dataset *ds = small_dataset(10);
    /* no shuffle, no augmentation: dataset order, pixels / 255 */
    fr_loader_config cfg = {.batch_size = 4, .drop_last = true, .prefetch = true};
    batch_log log;
    run_loader(ds, cfg, 1, &log);
    CHECK(log.n == 2 && log.bs[0] == 4 && log.bs[1] == 4);
    CHECK(log.n == 2 && log.y[1][0] == 4 && log.y[1][3] == 7);
    CHECK(log.n == 2 && log.x[1][48 + 5] == (float)fr_dataset_image(ds, 5)[5] / 255.0f);
    log_free(&log);

    /* seek resumes exactly where a straight run would be */
    cfg = aug_config();
    batch_log full;
    run_loader(ds, cfg, 2, &full);  // batches of 4, 4, 2 per epoch
    for (int threaded = 0; threaded < 2; threaded++) {
        cfg.prefetch = threaded;
        fr_loader *l = fr_loader_new(ds, &cfg);
        fr_tensor *x, *y;
        CHECK_OK(fr_loader_next(l, &x, &y));  /* let the thread run ahead */
        fr_release(x);
        fr_release(y);
        CHECK_OK(fr_loader_seek(l, 1, 1));
        CHECK_OK(fr_loader_next(l, &x, &y));
        CHECK(x && full.n == 6 && !memcmp(fr_data(x), full.x[4], 4 * 48 * sizeof(float)));
        fr_release(x);
        fr_release(y);
        CHECK_ERR(fr_loader_seek(l, 0, 4), FR_ERR_ARG, "seek");
        fr_loader_free(l);
    }
    log_free(&full);

    /* early destruction never hangs: before any batch, and holding one */
    cfg.prefetch = true;
    for (int i = 0; i < 20; i++) {
        fr_loader *l = fr_loader_new(ds, &cfg);
        fr_tensor *x = NULL, *y = NULL;
        if (i % 2)
            CHECK_OK(fr_loader_next(l, &x, &y));
        fr_loader_free(l);
        fr_release(x);
        fr_release(y);
    }
    cfg.batch_size = 0;
    CHECK(fr_loader_new(ds, &cfg) == NULL);
    CHECK_ERR(fr_last_status(), FR_ERR_ARG, "batch_size");
    fr_dataset_free(ds);
}

static void test_loader_cuda(void) {
    if (!fr_t_have_cuda())
        SKIP("no CUDA device");
    fr_dataset *ds = small_dataset(9);
    fr_loader_config cfg = aug_config();
    batch_log cpu, gpu;
    run_loader(ds, cfg, 1, &cpu);
    cfg.device = FR_CUDA;
    cfg.prefetch = true;
    run_loader(ds, cfg, 1, &gpu);
    CHECK(cpu.n == 3 && same_logs(&cpu, &gpu));
    log_free(&cpu);
    log_free(&gpu);
    fr_dataset_free(ds);
}

/* ---- the real Fashion-MNIST test set ---- */

static void test_fashion_mnist(void) {
    const char *img = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    const char *lab = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    struct stat sb;
    if (stat(img, &sb) != 0 || stat(lab, &sb) != 0)
        SKIP("Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)");
    size_t before = fr_mem_current(FR_CPU, FR_TAG_DATA);
    fr_dataset *ds = fr_dataset_load_idx(img, lab);
    CHECK_NOTNULL(ds);
    if (!ds)
        return;
    CHECK(ds->n == 10000 && ds->c == 1 && ds->h == 28 && ds->w == 28 && ds->num_classes == 10);
    CHECK(fr_mem_current(FR_CPU, FR_TAG_DATA) - before == 10000 * 28 * 28 + 10000 * 4);
    int per_class[10] = {0};
    bool in_range = true;
    for (int64_t i = 0; i < ds->n; i++) {
        int32_t y = fr_dataset_label(ds, i);
        in_range &= y >= 0 && y < 10;
        if (y >= 0 && y < 10)
            per_class[y]++;
    }
    CHECK(in_range);
    for (int c = 0; c < 10; c++)
        CHECK(per_class[c] == 1000);  /* the test set is balanced */
    double mean = 0;
    const uint8_t *px = fr_data(ds->images);
    for (int64_t i = 0; i < 10000 * 784; i++)
        mean += px[i];
    mean /= 10000.0 * 784 * 255;
    CHECK_CLOSE(mean, 0.286, 0.01);
    fr_dataset_free(ds);
}

int main(void) {
    RUN(test_idx);
    RUN(test_idx_errors);
    RUN(test_cifar);
    RUN(test_image_folder);
    RUN(test_augment_exact);
    RUN(test_loader_thread_same);
    RUN(test_loader_options);
    RUN(test_loader_cuda);
    RUN(test_fashion_mnist);
    return TEST_SUMMARY();
}
