"""The ``sbp`` and ``cost`` rules of the einsum op.

Both read the op's attrs: ``equation`` (canonical: explicit, one letter per dim) and
``path``.

SBP (1-D mesh). ``einsum_sbp(*metas, equation, path)`` lists the op's ``Signature``s, each
with one ``tessera.sbp`` value per operand and one for the output:

* split on a letter L: every operand holding L (at full size) is split on L's dim, the
  others (and operands where L is a broadcast dim of size 1) are broadcast; the output is
  split on L's dim when L is kept, partial_sum when L is contracted (each rank sums its
  share of L). A letter repeated within one operand (a diagonal) is never split, since a
  block of rows does not hold the matching block of the diagonal;
* all broadcast -> broadcast;
* einsum is linear in each operand: partial_sum on one operand, broadcast on the rest ->
  partial_sum.

Cost. ``einsum_cost(ins, outs, equation, path)``: the FLOPs of the path as ``opt_einsum``
counts them; bytes read: each operand once, and each intermediate of the path written and
read back (traffic inside the op); bytes written: the output.

>>> from tessera.ops.registry import Meta
>>> import tessera
>>> m = Meta((4, 3), tessera.float32), Meta((3, 2), tessera.float32)
>>> [str(s) for s in einsum_sbp(*m, equation="ij,jk->ik", path=((0, 1),))]
['(S(0), B) -> (S(0))', '(S(1), S(0)) -> (P)', '(B, S(1)) -> (S(1))', '(B, B) -> (B)', \
'(P, B) -> (P)', '(B, P) -> (P)']
>>> einsum_cost(list(m), [Meta((4, 2), tessera.float32)], equation="ij,jk->ik", path=((0, 1),))
Cost(flops=48, bytes_read=72, bytes_written=32)
"""
from __future__ import annotations

from tessera.ops.cost import Cost, nbytes
from tessera.ops.einsum._parse import bind, parse
from tessera.ops.einsum._path import _size, describe
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["einsum_sbp", "einsum_cost"]


def _signatures(*metas, equation: str, path=()) -> list:
    """The SBP signatures of one einsum (see the module docstring)."""
    b = bind(parse(equation), [m.shape for m in metas])
    n = len(metas)
    sigs = []
    letters = list(dict.fromkeys("".join(b.inputs)))
    for x in letters:
        if any(term.count(x) > 1 for term in b.inputs):
            continue
        ins = []
        for term, shape in zip(b.inputs, b.shapes):
            k = term.find(x)
            full = k >= 0 and (shape[k] != 1 or b.sizes[x] == 1)
            ins.append(S(k) if full else B)
        out = S(b.output.index(x)) if x in b.output else P
        sigs.append(Signature(tuple(ins), (out,)))
    sigs.append(Signature((B,) * n, (B,)))
    for i in range(n):
        sigs.append(Signature(tuple(P if k == i else B for k in range(n)), (P,)))
    return sigs


einsum_sbp = SbpRule(_signatures)


def einsum_cost(ins, outs, equation: str, path=()) -> Cost:
    """FLOPs and bytes of one einsum along ``path``."""
    b = bind(parse(equation), [m.shape for m in ins])
    info = describe(list(b.reduced()), b.output, b.sizes, list(path))
    inter = sum(_size(eq.split("->")[1], b.sizes) for _, eq, _ in info.steps[:-1])
    read = sum(nbytes(m) for m in ins) + 2 * inter * ins[0].dtype.itemsize
    return Cost(info.opt_flops, read, sum(nbytes(m) for m in outs))
