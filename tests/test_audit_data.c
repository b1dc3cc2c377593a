/* test_audit_data.c: the second outside audit's data findings (issue 25),
 * each as a case that failed before its fix:
 *
 *  - 16-bit PNGs (grey, RGB, RGBA, interlaced, with a gAMA chunk) decode to
 *    their stored samples scaled to 8 bits, round(v * 255 / 65535), with no
 *    gamma: the expected pixels are computed here from the samples the test
 *    wrote (PIL is not installed on this machine to compare with);
 *  - a folder's test split is labelled by the training split's class names:
 *    a subset of the classes keeps their labels, a class training lacks is
 *    an error naming it;
 *  - --limit-train / --limit-test on a folder take a stratified prefix;
 *  - a test split of another image size or with no images is refused; a
 *    data set with more classes than the model's outputs is refused naming
 *    both; validate --strategy abn on weights trained without it is
 *    refused. */
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"
#include "data/dataset.h"
#include "data/image.h"
#include "train/state.h"
#include "programs/cli_impl.h"


/* A PNG of w x h pixels of `bits` (8 or 16) samples, `spp` samples a pixel
 * (1 grey, 3 RGB, 4 RGBA), written by libpng's writer; gamma > 0 adds a
 * gAMA chunk. */
static bool write_png(const char *path, int w, int h, int bits, int spp, bool interlace, double gamma,
                      const uint16_t *samples) {
    FILE *f = fopen(path, "wb");
    png_structp png = f ? png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL) : NULL;
    png_infop info = png ? png_create_info_struct(png) : NULL;
    uint8_t *row = malloc((size_t)w * (size_t)spp * 2);
    bool ok = info && row;
    if (ok && setjmp(png_jmpbuf(png)))
        ok = false;
    else if (ok) {
        int type = spp == 1 ? PNG_COLOR_TYPE_GRAY : spp == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_RGBA;
        png_init_io(png, f);
        png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, bits, type,
                     interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                     PNG_FILTER_TYPE_DEFAULT);
        if (gamma > 0)
            png_set_gAMA(png, info, gamma);
        png_write_info(png, info);
        int passes = png_set_interlace_handling(png);
        for (int pass = 0; pass < passes; pass++)
            for (int y = 0; y < h; y++) {
                for (int i = 0; i < w * spp; i++) {
                    uint16_t v = samples[(size_t)y * (size_t)w * (size_t)spp + (size_t)i];
                    if (bits == 16) {
                        row[2 * i] = (uint8_t)(v >> 8); /* PNG stores big-endian */
                        row[2 * i + 1] = (uint8_t)v;
                    } else {
                        row[i] = (uint8_t)v;
                    }
                }
                png_write_row(png, row);
            }
        png_write_end(png, NULL);
    }
    if (png)
        png_destroy_write_struct(&png, info ? &info : NULL);
    free(row);
    if (f)
        fclose(f);
    return ok;
}

/* ---- 16-bit PNG ---- */

static void check_png16(const char *dir, int spp, bool interlace, double gamma) {
    enum { W = 13, H = 7 };
    uint16_t samples[W * H * 4];
    for (int i = 0; i < W * H * spp; i++) /* spread over the range, low bytes included */
        samples[i] = (uint16_t)((i * 40503u + 127u * (unsigned)(i % 7)) & 0xffff);
    samples[0] = 0;
    samples[1 % (W * H * spp)] = 65535;
    samples[2] = 128; /* 0.498: rounds to 0 */
    samples[3] = 129; /* 0.502: rounds to 1 */
    char path[700];
    snprintf(path, sizeof path, "%s/p%d%s.png", dir, spp, interlace ? "i" : "");
    CHECK(write_png(path, W, H, 16, spp, interlace, gamma, samples));
    uint8_t *buf;
    size_t len;
    CHECK_OK(fr_read_regular_file(path, 1 << 20, &buf, &len));
    int c = spp == 1 ? 1 : 3;
    uint8_t got[3 * W * H];
    CHECK_OK(fr_image_decode(buf, len, path, c, W, H, got));
    free(buf);
    int bad = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int ch = 0; ch < c; ch++) {
                uint32_t v = samples[((size_t)y * W + (size_t)x) * (size_t)spp + (size_t)ch];
                uint8_t want = (uint8_t)((v * 255 + 32767) / 65535);
                uint8_t have = got[(size_t)ch * W * H + (size_t)y * W + (size_t)x];
                if (have != want && bad++ < 3)
                    fprintf(stderr, "    %s: (%d, %d) channel %d: sample %u decoded to %d, want %d\n", path, x,
                            y, ch, v, have, want);
            }
    CHECK(bad == 0);
}

static void test_png16_no_gamma(void) {
    const char *dir = fr_t_make_tmpdir("png16");
    check_png16(dir, 1, false, 0);
    check_png16(dir, 3, false, 0);
    check_png16(dir, 4, false, 0);
    check_png16(dir, 3, true, 0);
    check_png16(dir, 1, true, 0);
    check_png16(dir, 3, false, 1 / 2.2); /* a gAMA chunk changes nothing either */
    fr_t_remove_tmpdir(dir);
}

/* ---- folders ---- */

/* DIR/<split>/<cls>/<i>.png for i < n, grey side x side, pixel value seed + i. */
static void write_class(const char *root, const char *split, const char *cls, int n, int side, int seed) {
    char path[900];
    snprintf(path, sizeof path, "%s/%s", root, split);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/%s/%s", root, split, cls);
    mkdir(path, 0700);
    uint16_t px[64 * 64];
    for (int i = 0; i < n; i++) {
        for (int p = 0; p < side * side; p++)
            px[p] = (uint16_t)((seed + i) & 255);
        snprintf(path, sizeof path, "%s/%s/%s/%02d.png", root, split, cls, i);
        CHECK(write_png(path, side, side, 8, 1, false, 0, px));
    }
}

