"""ONNX converters: one table, keyed by op name and then by the first opset a rule is
valid for (STYLE.md rule 9; onnx_chainer's ``@support``). ``attach()`` copies each entry
onto its ``OpDef.to_onnx``, so an op's ONNX rule lives with the op; the exporter picks, per
node, the rule with the highest opset not above the one requested.

A rule is ``rule(b, n) -> output name | list of names (None for an output it does not
produce)``: ``b`` is the ``Builder`` (``b.op``, ``b.const``, ``b.ints``, ``b.cast``), ``n``
the ``NodeView`` (``n.ins``: ONNX names of tensor inputs, Python values of the others;
``n.attrs``; symbolic shapes and dtypes). A rule that meets a case it cannot express raises
``NotImplementedError`` with the reason; the exporter adds the op and module path.

This module imports no ``onnx``: ``import tessera`` attaches the table.

>>> from tessera.ops.registry import REGISTRY
>>> sorted(REGISTRY["layer_norm"].to_onnx)
[13, 17]
"""
from __future__ import annotations

import math

import numpy as np

from tessera import _dtype as D
from tessera.ops.registry import REGISTRY

__all__ = ["RULES", "rule", "attach"]

RULES: dict[str, dict[int, object]] = {}


def rule(*ops: str, opset: int = 13):
    """Register the decorated function as the converter of ``ops`` from ``opset`` on."""
    def deco(fn):
        for op in ops:
            RULES.setdefault(op, {})[opset] = fn
        return fn
    return deco


# ---- helpers -------------------------------------------------------------------------------

def _t(b, n, i: int, dtype=None) -> str:
    """Input ``i`` as an ONNX tensor of tessera dtype ``dtype`` (a Python number becomes a
    constant)."""
    x = n.ins[i]
    if n.is_tensor(i):
        return b.cast(x, n.dtype(i), dtype) if dtype is not None else x
    if x is None:
        raise NotImplementedError(f"input {i} is None")
    return b.scalar(x, dtype if dtype is not None else D.scalar_dtype(x))


def _common(n, idx) -> D.dtype:
    args = []
    for i in idx:
        if n.is_tensor(i):
            args.append((n.dtype(i), n.rank(i)))
        elif n.ins[i] is not None:
            args.append(n.ins[i])
    return D.result_type(*args)


