"""ONNX export: trace, convert node by node through the export table, check, write.

The model is traced in eval mode into the IR (``tessera.onnx._trace``); every node's op
picks the converter with the highest opset not above the requested one
(``tessera.onnx.converters.EXPORT``, keyed by op name and opset). Parameters and buffers
become initializers named by module path. The model is checked with
``onnx.checker.check_model(full_check=True)`` before anything is written, and files are
written to a temporary name and renamed, so a failed export never leaves a broken file.

>>> import tessera, tessera.onnx
>>> proto = tessera.onnx.export(tessera.nn.Linear(3, 2), (tessera.ones(1, 3),))
>>> [n.op_type for n in proto.graph.node]
['Transpose', 'MatMul', 'Add']
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from tessera import _dtype as D
from tessera.graph.ir import Graph, Value
from tessera.onnx._trace import ExportError, Sym, symbolic_graph

__all__ = ["export", "export_graph", "Builder", "ExportError", "UnsupportedOpError",
           "MIN_OPSET", "MAX_OPSET", "ONNX_DTYPE"]

MIN_OPSET, MAX_OPSET = 13, 21

# tessera dtype name -> onnx.TensorProto data type (a quantized dtype: its integers)
ONNX_DTYPE = {"float32": 1, "uint8": 2, "int8": 3, "int16": 5, "int32": 6, "int64": 7,
              "bool": 9, "float16": 10, "float64": 11, "complex64": 14, "complex128": 15,
              "bfloat16": 16, "qint8": 3, "quint8": 2, "qint32": 6}
# external data above this many bytes of initializers (the protobuf limit is 2 GB)
EXTERNAL_DATA_BYTES = 1 << 30


class UnsupportedOpError(ExportError):
    """An op with no ONNX converter (for the requested opset)."""

    def __init__(self, op: str, path: str, opset: int, detail: str = ""):
        where = f"module '{path}'" if path else "the top-level module"
        msg = detail or (f"op '{op}' has no ONNX converter for opset {opset}")
        super().__init__(f"onnx.export: {msg} (called from {where})")
        self.op, self.path = op, path


class Builder:
    """Collects ONNX nodes and initializers. Converters call ``op``, ``const``, ``ints``."""

    def __init__(self, opset: int, axes: dict | None = None):
        self.opset = opset
        self.nodes: list = []
        self.initializers: dict = {}   # name -> numpy array
        self.axes = axes or {}         # dim name -> (input name, axis)
        self.scope = ""
        self._count = 0
        self._consts: dict = {}
        self._dims: dict = {}

    def fresh(self, hint: str = "t") -> str:
        self._count += 1
        return f"{self.scope + '/' if self.scope else ''}{hint}_{self._count}"

    def op(self, op_type: str, inputs, n_out: int = 1, domain: str = "", **attrs):
        """Append ``op_type(*inputs)``; returns its output name (a list when n_out > 1).
        An input of None is an omitted optional input. ``domain``: a custom operator set
        (``tessera.onnx.converters.DOMAINS``), imported by the model at version 1."""
        from onnx import helper
        outs = [self.fresh(op_type) for _ in range(n_out)]
        ins = ["" if i is None else i for i in inputs]
        while ins and ins[-1] == "":
            ins.pop()
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, ins, outs, name=self.fresh(op_type),
                                           domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=None) -> str:
        """An initializer holding ``value`` (NumPy dtype ``dtype`` or a tessera dtype)."""
        if isinstance(dtype, D.dtype):
            dtype = dtype.np
        arr = np.asarray(value, dtype=dtype)
        key = None
        if arr.size <= 16:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        name = self.fresh("const")
        self.initializers[name] = arr
        if key is not None:
            self._consts[key] = name
        return name

    def scalar(self, value, dtype) -> str:
        """A 0-d constant of tessera dtype ``dtype`` (a ``Sym`` becomes a computation)."""
        if isinstance(value, Sym):
            return self.cast(self.op("Squeeze", [self.dim(value), self.const([0], np.int64)]),
                             D.int64, dtype)
        return self.const(value, dtype)

    def ints(self, values) -> str:
        """A 1-D int64 tensor of ``values``; ``Sym`` entries are computed from the inputs."""
        values = list(values)
        if not any(isinstance(v, Sym) for v in values):
            return self.const(np.array(values, dtype=np.int64).reshape(len(values)))
        parts: list[str] = []
        run: list = []
        for v in values:
            if isinstance(v, Sym):
                if run:
                    parts.append(self.const(np.array(run, np.int64)))
                    run = []
                parts.append(self.dim(v))
            else:
                run.append(v)
        if run:
            parts.append(self.const(np.array(run, np.int64)))
        return parts[0] if len(parts) == 1 else self.op("Concat", parts, axis=0)

    def dim(self, s: Sym) -> str:
        """A 1-element int64 tensor holding the runtime value of ``s``."""
        if s in self._dims:
            return self._dims[s]
        out = None
        for name, power in s.powers:
            if (name, 1) not in self._dims:
                inp, axis = self.axes[name]
                if self.opset >= 15:
                    d = self.op("Shape", [inp], start=axis, end=axis + 1)
                else:  # a 0-d index (onnxruntime's Gather fusions assume one), then 1-D
                    shape = self.op("Shape", [inp])
                    d = self.op("Unsqueeze", [self.op("Gather", [shape, self.const(
                        np.array(axis, np.int64))], axis=0), self.const([0], np.int64)])
                self._dims[(name, 1)] = d
            for _ in range(power):
                d = self._dims[(name, 1)]
                out = d if out is None else self.op("Mul", [out, d])
        assert out is not None  # a Sym has an axis (a constant dim is an int)
        if s.coef != 1:
            out = self.op("Mul", [out, self.const([s.coef], np.int64)])
        self._dims[s] = out
        return out

    def cast(self, name: str, src, dst) -> str:
        """``name`` (of tessera dtype ``src``) as ``dst``; no node when they agree."""
        if src is dst:
            return name
        return self.op("Cast", [name], to=ONNX_DTYPE[dst.name])


class NodeView:
    """What a converter sees of one IR node: ONNX names (or Python values) of its inputs,
    attributes (with ``Sym`` where they follow dynamic axes), symbolic shapes, dtypes."""

    def __init__(self, node, ins: list, attrs: dict, shapes: dict):
        self.node = node
        self.ins = ins
        self.attrs = attrs
        self._shapes = shapes

    @property
    def name(self) -> str:
        return self.node.op.name

    def shape(self, i: int = 0) -> tuple:
        return self._shapes[self.node.inputs[i]]

    def dtype(self, i: int = 0):
        v = self.node.inputs[i]
        return v.dtype if isinstance(v, Value) else None

    def rank(self, i: int = 0) -> int:
        return len(self.node.inputs[i].shape)

    def is_tensor(self, i: int) -> bool:
        return i < len(self.node.inputs) and isinstance(self.node.inputs[i], Value)

    def out_shape(self, k: int = 0) -> tuple:
        return self._shapes[self.node.outputs[k]]

    def out_dtype(self, k: int = 0):
        return self.node.outputs[k].dtype

    def static(self, shape) -> bool:
        return not any(isinstance(d, Sym) for d in shape)


def _pick(op, opset: int, path: str):
    from tessera.onnx.converters import EXPORT, newest
    table = EXPORT.get(op.name, {})
    rule = newest(table, opset)
    if rule is None:
        if table:
            raise UnsupportedOpError(op.name, path, opset,
                                     f"op '{op.name}' needs opset {min(table)} or later "
                                     f"(exporting opset {opset})")
        raise UnsupportedOpError(op.name, path, opset)
    return rule


def _value_info(name: str, dtype, shape):
    from onnx import helper
    dims = [d.name if isinstance(d, Sym) else d for d in shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPE[dtype.name], dims)


def export_graph(g: Graph, tensors: dict, opset_version: int = 17, output_names=None,
                 shapes=None, attrs=None, axes=None, producer: str = "tessera"):
    """An ONNX ModelProto of IR graph ``g`` with variable values ``tensors``.

    >>> import tessera
    >>> from tessera.onnx._trace import trace_model
    >>> g, tensors = trace_model(tessera.nn.Linear(3, 2), (tessera.ones(1, 3),))
    >>> [o.name for o in export_graph(g, tensors, output_names=["y"]).graph.output]
    ['y']
    """
    if not MIN_OPSET <= opset_version <= MAX_OPSET:
        raise ValueError(f"onnx.export: opset_version must be in {MIN_OPSET}..{MAX_OPSET}, "
                         f"got {opset_version}")
    shapes = shapes or {}
    for v in list(g.inputs) + list(g.variables.values()) + [o for n in g.nodes
                                                              for o in n.outputs]:
        shapes.setdefault(v, v.shape)
    b = Builder(opset_version, axes)
    names = _emit_nodes(g, b, tensors, shapes, attrs or {})
    outputs = _name_outputs(g, b, names, list(output_names or []), shapes)
    _check_closed(g, b)
    return _make_model(g, b, outputs, shapes, producer)


def _emit_nodes(g: Graph, b: Builder, tensors: dict, shapes: dict, attrs: dict) -> dict:
    """Convert every node of ``g`` into ``b``; returns the ONNX name of each IR value."""
    names: dict[Value, str] = {v: v.name for v in g.inputs}
    for name, v in g.variables.items():
        t = tensors[name]
        b.initializers[name] = np.asarray(t._data if hasattr(t, "_data") else t)
        names[v] = name
    for node in g.nodes:
        b.scope = node.name
        ins = [_input_name(x, names, node, b.opset) for x in node.inputs]
        outs = _convert(node, b, NodeView(node, ins, attrs.get(node, node.attrs), shapes))
        for v, out in zip(node.outputs, outs):
            if out is not None:
                names[v] = out
    return names


def _input_name(x, names: dict, node, opset: int):
    """The ONNX name of input ``x`` of ``node`` (a Python value stays as it is)."""
    if not isinstance(x, Value):
        return x
    if x not in names:
        raise UnsupportedOpError(x.producer.op.name, x.producer.name, opset,
                                 f"output {x.index} of op '{x.producer.op.name}' "
                                 f"is not exported (used by op '{node.op.name}')")
    return names[x]


def _convert(node, b: Builder, view: NodeView) -> list:
    """The ONNX names of ``node``'s outputs (None for one its rule does not produce)."""
    rule = _pick(node.op, b.opset, node.name)
    try:
        outs = rule(b, view)
    except ExportError:
        raise
    except (NotImplementedError, TypeError, ValueError) as e:
        raise UnsupportedOpError(node.op.name, node.name, b.opset,
                                 f"op '{node.op.name}': {e}") from e
    return [outs] if isinstance(outs, str) or outs is None else list(outs)


