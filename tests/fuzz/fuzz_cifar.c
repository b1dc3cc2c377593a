/* fuzz_cifar.c: the CIFAR-10 and CIFAR-100 binary readers (data/dataset.c).
 * The first byte picks the format (even: CIFAR-10 test_batch.bin, odd:
 * CIFAR-100 test.bin); the rest is the file. */
#include "fuzz_common.h"
#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    bool c100 = data[0] & 1;
    char path[128];
    snprintf(path, sizeof path, "%s/%s", fz_dir(), c100 ? "test.bin" : "test_batch.bin");
    fz_write(path, data + 1, size - 1);
    size_t before = fr_mem_total_current(FR_CPU);
    fr_dataset *ds = c100 ? fr_dataset_load_cifar100(fz_dir(), false) : fr_dataset_load_cifar10(fz_dir(), false);
    if (ds) {
        for (int64_t i = 0; i < ds->n; i++)
            if (fr_dataset_label(ds, i) < 0 || fr_dataset_label(ds, i) >= ds->num_classes)
                abort();
        fr_dataset_free(ds);
    }
    remove(path);
    fz_check_no_leak(before);
    return 0;
}
