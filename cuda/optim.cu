/* optim.cu: optimizer updates on the GPU (kernels.def), in place on a
 * parameter and its state. Each statement mirrors one PyTorch tensor op and
 * rounds where that op does: the __f*_rn intrinsics keep nvcc from fusing a
 * multiply and an add into one FMA (which rounds once), so the GPU follows
 * cpu/optim.c, and torch.optim, step for step. */
#include "internal.h"

__global__ void sgd_kernel(float *w, float *buf, const float *g, size_t n, float lr, float momentum,
                           float keep, float weight_decay, bool nesterov, bool first_step) {
    FR_CUDA_FOR(i, n) {
        float d = g[i];
        if (weight_decay != 0.0f)
            d = __fadd_rn(d, __fmul_rn(weight_decay, w[i]));
        if (momentum != 0.0f) {
            float b = first_step ? d : __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(keep, d));
            buf[i] = b;
            d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, b)) : b;
        }
        w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
    }
}

extern "C" fr_status fr_cuda_sgd_update(float *w, float *buf, const float *g, size_t n, float lr,
                                        float momentum, float dampening, float weight_decay,
                                        bool nesterov, bool first_step) {
    FR_CUDA_RUN_1D(sgd_kernel, n, w, buf, g, n, lr, momentum, 1.0f - dampening,
                                                     weight_decay, nesterov, first_step);
}

__global__ void adam_kernel(float *w, float *m, float *v, const float *g, size_t n,
                            fr_adam_scalars c) {
    FR_CUDA_FOR(i, n) {
        float wi = __fmul_rn(w[i], c.decay);
        float gi = c.l2 != 0.0f ? __fadd_rn(g[i], __fmul_rn(c.l2, wi)) : g[i];
        float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, gi));
        float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]),
                             __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        m[i] = mi;
        v[i] = vi;
        w[i] = __fsub_rn(wi, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    }
}

extern "C" fr_status fr_cuda_adam_update(float *w, float *m, float *v, const float *g, size_t n,
                                         const fr_adam_scalars *s) {
    FR_CUDA_RUN_1D(adam_kernel, n, w, m, v, g, n, *s);
}
