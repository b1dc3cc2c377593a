"""torch_models.py: the architectures of models/resnet.h and models/densenet.h written
in PyTorch the way a PyTorch user would write them, as the baseline of
bench/torch_saved.py.

- "resnet<D>", D = 6n + 2: CIFAR ResNet (He et al. 2016, section 4.2), basic
  blocks, option-B shortcuts (1x1 convolution with stride 2, then BN) where the
  shape changes, nn.ReLU(inplace=True) everywhere, global average pool, fc.
- "densenet-bc-<L>[-k<K>]", L = 6n + 4: DenseNet-BC for CIFAR (Huang et al.
  2017), growth K (12 unless given), bottleneck 4K, compression 0.5, a 3x3
  stem of 2K channels, nn.ReLU(inplace=True); the standard implementation
  (each layer concatenates its inputs and keeps what autograd saves), not
  the memory-efficient one.
- "mobilenet_se": examples/mobilenet.c's MobileNetV2-style net (depthwise 3x3,
  squeeze-excitation, SiLU / hardswish, dropout 0.2), the module of
  tests/fixtures/example_models.py that its fixture test loads.

Convolutions have no bias, as in frugal. Weights are PyTorch's defaults:
memory and time do not depend on them. The modules are those of
tests/fixtures/cifar_models.py, built with inplace ReLUs.

The GPU section also runs the memory strategies PyTorch has natively
(native_strategies), under the names of frugal's strategies they stand for:

- "checkpoint" (ResNet): torch.utils.checkpoint over the stem and the basic
  blocks in about sqrt(blocks) equal segments, the last one not checkpointed
  (what torch.utils.checkpoint.checkpoint_sequential does);
- "recompute" (DenseNet): the memory-efficient DenseNet as torchvision writes
  it (memory_efficient=True): each layer's concatenation + BN + ReLU + 1x1
  convolution under torch.utils.checkpoint, recomputed in backward.

Both use the non-reentrant checkpoint (use_reentrant=False), which gives the
weights their gradients even when a segment's input does not require one.
"""
import math
import os
import re
import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# One definition of the models, shared with the fixture generators.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from cifar_models import DenseLayer, DenseNetBC, ResNet  # noqa: E402
from example_models import MobileNet  # noqa: E402


def build(name, in_channels, num_classes, strategy="plain"):
    """The model called `name` (the names frugal's constructors take), run
    under `strategy`, one of native_strategies(name)."""
    if strategy not in native_strategies(name):
        raise ValueError(f"torch_models: {name!r} has no PyTorch form of strategy {strategy!r}")
    m = re.fullmatch(r"resnet(\d+)", name)
    if m:
        model = ResNet(int(m.group(1)), in_channels, num_classes, inplace=True)
        return CheckpointedResNet(model) if strategy == "checkpoint" else model
    m = re.fullmatch(r"densenet-bc-(\d+)(?:-k(\d+))?", name)
    if m:
        model = DenseNetBC(int(m.group(1)), int(m.group(2) or 12), in_channels, num_classes,
                           inplace=True)
        return memory_efficient(model) if strategy == "recompute" else model
    if name == "mobilenet_se":  # examples/mobilenet_model.h's mobilenet_create
        return MobileNet(in_channels, num_classes, 16, dropout=0.2)
    raise ValueError(f"torch_models: no PyTorch definition for model {name!r}")


def native_strategies(name):
    """The strategies PyTorch runs for model `name`; "plain" first."""
    if re.fullmatch(r"resnet(\d+)", name):
        return ["plain", "checkpoint"]
    if re.fullmatch(r"densenet-bc-(\d+)(?:-k(\d+))?", name):
        return ["plain", "recompute"]
    return ["plain"]


def _checkpoint(fn, *args):
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


def _chain(modules):
    def run(x):
        for m in modules:
            x = m(x)
        return x
    return run


class CheckpointedResNet(nn.Module):
    """A basic-block ResNet whose stem and blocks run in checkpointed
    segments; the parameters are the wrapped ResNet's."""

    def __init__(self, net):
        super().__init__()
        assert not net.preact, "checkpointing is written for the basic-block ResNet"
        self.net = net
        parts = [nn.Sequential(net.conv1, net.bn1, net.relu)]
        parts += list(net.layer1) + list(net.layer2) + list(net.layer3)
        n_seg = max(1, round(math.sqrt(len(parts))))
        size = math.ceil(len(parts) / n_seg)
        # A plain list, so the modules are registered once (under net).
        self.segments = [parts[i:i + size] for i in range(0, len(parts), size)]

    def forward(self, x):
        for seg in self.segments[:-1]:
            x = _checkpoint(_chain(seg), x)
        x = _chain(self.segments[-1])(x)
        return self.net.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def memory_efficient(model):
    """Makes every dense layer of a DenseNetBC torchvision's memory-efficient
    one (its bottleneck recomputed in backward); returns the model."""
    def forward(layer, features):
        def bottleneck(*inputs):
            return layer.conv1(layer.relu(layer.norm1(torch.cat(inputs, 1))))
        x = _checkpoint(bottleneck, *features) if torch.is_grad_enabled() else bottleneck(*features)
        return layer.conv2(layer.relu(layer.norm2(x)))

    for m in model.modules():
        if isinstance(m, DenseLayer):
            m.forward = types.MethodType(forward, m)
    return model
