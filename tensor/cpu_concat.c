/* cpu_concat.c: the channel copy behind concat and its backward. */
#include <string.h>

#include "kernels.h"

/* Below this many floats copied, one thread is faster. */
#define FR_CONCAT_PAR_MIN 65536

fr_status fr_cpu_copy_channels(float *dst, int dst_c, int dst_c0, const float *src, int src_c,
                               int src_c0, int count, int n, int hw) {
    /* Within one sample the `count` channels are adjacent in both buffers,
     * so each sample is a single block copy. */
    size_t block = (size_t)count * (size_t)hw;
    size_t total = block * (size_t)n;
#pragma omp parallel for if (total > FR_CONCAT_PAR_MIN && n > 1) schedule(static)
    for (int i = 0; i < n; i++) {
        float *d = dst + ((size_t)i * (size_t)dst_c + (size_t)dst_c0) * (size_t)hw;
        const float *s = src + ((size_t)i * (size_t)src_c + (size_t)src_c0) * (size_t)hw;
        memcpy(d, s, block * sizeof *d);
    }
    return FR_OK;
}
