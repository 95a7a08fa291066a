"""Batch-norm folding (inference graphs only): an eval-mode ``batch_norm`` of the single-use
output of a ``conv``, or of a linear layer (``matmul`` by a weight, optionally plus a bias),
is an affine map per output channel, so it folds into that layer's weight and bias:

    s = gamma / sqrt(running_var + eps)
    W' = W * s (per output channel)        b' = (b - running_mean) * s + beta

W' and b' are new variables ``_folded.N`` computed with NumPy (in float64, stored in the
weight's dtype) from ``ctx.values``; the ``batch_norm`` is left for DCE. Only variables
that stay fixed qualify (``constfold.known_variables``): never in a training graph.

>>> from tessera.graph.ir import Graph
>>> from tessera.graph.passes import PassContext
>>> import tessera
>>> g = Graph.parse('''graph(%x: float32[1, 1, 3, 3]) {
...   var %w: float32[2, 1, 1, 1]
...   var %rm: float32[2]
...   var %rv: float32[2]
...   %0: float32[1, 2, 3, 3] = conv(%x, %w, None) {stride=(1, 1), pads=((0, 0), (0, 0)), \
dilation=(1, 1), groups=1}
...   %1: float32[1, 2, 3, 3], %2: float32[2], %3: float32[2] = batch_norm(%0, None, None, \
%rm, %rv) {training=False, eps=0.0}
...   return (%1)
... }''')
>>> vals = {"w": tessera.ones(2, 1, 1, 1), "rm": tessera.ones(2), "rv": tessera.full((2,), 4.)}
>>> run(g, PassContext(False, vals)), vals["_folded.0"].flatten().tolist(), vals["_folded.1"]
(True, [0.5, 0.5], tensor([-0.5000, -0.5000]))
"""
from __future__ import annotations

import numpy as np

from tessera._tensor import Tensor
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.constfold import known_variables, new_variable
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run"]


def _array(v, known: dict, size: int):
    """``v``'s value as a float64 vector of ``size`` entries; None for an absent input;
    False when its value is not fixed at compile time."""
    if v is None:
        return None
    if not isinstance(v, Value) or id(v) not in known or v.numel != size:
        return False
    return known[id(v)]._to_numpy().astype(np.float64).reshape(size)


def _single_use(v: Value, users: dict, roots: set) -> Node | None:
    """The one node reading ``v``, if it is the only reader and ``v`` is not returned."""
    us = users.get(v, [])
    return us[0] if len(us) == 1 and id(v) not in roots else None


def _only_reader(n: Node, v: Value, users: dict, roots: set) -> bool:
    return _single_use(v, users, roots) is n


def _affine(bn: Node, known: dict):
    """(scale, shift) of an eval-mode batch_norm with fixed statistics, or None."""
    if bn.attrs.get("training", True):
        return None
    c = bn.outputs[0].shape[1]
    _, gamma, beta, mean, var = (_array(v, known, c) for v in bn.inputs)
    if any(a is False for a in (gamma, beta, mean, var)) or mean is None or var is None:
        return None
    s = 1.0 / np.sqrt(var + bn.attrs["eps"])
    if gamma is not None:
        s = s * gamma
    shift = -mean * s + (beta if beta is not None else 0.0)
    return s, shift


def _emit(op: str, inputs: list, attrs: dict, name: str, g: Graph) -> Node:
    opdef = REGISTRY[op]
    m = opdef.infer(*[Meta(v.shape, v.dtype) if isinstance(v, Value) else v
                      for v in inputs], **attrs)
    n = Node(opdef, list(inputs), dict(attrs), [], name)
    n.outputs = [Value(g.fresh(), m.shape, m.dtype, n, 0)]
    return n


def _tensor(a: np.ndarray, like: Value) -> Tensor:
    return Tensor._from_numpy(np.ascontiguousarray(a.astype(like.dtype.np)))


