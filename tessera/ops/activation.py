"""Activation ops: pointwise nonlinearities, softmax and log_softmax.

Each op has one fused, numerically stable NumPy kernel (float16/bfloat16 compute in float32)
and a grad rule written with tessera ops. The hot ones (gelu, silu, softmax, log_softmax)
have their own backward op with a fused kernel, whose grad rule is again tessera ops, so
double backward works:

    gelu(x)                  grad: gelu_backward(g, x)
    silu(x)                  grad: silu_backward(g, x)
    softmax(x, dim)          grad: softmax_backward(g, y, dim)          (y = output)
    log_softmax(x, dim)      grad: log_softmax_backward(g, y, dim)

selu and celu are ``elu`` with PyTorch's ``scale``/``input_scale`` attrs; relu6 is hardtanh.
The softmax family also declares its decomposition into reductions and elementwise ops, which
the code generator fuses into one loop nest per row.
Argument handling (``inplace=``, defaults, legacy rules) lives in ``tessera.nn.functional``.

>>> import tessera
>>> tessera.softmax(tessera.tensor([0., 0.]), 0)
tensor([0.5000, 0.5000])
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera.ops import _jax, _relax, cost, reduce as R
from tessera.ops._elementwise import POINTWISE, checked_scalar
from tessera.ops._sbp import pointwise
from tessera.ops._util import call, missing, wrap_dim
from tessera.ops.registry import Meta, defop
from tessera.ops.ternary import where
from tessera.ops.unary import exp, sigmoid, tanh
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__ = ["softmax", "log_softmax"]

_LOWP = (np.dtype(np.float16), D.bfloat16.np)
_TNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
SQRT_2_PI = math.sqrt(2.0 / math.pi)   # gelu's tanh approximation
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
KAPPA = 0.044715


def tname(d: D.dtype) -> str:
    """PyTorch's name of a dtype in kernel errors ('Long', 'Float', ...)."""
    return _TNAME.get(d.name, d.name)


def need_tensor(name: str, m, arg: str = "input", pos: int = 1) -> Meta:
    if type(m) is not Meta:
        raise TypeError(f"{name}(): argument '{arg}' (position {pos}) must be Tensor, not "
                        f"{type(m).__name__}")
    return m


def need_float(kname: str, m: Meta) -> None:
    """PyTorch's dispatch error for a kernel that has no integer/bool version."""
    if m.dtype.category != 2:
        raise NotImplementedError(f"\"{kname}\" not implemented for '{tname(m.dtype)}'")


def upcast(x: np.ndarray) -> np.ndarray:
    """float16/bfloat16 compute in float32 (dispatch rounds the result back once)."""
    return x.astype(np.float32) if x.dtype in _LOWP else x


# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), with fractional error < 1.2e-7 for all
# z >= 0 (Numerical Recipes' Chebyshev fit "erfcc"), highest coefficient first.
_ERFC_P = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
           0.09678418, 0.37409196, 1.00002368, -1.26551223)
_BLOCK = 32768   # float32 elements per block: the ~25 passes over a block stay in cache


def _phi_block(x, p, z, t) -> None:
    """Phi(x) (the standard normal CDF) of a 1-d float32 block into ``p``; ``z`` and ``t`` are
    scratch. Its relative error stays ~1e-7 even far into the negative tail, where PyTorch's
    float32 ``0.5 * (1 + erf)`` loses every digit to cancellation."""
    f = np.float32
    np.abs(x, out=z)
    z *= f(0.7071067811865476)
    np.multiply(z, f(0.5), out=t)
    t += f(1)
    np.reciprocal(t, out=t)
    np.multiply(t, f(_ERFC_P[0]), out=p)
    for c in _ERFC_P[1:-1]:
        p += f(c)
        p *= t
    p += f(_ERFC_P[-1])
    np.multiply(x, x, out=z)      # z^2 = x^2 / 2, with one rounding fewer than (|x|/sqrt2)^2
    z *= f(0.5)
    p -= z
    np.exp(p, out=p)
    p *= t
    p *= f(0.5)                   # p = Phi(-|x|) = erfc(|x| / sqrt2) / 2
    # Phi(x) = [x <= 0] p + [x > 0] (1 - p): products with 0/1 and a sum with a zero are
    # exact, and ~20x faster on float32 than np.where or a where= mask
    np.subtract(f(1), p, out=z)
    z *= x > 0
    p *= x <= 0
    p += z