def _name_outputs(g: Graph, b: Builder, names: dict, output_names: list, shapes: dict) -> list:
    """Give the graph outputs their final names (a producer's output is renamed; an
    Identity copies a value that is output twice, or is an input or initializer); returns
    their value infos."""
    from onnx import helper
    outputs, renames, used = [], {}, set()
    graph_inputs = {v.name for v in g.inputs}
    for i, v in enumerate(g.outputs):
        if v not in names:
            raise UnsupportedOpError(v.producer.op.name, v.producer.name, b.opset,
                                     f"output {v.index} of op '{v.producer.op.name}' is not "
                                     "exported")
        want = output_names[i] if i < len(output_names) else f"output{i}"
        src = names[v]
        if src in used or src in b.initializers or src in graph_inputs:
            b.scope = ""
            b.nodes.append(helper.make_node("Identity", [src], [want], name=f"{want}/Identity"))
        else:
            renames[src] = want
        used.add(src)
        outputs.append(_value_info(want, v.dtype, shapes[v]))
    for n in b.nodes:
        n.input[:] = [renames.get(x, x) for x in n.input]
        n.output[:] = [renames.get(x, x) for x in n.output]
    return outputs


def _check_closed(g: Graph, b: Builder) -> None:
    """Every tensor a node reads is a graph input, an initializer or a node's output."""
    defined = set(b.initializers) | {v.name for v in g.inputs} | \
        {o for n in b.nodes for o in n.output}
    missing = {x for n in b.nodes for x in n.input if x} - defined
    if missing:
        raise ExportError(f"onnx.export: internal error, undefined tensors {sorted(missing)}")


