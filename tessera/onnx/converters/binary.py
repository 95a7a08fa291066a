"""Binary-network ops (``tessera.ops.binary``) in ONNX.

The sign and the latent binarized convolution and linear export as standard ONNX:
``Where(Less(x, 0), -1, 1)`` (ONNX's ``Sign`` maps 0 to 0, the binarization maps it to
+1), constant ``Pad`` by the pad value, ``Conv`` or ``MatMul``, and ``Mul`` by alpha.

The packed ops export as operators of the custom domain ``ai.tessera.binary`` (version 1;
their schemas are registered with ``onnx`` when a model uses them), which keep the weights
as bits (docs/binary.md):

* ``BinaryConv(X, W, alpha?)``: ``X`` float (N, C, H, W); ``W`` int64 (O, KH, KW,
  ceil(C/64)), the bits of uint64 words, bit ``i`` of word ``j`` set where weight
  ``64 j + i`` of that tap is -1 (dabnn's layout); attributes ``in_channels``,
  ``kernel_shape``, ``strides``, ``pads`` (ONNX's begin/end order), ``dilations``,
  ``pad_value`` (-1, 0 or 1). ``Y[n, o] = float(dot) * alpha[o]``.
* ``BinaryGemm(X, W, alpha?)``: ``X`` float (B, I); ``W`` int64 (O, ceil(I/64));
  attribute ``in_features``.

Import reads both back, and recognises what dabnn's onnx2bnn converted: ``Sign`` feeding
a ``Conv`` whose weights are a constant of +-1 values (or ``Sign`` of a constant) becomes a
``BinaryConv`` with zero padding (ONNX's ``Conv`` pads with 0), its bias an ``Add``; ONNX's
``Sign(0) = 0`` then reads as +1, the one value where the two differ.

>>> from tessera.onnx.converters import EXPORT, IMPORT
>>> "packed_binary_conv2d" in EXPORT, "BinaryConv" in IMPORT
(True, True)
"""
from __future__ import annotations

import functools

import numpy as np

from tessera import _dtype as D
from tessera.onnx.converters.helpers import operand
from tessera.onnx.converters.registry import export_rule, import_rule
from tessera.ops import binary as _B

DOMAIN = "ai.tessera.binary"


@functools.cache
def register_schemas() -> None:
    """Register the schemas of ``BinaryConv`` and ``BinaryGemm`` with ``onnx`` (once)."""
    from onnx import defs
    S = defs.OpSchema
    if defs.has("BinaryConv", DOMAIN):
        return
    opt = S.FormalParameterOption.Optional
    io = [S.FormalParameter("X", "T"), S.FormalParameter("W", "tensor(int64)"),
          S.FormalParameter("alpha", "T", param_option=opt)]
    out = [S.FormalParameter("Y", "T")]
    types = [("T", ["tensor(float)"], "float32 activations and scales")]
    ints = S.AttrType.INTS

    def attr(name, kind=S.AttrType.INT):
        return S.Attribute(name, kind, "", required=True)
    defs.register_schema(S(
        "BinaryConv", DOMAIN, 1, doc="Bit-packed binary 2-d convolution (docs/binary.md).",
        inputs=io, outputs=out, type_constraints=types,
        attributes=[attr("in_channels"), attr("kernel_shape", ints), attr("strides", ints),
                    attr("pads", ints), attr("dilations", ints), attr("pad_value")]))
    defs.register_schema(S(
        "BinaryGemm", DOMAIN, 1, doc="Bit-packed binary matrix product (docs/binary.md).",
        inputs=io, outputs=out, type_constraints=types, attributes=[attr("in_features")]))


# ---- export --------------------------------------------------------------------------------

def _sign(b, x: str, dt) -> str:
    less = b.op("Less", [x, b.const(0.0, dt)])
    return b.op("Where", [less, b.const(-1.0, dt), b.const(1.0, dt)])


@export_rule("binary_sign")
def _export_sign(b, n):
    return _sign(b, operand(b, n, 0), n.out_dtype())


