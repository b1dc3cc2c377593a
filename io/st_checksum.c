/* st_checksum.c: the CRC-32s of a safetensors file's checksum field; see
 * st_checksum.h, and io/safetensors.h for what each covers. */
#include "st_checksum.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

uint32_t fr_st_crc_update(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    uLong c = crc;
    while (n > 0) {
        uInt piece = n > UINT_MAX ? UINT_MAX : (uInt)n;
        c = crc32(c, b, piece);
        b += piece;
        n -= piece;
    }
    return (uint32_t)c;
}

/* s and its terminating 0 byte: the separator of every covered string. */
static uint32_t crc_str(uint32_t crc, const char *s) {
    return fr_st_crc_update(crc, s, strlen(s) + 1);
}

uint32_t fr_st_crc_begin(const char *name, const char *dtype, int ndim, const int64_t *shape) {
    char dims[FR_MAX_DIMS * 21 + 1] = "";
    size_t used = 0;
    for (int d = 0; d < ndim && d < FR_MAX_DIMS; d++)
        used += (size_t)snprintf(dims + used, sizeof dims - used, d ? ",%lld" : "%lld", (long long)shape[d]);
    return crc_str(crc_str(crc_str(0, name), dtype), dims);
}

/* Orders pointers into a key array by the keys they point to. */
static int key_cmp(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

fr_status fr_st_crc_metadata(int n, char *const *keys, char *const *vals, const char *skip, uint32_t *out) {
    /* Sorted, not in file order: the safetensors package keeps metadata in a
     * hash map, so a file another tool writes anew may list it in any order. */
    char *const **order = malloc(((size_t)n + 1) * sizeof *order);
    if (!order)
        return fr_error(FR_ERR_OOM, "safetensors: out of memory checksumming the metadata");
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!skip || strcmp(keys[i], skip))
            order[m++] = &keys[i];
    qsort(order, (size_t)m, sizeof *order, key_cmp);
    uint32_t crc = 0;
    for (int i = 0; i < m; i++)
        crc = crc_str(crc_str(crc, *order[i]), vals[order[i] - keys]);
    free(order);
    *out = crc;
    return FR_OK;
}

char *fr_st_sums_format(const uint32_t *sums, int n) {
    char *text = malloc((size_t)n * 9 + 1);
    if (!text)
        return NULL;
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(text + used, (size_t)n * 9 + 1 - used, i ? " %08x" : "%08x", (unsigned)sums[i]);
    return text;
}

bool fr_st_sums_parse(const char *text, uint32_t *sums, int n) {
    if (strlen(text) != (size_t)n * 9 - 1)
        return false;
    for (int i = 0; i < n; i++) {
        const char *p = text + (size_t)i * 9;
        uint32_t v = 0;
        for (int k = 0; k < 8; k++) {
            char c = p[k];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
                return false;
            v = v << 4 | (uint32_t)(c <= '9' ? c - '0' : c - 'a' + 10);
        }
        if (i + 1 < n && p[8] != ' ')
            return false;
        sums[i] = v;
    }
    return true;
}
