/* image.c: whole-file reads and the checks in front of stb_image; see
 * image.h. */
#include "image.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Only the formats the design names: TGA is left out on purpose, because
 * stb's TGA probe accepts many files that are not images. */
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_NO_HDR
#define STBI_NO_LINEAR
#define STBI_NO_STDIO
#define STBI_FAILURE_USERMSG
#define STBI_MAX_DIMENSIONS FR_IMAGE_MAX_SIDE
/* stb_image 2.27 asserts (abort) on some malformed JPEG entropy data, e.g.
 * a Huffman code whose length disagrees with its table (found by
 * tests/fuzz/fuzz_image_folder). A library must not abort on a bad file: a
 * failed check is noted instead and the decode reported as an error. */
static _Thread_local int stb_check_failed;
#define STBI_ASSERT(x) ((x) ? (void)0 : (void)(stb_check_failed = 1))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmisleading-indentation"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

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
static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const uint8_t *p) { return le16(p) | le16(p + 2) << 16; }

/* stb 2.27 reads a DHT segment as: a 16-bit length L, then while L > 2
 * tables of a class/id byte, 16 code-length counts and that many symbols,
 * and indexes a 257-entry array with the counts' sum. It finds a segment
 * wherever it meets the bytes FF C4 (a marker is always an FF run and the
 * marker byte), and reads past the end of the data as zeros. So every
 * FF C4 in the file is read here the way stb would read it, which covers
 * every DHT stb can reach however its parse goes. A table stb itself would
 * refuse (class > 1 or id > 3) ends the segment: stb stops there too. */
static fr_status check_dht_at(const uint8_t *b, size_t len, size_t at, const char *name) {
#define BYTE(i) ((i) < len ? b[i] : 0u)
    long left = (long)(BYTE(at) << 8 | BYTE(at + 1)) - 2;
    at += 2;
    while (left > 0) {
        unsigned q = BYTE(at);
        if (q >> 4 > 1 || (q & 15) > 3)
            return FR_OK;
        unsigned symbols = 0;
        for (size_t i = 1; i <= 16; i++)
            symbols += BYTE(at + i);
        if (symbols > 256)
            return fr_error(FR_ERR_FORMAT, "%s: corrupt JPEG: a Huffman table declares %u symbols (at most "
                            "256)", name, symbols);
        at += 17 + symbols;
        left -= 17 + (long)symbols;
    }
    return FR_OK;
#undef BYTE
}

/* The Huffman tables, then the markers walked from the start of image to
 * its end, so that a file cut short is named as such. */
static fr_status check_jpeg(const uint8_t *b, size_t len, size_t at, const char *name) {
    for (size_t i = 0; i + 1 < len; i++)
        if (b[i] == 0xFF && b[i + 1] == 0xC4)
            FR_TRY(check_dht_at(b, len, i + 2, name));
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

/* The pixel array of an uncompressed BMP must lie inside the file. */
static fr_status check_bmp(const uint8_t *b, size_t len, const char *name) {
    if (len < 26)
        return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %zu bytes", name, len);
    uint32_t offset = le32(b + 10), hsize = le32(b + 14);
    int64_t w, h;
    uint32_t bpp, compression = 0;
    if (hsize == 12) {
        w = le16(b + 18);
        h = le16(b + 20);
        bpp = le16(b + 24);
    } else {
        if (len < 34)
            return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %zu bytes", name, len);
        w = (int32_t)le32(b + 18);
        h = (int32_t)le32(b + 22);
        bpp = le16(b + 28);
        compression = le32(b + 30);
    }
    h = h < 0 ? -h : h;
    if (w <= 0 || h <= 0 || w > FR_IMAGE_MAX_SIDE || h > FR_IMAGE_MAX_SIDE || bpp == 0 || bpp > 32)
        return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: %lldx%lld pixels of %u bits", name, (long long)w,
                        (long long)h, bpp);
    if (compression != 0 && compression != 3)
        return FR_OK; /* RLE and the rest: stb refuses them itself */
    uint64_t row = ((uint64_t)w * bpp + 31) / 32 * 4;
    if (offset < 14 + hsize || offset > len || row * (uint64_t)h > len - offset)
        return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %lldx%lld pixels of %u bits need %llu bytes "
                        "from offset %u, the file has %zu", name, (long long)w, (long long)h, bpp,
                        (unsigned long long)(row * (uint64_t)h), offset, len);
    return FR_OK;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)be16(p) << 16 | be16(p + 2); }

