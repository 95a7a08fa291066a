"""ONNX import: an ONNX model runs as tessera ops, eagerly or traced into an IR graph.

``OnnxProgram`` replays the model's nodes through the import table (``tessera.onnx.
converters.IMPORT``, keyed by ONNX op type and the opset each rule starts at) on
tessera tensors. Run eagerly it is the ONNX backend and ``to_module``'s forward (autograd
works, so an imported model can be fine-tuned); run under the tracer it is ``load``, an IR
graph for the reference interpreter and the compiled executor. Nodes whose inputs are all
constants are folded while tracing, so shape computations (Shape -> Gather -> Concat ->
Reshape) become static attributes.

>>> import tessera, tessera.onnx
>>> proto = tessera.onnx.export(tessera.nn.Linear(3, 2), (tessera.ones(1, 3),))
>>> m = tessera.onnx.load(proto)
>>> [n.op.name for n in m.graph.nodes]
['permute', 'matmul', 'add']
>>> m.run(tessera.ones(1, 3))[0].shape
tessera.Size([1, 2])
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from tessera._dispatch import pop_mode, push_mode
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.graph.ir import Graph
from tessera.graph.trace import GraphTraceError, Tracer, is_symbolic
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.onnx.converters.helpers import DTYPES
from tessera.onnx.errors import OnnxImportError, OnnxValidationError

__all__ = ["OnnxProgram", "OnnxModel", "OnnxImportError", "OnnxValidationError", "load",
           "to_module", "LOAD_OPSETS"]

LOAD_OPSETS = (13, 21)





def _proto(model):
    """The ModelProto of ``model`` (a path, bytes or a ModelProto)."""
    return _read(model)[0]


def _read(model):
    """(the ModelProto of ``model``, the path it was read from or None)."""
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(model)), None
        except Exception as e:
            raise OnnxImportError(f"not an ONNX model: {e}") from None
    path = os.fspath(model)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: '{path}'")
    try:
        proto = onnx.load(path)
    except Exception as e:
        raise OnnxImportError(f"'{path}' is not a readable ONNX model ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else 'truncated?'})") from None
    if not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"'{path}' is not an ONNX model (no graph)")
    return proto, path


def _array(tensor) -> np.ndarray:
    from onnx import numpy_helper
    if tensor.data_type not in DTYPES:
        import onnx
        name = onnx.TensorProto.DataType.Name(tensor.data_type)
        raise OnnxImportError(f"tensor '{tensor.name}' has data type {name}, which tessera "
                              "does not have")
    return numpy_helper.to_array(tensor)


def _tensor(arr: np.ndarray) -> Tensor:
    return Tensor._from_numpy(np.array(arr, copy=True))


def opset_of(proto) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 1


class OnnxProgram:
    """The nodes of one ONNX graph, runnable on tessera tensors. The model is validated
    first (``tessera.onnx.validate``): an invalid one raises ``OnnxValidationError``."""

    def __init__(self, model, opset_range: tuple[int, int] | None = LOAD_OPSETS):
        from tessera.onnx.converters import IMPORT, newest
        from tessera.onnx.validate import validate
        self.proto, path = _read(model)
        self.opset = opset_of(self.proto)
        if opset_range is not None and not opset_range[0] <= self.opset <= opset_range[1]:
            raise OnnxImportError(f"ONNX opset {self.opset} is not supported; tessera imports "
                                  f"opsets {opset_range[0]}-{opset_range[1]}")
        from tessera.onnx.converters import DOMAINS
        from tessera.onnx.converters.binary import fuse_sign_conv
        used = {n.domain for n in self.proto.graph.node}
        for o in self.proto.opset_import:
            if o.domain in DOMAINS:
                DOMAINS[o.domain]()
            elif o.domain not in ("", "ai.onnx") and o.domain in used:
                raise OnnxImportError(f"operator domain '{o.domain}' is not supported")
        g = self.proto.graph
        for i, node in enumerate(g.node):
            if node.domain not in ("", "ai.onnx") and node.domain not in DOMAINS:
                raise OnnxImportError(f"node '{node.name}': operator {node.domain}::"
                                      f"{node.op_type} is not supported")
            if node.op_type not in IMPORT:
                raise OnnxImportError(f"node '{node.name or node.op_type}': ONNX operator "
                                      f"'{node.op_type}' is not supported")
        validate(self.proto, self.opset, path)
        self.proto = fuse_sign_conv(self.proto)  # dabnn's binary pattern, once it is valid
        g = self.proto.graph
        self.initializers = {t.name: _array(t) for t in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in self.initializers]
        self.output_names = [o.name for o in g.output]
        from tessera.onnx.validate import type_params
        self.rules = []
        self.type_params = [type_params(node, self.opset) for node in g.node]
        for node in g.node:
            table = IMPORT[node.op_type]
            rule = newest(table, self.opset)
            if rule is None:
                raise NotImplementedError(f"{node.op_type} needs opset {min(table)}")
            self.rules.append(rule)

    def input_shapes(self) -> list[tuple]:
        """Declared input shapes (a str for a symbolic dim, None for an unknown one)."""
        out = []
        by_name = {i.name: i for i in self.proto.graph.input}
        for name in self.input_names:
            t = by_name[name].type.tensor_type
            out.append(tuple(d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                             for d in t.shape.dim))
        return out

    def input_dtypes(self) -> list:
        by_name = {i.name: i for i in self.proto.graph.input}
        return [DTYPES.get(by_name[n].type.tensor_type.elem_type) for n in self.input_names]

    def run(self, inputs: list[Tensor], params: dict[str, Tensor]) -> list[Tensor]:
        """The graph's outputs for ``inputs`` (in input order), initializers from
        ``params`` (tensors by name; missing ones are the model's constants)."""
        from tessera.onnx.converters.helpers import ImportContext
        if len(inputs) != len(self.input_names):
            raise OnnxImportError(f"the model takes {len(self.input_names)} inputs "
                                  f"({', '.join(self.input_names)}), got {len(inputs)}")
        env: dict[str, Tensor] = {}
        for name, arr in self.initializers.items():
            env[name] = params[name] if name in params else _tensor(arr)
        env.update(zip(self.input_names, inputs))
        tracer = _current_tracer()
        # validation guarantees every name read is defined before (a KeyError here is a bug)
        for k, (node, rule) in enumerate(zip(self.proto.graph.node, self.rules)):
            args = [env[i] if i else None for i in node.input]
            ctx = ImportContext(node, self.opset, k)
            _check_types(ctx, self.type_params[k], args)
            out = _apply(rule, ctx, args, tracer)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for name, t in zip(node.output, outs):
                if not name:
                    continue
                if t is None:
                    raise OnnxImportError(f"{ctx.where}: tessera does not compute its "
                                          f"output '{name}'")
                env[name] = t
            if len(outs) < len(node.output) and any(node.output[len(outs):]):
                raise OnnxImportError(f"{ctx.where}: tessera computes {len(outs)} of its "
                                      f"{len(node.output)} outputs")
        outs = [env[n] for n in self.output_names]
        for v, t in zip(self.proto.graph.output, outs):
            want = DTYPES.get(v.type.tensor_type.elem_type)
            if want is not None and t.dtype is not want:
                raise OnnxValidationError(f"graph output '{v.name}' is declared {want}; the "
                                          f"model computes {t.dtype}")
        return outs


def _check_types(ctx, params: list[str], args: list) -> None:
    """Inputs bound to one type parameter of the node's schema have one dtype (tessera's
    ops would promote them instead)."""
    seen: dict[str, tuple] = {}
    for name, p, a in zip(ctx.node.input, params, args):
        if a is None:
            continue
        first = seen.setdefault(p, (name, a.dtype))
        if a.dtype is not first[1]:
            raise OnnxValidationError(f"{ctx.where}: inputs '{first[0]}' ({first[1]}) and "
                                      f"'{name}' ({a.dtype}) must have one type ({p})")


def _apply(rule, ctx, args: list, tracer):
    """``rule(ctx, *args)``; under ``load``'s tracer, a node whose inputs are all constants
    is computed now instead of traced (shape arithmetic becomes static attributes). The
    rule's errors become ``OnnxImportError``s naming the node."""
    node = ctx.node
    folding = tracer is not None and all(a is None or not is_symbolic(a) and
                                         a not in tracer.persistent for a in args)
    try:
        if not folding:
            return rule(ctx, *args)
        pop_mode()
        try:
            return rule(ctx, *args)
        finally:
            push_mode(tracer.tracer)
    except GraphTraceError as e:
        raise OnnxImportError(f"{ctx.where} needs the value of a tensor that is only known at run "
                              f"time, so it cannot be part of a static graph ({e})") from None
    except NotImplementedError as e:
        raise OnnxImportError(f"{ctx.where}: {node.op_type} {e}") from None
    except Exception as e:  # an op's own error (shapes, dtypes): keep its type, name the node
        note = getattr(e, "add_note", None)   # Python 3.11 on
        if note is not None and not isinstance(e, OnnxImportError):
            note(f"while importing ONNX {ctx.where}")
        raise


class _TraceState:
    def __init__(self, tracer: Tracer, persistent: _Persistent):
        self.tracer = tracer
        self.persistent = persistent   # tensors that are graph variables (parameters)


_TRACING: list[_TraceState] = []


def _current_tracer() -> _TraceState | None:
    return _TRACING[-1] if _TRACING else None


class _Persistent:
    """Identity-based set of tensors."""

    def __init__(self, tensors):
        self.ids = {id(t) for t in tensors}

    def __contains__(self, t) -> bool:
        return id(t) in self.ids


@dataclass
class OnnxModel:
    """An imported model: its IR ``graph``, variable ``values`` (initializers that are
    parameters, by name) and input/output names. ``run`` executes it."""

    graph: Graph
    values: dict
    input_names: list
    output_names: list
    opset: int

    def run(self, *inputs, compiled: bool = False) -> list[Tensor]:
        """The outputs for ``inputs`` through the reference interpreter, or the compiled
        executor with ``compiled=True``."""
        tensors = [x if isinstance(x, Tensor) else Tensor._from_numpy(np.asarray(x))
                   for x in inputs]
        variables = {k: self.values[k] for k in self.graph.variables}
        if compiled:
            from tessera.graph.executor import Executor
            if not hasattr(self, "_executor"):
                self._executor = Executor(self.graph)
            outs, _ = self._executor.run([x.numpy() for x in tensors],
                                         {k: v._data for k, v in variables.items()})
            return [Tensor._from_numpy(np.array(o, copy=True)) for o in outs]
        from tessera.graph.interpreter import interpret
        return interpret(self.graph, tensors, variables)[0]


def _trainable(arr: np.ndarray) -> bool:
    """Floating-point initializers with dimensions are parameters; 0-d ones are constants."""
    return arr.dtype.kind == "f" and arr.ndim >= 1


def load(model, input_shapes: dict | list | None = None) -> OnnxModel:
    """An ONNX model (path, bytes or ModelProto) as an IR graph. Floating-point initializers
    with dimensions become named variables (the parameters); the rest are
    constants folded into the graph. Symbolic input dims need ``input_shapes`` (by name or
    in order); the graph is static. The QDQ groups of a quantized model (dequantize, Conv
    or Gemm, quantize) become tessera's INT8 ops (``tessera.graph.passes.qdq``)."""
    prog = OnnxProgram(model)
    shapes = _resolve_shapes(prog, input_shapes)
    g = Graph()
    params = {k: _tensor(v) for k, v in prog.initializers.items() if _trainable(v)}
    tracer = Tracer(g, {id(t): k for k, t in params.items()})
    syms = []
    for name, shape, dt in zip(prog.input_names, shapes, prog.input_dtypes()):
        if dt is None:
            raise OnnxImportError(f"input '{name}' has a data type tessera does not have")
        v = g.add_input(_ident(name), shape, dt)
        syms.append(tracer.symbolic(v))
    _TRACING.append(_TraceState(tracer, _Persistent(params.values())))
    try:
        with tracer, no_grad():
            outs = prog.run(syms, params)
    finally:
        _TRACING.pop()
    g.outputs = [tracer.value(o) for o in outs]
    from tessera.graph.passes import PassContext, dce, qdq
    dce.run(g, None)
    values = {tracer.initial[k].name: t for k, t in tracer.tensors.items()}
    # a QDQ model's dequantize-compute-quantize groups run as tessera's INT8 ops
    if qdq.run(g, PassContext(False, values)):
        dce.run(g, None)
    return OnnxModel(g, {k: values[k] for k in g.variables}, prog.input_names,
                     prog.output_names, prog.opset)


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name) or "input"


