/* test_image_formats.c: the image readers behind data/image.c, pixel for
 * pixel from files built here in memory.
 *
 *  - BMP (frugal's own reader): palettes of 1, 4 and 8 bits in the core and
 *    info headers, 16-bit 5-5-5 and 5-6-5, 32-bit masks inside a V5 header,
 *    top-down rows and row padding; RLE, a palette index past the palette, a
 *    cut pixel array and a broken mask are errors naming the file;
 *  - PNG (libpng): alpha is dropped, never blended; grey+alpha is grey;
 *  - the one channel conversion: colour to grey is BT.601 luma in 8-bit
 *    fixed point, grey to colour copies, for every format alike;
 *  - JPEG (libjpeg-turbo): entropy data cut short but closed with an
 *    end-of-image marker passes the marker walk, and libjpeg's warning
 *    ("premature end") is an error, not a picture padded with grey. */
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "data/image.h"

#include <turbojpeg.h>

#include "stb_write.h"

static void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, v), put16(p + 2, v >> 16); }

typedef struct {
    uint32_t hsize, bpp, compression;
    int w, h;
    bool top_down;
    uint32_t colors;       /* palette entries written (bpp <= 8) */
    uint32_t masks[3];     /* written when compression is BI_BITFIELDS (3) */
} bmp_spec;

/* A palette colour and a pixel value, both from the pixel's place. */
static void palette_colour(uint32_t i, uint8_t rgb[3]) {
    rgb[0] = (uint8_t)(i * 37 + 5), rgb[1] = (uint8_t)(i * 91 + 11), rgb[2] = (uint8_t)(255 - i * 13);
}
static uint32_t pixel_value(const bmp_spec *s, int x, int y) {
    if (s->bpp <= 8)
        return (uint32_t)(x + 2 * y) % s->colors;
    return (uint32_t)(x * 2654435761u ^ (uint32_t)y * 40503u) & (s->bpp == 16 ? 0xFFFFu : 0xFFFFFFFFu);
}

/* The file for spec s into out (big enough); returns its length. */
static size_t make_bmp(uint8_t *out, const bmp_spec *s) {
    const bool core = s->hsize == 12, after_masks = s->compression == 3 && s->hsize == 40;
    const size_t entry = core ? 3 : 4;
    const size_t palette = s->bpp <= 8 ? s->colors * entry : 0;
    const size_t offset = 14 + s->hsize + (after_masks ? 12 : 0) + palette;
    const size_t row = ((size_t)s->w * s->bpp + 31) / 32 * 4;
    memset(out, 0, offset + row * (size_t)s->h);
    out[0] = 'B', out[1] = 'M';
    put32(out + 2, (uint32_t)(offset + row * (size_t)s->h));
    put32(out + 10, (uint32_t)offset);
    put32(out + 14, s->hsize);
    if (core) {
        put16(out + 18, (uint32_t)s->w), put16(out + 20, (uint32_t)s->h);
        put16(out + 22, 1), put16(out + 24, s->bpp);
    } else {
        put32(out + 18, (uint32_t)s->w), put32(out + 22, (uint32_t)(s->top_down ? -s->h : s->h));
        put16(out + 26, 1), put16(out + 28, s->bpp), put32(out + 30, s->compression);
        put32(out + 46, s->bpp <= 8 ? s->colors : 0);
        if (s->compression == 3)
            for (int c = 0; c < 3; c++)
                put32(out + 54 + 4 * c, s->masks[c]);
    }
    uint8_t *pal = out + offset - palette;
    for (uint32_t i = 0; s->bpp <= 8 && i < s->colors; i++) {
        uint8_t rgb[3];
        palette_colour(i, rgb);
        pal[i * entry] = rgb[2], pal[i * entry + 1] = rgb[1], pal[i * entry + 2] = rgb[0];
    }
    for (int y = 0; y < s->h; y++) {
        uint8_t *r = out + offset + (size_t)(s->top_down ? y : s->h - 1 - y) * row;
        for (int x = 0; x < s->w; x++) {
            uint32_t v = pixel_value(s, x, y);
            if (s->bpp <= 8)
                r[(size_t)x * s->bpp / 8] |= (uint8_t)(v << (8 - s->bpp - (size_t)x * s->bpp % 8));
            else if (s->bpp == 16)
                put16(r + 2 * x, v);
            else if (s->bpp == 24)
                r[3 * x] = (uint8_t)v, r[3 * x + 1] = (uint8_t)(v >> 8), r[3 * x + 2] = (uint8_t)(v >> 16);
            else
                put32(r + 4 * x, v);
        }
    }
    return offset + row * (size_t)s->h;
}

