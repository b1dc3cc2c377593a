/* gen_seeds.c: writes the committed seed corpora of the harnesses into
 * tests/fuzz/corpus/<harness>/ (run by `make fuzz-seeds`). Each seed is a
 * small valid file of its format, plus a few near-misses, so the fuzzer
 * starts from inputs that reach deep into each reader. */
#include <errno.h>
#include <png.h>
#include <sys/stat.h>
#include <zlib.h>

#include "fuzz_common.h"
#include "train/state.h"

#include "../stb_write.h"

static const char *root = "tests/fuzz/corpus";

static void mkdirs(const char *sub) {
    char p[256];
    snprintf(p, sizeof p, "%s", root);
    mkdir("tests/fuzz", 0755);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s", root, sub);
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        abort();
}

static void seed(const char *sub, const char *name, const void *b, size_t n) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s/%s", root, sub, name);
    fz_write(p, b, n);
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        abort();
    static uint8_t buf[1 << 20];
    *n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return buf;
}

static size_t gz(uint8_t *out, size_t cap, const uint8_t *in, size_t n) {
    z_stream z = {0};
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        abort();
    z.next_in = (uint8_t *)in;
    z.avail_in = (unsigned)n;
    z.next_out = out;
    z.avail_out = (unsigned)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END)
        abort();
    deflateEnd(&z);
    return z.total_out;
}

static size_t be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
    return 4;
}

static void idx_seeds(void) {
    mkdirs("idx");
    uint8_t img[16 + 3 * 4], lab[8 + 3], in[2 + sizeof img + sizeof lab];
    size_t i = be32(img, 0x803);
    i += be32(img + i, 3);
    i += be32(img + i, 2);
    i += be32(img + i, 2);
    for (int k = 0; k < 12; k++)
        img[i + k] = (uint8_t)(k * 20);
    be32(lab, 0x801);
    be32(lab + 4, 3);
    lab[8] = 0, lab[9] = 9, lab[10] = 4;
    /* plain */
    in[0] = sizeof img, in[1] = 0;
    memcpy(in + 2, img, sizeof img);
    memcpy(in + 2 + sizeof img, lab, sizeof lab);
    seed("idx", "plain", in, sizeof in);
    /* gzip, both files */
    uint8_t zi[256], zl[256], zin[600];
    size_t ni = gz(zi, sizeof zi, img, sizeof img), nl = gz(zl, sizeof zl, lab, sizeof lab);
    zin[0] = (uint8_t)ni, zin[1] = (uint8_t)(ni >> 8);
    memcpy(zin + 2, zi, ni);
    memcpy(zin + 2 + ni, zl, nl);
    seed("idx", "gzip", zin, 2 + ni + nl);
    /* a label of 255 */
    in[2 + sizeof img + 10] = 255;
    seed("idx", "label255", in, sizeof in);
}

static void cifar_seeds(void) {
    mkdirs("cifar");
    static uint8_t b[1 + 2 * 3074];
    b[0] = 0; /* CIFAR-10: two records of label + 3072 pixels */
    for (int r = 0; r < 2; r++) {
        b[1 + r * 3073] = (uint8_t)(r * 7);
        for (int k = 0; k < 3072; k++)
            b[2 + r * 3073 + k] = (uint8_t)(k + r);
    }
    seed("cifar", "cifar10", b, 1 + 2 * 3073);
    b[0] = 1; /* CIFAR-100: coarse, fine, pixels */
    for (int r = 0; r < 2; r++) {
        b[1 + r * 3074] = 3;
        b[2 + r * 3074] = (uint8_t)(r * 50 + 1);
        for (int k = 0; k < 3072; k++)
            b[3 + r * 3074 + k] = (uint8_t)(k * 3);
    }
    seed("cifar", "cifar100", b, 1 + 2 * 3074);
}

static void image_seeds(void) {
    mkdirs("image_folder");
    uint8_t px[3 * 8 * 6];
    for (size_t k = 0; k < sizeof px; k++)
        px[k] = (uint8_t)(k * 5);
    const char *tmp = "tests/fuzz/corpus/.tmp-image";
    struct {
        const char *name;
        int comp;
        int kind;
    } imgs[] = {{"rgb.png", 3, 0}, {"grey.png", 1, 0}, {"rgb.bmp", 3, 1}, {"grey.bmp", 1, 1},
                {"rgb.jpg", 3, 2}, {"grey.jpg", 1, 2}};
    for (size_t k = 0; k < sizeof imgs / sizeof *imgs; k++) {
        int ok = imgs[k].kind == 0   ? stbi_write_png(tmp, 8, 6, imgs[k].comp, px, 8 * imgs[k].comp)
                 : imgs[k].kind == 1 ? stbi_write_bmp(tmp, 8, 6, imgs[k].comp, px)
                                     : stbi_write_jpg(tmp, 8, 6, imgs[k].comp, px, 75);
        if (!ok)
            abort();
        size_t n;
        uint8_t *b = slurp(tmp, &n);
        seed("image_folder", imgs[k].name, b, n);
        /* regressions of the audit: a Huffman table of 510 symbols (stb
         * 2.27 writes past its 257-entry table) and a truncated BMP */
        for (size_t i = 2; imgs[k].kind == 2 && imgs[k].comp == 3 && i + 20 < n; i++)
            if (b[i] == 0xFF && b[i + 1] == 0xC4) {
                b[i + 19] = b[i + 20] = 255;
                seed("image_folder", "crafted-dht.jpg", b, n);
                break;
            }
        if (imgs[k].kind == 1 && imgs[k].comp == 3)
            seed("image_folder", "truncated.bmp", b, n - 30);
    }
    remove(tmp);
}

