/* image_bmp.c: uncompressed Windows bitmaps; see image_codecs.h.
 *
 * Taken: the OS/2 core header (12 bytes) and the Windows info headers (40,
 * 52, 56, 108, 124 bytes); 1, 4 and 8 bits per pixel through a palette; 16
 * and 32 bits through channel masks (BI_RGB's defaults or BI_BITFIELDS);
 * 24 bits as B, G, R; rows bottom-up, or top-down for a negative height.
 * Refused, by name: RLE and embedded JPEG/PNG compression. Every byte a
 * pixel needs must lie inside the file, and every palette index inside the
 * palette: a short or inconsistent file is an error, never zeros. A bitmap
 * always reads as colour (3 channels), as the format has no grey kind. */
#include "image_codecs.h"

#include <string.h>

static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const uint8_t *p) { return le16(p) | le16(p + 2) << 16; }

enum { BI_RGB = 0, BI_RLE8 = 1, BI_RLE4 = 2, BI_BITFIELDS = 3, BI_JPEG = 4, BI_PNG = 5 };

/* One colour channel held in a mask of a 16- or 32-bit pixel. */
typedef struct {
    uint32_t mask;
    unsigned shift;
    uint32_t max; /* the mask's value range, (mask >> shift) */
} channel_mask;

typedef struct {
    int64_t w, h;
    bool top_down;
    unsigned bpp;
    uint32_t compression;
    size_t pixels_at, row_bytes;
    size_t palette_at, palette_entry, colors;
    channel_mask rgb[3];
} bmp_layout;

static bool make_mask(uint32_t mask, channel_mask *out) {
    if (!mask)
        return false;
    unsigned shift = (unsigned)__builtin_ctz(mask);
    uint32_t v = mask >> shift;
    if (v & (v + 1)) /* the bits must be contiguous */
        return false;
    *out = (channel_mask){mask, shift, v};
    return true;
}

static uint8_t masked(uint32_t px, const channel_mask *m) {
    uint64_t v = (px & m->mask) >> m->shift;
    return (uint8_t)((v * 255 + m->max / 2) / m->max);
}

static fr_status layout_of(const uint8_t *b, size_t len, const char *name, bmp_layout *o) {
    memset(o, 0, sizeof *o);
    if (len < 26 || b[0] != 'B' || b[1] != 'M')
        return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %zu bytes", name, len);
    const uint32_t offset = le32(b + 10), hsize = le32(b + 14);
    if (hsize != 12 && hsize != 40 && hsize != 52 && hsize != 56 && hsize != 108 && hsize != 124)
        return fr_error(FR_ERR_FORMAT, "%s: unsupported BMP: a header of %u bytes", name, hsize);
    if (14 + (size_t)hsize > len)
        return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %zu bytes, its header needs %u", name, len,
                        14 + hsize);
    uint32_t planes;
    size_t colors = 0;
    if (hsize == 12) {
        o->w = le16(b + 18);
        o->h = le16(b + 20);
        planes = le16(b + 22);
        o->bpp = le16(b + 24);
        o->palette_entry = 3;
    } else {
        o->w = (int32_t)le32(b + 18);
        o->h = (int32_t)le32(b + 22);
        planes = le16(b + 26);
        o->bpp = le16(b + 28);
        o->compression = le32(b + 30);
        colors = le32(b + 46);
        o->palette_entry = 4;
    }
    o->top_down = o->h < 0;
    o->h = o->h < 0 ? -o->h : o->h;
    if (o->w < 1 || o->h < 1 || planes != 1)
        return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: %lldx%lld pixels in %u planes", name,
                        (long long)o->w, (long long)o->h, planes);
    if (o->compression == BI_RLE8 || o->compression == BI_RLE4 || o->compression == BI_JPEG ||
        o->compression == BI_PNG)
        return fr_error(FR_ERR_FORMAT, "%s: unsupported BMP: %s compression (only uncompressed bitmaps "
                        "are read)", name, o->compression == BI_JPEG ? "JPEG"
                                           : o->compression == BI_PNG ? "PNG" : "RLE");
    const bool fields = o->compression == BI_BITFIELDS;
    if ((o->compression != BI_RGB && !fields) || (fields && o->bpp != 16 && o->bpp != 32))
        return fr_error(FR_ERR_FORMAT, "%s: unsupported BMP: compression %u at %u bits per pixel", name,
                        o->compression, o->bpp);
    if (o->bpp != 1 && o->bpp != 4 && o->bpp != 8 && o->bpp != 16 && o->bpp != 24 && o->bpp != 32)
        return fr_error(FR_ERR_FORMAT, "%s: unsupported BMP: %u bits per pixel", name, o->bpp);

    size_t after_header = 14 + (size_t)hsize;
    if (o->bpp == 16 || o->bpp == 32) {
        uint32_t m[3] = {o->bpp == 16 ? 0x7C00u : 0xFF0000u, o->bpp == 16 ? 0x03E0u : 0xFF00u,
                         o->bpp == 16 ? 0x001Fu : 0xFFu};
        if (fields) { /* inside a header of 52 bytes or more, else right after it */
            size_t at = 14 + 40;
            if (hsize == 40 && (after_header += 12) > len)
                return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: its channel masks are missing", name);
            for (int c = 0; c < 3; c++)
                m[c] = le32(b + at + 4 * (size_t)c);
        }
        for (int c = 0; c < 3; c++)
            if (!make_mask(m[c], &o->rgb[c]) || (o->bpp == 16 && m[c] > 0xFFFF))
                return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: channel mask 0x%x", name, m[c]);
    }
    if (o->bpp <= 8) {
        const size_t most = (size_t)1 << o->bpp;
        o->colors = colors ? colors : most;
        o->palette_at = after_header;
        if (o->colors > most)
            return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: %zu palette colours at %u bits per pixel", name,
                            o->colors, o->bpp);
        if (o->colors * o->palette_entry > len - after_header)
            return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: its palette of %zu colours is cut", name,
                            o->colors);
    }
    o->row_bytes = (size_t)(((uint64_t)o->w * o->bpp + 31) / 32 * 4);
    o->pixels_at = offset;
    if (offset < 14 + (size_t)hsize || offset > len || (uint64_t)o->row_bytes * (uint64_t)o->h > len - offset)
        return fr_error(FR_ERR_FORMAT, "%s: truncated BMP: %lldx%lld pixels of %u bits need %llu bytes "
                        "from offset %u, the file has %zu", name, (long long)o->w, (long long)o->h, o->bpp,
                        (unsigned long long)((uint64_t)o->row_bytes * (uint64_t)o->h), offset, len);
    return FR_OK;
}

