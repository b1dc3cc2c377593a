/* fuzz_safetensors.c: the safetensors reader (io/safetensors.c, io/json.c)
 * on arbitrary bytes: open, list, read every tensor and a metadata key. */
#include "fuzz_common.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t before = fr_mem_total_current(FR_CPU);
    fr_st_file *f = fr_st_open(fz_memfd_path(data, size));
    for (int i = 0; f && i < fr_st_count(f); i++) {
        const char *name = fr_st_name(f, i);
        if (fr_st_find(f, name) != i)
            abort(); /* names are unique and found again */
        (void)fr_st_dtype(f, i);
        (void)fr_st_shape(f, i);
        fr_release(fr_st_get(f, name, FR_CPU, FR_TAG_WORKSPACE));
    }
    (void)fr_st_metadata(f, "format");
    fr_st_close(f);
    fz_check_no_leak(before);
    return 0;
}