def _gelu_f32(x: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
    """Exact gelu of float32 ``x`` (or ``g * gelu'(x)`` when ``g`` is given), a block at a
    time: ~3x faster than scipy's ndtr, which evaluates every element in float64."""
    xf = np.ascontiguousarray(x).reshape(-1)
    gf = None if g is None else np.ascontiguousarray(g, np.float32).reshape(-1)
    out = np.empty_like(xf)
    z = np.empty(min(_BLOCK, xf.size), np.float32)
    t = np.empty_like(z)
    for i in range(0, xf.size, _BLOCK):
        xs = xf[i:i + _BLOCK]
        n = xs.size
        p, zs = out[i:i + n], z[:n]
        _phi_block(xs, p, zs, t[:n])
        if gf is None:
            p *= xs
            continue
        np.multiply(xs, xs, out=zs)   # gelu'(x) = Phi(x) + x phi(x)
        zs *= np.float32(-0.5)
        np.exp(zs, out=zs)
        zs *= xs
        zs *= np.float32(INV_SQRT_2PI)
        p += zs
        p *= gf[i:i + n]
    return out.reshape(np.shape(x))


def _ndtr(x):
    import scipy.special  # lazily: only gelu needs it (float64; float32 uses _phi_block)
    return scipy.special.ndtr(x)


# ---- the pointwise-op pattern ---------------------------------------------------------------

def _pointwise(name: str, kernel, grad, flops: int, kname: str | None = None,
               ints: bool = False, check=None, save=("inputs",), to_c=None):
    """Register an elementwise activation: same shape and dtype out, ``flops`` operations
    per element, any split. ``ints``: integer inputs are allowed (relu-like ops);
    ``check(x, **attrs)`` validates attrs."""
    kname = kname or f"{name}_cpu"

    def infer(x, **attrs):
        need_tensor(name, x)
        if x.dtype is D.bool_ or (not ints and x.dtype.category != 2):
            raise NotImplementedError(f"\"{kname}\" not implemented for '{tname(x.dtype)}'")
        if check is not None:
            check(x, **attrs)
        return Meta(x.shape, x.dtype)

    def cpu(x, **attrs):
        with np.errstate(all="ignore"):
            return kernel(upcast(x), **attrs)
    cpu.__name__ = f"{name}_kernel"
    return defop(name, infer, cpu, grad=grad, save=save, sbp=POINTWISE,
                 cost=cost.elementwise(flops), to_c=to_c,
                 to_relax=_relax.rule(name), to_jax=_jax.rule(name))


def _x(ctx):
    return ctx.inputs[0]


# gelu ---------------------------------------------------------------------------------------

def _check_gelu(x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")


def _gelu_kernel(x, approximate="none"):
    if approximate == "tanh":
        inner = np.tanh(SQRT_2_PI * (x + KAPPA * x * x * x))
        inner += 1
        return 0.5 * x * inner
    if x.dtype == np.float32:
        return _gelu_f32(x)
    return x * _ndtr(x)


def _gelu_backward_kernel(g, x, approximate="none"):
    g, x = upcast(g), upcast(x)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            x2 = x * x
            t = np.tanh(SQRT_2_PI * (x + KAPPA * x2 * x))
            right = 0.5 * x * (1 - t * t) * (SQRT_2_PI * (1 + 3 * KAPPA * x2))
            return g * (0.5 * (1 + t) + right)
        if x.dtype == np.float32:
            return _gelu_f32(x, np.broadcast_to(g, x.shape))
        pdf = np.exp(-0.5 * x * x)
        pdf *= INV_SQRT_2PI * x
        pdf += _ndtr(x)
        return g * pdf


def _gelu_backward_infer(g, x, approximate="none"):
    return Meta(x.shape, x.dtype)


def _gelu_backward_grad(ctx, gg):
    """f(g, x) = g gelu'(x): d/dg = gelu_backward(gg, x); d/dx = gg g gelu''(x)."""
    g, x = ctx.inputs
    a = ctx.attrs.get("approximate", "none")
    need = ctx.needs_input_grad
    dg = gelu_backward(gg, x, a) if need[0] else None
    if not need[1]:
        return dg, None
    if a == "tanh":
        x2 = x * x
        du = SQRT_2_PI * (1 + 3 * KAPPA * x2)
        t = tanh(SQRT_2_PI * (x + KAPPA * x2 * x))
        d2 = (1 - t * t) * (du + 0.5 * x * (6 * SQRT_2_PI * KAPPA * x - 2 * t * du * du))
    else:
        d2 = INV_SQRT_2PI * exp(-0.5 * x * x) * (2 - x * x)
    return dg, gg * g * d2


def _gelu_c(c, a, at):
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        inner = f"{c.lit(0.7978845608028654)} * ({x} + {c.lit(0.044715)} * {x} * {x} * {x})"
        return f"(({c.T})0.5 * {x} * (({c.T})1 + {c.tsr('tanh')}({inner})))"
    return f"({x} * {c.tsr('phi')}({x}))"


def _gelu_backward_c(c, a, at):
    g, x = a
    if at.get("approximate", "none") == "tanh":
        k, s = c.lit(0.044715), c.lit(0.7978845608028654)
        return (f"({{ {c.T} x2 = {x} * {x}; {c.T} t = {c.tsr('tanh')}({s} * ({x} + {k} * x2 * "
                f"{x})); {g} * (({c.T})0.5 * (1 + t) + ({c.T})0.5 * {x} * (1 - t * t) * ({s} * "
                f"(1 + 3 * {k} * x2))); }})")
    # Phi(x) + x phi(x); float32 shares one exponential between the two terms
    return f"({g} * {c.tsr('gelu_grad')}({x}))"


# gelu: x Phi(x); the backward g (Phi(x) + x phi(x)) (the tanh forms: a few more, alike)
_GELU = _pointwise("gelu", _gelu_kernel,
                   lambda ctx, g: (gelu_backward(g, _x(ctx), ctx.attrs.get("approximate",
                                                                           "none")),),
                   2, kname="GeluKernelImpl", check=_check_gelu, to_c=_gelu_c)
_GELU_BACKWARD = defop("gelu_backward", _gelu_backward_infer, _gelu_backward_kernel,
                       grad=_gelu_backward_grad, sbp=pointwise(each=(0,)),
                       cost=cost.elementwise(5), to_c=_gelu_backward_c,
                       to_relax=_relax.gelu_backward, to_jax=_jax.gelu_backward)


def gelu(input, approximate: str = "none"):
    return call(_GELU, input, approximate=approximate)


def gelu_backward(grad, input, approximate: str = "none"):
    """The gradient of gelu at ``input`` times ``grad`` (one fused kernel)."""
    return call(_GELU_BACKWARD, grad, input, approximate=approximate)


# silu -----------------------------------------------------------------------------------------

def _sig(x):
    s = np.empty_like(x)  # one buffer for every step (0-d inputs included)
    np.negative(x, out=s)
    np.exp(s, out=s)
    s += 1
    return np.reciprocal(s, out=s)


def _silu_backward_kernel(g, x):
    g, x = upcast(g), upcast(x)
    with np.errstate(all="ignore"):
        s = _sig(x)
        d = 1 - s
        d *= x
        d += 1
        d *= s
        return g * d


def _silu_backward_grad(ctx, gg):
    """silu'(x) = s (1 + x (1 - s)); silu''(x) = s (1 - s) (2 + x (1 - 2 s))."""
    g, x = ctx.inputs
    need = ctx.needs_input_grad
    dg = silu_backward(gg, x) if need[0] else None
    if not need[1]:
        return dg, None
    s = sigmoid(x)
    return dg, gg * g * (s * (1 - s) * (2 + x * (1 - 2 * s)))


def _silu_backward_c(c, a, at):
    g, x = a
    return (f"({{ {c.T} s = {c.tsr('sigmoid')}({x}); {g} * (s * (1 + {x} * (1 - s))); }})")


_SILU = _pointwise("silu", lambda x: x * _sig(x),
                   lambda ctx, g: (silu_backward(g, _x(ctx)),), 2,
                   to_c=lambda c, a, at: f"({a[0]} * {c.tsr('sigmoid')}({a[0]}))")
_SILU_BACKWARD = defop("silu_backward", lambda g, x: Meta(x.shape, x.dtype),
                       _silu_backward_kernel, grad=_silu_backward_grad,
                       sbp=pointwise(each=(0,)), cost=cost.elementwise(6), to_c=_silu_backward_c,
                       to_relax=_relax.silu_backward, to_jax=_jax.silu_backward)


def silu_backward(grad, input):
    return call(_SILU_BACKWARD, grad, input)


# mish, softplus, logsigmoid -------------------------------------------------------------------

def _softplus_np(z):
    """log(1 + exp(z)) without overflow."""
    return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


def _mish_grad(ctx, g):
    x = _x(ctx)
    t = tanh(softplus(x))
    return (g * (t + x * sigmoid(x) * (1 - t * t)),)


def _softplus_c(c, z):
    """log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|))."""
    return (f"(({z} > 0 ? {z} : ({c.T})0) + {c.tsr('log1p')}({c.tsr('exp')}(-{c.fn('fabs')}"
            f"({z}))))")


_MISH = _pointwise("mish", lambda x: x * np.tanh(_softplus_np(x)), _mish_grad, 3,
                   to_c=lambda c, a, at: f"({a[0]} * {c.tsr('tanh')}({_softplus_c(c, a[0])}))")


def _softplus_kernel(x, beta=1.0, threshold=20.0):
    z = x * beta
    return np.where(z > threshold, x, np.log1p(np.exp(z)) / beta)


def _softplus_grad(ctx, g):
    x = _x(ctx)
    beta, th = ctx.attrs.get("beta", 1.0), ctx.attrs.get("threshold", 20.0)
    z = x * beta
    return (where(z > th, g, g * sigmoid(z)),)


def _softplus_rule_c(c, a, at):
    beta, th = at.get("beta", 1.0), at.get("threshold", 20.0)
    z = f"({a[0]} * {c.lit(beta)})"
    return (f"({z} > {c.lit(th)} ? {a[0]} : {c.tsr('log1p')}({c.tsr('exp')}({z})) / "
            f"{c.lit(beta)})")


_SOFTPLUS = _pointwise("softplus", _softplus_kernel, _softplus_grad, 4, to_c=_softplus_rule_c)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    return call(_SOFTPLUS, input, beta=beta, threshold=threshold)


_LOGSIGMOID = _pointwise(
    "log_sigmoid", lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))),
    lambda ctx, g: (g * sigmoid(-_x(ctx)),), 4, to_c=lambda c, a, at: (
        f"(({a[0]} < 0 ? {a[0]} : ({c.T})0) - {c.tsr('log1p')}({c.tsr('exp')}(-{c.fn('fabs')}"
        f"({a[0]}))))"))