@export_rule("binary_conv2d")
def _export_conv(b, n):
    dt, a = n.out_dtype(), n.attrs
    ct = D.float32
    x = _sign(b, operand(b, n, 0, ct), ct)
    w = _sign(b, operand(b, n, 1, ct), ct)
    ph, pw = a["padding"]
    pads = [ph, pw, ph, pw]
    if a["pad_value"] != 0 and any(pads):
        x = b.op("Pad", [x, b.ints([0, 0, ph, pw, 0, 0, ph, pw]),
                         b.const(float(a["pad_value"]), ct)])
        pads = [0, 0, 0, 0]
    y = b.op("Conv", [x, w], kernel_shape=list(n.shape(1)[2:]), strides=list(a["stride"]),
             pads=pads, dilations=list(a["dilation"]))
    y = b.cast(y, ct, dt)
    if n.ins[2] is not None:
        y = b.op("Mul", [y, b.op("Reshape", [operand(b, n, 2, dt), b.ints([1, -1, 1, 1])])])
    return y


@export_rule("binary_linear")
def _export_linear(b, n):
    dt = n.out_dtype()
    y = b.op("MatMul", [_sign(b, operand(b, n, 0), dt),
                        b.op("Transpose", [_sign(b, operand(b, n, 1), dt)], perm=[1, 0])])
    if n.ins[2] is not None:
        y = b.op("Mul", [y, operand(b, n, 2, dt)])
    return y


@export_rule("packed_binary_conv2d")
def _export_packed_conv(b, n):
    register_schemas()
    a = n.attrs
    ph, pw = a["padding"]
    ins = [operand(b, n, 0), operand(b, n, 1)] + \
        ([operand(b, n, 2, n.out_dtype())] if n.ins[2] is not None else [])
    return b.op("BinaryConv", ins, domain=DOMAIN, in_channels=int(a["in_channels"]),
                kernel_shape=list(n.shape(1)[1:3]), strides=list(a["stride"]),
                pads=[ph, pw, ph, pw], dilations=list(a["dilation"]),
                pad_value=int(a["pad_value"]))


@export_rule("packed_binary_linear")
def _export_packed_linear(b, n):
    register_schemas()
    ins = [operand(b, n, 0), operand(b, n, 1)] + \
        ([operand(b, n, 2, n.out_dtype())] if n.ins[2] is not None else [])
    return b.op("BinaryGemm", ins, domain=DOMAIN, in_features=int(n.attrs["in_features"]))


