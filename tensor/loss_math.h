/* loss_math.h: the pointwise losses' formulas, written once for
 * cpu/loss.c and cuda/loss.cu (internal). PyTorch 1.13's, per element of
 * d = pred - target (x = logits, t = target for BCE):
 *   MSE        d^2                                        grad 2 d
 *   L1         |d|                                        grad sign(d) (0 at 0)
 *   smooth L1  |d| < beta ? 0.5 d^2 / beta : |d| - beta/2 grad |d| < beta ? d / beta : sign(d)
 *              (beta 0: L1)
 *   BCE        max(x, 0) - x t + log1p(exp(-|x|))         grad sigmoid(x) - t
 * BCE's form never exponentiates a positive number, so any logit gives a
 * finite loss. The mean's 1/n is applied by the caller. */
#ifndef FR_LOSS_MATH_H
#define FR_LOSS_MATH_H

#include <math.h>

#include "shapes.h"

#ifdef __CUDACC__
#define FR_LOSS_FN static __host__ __device__ __forceinline__
#else
#define FR_LOSS_FN static inline
#endif

FR_LOSS_FN float fr_loss_value(fr_pointwise_loss kind, float p, float t, float beta) {
    float d = p - t, ad = fabsf(d);
    switch (kind) {
    case FR_LOSS_MSE:
        return d * d;
    case FR_LOSS_SMOOTH_L1:
        if (beta > 0.0f)
            return ad < beta ? 0.5f * d * d / beta : ad - 0.5f * beta;
        return ad;
    case FR_LOSS_BCE_LOGITS:
        return (p > 0.0f ? p : 0.0f) - p * t + log1pf(expf(-fabsf(p)));
    case FR_LOSS_L1:
    default:
        return ad;
    }
}

FR_LOSS_FN float fr_loss_sign(float d) { return d > 0.0f ? 1.0f : d < 0.0f ? -1.0f : d; }

/* dloss / dpred at one element */
FR_LOSS_FN float fr_loss_grad(fr_pointwise_loss kind, float p, float t, float beta) {
    float d = p - t;
    switch (kind) {
    case FR_LOSS_MSE:
        return 2.0f * d;
    case FR_LOSS_SMOOTH_L1:
        if (beta > 0.0f && fabsf(d) < beta)
            return d / beta;
        return fr_loss_sign(d);
    case FR_LOSS_BCE_LOGITS:
        return 1.0f / (1.0f + expf(-p)) - t;
    case FR_LOSS_L1:
    default:
        return fr_loss_sign(d);
    }
}

#endif
