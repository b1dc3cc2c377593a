/* fuzz_st_metadata.c: a safetensors __metadata__ of arbitrary JSON (the
 * input is its value's text) through the reader (io/safetensors.c,
 * io/json.c) and the checkpoint's metadata reader (train/state.c): values
 * that are not strings are kept as keys without a value, keys frugal does
 * not read are noted, the fields it needs are range-checked. */
#include "fuzz_common.h"
#include "train/state.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char head[] = "{\"__metadata__\":";
    static const char tail[] = ",\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    if (size > 60000)
        return 0;
    size_t hlen = sizeof head - 1 + size + sizeof tail - 1;
    uint8_t *file = malloc(8 + hlen + 4);
    if (!file)
        return 0;
    for (int i = 0; i < 8; i++)
        file[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(file + 8, head, sizeof head - 1);
    memcpy(file + 8 + sizeof head - 1, data, size);
    memcpy(file + 8 + sizeof head - 1 + size, tail, sizeof tail - 1);
    memset(file + 8 + hlen, 0, 4);
    const char *path = fz_memfd_path(file, 8 + hlen + 4);
    free(file);
    size_t before = fr_mem_total_current(FR_CPU);
    fr_st_file *f = fr_st_open(path);
    for (int i = 0; f && i < fr_st_metadata_count(f); i++) {
        const char *key = fr_st_metadata_key(f, i), *kind = fr_st_metadata_kind(f, key);
        const char *value = fr_st_metadata(f, key);
        if (!kind || (value != NULL) != !strcmp(kind, "a string"))
            abort(); /* a value exactly when it is a string */
    }
    fr_st_close(f);
    fr_state_info info;
    (void)fr_state_read_info(path, &info);
    fz_check_no_leak(before);
    return 0;
}
