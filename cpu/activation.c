/* cpu/activation.c: the activation kernels on the host, one loop per
 * activation made from the formulas of tensor/activation.h.
 *
 * Backward reads s: the output y for the activations whose gradient needs
 * only the output (shapes.h: FR_ACT_NEEDS_OUTPUT), else the input x. Every
 * loop reads element i before writing element i, which makes y == x and
 * dx == dy safe (also vectorised: a vector's elements are all read before
 * any is written).
 *
 * The loops are `simd`: -O2 leaves them scalar, and ReLU's scalar select
 * compiles to a branch on the sign, which a random sign mispredicts half the
 * time (relu forward + backward were 17% of a ResNet-20 training step at
 * one thread, perf, 2026-12-01). The vector form is a compare and a blend;
 * FR_SELECT_BLEND (simd.h) lets leaky ReLU's product arm be one too. The
 * transcendental activations stay scalar calls (no -ffast-math, so no
 * vector expf), the same calls as the fused batch-norm kernels make. */
#include "../tensor/activation.h"
#include "../tensor/kernels.h"
#include "simd.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_ACT_PAR_MIN 32768

FR_SELECT_BLEND fr_status fr_cpu_act_forward(float *y, const float *x, fr_act act, float p,
                                             size_t n) {
    switch (act) {
#define FR_ACT_FWD_(NAME, name, needs, inv)                                     \
    case FR_ACT_##NAME: {                                                       \
        _Pragma("omp parallel for simd if (n > FR_ACT_PAR_MIN) schedule(static)") \
        for (size_t i = 0; i < n; i++)                                          \
            y[i] = fr_act_fwd_##NAME(x[i], p);                          \
        break;                                                                  \
    }
        FR_ACT_LIST(FR_ACT_FWD_)
#undef FR_ACT_FWD_
    default:
        return fr_error(FR_ERR_ARG, "activation: unknown activation %d", (int)act);
    }
    return FR_OK;
}

FR_SELECT_BLEND fr_status fr_cpu_act_backward(float *dx, const float *dy, const float *s,
                                              fr_act act, float p, size_t n) {
    switch (act) {
#define FR_ACT_BWD_(NAME, name, needs, inv)                                     \
    case FR_ACT_##NAME: {                                                       \
        _Pragma("omp parallel for simd if (n > FR_ACT_PAR_MIN) schedule(static)") \
        for (size_t i = 0; i < n; i++)                                          \
            dx[i] = fr_act_grad_##NAME(dy[i], s[i], p);                 \
        break;                                                                  \
    }
        FR_ACT_LIST(FR_ACT_BWD_)
#undef FR_ACT_BWD_
    default:
        return fr_error(FR_ERR_ARG, "activation_backward: unknown activation %d", (int)act);
    }
    return FR_OK;
}