# relu family: leaky_relu, elu (selu, celu), hardtanh (relu6), threshold --------------------------

def _leaky_relu_c(c, a, at):
    return f"({a[0]} > 0 ? {a[0]} : {a[0]} * {c.lit(at.get('negative_slope', 0.01))})"


_LEAKY = _pointwise("leaky_relu",
                    lambda x, negative_slope=0.01: np.where(x > 0, x, x * negative_slope),
                    lambda ctx, g: (where(_x(ctx) > 0, g,
                                          g * ctx.attrs.get("negative_slope", 0.01)),),
                    2, to_c=_leaky_relu_c)


def _elu_kernel(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return np.where(x <= 0, np.expm1(x * input_scale) * (alpha * scale), x * scale)


def _elu_grad(ctx, g):
    x = _x(ctx)
    a = ctx.attrs
    alpha, scale, iscale = a.get("alpha", 1.0), a.get("scale", 1.0), a.get("input_scale", 1.0)
    neg = g * exp(x * iscale) * (iscale * alpha * scale)
    return (where(x <= 0, neg, g * scale),)


def _elu_c(c, a, at):
    x = a[0]
    alpha, scale = at.get("alpha", 1.0), at.get("scale", 1.0)
    inner = at.get("input_scale", 1.0)
    return (f"({x} <= 0 ? {c.tsr('expm1')}({x} * {c.lit(inner)}) * {c.lit(alpha * scale)} : "
            f"{x} * {c.lit(scale)})")


_ELU = _pointwise("elu", _elu_kernel, _elu_grad, 3, to_c=_elu_c)


def _int_bound(v, dt: np.dtype):
    """A float bound as PyTorch converts it for an integer tensor (truncation)."""
    return int(v) if dt.kind in "iu" else v


def _hardtanh_kernel(x, min_val=-1.0, max_val=1.0):
    lo, hi = _int_bound(min_val, x.dtype), _int_bound(max_val, x.dtype)
    return np.minimum(np.maximum(x, lo), hi).astype(x.dtype, copy=False)


def _check_hardtanh(x, min_val=-1.0, max_val=1.0):
    # Scalars: NaN or out of range raises, as in PyTorch, which reads a float limit of an
    # integer tensor as an int64 first
    for v in (min_val, max_val):
        if x.dtype.category == 1 and isinstance(v, float):
            checked_scalar(v, D.int64)
    if x.dtype is D.uint8 and (min_val < 0 or max_val < 0):
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
    checked_scalar(min_val, x.dtype)
    checked_scalar(max_val, x.dtype)


def _hardtanh_grad(ctx, g):
    x = _x(ctx)
    lo, hi = ctx.attrs.get("min_val", -1.0), ctx.attrs.get("max_val", 1.0)
    return (where((x <= lo) | (x >= hi), 0.0, g),)


def _hardtanh_c(c, a, at):
    lo, hi = c.lit(at.get("min_val", -1.0)), c.lit(at.get("max_val", 1.0))
    return f"({a[0]} < {lo} ? {lo} : ({a[0]} > {hi} ? {hi} : {a[0]}))"


_HARDTANH = _pointwise("hardtanh", _hardtanh_kernel, _hardtanh_grad, 2, ints=True,
                       check=_check_hardtanh, to_c=_hardtanh_c)


def _threshold_kernel(x, threshold=0.0, value=0.0):
    if x.dtype.kind in "iu":  # compared in the tensor's type (-1 is 255 for uint8)
        threshold = np.asarray(threshold).astype(x.dtype)
    return np.where(x <= threshold, np.asarray(value).astype(x.dtype), x)


def _threshold_c(c, a, at):
    return f"({a[0]} <= {c.lit(at.get('threshold', 0.0))} ? {c.lit(at.get('value', 0.0))} " \
           f": {a[0]})"


def _check_threshold(x, threshold=0.0, value=0.0):
    # Scalars: NaN or out of range raises, as in PyTorch (which compares in float32 for
    # float16 and bfloat16)
    checked_scalar(threshold, D.float32 if x.dtype in (D.float16, D.bfloat16) else x.dtype)
    checked_scalar(value, x.dtype)


_THRESHOLD = _pointwise("threshold", _threshold_kernel,
                        lambda ctx, g: (where(_x(ctx) <= ctx.attrs["threshold"], 0.0, g),),
                        1, ints=True, check=_check_threshold, to_c=_threshold_c)


# hard gates and shrinks ------------------------------------------------------------------------

def _relu6_np(z):
    return np.minimum(np.maximum(z, 0), 6)


def _relu6_c(c, x):
    return f"({x} < 0 ? ({c.T})0 : ({x} > 6 ? ({c.T})6 : {x}))"


# PyTorch's hardsigmoid backward multiplies by the float literal 1.0f / 6.0f in every dtype
ONE_SIXTH_F32 = float(np.float32(1.0) / np.float32(6.0))
_HARDSIGMOID = _pointwise(
    "hardsigmoid", lambda x: _relu6_np(x + 3) / 6,
    lambda ctx, g: (where((_x(ctx) > -3) & (_x(ctx) < 3), g * ONE_SIXTH_F32, 0.0),), 3,
    to_c=lambda c, a, at: f"({_relu6_c(c, f'({a[0]} + 3)')} / 6)")


def _hardswish_grad(ctx, g):
    x = _x(ctx)
    mid = where(x <= 3, g * (x / 3 + 0.5), g)
    return (where(x < -3, 0.0, mid),)


_HARDSWISH = _pointwise("hardswish", lambda x: x * _relu6_np(x + 3) / 6, _hardswish_grad, 4,
                        to_c=lambda c, a, at: f"({a[0]} * {_relu6_c(c, f'({a[0]} + 3)')} / 6)")


def _shrink_grad(ctx, g):
    x, lam = _x(ctx), ctx.attrs.get("lambd", 0.5)
    return (where((x >= -lam) & (x <= lam), 0.0, g),)


def _check_softshrink(x, lambd=0.5):
    if not lambd >= 0:
        raise RuntimeError(f"lambda must be in range [0, 3.40282e+38] for input dtype "
                           f"{tname(x.dtype)}, but found {lambd}")


def _softshrink_kernel(x, lambd=0.5):
    return np.where(x > lambd, x - lambd, np.where(x < -lambd, x + lambd, 0)).astype(x.dtype)


_SOFTSHRINK = _pointwise("softshrink", _softshrink_kernel, _shrink_grad, 2,
                         kname="softshrink_check", check=_check_softshrink)
_HARDSHRINK = _pointwise(
    "hardshrink",
    lambda x, lambd=0.5: np.where((x >= -lambd) & (x <= lambd), np.zeros((), x.dtype), x),
    _shrink_grad, 1)


# prelu ----------------------------------------------------------------------------------------

def _prelu_infer(x, w):
    need_tensor("prelu", x)
    need_tensor("prelu", w, "weight", 2)
    if len(w.shape) > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: "
                           f"ndim = {len(w.shape)}")
    need_float("prelu_cpu", x)
    if w.dtype is not x.dtype:
        raise RuntimeError(f"prelu: Type promoting not supported. Got {tname(x.dtype)} and "
                           f"{tname(w.dtype)}")
    n = int(np.prod(w.shape))
    channels = x.shape[1] if len(x.shape) >= 2 else 1
    if n != 1 and n != channels:
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                           f"parameter numbers = {n} and channel size = {channels}.")
    return Meta(x.shape, x.dtype)


