/* blocks.h: the few compositions every CNN here is built from, and the ONE
 * place where a memory strategy (model.h) changes how they run.
 *
 * Models call these instead of chaining BN, add and ReLU themselves, so a new
 * strategy (recompute, InPlace-ABN, checkpointing) is a change in
 * nn/blocks.c, not in every model. Like the layers, each takes its tensors
 * borrowed, returns a NEW reference, and returns NULL without touching the
 * error when a tensor argument is NULL (layers.h: NULL in, NULL out).
 *
 * Why INPLACE is legal: BatchNorm's backward needs its input, never its
 * output, and ReLU's backward needs only its output; so BN's output may be
 * overwritten by the residual add and the ReLU, saving one activation-sized
 * tensor per ReLU. */
#ifndef FR_BLOCKS_H
#define FR_BLOCKS_H

#include "layers.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* relu(bn(x)) */
fr_tensor *fr_bn_relu(const fr_batchnorm2d_layer *bn, fr_tensor *x, bool training,
                      const fr_model_cfg *cfg);
/* relu(bn(x) + shortcut) */
fr_tensor *fr_bn_add_relu(const fr_batchnorm2d_layer *bn, fr_tensor *x, fr_tensor *shortcut, bool training,
                          const fr_model_cfg *cfg);
/* bn(conv(x)) */
fr_tensor *fr_conv_bn(const fr_conv2d_layer *conv, const fr_batchnorm2d_layer *bn, fr_tensor *x,
                      bool training, const fr_model_cfg *cfg);
/* relu(bn(conv(x))) */
fr_tensor *fr_conv_bn_relu(const fr_conv2d_layer *conv, const fr_batchnorm2d_layer *bn, fr_tensor *x,
                           bool training, const fr_model_cfg *cfg);
/* conv(relu(bn(x))): the pre-activation unit */
fr_tensor *fr_bn_relu_conv(const fr_batchnorm2d_layer *bn, const fr_conv2d_layer *conv, fr_tensor *x,
                           bool training, const fr_model_cfg *cfg);
/* y + shortcut. INPLACE writes into y, so y must be an output no op saved
 * (a convolution's or BN's: both save their input). */
fr_tensor *fr_residual_add(fr_tensor *y, fr_tensor *shortcut, const fr_model_cfg *cfg);
/* (N, C, H, W) -> (N, C); NULL-propagating */
fr_tensor *fr_global_pool(fr_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