/* What channel c of pixel (x, y) must decode to. */
static uint8_t expected(const bmp_spec *s, int x, int y, int c) {
    uint32_t v = pixel_value(s, x, y);
    if (s->bpp <= 8) {
        uint8_t rgb[3];
        palette_colour(v, rgb);
        return rgb[c];
    }
    if (s->bpp == 24)
        return (uint8_t)(v >> (16 - 8 * c));
    uint32_t mask = s->compression == 3 ? s->masks[c]
                    : s->bpp == 16      ? (uint32_t[]){0x7C00, 0x03E0, 0x001F}[c]
                                        : (uint32_t[]){0xFF0000, 0xFF00, 0xFF}[c];
    unsigned shift = (unsigned)__builtin_ctz(mask);
    uint64_t max = mask >> shift, got = (v & mask) >> shift;
    return (uint8_t)((got * 255 + max / 2) / max);
}

static void check_bmp_decodes(const bmp_spec *s, const char *what) {
    static uint8_t file[1 << 16];
    size_t n = make_bmp(file, s);
    int w, h, c;
    CHECK_OK(fr_image_info(file, n, what, &w, &h, &c));
    CHECK(w == s->w && h == s->h && c == 3);
    uint8_t px[3 * 64 * 64];
    CHECK_OK(fr_image_decode(file, n, what, 3, s->w, s->h, px));
    int wrong = 0;
    const int plane = s->w * s->h;
    for (int ch = 0; ch < 3; ch++)
        for (int y = 0; y < s->h; y++)
            for (int x = 0; x < s->w; x++)
                wrong += px[ch * plane + y * s->w + x] != expected(s, x, y, ch);
    if (wrong)
        fprintf(stderr, "    %s: %d of %d values differ\n", what, wrong, 3 * plane);
    CHECK(wrong == 0);
}

static void test_bmp_layouts(void) {
    check_bmp_decodes(&(bmp_spec){40, 8, 0, 5, 3, false, 200, {0}}, "8-bit palette, padded rows");
    check_bmp_decodes(&(bmp_spec){40, 4, 0, 3, 4, true, 16, {0}}, "4-bit palette, top-down");
    check_bmp_decodes(&(bmp_spec){12, 1, 0, 9, 2, false, 2, {0}}, "1-bit palette, core header");
    check_bmp_decodes(&(bmp_spec){12, 8, 0, 4, 4, false, 256, {0}}, "8-bit palette, core header");
    check_bmp_decodes(&(bmp_spec){40, 24, 0, 7, 3, false, 0, {0}}, "24-bit");
    check_bmp_decodes(&(bmp_spec){40, 16, 0, 3, 5, false, 0, {0}}, "16-bit 5-5-5");
    check_bmp_decodes(&(bmp_spec){40, 16, 3, 6, 2, false, 0, {0xF800, 0x07E0, 0x001F}}, "16-bit 5-6-5 masks");
    check_bmp_decodes(&(bmp_spec){124, 32, 3, 4, 3, true, 0, {0xFF, 0xFF00, 0xFF0000}}, "32-bit V5, BGR masks");
    check_bmp_decodes(&(bmp_spec){108, 32, 0, 2, 2, false, 0, {0}}, "32-bit V4, BI_RGB");
}