def _axis(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _dims(dim, rank: int) -> list[int] | None:
    """Reduction dims as sorted non-negative axes; None for all dims."""
    if dim is None or dim == () or dim == [] or rank == 0:
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return sorted(_axis(d, rank) for d in dim)


def _prod(shape):
    out = 1
    for s in shape:
        if not isinstance(s, int):
            raise NotImplementedError("needs a static size of a dynamic dimension")
        out *= s
    return out


def _f(b, value, dtype) -> str:
    return b.const(value, dtype)


def _reduce(b, op: str, x: str, axes, keepdims: bool) -> str:
    """``op`` over ``axes`` (None: all); axes are an input from opset 18 (ReduceSum: 13)."""
    keep = int(bool(keepdims))
    if axes is None:
        return b.op(op, [x], keepdims=keep)
    if op == "ReduceSum" or b.opset >= 18:
        return b.op(op, [x, b.ints(axes)], keepdims=keep)
    return b.op(op, [x], axes=list(axes), keepdims=keep)


# ---- elementwise: unary -------------------------------------------------------------------

_UNARY = {"abs": "Abs", "acos": "Acos", "acosh": "Acosh", "asin": "Asin", "asinh": "Asinh",
          "atan": "Atan", "atanh": "Atanh", "ceil": "Ceil", "cos": "Cos", "cosh": "Cosh",
          "erf": "Erf", "exp": "Exp", "floor": "Floor", "log": "Log", "neg": "Neg",
          "reciprocal": "Reciprocal", "sigmoid": "Sigmoid", "sign": "Sign", "sin": "Sin",
          "sinh": "Sinh", "sqrt": "Sqrt", "tan": "Tan", "tanh": "Tanh", "positive": "Identity",
          "clone": "Identity"}


def _unary(onnx_op: str):
    def conv(b, n):
        return b.op(onnx_op, [_t(b, n, 0, n.out_dtype())])
    conv.__name__ = f"_{onnx_op.lower()}"
    return conv


for _name, _op in _UNARY.items():
    rule(_name)(_unary(_op))


def _composite(fn):
    """A rule from ``fn(b, x, dtype, attrs) -> name`` on input 0 in the output dtype."""
    def conv(b, n):
        dt = n.out_dtype()
        return fn(b, _t(b, n, 0, dt), dt, n.attrs)
    conv.__name__ = fn.__name__
    return conv


def _sub1(b, x, dt, a):
    return b.op("Sub", [x, _f(b, 1, dt)])


_UNARY_COMPOSITE = {
    "expm1": lambda b, x, dt, a: b.op("Sub", [b.op("Exp", [x]), _f(b, 1, dt)]),
    "log1p": lambda b, x, dt, a: b.op("Log", [b.op("Add", [x, _f(b, 1, dt)])]),
    "log2": lambda b, x, dt, a: b.op("Div", [b.op("Log", [x]), _f(b, math.log(2), dt)]),
    "log10": lambda b, x, dt, a: b.op("Div", [b.op("Log", [x]), _f(b, math.log(10), dt)]),
    "exp2": lambda b, x, dt, a: b.op("Pow", [_f(b, 2, dt), x]),
    "square": lambda b, x, dt, a: b.op("Mul", [x, x]),
    "rsqrt": lambda b, x, dt, a: b.op("Reciprocal", [b.op("Sqrt", [x])]),
    "erfc": lambda b, x, dt, a: b.op("Sub", [_f(b, 1, dt), b.op("Erf", [x])]),
    "silu": lambda b, x, dt, a: b.op("Mul", [x, b.op("Sigmoid", [x])]),
    "log_sigmoid": lambda b, x, dt, a: b.op("Neg", [b.op("Softplus", [b.op("Neg", [x])])]),
    "hardsigmoid": lambda b, x, dt, a: b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5),
    "leaky_relu": lambda b, x, dt, a: b.op("LeakyRelu", [x], alpha=float(a["negative_slope"])),
    "hardtanh": lambda b, x, dt, a: b.op("Clip", [x, _f(b, a["min_val"], dt),
                                                  _f(b, a["max_val"], dt)]),
    "softshrink": lambda b, x, dt, a: b.op("Shrink", [x], bias=float(a["lambd"]),
                                           lambd=float(a["lambd"])),
    "mish": lambda b, x, dt, a: b.op("Mul", [x, b.op("Tanh", [b.op("Softplus", [x])])]),
}
for _name, _fn in _UNARY_COMPOSITE.items():
    rule(_name)(_composite(_fn))


