/* cpu/optim.c: optimizer update kernels on the host (kernels.def). Each
 * statement mirrors one PyTorch tensor op and rounds to f32 where that op
 * does, so the results follow torch.optim step for step. SGD's loop is
 * `omp simd` (-O2 leaves it scalar): the same arithmetic per element. */
#include <math.h>

#include "../tensor/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FR_OPTIM_PAR_MIN 32768

fr_status fr_cpu_sgd_update(float *w, float *buf, const float *g, size_t n, float lr, float momentum,
                            float dampening, float weight_decay, bool nesterov, bool first_step) {
    float keep = 1.0f - dampening;
#pragma omp parallel for simd if (n > FR_OPTIM_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (weight_decay != 0.0f)
            d = d + weight_decay * w[i];
        if (momentum != 0.0f) {
            float b = first_step ? d : momentum * buf[i] + keep * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        w[i] = w[i] - lr * d;
    }
    return FR_OK;
}

fr_status fr_cpu_adam_update(float *w, float *m, float *v, const float *g, size_t n,
                             const fr_adam_scalars *s) {
    const fr_adam_scalars c = *s;
#pragma omp parallel for if (n > FR_OPTIM_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float wi = w[i] * c.decay;
        float gi = c.l2 != 0.0f ? g[i] + c.l2 * wi : g[i];
        float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
        float vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - c.step_size * (mi / denom);
    }
    return FR_OK;
}