static void test_bmp_refusals(void) {
    static uint8_t file[1 << 16];
    uint8_t px[3 * 64];
    int w, h, c;
    bmp_spec rle = {40, 8, 1, 4, 4, false, 4, {0}};
    size_t n = make_bmp(file, &rle);
    CHECK_ERR(fr_image_info(file, n, "rle.bmp", &w, &h, &c), FR_ERR_FORMAT, "RLE compression");
    CHECK_ERR(fr_last_status(), FR_ERR_FORMAT, "rle.bmp");

    bmp_spec pal = {40, 4, 0, 4, 2, false, 3, {0}};
    n = make_bmp(file, &pal);
    /* pixel (3, 0): the low nibble of the second byte of the last row (rows
     * of 4 bytes, bottom-up) becomes colour 3 of a palette of 3 */
    const uint32_t at = (uint32_t)file[10] | (uint32_t)file[11] << 8;
    file[at + 4 + 1] = (uint8_t)((file[at + 4 + 1] & 0xF0) | 3);
    CHECK_OK(fr_image_info(file, n, "palette.bmp", &w, &h, &c));
    CHECK_ERR(fr_image_decode(file, n, "palette.bmp", 3, 4, 2, px), FR_ERR_FORMAT,
              "palette.bmp: corrupt BMP: pixel (3, 0) uses colour 3 of a palette of 3");

    bmp_spec cut = {40, 24, 0, 4, 4, false, 0, {0}};
    n = make_bmp(file, &cut);
    CHECK_ERR(fr_image_info(file, n - 1, "cut.bmp", &w, &h, &c), FR_ERR_FORMAT, "truncated BMP");

    bmp_spec mask = {40, 32, 3, 2, 2, false, 0, {0xF0F0, 0xFF0000, 0xFF}};
    n = make_bmp(file, &mask);
    CHECK_ERR(fr_image_info(file, n, "mask.bmp", &w, &h, &c), FR_ERR_FORMAT, "channel mask 0xf0f0");

    bmp_spec odd = {64, 24, 0, 2, 2, false, 0, {0}};
    n = make_bmp(file, &odd);
    CHECK_ERR(fr_image_info(file, n, "odd.bmp", &w, &h, &c), FR_ERR_FORMAT, "a header of 64 bytes");
}

static uint8_t *png_of(const uint8_t *px, int w, int h, int comp, size_t *n) {
    int len = 0;
    uint8_t *b = stbi_write_png_to_mem(px, w * comp, w, h, comp, &len);
    *n = (size_t)len;
    return b;
}

static void test_png_alpha_and_conversion(void) {
    enum { W = 5, H = 3 };
    uint8_t src[W * H * 4], out[3 * W * H];
    for (int i = 0; i < W * H * 4; i++)
        src[i] = (uint8_t)(i * 53 + 17);
    const int plane = W * H;
    for (int comp = 1; comp <= 4; comp++) {
        size_t n;
        uint8_t *b = png_of(src, W, H, comp, &n);
        CHECK_NOTNULL(b);
        if (!b)
            continue;
        int w, h, c;
        const int colour = comp >= 3 ? 3 : 1;
        CHECK_OK(fr_image_info(b, n, "a.png", &w, &h, &c));
        CHECK(w == W && h == H && c == colour);
        /* in the file's own channels: every value as written, alpha dropped */
        CHECK_OK(fr_image_decode(b, n, "a.png", colour, W, H, out));
        bool exact = true;
        for (int p = 0; p < plane; p++)
            for (int ch = 0; ch < colour; ch++)
                exact &= out[ch * plane + p] == src[p * comp + ch];
        CHECK(exact);
        /* converted: luma of colour, or grey copied into three planes */
        const int other = colour == 3 ? 1 : 3;
        CHECK_OK(fr_image_decode(b, n, "a.png", other, W, H, out));
        exact = true;
        for (int p = 0; p < plane; p++) {
            const uint8_t *s = src + p * comp;
            if (other == 1)
                exact &= out[p] == (uint8_t)((77u * s[0] + 150u * s[1] + 29u * s[2]) >> 8);
            else
                for (int ch = 0; ch < 3; ch++)
                    exact &= out[ch * plane + p] == s[0];
        }
        CHECK(exact);
        free(b);
    }
}

