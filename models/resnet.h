/* resnet.h: residual networks for 32x32 images (CIFAR; 28x28 Fashion-MNIST
 * works too: the network ends in a global average pool).
 *
 * "resnet<D>", D = 6n + 2 (20, 32, 44, 56, 110, ...): He et al. 2016, "Deep
 * Residual Learning", section 4.2. A 3x3 stem of 16 channels, three stages of
 * n basic blocks (two 3x3 convolutions) with 16, 32, 64 channels, the last two
 * stages starting with stride 2; global average pool; fully connected.
 * Downsampling blocks use a projection shortcut (option B: 1x1 convolution
 * with stride 2, then BN). Parameter names, as the same network written in
 * PyTorch with nn.Sequential shortcuts:
 *     conv1.weight  bn1.{weight,bias,running_mean,running_var,num_batches_tracked}
 *     layer1.0.conv1.weight  layer1.0.bn1.*  layer1.0.conv2.weight  layer1.0.bn2.*
 *     layer2.0.shortcut.0.weight  layer2.0.shortcut.1.*   (projection conv, BN)
 *     fc.weight  fc.bias
 *
 * "preresnet<D>", D = 9n + 2 (164, 1001, ...): He et al. 2016b, "Identity
 * Mappings in Deep Residual Networks": pre-activation bottleneck blocks
 * (BN-ReLU-conv1x1, BN-ReLU-conv3x3, BN-ReLU-conv1x1, widths 16/32/64 with
 * expansion 4, so stages output 64/128/256 channels), the 3x3 stride-2
 * convolution in the middle, and a projection shortcut (1x1 convolution, no
 * BN, applied to the block's pre-activated input) where the shape changes,
 * including the first block. The network ends with BN-ReLU, the pool and fc.
 * Names: conv1.weight, layer1.0.{bn1,conv1,bn2,conv2,bn3,conv3}.*,
 * layer1.0.shortcut.0.weight, bn.*, fc.*.
 *
 * Convolutions have no bias (a BN follows or precedes each). Weights are
 * initialised from `seed` (layers.h), in registration order. */
#ifndef FR_RESNET_H
#define FR_RESNET_H

#include "../nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model by name (see above), or NULL with FR_ERR_ARG naming the accepted
 * forms. The model starts on the CPU with the plain strategy. */
fr_model *fr_resnet_create(const char *name, int in_channels, int num_classes, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
