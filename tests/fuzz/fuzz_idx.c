/* fuzz_idx.c: the IDX reader (data/dataset.c), plain or gzip (zlib tells
 * them apart by the bytes). Input: a 2-byte little-endian length L, then L
 * bytes of the images file and the rest as the labels file. */
#include "fuzz_common.h"
#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    size_t split = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (split > size)
        split = size;
    char images[128], labels[128];
    snprintf(images, sizeof images, "%s/images-idx3-ubyte", fz_dir());
    snprintf(labels, sizeof labels, "%s/labels-idx1-ubyte", fz_dir());
    fz_write(images, data, split);
    fz_write(labels, data + split, size - split);
    size_t before = fr_mem_total_current(FR_CPU);
    fr_dataset *ds = fr_dataset_load_idx(images, labels);
    if (ds) {
        for (int64_t i = 0; i < ds->n; i++)
            if (fr_dataset_label(ds, i) < 0 || fr_dataset_label(ds, i) >= ds->num_classes)
                abort(); /* the reader's promise */
        fr_dataset_free(ds);
    }
    fz_check_no_leak(before);
    return 0;
}
