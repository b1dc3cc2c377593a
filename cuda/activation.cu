/* activation.cu: the activations on the GPU, the formulas of
 * tensor/activation.h (shared with cpu/activation.c; NaN and -0 as
 * PyTorch). Backward reads s: the output y where the gradient needs only
 * the output (shapes.h), else the input. Each thread reads element i before
 * writing it: y may be x, dx may be dy. The activation is a template
 * argument, so each kernel is one activation's loop. */
#include "internal.h"
#include "../tensor/activation.h"

template <fr_act A> __global__ void act_forward_kernel(float *y, const float *x, float p, size_t n) {
    FR_CUDA_FOR(i, n) y[i] = fr_act_fwd(A, x[i], p);
}

template <fr_act A>
__global__ void act_backward_kernel(float *dx, const float *dy, const float *s, float p, size_t n) {
    FR_CUDA_FOR(i, n) dx[i] = fr_act_grad(A, dy[i], s[i], p);
}

extern "C" fr_status fr_cuda_act_forward(float *y, const float *x, fr_act act, float p, size_t n) {
    switch (act) {
#define FR_ACT_FWD_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                    \
        FR_CUDA_RUN_1D(act_forward_kernel<FR_ACT_##NAME>, n, y, x, p, n);
        FR_ACT_LIST(FR_ACT_FWD_)
#undef FR_ACT_FWD_
    default:
        return fr_error(FR_ERR_ARG, "activation: unknown activation %d", (int)act);
    }
}

extern "C" fr_status fr_cuda_act_backward(float *dx, const float *dy, const float *s, fr_act act,
                                          float p, size_t n) {
    switch (act) {
#define FR_ACT_BWD_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                    \
        FR_CUDA_RUN_1D(act_backward_kernel<FR_ACT_##NAME>, n, dx, dy, s, p, n);
        FR_ACT_LIST(FR_ACT_BWD_)
#undef FR_ACT_BWD_
    default:
        return fr_error(FR_ERR_ARG, "activation_backward: unknown activation %d", (int)act);
    }
}
