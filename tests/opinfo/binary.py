"""Op-info entries: the binary-network ops (``tessera.ops.binary``) against PyTorch
compositions of the same arithmetic: ``where(x < 0, -1, 1)`` with the straight-through
gradient written as ``x + (sign(x) - x).detach()`` (clipped by ``clamp`` for the sign's
estimator), constant padding by the pad value, and a float convolution or product.

Finite differences see the sign's zero derivative, not the estimator, so these entries
check gradients against PyTorch only (``gradcheck=False``). Values stay away from 0 and
from +-1, where the sign and the estimator's clip jump.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, register

F32 = (np.float32,)


def _torch(L):
    import torch
    return torch if L is torch else None


def _away(rng, shape, dt, scale=2.0):
    """Uniform in +-[0.05, scale], away from 0 and from +-1."""
    v = np.asarray(rng.uniform(0.05, scale, shape) * rng.choice([-1.0, 1.0], shape))
    v[np.abs(np.abs(v) - 1.0) < 0.05] = 0.5
    return v.astype(dt)


def _sgn(torch, x):
    return torch.where(x < 0, -1.0, 1.0).to(x.dtype)


def _straight(torch, x):
    return x + (_sgn(torch, x) - x).detach()


def _sign(L, x, estimator="ste"):
    torch = _torch(L)
    if torch is None:
        from tessera.ops.binary import binary_sign
        return binary_sign(x, estimator)
    s = _sgn(torch, x)
    if estimator == "approx":  # d/dx (2x - x|x|) = 2 - 2|x| inside [-1, 1]
        inside = x.abs() <= 1
        f = torch.where(inside, 2 * x - x * x.abs(), torch.zeros_like(x))
        return s + f - f.detach()
    xc = x.clamp(-1, 1)
    return xc + (s - xc).detach()


def _sign_samples(rng, dt):
    for s in [(), (5,), (3, 4), (2, 3, 4), (0, 3)]:
        for est in ("ste", "approx"):
            yield Sample((_away(rng, s, dt),), dict(estimator=est))


def _conv_ref(torch, x, w, a, stride, padding, dilation, pad_value):
    import torch.nn.functional as F
    p = padding if isinstance(padding, int) else padding[0]
    xs = F.pad(_straight(torch, x), (p,) * 4, value=float(pad_value))
    y = F.conv2d(xs, _straight(torch, w), stride=stride, dilation=dilation)
    return y if a is None else y * a.reshape(1, -1, 1, 1)


def _conv(L, x, w, a=None, stride=1, padding=0, dilation=1, pad_value=-1):
    torch = _torch(L)
    if torch is not None:
        return _conv_ref(torch, x, w, a, stride, padding, dilation, pad_value)
    from tessera.ops.binary import binary_conv2d
    return binary_conv2d(x, w, a, stride=stride, padding=padding, dilation=dilation,
                         pad_value=pad_value)


def _conv_samples(rng, dt):
    geo = [((2, 3, 5, 6), (4, 3, 3, 3), dict(padding=1)),
           ((1, 70, 6, 5), (5, 70, 3, 3), dict(padding=1, stride=2)),
           ((2, 4, 7, 7), (3, 4, 3, 3), dict(padding=2, dilation=2)),
           ((1, 2, 4, 4), (2, 2, 1, 1), {})]
    for i, (xs, ws, kw) in enumerate(geo):
        for pv in (-1, 0, 1):
            args = (_away(rng, xs, dt), _away(rng, ws, dt))
            if i % 2 == 0:
                args += (rng.uniform(0.1, 2.0, ws[0]).astype(dt),)
            yield Sample(args, dict(kw, pad_value=pv))


def _packed_conv(L, x, w, a=None, stride=1, padding=0, dilation=1, pad_value=-1):
    torch = _torch(L)
    if torch is not None:
        return _conv_ref(torch, x, w, a, stride, padding, dilation, pad_value)
    from tessera.ops.binary import binary_pack, packed_binary_conv2d
    words = binary_pack(w.permute(0, 2, 3, 1).contiguous())
    return packed_binary_conv2d(x, words, a, w.shape[1], stride=stride, padding=padding,
                                dilation=dilation, pad_value=pad_value)


def _linear(L, x, w, a=None):
    torch = _torch(L)
    if torch is not None:
        y = _straight(torch, x) @ _straight(torch, w).T
        return y if a is None else y * a
    from tessera.ops.binary import binary_linear
    return binary_linear(x, w, a)


def _packed_linear(L, x, w, a=None):
    torch = _torch(L)
    if torch is not None:
        return _linear(L, x, w, a)
    from tessera.ops.binary import binary_pack, packed_binary_linear
    return packed_binary_linear(x, binary_pack(w), a, w.shape[1])


def _linear_samples(rng, dt):
    for xs, o in [((3, 10), 4), ((1, 130), 17), ((2, 3, 64), 5), ((0, 8), 3)]:
        yield Sample((_away(rng, xs, dt), _away(rng, (o, xs[-1]), dt)))
        yield Sample((_away(rng, xs, dt), _away(rng, (o, xs[-1]), dt),
                      rng.uniform(0.1, 2.0, o).astype(dt)))


def _bits_ref(torch, y, t):
    """PyTorch's bit-packing of the signs ``(y < t) xor flip`` along dim 1, moved last:
    int64 words (sums of distinct bits, bit 63 included, wrap as an or)."""
    neg = (y < t[:, 0].reshape(1, -1, *([1] * (y.dim() - 2)))) != t[:, 1].bool().reshape(
        1, -1, *([1] * (y.dim() - 2)))
    neg = neg.movedim(1, -1).long()
    c = neg.shape[-1]
    cw = -(-c // 64)
    neg = torch.nn.functional.pad(neg, (0, cw * 64 - c)).reshape(*neg.shape[:-1], cw, 64)
    return (neg << torch.arange(64)).sum(-1)


def _bitpacked_conv(L, x, w, a=None, t=None, stride=1, padding=0, dilation=1, pad_value=-1):
    """Bit-packed input (float output with alpha), or float input and thresholded output."""
    torch = _torch(L)
    if torch is not None:
        y = _conv_ref(torch, x, w, a if t is None else None, stride, padding, dilation,
                      pad_value)
        return y if t is None else _bits_ref(torch, y, t)
    from tessera.ops.binary import binary_pack, bitpacked_binary_conv2d
    words = binary_pack(w.permute(0, 2, 3, 1).contiguous())
    if t is None:
        x = binary_pack(x.permute(0, 2, 3, 1).contiguous())
    return bitpacked_binary_conv2d(x, words, a if t is None else None, t, w.shape[1],
                                   stride=stride, padding=padding, dilation=dilation,
                                   pad_value=pad_value)


def _thresholds(rng, o: int, k: int) -> np.ndarray:
    t = np.stack([rng.integers(-k, k + 1, o), rng.integers(0, 2, o)], 1)
    t[0, 0] = 1 << 40   # a constant sign
    return t.astype(np.int64)


def _bitpacked_conv_samples(rng, dt):
    for s in _conv_samples(rng, dt):
        yield s
        x, w = s.args[:2]
        yield Sample((x, w, None, _thresholds(rng, w.shape[0], int(np.prod(w.shape[1:])))),
                     s.kwargs)


def _bitpacked_linear(L, x, w, a=None, t=None):
    torch = _torch(L)
    if torch is not None:
        y = _linear(L, x, w, a if t is None else None)
        return y if t is None else _bits_ref(torch, y, t)
    from tessera.ops.binary import binary_pack, bitpacked_binary_linear
    if t is None:
        x = binary_pack(x)
    return bitpacked_binary_linear(x, binary_pack(w), a if t is None else None, t, w.shape[1])


def _bitpacked_linear_samples(rng, dt):
    for xs, o in [((3, 10), 4), ((1, 130), 70), ((2, 64), 5), ((0, 8), 3)]:
        x, w = _away(rng, xs, dt), _away(rng, (o, xs[-1]), dt)
        yield Sample((x, w, rng.uniform(0.1, 2.0, o).astype(dt)))
        yield Sample((x, w, None, _thresholds(rng, o, xs[-1])))


def _roundtrip(L, x):
    torch = _torch(L)
    if torch is not None:
        return _sgn(torch, x)
    from tessera.ops.binary import binary_pack, binary_unpack
    return binary_unpack(binary_pack(x), x.shape[-1]).to(x.dtype)


def _pack_samples(rng, dt):
    for s in [(5,), (3, 64), (2, 3, 65), (4, 200), (0, 3)]:
        yield Sample((_away(rng, s, dt),))


register(
    OpInfo("binary_sign", _sign, _sign_samples, gradcheck=False),
    OpInfo("binary_conv2d", _conv, _conv_samples, gradcheck=False, noncontiguous=False,
           atol=1e-4, grad_atol=1e-3),
    OpInfo("binary_linear", _linear, _linear_samples, gradcheck=False, atol=1e-4,
           grad_atol=1e-3),
    OpInfo("packed_binary_conv2d", _packed_conv, _conv_samples, dtypes=F32,
           differentiable=False, noncontiguous=False, meta=False, atol=1e-4,
           covers=("packed_binary_conv2d", "binary_pack")),
    OpInfo("packed_binary_linear", _packed_linear, _linear_samples, dtypes=F32,
           differentiable=False, meta=False, atol=1e-4),
    OpInfo("bitpacked_binary_conv2d", _bitpacked_conv, _bitpacked_conv_samples, dtypes=F32,
           differentiable=False, noncontiguous=False, meta=False, atol=1e-4,
           covers=("bitpacked_binary_conv2d", "binary_pack")),
    OpInfo("bitpacked_binary_linear", _bitpacked_linear, _bitpacked_linear_samples,
           dtypes=F32, differentiable=False, meta=False, atol=1e-4,
           covers=("bitpacked_binary_linear", "binary_pack")),
    OpInfo("binary_unpack", _roundtrip, _pack_samples, differentiable=False, meta=False,
           covers=("binary_unpack", "binary_pack")),
)
