/* activation.h: every activation's formulas, written once (internal).
 *
 * The list and its properties are in shapes.h (FR_ACT_LIST). Each function
 * pair is two small always-inlined functions; the kernels write one loop
 * per activation by expanding FR_ACT_LIST, each calling its own pair, so
 * the loop keeps its vector form where the formula has one (ReLU and leaky
 * ReLU: a compare and a blend). Used by the plain kernels (cpu/activation.c,
 * cuda/activation.cu), the fused batch norm + activation (cpu/batchnorm.c,
 * cuda/batchnorm.cu) and InPlace-ABN's inversion (cpu/abn.c, cuda/abn.cu),
 * so the fused and plain paths compute the same bits.
 *
 * The formulas are PyTorch 1.13's (docs/MODELS.md, Activations), in f32.
 * NaN propagates as in PyTorch: relu is `v < 0 ? 0 : v` (a NaN fails the
 * test and stays), the clamps of the hard functions are selects that keep
 * a NaN, and the gradients pass a NaN through.
 *
 * Adding an activation: one line in FR_ACT_LIST (shapes.h) and its two
 * functions here, fr_act_fwd_<NAME> and fr_act_grad_<NAME> (and a case in
 * fr_act_inv if it is invertible). */
#ifndef FR_ACTIVATION_H
#define FR_ACTIVATION_H

#include <math.h>
#include <stdint.h>

#include "shapes.h"

#ifdef __CUDACC__
#define FR_ACT_FN static __host__ __device__ __forceinline__
#else
#define FR_ACT_FN static inline __attribute__((always_inline))
#endif
/* a product the GPU compiler must not fuse into an FMA with what follows
 * (InPlace-ABN's inversion rounds as the host does) */
#ifdef __CUDA_ARCH__
#define FR_ACT_MUL_RN(a, b) __fmul_rn(a, b)
#else
#define FR_ACT_MUL_RN(a, b) ((a) * (b))
#endif

FR_ACT_FN fr_act_needs fr_act_needs_of(fr_act a) {
    switch (a) {
#define FR_ACT_NEEDS_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                      \
        return needs;
        FR_ACT_LIST(FR_ACT_NEEDS_)
#undef FR_ACT_NEEDS_
    default:
        return FR_ACT_NEEDS_INPUT;
    }
}

FR_ACT_FN int fr_act_invertible(fr_act a) {
    switch (a) {
#define FR_ACT_INV_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                    \
        return inv;
        FR_ACT_LIST(FR_ACT_INV_)
#undef FR_ACT_INV_
    default:
        return 0;
    }
}

/* GELU's constants: 1 / sqrt(2), 1 / sqrt(2 pi), sqrt(2 / pi) */
#define FR_ACT_SQRT1_2 0.70710678118654752440f
#define FR_ACT_INV_SQRT_2PI 0.39894228040143267794f
#define FR_ACT_SQRT_2_PI 0.79788456080286535588f
#define FR_ACT_GELU_KAPPA 0.044715f

/* relu6(v + 3), the hard functions' clamp, a NaN kept */
FR_ACT_FN float fr_act_relu6_3(float v) {
    float t = v + 3.0f;
    t = t < 0.0f ? 0.0f : t;
    return t > 6.0f ? 6.0f : t;
}

/* e^x in f32 arithmetic alone, so that the host's activation loops
 * vectorise (libm's expf is a call per element: SiLU forward and backward
 * were 18% of a one-thread training step of the MobileNet example, perf,
 * bench/RESULTS.md, issue 21). x = n ln2 + r with n rounded to nearest by
 * the 1.5 * 2^23 shifter and ln2 split in two (the high part has 15
 * significant bits, so n * high is exact); e^r by its Taylor series to r^7
 * (|r| <= ln2 / 2: the first term left out is below 6e-9 relative), then
 * times 2^(n-1) * 2, so n = 128 near the top of the range still fits.
 * Within 1.3 ulp of e^x (measured against double exp over [-86.5, 88.7]);
 * below -86.5 it returns 0 (e^x < 3e-38: 1 + e^x is 1 either way), above
 * ln(FLT_MAX) infinity; a NaN stays NaN. The GPU keeps its own expf. Every
 * host path (plain, fused with a norm, recomputed) calls this one. */