def _channel_shape(ndim: int, n: int) -> tuple:
    """The shape a per-channel weight broadcasts as against an ``ndim``-d input."""
    if n == 1 or ndim < 2:
        return ()
    return (n,) + (1,) * (ndim - 2)


def _prelu_kernel(x, w):
    x, w = upcast(x), upcast(w)
    wb = w.reshape(_channel_shape(x.ndim, w.size))
    return np.where(x > 0, x, wb * x)


def _prelu_grad(ctx, g):
    x, w = ctx.inputs
    wb = w.reshape(_channel_shape(x.dim(), w.numel()))
    pos = x > 0
    need = ctx.needs_input_grad
    gx = where(pos, g, g * wb) if need[0] else None
    gw = None
    if need[1]:
        contrib = where(pos, 0.0, g * x)
        if wb.dim() == 0:
            gw = contrib.sum().reshape(w.shape)
        else:
            dims = (0,) + tuple(range(2, x.dim()))
            gw = R.sum(contrib, dims).reshape(w.shape)
    return gx, gw


def _prelu_sbp(x, w):
    """Any dim but the channels with the weight whole; the channels with a per-channel
    weight split too (a single weight stays whole)."""
    n = len(x.shape)
    per_c = n >= 2 and w.shape and w.shape[0] != 1
    sigs = [Signature((S(d), B), (S(d),)) for d in range(n) if not (per_c and d == 1)]
    if per_c:
        sigs.append(Signature((S(1), S(0)), (S(1),)))
    return sigs + [Signature((B, B), (B,))]


