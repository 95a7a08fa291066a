"""Algebraic simplification: identities such as ``x * 1 -> x``, ``neg(neg(x)) -> x`` and
``permute(permute(x)) -> permute(x)``, as one rule table keyed by op name.

A rule gets the node (inputs already renamed by earlier rewrites) and an ``emit`` function
that adds a replacement node right after it; it returns the value that replaces the
node's output, or None. Replaced nodes are left for DCE. An identity rewrite applies only
when the result's shape and dtype equal the operand's (``x * 1`` that broadcasts or
promotes is not ``x``). Deliberately absent: ``x * 0 -> 0`` (wrong for NaN and inf).
``x + 0 -> x`` turns ``-0.0 + 0`` into ``-0.0`` (IEEE gives ``+0.0``), the one difference,
accepted as XLA and Inductor accept it.

The graph is functional (values are immutable; the executor copies returned values), so
``clone`` is an identity and ``copy`` (``x.copy_(src)``) is ``src``; ``contiguous``,
``reshape`` and ``to`` trace to ``view``/``cast`` or to nothing, and are covered by those
rules.

>>> from tessera.graph.ir import Graph
>>> g = Graph.parse('''graph(%x: float32[2, 3]) {
...   %0: float32[2, 3] = mul(%x, 1)
...   %1: float32[2, 3] = neg(%0)
...   %2: float32[2, 3] = neg(%1)
...   return (%2)
... }''')
>>> run(g, None), str(g).splitlines()[-2]
(True, '  return (%x)')
"""
from __future__ import annotations

import math

from tessera import _dtype as D
from tessera.graph.ir import Graph, Node, Value
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run", "RULES"]


# ---- helpers -------------------------------------------------------------------------

def _same(v, out: Value) -> bool:
    """``v`` can stand for ``out``: a value of the same shape and dtype."""
    return isinstance(v, Value) and v.shape == out.shape and v.dtype is out.dtype


def _const(v):
    """The number ``v`` is, if known: a Python scalar, or a value made by ``full``."""
    if isinstance(v, Value):
        p = v.producer
        if p is not None and p.op.name == "full" and not p.tensor_inputs:
            v = p.attrs.get("value")
        else:
            return None
    return v if isinstance(v, (bool, int, float)) else None


def _is(v, number) -> bool:
    c = _const(v)
    return c is not None and c == number


def _finite(x) -> bool:
    return isinstance(x, (bool, int)) or (isinstance(x, float) and math.isfinite(x))


def _producer(v, *names):
    """The node that produced ``v`` if its op is one of ``names``."""
    p = v.producer if isinstance(v, Value) else None
    return p if p is not None and p.op.name in names else None


# ---- the rules ------------------------------------------------------------------------

def _mul(n: Node, emit):
    (x, y), out = n.inputs, n.outputs[0]
    if _is(y, 1) and _same(x, out):
        return x
    if _is(x, 1) and _same(y, out):
        return y
    return None


def _add(n: Node, emit):
    (x, y), out, alpha = n.inputs, n.outputs[0], n.attrs.get("alpha", 1)
    if _is(y, 0) and _finite(alpha) and _same(x, out):
        return x
    if _is(x, 0) and alpha == 1 and _same(y, out):
        return y
    return None


def _sub(n: Node, emit):
    (x, y), out = n.inputs, n.outputs[0]
    if _is(y, 0) and _finite(n.attrs.get("alpha", 1)) and _same(x, out):
        return x
    return None


def _div(n: Node, emit):
    (x, y), out = n.inputs, n.outputs[0]
    if n.attrs.get("rounding_mode") is None and _is(y, 1) and _same(x, out):
        return x
    return None


def _identity(n: Node, emit):
    """clone(x), positive(x): x itself (values are immutable)."""
    x = n.inputs[0]
    return x if _same(x, n.outputs[0]) else None


def _copy(n: Node, emit):
    """copy(x, src) (``x.copy_(src)`` traced) -> src, when src already has x's shape and
    dtype: the destination's old value is never read (ZeRO's updated shard copied into the
    parameter's slice before it is gathered). Only for src a node's own result, not an
    input or a variable or a view of one: an assigned value must not be another variable's
    array, which that variable's own assignment may overwrite first (``a.copy_(b);
    b.copy_(t)`` swaps them)."""
    src = n.inputs[1]
    if not _same(src, n.outputs[0]) or src.producer is None or \
            src.producer.op.aliasing != "none":
        return None
    return src