def _fold_conv(g, ctx, bn, conv, known, s, shift) -> list[Node] | None:
    x, w, b = conv.inputs
    o = w.shape[0] if isinstance(w, Value) else -1
    if not (isinstance(w, Value) and id(w) in known) or o != len(s):
        return None
    bias = _array(b, known, o)
    if bias is False:
        return None
    wv = known[id(w)]._to_numpy().astype(np.float64)
    w2 = wv * s.reshape((o,) + (1,) * (wv.ndim - 1))
    b2 = shift + (bias * s if bias is not None else 0.0)
    nw = new_variable(g, ctx, _tensor(w2, w))
    nb = new_variable(g, ctx, _tensor(b2, w))
    return [_emit("conv", [x, nw, nb], conv.attrs, conv.name, g)]


def _weight_matrix(r, known: dict):
    """The (in, out) matrix a linear layer multiplies by: a fixed variable, or the
    transpose of one (how ``F.linear`` traces)."""
    if not isinstance(r, Value) or len(r.shape) != 2:
        return None
    if id(r) in known:
        return known[id(r)]._to_numpy().astype(np.float64)
    p = r.producer
    if p is not None and p.op.name == "permute" and tuple(d % 2 for d in p.attrs["dims"]) == \
            (1, 0) and isinstance(p.inputs[0], Value) and id(p.inputs[0]) in known:
        return known[id(p.inputs[0])]._to_numpy().astype(np.float64).T
    return None


def _fold_linear(g, ctx, bn, y, known, users, roots, s, shift) -> list[Node] | None:
    """y = matmul(x, R) or add(matmul(x, R), b) (either operand order), both 2-d."""
    c = len(s)
    bias, mm = 0.0, y.producer
    if mm.op.name == "add":
        a, b = mm.inputs
        alpha = mm.attrs.get("alpha", 1)
        if _producer_is(a, "matmul") and _single_use(a, users, roots) is mm:
            vec, mm = _array(b, known, c), a.producer
            scale = alpha
        elif _producer_is(b, "matmul") and alpha == 1 and _single_use(b, users, roots) is mm:
            vec, mm, scale = _array(a, known, c), b.producer, 1
        else:
            return None
        other = b if mm.outputs[0] is a else a
        if vec is None or vec is False or other.shape not in ((c,), (1, c)):
            return None
        bias = vec * scale
    if mm.op.name != "matmul" or len(mm.outputs[0].shape) != 2 or \
            mm.outputs[0].shape != y.shape:
        return None
    x, r = mm.inputs
    mat = _weight_matrix(r, known)
    if mat is None or mat.shape[1] != c:
        return None
    nr = new_variable(g, ctx, _tensor(mat * s.reshape(1, c), r))
    nb = new_variable(g, ctx, _tensor(bias * s + shift, r))
    m = _emit("matmul", [x, nr], {}, mm.name, g)
    return [m, _emit("add", [m.outputs[0], nb], {"alpha": 1}, y.producer.name, g)]


def _producer_is(v, name: str) -> bool:
    return isinstance(v, Value) and v.producer is not None and v.producer.op.name == name


def run(g: Graph, ctx) -> bool:
    known = known_variables(g, ctx)
    if not known:
        return False
    changed = False
    for bn in [n for n in g.nodes if n.op.name == "batch_norm"]:
        users, roots = g.users(), {id(v) for v in g.live_roots()}
        y = bn.inputs[0]
        if not isinstance(y, Value) or y.producer is None:
            continue
        stats_used = any(users.get(v) or id(v) in roots for v in bn.outputs[1:])
        if stats_used or not _only_reader(bn, y, users, roots):
            continue  # the layer's output is needed unfolded too
        affine = _affine(bn, known)
        if affine is None:
            continue
        if y.producer.op.name == "conv":
            new = _fold_conv(g, ctx, bn, y.producer, known, *affine)
        elif y.producer.op.name in ("matmul", "add"):
            new = _fold_linear(g, ctx, bn, y, known, users, roots, *affine)
        else:
            new = None
        if not new:
            continue
        at = g.nodes.index(bn)
        g.nodes[at:at] = new
        g.replace_uses(bn.outputs[0], new[-1].outputs[0])
        changed = True
    return changed
