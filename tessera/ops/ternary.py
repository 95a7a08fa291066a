"""Elementwise ops of three operands: ``where``, ``lerp``, ``addcmul``, ``addcdiv``,
``clamp`` and ``masked_fill``. They broadcast and promote like the binary ops of
``arithmetic`` and share their operand helpers (``_elementwise``).

>>> import tessera
>>> tessera.where(tessera.tensor([True, False]), 1.0, 2.0)
tensor([1., 2.])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera.kernels.c_expr import fmt
from tessera.ops import _jax, _relax, cost
from tessera.ops._elementwise import (
    _NUMBER,
    ONE,
    POINTWISE,
    _first_dtype,
    _is_int_scalar,
    _kernel,
    _need_tensor,
    _np_result_type,
    _operands,
    _shape,
    _wrap_int,
    builtins_abs,
    checked_scalar,
    checked_tensor_scalar,
)
from tessera.ops._sbp import pointwise
from tessera.ops._util import broadcast_shapes, call, dtype_arg, shape_of, sum_to
from tessera.ops.registry import Meta, defop

__all__ = ["where", "lerp", "addcmul", "addcdiv", "clamp", "clip", "clamp_min", "clamp_max",
           "masked_fill"]
# traits (``tessera.ops.registry.TRAITS``) of the selects: NumPy runs them in one pass at
# memory speed, and their C rules are exact on integers
_SELECT = frozenset({"single_pass", "c_int"})



def _number_or_tensor(name, m, arg, pos):
    if type(m) is not Meta and not isinstance(m, _NUMBER):
        raise TypeError(f"{name}(): argument '{arg}' (position {pos}) must be Tensor or "
                        f"Number, not {type(m).__name__}")


def _where_infer(cond, a, b):
    if type(cond) is not Meta:
        raise TypeError(f"where(): argument 'condition' (position 1) must be Tensor, not "
                        f"{type(cond).__name__}")
    if cond.dtype is not D.bool_ and cond.dtype is not D.uint8:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor "
                           f"with dtype {cond.dtype.name.capitalize()}")
    _number_or_tensor("where", a, "input", 2)
    _number_or_tensor("where", b, "other", 3)
    shape = broadcast_shapes("where", cond.shape, shape_of(a), shape_of(b))
    dt = D.result_type(dtype_arg(a), dtype_arg(b))
    if dt.category == 1:
        for v in (a, b):
            if type(v) is not Meta:
                checked_scalar(v, dt)
    return Meta(shape, dt)


def _where_kernel(c, a, b):
    a, b = _operands([a, b], _np_result_type(a, b))
    return np.where(c, a, b)


def _where_grad(ctx, g):
    c = ctx.inputs[0]
    need = ctx.needs_input_grad
    ga = sum_to(where(c, g, 0.0), _shape(ctx, 1)) if need[1] else None
    gb = sum_to(where(c, 0.0, g), _shape(ctx, 2)) if need[2] else None
    return None, ga, gb


_WHERE = defop("where", _where_infer, _where_kernel, grad=_where_grad,
               sbp=pointwise(joint=(1, 2)), cost=ONE, to_c=fmt("({0} ? {1} : {2})"),
               traits=_SELECT,
               to_relax=_relax.where, to_jax=lambda jnp, lax, a, at: jnp.where(a[0], a[1], a[2]))


def where(condition, input=None, other=None, *, out=None):
    """``input`` where ``condition`` else ``other``; ``where(cond)`` is ``nonzero(as_tuple)``."""
    if input is None and other is None:
        from tessera.ops.getitem import nonzero
        return nonzero(condition, as_tuple=True)
    return call(_WHERE, condition, input, other, out=out)


def _lerp_infer(a, b, w):
    _need_tensor("lerp", a)
    if type(b) is not Meta:
        raise TypeError(f"lerp(): argument 'end' (position 2) must be Tensor, not "
                        f"{type(b).__name__}")
    _number_or_tensor("lerp", w, "weight", 3)
    if a.dtype.category != 2:
        raise NotImplementedError(f'"lerp_kernel_scalar" not implemented for '
                                  f"'{a.dtype.name}'")
    if b.dtype is not a.dtype:
        raise RuntimeError(f"expected dtype {a.dtype.name} for `end` but got dtype "
                           f"{b.dtype.name}")
    # a 0-d weight of another dtype binds to PyTorch's Scalar overload and is accepted
    if type(w) is Meta and w.dtype is not a.dtype and w.shape != ():
        raise RuntimeError(f"expected dtype {a.dtype.name} for `weight` but got dtype "
                           f"{w.dtype.name}")
    return Meta(broadcast_shapes("lerp", a.shape, b.shape, shape_of(w)), a.dtype)


def _lerp_kernel(a, b, w, out=None):
    # PyTorch's formula: exact at both ends, from whichever end the weight is nearer
    a, b, w = _operands([a, b, w], a.dtype)
    if isinstance(w, (int, float)):  # one branch, one temporary (Adam's exp_avg.lerp_)
        diff = np.subtract(b, a)
        if builtins_abs(w) < 0.5:
            np.multiply(diff, w, out=diff)
            return np.add(a, diff, out=out)
        np.multiply(diff, 1 - w, out=diff)
        return np.subtract(b, diff, out=out)
    diff = b - a
    res = np.where(np.abs(w) < 0.5, a + w * diff, b - diff * (1 - w))
    if out is None:
        return res
    np.copyto(out, res, casting="unsafe")
    return out


def _lerp_grad(ctx, g):
    a, b, w = ctx.inputs
    need = ctx.needs_input_grad
    ga = sum_to(g * (1 - w), _shape(ctx, 0)) if need[0] else None
    gb = sum_to(g * w, _shape(ctx, 1)) if need[1] else None
    gw = sum_to(g * (b - a), _shape(ctx, 2)) if need[2] else None
    return ga, gb, gw


_FLOATS32_64 = (np.dtype(np.float32), np.dtype(np.float64))


def _lerp_into(t, a, b, w):
    if t.dtype == a.dtype == b.dtype and a.dtype in _FLOATS32_64:
        _lerp_kernel(a, b, w, out=t)
    else:
        np.copyto(t, _kernel(_lerp_kernel)(a, b, w), casting="unsafe")


def _lerp_c(c, a, at):
    s, e, w = a
    return f"({w} < ({c.T})0.5 ? {s} + {w} * ({e} - {s}) : {e} - ({e} - {s}) * (1 - {w}))"


_LERP = defop("lerp", _lerp_infer, _kernel(_lerp_kernel), grad=_lerp_grad, sbp=POINTWISE,
              cost=cost.elementwise(3), to_c=_lerp_c, traits={"out_form"},
              inplace_kernels={"cpu": _lerp_into}, to_relax=_relax.lerp, to_jax=_jax.lerp)


def lerp(input, end, weight, *, out=None):
    """``input + weight * (end - input)``."""
    return call(_LERP, input, end, weight, out=out)


def _addc_infer(name):
    def infer(a, t1, t2, value=1):
        for pos, (m, arg) in enumerate(((a, "input"), (t1, "tensor1"), (t2, "tensor2")), 1):
            if type(m) is not Meta:
                raise TypeError(f"{name}(): argument '{arg}' (position {pos}) must be Tensor, "
                                f"not {type(m).__name__}")
        if name == "addcdiv" and t1.dtype.category < 2 and t2.dtype.category < 2:
            raise RuntimeError("Integer division with addcdiv is no longer supported, and in a "
                               "future release addcdiv will perform a true division of tensor1 "
                               "and tensor2. The historic addcdiv behavior can be implemented "
                               "as (input + value * torch.trunc(tensor1 / tensor2)).to("
                               "input.dtype) for integer inputs and as (input + value * tensor1 "
                               "/ tensor2) for float inputs. The future addcdiv behavior can be "
                               "implemented with (input + value * tensor1 / tensor2).")
        shape = broadcast_shapes(name, a.shape, t1.shape, t2.shape)
        dt = D.result_type(dtype_arg(a), dtype_arg(t1), dtype_arg(t2))
        # a Scalar in the compute type (float32 for float16/bfloat16): NaN or out of range
        # raises, as in PyTorch
        checked_scalar(value, D.float32 if dt in (D.float16, D.bfloat16) else dt)
        return Meta(shape, dt)
    return infer


def _value(value, dt: np.dtype):
    """``value`` as PyTorch casts it to the compute type (truncated for integers)."""
    return _wrap_int(int(value), dt) if dt.kind in "iu" else value


def _addcmul_kernel(a, t1, t2, value=1):
    return a + _value(value, _first_dtype(a, t1, t2)) * t1 * t2


def _addcdiv_kernel(a, t1, t2, value=1):
    return a + _value(value, _first_dtype(a, t1, t2)) * t1 / t2


def _addcmul_grad(ctx, g):
    a, t1, t2 = ctx.inputs
    v = ctx.attrs.get("value", 1)
    need = ctx.needs_input_grad
    return (sum_to(g, _shape(ctx, 0)) if need[0] else None,
            sum_to(g * t2 * v, _shape(ctx, 1)) if need[1] else None,
            sum_to(g * t1 * v, _shape(ctx, 2)) if need[2] else None)


def _addcdiv_grad(ctx, g):
    a, t1, t2 = ctx.inputs
    v = ctx.attrs.get("value", 1)
    need = ctx.needs_input_grad
    return (sum_to(g, _shape(ctx, 0)) if need[0] else None,
            sum_to(g * v / t2, _shape(ctx, 1)) if need[1] else None,
            sum_to(-g * v * t1 / (t2 * t2), _shape(ctx, 2)) if need[2] else None)


def _addc_into(k):
    return lambda t, a, t1, t2, value=1: np.copyto(t, _kernel(k)(a, t1, t2, value=value),
                                                   casting="unsafe")


def _addc_rules(kernel, to_c) -> dict:
    """input + value * (tensor1 op tensor2): three operations per element."""
    return dict(promote=True, sbp=POINTWISE, cost=cost.elementwise(3), to_c=to_c,
                traits={"out_form"}, inplace_kernels={"cpu": _addc_into(kernel)})


def _addcmul_c(c, a, at):
    return f"({a[0]} + {c.lit(at.get('value', 1))} * {a[1]} * {a[2]})"


def _addcdiv_c(c, a, at):
    return f"({a[0]} + {c.lit(at.get('value', 1))} * ({a[1]} / {a[2]}))"


_ADDCMUL = defop("addcmul", _addc_infer("addcmul"), _kernel(_addcmul_kernel),
                 grad=_addcmul_grad, **_addc_rules(_addcmul_kernel, _addcmul_c),
                 to_relax=_relax.addcmul,
                 to_jax=lambda jnp, lax, a, at: a[0] + at.get("value", 1) * (a[1] * a[2]))
_ADDCDIV = defop("addcdiv", _addc_infer("addcdiv"), _kernel(_addcdiv_kernel),
                 grad=_addcdiv_grad, **_addc_rules(_addcdiv_kernel, _addcdiv_c),
                 to_relax=_relax.addcdiv,
                 to_jax=lambda jnp, lax, a, at: a[0] + at.get("value", 1) * (a[1] / a[2]))


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 * tensor2``."""
    return call(_ADDCMUL, input, tensor1, tensor2, value=value, out=out)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 / tensor2``."""
    return call(_ADDCDIV, input, tensor1, tensor2, value=value, out=out)


def _clamp_infer(x, lo, hi):
    _need_tensor("clamp", x)
    if lo is None and hi is None:
        raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
    _number_or_tensor("clamp", lo if lo is not None else 0, "min", 2)
    _number_or_tensor("clamp", hi if hi is not None else 0, "max", 3)
    # PyTorch binds either both bounds as Tensors or both as Numbers (a 0-d tensor can
    # pass as a Number)
    if lo is not None and hi is not None and (type(lo) is Meta) != (type(hi) is Meta) and \
            (lo if type(lo) is Meta else hi).shape != ():
        raise TypeError("clamp() received an invalid combination of arguments: min and max "
                        "must both be Tensors or both be Numbers")
    shape = broadcast_shapes("clamp", x.shape, shape_of(lo), shape_of(hi))
    dt = D.result_type(*[dtype_arg(m) for m in (x, lo, hi) if m is not None])
    for v in (lo, hi):
        if v is not None and type(v) is not Meta:
            checked_scalar(v, dt)
    return Meta(shape, dt)


def _clamp_kernel(x, lo, hi):
    # min(max(x, lo), hi): NaN in x or in a bound propagates, and lo > hi gives hi
    out = x if lo is None else np.maximum(x, lo)
    return out if hi is None else np.minimum(out, hi)


def _clamp_grad(ctx, g):
    """PyTorch's rule: ``input`` gets the gradient where it lies within the bounds, a tensor
    bound where it was taken (``min`` never, when min > max)."""
    x, lo, hi = ctx.inputs
    need = ctx.needs_input_grad
    inside = None
    if lo is not None:
        inside = x >= lo
    if hi is not None:
        inside = (x <= hi) if inside is None else inside & (x <= hi)
    gx = sum_to(where(inside, g, 0.0), _shape(ctx, 0)) if need[0] else None
    glo = ghi = None
    if need[1]:
        took = x < lo if hi is None else (x < lo) & (lo < hi)
        glo = sum_to(where(took, g, 0.0), _shape(ctx, 1))
    if need[2]:
        took = x > hi if lo is None else (x > hi) | (hi < lo)
        ghi = sum_to(where(took, g, 0.0), _shape(ctx, 2))
    return gx, glo, ghi


def _clamp_c(c, a, at):
    x = a[0]
    if a[1] is not None:  # a NaN bound makes the result NaN
        x = f"(({x} < {a[1]} || {a[1]} != {a[1]}) ? {a[1]} : {x})"
    if a[2] is not None:
        x = f"(({x} > {a[2]} || {a[2]} != {a[2]}) ? {a[2]} : {x})"
    return x


def _clamp_cost(ins, outs, **attrs):
    """One comparison per bound given."""
    return cost.elementwise((ins[1] is not None) + (ins[2] is not None))(ins, outs)


_CLAMP = defop("clamp", _clamp_infer, _kernel(_clamp_kernel), grad=_clamp_grad, promote=True,
               sbp=POINTWISE, cost=_clamp_cost, to_c=_clamp_c, traits={"out_form", "c_int"},
               inplace_kernels={"cpu": lambda t, x, lo, hi: np.copyto(
                   t, _kernel(_clamp_kernel)(x, lo, hi), casting="unsafe")},
                   to_relax=_relax.clamp, to_jax=_jax.clamp)


def clamp(input, min=None, max=None, *, out=None):
    """Limit values to [min, max]; either bound may be a tensor or None."""
    return call(_CLAMP, input, min, max, out=out)


clip = clamp


def clamp_min(input, min, *, out=None):
    """``clamp(input, min=min)``."""
    return clamp(input, min, None, out=out)


def clamp_max(input, max, *, out=None):
    """``clamp(input, max=max)``."""
    return clamp(input, None, max, out=out)


_MASK_NAMES = {"int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
               "uint8": "unsigned char", "float32": "float", "float64": "double",
               "float16": "c10::Half", "bfloat16": "c10::BFloat16"}


def _masked_fill_infer(x, mask, value):
    _need_tensor("masked_fill", x)
    if type(mask) is not Meta:
        raise TypeError(f"masked_fill(): argument 'mask' (position 2) must be Tensor, not "
                        f"{type(mask).__name__}")
    if mask.dtype is not D.bool_:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{_MASK_NAMES.get(mask.dtype.name, mask.dtype.name)}")
    _number_or_tensor("masked_fill", value, "value", 3)
    if type(value) is Meta and value.shape != ():
        raise RuntimeError("masked_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {len(value.shape)} dimension(s).")
    if type(value) is not Meta:
        checked_scalar(value, x.dtype)
    return Meta(broadcast_shapes("masked_fill", x.shape, mask.shape), x.dtype)


def _fill_value(value, dt: np.dtype):
    if _is_int_scalar(value) and dt.kind in "iu":
        return _wrap_int(value, dt)
    value = np.asarray(value)
    if value.dtype.kind == "c" and dt.kind != "c":  # (checked_scalar saw no imaginary part)
        value = value.real
    return value.astype(dt)


def _masked_value(value, dt: np.dtype):
    """``masked_fill``'s value as ``dt``: a 0-d tensor is checked as PyTorch reads it (its
    ``item()``, a Scalar: NaN into an integer tensor raises), unlike ``fill_``'s, which
    PyTorch casts; a number was checked by the infer rule."""
    return _fill_value(checked_tensor_scalar(value, dt), dt)


def _masked_fill_grad(ctx, g):
    mask = ctx.inputs[1]
    need = ctx.needs_input_grad
    gx = sum_to(where(mask, 0.0, g), _shape(ctx, 0)) if need[0] else None
    gv = where(mask, g, 0.0).sum() if need[2] else None
    return gx, None, gv


_MASKED_FILL = defop("masked_fill", _masked_fill_infer,
                     lambda x, mask, value: np.where(mask, _masked_value(value, x.dtype), x),
                     grad=_masked_fill_grad, sbp=POINTWISE, cost=ONE,
                     to_c=fmt("({1} ? {2} : {0})"), traits=_SELECT | {"checked_value"},
                     inplace_kernels={"cpu": lambda t, x, mask, value: np.copyto(
                         t, _masked_value(value, t.dtype), where=np.broadcast_to(mask, t.shape))},
                     to_relax=_relax.masked_fill,
                     to_jax=lambda jnp, lax, a, at: jnp.where(a[1], a[2], a[0]))


def masked_fill(input, mask, value, *, out=None):
    """``value`` where ``mask`` is True, else ``input``."""
    return call(_MASKED_FILL, input, mask, value, out=out)
