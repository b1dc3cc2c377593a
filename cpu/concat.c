/* cpu/concat.c: the channel copy behind concat and its backward. */
#include <string.h>

#include "../tensor/kernels.h"

/* Below this many floats' worth of bytes copied, one thread is faster. */
#define FR_CONCAT_PAR_MIN 65536

fr_status fr_cpu_copy_channels(void *dst, int dst_c, int dst_c0, const void *src, int src_c,
                               int src_c0, int count, int n, int hw, size_t elem_size) {
    /* Within one sample the `count` channels are adjacent in both buffers,
     * so each sample is a single block copy. */
    size_t block = (size_t)count * (size_t)hw * elem_size; // bytes per sample
    size_t total = block * (size_t)n / sizeof(float);
#pragma omp parallel for if (total > FR_CONCAT_PAR_MIN && n > 1) schedule(static)
    for (int i = 0; i < n; i++) {
        char *d = (char *)dst + ((size_t)i * (size_t)dst_c + (size_t)dst_c0) * (size_t)hw * elem_size;
        const char *s =
            (const char *)src + ((size_t)i * (size_t)src_c + (size_t)src_c0) * (size_t)hw * elem_size;
        memcpy(d, s, block);
    }
    return FR_OK;
}