FR_ACT_FN float fr_act_exp(float x) {
#ifdef __CUDA_ARCH__
    return expf(x);
#else
    const float shifter = 12582912.0f;
    union {
        float f;
        uint32_t u;
    } t = {.f = x * 1.44269504088896341f + shifter}, scale;
    float n = t.f - shifter;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606820309417232e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    scale.u = (t.u - 0x4B400000u + 126u) << 23; /* unsigned: out-of-range x wraps, then is replaced */
    float y = p * scale.f * 2.0f;
    y = x > 88.72283935546875f ? INFINITY : y;
    return x < -86.5f ? 0.0f : y;
#endif
}

FR_ACT_FN float fr_act_sigmoid(float v) { return 1.0f / (1.0f + fr_act_exp(-v)); }

/* Each activation: fr_act_fwd_<NAME>(v, p) = act(v), and
 * fr_act_grad_<NAME>(g, s, p) = g * act'(x) from s = y when it needs its
 * output (shapes.h), s = x when it needs its input. p is the slope (leaky
 * ReLU) or alpha (ELU). Small separate functions, so that each kernel's
 * loop inlines its own and vectorises where it can. */

FR_ACT_FN float fr_act_fwd_IDENTITY(float v, float p) { (void)p; return v; }
FR_ACT_FN float fr_act_grad_IDENTITY(float g, float s, float p) { (void)s, (void)p; return g; }

FR_ACT_FN float fr_act_fwd_RELU(float v, float p) { (void)p; return v < 0.0f ? 0.0f : v; }
/* PyTorch's threshold_backward: 0 at y == 0, a NaN passes */
FR_ACT_FN float fr_act_grad_RELU(float g, float s, float p) { (void)p; return s <= 0.0f ? 0.0f : g; }

/* the product computed for every element: a blend, not a branch */
FR_ACT_FN float fr_act_fwd_LEAKY_RELU(float v, float p) {
    float leak = v * p;
    return v > 0.0f ? v : leak;
}
FR_ACT_FN float fr_act_grad_LEAKY_RELU(float g, float s, float p) {
    float leak = g * p;
    return s > 0.0f ? g : leak;
}

FR_ACT_FN float fr_act_fwd_ELU(float v, float p) { return v > 0.0f ? v : p * expm1f(v); }
/* from y: alpha * e^x = y + alpha */
FR_ACT_FN float fr_act_grad_ELU(float g, float s, float p) { return s > 0.0f ? g : g * (s + p); }

FR_ACT_FN float fr_act_fwd_GELU(float v, float p) {
    (void)p;
    return v * 0.5f * (1.0f + erff(v * FR_ACT_SQRT1_2));
}
FR_ACT_FN float fr_act_grad_GELU(float g, float s, float p) {
    (void)p;
    float cdf = 0.5f * (1.0f + erff(s * FR_ACT_SQRT1_2));
    float pdf = expf(-0.5f * s * s) * FR_ACT_INV_SQRT_2PI;
    return g * (cdf + s * pdf);
}

