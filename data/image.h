/* image.h (internal to data/): reading image files safely for the image
 * folder reader.
 *
 * Files are read whole into memory (regular files only, bounded size), then
 * checked for structure (a PNG's chunks and a JPEG's segments lie inside
 * the file, so a cut file is named as truncated), then decoded by a reader
 * made for the format: libpng and libjpeg-turbo, both fuzzed continuously
 * upstream, and a small BMP reader of our own (data/image_bmp.c). Debian's
 * stb_image 2.27 was used before and dropped: fuzz_image_folder kept finding
 * out-of-bounds reads and writes and aborts in its JPEG decoder. Every
 * error names the file. */
#ifndef FR_DATA_IMAGE_H
#define FR_DATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "../tensor/fr_base.h"

/* Largest image side the folder reader takes (a dataset holds every image
 * at one size; bigger ones are almost surely not what a user means). */
#define FR_IMAGE_MAX_SIDE 16384
/* Largest image file read into memory. */
#define FR_IMAGE_MAX_FILE ((size_t)256 << 20)

/* The whole of regular file `path` (at most `max` bytes) into a malloc'ed
 * buffer the caller frees. A FIFO, device or folder is refused without
 * blocking (the file is opened O_NONBLOCK and checked with fstat first). */
fr_status fr_read_regular_file(const char *path, size_t max, uint8_t **buf, size_t *len);

/* The structural checks above, for a PNG, JPEG or BMP held in buf; anything
 * else is an error saying it is not one of them. */
fr_status fr_image_check(const uint8_t *buf, size_t len, const char *name);

/* Checks, then reads the header: width, height, and 1 (grey, grey+alpha)
 * or 3 (colour, colour+alpha) channels. */
fr_status fr_image_info(const uint8_t *buf, size_t len, const char *name, int *w, int *h, int *channels);

/* Checks, then decodes into dst (channels, h, w) u8, converting to
 * `channels` (1 or 3); the image must be w x h. */
fr_status fr_image_decode(const uint8_t *buf, size_t len, const char *name, int channels, int w, int h,
                          uint8_t *dst);

#endif
