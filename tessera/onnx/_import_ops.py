"""The import table: ONNX op type -> {first opset: rule}. A rule is ``rule(c, *inputs)``
with tessera tensors (None for an omitted optional input) and returns the output tensor(s);
``c.attr(name, default)`` reads attributes, ``c.ints(t)`` the value of a constant tensor.
A rule raises ``NotImplementedError`` for a case it does not support (an attribute value,
a dtype), which the importer reports with the node's name."""
from __future__ import annotations

import math

import numpy as np

import tessera
import tessera.nn.functional as F
from tessera import _dtype as D
from tessera._tensor import Tensor

__all__ = ["IMPORTERS", "Ctx", "pick", "supported_ops"]

IMPORTERS: dict[str, dict[int, object]] = {}


def onnx_op(*names: str, since: int = 1):
    def deco(fn):
        for n in names:
            IMPORTERS.setdefault(n, {})[since] = fn
        return fn
    return deco


def pick(table: dict, node, opset: int):
    versions = [v for v in table if v <= opset]
    if not versions:
        raise NotImplementedError(f"{node.op_type} needs opset {min(table)}")
    return table[max(versions)]


def supported_ops() -> list[str]:
    return sorted(IMPORTERS)


class Ctx:
    """What a rule knows about its node."""

    def __init__(self, node, opset: int, program=None):
        from onnx import helper
        self.node = node
        self.opset = opset
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for k, v in self.attrs.items():
            if isinstance(v, bytes):
                self.attrs[k] = v.decode()

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def ints(self, t) -> list[int]:
        """The value of a (constant) integer tensor as a list."""
        return [int(v) for v in np.asarray(t.numpy()).reshape(-1)]

    def value(self, t) -> np.ndarray:
        return np.asarray(t.numpy())

    def unsupported(self, what: str):
        raise NotImplementedError(what)


def _dt(onnx_type: int):
    from tessera.onnx.importer import DTYPES
    dt = DTYPES.get(onnx_type)
    if dt is None:
        raise NotImplementedError(f"data type {onnx_type} is not supported")
    return dt


# ---- elementwise --------------------------------------------------------------------------

_UNARY = {"Abs": tessera.abs, "Acos": tessera.acos, "Acosh": tessera.acosh,
          "Asin": tessera.asin, "Asinh": tessera.asinh, "Atan": tessera.atan,
          "Atanh": tessera.atanh, "Ceil": tessera.ceil, "Cos": tessera.cos,
          "Cosh": tessera.cosh, "Erf": tessera.erf, "Exp": tessera.exp, "Floor": tessera.floor,
          "Log": tessera.log, "Neg": tessera.neg, "Reciprocal": tessera.reciprocal,
          "Sigmoid": tessera.sigmoid, "Sign": tessera.sign, "Sin": tessera.sin,
          "Sinh": tessera.sinh, "Sqrt": tessera.sqrt, "Tan": tessera.tan, "Tanh": tessera.tanh,
          "Not": tessera.logical_not, "IsNaN": tessera.isnan, "Round": tessera.round,
          "Softsign": F.softsign, "HardSwish": F.hardswish, "Mish": F.mish,
          "BitwiseNot": tessera.bitwise_not}
for _name, _fn in _UNARY.items():
    onnx_op(_name)(lambda c, x, _f=_fn: _f(x))


@onnx_op("Identity")
def _identity(c, x):
    return x


@onnx_op("Relu")
def _relu(c, x):
    return F.relu(x) if x.dtype.is_floating_point else tessera.clamp(x, min=0)


@onnx_op("Softplus")
def _softplus(c, x):
    return tessera.logaddexp(x, tessera.zeros_like(x)) if hasattr(tessera, "logaddexp") \
        else F.softplus(x, threshold=1e30)


@onnx_op("IsInf")
def _isinf(c, x):
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    if pos and neg:
        return tessera.isinf(x)
    if pos:
        return tessera.isposinf(x)
    if neg:
        return tessera.isneginf(x)
    return tessera.zeros(x.shape, dtype=tessera.bool)


@onnx_op("Elu")
def _elu(c, x):
    return F.elu(x, alpha=c.attr("alpha", 1.0))


@onnx_op("Selu")
def _selu(c, x):
    a, g = c.attr("alpha", 1.67326319217681884765625), c.attr("gamma", 1.05070102214813232421875)
    return g * tessera.where(x > 0, x, a * (tessera.exp(x) - 1))


@onnx_op("Celu")
def _celu(c, x):
    return F.celu(x, alpha=c.attr("alpha", 1.0))


@onnx_op("LeakyRelu")
def _leaky(c, x):
    return F.leaky_relu(x, c.attr("alpha", 0.01))


@onnx_op("HardSigmoid")
def _hardsigmoid(c, x):
    a, b = c.attr("alpha", 0.2), c.attr("beta", 0.5)
    return tessera.clamp(x * a + b, 0, 1)


