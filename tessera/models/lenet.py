"""LeNet-5 for 1x28x28 images (MNIST), with ReLU and max pooling as it is usually written now.

>>> import tessera
>>> m = tessera.models.lenet5(num_classes=10)
>>> m(tessera.zeros(2, 1, 28, 28)).shape
tessera.Size([2, 10])
"""
from __future__ import annotations

from tessera import nn
from tessera._tensor import Tensor
from tessera.nn import functional as F
from tessera.ops.views import flatten

__all__ = ["LeNet5", "lenet5"]


class LeNet5(nn.Module):
    """Two 5x5 convolutions (6 and 16 channels, each followed by 2x2 max pooling) and three
    linear layers (120, 84, ``num_classes``). The first convolution pads by 2 so a 28x28
    input gives the 32x32 receptive field of the original paper."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(flatten(x, 1)))
        return self.fc3(F.relu(self.fc2(x)))


def lenet5(num_classes: int = 10) -> LeNet5:
    """A LeNet-5 with PyTorch's default layer initialisation."""
    return LeNet5(num_classes=num_classes)