_PRELU = defop("prelu", _prelu_infer, _prelu_kernel, grad=_prelu_grad,
               sbp=SbpRule(_prelu_sbp), cost=cost.elementwise(2), to_jax=_jax.prelu,
               to_relax=_relax.prelu)


def prelu(input, weight):
    """``max(0, x) + weight * min(0, x)``, one weight per channel (dim 1) or one in all."""
    return call(_PRELU, input, weight)


# ---- softmax and log_softmax -----------------------------------------------------------------

def _softmax_infer(name: str, kname: str):
    def infer(x, dim):
        need_tensor(name, x)
        wrap_dim(dim, len(x.shape), name)
        need_float(kname, x)
        return Meta(x.shape, x.dtype)
    return infer


def _along(fn):
    """Wrap a kernel over ``dim``: 0-d inputs compute as one element, empty ones are empty."""
    def kernel(*given, dim):
        arrays = [upcast(a) for a in given]
        x = arrays[0]
        if x.ndim == 0:
            return kernel(*[a.reshape(1) for a in arrays], dim=0).reshape(())
        if x.size == 0:
            return x.copy()
        with np.errstate(all="ignore"):
            return fn(*arrays, axis=dim % x.ndim)
    kernel.__name__ = fn.__name__
    return kernel


@_along
def _softmax_kernel(x, axis):
    e = x - x.max(axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


@_along
def _log_softmax_kernel(x, axis):
    y = x - x.max(axis=axis, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=axis, keepdims=True))
    return y


