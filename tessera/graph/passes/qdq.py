"""QDQ fusion (inference graphs only): a float convolution or linear layer between
dequantizations and a quantization, the QDQ form of ONNX and of imported models,

    quantize_per_tensor(relu?(conv(dequantize(x), dequantize_per_channel(W), bias)))

becomes the INT8 op it stands for (``quantized_conv2d``, or ``quantized_linear`` for
``matmul(x, permute(W))`` plus a bias), which runs on tessera's INT8 kernels. It applies
where those kernels take the operands: a quint8 input, int8 weights with zero points 0
fixed for the graph's lifetime (``constfold.known_variables``), a bias that is a fixed
float vector or the dequantization of a fixed int32 one, and a quint8 output. The
replaced nodes are left for DCE.

>>> from tessera.graph.ir import Graph
>>> from tessera.graph.passes import PassContext
>>> import tessera
>>> g = Graph.parse('''graph(%x: quint8[1, 1, 3, 3]) {
...   var %w: qint8[2, 1, 1, 1]
...   var %s: float32[2]
...   var %z: int32[2]
...   %0: float32[1, 1, 3, 3] = dequantize(%x) {scale=0.5, zero_point=3}
...   %1: float32[2, 1, 1, 1] = dequantize_per_channel(%w, %s, %z) {axis=0}
...   %2: float32[1, 2, 3, 3] = conv(%0, %1, None) {stride=(1, 1), pads=((0, 0), (0, 0)), \
dilation=(1, 1), groups=1}
...   %3: quint8[1, 2, 3, 3] = quantize_per_tensor(%2) {scale=0.25, zero_point=0, \
dtype='quint8'}
...   return (%3)
... }''')
>>> vals = {"w": tessera.ones(2, 1, 1, 1, dtype=tessera.int8), "s": tessera.ones(2),
...         "z": tessera.zeros(2, dtype=tessera.int32)}
>>> run(g, PassContext(False, vals)), g.outputs[0].producer.op.name
(True, 'quantized_conv2d')
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.constfold import known_variables, new_variable
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run"]

_UINT8 = (D.quint8, D.uint8)


def _producer(v, name: str) -> Node | None:
    if isinstance(v, Value) and v.producer is not None and v.producer.op.name == name:
        return v.producer
    return None


def _value(v, known: dict) -> np.ndarray | None:
    return known[id(v)]._to_numpy() if isinstance(v, Value) and id(v) in known else None


def _input(v):
    """(quint8 integers, scale, zero point) of a per-tensor dequantization, or None."""
    dq = _producer(v, "dequantize")
    if dq is None or dq.inputs[0].dtype not in _UINT8:
        return None
    return dq.inputs[0], dq.attrs["scale"], dq.attrs["zero_point"]


def _weight(v, known: dict, cout: int):
    """(int8 weight variable, float32 scales per output channel) of a dequantized fixed
    weight with zero points 0, or None."""
    dq = _producer(v, "dequantize_per_channel")
    if dq is not None:
        w, s, z = dq.inputs
        scales, zps = _value(s, known), _value(z, known)
        if dq.attrs["axis"] != 0 or scales is None or zps is None or zps.any():
            return None
    else:
        dq = _producer(v, "dequantize")
        if dq is None or dq.attrs["zero_point"] != 0:
            return None
        w, scales = dq.inputs[0], np.full(cout, dq.attrs["scale"], np.float32)
    if w.dtype not in (D.qint8, D.int8) or _value(w, known) is None:
        return None
    return w, np.asarray(scales, np.float32).reshape(cout)


def _bias(v, known: dict, cout: int):
    """The float bias vector (None when absent), or False when it is not fixed."""
    if v is None:
        return None
    b = _value(v, known)
    if b is not None:
        return b.astype(np.float64).reshape(cout)
    dq = _producer(v, "dequantize_per_channel")
    if dq is None:
        return False
    q, s, z = (_value(i, known) for i in dq.inputs)
    if q is None or s is None or z is None:
        return False
    return (q.astype(np.float64) - z.astype(np.float64)) * s.astype(np.float64)


def _emit(g: Graph, op: str, inputs: list, attrs: dict, name: str) -> Node:
    opdef = REGISTRY[op]
    metas = [Meta(v.shape, D.quint8 if k == 0 else D.qint8 if k == 1 else v.dtype)
             if isinstance(v, Value) else v for k, v in enumerate(inputs)]
    m = opdef.infer(*metas, **attrs)
    n = Node(opdef, list(inputs), dict(attrs), [], name)
    n.outputs = [Value(g.fresh(), m.shape, m.dtype, n, 0)]
    return n


def _var(g: Graph, ctx, a: np.ndarray) -> Value:
    return new_variable(g, ctx, Tensor._from_numpy(np.ascontiguousarray(a)), "_qdq")


def _conv(g, ctx, c: Node, known: dict):
    x, w, b = c.inputs
    if len(w.shape) != 4 or any(lo != hi for lo, hi in c.attrs["pads"]):
        return None
    cout = w.shape[0]
    xin, wq, bias = _input(x), _weight(w, known, cout), _bias(b, known, cout)
    if xin is None or wq is None or bias is False:
        return None
    attrs = dict(stride=tuple(c.attrs["stride"]), padding=tuple(p[0] for p in c.attrs["pads"]),
                 dilation=tuple(c.attrs["dilation"]), groups=int(c.attrs["groups"]))
    return xin, wq, bias, "quantized_conv2d", attrs


def _linear(g, ctx, y: Value, known: dict, users: dict):
    """y = matmul(x, permute(W)) (+ bias), 2-d."""
    bias = None
    add = _producer(y, "add")
    if add is not None:
        if add.attrs.get("alpha", 1) != 1 or len(users.get(add.inputs[0], ())) != 1:
            return None
        y, bias = add.inputs
    mm = _producer(y, "matmul")
    if mm is None or len(y.shape) != 2:
        return None
    x, r = mm.inputs
    t = _producer(r, "permute")
    if t is None or tuple(t.attrs["dims"]) not in ((1, 0), (-1, -2)):
        return None
    cout = r.shape[1]
    xin, wq = _input(x), _weight(t.inputs[0], known, cout)
    b = _bias(bias, known, cout)
    if xin is None or wq is None or b is False:
        return None
    return xin, wq, b, "quantized_linear", {}


def _fuse(g: Graph, ctx, q: Node, known: dict, users: dict, roots: set) -> Node | None:
    y, relu = q.inputs[0], False
    r = _producer(y, "relu")
    if r is not None and len(users.get(y, ())) == 1 and id(y) not in roots:
        y, relu = r.inputs[0], True
    if len(users.get(y, ())) != 1 or id(y) in roots or y.producer is None:
        return None
    c = _producer(y, "conv")
    found = _conv(g, ctx, c, known) if c is not None else _linear(g, ctx, y, known, users)
    if found is None:
        return None
    (x, x_scale, x_zp), (w, scales), bias, op, attrs = found
    ins = [x, w, _var(g, ctx, scales),
           None if bias is None else _var(g, ctx, bias.astype(np.float32))]
    attrs.update(x_scale=float(x_scale), x_zp=int(x_zp), out_scale=float(q.attrs["scale"]),
                 out_zp=int(q.attrs["zero_point"]), relu=relu)
    return _emit(g, op, ins, attrs, q.name)


def run(g: Graph, ctx) -> bool:
    known = known_variables(g, ctx)
    if not known:
        return False
    changed = False
    for q in [n for n in g.nodes if n.op.name == "quantize_per_tensor"]:
        if q.attrs["dtype"] != "quint8":
            continue
        new = _fuse(g, ctx, q, known, g.users(), {id(v) for v in g.live_roots()})
        if new is None:
            continue
        g.nodes.insert(g.nodes.index(q), new)
        g.replace_uses(q.outputs[0], new.outputs[0])
        changed = True
    return changed