static uint8_t *read_seed(const char *path, size_t *n) {
    uint8_t *b;
    return fr_read_regular_file(path, 1 << 20, &b, n) == FR_OK ? b : NULL;
}

static void test_jpeg_channels_and_cut_entropy_data(void) {
    size_t n;
    int w, h, c;
    uint8_t px[3 * 8 * 6];
    /* a one-component (grey) JPEG, encoded here: the seeds written by
     * stb_image_write are all three-component */
    uint8_t grey_px[8 * 6];
    for (int i = 0; i < 48; i++)
        grey_px[i] = (uint8_t)(i * 5);
    tjhandle tj = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long jpeg_len = 0;
    CHECK(tj && tjCompress2(tj, grey_px, 8, 0, 6, TJPF_GRAY, &jpeg, &jpeg_len, TJSAMP_GRAY, 95, 0) == 0);
    if (jpeg) {
        CHECK_OK(fr_image_info(jpeg, jpeg_len, "grey.jpg", &w, &h, &c));
        CHECK(w == 8 && h == 6 && c == 1);
        CHECK_OK(fr_image_decode(jpeg, jpeg_len, "grey.jpg", 3, 8, 6, px));
        CHECK(!memcmp(px, px + 48, 48) && !memcmp(px, px + 96, 48)); /* grey copied into R, G, B */
        int far = 0; /* lossy, but close to what was encoded */
        for (int i = 0; i < 48; i++)
            far += abs(px[i] - grey_px[i]) > 8;
        CHECK(far == 0);
    }
    tjFree(jpeg);
    if (tj)
        tjDestroy(tj);
    const char *rgb = "tests/fuzz/corpus/image_folder/rgb.jpg";
    uint8_t *b;
    b = read_seed(rgb, &n);
    CHECK_NOTNULL(b);
    if (b) {
        CHECK_OK(fr_image_info(b, n, rgb, &w, &h, &c));
        CHECK(w == 8 && h == 6 && c == 3);
        CHECK_OK(fr_image_decode(b, n, rgb, 3, 8, 6, px));
        /* the entropy data after the start of scan, cut to a third and closed
         * with FF D9: structurally whole, its data short */
        size_t sos = 0;
        for (size_t i = 2; i + 1 < n && !sos; i++)
            if (b[i] == 0xFF && b[i + 1] == 0xDA)
                sos = i;
        CHECK(sos > 0);
        if (sos) {
            size_t data = sos + 2 + ((size_t)b[sos + 2] << 8 | b[sos + 3]);
            size_t keep = data + (n - 2 - data) / 3;
            CHECK(keep + 2 < n);
            b[keep] = 0xFF, b[keep + 1] = 0xD9;
            if (b[keep - 1] == 0xFF)
                b[keep - 1] = 0x00;
            CHECK_OK(fr_image_info(b, keep + 2, "cut.jpg", &w, &h, &c));
            CHECK_ERR(fr_image_decode(b, keep + 2, "cut.jpg", 3, 8, 6, px), FR_ERR_FORMAT, "cut.jpg");
        }
    }
    free(b);
}

int main(void) {
    RUN(test_bmp_layouts);
    RUN(test_bmp_refusals);
    RUN(test_png_alpha_and_conversion);
    RUN(test_jpeg_channels_and_cut_entropy_data);
    return TEST_SUMMARY();
}