@onnx_op("ThresholdedRelu")
def _thresholded_relu(c, x):
    return tessera.where(x > c.attr("alpha", 1.0), x, tessera.zeros_like(x))


@onnx_op("Gelu", since=20)
def _gelu(c, x):
    return F.gelu(x, approximate=c.attr("approximate", "none"))


@onnx_op("Shrink")
def _shrink(c, x):
    lambd, bias = c.attr("lambd", 0.5), c.attr("bias", 0.0)
    zero = tessera.zeros_like(x)
    out = tessera.where(x < -lambd, x + bias, tessera.where(x > lambd, x - bias, zero))
    return out.to(x.dtype)


@onnx_op("PRelu")
def _prelu(c, x, slope):
    return tessera.where(x < 0, x * slope, x)


@onnx_op("Clip", since=11)
def _clip(c, x, lo=None, hi=None):
    from tessera.graph.trace import is_symbolic
    if lo is None and hi is None:
        return x
    if not any(t is not None and (is_symbolic(t) or t.requires_grad) for t in (lo, hi)):
        return tessera.clamp(x, None if lo is None else c.value(lo).item(),
                             None if hi is None else c.value(hi).item())
    if lo is not None:
        x = tessera.maximum(x, lo)
    if hi is not None:
        x = tessera.minimum(x, hi)
    return x


@onnx_op("Clip")
def _clip6(c, x):
    return tessera.clamp(x, c.attr("min", -3.4028234663852886e38),
                         c.attr("max", 3.4028234663852886e38))


def _same(a: Tensor, b: Tensor):
    if a.dtype is not b.dtype:
        raise NotImplementedError(f"inputs of types {a.dtype} and {b.dtype}")
    return a, b


def _binary(fn):
    def rule(c, a, b):
        a, b = _same(a, b)
        return fn(a, b)
    return rule


for _name, _fn in {"Add": tessera.add, "Sub": tessera.sub, "Mul": tessera.mul,
                   "Equal": tessera.eq, "Less": tessera.lt, "LessOrEqual": tessera.le,
                   "Greater": tessera.gt, "GreaterOrEqual": tessera.ge,
                   "And": tessera.logical_and, "Or": tessera.logical_or,
                   "Xor": tessera.logical_xor, "BitwiseAnd": tessera.bitwise_and,
                   "BitwiseOr": tessera.bitwise_or, "BitwiseXor": tessera.bitwise_xor,
                   "MatMul": tessera.matmul}.items():
    onnx_op(_name)(_binary(_fn))


@onnx_op("Div")
def _div(c, a, b):
    a, b = _same(a, b)
    if a.dtype.is_floating_point:
        return a / b
    return tessera.div(a, b, rounding_mode="trunc")


@onnx_op("Pow")
def _pow(c, a, b):
    if a.dtype.is_floating_point:
        return tessera.pow(a, b.to(a.dtype))
    return tessera.pow(a.double(), b.double()).to(a.dtype)


@onnx_op("Mod")
def _mod(c, a, b):
    a, b = _same(a, b)
    if c.attr("fmod", 0):
        return tessera.fmod(a, b)
    return tessera.remainder(a, b)


