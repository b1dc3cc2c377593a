/* image.c: whole-file reads, the structural checks every image passes
 * first, and the one conversion of channels and layout behind the format
 * readers (image_png.c, image_jpeg.c, image_bmp.c); see image.h. */
#include "image.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image_codecs.h"

fr_status fr_read_regular_file(const char *path, size_t max, uint8_t **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer forever, before fstat could say what it is */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return fr_error(FR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    fr_status st = FR_OK;
    if (fstat(fd, &sb) != 0)
        st = fr_error(FR_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = fr_error(FR_ERR_IO, "%s is not a regular file", path);
    else if ((uint64_t)sb.st_size > max)
        st = fr_error(FR_ERR_FORMAT, "%s is %lld bytes, more than the %zu this reader takes", path,
                      (long long)sb.st_size, max);
    size_t n = st == FR_OK ? (size_t)sb.st_size : 0;
    uint8_t *b = st == FR_OK ? malloc(n ? n : 1) : NULL;
    if (st == FR_OK && !b)
        st = fr_error(FR_ERR_OOM, "out of memory reading %s (%zu bytes)", path, n);
    for (size_t done = 0; st == FR_OK && done < n;) {
        ssize_t got = read(fd, b + done, n - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            st = fr_error(FR_ERR_IO, "cannot read %s: %s", path, got < 0 ? strerror(errno) : "it shrank");
        else
            done += (size_t)got;
    }
    close(fd);
    if (st != FR_OK) {
        free(b);
        return st;
    }
    *buf = b;
    *len = n;
    return FR_OK;
}

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }
static uint32_t be32(const uint8_t *p) { return (uint32_t)be16(p) << 16 | be16(p + 2); }

/* The markers walked from the start of image to its end, so that a file cut
 * short is named as such before the decoder sees it. */
static fr_status check_jpeg(const uint8_t *b, size_t len, const char *name) {
    size_t at = 2;
    for (;;) {
        while (at < len && b[at] != 0xFF)
            at++; /* entropy-coded data */
        while (at < len && b[at] == 0xFF)
            at++; /* fill bytes */
        if (at >= len)
            return fr_error(FR_ERR_FORMAT, "%s: truncated JPEG: no end-of-image marker", name);
        uint8_t m = b[at++];
        if (m == 0x00 || (m >= 0xD0 && m <= 0xD7) || m == 0x01)
            continue; /* stuffed byte, restart marker, TEM: no length */
        if (m == 0xD9)
            return FR_OK;
        if (len - at < 2 || be16(b + at) < 2 || be16(b + at) > len - at)
            return fr_error(FR_ERR_FORMAT, "%s: truncated JPEG: a segment runs past the end of the file",
                            name);
        at += be16(b + at);
    }
}

/* Every chunk inside the file, up to IEND, so that a file cut short is named
 * as such (libpng would say only that the data ended). */
static fr_status check_png(const uint8_t *b, size_t len, const char *name) {
    size_t at = 8;
    for (;;) {
        if (len - at < 12)
            return fr_error(FR_ERR_FORMAT, "%s: truncated PNG: no IEND chunk", name);
        uint32_t n = be32(b + at);
        if (n > len - at - 12)
            return fr_error(FR_ERR_FORMAT, "%s: truncated PNG: a %u-byte chunk runs past the end of the "
                            "file", name, n);
        if (!memcmp(b + at + 4, "IEND", 4))
            return FR_OK;
        at += 12 + (size_t)n;
    }
}

typedef enum { FORMAT_NONE, FORMAT_PNG, FORMAT_JPEG, FORMAT_BMP } image_format;

static image_format format_of(const uint8_t *b, size_t len) {
    if (len >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8))
        return FORMAT_PNG;
    if (len >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF)
        return FORMAT_JPEG;
    if (len >= 2 && b[0] == 'B' && b[1] == 'M')
        return FORMAT_BMP;
    return FORMAT_NONE;
}

fr_status fr_image_check(const uint8_t *buf, size_t len, const char *name) {
    switch (format_of(buf, len)) {
    case FORMAT_PNG:
        return check_png(buf, len, name);
    case FORMAT_JPEG:
        return check_jpeg(buf, len, name);
    case FORMAT_BMP: {
        fr_image_header hd;
        return fr_bmp_header(buf, len, name, &hd);
    }
    case FORMAT_NONE:
        break;
    }
    return fr_error(FR_ERR_FORMAT, "%s is not a PNG, JPEG or BMP image", name);
}

/* The checks, then the header, then the limits every format shares. A
 * BMP's check is its header read, so it is read once. */
static fr_status header_of(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd) {
    switch (format_of(buf, len)) {
    case FORMAT_PNG:
        FR_TRY(check_png(buf, len, name));
        FR_TRY(fr_png_header(buf, len, name, hd));
        break;
    case FORMAT_JPEG:
        FR_TRY(check_jpeg(buf, len, name));
        FR_TRY(fr_jpeg_header(buf, len, name, hd));
        break;
    case FORMAT_BMP:
        FR_TRY(fr_bmp_header(buf, len, name, hd));
        break;
    case FORMAT_NONE:
        return fr_image_check(buf, len, name); /* the error naming the formats */
    }
    if (hd->w < 1 || hd->h < 1 || hd->w > FR_IMAGE_MAX_SIDE || hd->h > FR_IMAGE_MAX_SIDE)
        return fr_error(FR_ERR_FORMAT, "%s is %dx%d (WxH); sides must lie in [1, %d]", name, hd->w, hd->h,
                        FR_IMAGE_MAX_SIDE);
    /* A header cannot claim more pixels than the file could encode (deflate
     * packs at most ~1032 bytes into one, a byte is at most 8 one-bit
     * pixels; a JPEG block takes a few bits): a tiny file claiming a huge
     * image would otherwise size a huge allocation before failing. */
    if ((double)hd->w * (double)hd->h > 8.0 * 1032.0 * (double)len)
        return fr_error(FR_ERR_FORMAT, "%s is %zu bytes but claims %dx%d pixels: corrupt or truncated", name,
                        len, hd->w, hd->h);
    return FR_OK;
}

fr_status fr_image_info(const uint8_t *buf, size_t len, const char *name, int *w, int *h, int *channels) {
    fr_image_header hd;
    FR_TRY(header_of(buf, len, name, &hd));
    *w = hd.w;
    *h = hd.h;
    *channels = hd.channels;
    return FR_OK;
}

fr_status fr_image_decode(const uint8_t *buf, size_t len, const char *name, int channels, int w, int h,
                          uint8_t *dst) {
    if (channels != 1 && channels != 3)
        return fr_error(FR_ERR_ARG, "decoding %s: channels must be 1 or 3 (got %d)", name, channels);
    fr_image_header hd;
    FR_TRY(header_of(buf, len, name, &hd));
    if (hd.w != w || hd.h != h)
        return fr_error(FR_ERR_FORMAT, "%s is %dx%d (WxH), %dx%d was expected", name, hd.w, hd.h, w, h);
    const size_t plane = (size_t)h * (size_t)w;
    uint8_t *hwc = malloc(plane * (size_t)hd.channels);
    if (!hwc)
        return fr_error(FR_ERR_OOM, "out of memory decoding %s (%dx%d)", name, w, h);
    image_format f = format_of(buf, len);
    fr_status st = f == FORMAT_PNG    ? fr_png_decode(buf, len, name, &hd, hwc)
                   : f == FORMAT_JPEG ? fr_jpeg_decode(buf, len, name, &hd, hwc)
                                      : fr_bmp_decode(buf, len, name, &hd, hwc);
    /* the file's (H, W, C) into the dataset's (C, H, W); colour to grey with
     * the ITU-R BT.601 luma weights in 8-bit fixed point (77, 150, 29) / 256,
     * grey to colour by copying, so every format converts alike */
    for (size_t p = 0; st == FR_OK && p < plane; p++) {
        const uint8_t *px = hwc + p * (size_t)hd.channels;
        if (hd.channels == channels)
            for (int c = 0; c < channels; c++)
                dst[(size_t)c * plane + p] = px[c];
        else if (channels == 1)
            dst[p] = (uint8_t)((77u * px[0] + 150u * px[1] + 29u * px[2]) >> 8);
        else
            for (int c = 0; c < 3; c++)
                dst[(size_t)c * plane + p] = px[0];
    }
    free(hwc);
    return st;
}
