/* test_data_bad.c: bad data files the audit of issue 13 found accepted or
 * mishandled, each an error naming the file now.
 *
 *  - IDX: a label outside the dataset's class count (255 in the MNIST
 *    layout) names the file and the record; an explicit count accepts it;
 *  - image folders: a crafted JPEG whose Huffman table declares more than
 *    256 symbols (an out-of-bounds write in the stb_image 2.27 frugal used
 *    to decode with), the fuzzer's regression seeds, truncated JPEG / BMP /
 *    PNG files; a grey first file no longer decides the channels of the split,
 *    and an explicit count converts every file;
 *  - missing data folders say that the folder is missing. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "testlib.h"
#include "data/dataset.h"
#include "data/image.h"
#include "programs/cli_impl.h"

#include "stb_write.h"

static char dir[600];

static const char *at(char *buf, const char *name) {
    snprintf(buf, 700, "%s/%s", dir, name);
    return buf;
}

static bool write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(b, 1, n, f) == n;
    if (f)
        fclose(f);
    return ok;
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    uint8_t *b;
    return fr_read_regular_file(path, 1 << 24, &b, n) == FR_OK ? b : NULL;
}

/* The loader returns NULL with an error holding both needles. */
#define CHECK_LOAD_FAILS(expr, code, n1, n2)                   \
    do {                                                       \
        fr_dataset *d_ = (expr);                               \
        CHECK(d_ == NULL);                                     \
        fr_dataset_free(d_);                                   \
        CHECK_ERR(fr_last_status(), code, n1);                 \
        CHECK_ERR(fr_last_status(), code, n2);                 \
    } while (0)

static void put_be32(FILE *f, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8)
        fputc((int)(v >> s) & 255, f);
}

static void test_idx_label_out_of_range(void) {
    char ip[700], lp[700];
    FILE *f = fopen(at(ip, "img"), "wb");
    put_be32(f, 0x803);
    put_be32(f, 4);
    put_be32(f, 2);
    put_be32(f, 2);
    for (int i = 0; i < 16; i++)
        fputc(i, f);
    fclose(f);
    f = fopen(at(lp, "lab"), "wb");
    put_be32(f, 0x801);
    put_be32(f, 4);
    const uint8_t labels[4] = {1, 9, 255, 3};
    fwrite(labels, 1, 4, f);
    fclose(f);
    CHECK_LOAD_FAILS(fr_dataset_load_idx(ip, lp), FR_ERR_FORMAT, lp, "record 2: label 255 is outside [0, 10)");
    CHECK_LOAD_FAILS(fr_dataset_load_idx_classes(ip, lp, 9), FR_ERR_FORMAT, lp, "record 1: label 9");
    fr_dataset *ds = fr_dataset_load_idx_classes(ip, lp, 256);
    CHECK(ds && ds->num_classes == 256 && fr_dataset_label(ds, 2) == 255);
    fr_dataset_free(ds);
    CHECK_LOAD_FAILS(fr_dataset_load_idx_classes(ip, lp, 0), FR_ERR_ARG, "num_classes", "0");
}

/* A w x h image of `comp` channels. JPEGs are the committed 8 x 6 seeds of
 * fuzz_image_folder: stb_image_write's JPEG encoder shifts a negative int
 * (UBSan stops the sanitizer build there). */
static void write_image(const char *path, int w, int h, int comp, const char *kind) {
    if (!strcmp(kind, "jpg")) {
        size_t n;
        uint8_t *b = read_bytes(comp == 1 ? "tests/fuzz/corpus/image_folder/grey.jpg"
                                          : "tests/fuzz/corpus/image_folder/rgb.jpg", &n);
        CHECK(b && w == 8 && h == 6 && write_bytes(path, b, n));
        free(b);
        return;
    }
    uint8_t px[4 * 32 * 32];
    for (int i = 0; i < w * h * comp; i++)
        px[i] = (uint8_t)(i * 29 + 7);
    int ok = !strcmp(kind, "png") ? stbi_write_png(path, w, h, comp, px, w * comp)
                                  : stbi_write_bmp(path, w, h, comp, px);
    CHECK(ok);
}