static fr_dataset *open_split(const char *root, bool train, int64_t limit) {
    char spec_text[800];
    snprintf(spec_text, sizeof spec_text, "folder:%s", root);
    fr_data_spec spec;
    if (fr_data_spec_parse(spec_text, &spec) != FR_OK)
        return NULL;
    return fr_data_open(&spec, train, limit);
}

static void test_folder_labels_by_name(void) {
    const char *root = fr_t_make_tmpdir("fold25");
    write_class(root, "train", "cat", 2, 4, 10);
    write_class(root, "train", "dog", 2, 4, 20);
    write_class(root, "train", "eel", 2, 4, 30);
    /* the test split lacks "cat": dog and eel keep labels 1 and 2 */
    write_class(root, "test", "dog", 1, 4, 20);
    write_class(root, "test", "eel", 1, 4, 30);
    fr_dataset *ds = open_split(root, false, 0);
    CHECK_NOTNULL(ds);
    if (ds) {
        const int32_t *lab = fr_data(ds->labels);
        const uint8_t *px = fr_data(ds->images);
        CHECK(ds->n == 2 && ds->num_classes == 3);
        for (int i = 0; i < ds->n; i++) /* each image's pixel says its class: 20 dog, 30 eel */
            CHECK(lab[i] == (px[i * 16] == 20 ? 1 : 2));
        CHECK(!strcmp(ds->class_names[0], "cat") && !strcmp(ds->class_names[2], "eel"));
    }
    fr_dataset_free(ds);
    /* a class training lacks is named */
    write_class(root, "test", "fox", 1, 4, 40);
    ds = open_split(root, false, 0);
    CHECK(!ds);
    fr_dataset_free(ds);
    CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, "class \"fox\"");
    CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, "cat, dog, eel");
    fr_t_remove_tmpdir(root);
}

static void test_folder_limit_stratified(void) {
    const char *root = fr_t_make_tmpdir("strat25");
    write_class(root, "train", "a", 5, 4, 0);
    write_class(root, "train", "b", 5, 4, 50);
    write_class(root, "train", "c", 2, 4, 100);
    fr_dataset *ds = open_split(root, true, 7);
    CHECK_NOTNULL(ds);
    if (ds) {
        int count[3] = {0, 0, 0};
        const int32_t *lab = fr_data(ds->labels);
        const uint8_t *px = fr_data(ds->images);
        for (int i = 0; i < ds->n; i++) {
            count[lab[i]]++;
            /* the first images of each class: pixel = class seed + index < seed + 3 */
            CHECK(px[i * 16] - lab[i] * 50 < 3);
        }
        /* round robin: a0 b0 c0 a1 b1 c1 a2 */
        CHECK(ds->n == 7 && count[0] == 3 && count[1] == 2 && count[2] == 2);
    }
    fr_dataset_free(ds);
    fr_t_remove_tmpdir(root);
}

/* ---- the programs ---- */


static void test_programs_split_checks(void) {
    if (!fr_t_have_programs())
        SKIP("examples not built");
    const char *root = fr_t_make_tmpdir("split25");
    char args[1400], path[900];
    write_class(root, "train", "a", 4, 8, 0);
    write_class(root, "train", "b", 4, 8, 50);
    /* test images of another size */
    write_class(root, "test", "a", 2, 4, 0);
    snprintf(args, sizeof args, "--model resnet8 --data folder:%s --batch 4 --epochs 1 --threads 1", root);
    fr_t_example_fails("train", args, "4x4", "8x8");
    /* a test split with no images: class folders, no files */
    snprintf(path, sizeof path, "rm -rf %s/test && mkdir -p %s/test/a", root, root);
    CHECK(system(path) == 0);
    fr_t_example_fails("train", args, "holds no image files", NULL);
    snprintf(path, sizeof path, "rm -rf %s/test && mkdir -p %s/test", root, root);
    CHECK(system(path) == 0);
    fr_t_example_fails("train", args, "no class sub-folders", NULL);
    write_class(root, "test", "a", 2, 8, 0);
    write_class(root, "test", "b", 2, 8, 50);

    /* weights for 2 classes, trained plain */
    snprintf(path, sizeof path, "%s/w.safetensors", root);
    fr_model *m = fr_model_create("resnet8", 1, 2, 3);
    CHECK_OK(fr_state_save(path, m, NULL, NULL, NULL));
    fr_model_free(m);
    snprintf(args, sizeof args, "--checkpoint %s --data folder:%s --strategy abn --batch 2", path, root);
    fr_t_example_fails("validate", args, "--strategy abn: abn changes the network's function",
                "trained without it");
    /* a third class: more classes than the model's 2 outputs */
    write_class(root, "train", "c", 2, 8, 100);
    write_class(root, "test", "c", 2, 8, 100);
    snprintf(args, sizeof args, "--checkpoint %s --data folder:%s --batch 2", path, root);
    fr_t_example_fails("validate", args, "has 3 classes", "resnet8");
    fr_t_remove_tmpdir(root);
}

int main(void) {
    RUN(test_png16_no_gamma);
    RUN(test_folder_labels_by_name);
    RUN(test_folder_limit_stratified);
    RUN(test_programs_split_checks);
    return TEST_SUMMARY();
}
