/* image_png.c: PNG files through libpng's read API; see image_codecs.h.
 * libpng checks the chunk CRCs, the zlib stream and the amount of image
 * data itself; a short image is an error, not a picture padded with zeros.
 *
 * Not the simplified API (png_image_*): it treats 16-bit samples as linear
 * light and gamma-encodes them to sRGB on the way to 8 bits, so a 16-bit
 * file decoded to other pixels than its 8-bit twin (issue 25). Here the
 * samples are taken as stored, as PIL and torchvision take them: 16-bit
 * scaled to 8 by round(v * 255 / 65535) (png_set_scale_16), palettes
 * expanded, grey below 8 bits widened, alpha and tRNS dropped, never
 * composited, and no gamma transform whatever the file's gAMA, sRGB or
 * iCCP chunks say. Interlaced files are read in all their passes
 * (png_set_interlace_handling). */
#include "image_codecs.h"

#include <limits.h>
#include <png.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

typedef struct {
    const uint8_t *buf;
    size_t len, at;
    const char *name;
    char why[256]; /* libpng's message of the error that ended the read */
} source;

static void read_mem(png_structp png, png_bytep out, size_t n) {
    source *s = png_get_io_ptr(png);
    if (n > s->len - s->at)
        png_error(png, "the file ends inside the image");
    memcpy(out, s->buf + s->at, n);
    s->at += n;
}

static void on_error(png_structp png, png_const_charp msg) {
    source *s = png_get_error_ptr(png);
    snprintf(s->why, sizeof s->why, "%s", msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* benign chunk complaints: the pixels are still checked */
}

/* A reader over `buf` with the file's header read and the transforms to
 * 8-bit samples in the file's own channels (alpha dropped) set; *png and
 * *info are freed by the caller with png_destroy_read_struct. The caller
 * sets its own setjmp before any further libpng call. */
static fr_status open_png(source *s, png_structp *png, png_infop *info) {
    *png = png_create_read_struct(PNG_LIBPNG_VER_STRING, s, on_error, on_warning);
    *info = *png ? png_create_info_struct(*png) : NULL;
    if (!*info)
        return fr_error(FR_ERR_OOM, "out of memory decoding %s", s->name);
    if (setjmp(png_jmpbuf(*png)))
        return fr_error(FR_ERR_FORMAT, "cannot decode %s (PNG: %s)", s->name, s->why);
    png_set_read_fn(*png, s, read_mem);
    png_set_user_limits(*png, FR_IMAGE_MAX_SIDE, FR_IMAGE_MAX_SIDE);
    png_read_info(*png, *info);
    int type = png_get_color_type(*png, *info), depth = png_get_bit_depth(*png, *info);
    if (type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(*png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(*png);
    if (depth == 16)
        png_set_scale_16(*png);
    /* a palette's tRNS becomes alpha in the expansion: dropped with it */
    if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(*png, *info, PNG_INFO_tRNS))
        png_set_strip_alpha(*png);
    png_set_interlace_handling(*png);
    png_read_update_info(*png, *info);
    return FR_OK;
}

/* The channels of the file's pixels: 3 for colour or a palette, else 1. */
static int file_channels(png_structp png, png_infop info) {
    return png_get_color_type(png, info) & (PNG_COLOR_MASK_COLOR | PNG_COLOR_MASK_PALETTE) ? 3 : 1;
}

fr_status fr_png_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd) {
    source s = {.buf = buf, .len = len, .name = name};
    png_structp png = NULL;
    png_infop info = NULL;
    fr_status st = open_png(&s, &png, &info);
    if (st == FR_OK) {
        png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
        if (w > INT_MAX || h > INT_MAX)
            st = fr_error(FR_ERR_FORMAT, "%s: corrupt PNG: %ux%u pixels", name, w, h);
        hd->w = (int)w;
        hd->h = (int)h;
        hd->channels = file_channels(png, info);
    }
    png_destroy_read_struct(&png, &info, NULL);
    return st;
}

/* Every pass of the image into rows; the setjmp in a frame of its own, so
 * no local of the caller lives across the longjmp. */
static fr_status read_rows(png_structp png, png_bytep *rows, source *s) {
    if (setjmp(png_jmpbuf(png)))
        return fr_error(FR_ERR_FORMAT, "cannot decode %s (PNG: %s)", s->name, s->why);
    png_read_image(png, rows);
    return FR_OK;
}

fr_status fr_png_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                        uint8_t *hwc) {
    source s = {.buf = buf, .len = len, .name = name};
    png_structp png = NULL;
    png_infop info = NULL;
    png_bytep *rows = NULL;
    fr_status st = open_png(&s, &png, &info);
    /* the header read before must describe the same pixels */
    if (st == FR_OK && (png_get_image_width(png, info) != (png_uint_32)hd->w ||
                        png_get_image_height(png, info) != (png_uint_32)hd->h ||
                        file_channels(png, info) != hd->channels ||
                        png_get_rowbytes(png, info) != (size_t)hd->w * (size_t)hd->channels))
        st = fr_error(FR_ERR_FORMAT, "cannot decode %s (PNG: the pixels do not match the header)", name);
    if (st == FR_OK && !(rows = malloc((size_t)hd->h * sizeof *rows)))
        st = fr_error(FR_ERR_OOM, "out of memory decoding %s", name);
    if (st == FR_OK) {
        for (int y = 0; y < hd->h; y++)
            rows[y] = hwc + (size_t)y * (size_t)hd->w * (size_t)hd->channels;
        st = read_rows(png, rows, &s);
    }
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    return st;
}
