/* layers.h: layers with parameters, their initialisation, and the RNG.
 *
 * A layer is a small struct of BORROWED tensor pointers into a parameter
 * registry (params.h) plus its settings. `_init` creates and registers the
 * tensors under "<name>.weight" etc. and initialises them; there is no
 * `_free`: the registry owns the tensors. `_forward` takes its input borrowed
 * and returns a NEW reference (or NULL with fr_last_error() set).
 *
 * NULL in, NULL out: a forward given NULL returns NULL under the one NULL
 * convention of every function and layer (fr_error_null in tensor/fr_base.h):
 * the pending first error is kept, its status unchanged, its message inside
 * the new one. With fr_chain this keeps model code short and leak-free while
 * the first error (the one that matters) survives:
 *
 *     fr_tensor *y = fr_conv2d_layer_forward(&l->conv, x);
 *     y = fr_chain(y, fr_batch_norm2d_layer_forward(&l->bn, y, training));
 *     if (!y) return NULL;   // fr_last_error() says what failed first
 *
 * Initialisation follows common PyTorch practice for CIFAR ResNets:
 * convolutions kaiming-normal (fan_out, relu gain): std = sqrt(2 / (K*R*S));
 * BatchNorm weight 1, bias 0, running mean 0, running var 1; Linear (and a
 * convolution's bias) as PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
#ifndef FR_LAYERS_H
#define FR_LAYERS_H

#include "../autograd/functions.h"
#include "../tensor/rng.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RNG draws (nn/init.c) ----
 * fr_rng is the SplitMix64 stream of tensor/rng.h. Uniforms take the top 53
 * bits (double, [0, 1)); normals use Box-Muller on two uniforms (the cosine
 * branch only, one normal per two draws), in double, then round to float.
 * Weights are therefore the same on every platform with an IEEE libm. */
double fr_rng_uniform(fr_rng *rng);  /* [0, 1) */
double fr_rng_normal(fr_rng *rng);   /* mean 0, std 1 */

/* Fill a CPU f32 tensor (initialisers of nn/init.c). */
fr_status fr_init_normal_(fr_tensor *t, double mean, double std, fr_rng *rng);
fr_status fr_init_uniform_(fr_tensor *t, double low, double high, fr_rng *rng);

/* ---- chaining ---- */
/* Releases prev and returns next: `x = fr_chain(x, fr_relu(x))`. */
static inline fr_tensor *fr_chain(fr_tensor *prev, fr_tensor *next) {
    fr_release(prev);
    return next;
}

/* ---- Conv2d, groups 1, square kernel ---- */
typedef struct {
    fr_tensor *weight;  /* (K, C, R, R) */
    fr_tensor *bias;    /* (K), or NULL */
    fr_conv_params p;
} fr_conv2d_layer;

fr_status fr_conv2d_layer_init(fr_conv2d_layer *l, fr_params *params, const char *name, int in_channels,
                               int out_channels, int kernel, int stride, int pad, bool bias, fr_rng *rng);
fr_tensor *fr_conv2d_layer_forward(const fr_conv2d_layer *l, fr_tensor *x);

/* ---- BatchNorm2d (also takes (N, C) input) ---- */
typedef struct {
    fr_tensor *weight, *bias;               /* (C) */
    fr_tensor *running_mean, *running_var;  /* (C) buffers */
    fr_tensor *num_batches_tracked;         /* 0-d i32 buffer on the CPU */
    float momentum, eps;                    /* 0.1, 1e-5 */
} fr_batch_norm2d_layer;

fr_status fr_batch_norm2d_layer_init(fr_batch_norm2d_layer *l, fr_params *params, const char *name,
                                    int channels);
/* training: batch statistics, running statistics updated, counter bumped;
 * else: running statistics. A strategy that re-runs a forward to recompute
 * activations must not come through here a second time (it would update the
 * running statistics twice). */
fr_tensor *fr_batch_norm2d_layer_forward(const fr_batch_norm2d_layer *l, fr_tensor *x, bool training);
/* The layer's tensors as fused ops take them (autograd/functions.h). */
fr_bn_state fr_batch_norm2d_layer_state(const fr_batch_norm2d_layer *l, bool training);
/* Bumps num_batches_tracked (not during a checkpoint replay); fused paths
 * that bypass fr_batch_norm2d_layer_forward call it themselves. */
void fr_batch_norm2d_layer_count_batch(const fr_batch_norm2d_layer *l);

/* ---- Linear: y (N, OUT) = x (N, IN) W^T + b ---- */
typedef struct {
    fr_tensor *weight;  /* (OUT, IN) */
    fr_tensor *bias;    /* (OUT), or NULL */
} fr_linear_layer;

fr_status fr_linear_layer_init(fr_linear_layer *l, fr_params *params, const char *name, int in_features,
                               int out_features, bool bias, fr_rng *rng);
fr_tensor *fr_linear_layer_forward(const fr_linear_layer *l, fr_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