def _involution(n: Node, emit):
    """f(f(x)) -> x, for f its own inverse (neg)."""
    inner = _producer(n.inputs[0], n.op.name)
    if inner is not None and _same(inner.inputs[0], n.outputs[0]):
        return inner.inputs[0]
    return None


def _permute(n: Node, emit):
    x, dims = n.inputs[0], tuple(d % max(len(n.inputs[0].shape), 1) for d in n.attrs["dims"])
    inner = _producer(x, "permute")
    if inner is not None:
        x = inner.inputs[0]
        p1 = tuple(d % max(len(x.shape), 1) for d in inner.attrs["dims"])
        dims = tuple(p1[d] for d in dims)
    if dims == tuple(range(len(dims))):
        return x
    if inner is None and dims == (1, 0):
        return _transpose_of_matmul(x, emit)
    return emit("permute", [x], {"dims": dims}) if inner is not None else None


def _transpose_of_matmul(x, emit):
    """(A @ B).T -> B.T @ A.T for 2-D operands read only here: the product comes out
    contiguous instead of as a transposed view (a linear layer's weight gradient), so the
    elementwise ops after it (optimizer updates) read memory in order."""
    mm = _producer(x, "matmul")
    if mm is None or emit.uses(x) != 1 or \
            not all(isinstance(v, Value) and len(v.shape) == 2 for v in mm.inputs):
        return None
    a, b = mm.inputs
    return emit("matmul", [_t(b, emit), _t(a, emit)], {})


def _t(v, emit):
    """v.T as a value: the operand of a transposing permute, or a new permute."""
    p = _producer(v, "permute")
    if p is not None and tuple(p.attrs["dims"]) in ((1, 0), (-1, -2), (-1, 0), (1, -2)):
        return p.inputs[0]
    return emit("permute", [v], {"dims": (1, 0)})


_RESHAPES = ("view", "squeeze", "unsqueeze")


def _reshape(n: Node, emit):
    """A view/squeeze/unsqueeze to the operand's shape is the operand; one of another such
    op is one ``view`` of the first operand (the graph's values are contiguous)."""
    x, out = n.inputs[0], n.outputs[0]
    inner = _producer(x, *_RESHAPES)
    if inner is not None:
        x = inner.inputs[0]
    if _same(x, out):
        return x
    return emit("view", [x], {"shape": out.shape}) if inner is not None else None


def _expand(n: Node, emit):
    x, out = n.inputs[0], n.outputs[0]
    inner = _producer(x, "expand")
    if inner is not None:
        x = inner.inputs[0]
    if _same(x, out):
        return x
    return emit("expand", [x], {"shape": out.shape}) if inner is not None else None


# precision (mantissa bits incl. the implicit one, or value bits) and exponent bits
_FLOAT_BITS = {D.float16: (11, 5), D.bfloat16: (8, 8), D.float32: (24, 8), D.float64: (53, 11)}
_INT_BITS = {D.bool_: (1, False), D.uint8: (8, False), D.int8: (7, True),
             D.int16: (15, True), D.int32: (31, True), D.int64: (63, True)}


def _exact(src: D.dtype, mid: D.dtype) -> bool:
    """Whether every value of ``src`` survives a cast to ``mid`` unchanged."""
    if src is mid:
        return True
    if src in _FLOAT_BITS:
        if mid not in _FLOAT_BITS:
            return False
        (ms, es), (mm, em) = _FLOAT_BITS[src], _FLOAT_BITS[mid]
        return mm >= ms and em >= es
    if src not in _INT_BITS:
        return False  # complex: not handled
    bits, signed = _INT_BITS[src]
    if mid in _FLOAT_BITS:
        return bits <= _FLOAT_BITS[mid][0]
    if mid not in _INT_BITS or mid is D.bool_:
        return False
    mbits, msigned = _INT_BITS[mid]
    return (msigned or not signed) and bits <= mbits


def _cast(n: Node, emit):
    """cast to the operand's dtype is the operand; cast(cast(x, mid), dst) is cast(x, dst)
    when ``mid`` holds every value of x exactly and the second cast then rounds (or wraps)
    the same number the same way: a float ``dst``, or integers throughout."""
    x, out = n.inputs[0], n.outputs[0]
    if _same(x, out):
        return x
    inner = _producer(x, "cast")
    if inner is None or not isinstance(inner.inputs[0], Value):
        return None
    src, mid, dst = inner.inputs[0].dtype, x.dtype, out.dtype
    if not _exact(src, mid):
        return None
    if dst is src:
        return inner.inputs[0]
    ints = all(d in _INT_BITS for d in (src, mid, dst))
    if (dst in _FLOAT_BITS and src in _FLOAT_BITS | _INT_BITS) or ints:
        return emit("cast", [inner.inputs[0]], {"dtype": dst})
    return None