/* Every chunk inside the file, up to IEND. stb 2.27 grows its IDAT buffer to
 * a chunk's declared length (up to 1 GiB) before reading it, so a 100-byte
 * file could cost a gigabyte; it is refused here instead. */
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

fr_status fr_image_check(const uint8_t *buf, size_t len, const char *name) {
    if (len >= 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8))
        return check_png(buf, len, name);
    /* what stb's JPEG test takes: a run of FF bytes, then D8 */
    size_t at = 0;
    while (at < len && buf[at] == 0xFF)
        at++;
    if (at > 0 && at < len && buf[at] == 0xD8)
        return check_jpeg(buf, len, at + 1, name);
    if (len >= 2 && buf[0] == 'B' && buf[1] == 'M')
        return check_bmp(buf, len, name);
    return FR_OK; /* PNG (stb checks its chunks against the data it inflates) or not an image */
}

fr_status fr_image_info(const uint8_t *buf, size_t len, const char *name, int *w, int *h, int *channels) {
    FR_TRY(fr_image_check(buf, len, name));
    int comp;
    if (len > INT32_MAX || !stbi_info_from_memory(buf, (int)len, w, h, &comp))
        return fr_error(FR_ERR_FORMAT, "%s is not a PNG, JPEG or BMP image (%s)", name,
                        len > INT32_MAX ? "too large" : stbi_failure_reason());
    if (*w < 1 || *h < 1 || *w > FR_IMAGE_MAX_SIDE || *h > FR_IMAGE_MAX_SIDE)
        return fr_error(FR_ERR_FORMAT, "%s is %dx%d (WxH); sides must lie in [1, %d]", name, *w, *h,
                        FR_IMAGE_MAX_SIDE);
    /* A header cannot claim more pixels than the file could encode (deflate
     * packs at most ~1032 bytes into one, a byte is at most 8 one-bit
     * pixels; a JPEG block takes a few bits): a tiny file claiming a huge
     * image would otherwise size a huge allocation before failing. */
    if ((double)*w * (double)*h > 8.0 * 1032.0 * (double)len)
        return fr_error(FR_ERR_FORMAT, "%s is %zu bytes but claims %dx%d pixels: corrupt or truncated", name,
                        len, *w, *h);
    *channels = comp <= 2 ? 1 : 3;
    return FR_OK;
}

fr_status fr_image_decode(const uint8_t *buf, size_t len, const char *name, int channels, int w, int h,
                          uint8_t *dst) {
    FR_TRY(fr_image_check(buf, len, name));
    int gw, gh, comp;
    stb_check_failed = 0;
    uint8_t *img = len <= INT32_MAX ? stbi_load_from_memory(buf, (int)len, &gw, &gh, &comp, channels) : NULL;
    if (img && stb_check_failed) {
        stbi_image_free(img);
        return fr_error(FR_ERR_FORMAT, "cannot decode %s (corrupt: the decoder's consistency check "
                        "failed)", name);
    }
    if (!img)
        return fr_error(FR_ERR_FORMAT, "cannot decode %s (%s)", name,
                        len > INT32_MAX ? "too large" : stbi_failure_reason());
    if (gw != w || gh != h) {
        stbi_image_free(img);
        return fr_error(FR_ERR_FORMAT, "%s decodes to %dx%d (WxH), its header said %dx%d", name, gw, gh, w, h);
    }
    const int64_t plane = (int64_t)h * w;
    for (int64_t p = 0; p < plane; p++)  // stb's interleaved (H, W, C) into (C, H, W)
        for (int c = 0; c < channels; c++)
            dst[c * plane + p] = img[p * channels + c];
    stbi_image_free(img);
    return FR_OK;
}