@_along
def _softmax_backward_kernel(g, y, axis):
    out = g - (g * y).sum(axis=axis, keepdims=True)
    out *= y
    return out


@_along
def _log_softmax_backward_kernel(g, y, axis):
    e = np.exp(y)
    e *= g.sum(axis=axis, keepdims=True)
    return g - e


def _ksum(t, dim):
    return R.sum(t, dim, keepdim=True) if t.dim() else t


def _softmax_backward_grad(ctx, gg):
    """f(g, y) = y * (g - sum(g y)): d/dg = f(gg, y); d/dy = gg (g - sum(g y)) - g sum(gg y)."""
    g, y = ctx.inputs
    dim = ctx.attrs["dim"]
    need = ctx.needs_input_grad
    dg = softmax_backward(gg, y, dim) if need[0] else None
    dy = gg * (g - _ksum(g * y, dim)) - g * _ksum(gg * y, dim) if need[1] else None
    return dg, dy


def _log_softmax_backward_grad(ctx, gg):
    """f(g, y) = g - exp(y) sum(g): d/dg = gg - sum(gg exp(y)); d/dy = -gg exp(y) sum(g)."""
    g, y = ctx.inputs
    dim = ctx.attrs["dim"]
    need = ctx.needs_input_grad
    s = exp(y)
    dg = gg - _ksum(gg * s, dim) if need[0] else None
    dy = -gg * s * _ksum(g, dim) if need[1] else None
    return dg, dy


