"""Each op's ``cost`` rule against a count of the work its kernel actually does, on every
call the op-info samples make (forward and backward):

* products (``matmul``, ``vdot``, ``einsum``, ``conv`` and its two gradients): the kernel
  run on all-ones operands gives, in each output element, the number of multiply-adds that
  went into it; twice their sum (and one add per element for a bias) is the FLOP count;
* elementwise ops (their ``sbp`` rule says so): the bytes of the arrays the kernel reads
  (every tensor argument but a destination the op only overwrites, ``fill``'s and
  ``copy``'s) and of the results dispatch hands back.

These are the figures the auto-parallel cost model prices plans with.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import tessera
from tessera import _dispatch
from tessera._tensor import Tensor
from tessera.ops.cost import cost_of
from tessera.ops.registry import Meta
from tests.opinfo import OP_DB

# arguments whose old values the op overwrites without reading them
_OVERWRITTEN = {"fill": (0,), "copy": (0,)}
_PRODUCTS = ("matmul", "vdot", "einsum", "conv", "conv_input_grad", "conv_weight_grad")


class _Calls:
    """A dispatch mode keeping each op call (op, the tensor arguments' arrays, attrs)."""

    def __init__(self):
        self.calls = []

    def _run(self, fn, op, args, attrs, inplace=False):
        arrays = [np.array(a._data) if isinstance(a, Tensor) else a for a in args]
        _dispatch.pop_mode()
        try:
            out = fn()
        finally:
            _dispatch.push_mode(self)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not inplace:  # (an in-place call's result is its target, written in place)
            self.calls.append((op, args, arrays, dict(attrs),
                               [np.asarray(o._data) for o in outs if isinstance(o, Tensor)]))
        return out

    def dispatch(self, op, args, attrs):
        return self._run(lambda: _dispatch.dispatch(op, *args, **attrs), op, args, attrs)

    def dispatch_inplace(self, op, target, args, attrs):
        return self._run(lambda: _dispatch.dispatch_inplace(op, target, *args, **attrs),
                         op, args, attrs, inplace=True)


def _calls(info):
    """Every op call the entry's samples make, forward and backward, in float64."""
    dt = np.dtype(np.float64 if np.float64 in info.dtypes else info.dtypes[0])
    rng = np.random.default_rng(zlib.crc32(f"{info.name}/{dt}".encode()))
    rec = _Calls()
    for s in info.samples(rng, dt):
        args = [tessera.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a
                for a in s.args]
        for a in args:
            if isinstance(a, Tensor) and a.dtype.is_floating_point and info.differentiable:
                a.requires_grad_()
        _dispatch.push_mode(rec)
        try:
            out = info.fn(tessera, *args, **s.kwargs)
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                    if isinstance(o, Tensor) and o.requires_grad]
            if outs:
                tessera.autograd.backward([o.sum() for o in outs])
        except Exception:
            pass  # samples of bad input raise on purpose
        finally:
            _dispatch.pop_mode()
    return rec.calls


def _meta(a):
    return Meta(tuple(a._shape), a._dtype) if isinstance(a, Tensor) else a


def _cost(op, args, attrs):
    try:
        return cost_of(op, *[_meta(a) for a in args], **attrs)
    except (TypeError, ValueError, RuntimeError, IndexError):
        return None  # a call infer rejects


def _sums(op, attrs, operands: int) -> bool:
    """Whether the products are summed (a multiply-add: two FLOPs) or stand alone (one,
    ``opt_einsum``'s count: a broadcast product, or one operand's own additions)."""
    if op.name != "einsum":
        return True
    if operands == 1:
        return False
    lhs, rhs = attrs["equation"].replace(".", "").split("->")
    return bool(set(lhs.replace(",", "")) - set(rhs))


def _pads_zero(attrs) -> bool:
    return all(p == 0 for pair in attrs.get("pads", ()) for p in pair)


def _product_entries():
    return [pytest.param(info, id=info.name) for info in OP_DB
            if set(info.covered_ops()) & set(_PRODUCTS)]


@pytest.mark.parametrize("info", _product_entries())
def test_product_flops_equal_the_kernels_multiply_adds(info):
    checked = 0
    for op, args, arrays, attrs, results in _calls(info):
        if op.name not in _PRODUCTS or not _pads_zero(attrs):
            continue  # (a padded conv's kernel multiplies padding the ones count cannot see)
        c = _cost(op, args, attrs)
        if c is None:
            continue
        ones = [np.ones_like(a) if isinstance(a, np.ndarray) else a for a in arrays]
        bias = op.name == "conv" and len(ones) > 2 and ones[2] is not None
        if bias:
            ones[2] = np.zeros_like(ones[2])  # the bias's adds are counted apart
        out = op.kernels["cpu"](*ones, **attrs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        macs = int(round(float(np.sum(out))))
        operands = sum(isinstance(a, np.ndarray) for a in arrays)
        if op.name == "einsum" and operands > 2:
            continue  # (a path of several steps: the ones count sees the last step only)
        want = (2 * macs if _sums(op, attrs, operands) else macs) + (out.size if bias else 0)
        assert c.flops == want, (op.name, [a.shape for a in arrays
                                           if isinstance(a, np.ndarray)], attrs, c)
        checked += 1
    assert checked, f"{info.name}: no product call to count"


def _elementwise_entries():
    return [pytest.param(info, id=info.name) for info in OP_DB
            if any(op.sbp is not None and op.sbp.elementwise
                   for op in map(tessera.ops.REGISTRY.get, info.covered_ops())
                   if op is not None)]


@pytest.mark.parametrize("info", _elementwise_entries())
def test_elementwise_bytes_equal_the_kernels_arrays(info):
    for op, args, arrays, attrs, results in _calls(info):
        if op.sbp is None or not op.sbp.elementwise:
            continue
        c = _cost(op, args, attrs)
        if c is None:
            continue
        skip = _OVERWRITTEN.get(op.name, ())
        read = sum(a.nbytes for i, a in enumerate(arrays)
                   if isinstance(a, np.ndarray) and i not in skip)
        written = sum(r.nbytes for r in results)
        assert (c.bytes_read, c.bytes_written) == (read, written), (op.name, c)