FR_ACT_FN float fr_act_fwd_GELU_TANH(float v, float p) {
    (void)p;
    float inner = FR_ACT_SQRT_2_PI * (v + FR_ACT_GELU_KAPPA * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
}
FR_ACT_FN float fr_act_grad_GELU_TANH(float g, float s, float p) {
    (void)p;
    float s2 = s * s;
    float t = tanhf(FR_ACT_SQRT_2_PI * (s + FR_ACT_GELU_KAPPA * s2 * s));
    float dinner = FR_ACT_SQRT_2_PI * (1.0f + 3.0f * FR_ACT_GELU_KAPPA * s2);
    return g * (0.5f * (1.0f + t) + 0.5f * s * (1.0f - t * t) * dinner);
}

FR_ACT_FN float fr_act_fwd_SILU(float v, float p) { (void)p; return v / (1.0f + fr_act_exp(-v)); }
FR_ACT_FN float fr_act_grad_SILU(float g, float s, float p) {
    (void)p;
    float sg = fr_act_sigmoid(s);
    return g * sg * (1.0f + s * (1.0f - sg));
}

FR_ACT_FN float fr_act_fwd_SIGMOID(float v, float p) { (void)p; return fr_act_sigmoid(v); }
/* from y */
FR_ACT_FN float fr_act_grad_SIGMOID(float g, float s, float p) { (void)p; return g * (1.0f - s) * s; }

FR_ACT_FN float fr_act_fwd_TANH(float v, float p) { (void)p; return tanhf(v); }
/* from y */
FR_ACT_FN float fr_act_grad_TANH(float g, float s, float p) { (void)p; return g * (1.0f - s * s); }

FR_ACT_FN float fr_act_fwd_HARDSWISH(float v, float p) { (void)p; return v * fr_act_relu6_3(v) / 6.0f; }
FR_ACT_FN float fr_act_grad_HARDSWISH(float g, float s, float p) {
    (void)p;
    return s < -3.0f ? 0.0f : s <= 3.0f ? g * (s / 3.0f + 0.5f) : g;
}

FR_ACT_FN float fr_act_fwd_HARDSIGMOID(float v, float p) { (void)p; return fr_act_relu6_3(v) / 6.0f; }
FR_ACT_FN float fr_act_grad_HARDSIGMOID(float g, float s, float p) {
    (void)p;
    return s > -3.0f && s < 3.0f ? g / 6.0f : 0.0f;
}

/* beta 1, threshold 20 (nn.Softplus's defaults) */
FR_ACT_FN float fr_act_fwd_SOFTPLUS(float v, float p) {
    (void)p;
    return v > 20.0f ? v : log1pf(expf(v));
}
FR_ACT_FN float fr_act_grad_SOFTPLUS(float g, float s, float p) {
    (void)p;
    float z = expf(s);
    return s > 20.0f ? g : g * z / (z + 1.0f);
}

/* x * tanh(softplus(x)), softplus without threshold as PyTorch's mish */
FR_ACT_FN float fr_act_fwd_MISH(float v, float p) {
    (void)p;
    return v * tanhf(log1pf(expf(v)));
}
FR_ACT_FN float fr_act_grad_MISH(float g, float s, float p) {
    (void)p;
    float t = tanhf(log1pf(expf(s)));
    return g * (t + s * fr_act_sigmoid(s) * (1.0f - t * t));
}

/* The same by a run-time activation (a GPU thread, a scalar caller). */
FR_ACT_FN float fr_act_fwd(fr_act a, float v, float p) {
    switch (a) {
#define FR_ACT_FWD_CASE_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                         \
        return fr_act_fwd_##NAME(v, p);
        FR_ACT_LIST(FR_ACT_FWD_CASE_)
#undef FR_ACT_FWD_CASE_
    default:
        return v;
    }
}

FR_ACT_FN float fr_act_grad(fr_act a, float g, float s, float p) {
    switch (a) {
#define FR_ACT_GRAD_CASE_(NAME, name, needs, inv) \
    case FR_ACT_##NAME:                          \
        return fr_act_grad_##NAME(g, s, p);
        FR_ACT_LIST(FR_ACT_GRAD_CASE_)
#undef FR_ACT_GRAD_CASE_
    default:
        return g;
    }
}

/* x from y = act(x), for the invertible activations (identity, leaky
 * ReLU with p > 0): the reciprocal of the slope is taken once per call
 * (hoisted out of a loop) and multiplied, as InPlace-ABN's inversion
 * always has. */
FR_ACT_FN float fr_act_inv(fr_act a, float y, float p) {
    if (a != FR_ACT_LEAKY_RELU)
        return y;
    float unleak = FR_ACT_MUL_RN(y, 1.0f / p);
    return y >= 0.0f ? y : unleak;
}

#endif
