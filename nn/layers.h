/* layers.h: the layers with parameters that the build API's layer modules
 * hold (nn/module_impl.h); internal to the engine, not installed: a program
 * writes its layers with nn/build.h.
 *
 * A layer is a small struct of BORROWED tensor pointers into a parameter
 * registry (params.h) plus its settings. `_init` creates and registers the
 * tensors under "<name>.weight" etc. and initialises them; there is no
 * `_free`: the registry owns the tensors. `_forward` takes its input borrowed
 * and returns a NEW reference (or NULL with fr_last_error() set).
 *
 * NULL in, NULL out: a forward given NULL returns NULL under the one NULL
 * convention of every function and layer (fr_error_null in tensor/fr_base.h),
 * so layer calls chain with fr_chain (nn/build.h). Initialisation: nn/init.h. */
#ifndef FR_LAYERS_H
#define FR_LAYERS_H

#include "../autograd/functions.h"
#include "init.h"
#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Conv2d, square kernel. in_channels is the weight's C (C/groups for
 * a grouped layer: set p.groups after init, as fr_conv2d_new does) ---- */
typedef struct {
    fr_tensor *weight;  /* (K, C/groups, R, R) */
    fr_tensor *bias;    /* (K), or NULL */
    fr_conv_params p;
} fr_conv2d_layer;

fr_status fr_conv2d_layer_init(fr_conv2d_layer *l, fr_params *params, const char *name, int in_channels,
                               int out_channels, int kernel, int stride, int pad, bool bias, fr_rng *rng);
fr_tensor *fr_conv2d_layer_forward(const fr_conv2d_layer *l, fr_tensor *x);

/* ---- ConvTranspose2d, square kernel: PyTorch's layout and default
 * initialisation (weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
 * fan_in = Cout/groups * R * R, the weight's dims after the first) ---- */
typedef struct {
    fr_tensor *weight;  /* (Cin, Cout/groups, R, R) */
    fr_tensor *bias;    /* (Cout), or NULL */
    fr_conv_transpose_params p;
} fr_conv_transpose2d_layer;

fr_status fr_conv_transpose2d_layer_init(fr_conv_transpose2d_layer *l, fr_params *params,
                                         const char *name, int in_channels, int out_channels,
                                         int kernel, fr_conv_transpose_params p, bool bias,
                                         fr_rng *rng);
fr_tensor *fr_conv_transpose2d_layer_forward(const fr_conv_transpose2d_layer *l, fr_tensor *x);

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

/* ---- GroupNorm (layer and instance norm are its cases) ---- */
typedef struct {
    fr_tensor *weight, *bias;   /* (C) */
    int groups;
    float eps;                  /* 1e-5 */
} fr_group_norm_layer;

/* weight 1, bias 0; FR_ERR_ARG naming the layer when groups does not
 * divide channels */
fr_status fr_group_norm_layer_init(fr_group_norm_layer *l, fr_params *params, const char *name,
                                   int channels, int groups);

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
