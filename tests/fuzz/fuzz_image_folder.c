/* fuzz_image_folder.c: image decoding (data/image.c: its checks, libpng,
 * libjpeg-turbo, its own BMP reader) and the folder reader (data/image_folder.c). The input is one
 * image file: decoded from memory in both channel counts, then loaded as
 * the only file of a one-class folder. Images over 2^20 pixels are only
 * probed (a real, huge image is not a bug, and would pass the fuzzer's
 * memory limit). */
#include "fuzz_common.h"
#include <sys/stat.h>

#include "data/dataset.h"
#include "data/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char file[160];
    if (!file[0]) {
        char cls[140];
        snprintf(cls, sizeof cls, "%s/only-class", fz_dir());
        if (mkdir(cls, 0700) != 0)
            abort();
        snprintf(file, sizeof file, "%s/image", cls);
    }
    int w, h, c;
    if (fr_image_info(data, size, "input", &w, &h, &c) != FR_OK || (int64_t)w * h > (1 << 20))
        return 0;
    if (c != 1 && c != 3)
        abort();
    uint8_t *px = malloc((size_t)w * (size_t)h * 3);
    if (!px)
        return 0;
    (void)fr_image_decode(data, size, "input", 3, w, h, px);
    (void)fr_image_decode(data, size, "input", 1, w, h, px);
    free(px);
    fz_write(file, data, size);
    size_t before = fr_mem_total_current(FR_CPU);
    fr_dataset *ds = fr_dataset_load_folder(fz_dir(), 0);
    if (ds && (ds->n != 1 || ds->w != w || ds->h != h || ds->c != c))
        abort(); /* the folder reader agrees with the header */
    fr_dataset_free(ds);
    fz_check_no_leak(before);
    return 0;
}