def _resolve_shapes(prog: OnnxProgram, given) -> list[tuple]:
    declared = prog.input_shapes()
    if isinstance(given, dict):
        given = [given.get(n) for n in prog.input_names]
    given = list(given or [None] * len(declared))
    out = []
    for name, decl, want in zip(prog.input_names, declared, given):
        shape = tuple(want) if want is not None else decl
        if any(not isinstance(d, int) for d in shape):
            raise OnnxImportError(f"input '{name}' has symbolic or unknown dims {list(decl)}; "
                                  "pass input_shapes to load() (tessera graphs are static)")
        out.append(shape)
    return out


class OnnxModule(Module):
    """An ONNX model as a module: floating-point initializers are parameters (nested by
    their dotted names, so ``state_dict`` keys are the initializer names), and ``forward``
    runs the nodes eagerly as tessera ops, with autograd."""

    def __init__(self, model):
        super().__init__()
        prog = OnnxProgram(model)
        object.__setattr__(self, "_program", prog)
        self._param_names = []
        for name, arr in prog.initializers.items():
            if not _trainable(arr):
                continue
            *path, leaf = [_ident(p) or "_" for p in name.split(".")]
            mod = self
            for p in path:
                if p not in mod._modules:
                    mod.add_module(p, Module())
                mod = mod._modules[p]
            if leaf in mod._parameters or leaf in mod._modules:
                raise OnnxImportError(f"initializer name '{name}' collides with another")
            mod.register_parameter(leaf, Parameter(_tensor(arr)))
            self._param_names.append((name, ".".join(path + [leaf])))

    def forward(self, *inputs):
        params = dict(self.named_parameters())
        outs = self._program.run(list(inputs), {onnx_name: params[path]
                                                for onnx_name, path in self._param_names})
        return outs[0] if len(outs) == 1 else tuple(outs)


def to_module(model) -> OnnxModule:
    """An ONNX model (path, bytes or ModelProto) as an ``nn.Module`` to run or fine-tune.

    >>> import tessera, tessera.onnx
    >>> lin = tessera.nn.Linear(3, 2)
    >>> m = tessera.onnx.to_module(tessera.onnx.export(lin, (tessera.ones(1, 3),)))
    >>> sorted(m.state_dict())
    ['bias', 'weight']
    """
    return OnnxModule(model)
