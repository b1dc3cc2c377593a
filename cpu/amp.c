/* cpu/amp.c: the gradient checks of dynamic loss scaling on the host. */
#include <string.h>

#include "../tensor/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_PAR_MIN 32768

/* inf and NaN are the values whose exponent bits are all ones; testing the
 * bits keeps the answer right whatever floating-point flags a build uses. */
static inline bool nonfinite(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x7f800000u) == 0x7f800000u;
}

fr_status fr_cpu_nonfinite_count(float *count, const float *x, size_t n) {
    size_t found = 0;
#pragma omp parallel for if (n > FR_PAR_MIN) reduction(+ : found) schedule(static)
    for (size_t i = 0; i < n; i++)
        found += nonfinite(x[i]);
    count[0] += (float)found;
    return FR_OK;
}

fr_status fr_cpu_unscale(float *y, float inv_scale, size_t n) {
#pragma omp parallel for if (n > FR_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] *= inv_scale;
    return FR_OK;
}
