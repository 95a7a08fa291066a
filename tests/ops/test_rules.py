"""Every op's rules are declared where it is registered, and each rule is sound.

``cost``: every op has one, and on the calls the op-info samples make (forward and
backward) it gives non-negative integer figures; an op that writes a fresh result counts
exactly its outputs' bytes as written, and a view writes and reads nothing.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import tessera
from tessera import _dispatch
from tessera._tensor import Tensor
from tessera.ops import REGISTRY
from tessera.ops.cost import Cost, cost_of, nbytes
from tessera.ops.registry import Meta
from tests.opinfo import OP_DB


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_has_a_cost_rule(name):
    assert REGISTRY[name].cost is not None, f"op '{name}' has no cost rule"


def _meta(a):
    if isinstance(a, Tensor):
        return Meta(tuple(a.shape), a.dtype)
    if isinstance(a, (list, tuple)) and a and all(isinstance(x, Tensor) for x in a):
        return type(a)(_meta(x) for x in a)
    return a


class _Recorder:
    """A dispatch mode that notes each op call (op, argument metas, attrs) and runs it."""

    def __init__(self):
        self.calls = []

    def _run(self, fn, op, args, attrs):
        self.calls.append((op, [_meta(a) for a in args], dict(attrs)))
        _dispatch.pop_mode()
        try:
            return fn()
        finally:
            _dispatch.push_mode(self)

    def dispatch(self, op, args, attrs):
        return self._run(lambda: _dispatch.dispatch(op, *args, **attrs), op, args, attrs)

    def dispatch_inplace(self, op, target, args, attrs):
        return self._run(lambda: _dispatch.dispatch_inplace(op, target, *args, **attrs),
                         op, args, attrs)


def _entries():
    for info in OP_DB:
        dt = np.dtype(info.dtypes[0])
        rng = np.random.default_rng(zlib.crc32(f"{info.name}/{dt}".encode()))
        for i, s in enumerate(info.samples(rng, dt)):
            if i >= 2:
                break
            yield pytest.param(info, s, id=f"{info.name}-{i}")


@pytest.mark.parametrize("info,sample", _entries())
def test_cost_on_op_info_calls(info, sample):
    args = [tessera.from_numpy(a.copy()) if isinstance(a, np.ndarray) else a
            for a in sample.args]
    leaves = [a for a in args if isinstance(a, Tensor) and a.dtype.is_floating_point]
    for a in leaves:
        a.requires_grad_(info.differentiable)
    rec = _Recorder()
    _dispatch.push_mode(rec)
    try:
        out = info.fn(tessera, *args, **sample.kwargs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, Tensor) and o.requires_grad]
        if outs:
            tessera.autograd.backward([o.sum() for o in outs])
    except Exception:
        pass  # samples that raise on purpose (bad input) still record the calls before it
    finally:
        _dispatch.pop_mode()
    for op, metas, attrs in rec.calls:
        if op.cost is None or op.dynamic_shape:
            continue
        try:
            c = cost_of(op, *metas, **attrs)
        except (TypeError, ValueError, RuntimeError, IndexError):
            continue  # a call infer rejects (the sample's bad input): no cost to give
        assert isinstance(c, Cost), op.name
        assert all(isinstance(v, int) and v >= 0 for v in c), (op.name, c)
        out = op.infer(*metas, **attrs)
        outs = list(out) if type(out) is tuple else [out]
        if op.aliasing == "view":
            assert c == Cost(0, 0, 0), (op.name, c)
        else:
            assert c.bytes_written == sum(nbytes(m) for m in outs if type(m) is Meta), \
                (op.name, c)


def test_a_registered_op_is_read_only():
    op = REGISTRY["add"]
    with pytest.raises(AttributeError, match="belongs in its defop"):
        op.sbp = None
    assert op.sbp is not None


def test_every_rule_is_declared_by_the_module_that_registers_the_op():
    """No rule table outside the op families fills OpDefs: the modules that used to attach
    rules by name are gone, and each op's rules are the ones its defop gave."""
    import importlib.util
    for gone in ("tessera.codegen.c_rules", "tessera.distributed.sbp_rules",
                 "tessera.distributed.sbp_nn", "tessera.codegen.decompose"):
        assert importlib.util.find_spec(gone) is None, gone
    for name, op in REGISTRY.items():
        assert "to_onnx" not in vars(op), name
