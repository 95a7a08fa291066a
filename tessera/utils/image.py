"""Image grids and image files, with ``torchvision.utils``' names and semantics:
``make_grid`` tiles a batch of images into one image tensor and ``save_image`` writes a
batch (as a grid) or a single image to disk with Pillow.

>>> import tessera
>>> from tessera.utils import make_grid
>>> tuple(make_grid(tessera.rand(10, 1, 28, 28), nrow=5).shape)  # 1 channel -> RGB
(3, 62, 152)
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import IO

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.ops.shape import cat, stack

__all__ = ["make_grid", "save_image"]


def _to_batch(tensor) -> Tensor:
    """``tensor`` (or a list of same-shaped images) as a 4-d batch, 1-channel made RGB."""
    if isinstance(tensor, (list, tuple)):
        for t in tensor:
            if not isinstance(t, Tensor):
                raise TypeError(f"make_grid: tensor or list of tensors expected, got a list "
                                f"containing {type(t).__name__}")
        if not tensor:
            raise ValueError("make_grid: got an empty list of images")
        tensor = stack(list(tensor), dim=0)
    elif not isinstance(tensor, Tensor):
        raise TypeError(f"make_grid: tensor or list of tensors expected, got "
                        f"{type(tensor).__name__}")
    if tensor.dim() not in (2, 3, 4):
        raise ValueError(f"make_grid: expected an image (H, W) or (C, H, W) or a batch "
                         f"(B, C, H, W), got a tensor of shape {tuple(tensor.shape)}")
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        if tensor.size(0) == 1:
            tensor = cat((tensor, tensor, tensor), 0)
        tensor = tensor.unsqueeze(0)
    if tensor.size(1) == 1:
        tensor = cat((tensor, tensor, tensor), 1)
    return tensor


def _normalize(tensor: Tensor, value_range, scale_each: bool) -> Tensor:
    """Shift to [0, 1] by ``value_range`` or by the min and max (per image if scale_each)."""
    if value_range is not None and not isinstance(value_range, tuple):
        raise TypeError("make_grid: value_range has to be a tuple (min, max) if specified; "
                        f"got {type(value_range).__name__}")
    tensor = tensor.clone()  # the caller's tensor is left as it was

    def norm_ip(img: Tensor, low: float, high: float) -> None:
        img.clamp_(min=low, max=high)
        img.sub_(low).div_(max(high - low, 1e-5))

    def norm_range(t: Tensor) -> None:
        if value_range is not None:
            norm_ip(t, value_range[0], value_range[1])
        else:
            norm_ip(t, float(t.min()), float(t.max()))

    if scale_each:
        for t in tensor:  # views of the clone: normalised in place one image at a time
            norm_range(t)
    else:
        norm_range(tensor)
    return tensor


def make_grid(tensor: Tensor | list[Tensor], nrow: int = 8, padding: int = 2,
              normalize: bool = False, value_range: tuple[float, float] | None = None,
              scale_each: bool = False, pad_value: float = 0.0) -> Tensor:
    """Tile a batch ``(B, C, H, W)`` (or a list of ``(C, H, W)`` images) into one image
    ``(C, H', W')`` with ``nrow`` images per row and ``padding`` pixels of ``pad_value``
    around each. 1-channel images become 3-channel; a single image is returned unpadded.
    ``normalize`` shifts values to [0, 1] using ``value_range`` or the min and max (of each
    image if ``scale_each``), as ``torchvision.utils.make_grid`` does.

    >>> import tessera
    >>> make_grid(tessera.zeros(3, 2, 2, 2), nrow=2, padding=1, pad_value=1).shape
    tessera.Size([2, 7, 7])
    """
    for name, value, low in (("nrow", nrow, 1), ("padding", padding, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"make_grid: {name} must be an int >= {low}, got {value!r}")
    with no_grad():
        tensor = _to_batch(tensor)
        if tensor.size(0) == 0:
            raise ValueError(f"make_grid: the batch holds no images (shape "
                             f"{tuple(tensor.shape)})")
        if normalize is True:
            tensor = _normalize(tensor, value_range, scale_each)
        if tensor.size(0) == 1:
            return tensor.squeeze(0)
        nmaps = tensor.size(0)
        xmaps = min(nrow, nmaps)
        ymaps = int(math.ceil(float(nmaps) / xmaps))
        height, width = int(tensor.size(2) + padding), int(tensor.size(3) + padding)
        grid = tensor.new_full((tensor.size(1), height * ymaps + padding,
                                width * xmaps + padding), pad_value)
        for k in range(nmaps):
            y, x = divmod(k, xmaps)
            grid.narrow(1, y * height + padding, height - padding).narrow(
                2, x * width + padding, width - padding).copy_(tensor[k])
        return grid


def _image_format(path: str, format: str | None) -> str:
    """Pillow's format name for ``path``, from ``format`` or else its extension."""
    from PIL import Image
    if format is not None:
        return format
    ext = os.path.splitext(path)[1].lower()
    found = Image.registered_extensions().get(ext)
    if found is None:
        raise ValueError(f"save_image: cannot tell the image format from the file name "
                         f"{path!r} (extension {ext or 'missing'!r}); use an extension such as "
                         f".png or pass format='PNG'")
    return found


def _new_file_mode() -> int:
    """The permissions ``open(path, 'w')`` would give a new file (mkstemp uses 0o600)."""
    try:
        with open("/proc/self/status") as fh:  # Linux: read the umask without changing it
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _save_atomic(im, path: str, format: str | None) -> None:
    """Write to a temporary file in the target's folder, then rename it over the target, so
    a reader never sees a half-written image and a failure leaves the old file intact."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"save_image: folder {folder!r} (for {path!r}) does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            im.save(fh, format=format)
        mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else _new_file_mode()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_image(tensor: Tensor | list[Tensor], fp: str | os.PathLike | IO[bytes],
               format: str | None = None, *, nrow: int = 8, padding: int = 2,
               normalize: bool = False, value_range: tuple[float, float] | None = None,
               scale_each: bool = False, pad_value: float = 0.0) -> None:
    """Save an image, or a batch as a grid (see :func:`make_grid` for the keyword
    arguments), to ``fp``: a path (format from the extension unless ``format`` is given,
    written atomically) or a binary file object (``format`` required). Values in [0, 1] map
    to 0..255, rounded to nearest, as in ``torchvision.utils.save_image``. Needs Pillow.

    >>> import tessera, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "grid.png")
    >>> save_image(tessera.rand(4, 3, 8, 8), path, nrow=2)
    """
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("tessera.utils.save_image needs Pillow to write image files, and it "
                          "is not installed: pip install pillow") from None
    path = os.fspath(fp) if isinstance(fp, (str, os.PathLike)) else None
    if path is not None:
        format = _image_format(path, format)
    elif not hasattr(fp, "write"):
        raise TypeError(f"save_image: fp must be a path or a binary file object, got "
                        f"{type(fp).__name__}")
    grid = make_grid(tensor, nrow=nrow, padding=padding, normalize=normalize,
                     value_range=value_range, scale_each=scale_each, pad_value=pad_value)
    with no_grad():
        # + 0.5 before truncating to uint8 rounds to the nearest integer
        ndarr = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to(
            "cpu", D.uint8).numpy()
    im = Image.fromarray(ndarr)
    if path is not None:
        _save_atomic(im, path, format)
    else:
        im.save(fp, format=format)
