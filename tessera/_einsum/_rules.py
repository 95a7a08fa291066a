"""The ``sbp`` and ``cost`` rules of the einsum op.

Both read the op's attrs: ``equation`` (canonical: explicit, one letter per dim) and
``path``.

SBP (1-D mesh). ``einsum_sbp(*metas, equation, path)`` returns a list of ``Signature``s,
each ``(ins, outs)``: one ``tessera.sbp`` value per operand and one for the output:

* split on a letter L: every operand holding L (at full size) is split on L's dim, the
  others (and operands where L is a broadcast dim of size 1) are broadcast; the output is
  split on L's dim when L is kept, partial_sum when L is contracted (each rank sums its
  share of L). A letter repeated within one operand (a diagonal) is never split, since a
  block of rows does not hold the matching block of the diagonal;
* all broadcast -> broadcast;
* einsum is linear in each operand: partial_sum on one operand, broadcast on the rest ->
  partial_sum.

The signatures are ``tessera.sbp.Signature``s; ``mesh_size`` (passed by
the global-tensor dispatch) does not change them.

Cost. ``einsum_cost(*metas, equation, path)`` returns ``{"flops", "bytes", "steps"}``:
FLOPs of the path as ``opt_einsum`` counts them, and bytes read and written (each operand
read once, each intermediate written and read once, the output written once).

>>> from tessera.ops.registry import Meta
>>> import tessera
>>> m = Meta((4, 3), tessera.float32), Meta((3, 2), tessera.float32)
>>> [str(s) for s in einsum_sbp(*m, equation="ij,jk->ik", path=((0, 1),))]
['(S(0), B) -> (S(0))', '(S(1), S(0)) -> (P)', '(B, S(1)) -> (S(1))', '(B, B) -> (B)', \
'(P, B) -> (P)', '(B, P) -> (P)']
>>> einsum_cost(*m, equation="ij,jk->ik", path=((0, 1),))["flops"]
48
"""
from __future__ import annotations

from tessera._einsum._parse import bind, parse
from tessera._einsum._path import _size, describe

__all__ = ["einsum_sbp", "einsum_cost"]


def einsum_sbp(*metas, equation: str, path=(), mesh_size: int | None = None) -> list:
    """The SBP signatures of one einsum (see the module docstring for the format)."""
    from tessera.sbp import Signature, broadcast as B, partial_sum as P, split as S
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


# what ``tessera.sbp.SbpRule`` carries besides the signatures: no attr
# holds a logical shape, no signature depends on the mesh size, tiles need not be
# contiguous. (A plain function with these attributes, not an ``SbpRule``, because the
# op is defined before ``tessera.distributed`` is imported.)
einsum_sbp.shape_attrs = ()
einsum_sbp.mesh = False
einsum_sbp.contiguous = False


def einsum_cost(*metas, equation: str, path=()) -> dict:
    """FLOPs and bytes of one einsum along ``path``."""
    b = bind(parse(equation), [m.shape for m in metas])
    ops = list(b.reduced())
    info = describe(ops, b.output, b.sizes, list(path))
    item = metas[0].dtype.itemsize
    read = sum(_numel(s) for s in b.shapes)
    inter = 0
    for _, eq, _ in info.steps[:-1]:
        inter += _size(eq.split("->")[1], b.sizes)
    out = _size(b.output, b.sizes)
    return {"flops": info.opt_flops, "bytes": item * (read + 2 * inter + out),
            "steps": len(info.steps)}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