@export_rule("binary_pack")
def _export_pack(b, n):
    """The words as arithmetic: bit ``i`` of word ``j`` is ``2**i``, summed with int64
    wrap-around (bit 63 is the sign bit of the int64 word)."""
    shape, dt = n.shape(0), n.dtype(0)
    c = int(shape[-1])
    words = -(-c // 64)
    x = operand(b, n, 0)
    if words * 64 != c:
        pad = [0] * (2 * len(shape))
        pad[2 * len(shape) - 1] = words * 64 - c
        x = b.op("Pad", [x, b.ints(pad), b.const(0.0, dt)])
    lead = [int(d) for d in shape[:-1]]
    bits = b.op("Cast", [b.op("Less", [x, b.const(0.0, dt)])], to=7)
    bits = b.op("Reshape", [bits, b.ints(lead + [words, 64])])
    weights = (np.uint64(1) << np.arange(64, dtype=np.uint64)).view(np.int64)
    return b.op("ReduceSum", [b.op("Mul", [bits, b.const(weights)]), b.ints([-1])],
                keepdims=0)


# ---- import --------------------------------------------------------------------------------

def _int_attrs(c, name: str, n: int) -> tuple[int, ...]:
    v = c.attr(name)
    return tuple(int(i) for i in v) if v is not None else (0,) * n


@import_rule("BinaryConv")
def _import_binary_conv(c, x, w, alpha=None):
    pads = _int_attrs(c, "pads", 4)
    if pads[:2] != pads[2:]:
        raise NotImplementedError(f"{c.where}: BinaryConv with unequal begin and end pads "
                                  f"{list(pads)}")
    return _B.packed_binary_conv2d(x, w, alpha, c.attr("in_channels"),
                                   stride=_int_attrs(c, "strides", 2) or (1, 1),
                                   padding=pads[:2], dilation=_int_attrs(c, "dilations", 2),
                                   pad_value=c.attr("pad_value", -1))


@import_rule("BinaryGemm")
def _import_binary_gemm(c, x, w, alpha=None):
    return _B.packed_binary_linear(x, w, alpha, c.attr("in_features"))


def fuse_sign_conv(proto):
    """``proto`` with each ``Sign -> Conv`` on +-1 weights (dabnn's onnx2bnn pattern) as a
    ``BinaryConv`` of the custom domain; ``proto`` itself when there is none."""
    from onnx import helper, numpy_helper
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: nd for nd in g.node for o in nd.output}
    readers: dict[str, int] = {}
    for nd in g.node:
        for i in nd.input:
            readers[i] = readers.get(i, 0) + 1
    out_names = {o.name for o in g.output}
    replace: dict[int, list] = {}
    drop: set[int] = set()
    new_inits = []
    index = {id(nd): k for k, nd in enumerate(g.node)}
    for k, nd in enumerate(g.node):
        if nd.op_type != "Conv" or nd.domain not in ("", "ai.onnx"):
            continue
        sign = producer.get(nd.input[0])
        if sign is None or sign.op_type != "Sign" or len(nd.input) < 2:
            continue
        w = _binary_weight(nd.input[1], inits, producer)
        attrs = {a.name: helper.get_attribute_value(a) for a in nd.attribute}
        if w is None or attrs.get("group", 1) != 1 \
                or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or \
                readers.get(sign.output[0], 0) != 1 or sign.output[0] in out_names or w.ndim != 4:
            continue
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        if len(pads) != 4 or pads[:2] != pads[2:]:
            continue
        words = np.packbits(w.transpose(0, 2, 3, 1) < 0, axis=-1, bitorder="little")
        nbytes = -(-w.shape[1] // 64) * 8
        words = np.concatenate([words, np.zeros(words.shape[:-1] + (nbytes - words.shape[-1],),
                                                np.uint8)], -1).view("<i8")
        wname = nd.output[0] + "/bits"
        new_inits.append(numpy_helper.from_array(np.ascontiguousarray(words), wname))
        y = nd.output[0] if len(nd.input) < 3 else nd.output[0] + "/nobias"
        nodes = [helper.make_node(
            "BinaryConv", [sign.input[0], wname], [y], domain=DOMAIN,
            in_channels=int(w.shape[1]), kernel_shape=list(w.shape[2:]),
            strides=list(attrs.get("strides", [1, 1])), pads=pads,
            dilations=list(attrs.get("dilations", [1, 1])), pad_value=0)]
        if len(nd.input) >= 3 and nd.input[2]:
            shape = nd.output[0] + "/bias_shape"
            new_inits.append(numpy_helper.from_array(np.array([-1, 1, 1], np.int64), shape))
            nodes += [helper.make_node("Reshape", [nd.input[2], shape], [y + "/b"]),
                      helper.make_node("Add", [y, y + "/b"], [nd.output[0]])]
        replace[k] = nodes
        drop.add(index[id(sign)])
    if not replace:
        return proto
    register_schemas()
    out = type(proto)()
    out.CopyFrom(proto)
    del out.graph.node[:]
    for k, nd in enumerate(g.node):
        if k in drop:
            continue
        out.graph.node.extend(replace.get(k, [nd]))
    out.graph.initializer.extend(new_inits)
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


def _binary_weight(name: str, inits: dict, producer: dict) -> np.ndarray | None:
    """The +-1 weights named ``name``: a constant of +-1 values, or ``Sign`` of a constant
    (binarized as ``x < 0 -> -1``)."""
    from onnx import TensorProto, numpy_helper
    t = inits.get(name)
    if t is None and name in producer and producer[name].op_type == "Sign":
        t = inits.get(producer[name].input[0])
    if t is None or t.data_location == TensorProto.EXTERNAL:
        return None  # computed, or read by the importer later
    if name in inits:
        w = numpy_helper.to_array(inits[name])
        return w if w.size and np.isin(w, (-1.0, 1.0)).all() else None
    p = producer.get(name)
    if p is not None and p.op_type == "Sign" and p.input[0] in inits:
        w = numpy_helper.to_array(inits[p.input[0]])
        return np.where(w < 0, -1.0, 1.0)
    return None
