"""VGG with torchvision's structure, parameter names and initialisation (``features.N``,
``classifier.0/3/6``); ``vgg11_bn`` is configuration "A" with BatchNorm.

>>> import tessera
>>> m = tessera.models.vgg11_bn(num_classes=10).eval()
>>> m(tessera.zeros(1, 3, 32, 32)).shape
tessera.Size([1, 10])
"""
from __future__ import annotations

from tessera import nn
from tessera._tensor import Tensor
from tessera.ops.views import flatten

__all__ = ["VGG", "make_layers", "vgg11", "vgg11_bn"]

# "M" is a 2x2 max pooling, a number a 3x3 convolution with that many output channels
cfgs: dict[str, list[str | int]] = {
    "A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "B": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512,
          "M"],
    "E": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512,
          512, 512, 512, "M"],
}


class VGG(nn.Module):
    """Convolutional ``features``, adaptive pooling to 7x7, and a three-layer classifier."""

    def __init__(self, features: nn.Module, num_classes: int = 1000, init_weights: bool = True,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes))
        if init_weights:
            self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(flatten(x, 1))


def make_layers(cfg: list[str | int], batch_norm: bool = False) -> nn.Sequential:
    """The ``features`` Sequential for one configuration of :data:`cfgs`."""
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            continue
        layers.append(nn.Conv2d(in_channels, int(v), kernel_size=3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(int(v)))
        layers.append(nn.ReLU(inplace=True))
        in_channels = int(v)
    return nn.Sequential(*layers)


def vgg11(num_classes: int = 1000, **kwargs) -> VGG:
    """VGG-11 (configuration "A") without BatchNorm; ``kwargs`` go to :class:`VGG`."""
    return VGG(make_layers(cfgs["A"], batch_norm=False), num_classes=num_classes, **kwargs)


def vgg11_bn(num_classes: int = 1000, **kwargs) -> VGG:
    """VGG-11 (configuration "A") with BatchNorm; ``kwargs`` go to :class:`VGG`."""
    return VGG(make_layers(cfgs["A"], batch_norm=True), num_classes=num_classes, **kwargs)
