"""A model as TensorBoard's ``GraphDef``: traced with tessera's tracer (the ``nn.Graph`` IR)
and converted node by node.

Node names are module paths with ``/`` between the parts, so TensorBoard's graph tab nests
each module's ops in a box named after it (``Net/fc1/matmul``); graph inputs and outputs
are ``IO Node``s named ``input/...`` and ``output/...`` as PyTorch's writer names them,
parameters and buffers are ``Parameter`` nodes under their module.

>>> import tessera
>>> gd, _ = graph(tessera.nn.Linear(3, 2), (tessera.ones(1, 3),))
>>> [n.name for n in gd.node]  # doctest: +NORMALIZE_WHITESPACE
['input/input0', 'Linear/weight', 'Linear/bias', 'Linear/permute', 'Linear/matmul',
 'Linear/add', 'output/output0']
"""
from __future__ import annotations

from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.config_pb2 import RunMetadata
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.step_stats_pb2 import DeviceStepStats, StepStats
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.versions_pb2 import VersionDef

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.graph.ir import Graph as IRGraph, Value
from tessera.graph.trace import current_tracer, trace
from tessera.nn.graph import Graph as NNGraph, _module_scopes
from tessera.nn.modules.module import Module

__all__ = ["graph", "graph_def"]


def _shape_attr(values) -> AttrValue:
    return AttrValue(list=AttrValue.ListValue(shape=[
        TensorShapeProto(dim=[TensorShapeProto.Dim(size=d) for d in v.shape])
        for v in values]))


def _node(name: str, op: str, inputs: list[str], outputs, extra: str = "") -> NodeDef:
    attr = {"_output_shapes": _shape_attr(outputs)}
    if outputs:
        attr["dtype"] = AttrValue(s=outputs[0].dtype.name.encode())
    if extra:
        attr["attr"] = AttrValue(s=extra.encode("utf_8"))
    return NodeDef(name=name, op=op, input=inputs, attr=attr)


def _path(name: str) -> str:
    return name.replace(".", "/")


def graph_def(ir: IRGraph) -> GraphDef:
    """``ir`` as a ``GraphDef``: a node per input, variable, op node and output."""
    producer: dict[int, str] = {}
    nodes = []
    for v in ir.inputs:
        producer[id(v)] = f"input/{v.name}"
        nodes.append(_node(producer[id(v)], "IO Node", [], [v]))
    for name, v in ir.variables.items():
        producer[id(v)] = _path(name)
        nodes.append(_node(producer[id(v)], "Parameter", [], [v]))
    used: dict[str, int] = {}
    for n in ir.nodes:
        base = f"{_path(n.name)}/{n.op.name}" if n.name else n.op.name
        k = used.get(base, 0)
        used[base] = k + 1
        name = base if k == 0 else f"{base}_{k}"
        for i, out in enumerate(n.outputs):
            producer[id(out)] = name if i == 0 else f"{name}:{i}"
        attrs = ", ".join(f"{a}={v!r}" for a, v in n.attrs.items() if a != "body")
        nodes.append(_node(name, n.op.name, [producer[id(v)] for v in n.inputs
                                             if isinstance(v, Value)], n.outputs,
                           "{" + attrs + "}" if attrs else ""))
    for i, v in enumerate(ir.outputs):
        nodes.append(_node(f"output/output{i}", "IO Node", [producer[id(v)]], [v]))
    return GraphDef(node=nodes, versions=VersionDef(producer=22))


def _flat(out) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    return []


class _Holder(NNGraph):
    """Names the model's modules (their paths start at the model's class name)."""

    def build(self, *args):  # never called: only its module naming is used
        raise NotImplementedError


def trace_module(model: Module, inputs: tuple) -> IRGraph:
    """The IR of ``model(*inputs)`` in eval mode without gradients, its nodes named after
    the module paths (the root is the model's class name)."""
    holder = _Holder()
    setattr(holder, type(model).__name__, model)
    names = holder._names()

    def run(*syms):
        with _module_scopes(holder, current_tracer()):
            return _flat(model(*syms))
    was_training = model.training
    model.train(False)
    try:
        with no_grad():
            ir, _ = trace(run, *inputs, names=names)
    finally:
        model.train(was_training)
    return ir


def graph(model, args) -> tuple[GraphDef, RunMetadata]:
    """The ``GraphDef`` of ``model`` (a Module run on ``args``, or an ``nn.Graph``: its
    compiled IR, compiled on ``args`` first if needed), and the run metadata TensorBoard
    expects beside it."""
    if args is None:
        args = ()
    elif isinstance(args, Tensor):
        args = (args,)
    args = tuple(args)
    if isinstance(model, IRGraph):
        ir = model
    elif isinstance(model, NNGraph):
        if model._last_key is None:
            if model.training or not args:  # a training graph's call is a training step
                raise RuntimeError(f"add_graph: the nn.Graph {type(model).__name__} has not "
                                   "been compiled yet; call it once before adding its graph")
            model(*args)
        ir = model.ir
    elif isinstance(model, Module):
        bad = [type(a).__name__ for a in args if not isinstance(a, Tensor)]
        if bad:
            raise TypeError(f"add_graph: input_to_model must be tensors, got {bad}")
        ir = trace_module(model, args)
    else:
        raise TypeError(f"add_graph: expected an nn.Module or an nn.Graph, got "
                        f"{type(model).__name__}")
    stats = RunMetadata(step_stats=StepStats(dev_stats=[DeviceStepStats(
        device="/device:CPU:0")]))
    return graph_def(ir), stats