static void test_corrupt_images_are_errors(void) {
    char p[700], q[700];
    /* the crafted JPEG: a valid one whose first Huffman table claims
     * 2 x 255 symbols */
    write_image(at(p, "good.jpg"), 8, 6, 3, "jpg");
    size_t n;
    uint8_t *b = read_bytes(p, &n);
    CHECK_NOTNULL(b);
    int w, h, c;
    CHECK_OK(fr_image_info(b, n, p, &w, &h, &c));
    CHECK(w == 8 && h == 6 && c == 3);
    size_t dht = 0;
    for (size_t i = 2; b && i + 1 < n && !dht; i++)
        if (b[i] == 0xFF && b[i + 1] == 0xC4)
            dht = i;
    CHECK(dht > 0);
    if (b && dht) {
        b[dht + 4 + 15] = 255;
        b[dht + 4 + 16] = 255;
        CHECK(write_bytes(at(q, "crafted.jpg"), b, n));
        uint8_t px[3 * 8 * 6];
        CHECK_ERR(fr_image_decode(b, n, q, 3, 8, 6, px), FR_ERR_FORMAT, "Bogus Huffman table");
        CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, q);
    }
    free(b);
    /* found by fuzz_image_folder: FF bytes before the start-of-image marker
     * (stb skipped them, and they once hid the tables from its checks);
     * libjpeg wants FF D8 first, so the file is no JPEG at all */
    const char *regress = "tests/fuzz/corpus/image_folder/regress-leading-ff-dht.jpg";
    b = read_bytes(regress, &n);
    CHECK_NOTNULL(b);
    if (b)
        CHECK_ERR(fr_image_info(b, n, regress, &w, &h, &c), FR_ERR_FORMAT, "is not a PNG, JPEG or BMP");
    free(b);
    /* found by fuzz_image_folder (a timeout): a PNG chunk declaring ~1 GiB,
     * which stb 2.27 allocates before reading; and a tiny file claiming a
     * huge image */
    regress = "tests/fuzz/corpus/image_folder/regress-huge-idat-chunk.png";
    b = read_bytes(regress, &n);
    CHECK_NOTNULL(b);
    if (b)
        CHECK_ERR(fr_image_info(b, n, regress, &w, &h, &c), FR_ERR_FORMAT, "runs past the end");
    free(b);
    /* found by fuzz_image_folder in CI: entropy data on which stb 2.27's
     * STBI_ASSERT aborted the process. libjpeg-turbo decodes it without a
     * warning (a legal, odd stream); the grey decode must then be the luma
     * of the colour one, as the conversion is frugal's own */
    regress = "tests/fuzz/corpus/image_folder/regress-huffman-assert.jpg";
    b = read_bytes(regress, &n);
    CHECK_NOTNULL(b);
    if (b) {
        CHECK_OK(fr_image_info(b, n, regress, &w, &h, &c));
        const size_t plane = (size_t)w * (size_t)h;
        uint8_t *rgb = malloc(plane * 3), *grey = malloc(plane);
        CHECK(rgb && grey);
        if (rgb && grey) {
            CHECK_OK(fr_image_decode(b, n, regress, 3, w, h, rgb));
            CHECK_OK(fr_image_decode(b, n, regress, 1, w, h, grey));
            bool luma = true;
            for (size_t p = 0; p < plane; p++)
                luma &= grey[p] == (uint8_t)((77u * rgb[p] + 150u * rgb[plane + p] + 29u * rgb[2 * plane + p]) >> 8);
            CHECK(luma);
        }
        free(rgb);
        free(grey);
    }
    free(b);
    write_image(at(p, "small.png"), 4, 4, 1, "png");
    b = read_bytes(p, &n);
    if (b && n > 24) {
        b[16] = 0, b[17] = 0, b[18] = 0x40, b[19] = 0; /* width 16384 */
        b[20] = 0, b[21] = 0, b[22] = 0x40, b[23] = 0;
        uint32_t crc = (uint32_t)crc32(0, b + 12, 17); /* IHDR's type and data, so libpng reads on */
        b[29] = (uint8_t)(crc >> 24), b[30] = (uint8_t)(crc >> 16), b[31] = (uint8_t)(crc >> 8), b[32] = (uint8_t)crc;
        CHECK_ERR(fr_image_info(b, n, p, &w, &h, &c), FR_ERR_FORMAT, "claims 16384x16384 pixels");
    }
    free(b);
    /* truncated files of each format: the first half of a good one */
    const char *kinds[3] = {"jpg", "bmp", "png"};
    const char *needles[3] = {"truncated JPEG", "truncated BMP", "truncated PNG"};
    for (int k = 0; k < 3; k++) {
        char name[32];
        snprintf(name, sizeof name, "good.%s", kinds[k]);
        int side_w = k == 0 ? 8 : 16, side_h = k == 0 ? 6 : 16;
        write_image(at(p, name), side_w, side_h, 3, kinds[k]);
        b = read_bytes(p, &n);
        snprintf(name, sizeof name, "cut.%s", kinds[k]);
        at(q, name);
        CHECK(b && n > 60);
        if (!b)
            continue;
        uint8_t px[3 * 16 * 16];
        /* a cut past the headers: stb_image 2.27 alone decodes the BMP anyway */
        size_t cut = k == 2 ? n - 20 : n * 2 / 3;
        fr_status st = fr_image_info(b, cut, q, &w, &h, &c);
        if (st == FR_OK)
            st = fr_image_decode(b, cut, q, 3, side_w, side_h, px);
        CHECK(st == FR_ERR_FORMAT && strstr(fr_last_error(), q));
        CHECK(strstr(fr_last_error(), needles[k]) != NULL);
        free(b);
    }
}