/* A 16-bit PNG (bits 16) of `type`, interlaced or not, through libpng's
 * writer (stb writes 8 bits only): the paths of issue 25's decoding fix. */
static void png_seed(const char *name, int type, int bits, bool interlace) {
    const char *tmp = "tests/fuzz/corpus/.tmp-png";
    FILE *f = fopen(tmp, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (!f || !info || setjmp(png_jmpbuf(png)))
        abort();
    png_init_io(png, f);
    png_set_IHDR(png, info, 9, 5, bits, type, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_color palette[4] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {0, 0, 255}};
    png_byte trans[2] = {0, 128};
    if (type == PNG_COLOR_TYPE_PALETTE) {
        png_set_PLTE(png, info, palette, 4);
        png_set_tRNS(png, info, trans, 2, NULL);
    }
    png_set_gAMA(png, info, 1 / 2.2);
    png_write_info(png, info);
    uint8_t row[9 * 8];
    for (size_t k = 0; k < sizeof row; k++)
        row[k] = (uint8_t)(type == PNG_COLOR_TYPE_PALETTE ? k % 4 : k * 37);
    int passes = png_set_interlace_handling(png);
    for (int p = 0; p < passes; p++)
        for (int y = 0; y < 5; y++)
            png_write_row(png, row);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
    size_t n;
    uint8_t *b = slurp(tmp, &n);
    seed("image_folder", name, b, n);
    remove(tmp);
}

static void png_seeds(void) {
    png_seed("rgb16.png", PNG_COLOR_TYPE_RGB, 16, false);
    png_seed("rgba16-interlaced.png", PNG_COLOR_TYPE_RGBA, 16, true);
    png_seed("grey-alpha16.png", PNG_COLOR_TYPE_GRAY_ALPHA, 16, false);
    png_seed("palette-trns-interlaced.png", PNG_COLOR_TYPE_PALETTE, 8, true);
}

static void st_seeds(void) {
    mkdirs("safetensors");
    mkdirs("state");
    const char *tmp = "tests/fuzz/corpus/.tmp.safetensors";
    fr_st_writer *w = fr_st_writer_new();
    float v[6] = {1, 2, 3, 4, 5, 6};
    int32_t c = 7;
    fr_tensor *a = fr_from_host(FR_CPU, FR_F32, 2, FR_SHAPE(2, 3), FR_TAG_WORKSPACE, v);
    fr_tensor *b = fr_from_host(FR_CPU, FR_I32, 0, FR_SHAPE(1), FR_TAG_WORKSPACE, &c);
    fr_tensor *h = fr_to_dtype(a, FR_F16, FR_TAG_WORKSPACE);
    if (fr_st_writer_add(w, "a", a) || fr_st_writer_add(w, "count", b) || fr_st_writer_add(w, "half", h) ||
        fr_st_writer_add_metadata(w, "note", "seed \"quoted\" \\u00e9") || fr_st_writer_save(w, tmp))
        abort();
    size_t n;
    uint8_t *bytes = slurp(tmp, &n);
    seed("safetensors", "three-tensors", bytes, n);
    fr_st_writer_free(w);
    fr_release(a);
    fr_release(b);
    fr_release(h);
    /* checkpoints of the harness's model: weights only, and a training one
     * with SGD state, a warm-up cosine schedule and bf16 scaler fields */
    fr_model *m = fz_tiny_model();
    fr_optim *opt = fr_sgd_new(m->params, (fr_sgd_options){.lr = 0.1, .momentum = 0.9});
    fr_train_state st = {.epoch = 1, .batch = 2, .step = 5, .seed = 3, .batch_size = 2, .accum = 1, .epochs = 3};
    snprintf(st.data, sizeof st.data, "mnist:/data");
    if (fr_schedule_cosine(&st.schedule, 0.1, 9, 0.0) || fr_schedule_warmup(&st.schedule, 2, 0.1) ||
        fr_state_save(tmp, m, NULL, NULL, NULL))
        abort();
    bytes = slurp(tmp, &n);
    seed("state", "weights", bytes, n);
    seed("safetensors", "weights", bytes, n);
    for (int i = 0; i < opt->n; i++)
        opt->state[0][i] = fr_zeros_like(m->params->items[i].tensor, FR_TAG_OPTIM), opt->steps[i] = 4;
    fr_loss_scaler sc;
    if (fr_loss_scaler_init(&sc, FR_F32) || fr_state_save(tmp, m, opt, &sc, &st))
        abort();
    bytes = slurp(tmp, &n);
    seed("state", "training", bytes, n);
    int64_t ms[2] = {3, 6};
    if (fr_schedule_step(&st.schedule, 0.1, ms, 2, 0.1) || fr_state_save(tmp, m, opt, NULL, &st))
        abort();
    bytes = slurp(tmp, &n);
    seed("state", "training-step-schedule", bytes, n);
    remove(tmp);
    fr_optim_free(opt);
    fr_model_free(m);
}

int main(void) {
    idx_seeds();
    cifar_seeds();
    image_seeds();
    png_seeds();
    st_seeds();
    printf("seeds written under %s\n", root);
    return 0;
}