@rule("relu")
def _relu(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    if dt.is_floating_point:
        return b.op("Relu", [x])
    return b.op("Max", [x, _f(b, 0, dt)])


@rule("mish", opset=18)
def _mish18(b, n):
    return b.op("Mish", [_t(b, n, 0, n.out_dtype())])


@rule("hardswish", opset=14)
def _hardswish(b, n):
    return b.op("HardSwish", [_t(b, n, 0, n.out_dtype())])


def _trunc_of(b, x, dt):
    return b.op("Mul", [b.op("Sign", [x]), b.op("Floor", [b.op("Abs", [x])])])


@rule("trunc")
def _trunc(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    return _trunc_of(b, x, dt) if dt.is_floating_point else b.op("Identity", [x])


@rule("frac")
def _frac(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    return b.op("Sub", [x, _trunc_of(b, x, dt)])


@rule("round")
def _round(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    d = n.attrs.get("decimals", 0)
    if not dt.is_floating_point:
        return b.op("Identity", [x])
    if not d:
        return b.op("Round", [x])
    s = _f(b, 10.0 ** d, dt)
    return b.op("Div", [b.op("Round", [b.op("Mul", [x, s])]), s])


@rule("gelu")
def _gelu(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    half = b.op("Mul", [x, _f(b, 0.5, dt)])
    if n.attrs.get("approximate", "none") == "tanh":
        x3 = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Mul", [b.op("Add", [x, b.op("Mul", [x3, _f(b, 0.044715, dt)])]),
                             _f(b, math.sqrt(2 / math.pi), dt)])
        return b.op("Mul", [half, b.op("Add", [b.op("Tanh", [inner]), _f(b, 1, dt)])])
    erf = b.op("Erf", [b.op("Mul", [x, _f(b, 1 / math.sqrt(2), dt)])])
    return b.op("Mul", [half, b.op("Add", [erf, _f(b, 1, dt)])])


@rule("gelu", opset=20)
def _gelu20(b, n):
    return b.op("Gelu", [_t(b, n, 0, n.out_dtype())],
                approximate=n.attrs.get("approximate", "none"))


@rule("elu")
def _elu(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    alpha, scale, iscale = (float(n.attrs[k]) for k in ("alpha", "scale", "input_scale"))
    if scale == 1 and iscale == 1:
        return b.op("Elu", [x], alpha=alpha)
    if iscale == 1 and abs(alpha - 1.6732632423543772) < 1e-6 \
            and abs(scale - 1.0507009873554805) < 1e-6:
        return b.op("Selu", [x], alpha=alpha, gamma=scale)
    neg = b.op("Mul", [b.op("Sub", [b.op("Exp", [b.op("Mul", [x, _f(b, iscale, dt)])]),
                                    _f(b, 1, dt)]), _f(b, alpha * scale, dt)])
    pos = b.op("Mul", [x, _f(b, scale, dt)])
    return b.op("Where", [b.op("Greater", [x, _f(b, 0, dt)]), pos, neg])


@rule("softplus")
def _softplus(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    beta, th = float(n.attrs["beta"]), float(n.attrs["threshold"])
    bx = b.op("Mul", [x, _f(b, beta, dt)]) if beta != 1 else x
    sp = b.op("Softplus", [bx])
    if beta != 1:
        sp = b.op("Div", [sp, _f(b, beta, dt)])
    return b.op("Where", [b.op("Greater", [bx, _f(b, th, dt)]), x, sp])


@rule("threshold")
def _threshold(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    return b.op("Where", [b.op("Greater", [x, _f(b, n.attrs["threshold"], dt)]), x,
                          _f(b, n.attrs["value"], dt)])


@rule("hardshrink")
def _hardshrink(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    keep = b.op("Greater", [b.op("Abs", [x]), _f(b, n.attrs["lambd"], dt)])
    return b.op("Where", [keep, x, _f(b, 0, dt)])


@rule("logit")
def _logit(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    eps = n.attrs.get("eps")
    if eps is not None:
        x = b.op("Clip", [x, _f(b, eps, dt), _f(b, 1 - eps, dt)])
    return b.op("Log", [b.op("Div", [x, b.op("Sub", [_f(b, 1, dt), x])])])


@rule("prelu")
def _prelu(b, n):
    dt = n.out_dtype()
    x, w = _t(b, n, 0, dt), _t(b, n, 1, dt)
    if n.rank(0) >= 2 and _prod(n.shape(1)) > 1:
        w = b.op("Reshape", [w, b.ints([-1] + [1] * (n.rank(0) - 2))])
    return b.op("PRelu", [x, w])


@rule("nan_to_num")
def _nan_to_num(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    if not dt.is_floating_point:
        return b.op("Identity", [x])
    fi = np.finfo(dt.np)
    if dt in (D.float16, D.bfloat16):
        ct = D.float32
        x = b.cast(x, dt, ct)
    else:
        ct = dt
    a = n.attrs
    pos = a.get("posinf")
    neg = a.get("neginf")
    x = b.op("Where", [b.op("IsNaN", [x]), _f(b, a.get("nan") or 0.0, ct), x])
    x = b.op("Where", [b.op("IsInf", [x], detect_negative=0),
                       _f(b, fi.max if pos is None else pos, ct), x])
    x = b.op("Where", [b.op("IsInf", [x], detect_positive=0),
                       _f(b, fi.min if neg is None else neg, ct), x])
    return b.cast(x, ct, dt)


def _float_in(b, n):
    """Input 0; float16/bfloat16 as float32 (IsInf and IsNaN take no half types)."""
    dt = n.dtype(0)
    if dt in (D.float16, D.bfloat16):
        return _t(b, n, 0, D.float32), D.float32
    return _t(b, n, 0), dt


@rule("isnan")
def _isnan(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Not", [b.op("Equal", [x, x])])
    return b.op("IsNaN", [x])


def _isinf(pos: int, neg: int):
    def conv(b, n):
        x, dt = _float_in(b, n)
        if not dt.is_floating_point:
            return b.op("Not", [b.op("Equal", [x, x])])
        return b.op("IsInf", [x], detect_positive=pos, detect_negative=neg)
    return conv


rule("isinf")(_isinf(1, 1))
rule("isposinf")(_isinf(1, 0))
rule("isneginf")(_isinf(0, 1))


@rule("isfinite")
def _isfinite(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Equal", [x, x])
    return b.op("Not", [b.op("Or", [b.op("IsNaN", [x]), b.op("IsInf", [x])])])


@rule("signbit")
def _signbit(b, n):
    x, dt = _float_in(b, n)
    if not dt.is_floating_point:
        return b.op("Less", [x, _f(b, 0, dt)])
    zero = _f(b, 0, dt)
    negzero = b.op("And", [b.op("Equal", [x, zero]),
                           b.op("Less", [b.op("Reciprocal", [x]), zero])])
    return b.op("Or", [b.op("Less", [x, zero]), negzero])


@rule("cast")
def _cast(b, n):
    return b.cast(_t(b, n, 0), n.dtype(0), n.out_dtype())


@rule("logical_not")
def _logical_not(b, n):
    return b.op("Not", [_t(b, n, 0, D.bool_)])


@rule("bitwise_not")
def _bitwise_not(b, n):
    dt = n.out_dtype()
    if dt is not D.bool_:
        raise NotImplementedError("integer bitwise ops need opset 18")
    return b.op("Not", [_t(b, n, 0, dt)])


@rule("bitwise_not", opset=18)
def _bitwise_not18(b, n):
    dt = n.out_dtype()
    return b.op("Not" if dt is D.bool_ else "BitwiseNot", [_t(b, n, 0, dt)])


# ---- elementwise: binary and more ---------------------------------------------------------

def _binary(onnx_op: str, compare: bool = False):
    def conv(b, n):
        dt = _common(n, range(len(n.ins))) if compare else n.out_dtype()
        return b.op(onnx_op, [_t(b, n, i, dt) for i in range(len(n.ins))])
    conv.__name__ = f"_{onnx_op.lower()}"
    return conv


for _name, _op in {"mul": "Mul", "maximum": "Max", "minimum": "Min", "pow": "Pow",
                   "matmul": "MatMul"}.items():
    rule(_name)(_binary(_op))
for _name, _op in {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater",
                   "ge": "GreaterOrEqual"}.items():
    rule(_name)(_binary(_op, compare=True))


@rule("ne")
def _ne(b, n):
    return b.op("Not", [_binary("Equal", compare=True)(b, n)])


def _alpha_op(onnx_op: str):
    def conv(b, n):
        dt = n.out_dtype()
        x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
        alpha = n.attrs.get("alpha", 1)
        if alpha != 1:
            y = b.op("Mul", [y, _f(b, alpha, dt)])
        return b.op(onnx_op, [x, y])
    return conv


rule("add")(_alpha_op("Add"))
rule("sub")(_alpha_op("Sub"))


def _floor_divmod(b, x, y, dt):
    """(floor(x / y), x mod y) as NumPy and PyTorch compute them: from fmod, so a quotient
    that is exactly an integer is not lost to the rounding of x / y."""
    zero = _f(b, 0, dt)
    mod = b.op("Mod", [x, y], fmod=1)
    div = b.op("Div", [b.op("Sub", [x, mod]), y])
    fix = b.op("And", [b.op("Not", [b.op("Equal", [mod, zero])]),
                       b.op("Xor", [b.op("Less", [y, zero]), b.op("Less", [mod, zero])])])
    div = b.op("Sub", [div, b.cast(fix, D.bool_, dt)])
    mod = b.op("Where", [fix, b.op("Add", [mod, y]), mod])
    fl = b.op("Floor", [div])
    up = b.op("Greater", [b.op("Sub", [div, fl]), _f(b, 0.5, dt)])
    fl = b.op("Add", [fl, b.cast(up, D.bool_, dt)])
    # division by zero: x / y as is (inf or nan), like the kernels
    q = b.op("Div", [x, y])
    fl = b.op("Where", [b.op("Equal", [y, zero]), q, fl])
    return fl, mod


@rule("div")
def _div(b, n):
    dt = n.out_dtype()
    mode = n.attrs.get("rounding_mode")
    if dt.is_floating_point:
        x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
        if mode == "floor":
            return _floor_divmod(b, x, y, dt)[0]
        q = b.op("Div", [x, y])
        return _trunc_of(b, q, dt) if mode == "trunc" else q
    if mode == "trunc":
        return b.op("Div", [_t(b, n, 0, dt), _t(b, n, 1, dt)])
    q = _floor_divmod(b, _t(b, n, 0, D.float64), _t(b, n, 1, D.float64), D.float64)[0]
    return b.cast(q, D.float64, dt)


def _logical(onnx_op: str):
    def conv(b, n):
        return b.op(onnx_op, [_t(b, n, 0, D.bool_), _t(b, n, 1, D.bool_)])
    return conv


rule("logical_and")(_logical("And"))
rule("logical_or")(_logical("Or"))
rule("logical_xor")(_logical("Xor"))


def _bitwise(logical: str, onnx_op: str | None):
    def conv(b, n):
        dt = n.out_dtype()
        if dt is D.bool_:
            return b.op(logical, [_t(b, n, 0, dt), _t(b, n, 1, dt)])
        if onnx_op is None:
            raise NotImplementedError("integer bitwise ops need opset 18")
        return b.op(onnx_op, [_t(b, n, 0, dt), _t(b, n, 1, dt)])
    return conv


for _name, _ops in {"bitwise_and": ("And", "BitwiseAnd"), "bitwise_or": ("Or", "BitwiseOr"),
                    "bitwise_xor": ("Xor", "BitwiseXor")}.items():
    rule(_name)(_bitwise(_ops[0], None))
    rule(_name, opset=18)(_bitwise(*_ops))


@rule("remainder")
def _remainder(b, n):
    dt = n.out_dtype()
    x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
    if not dt.is_floating_point:
        return b.op("Mod", [x, y], fmod=0)
    return _floor_divmod(b, x, y, dt)[1]


@rule("fmod")
def _fmod(b, n):
    dt = n.out_dtype()
    return b.op("Mod", [_t(b, n, 0, dt), _t(b, n, 1, dt)], fmod=1)  # C's fmod, ints too


def _nan_ignoring(onnx_op: str):
    def conv(b, n):
        dt = n.out_dtype()
        x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
        m = b.op(onnx_op, [x, y])
        if not dt.is_floating_point:
            return m
        m = b.op("Where", [b.op("IsNaN", [y]), x, m])
        return b.op("Where", [b.op("IsNaN", [x]), y, m])
    return conv


rule("fmax")(_nan_ignoring("Max"))
rule("fmin")(_nan_ignoring("Min"))


@rule("hypot")
def _hypot(b, n):
    dt = n.out_dtype()
    x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
    return b.op("Sqrt", [b.op("Add", [b.op("Mul", [x, x]), b.op("Mul", [y, y])])])


@rule("atan2")
def _atan2(b, n):
    dt = n.out_dtype()
    y, x = _t(b, n, 0, dt), _t(b, n, 1, dt)
    zero = _f(b, 0, dt)
    base = b.op("Atan", [b.op("Div", [y, x])])
    # x < 0: add pi with the sign of y (atan2(+-0, -x) = +-pi); x == 0: +-pi/2 or 0
    sign_y = b.op("Where", [b.op("Or", [b.op("Less", [y, zero]), b.op("And", [
        b.op("Equal", [y, zero]), b.op("Less", [b.op("Reciprocal", [y]), zero])])]),
        _f(b, -1, dt), _f(b, 1, dt)])
    left = b.op("Add", [base, b.op("Mul", [sign_y, _f(b, math.pi, dt)])])
    out = b.op("Where", [b.op("Less", [x, zero]), left, base])
    return out


@rule("lerp")
def _lerp(b, n):
    dt = n.out_dtype()
    a, e, w = _t(b, n, 0, dt), _t(b, n, 1, dt), _t(b, n, 2, dt)
    return b.op("Add", [a, b.op("Mul", [w, b.op("Sub", [e, a])])])


def _addc(onnx_op: str):
    def conv(b, n):
        dt = n.out_dtype()
        x, t1, t2 = _t(b, n, 0, dt), _t(b, n, 1, dt), _t(b, n, 2, dt)
        v = b.op(onnx_op, [t1, t2])
        if n.attrs.get("value", 1) != 1:
            v = b.op("Mul", [v, _f(b, n.attrs["value"], dt)])
        return b.op("Add", [x, v])
    return conv


rule("addcmul")(_addc("Mul"))
rule("addcdiv")(_addc("Div"))


@rule("where")
def _where(b, n):
    dt = n.out_dtype()
    return b.op("Where", [_t(b, n, 0, D.bool_), _t(b, n, 1, dt), _t(b, n, 2, dt)])


@rule("masked_fill")
def _masked_fill(b, n):
    dt = n.out_dtype()
    return b.op("Where", [_t(b, n, 1, D.bool_), _t(b, n, 2, dt), _t(b, n, 0, dt)])


@rule("clamp")
def _clamp(b, n):
    dt = n.out_dtype()
    x = _t(b, n, 0, dt)
    lo, hi = n.ins[1], n.ins[2]
    if not n.is_tensor(1) and not n.is_tensor(2):
        return b.op("Clip", [x, None if lo is None else _f(b, lo, dt),
                             None if hi is None else _f(b, hi, dt)])
    if lo is not None:
        x = b.op("Max", [x, _t(b, n, 1, dt)])
    if hi is not None:
        x = b.op("Min", [x, _t(b, n, 2, dt)])
    return x


@rule("isclose")
def _isclose(b, n):
    dt = _common(n, (0, 1))
    x, y = _t(b, n, 0, dt), _t(b, n, 1, dt)
    a = n.attrs
    diff = b.op("Abs", [b.op("Sub", [x, y])])
    tol = b.op("Add", [_f(b, a["atol"], dt), b.op("Mul", [_f(b, a["rtol"], dt),
                                                          b.op("Abs", [y])])])
    out = b.op("Or", [b.op("Equal", [x, y]), b.op("LessOrEqual", [diff, tol])])
    if a.get("equal_nan") and dt.is_floating_point:
        out = b.op("Or", [out, b.op("And", [b.op("IsNaN", [x]), b.op("IsNaN", [y])])])
    return out


@rule("copy")
def _copy(b, n):
    return b.op("Expand", [_t(b, n, 1, n.out_dtype()), b.ints(n.out_shape())])


@rule("fill")
def _fill(b, n):
    return b.op("Expand", [_t(b, n, 1, n.out_dtype()), b.ints(n.out_shape())])


@rule("vdot")
def _vdot(b, n):
    dt = n.out_dtype()
    return _reduce(b, "ReduceSum", b.op("Mul", [_t(b, n, 0, dt), _t(b, n, 1, dt)]), None,
                   False)


import tessera.onnx._conv_nn  # noqa: E402,F401


@rule("einsum")
def _einsum(b, n):
    """ONNX Einsum takes the canonical equation as it is (explicit output, '...')."""
    dt = n.out_dtype()
    eq = n.attrs["equation"]
    if not all(ch.isalpha() or ch in ",.->" for ch in eq.replace(" ", "")):
        raise NotImplementedError(f"equation '{eq}'")
    ins = [_t(b, n, i, dt) for i in range(len(n.ins))]
    return b.op("Einsum", ins, equation=eq)
import tessera.onnx._conv_reduce  # noqa: E402,F401  (reductions, shape and nn families)


def attach() -> None:
    """Fill each registered op's ``to_onnx`` slot from ``RULES``."""
    for name, table in RULES.items():
        op = REGISTRY.get(name)
        if op is not None:
            op.to_onnx = dict(table)


attach()