def _backward_infer(g, y, dim):
    return Meta(y.shape, y.dtype)


# decompositions (``OpDef.decompose``): ``b`` emits reductions and elementwise ops, computing
# what the kernels above compute in the same order of operations

def _rows(x, dim) -> tuple[int, ...]:
    return (dim % len(x.shape),) if x.shape else ()


def _softmax_decompose(b, x, dim):
    d = _rows(x, dim)
    e = b.exp(b.sub(x, b.amax(x, d)))
    return b.div(e, b.sum(e, d))


def _log_softmax_decompose(b, x, dim):
    d = _rows(x, dim)
    z = b.sub(x, b.amax(x, d))
    return b.sub(z, b.log(b.sum(b.exp(z), d)))


def _softmax_backward_decompose(b, g, y, dim):
    return b.mul(b.sub(g, b.sum(b.mul(g, y), _rows(y, dim))), y)


def _log_softmax_backward_decompose(b, g, y, dim):
    return b.sub(g, b.mul(b.exp(y), b.sum(g, _rows(y, dim))))


# any dim but the one reduced over may be split; per element: softmax's max, subtract, exp,
# sum and divide, its backward's product, sum, subtract and product
_ROWWISE = pointwise(skip=("dim",))
_ROWWISE_BACKWARD = pointwise(each=(0,), skip=("dim",))
_SOFTMAX = defop("softmax", _softmax_infer("softmax", "softmax_lastdim_kernel_impl"),
                 _softmax_kernel, save=("outputs",),
                 grad=lambda ctx, g: (softmax_backward(g, ctx.outputs[0], ctx.attrs["dim"]),),
                 sbp=_ROWWISE, cost=cost.elementwise(5), decompose=_softmax_decompose,
                 to_relax=_relax.softmax, to_jax=_jax.softmax)
