"""The vocabulary of ``cost`` rules: FLOPs and bytes an op reads and writes.

Every op declares ``cost=`` in its ``defop``. A rule is ``rule(ins, outs, **attrs) -> Cost``:
``ins`` are the op's arguments as ``infer`` saw them (``Meta`` for tensors, Python values
otherwise), ``outs`` the output metas ``infer`` gave. The figures count the work of the
op's definition (a multiply-add is two FLOPs), not of a particular kernel, so the planners
that read them (auto-parallel, rematerialization, the profiler) compare ops on one scale.
Sizes ``infer`` cannot know (-1: ``nonzero``, ``unique``) count as empty.

>>> from tessera.ops.registry import Meta
>>> import tessera
>>> x = Meta((2, 3), tessera.float32)
>>> elementwise(2)([x, x], [x])
Cost(flops=12, bytes_read=48, bytes_written=24)
>>> cost_of("matmul", Meta((4, 3), tessera.float32), Meta((3, 5), tessera.float32))
Cost(flops=120, bytes_read=108, bytes_written=80, product_dim=3)
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from tessera.ops.registry import REGISTRY, Meta, MissingRule

__all__ = ["Cost", "numel", "nbytes", "tensors", "io", "elementwise", "reduction", "movement",
           "view", "output_only", "sorting", "cost_of"]


class Cost(NamedTuple):
    """What one call of an op does: floating-point (or integer) operations, and bytes of
    tensors read and written; for an op whose FLOPs are matrix products, the smallest
    dimension of one of them (rows, reduced size or columns), which bounds the rate a
    product kernel reaches (``Profile.thin_curve``); 0 for other ops."""

    flops: int
    bytes_read: int
    bytes_written: int
    product_dim: int = 0

    def __repr__(self) -> str:   # (the product's dimension only where there is one)
        dim = f", product_dim={self.product_dim}" if self.product_dim else ""
        return (f"Cost(flops={self.flops}, bytes_read={self.bytes_read}, "
                f"bytes_written={self.bytes_written}{dim})")


def numel(m: Meta) -> int:
    """Elements of ``m`` (a size ``infer`` leaves open, -1, counts as 0)."""
    return math.prod(max(int(d), 0) for d in m.shape)


def nbytes(m: Meta) -> int:
    return numel(m) * m.dtype.itemsize


def tensors(values) -> list[Meta]:
    """The ``Meta`` among ``values`` (an op's arguments), in order."""
    return [v for v in values if type(v) is Meta]


def io(ins, outs) -> tuple[int, int]:
    """(bytes read, bytes written): every tensor argument read once, every output written."""
    return sum(nbytes(m) for m in tensors(ins)), sum(nbytes(m) for m in outs)


def elementwise(flops_per_element: int = 1) -> Callable[..., Cost]:
    """Ops that compute each output element from the same element of each input:
    ``flops_per_element`` operations per output element."""
    def rule(ins, outs, **attrs) -> Cost:
        return Cost(flops_per_element * sum(numel(m) for m in outs), *io(ins, outs))
    return rule


def reduction(flops_per_element: int = 1) -> Callable[..., Cost]:
    """Ops that combine the elements of their first input: ``flops_per_element`` operations
    per input element."""
    def rule(ins, outs, **attrs) -> Cost:
        src = tensors(ins)
        return Cost(flops_per_element * (numel(src[0]) if src else 0), *io(ins, outs))
    return rule


def movement() -> Callable[..., Cost]:
    """Ops that move or copy elements without arithmetic (concatenation, gathers, copies):
    they read their inputs and write their outputs."""
    def rule(ins, outs, **attrs) -> Cost:
        return Cost(0, *io(ins, outs))
    return rule


def view() -> Callable[..., Cost]:
    """Views: the result shares its input's memory, so nothing is read or written."""
    def rule(ins, outs, **attrs) -> Cost:
        return Cost(0, 0, 0)
    return rule


def output_only(flops_per_element: int = 0) -> Callable[..., Cost]:
    """Ops that make their output from attributes alone (``full``, ``arange``, random
    numbers): they write it, with ``flops_per_element`` operations per element."""
    def rule(ins, outs, **attrs) -> Cost:
        n = sum(numel(m) for m in outs)
        return Cost(flops_per_element * n, 0, sum(nbytes(m) for m in outs))
    return rule


def sorting(dim: int | None = -1) -> Callable[..., Cost]:
    """Ops that sort their first input along the attr ``dim`` (``dim``: its default; None
    sorts the flattened input): ceil(log2 m) comparisons per element for slices of m.

    >>> from tessera.ops.registry import Meta
    >>> import tessera
    >>> x = Meta((4, 8), tessera.float32)
    >>> sorting()([x], [x], dim=1).flops
    96
    """
    def rule(ins, outs, **attrs) -> Cost:
        x = tensors(ins)[0]
        d = attrs.get("dim", dim)
        m = numel(x) if d is None or not x.shape else max(int(x.shape[d]), 0)
        return Cost(numel(x) * max(m - 1, 0).bit_length(), *io(ins, outs))
    return rule


def cost_of(op, *args: Any, **attrs: Any) -> Cost:
    """``op``'s cost (an ``OpDef`` or its name) at these arguments (``Meta`` for tensors):
    its ``infer`` gives the outputs, its ``cost`` rule the figures."""
    op = REGISTRY[op] if isinstance(op, str) else op
    if op.cost is None:
        raise MissingRule(op.name, "cost")
    out = op.infer(*args, **attrs)
    return op.cost(list(args), list(out) if type(out) is tuple else [out], **attrs)