static void test_folder_channels_and_names(void) {
    char p[700], root[700];
    at(root, "set");
    mkdir(root, 0700);
    mkdir(at(p, "set/a"), 0700);
    mkdir(at(p, "set/b"), 0700);
    /* the first file in sorted order is grey, a later one colour */
    write_image(at(p, "set/a/0.png"), 4, 3, 1, "png");
    write_image(at(p, "set/a/1.png"), 4, 3, 3, "png");
    write_image(at(p, "set/b/0.bmp"), 4, 3, 3, "bmp");
    fr_dataset *ds = fr_dataset_load_folder(root, 0);
    CHECK_NOTNULL(ds);
    CHECK(ds && ds->c == 3 && ds->n == 3);
    if (ds) {
        /* the grey file is replicated into the three planes */
        const uint8_t *im = fr_dataset_image(ds, 0);
        CHECK(im[0] == im[12] && im[0] == im[24] && im[5] == im[17]);
    }
    fr_dataset_free(ds);
    ds = fr_dataset_load_folder(root, 1);
    CHECK(ds && ds->c == 1);
    fr_dataset_free(ds);
    /* through the --data spec: channels=1, and the test split follows */
    fr_data_spec spec;
    char text[800];
    snprintf(text, sizeof text, "folder:%s,channels=1", dir);
    CHECK_OK(fr_data_spec_parse(text, &spec));
    CHECK(spec.kind == FR_DATA_FOLDER && spec.channels == 1 && !strcmp(spec.dir, dir));
    snprintf(text, sizeof text, "cifar10:%s,channels=1", dir);
    CHECK_ERR(fr_data_spec_parse(text, &spec), FR_ERR_ARG, "channels=");
    snprintf(text, sizeof text, "mnist:%s,classes=26", dir);
    CHECK_OK(fr_data_spec_parse(text, &spec));
    CHECK(spec.kind == FR_DATA_MNIST && spec.num_classes == 26 && !strcmp(spec.dir, dir));
    /* a suffix given twice: refused (its leftmost value had won silently) */
    snprintf(text, sizeof text, "mnist:%s,classes=12,classes=10", dir);
    CHECK_ERR(fr_data_spec_parse(text, &spec), FR_ERR_ARG, "classes= is given twice");
    snprintf(text, sizeof text, "folder:%s,channels=1,channels=3", dir);
    CHECK_ERR(fr_data_spec_parse(text, &spec), FR_ERR_ARG, "channels= is given twice");
    /* a truncated file among good ones: named */
    size_t n;
    uint8_t *b = read_bytes(at(p, "set/b/0.bmp"), &n);
    CHECK(b && write_bytes(at(p, "set/b/1.bmp"), b, n - 9));
    free(b);
    CHECK_LOAD_FAILS(fr_dataset_load_folder(root, 0), FR_ERR_FORMAT, p, "truncated BMP");
    remove(p);
    /* a FIFO among the files is skipped, never opened */
    CHECK(mkfifo(at(p, "set/b/2.png"), 0600) == 0);
    alarm(60);
    ds = fr_dataset_load_folder(root, 0);
    alarm(0);
    CHECK(ds && ds->n == 3);
    fr_dataset_free(ds);
    remove(p);
}

