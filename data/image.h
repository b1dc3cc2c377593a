/* image.h (internal to data/): reading image files safely for the image
 * folder reader, and the checks that stand in front of stb_image.
 *
 * Debian's stb_image (v2.27) trusts two things a crafted file controls: the
 * symbol counts of a JPEG Huffman table (their sum indexes a 257-entry array:
 * an out-of-bounds write when it passes 256) and the pixel data size of a
 * BMP (a truncated file decodes silently, its missing rows read as zeros).
 * fr_image_check refuses both before stb sees the bytes; the decoders are
 * then only ever handed whole, checked files held in memory. Every error
 * names the file. */
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

/* The structural checks above, for a PNG, JPEG or BMP held in buf. */
fr_status fr_image_check(const uint8_t *buf, size_t len, const char *name);

/* Checks, then reads the header: width, height, and 1 (grey, grey+alpha)
 * or 3 (colour, colour+alpha) channels. */
fr_status fr_image_info(const uint8_t *buf, size_t len, const char *name, int *w, int *h, int *channels);

/* Checks, then decodes into dst (channels, h, w) u8, converting to
 * `channels` (1 or 3); the image must be w x h. */
fr_status fr_image_decode(const uint8_t *buf, size_t len, const char *name, int channels, int w, int h,
                          uint8_t *dst);

#endif
