"""torch_models.py: the architectures of nn/resnet.h and nn/densenet.h written
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

Convolutions have no bias, as in frugal. Weights are PyTorch's defaults:
memory and time do not depend on them. The modules are those of
tests/fixtures/cifar_models.py, built with inplace ReLUs.
"""
import os
import re
import sys

# One definition of the models, shared with the fixture generators.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
from cifar_models import DenseNetBC, ResNet  # noqa: E402


def build(name, in_channels, num_classes):
    """The model called `name` (the names frugal's constructors take)."""
    m = re.fullmatch(r"resnet(\d+)", name)
    if m:
        return ResNet(int(m.group(1)), in_channels, num_classes, inplace=True)
    m = re.fullmatch(r"densenet-bc-(\d+)(?:-k(\d+))?", name)
    if m:
        return DenseNetBC(int(m.group(1)), int(m.group(2) or 12), in_channels, num_classes,
                          inplace=True)
    raise ValueError(f"torch_models: no PyTorch definition for model {name!r}")
