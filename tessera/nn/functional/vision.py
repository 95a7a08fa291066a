"""Vision functions of ``nn.functional``: pad, interpolate (and the upsample aliases),
pixel_shuffle / pixel_unshuffle, channel_shuffle, unfold / fold, affine_grid.

The ops live in ``tessera.ops.vision``; the shuffles and affine_grid are composites of
view and matmul ops.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.pad(tessera.arange(3.), (1, 2), value=9.0).tolist()
[9.0, 0.0, 1.0, 2.0, 9.0, 9.0]
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.nn.functional.conv import _is_int, _tensor, ntuple
from tessera.ops import vision as V
from tessera.ops.creation import tensor

__all__ = ["pad", "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
           "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
           "unfold", "fold", "affine_grid", "grid_sample"]


# ---- pad -----------------------------------------------------------------------------------

def _pad_list(pad) -> list[int]:
    if isinstance(pad, Tensor) or not isinstance(pad, (tuple, list)):
        raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, not "
                        f"{type(pad).__name__}")
    for i, p in enumerate(pad):
        if not _is_int(p):
            raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, but "
                            f"found element of type {type(p).__name__} at pos {i}")
    return [int(p) for p in pad]


def pad(input, pad, mode="constant", value=None) -> Tensor:
    """Pad the last ``len(pad) // 2`` dims: ``pad`` = (last_lo, last_hi, prev_lo, ...).
    Modes 'constant' (negative sizes crop), 'reflect', 'replicate', 'circular'.

    >>> import tessera
    >>> pad(tessera.arange(4.).reshape(1, 4), (2, 1), mode="reflect").tolist()
    [[2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]]
    """
    _tensor("pad", input, "input")
    sizes = _pad_list(pad)
    if len(sizes) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    nd = len(sizes) // 2
    if nd > input.dim():
        raise RuntimeError(f"Padding length should be less than or equal to two times the "
                           f"input dimension but got padding length {len(sizes)} and input "
                           f"of dimension {input.dim()}")
    # torch order is innermost dim first; the ops take ((lo, hi), ...) in dim order
    pads = tuple((sizes[2 * i], sizes[2 * i + 1]) for i in reversed(range(nd)))
    if mode == "constant":
        return V.constant_pad(input, pads, 0.0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    if not 1 <= nd <= 3 or input.dim() not in (nd + 1, nd + 2):
        raise NotImplementedError(f"Padding size {len(sizes)} is not supported for "
                                  f"{input.dim()}D input tensor.")
    if mode != "circular":
        first = 1 if input.dim() == nd + 2 else 0
        if any(s == 0 for s in input.shape[first:]):
            raise RuntimeError(f"Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with "
                               f"possibly 0 batch size and other non-zero dimensions for "
                               f"input, but got: {list(input.shape)}")
    return V.pad(input, pads, mode)


# ---- interpolate ---------------------------------------------------------------------------

_MODE = {"nearest": "nearest", "nearest-exact": "nearest-exact", "linear": "linear",
         "bilinear": "linear", "trilinear": "linear", "bicubic": "cubic", "area": "area"}
_MODE_DIM = {"linear": 3, "bilinear": 4, "trilinear": 5, "bicubic": 4}


def _interp_sizes(input, size, scale_factor, dim, recompute_scale_factor, mode):
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(f"Input and output must have the same number of spatial "
                                 f"dimensions, but got input with spatial dimensions of "
                                 f"{list(input.shape[2:])} and output size of {size}. Please "
                                 f"provide input tensor in (N, C, d1, d2, ...,dK) format and "
                                 f"output size in (o1, o2, ...,oK) format.")
            if not all(_is_int(s) for s in size):
                raise TypeError(f"expected size to be one of int or Tuple[int] or Tuple[int, "
                                f"int] or Tuple[int, int, int], but got size with types "
                                f"{[type(s) for s in size]}")
            out = [int(s) for s in size]
        elif _is_int(size):
            out = [int(size)] * dim
        else:
            raise TypeError(f"expected size to be one of int or Tuple[int], got {size!r}")
        if recompute_scale_factor:
            raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
        return out, [None] * dim
    if scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    if isinstance(scale_factor, (list, tuple)):
        if len(scale_factor) != dim:
            raise ValueError(f"Input and scale_factor must have the same number of spatial "
                             f"dimensions, but got input with spatial dimensions of "
                             f"{list(input.shape[2:])} and scale_factor of shape "
                             f"{scale_factor}. Please provide input tensor in (N, C, d1, d2, "
                             f"...,dK) format and scale_factor in (s1, s2, ...,sK) format.")
        scales = [float(s) for s in scale_factor]
    else:
        scales = [float(scale_factor)] * dim
    out = [int(math.floor(input.shape[2 + i] * scales[i])) for i in range(dim)]
    if mode == "area" or recompute_scale_factor:
        return out, [None] * dim
    return out, scales


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False) -> Tensor:
    """Resample (N, C, *S) to ``size`` or by ``scale_factor`` (PyTorch's index formulas).

    >>> import tessera
    >>> interpolate(tessera.arange(2.).reshape(1, 1, 2), scale_factor=2).tolist()
    [[[0.0, 0.0, 1.0, 1.0]]]
    """
    _tensor("interpolate", input, "input")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating "
                             "modes: linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    dim = input.dim() - 2
    out, scales = _interp_sizes(input, size, scale_factor, dim, recompute_scale_factor, mode)
    if antialias:
        if not (mode in ("bilinear", "bicubic", "lanczos") and input.dim() == 4):
            raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and "
                             "lanczos modes and requires a 4-D tensor as input")
        raise NotImplementedError("interpolate: antialias=True is not supported by tessera")
    if mode not in _MODE:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported "
                                  f"(got {input.dim()}D) for the modes: nearest | linear | "
                                  f"bilinear | bicubic | trilinear | area | nearest-exact "
                                  f"(got {mode})")
    need = _MODE_DIM.get(mode)
    if need is not None and input.dim() != need and input.dim() in (3, 4, 5):
        raise NotImplementedError(f"Got {input.dim()}D input, but {mode} mode needs {need}D "
                                  "input")
    if input.dim() not in (3, 4, 5):
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported "
                                  f"(got {input.dim()}D) for the modes: nearest | linear | "
                                  f"bilinear | bicubic | trilinear | area | nearest-exact "
                                  f"(got {mode})")
    return V.interpolate(input, mode=_MODE[mode], size=out, scales=scales,
                         align_corners=bool(align_corners))


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Deprecated alias of ``interpolate``."""
    warnings.warn("nn.functional.upsample is deprecated. Use nn.functional.interpolate "
                  "instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    """Deprecated: ``interpolate(..., mode='nearest')``."""
    warnings.warn("nn.functional.upsample_nearest is deprecated. Use "
                  "nn.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """Deprecated: ``interpolate(..., mode='bilinear', align_corners=True)``."""
    warnings.warn("nn.functional.upsample_bilinear is deprecated. Use "
                  "nn.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# ---- shuffles (views) ----------------------------------------------------------------------

def _fresh(y: Tensor, x: Tensor) -> Tensor:
    """PyTorch's shuffles return new memory; when the permutation moved only size-1 dims the
    reshape is a view of ``x``, so copy it then."""
    if type(y._data) is np.ndarray and type(x._data) is np.ndarray and \
            np.shares_memory(y._data, x._data):  # (a traced graph has no memory to share)
        return y.clone()
    return y


def pixel_shuffle(input, upscale_factor) -> Tensor:
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r).

    >>> import tessera
    >>> pixel_shuffle(tessera.arange(4.).reshape(4, 1, 1), 2).tolist()
    [[[0.0, 1.0], [2.0, 3.0]]]
    """
    _tensor("pixel_shuffle", input, "input")
    r = int(upscale_factor)
    if input.dim() < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but "
                           f"got input with {input.dim()} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)={c} "
                           f"is not divisible by {r * r}")
    nl = len(lead)
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    perm = tuple(range(nl)) + (nl, nl + 3, nl + 1, nl + 4, nl + 2)
    return _fresh(x.permute(perm).reshape(*lead, c // (r * r), h * r, w * r), input)


def pixel_unshuffle(input, downscale_factor) -> Tensor:
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W), the inverse of ``pixel_shuffle``."""
    _tensor("pixel_unshuffle", input, "input")
    r = int(downscale_factor)
    if input.dim() < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but "
                           f"got input with {input.dim()} dimension(s)")
    if r <= 0:
        raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    *lead, c, h, w = input.shape
    if h % r:
        raise RuntimeError(f"pixel_unshuffle expects height to be divisible by "
                           f"downscale_factor, but input.size(-2)={h} is not divisible by {r}")
    if w % r:
        raise RuntimeError(f"pixel_unshuffle expects width to be divisible by "
                           f"downscale_factor, but input.size(-1)={w} is not divisible by {r}")
    nl = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    perm = tuple(range(nl)) + (nl, nl + 2, nl + 4, nl + 1, nl + 3)
    return _fresh(x.permute(perm).reshape(*lead, c * r * r, h // r, w // r), input)


def channel_shuffle(input, groups) -> Tensor:
    """(N, C, *) with C = g * k: channels reordered as a (k, g) transpose of (g, k)."""
    _tensor("channel_shuffle", input, "input")
    g = int(groups)
    if input.dim() <= 2:
        raise RuntimeError(f"channel_shuffle expects input with > 2 dims, but got input with "
                           f"sizes {list(input.shape)}")
    if g <= 0:
        raise RuntimeError(f"Number of groups to divide channels in must be positive. Value "
                           f"of groups:{g}")
    n, c, *rest = input.shape
    if c % g:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels "
                           f"and {g} groups.")
    return _fresh(input.reshape(n, g, c // g, *rest).transpose(1, 2).reshape(n, c, *rest),
                  input)


native_channel_shuffle = channel_shuffle


# ---- unfold / fold ---------------------------------------------------------------------------

def _fold_args(fn, kernel_size, dilation, padding, stride):
    k = ntuple(kernel_size, 2, "kernel_size", fn)
    d = ntuple(dilation, 2, "dilation", fn)
    p = ntuple(padding, 2, "padding", fn)
    s = ntuple(stride, 2, "stride", fn)
    if any(v <= 0 for v in k):
        raise RuntimeError(f"{fn}: kernel size should be greater than zero, but got {list(k)}")
    if any(v <= 0 for v in d):
        raise RuntimeError(f"{fn}: dilation should be greater than zero, but got {list(d)}")
    if any(v < 0 for v in p):
        raise RuntimeError(f"{fn}: padding should be non-negative, but got {list(p)}")
    if any(v <= 0 for v in s):
        raise RuntimeError(f"{fn}: stride should be greater than zero, but got {list(s)}")
    return dict(kernel_size=k, dilation=d, padding=p, stride=s)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sliding blocks as columns: (N, C, H, W) -> (N, C*kH*kW, L) (im2col).

    >>> import tessera
    >>> unfold(tessera.ones(1, 2, 3, 3), 2).shape
    tessera.Size([1, 8, 4])
    """
    _tensor("unfold", input, "input")
    if input.dim() not in (3, 4) or any(s == 0 for s in input.shape[-3:]):
        if input.dim() < 3:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-max(input.dim(), 1)}, {max(input.dim(), 1) - 1}], but got 2)")
        raise RuntimeError(f"Expected 3D or 4D (batch mode) tensor with possibly 0 batch size "
                           f"and other non-zero dimensions for input, but got: "
                           f"{list(input.shape)}")
    args = _fold_args("unfold", kernel_size, dilation, padding, stride)
    batched = input.dim() == 4
    y = V.im2col(input if batched else input.unsqueeze(0), **args)
    return y if batched else y.squeeze(0)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sum columns back into an image: (N, C*kH*kW, L) -> (N, C, *output_size) (col2im)."""
    _tensor("fold", input, "input")
    if input.dim() not in (2, 3) or any(s == 0 for s in input.shape[-2:]):
        raise RuntimeError(f"Expected 2D or 3D (batch mode) tensor for input with possibly 0 "
                           f"batch size and non-zero dimensions for input, but got: "
                           f"{list(input.shape)}")
    out = ntuple(output_size, 2, "output_size", "fold")
    args = _fold_args("fold", kernel_size, dilation, padding, stride)
    batched = input.dim() == 3
    y = V.col2im(input if batched else input.unsqueeze(0), out, **args)
    return y if batched else y.squeeze(0)


# ---- affine_grid / grid_sample -------------------------------------------------------------

_ALIGN_WARNING = ("Default grid_sample and affine_grid behavior has changed to align_corners="
                  "False since 1.3.0. Please specify align_corners=True if the old behavior is "
                  "desired. See the documentation of grid_sample for details.")

def _base_coords(steps: int, align_corners: bool) -> np.ndarray:
    if steps <= 1:
        return np.zeros(max(steps, 0))
    r = np.linspace(-1.0, 1.0, steps)
    return r if align_corners else r * (steps - 1) / steps


def affine_grid(theta, size, align_corners=None) -> Tensor:
    """Sampling grid (N, H, W, 2) (or (N, D, H, W, 3)) of the affine maps ``theta``."""
    _tensor("affine_grid", theta, "theta")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if not theta.dtype.is_floating_point:
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    size = list(size)
    if len(size) == 4:
        if theta.dim() != 3 or tuple(theta.shape[-2:]) != (2, 3):
            raise ValueError(f"Expected a batch of 2D affine matrices of shape Nx2x3 for size "
                             f"{size}. Got {list(theta.shape)}.")
        spatial = size[-2:]
    elif len(size) == 5:
        if theta.dim() != 3 or tuple(theta.shape[-2:]) != (3, 4):
            raise ValueError(f"Expected a batch of 3D affine matrices of shape Nx3x4 for size "
                             f"{size}. Got {list(theta.shape)}.")
        spatial = size[-3:]
    else:
        raise NotImplementedError(f"affine_grid only supports 4D and 5D sizes, for 2D and 3D "
                                  f"affine transforms, respectively. Got size {size}.")
    if min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {size}")
    if theta.shape[0] != size[0]:
        raise ValueError(f"Expected theta batch size {size[0]} to match size[0]")
    axes = [_base_coords(s, align_corners) for s in reversed(spatial)]   # x, y(, z)
    mesh = np.meshgrid(*axes[::-1], indexing="ij")                      # (z,) y, x grids
    base = np.stack([m for m in mesh[::-1]] + [np.ones_like(mesh[0])], axis=-1)
    nsp = int(np.prod(spatial))
    base_t = tensor(base.reshape(1, nsp, len(spatial) + 1), dtype=theta.dtype,
                            device=theta.device)
    grid = base_t.matmul(theta.transpose(1, 2))
    return grid.reshape(size[0], *spatial, len(spatial))


def _unnormalize(c: Tensor, size: int, align_corners: bool) -> Tensor:
    """[-1, 1] grid coordinates -> input pixel coordinates (PyTorch's convention)."""
    if align_corners:
        return (c + 1) / 2 * (size - 1)
    return ((c + 1) * size - 1) / 2


def _reflect(c: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """Fold ``c`` back into [twice_low / 2, twice_high / 2] by reflection (any number of
    times), differentiably."""
    from tessera.ops.ternary import where
    if twice_low == twice_high:
        return c * 0
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c = (c - lo).abs()
    extra = c.fmod(span)
    flips = (c / span).floor()
    return where(flips.remainder(2) == 0, extra + lo, span - extra + lo)


def _pad_coords(c: Tensor, size: int, padding_mode: str, align_corners: bool) -> Tensor:
    if padding_mode == "border":
        return c.clamp(0, size - 1)
    if padding_mode == "reflection":
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        return c.clamp(0, size - 1)
    return c


def _cubic_weights(t: Tensor) -> list[Tensor]:
    a = -0.75

    def conv1(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def conv2(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]


def _gather_taps(flat_in: Tensor, idx: list[Tensor], in_sp, out_valid) -> Tensor:
    """input[n, :, idx_0, idx_1, ...] for (N, P) integer positions; zero where invalid."""
    n, c = flat_in.shape[:2]
    flat = None
    valid = out_valid
    for d, (i, size) in enumerate(zip(idx, in_sp)):
        ok = (i >= 0) & (i < size)
        valid = ok if valid is None else valid & ok
        i = i.clamp(0, size - 1)
        row = int(np.prod(in_sp[d + 1:]))
        flat = i * row if flat is None else flat + i * row
    assert flat is not None and valid is not None  # one spatial dim at least
    p = flat.shape[1]
    vals = flat_in.gather(2, flat.unsqueeze(1).expand(n, c, p))
    return vals * valid.unsqueeze(1).to(vals.dtype)


def _sample_nd(input, coords, mode, padding_mode, align_corners):
    """(N, C, P) samples of ``input`` at per-dim pixel coordinates ``coords`` (N, P)."""
    n, c = input.shape[:2]
    in_sp = tuple(input.shape[2:])
    flat_in = input.reshape(n, c, int(np.prod(in_sp)))
    if mode == "bicubic":
        base = [x.detach().floor() for x in coords]
        ws = [_cubic_weights(x - b) for x, b in zip(coords, base)]
        out = None
        for taps in itertools.product(range(4), repeat=len(coords)):
            with no_grad():
                idx = [_pad_coords(b + (t - 1), size, padding_mode, align_corners).long()
                       for b, t, size in zip(base, taps, in_sp)]
            w = ws[0][taps[0]]
            for d in range(1, len(coords)):
                w = w * ws[d][taps[d]]
            term = _gather_taps(flat_in, idx, in_sp, None) * w.unsqueeze(1)
            out = term if out is None else out + term
        return out
    coords = [_pad_coords(x, size, padding_mode, align_corners)
              for x, size in zip(coords, in_sp)]
    if mode == "nearest":
        with no_grad():
            idx = [x.round().long() for x in coords]
        # the grid's gradient is zero but defined (as in PyTorch): keep it in the graph
        return _gather_taps(flat_in, idx, in_sp, None) + coords[0].sum() * 0
    base = [x.detach().floor() for x in coords]
    frac = [x - b for x, b in zip(coords, base)]
    out = None
    for corner in itertools.product((0, 1), repeat=len(coords)):
        wc = None
        for f, bit in zip(frac, corner):
            wd = f if bit else 1 - f
            wc = wd if wc is None else wc * wd
        assert wc is not None  # one spatial dim at least
        with no_grad():
            idx = [(b + bit).long() for b, bit in zip(base, corner)]
        term = _gather_taps(flat_in, idx, in_sp, None) * wc.unsqueeze(1)
        out = term if out is None else out + term
    return out


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """Sample (N, C, H, W) ``input`` at the [-1, 1] locations of ``grid`` (N, Ho, Wo, 2)
    (5-d: (N, Do, Ho, Wo, 3)); modes bilinear, nearest, bicubic (4-d); padding zeros,
    border or reflection. A composite of gathers and elementwise ops, so it is
    differentiable in both arguments to any order."""
    _tensor("grid_sample", input, "input")
    _tensor("grid_sample", grid, "grid")
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', "
                         f"'nearest' or 'bicubic', but got: '{mode}'")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"nn.functional.grid_sample(): expected padding_mode to be 'zeros', "
                         f"'border', or 'reflection', but got: '{padding_mode}'")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if input.dim() not in (4, 5) or grid.dim() != input.dim():
        raise RuntimeError(f"grid_sampler(): expected 4D or 5D input and grid with same number "
                           f"of dimensions, but got input with sizes {list(input.shape)} and "
                           f"grid with sizes {list(grid.shape)}")
    nd = input.dim() - 2
    if grid.shape[0] != input.shape[0]:
        raise RuntimeError(f"grid_sampler(): expected grid and input to have same batch size, "
                           f"but got input with sizes {list(input.shape)} and grid with sizes "
                           f"{list(grid.shape)}")
    if grid.shape[-1] != nd:
        raise RuntimeError(f"grid_sampler(): expected grid to have size {nd} in last "
                           f"dimension, but got grid with sizes {list(grid.shape)}")
    if any(s == 0 for s in input.shape[2:]):
        raise RuntimeError(f"grid_sampler(): expected input to have non-empty spatial "
                           f"dimensions, but input has sizes {list(input.shape)}")
    if input.dtype is not grid.dtype:
        raise RuntimeError(f"grid_sampler(): expected input and grid to have the same dtype, "
                           f"but input has {input.dtype} and grid has {grid.dtype}")
    if mode == "bicubic" and nd != 2:
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    n, c = input.shape[:2]
    out_sp = tuple(grid.shape[1:-1])
    g = grid.reshape(n, int(np.prod(out_sp)), nd)
    # grid's last dim is (x, y[, z]) = (W, H[, D]): reversed spatial order
    coords = [_unnormalize(g[..., nd - 1 - d], size, align_corners)
              for d, size in enumerate(input.shape[2:])]
    out = _sample_nd(input, coords, mode, padding_mode, align_corners)
    return out.reshape(n, c, *out_sp)