def _variadic(fn):
    def rule(c, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out
    return rule


onnx_op("Max")(_variadic(tessera.maximum))
onnx_op("Min")(_variadic(tessera.minimum))
onnx_op("Sum")(_variadic(tessera.add))


@onnx_op("Mean")
def _mean(c, *xs):
    return _variadic(tessera.add)(c, *xs) / len(xs)


@onnx_op("Where")
def _where(c, cond, a, b):
    return tessera.where(cond, a, b)


@onnx_op("Gemm")
def _gemm(c, a, b, bias=None):
    if c.attr("transA", 0):
        a = a.transpose(0, 1)
    if c.attr("transB", 0):
        b = b.transpose(0, 1)
    y = tessera.matmul(a, b)
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    if alpha != 1:
        y = y * alpha
    if bias is not None:
        y = y + (bias * beta if beta != 1 else bias)
    return y


@onnx_op("Cast")
def _cast(c, x):
    to = _dt(c.attr("to"))
    if x.dtype.is_floating_point and to is D.bool_:
        return x != 0
    return x.to(to)


@onnx_op("CastLike")
def _cast_like(c, x, like):
    return x.to(like.dtype)


# ---- reductions -------------------------------------------------------------------------

def _axes(c, x, axes_t=None, since_input=True):
    if since_input and axes_t is not None:
        axes = c.ints(axes_t)
    else:
        axes = c.attr("axes")
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            return None
        return list(range(x.dim()))
    return [a % max(x.dim(), 1) for a in axes]


def _reduction(fn, input_axes_since: int):
    def rule(c, x, axes_t=None):
        axes = _axes(c, x, axes_t, c.opset >= input_axes_since)
        if axes is None:
            return x
        keep = bool(c.attr("keepdims", 1))
        if not axes:
            return fn(x, None, keep) if x.dim() == 0 else x
        return fn(x, axes, keep)
    return rule


def _rsum(x, axes, keep):
    return tessera.sum(x, dim=axes, keepdim=keep) if axes else x


def _rmean(x, axes, keep):
    return tessera.mean(x, dim=axes, keepdim=keep) if axes else x


def _rmax(x, axes, keep):
    if x.numel() == 0:
        return _empty_reduce(x, axes, keep, "max")
    return tessera.amax(x, dim=axes, keepdim=keep) if axes else x


def _rmin(x, axes, keep):
    if x.numel() == 0:
        return _empty_reduce(x, axes, keep, "min")
    return tessera.amin(x, dim=axes, keepdim=keep) if axes else x


def _empty_reduce(x, axes, keep, kind):
    shape = [1 if i in axes else s for i, s in enumerate(x.shape)] if keep else \
        [s for i, s in enumerate(x.shape) if i not in axes]
    if x.dtype.is_floating_point:
        v = -math.inf if kind == "max" else math.inf
    else:
        info = np.iinfo(x.dtype.np) if x.dtype is not D.bool_ else None
        v = (info.min if kind == "max" else info.max) if info else kind == "min"
    return tessera.full(shape, v, dtype=x.dtype)


def _rprod(x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = tessera.prod(x, dim=a, keepdim=keep)
    return x


_REDUCERS = {
    "ReduceSum": (_rsum, 13),
    "ReduceMean": (_rmean, 18), "ReduceMax": (_rmax, 18), "ReduceMin": (_rmin, 18),
    "ReduceProd": (_rprod, 18),
    "ReduceL1": (lambda x, a, k: _rsum(tessera.abs(x), a, k), 18),
    "ReduceL2": (lambda x, a, k: tessera.sqrt(_rsum(x * x, a, k)), 18),
    "ReduceSumSquare": (lambda x, a, k: _rsum(x * x, a, k), 18),
    "ReduceLogSum": (lambda x, a, k: tessera.log(_rsum(x, a, k)), 18),
    "ReduceLogSumExp": (lambda x, a, k: tessera.logsumexp(x, dim=a, keepdim=k)
                        if x.numel() else tessera.log(_rsum(tessera.exp(x), a, k)), 18),
}
for _name, (_fn, _since) in _REDUCERS.items():
    onnx_op(_name)(_reduction(_fn, _since))


def _arg(fn):
    def rule(c, x):
        axis = c.attr("axis", 0) % max(x.dim(), 1)
        keep = bool(c.attr("keepdims", 1))
        if c.attr("select_last_index", 0):
            flipped = x.flip(axis)
            i = fn(flipped, dim=axis, keepdim=keep)
            return (x.shape[axis] - 1) - i
        return fn(x, dim=axis, keepdim=keep)
    return rule


onnx_op("ArgMax")(_arg(tessera.argmax))
onnx_op("ArgMin")(_arg(tessera.argmin))


@onnx_op("CumSum")
def _cumsum(c, x, axis):
    a = c.ints(axis)[0]
    if c.attr("reverse", 0):
        x = x.flip(a)
    y = tessera.cumsum(x, a).to(x.dtype)
    if c.attr("exclusive", 0):
        y = y - x
    if c.attr("reverse", 0):
        y = y.flip(a)
    return y


def _softmax(fn, name):
    def rule13(c, x):
        return fn(x, dim=c.attr("axis", -1))

    def rule1(c, x):  # opsets < 13: over the flattened dims from axis on
        axis = c.attr("axis", 1) % max(x.dim(), 1)
        shape = x.shape
        flat = x.reshape(int(np.prod(shape[:axis], dtype=np.int64)), -1)
        return fn(flat, dim=1).reshape(shape)
    onnx_op(name, since=13)(rule13)
    onnx_op(name)(rule1)


_softmax(F.softmax, "Softmax")
_softmax(F.log_softmax, "LogSoftmax")


@onnx_op("Hardmax", since=13)
def _hardmax(c, x):
    axis = c.attr("axis", -1)
    i = tessera.argmax(x, dim=axis, keepdim=True)
    return tessera.zeros_like(x).scatter(axis, i, 1.0)


@onnx_op("TopK", since=10)
def _topk(c, x, k):
    kk = c.ints(k)[0]
    axis = c.attr("axis", -1)
    largest = bool(c.attr("largest", 1))
    # stable order: equal values keep their index order, as ONNX specifies
    idx = tessera.argsort(x, dim=axis, descending=largest, stable=True)
    idx = idx.narrow(axis % x.dim(), 0, kk)
    return tessera.gather(x, axis, idx), idx


import tessera.onnx._import_shape  # noqa: E402,F401  (shape, indexing and nn ops)