def _merged_pieces(n: Node, emit):
    """split_backward (a concatenation) of pieces that are each a ``view`` merging the
    trailing dims of a value of one shape P (attention's heads: (B, T, H, D) -> (B, T, H*D))
    -> a view of the concatenation of those values along P's dim: one copy, reading them
    through their strides, instead of a contiguous copy of each (the views of permuted
    values need one) and then the concatenation."""
    a = n.attrs
    out = n.outputs[0]
    d = a["dim"] % len(out.shape) if out.shape else 0
    views = [_producer(v, "view") for v in n.inputs]
    if a["squeeze"] or d != len(out.shape) - 1 or any(v is None for v in views) or \
            not _is_partition(a["bounds"], out.shape[d]):
        return None
    srcs = [v.inputs[0] for v in views]
    shape = srcs[0].shape
    if len(shape) <= d + 1 or any(s.shape != shape or s.dtype is not out.dtype
                                  for s in srcs) or tuple(shape[:d]) != tuple(out.shape[:d]):
        return None
    inner = math.prod(shape[d + 1:])
    if any(hi - lo != inner * shape[d] for lo, hi in a["bounds"]):
        return None
    bounds = tuple((lo // inner, hi // inner) for lo, hi in a["bounds"])
    whole = tuple(shape[:d]) + (bounds[-1][1],) + tuple(shape[d + 1:])
    cat = emit("split_backward", srcs, {"shape": whole, "dim": d, "bounds": bounds,
                                        "squeeze": False})
    return emit("view", [cat], {"shape": out.shape})


def _is_partition(bounds, n: int) -> bool:
    at = 0
    for lo, hi in bounds:
        if lo != at:
            return False
        at = hi
    return at == n


def _unused_indices(n: Node, emit):
    """max_pool whose indices nobody reads -> max_pool_values (no index bookkeeping)."""
    if emit.uses(n.outputs[1]) == 0:
        return emit("max_pool_values", n.inputs, n.attrs)
    return None


RULES = {
    "mul": _mul,
    "add": _add,
    "sub": _sub,
    "div": _div,
    "clone": _identity,
    "positive": _identity,
    "copy": _copy,
    "neg": _involution,
    "permute": _permute,
    "view": _reshape,
    "squeeze": _reshape,
    "unsqueeze": _reshape,
    "expand": _expand,
    "cast": _cast,
    "max_pool": _unused_indices,
    "split_backward": _merged_pieces,
}


# ---- the pass --------------------------------------------------------------------------

def _meta(v):
    return Meta(v.shape, v.dtype) if isinstance(v, Value) else v


def run(g: Graph, ctx) -> bool:
    rename: dict[int, Value] = {}
    nodes: list[Node] = []
    uses: dict[int, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            if isinstance(v, Value):
                uses[id(v)] = uses.get(id(v), 0) + 1
    for v in g.live_roots():
        uses[id(v)] = uses.get(id(v), 0) + 1

    for n in g.nodes:
        if rename:
            n.inputs = [rename.get(id(v), v) if isinstance(v, Value) else v for v in n.inputs]
        nodes.append(n)
        rule = RULES.get(n.op.name)
        if rule is None:  # a rule replaces output 0 (a multi-output op's rule checks the rest)
            continue

        def emit(op: str, inputs: list, attrs: dict, _n=n) -> Value:
            opdef = REGISTRY[op]
            m = opdef.infer(*[_meta(v) for v in inputs], **attrs)
            new = Node(opdef, list(inputs), dict(attrs), [], _n.name)
            new.outputs = [Value(g.fresh(), m.shape, m.dtype, new, 0)]
            nodes.append(new)
            return new.outputs[0]
        emit.uses = lambda v: uses.get(id(v), 0)  # type: ignore[attr-defined]  # for the rules

        new = rule(n, emit)
        if new is not None:
            rename[id(n.outputs[0])] = new
    g.nodes = nodes
    if not rename:
        return False
    g.outputs = [rename.get(id(v), v) for v in g.outputs]
    g.assigns = [(k, rename.get(id(v), v)) for k, v in g.assigns]
    return True