_LOG_SOFTMAX = defop(
    "log_softmax", _softmax_infer("log_softmax", "log_softmax_lastdim_kernel_impl"),
    _log_softmax_kernel, save=("outputs",),
    grad=lambda ctx, g: (log_softmax_backward(g, ctx.outputs[0], ctx.attrs["dim"]),),
    sbp=_ROWWISE, cost=cost.elementwise(5), decompose=_log_softmax_decompose,
                     to_relax=_relax.log_softmax, to_jax=_jax.log_softmax)
_SOFTMAX_BACKWARD = defop("softmax_backward", _backward_infer, _softmax_backward_kernel,
                          grad=_softmax_backward_grad, sbp=_ROWWISE_BACKWARD,
                          cost=cost.elementwise(4), decompose=_softmax_backward_decompose,
                          to_relax=_relax.softmax_backward, to_jax=_jax.softmax_backward)
_LOG_SOFTMAX_BACKWARD = defop("log_softmax_backward", _backward_infer,
                              _log_softmax_backward_kernel, grad=_log_softmax_backward_grad,
                              sbp=_ROWWISE_BACKWARD, cost=cost.elementwise(4),
                              decompose=_log_softmax_backward_decompose,
                              to_relax=_relax.log_softmax_backward,
                              to_jax=_jax.log_softmax_backward)


def softmax_backward(grad, output, dim: int):
    return call(_SOFTMAX_BACKWARD, grad, output, dim=dim)


def log_softmax_backward(grad, output, dim: int):
    return call(_LOG_SOFTMAX_BACKWARD, grad, output, dim=dim)


def _cast_for(input, dtype):
    if dtype is None:
        return input
    return input.to(D.as_dtype(dtype))


def softmax(input, dim: int | None = None, dtype=None, *, out=None, axis=None):
    """``exp(x) / sum(exp(x))`` along ``dim``; with ``dtype`` the input is cast first.

    >>> import tessera
    >>> tessera.softmax(tessera.tensor([1., 1., 1., 1.]), 0)
    tensor([0.2500, 0.2500, 0.2500, 0.2500])
    """
    dim = dim if axis is None else axis
    if dim is None:
        missing("softmax", dim=dim)
    return call(_SOFTMAX, _cast_for(input, dtype), dim=dim, out=out)


def log_softmax(input, dim: int | None = None, dtype=None, *, out=None, axis=None):
    """``x - logsumexp(x)`` along ``dim``, computed stably in one kernel."""
    dim = dim if axis is None else axis
    if dim is None:
        missing("log_softmax", dim=dim)
    return call(_LOG_SOFTMAX, _cast_for(input, dtype), dim=dim, out=out)
