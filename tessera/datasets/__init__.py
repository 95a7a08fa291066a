"""Small real datasets that need no network: ``MNIST`` read from the IDX files in a folder
the user gives, and ``Digits``, scikit-learn's bundled 8x8 handwritten digits.

Samples are ``(image, label)`` with the image a float32 tensor of shape ``(1, H, W)``
scaled to [0, 1] (what torchvision's ``ToTensor()`` would give) and the label an int;
``transform`` / ``target_transform`` are applied to them. ``.data`` and ``.targets`` hold
the whole split as tensors, for vectorised use.
"""
from tessera.datasets.digits import Digits
from tessera.datasets.mnist import MNIST

__all__ = ["MNIST", "Digits"]
