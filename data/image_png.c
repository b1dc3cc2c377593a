/* image_png.c: PNG files through libpng's simplified API; see
 * image_codecs.h. libpng checks the chunk CRCs, the zlib stream and the
 * amount of image data itself; a short image is an error, not a picture
 * padded with zeros. */
#include "image_codecs.h"

#include <limits.h>
#include <png.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static fr_status begin(png_image *im, const uint8_t *buf, size_t len, const char *name) {
    memset(im, 0, sizeof *im);
    im->version = PNG_IMAGE_VERSION;
    if (png_image_begin_read_from_memory(im, buf, len))
        return FR_OK;
    fr_status st = fr_error(FR_ERR_FORMAT, "cannot decode %s (PNG: %s)", name, im->message);
    png_image_free(im);
    return st;
}

fr_status fr_png_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd) {
    png_image im;
    FR_TRY(begin(&im, buf, len, name));
    if (im.width > INT_MAX || im.height > INT_MAX) {
        png_image_free(&im);
        return fr_error(FR_ERR_FORMAT, "%s: corrupt PNG: %ux%u pixels", name, im.width, im.height);
    }
    hd->w = (int)im.width;
    hd->h = (int)im.height;
    hd->channels = im.format & PNG_FORMAT_FLAG_COLOR ? 3 : 1;
    png_image_free(&im);
    return FR_OK;
}

fr_status fr_png_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                        uint8_t *hwc) {
    png_image im;
    FR_TRY(begin(&im, buf, len, name));
    /* Alpha is read and then dropped, never composited: with no background
     * libpng would blend onto whatever the buffer held. */
    const bool alpha = im.format & PNG_FORMAT_FLAG_ALPHA;
    im.format = (hd->channels == 3 ? PNG_FORMAT_FLAG_COLOR : 0) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
    const size_t pixels = (size_t)hd->w * (size_t)hd->h, stride = (size_t)hd->channels + alpha;
    uint8_t *rows = hwc;
    if (alpha && !(rows = malloc(pixels * stride))) {
        png_image_free(&im);
        return fr_error(FR_ERR_OOM, "out of memory decoding %s (%zu pixels)", name, pixels);
    }
    fr_status st = FR_OK;
    if (!png_image_finish_read(&im, NULL, rows, 0, NULL))
        st = fr_error(FR_ERR_FORMAT, "cannot decode %s (PNG: %s)", name, im.message);
    for (size_t p = 0; st == FR_OK && alpha && p < pixels; p++)
        memcpy(hwc + p * (size_t)hd->channels, rows + p * stride, (size_t)hd->channels);
    if (alpha)
        free(rows);
    png_image_free(&im);
    return st;
}
