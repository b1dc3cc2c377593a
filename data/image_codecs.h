/* image_codecs.h (internal to data/): one reader per image file format,
 * behind data/image.c. Each reads a header (size, and the file's own
 * channels: 1 for grey or grey+alpha, 3 for colour or colour+alpha) and
 * decodes the whole, checked file into interleaved (H, W, channels) u8 in
 * the file's own channels, alpha dropped; image.c converts the channel
 * count and the layout, the same way for every format. Every error names
 * the file. */
#ifndef FR_DATA_IMAGE_CODECS_H
#define FR_DATA_IMAGE_CODECS_H

#include <stddef.h>
#include <stdint.h>

#include "../tensor/fr_base.h"

typedef struct {
    int w, h;
    int channels; /* 1 or 3 */
} fr_image_header;

/* PNG through libpng's simplified API (image_png.c). */
fr_status fr_png_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd);
fr_status fr_png_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                        uint8_t *hwc);

/* JPEG through libjpeg-turbo's TurboJPEG API (image_jpeg.c). */
fr_status fr_jpeg_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd);
fr_status fr_jpeg_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                         uint8_t *hwc);

/* Uncompressed BMP (image_bmp.c): no library in the field covers it, and
 * the format is a header and rows of pixels. */
fr_status fr_bmp_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd);
fr_status fr_bmp_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                        uint8_t *hwc);

#endif
