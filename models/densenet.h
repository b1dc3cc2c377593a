/* densenet.h: DenseNet-BC for 32x32 images (Huang et al. 2017, "Densely
 * Connected Convolutional Networks", the CIFAR variant of section 4), with the
 * memory-efficient implementation of Pleiss et al. 2017 as a strategy.
 *
 * "densenet-bc-<L>" or "densenet-bc-<L>-k<K>": depth L = 6n + 4 (40, 100,
 * 190, ...), growth rate K (12 unless given). A 3x3 stem convolution with 2K
 * channels (no BN after it: the first dense layer's BN does that); three dense
 * blocks of n bottleneck layers each,
 *     layer(x0..xi) = conv3x3_K(relu(bn(conv1x1_4K(relu(bn(concat(x0..xi)))))))
 * every layer adding K channels; between blocks a transition
 * BN-ReLU-conv1x1 (compression 0.5: floor(C / 2) channels)-avgpool 2x2; then
 * BN-ReLU, global average pool and a fully connected classifier. No dropout.
 * DenseNet-BC-100 (K = 12) has 769,162 parameters for 10 classes,
 * DenseNet-BC-40 (K = 12) 176,122.
 *
 * Parameter names follow torchvision's DenseNet (features / classifier,
 * denseblockB.denselayerJ with 1-based B and J, transitionB, norm5) minus its
 * ImageNet stem (no norm0 / pool0):
 *     features.conv0.weight
 *     features.denseblock1.denselayer1.{norm1.*, conv1.weight, norm2.*, conv2.weight}
 *     features.transition1.{norm.*, conv.weight}
 *     features.norm5.{weight,bias,running_mean,running_var,num_batches_tracked}
 *     classifier.weight  classifier.bias
 * (tests/fixtures/gen_densenet.py writes the same network in PyTorch.)
 * Convolutions have no bias; initialisation as layers.h, from `seed`.
 *
 * Memory strategies (model.h) as the engine (nn/build.h) applies them here:
 *   plain      every layer's concatenation, its BN+ReLU output and the
 *              bottleneck's two tensors are kept: memory quadratic in depth.
 *   recompute  the memory-efficient DenseNet: each layer's concatenation and
 *              its first BN+ReLU output are never kept, only recipes that
 *              rebuild them in backward from the features (which are kept
 *              anyway, K channels per layer); the bottleneck's BN+ReLU is
 *              recomputed as in ResNets. Memory linear in depth; same loss,
 *              gradients and running statistics as plain, bit for bit.
 *   checkpoint segments of dense layers within a block (k per segment for
 *              checkpoint:k, else chosen from measured bytes); each keeps
 *              only its input, the concatenation so far, and replays in
 *              backward. The transitions and the head are segments of the
 *              network's sequence. Combines with recompute.
 *   abn        refused (FR_ERR_ARG) by the engine: a layer's input, the
 *              concatenation of earlier features, is read by every later
 *              layer and cannot be overwritten in place; abn_reference
 *              likewise. */
#ifndef FR_DENSENET_H
#define FR_DENSENET_H

#include "../nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model by name (see above). growth: 0 takes K from the name (12 when the
 * name has none); a positive growth must agree with a K in the name. The
 * model's name is the canonical "densenet-bc-<L>-k<K>". NULL with FR_ERR_ARG
 * naming the accepted forms. The model starts on the CPU, strategy plain. */
fr_model *fr_densenet_create(const char *name, int growth, int in_channels, int num_classes,
                             uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
