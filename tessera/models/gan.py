"""DCGAN (Radford et al., 2015) for 28x28 and 32x32 images, following the structure and
parameter names of PyTorch's DCGAN tutorial (``main.0.weight``, ``main.1.running_mean``, ...)
so that a tutorial checkpoint trained at these sizes loads without renaming.

The tutorial's networks make 64x64 images with five layers each; these keep its layer
pattern (transposed convolutions, BatchNorm, ReLU and a Tanh output in the generator;
convolutions, LeakyReLU(0.2), BatchNorm and a Sigmoid output in the discriminator) with four
layers each, sized so that the feature maps go 1 -> 4 -> 8 -> 16 -> 32 (32x32) or
1 -> 3 -> 7 -> 14 -> 28 (28x28, MNIST's size) and back.

>>> import tessera
>>> from tessera.models.gan import dcgan
>>> netG, netD = dcgan(nz=16, ngf=8, ndf=8, image_size=28)
>>> fake = netG(tessera.randn(2, 16, 1, 1))
>>> tuple(fake.shape), tuple(netD(fake).shape)
((2, 1, 28, 28), (2, 1, 1, 1))
"""
from __future__ import annotations

from tessera import nn
from tessera._tensor import Tensor

__all__ = ["DCGANGenerator", "DCGANDiscriminator", "dcgan", "weights_init"]

_SIZES = (28, 32)


def _check_sizes(image_size: int, **channels: int) -> None:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or \
            image_size not in _SIZES:
        raise ValueError(f"DCGAN: image_size must be 28 or 32, got {image_size!r}")
    for name, value in channels.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"DCGAN: {name} must be a positive int, got {value!r}")


def weights_init(m: nn.Module) -> None:
    """The DCGAN tutorial's initialisation, for ``model.apply(weights_init)``: conv and
    transposed-conv weights ~ N(0, 0.02); BatchNorm weights ~ N(1, 0.02), biases 0."""
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class DCGANGenerator(nn.Module):
    """Maps a latent ``(N, nz, 1, 1)`` to images ``(N, nc, image_size, image_size)`` in
    [-1, 1]. ``ngf`` is the width of the last hidden layer (the first is ``4 * ngf``).

    >>> import tessera
    >>> g = DCGANGenerator(nz=8, ngf=4, nc=3, image_size=32)
    >>> tuple(g(tessera.randn(1, 8, 1, 1)).shape)
    (1, 3, 32, 32)
    """

    def __init__(self, nz: int = 100, ngf: int = 64, nc: int = 1,
                 image_size: int = 28) -> None:
        super().__init__()
        _check_sizes(image_size, nz=nz, ngf=ngf, nc=nc)
        self.nz, self.image_size = nz, image_size
        # 28: 1 -> 3 -> 7 -> 14 -> 28;  32: 1 -> 4 -> 8 -> 16 -> 32
        k0, k1, p1 = (3, 3, 0) if image_size == 28 else (4, 4, 1)
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, k0, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, k1, 2, p1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )
        self.apply(weights_init)

    def forward(self, input: Tensor) -> Tensor:
        return self.main(input)


class DCGANDiscriminator(nn.Module):
    """Maps images ``(N, nc, image_size, image_size)`` to the probability that each is real,
    shaped ``(N, 1, 1, 1)`` as in the tutorial (``.view(-1)`` gives ``(N,)``).

    >>> import tessera
    >>> d = DCGANDiscriminator(nc=3, ndf=4, image_size=32)
    >>> tuple(d(tessera.randn(2, 3, 32, 32)).shape)
    (2, 1, 1, 1)
    """

    def __init__(self, nc: int = 1, ndf: int = 64, image_size: int = 28) -> None:
        super().__init__()
        _check_sizes(image_size, nc=nc, ndf=ndf)
        self.image_size = image_size
        # 28: 28 -> 14 -> 7 -> 3 -> 1;  32: 32 -> 16 -> 8 -> 4 -> 1
        k2, p2, k3 = (3, 0, 3) if image_size == 28 else (4, 1, 4)
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, k2, 2, p2, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, 1, k3, 1, 0, bias=False),
            nn.Sigmoid(),
        )
        self.apply(weights_init)

    def forward(self, input: Tensor) -> Tensor:
        return self.main(input)


def dcgan(nz: int = 100, ngf: int = 64, ndf: int = 64, nc: int = 1,
          image_size: int = 28) -> tuple[DCGANGenerator, DCGANDiscriminator]:
    """A matching ``(generator, discriminator)`` pair, both initialised with
    :func:`weights_init`.

    >>> netG, netD = dcgan(nz=8, ngf=4, ndf=4, nc=1, image_size=32)
    >>> netG.nz, netD.image_size
    (8, 32)
    """
    return (DCGANGenerator(nz=nz, ngf=ngf, nc=nc, image_size=image_size),
            DCGANDiscriminator(nc=nc, ndf=ndf, image_size=image_size))
