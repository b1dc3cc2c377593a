/* image_jpeg.c: JPEG files through libjpeg-turbo's TurboJPEG API; see
 * image_codecs.h. Warnings are errors (TurboJPEG reports them as a failed
 * call; TJFLAG_STOPONWARNING also stops the decode there): libjpeg
 * otherwise "recovers" from corrupt or missing entropy data by filling in
 * grey, a silently different image. Progressive files are limited to the
 * library's scan cap (TJFLAG_LIMITSCANS), so a small crafted file cannot
 * cost minutes. */
#include "image_codecs.h"

#include <turbojpeg.h>

static fr_status jpeg_error(tjhandle tj, const char *name) {
    return fr_error(FR_ERR_FORMAT, "cannot decode %s (JPEG: %s)", name,
                    tj ? tjGetErrorStr2(tj) : "cannot start the decoder");
}

fr_status fr_jpeg_header(const uint8_t *buf, size_t len, const char *name, fr_image_header *hd) {
    tjhandle tj = tjInitDecompress();
    int w, h, subsampling, colorspace;
    fr_status st = FR_OK;
    if (!tj || tjDecompressHeader3(tj, buf, (unsigned long)len, &w, &h, &subsampling, &colorspace) != 0)
        st = jpeg_error(tj, name);
    else if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
        st = fr_error(FR_ERR_FORMAT, "%s is a CMYK JPEG; only grey and colour (YCbCr/RGB) ones are read",
                      name);
    else
        *hd = (fr_image_header){w, h, colorspace == TJCS_GRAY ? 1 : 3};
    if (tj)
        tjDestroy(tj);
    return st;
}

fr_status fr_jpeg_decode(const uint8_t *buf, size_t len, const char *name, const fr_image_header *hd,
                         uint8_t *hwc) {
    tjhandle tj = tjInitDecompress();
    fr_status st = FR_OK;
    if (!tj || tjDecompress2(tj, buf, (unsigned long)len, hwc, hd->w, 0, hd->h,
                             hd->channels == 1 ? TJPF_GRAY : TJPF_RGB,
                             TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
        st = jpeg_error(tj, name);
    if (tj)
        tjDestroy(tj);
    return st;
}
