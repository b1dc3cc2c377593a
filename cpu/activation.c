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
 * FR_SELECT_BLEND (simd.h) lets leaky ReLU's product arm be one too. SiLU
 * and sigmoid vectorise through fr_act_exp (activation.h); the other
 * transcendental activations stay scalar libm calls (no -ffast-math, so no
 * vector expf), the same calls as the fused batch-norm kernels make. */
#include "../tensor/activation.h"
#include "../tensor/kernels.h"
#include "simd.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_ACT_PAR_MIN 32768
/* The loops run over chunks of this many elements, each chunk a call. */
#define FR_ACT_CHUNK 16384

/* Each activation's loop over one chunk is a small function built twice,
 * for AVX2 and the portable baseline (SSE2), the copy picked at load time
 * as cpu/batchnorm.c's are: SiLU's forward and backward are a division and
 * fr_act_exp's polynomial per element, compute-bound at four lanes. Both
 * copies round alike (no FMA: -std=c11 forbids contraction), so the plain
 * kernels still compute the fused batch norm's bits. */
#define FR_ACT_VEC __attribute__((target_clones("avx2", "default"))) FR_SELECT_BLEND

#define FR_ACT_CHUNK_FNS_(NAME, name, needs, inv)                                        \
    FR_ACT_VEC static void fwd_##NAME(float *y, const float *x, float p, size_t n) {       \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) y[i] = fr_act_fwd_##NAME(x[i], p); \
    }                                                                                   \
    FR_ACT_VEC static void bwd_##NAME(float *dx, const float *dy, const float *s, float p, \
                                      size_t n) {                                       \
        _Pragma("omp simd") for (size_t i = 0; i < n; i++) dx[i] =                      \
            fr_act_grad_##NAME(dy[i], s[i], p);                                         \
    }
FR_ACT_LIST(FR_ACT_CHUNK_FNS_)
#undef FR_ACT_CHUNK_FNS_

/* the number of chunks of n elements, and chunk k's start and length */
static size_t chunks(size_t n) { return (n + FR_ACT_CHUNK - 1) / FR_ACT_CHUNK; }
static size_t chunk_len(size_t n, size_t k) {
    size_t rest = n - k * FR_ACT_CHUNK;
    return rest < FR_ACT_CHUNK ? rest : FR_ACT_CHUNK;
}

fr_status fr_cpu_act_forward(float *y, const float *x, fr_act act, float p, size_t n) {
    const size_t nc = chunks(n);
    switch (act) {
#define FR_ACT_FWD_(NAME, name, needs, inv)                                         \
    case FR_ACT_##NAME: {                                                           \
        _Pragma("omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)")        \
        for (size_t k = 0; k < nc; k++)                                      \
            fwd_##NAME(y + k * FR_ACT_CHUNK, x + k * FR_ACT_CHUNK, p, chunk_len(n, k)); \
        break;                                                                      \
    }
        FR_ACT_LIST(FR_ACT_FWD_)
#undef FR_ACT_FWD_
    default:
        return fr_error(FR_ERR_ARG, "activation: unknown activation %d", (int)act);
    }
    return FR_OK;
}

fr_status fr_cpu_act_backward(float *dx, const float *dy, const float *s, fr_act act, float p,
                              size_t n) {
    const size_t nc = chunks(n);
    switch (act) {
#define FR_ACT_BWD_(NAME, name, needs, inv)                                          \
    case FR_ACT_##NAME: {                                                            \
        _Pragma("omp parallel for if (n > FR_ACT_PAR_MIN) schedule(static)")         \
        for (size_t k = 0; k < nc; k++)                                       \
            bwd_##NAME(dx + k * FR_ACT_CHUNK, dy + k * FR_ACT_CHUNK, s + k * FR_ACT_CHUNK, \
                       p, chunk_len(n, k));                                          \
        break;                                                                       \
    }
        FR_ACT_LIST(FR_ACT_BWD_)
#undef FR_ACT_BWD_
    default:
        return fr_error(FR_ERR_ARG, "activation_backward: unknown activation %d", (int)act);
    }
    return FR_OK;
}