def _make_model(g: Graph, b: Builder, outputs: list, shapes: dict, producer: str):
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(a, copy=not a.flags.c_contiguous), name)
             for name, a in b.initializers.items()]
    graph = helper.make_graph(b.nodes, "tessera", [_value_info(v.name, v.dtype, shapes[v])
                                                   for v in g.inputs], outputs, inits)
    domains = sorted({n.domain for n in b.nodes if n.domain})
    model = helper.make_model(graph, producer_name=producer,
                              opset_imports=[helper.make_opsetid("", b.opset)] +
                              [helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = min(model.ir_version, 10)
    return model


def export(model, args, f=None, *, opset_version: int = 17, input_names=None,
           output_names=None, dynamic_axes=None, external_data: bool | None = None,
           check: bool = True):
    """Export ``model`` (an ``nn.Module``, traced in eval mode, or an inference
    ``nn.Graph``) called on ``args`` as ONNX; writes ``f`` (a path) if given and returns
    the ``onnx.ModelProto``. ``dynamic_axes`` as in ``torch.onnx.export``:
    ``{"input_ids": {0: "batch", 1: "seq"}}``. ``external_data`` stores the weights in a
    ``<file>.data`` beside the model (default: when they exceed 1 GB).

    >>> import tessera, tessera.onnx
    >>> m = tessera.nn.Sequential(tessera.nn.Linear(4, 3), tessera.nn.ReLU())
    >>> p = tessera.onnx.export(m, tessera.ones(2, 4), dynamic_axes={"input0": {0: "n"}})
    >>> p.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    'n'
    """
    g, tensors, shapes, attrs, axes = symbolic_graph(model, args, input_names, dynamic_axes)
    proto = export_graph(g, tensors, opset_version, output_names, shapes, attrs, axes)
    size = sum(a.nbytes for a in tensors.values() if hasattr(a, "nbytes"))
    if external_data is None:
        external_data = size > EXTERNAL_DATA_BYTES
    if f is None:
        if check:
            _check(proto)
        return proto
    save(proto, f, external_data=external_data, check=check)
    return proto


def _check(proto, path: str | None = None) -> None:
    import onnx
    try:
        onnx.checker.check_model(path if path is not None else proto, full_check=True)
    except Exception as e:
        raise ExportError(f"onnx.export: the exported model fails onnx.checker: {e}") from e


def save(proto, path, external_data: bool = False, check: bool = True) -> None:
    """Write ``proto`` to ``path`` atomically (checked first; weights external if asked)."""
    import onnx
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    if not external_data:
        if check:
            _check(proto)
        data = proto.SerializeToString()
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return
    # external data: write both files in a private temporary folder, check, then move
    tmpdir = tempfile.mkdtemp(prefix=f".{base}.", dir=folder)
    try:
        proto = onnx.ModelProto.FromString(proto.SerializeToString())
        onnx.save_model(proto, os.path.join(tmpdir, base), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=base + ".data",
                        size_threshold=1024)
        if check:
            _check(None, os.path.join(tmpdir, base))
        os.replace(os.path.join(tmpdir, base + ".data"), os.path.join(folder, base + ".data"))
        os.replace(os.path.join(tmpdir, base), path)
    finally:
        for name in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, name))
        os.rmdir(tmpdir)