fr_status fr_bmp_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd) {
    bmp_layout o;
    FR_TRY(layout_of(buf, len, name, &o));
    if (o.w > INT32_MAX || o.h > INT32_MAX)
        return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: %lldx%lld pixels", name, (long long)o.w,
                        (long long)o.h);
    *hd = (fr_image_header){(int)o.w, (int)o.h, 3};
    return FR_OK;
}

fr_status fr_bmp_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                        uint8_t *hwc) {
    bmp_layout o;
    FR_TRY(layout_of(buf, len, name, &o));
    if (o.w != hd->w || o.h != hd->h || hd->channels != 3)
        return fr_error(FR_ERR_ARG, "%s: decoding a %lldx%lld BMP as %dx%d with %d channels", name,
                        (long long)o.w, (long long)o.h, hd->w, hd->h, hd->channels);
    for (int64_t y = 0; y < o.h; y++) {
        const uint8_t *row = buf + o.pixels_at + (size_t)(o.top_down ? y : o.h - 1 - y) * o.row_bytes;
        uint8_t *out = hwc + (size_t)y * (size_t)o.w * 3;
        for (int64_t x = 0; x < o.w; x++, out += 3) {
            if (o.bpp <= 8) {
                const uint64_t bit = (uint64_t)x * o.bpp;
                const unsigned index = (row[bit / 8] >> (8 - o.bpp - bit % 8)) & ((1u << o.bpp) - 1);
                if (index >= o.colors)
                    return fr_error(FR_ERR_FORMAT, "%s: corrupt BMP: pixel (%lld, %lld) uses colour %u of a "
                                    "palette of %zu", name, (long long)x, (long long)y, index, o.colors);
                const uint8_t *bgr = buf + o.palette_at + index * o.palette_entry;
                out[0] = bgr[2], out[1] = bgr[1], out[2] = bgr[0];
            } else if (o.bpp == 24) {
                const uint8_t *bgr = row + (size_t)x * 3;
                out[0] = bgr[2], out[1] = bgr[1], out[2] = bgr[0];
            } else {
                const uint32_t px = o.bpp == 16 ? le16(row + (size_t)x * 2) : le32(row + (size_t)x * 4);
                for (int c = 0; c < 3; c++)
                    out[c] = masked(px, &o.rgb[c]);
            }
        }
    }
    return FR_OK;
}