static void test_missing_folders(void) {
    char p[700];
    at(p, "nowhere");
    CHECK_LOAD_FAILS(fr_dataset_load_folder(p, 0), FR_ERR_IO, p, "is missing");
    CHECK_LOAD_FAILS(fr_dataset_load_cifar10(p, true), FR_ERR_IO, p, "is missing");
    CHECK_LOAD_FAILS(fr_dataset_load_cifar100(p, false), FR_ERR_IO, p, "is missing");
    fr_data_spec spec;
    char text[800];
    snprintf(text, sizeof text, "fashion-mnist:%s", p);
    CHECK_OK(fr_data_spec_parse(text, &spec));
    CHECK_LOAD_FAILS(fr_data_open(&spec, true, 0), FR_ERR_IO, p, "is missing");
    snprintf(text, sizeof text, "folder:%s", p);
    CHECK_OK(fr_data_spec_parse(text, &spec));
    CHECK_LOAD_FAILS(fr_data_open(&spec, true, 0), FR_ERR_IO, p, "is missing");
    /* a file where the folder should be */
    CHECK(write_bytes(p, "x", 1));
    CHECK_LOAD_FAILS(fr_dataset_load_cifar10(p, true), FR_ERR_IO, p, "not a folder");
    remove(p);
}

/* A data folder this user may not search: its files are there, and the
 * error says why they cannot be seen, not that they are missing. As root
 * (who searches any folder) the look-up runs in a child as nobody. */
static void test_unsearchable_folder(void) {
    char p[700], q[760];
    at(p, "locked");
    CHECK(mkdir(p, 0755) == 0 || errno == EEXIST);
    snprintf(q, sizeof q, "%s/train-images-idx3-ubyte", p);
    CHECK(write_bytes(q, "x", 1));
    CHECK(chmod(dir, 0755) == 0 && chmod(p, 0) == 0);
    pid_t child = fork();
    if (child == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(2);
        fr_data_spec spec;
        char text[800];
        snprintf(text, sizeof text, "mnist:%s", p);
        if (fr_data_spec_parse(text, &spec) != FR_OK)
            _exit(3);
        fr_dataset *ds = fr_data_open(&spec, true, 0);
        bool named = !ds && strstr(fr_last_error(), "cannot look for") &&
                     strstr(fr_last_error(), strerror(EACCES));
        if (!named)
            fprintf(stderr, "    got: %s\n", ds ? "a dataset" : fr_last_error());
        _exit(named ? 0 : 1);
    }
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(chmod(p, 0755) == 0 && chmod(dir, 0700) == 0);
    remove(q);
    rmdir(p);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", fr_t_make_tmpdir("databad"));
    RUN(test_idx_label_out_of_range);
    RUN(test_corrupt_images_are_errors);
    RUN(test_folder_channels_and_names);
    RUN(test_missing_folders);
    RUN(test_unsearchable_folder);
    fr_t_remove_tmpdir(dir);
    return TEST_SUMMARY();
}
