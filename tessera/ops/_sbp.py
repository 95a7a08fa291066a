"""The generic builders of ops' ``sbp`` rules (OneFlow's per-op ``GetSbpSignatures``), for
the op families to declare their rules with:

* ``pointwise(joint, each, nout, skip)``: broadcasting pointwise ops: split any output dim
  (inputs that broadcast on it are broadcast), all broadcast, and partial_sum where the op is
  linear (``add``: P+P, ``mul``: P*B, ``div``: P/B);
* ``reduction(partial, mean, nout)``: reductions: split a kept dim; ``sum`` of a split reduced
  dim is partial_sum (``mean`` sums its tile and divides by the logical count);
* small helpers for the ops' own rules (``linear_identity``, ``aligned``, ``bshape``...).

>>> import tessera
>>> from tessera.ops.registry import Meta
>>> x = Meta((4, 3), tessera.float32)
>>> [str(s) for s in pointwise(joint=(0, 1))(x, x)]
['(S(0), S(0)) -> (S(0))', '(S(1), S(1)) -> (S(1))', '(B, B) -> (B)', '(P, P) -> (P)']
"""
from __future__ import annotations

import math

from tessera.ops.registry import Meta
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, sbp, split as S

__all__ = ["pointwise", "reduction", "full_reduction", "linear_identity", "optional",
           "aligned", "tensors", "bshape", "wrap", "dims", "reduced", "resolve"]


def tensors(metas) -> list[int]:
    return [i for i, m in enumerate(metas) if type(m) is Meta]


def bshape(shapes) -> tuple:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for k, v in enumerate(s):
            d = k + n - len(s)
            if v != 1:
                out[d] = v
    return tuple(out)


def wrap(d: int, n: int) -> int:
    return d + n if d < 0 else d


# ---- pointwise ---------------------------------------------------------------------------

def dims(v, n: int) -> set:
    """The dims an attr names (an int, a sequence of ints, or None for none)."""
    if v is None:
        return set()
    return {wrap(d, n) for d in ((v,) if isinstance(v, int) else v)}


def pointwise(joint: tuple = (), each: tuple = (), nout: int = 1, skip: tuple = ()) -> SbpRule:
    """Broadcasting pointwise ops. ``joint``: input positions the op is linear in together
    (``add``); ``each``: positions it is linear in one at a time (``mul``). ``skip``: dims
    (of the output) that must not be split: the dims an attr names (``softmax``'s dim,
    ``flip``'s dims, a scan's dim) or fixed dims given as ints (``tril``'s -2 and -1). Ops
    that work along some dims and are elementwise across the others use it too (the
    output may differ from the inputs in a skipped dim: ``topk``)."""
    def rule(*metas, **attrs):
        tpos = tensors(metas)
        shape = bshape([metas[i].shape for i in tpos])
        n = len(shape)
        banned = set()
        for a in skip:
            banned |= dims(a if isinstance(a, int) else attrs.get(a), n)
        sigs = []
        for d in range(n):
            if d in banned:
                continue
            ins: list[sbp | None] = []
            for i, m in enumerate(metas):
                if i not in tpos:
                    ins.append(None)
                    continue
                k = d - (n - len(m.shape))
                ins.append(S(k) if k >= 0 and m.shape[k] == shape[d] else B)
            sigs.append(Signature(tuple(ins), (S(d),) * nout))
        sigs.append(Signature(tuple(B if i in tpos else None for i in range(len(metas))),
                              (B,) * nout))
        if joint and all(i in tpos for i in joint):
            sigs.append(Signature(tuple((P if i in joint else B) if i in tpos else None
                                        for i in range(len(metas))), (P,) * nout))
        for j in each:
            if j in tpos:
                sigs.append(Signature(tuple((P if i == j else B) if i in tpos else None
                                            for i in range(len(metas))), (P,) * nout))
        return sigs
    return SbpRule(rule, elementwise=not skip and nout == 1)


def reduced(x: Meta, dim) -> tuple[int, ...]:
    n = len(x.shape)
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(n))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({wrap(d, max(n, 1)) for d in dims})) if n else ()


def reduction(partial: bool = False, mean=None, nout: int = 1) -> SbpRule:
    """Reductions over ``dim`` (None: all) with ``keepdim``. ``partial``: a split reduced dim
    gives partial_sum (``sum``); ``mean``: the same, with ``mean`` as the signature's local
    computation (``mean`` over a split dim sums its tile and divides by the logical count)."""
    def rule(x, dim=None, keepdim=False, **attrs):
        if type(x) is not Meta:
            return []
        dims = reduced(x, dim)
        sigs = []
        for d in range(len(x.shape)):
            if d not in dims:
                od = d if keepdim else d - sum(1 for r in dims if r < d)
                sigs.append(Signature((S(d),), (S(od),) * nout))
        sigs.append(Signature((B,), (B,) * nout))
        if partial or mean:
            local = mean if mean else None
            sigs += [Signature((S(d),), (P,), local) for d in dims]
            sigs.append(Signature((P,), (P,)))
        return sigs
    return SbpRule(rule)


def full_reduction(x):
    return [Signature((B,), (B,))]


def linear_identity(nin: int = 1):
    return [Signature((B,) * nin, (B,)), Signature((P,) * nin, (P,))]


def resolve(shape, numel: int) -> tuple:
    shape = tuple(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(numel // known if s == -1 else s for s in shape)
    return shape


def optional(m, s=B):
    return None if m is None else s


def aligned(dim: int, *metas) -> list[int]:
    """Dims other than ``dim`` where every tensor has the first's size (tiles line up)."""
    n = len(metas[0].shape)
    dim = wrap(dim, max(n, 1))
    return [d for d in range(n) if d != dim and
            all(len(m.shape) == n and m.shape[d] == metas[0].shape[d] for m in metas)]
