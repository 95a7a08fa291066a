"""What an export starts from: an inference graph after the compiler's passes, and the
values of its variables as NumPy arrays.

A module in eval mode is traced through ``nn.Graph`` (so it gets the same passes: conv+BN
folding, fusion, outlining), an inference ``nn.Graph`` is compiled for the example inputs,
and an ONNX file goes through ``tessera.onnx.load`` and the pass pipeline. The graph is
then a private copy (its text form parsed back), and every node that reads only variables
(a weight's transpose, a folded constant) is computed here, once, into a new variable.
"""
from __future__ import annotations

import os

import numpy as np

from tessera._tensor import Tensor
from tessera.graph.executor import compile_kernel
from tessera.graph.ir import Graph, Value
from tessera.nn.graph import Graph as NNGraph
from tessera.nn.modules.module import Module

__all__ = ["capture"]


class _Wrap(NNGraph):
    def __init__(self, module: Module):
        super().__init__()
        self.model = module

    def build(self, *args):
        return self.model(*args)


def _check_inputs(example_inputs) -> tuple:
    if isinstance(example_inputs, Tensor):
        example_inputs = (example_inputs,)
    inputs = tuple(example_inputs)
    if not inputs or not all(isinstance(t, Tensor) for t in inputs):
        raise TypeError("tessera.deploy.export_c: example_inputs must be a tuple of tensors, "
                        f"got {type(example_inputs).__name__}")
    return inputs


def capture(model, example_inputs, plain: dict | None = None
            ) -> tuple[Graph, dict[str, np.ndarray]]:
    """(graph, variable values) of ``model`` for ``example_inputs``; into ``plain``, if
    given, the plain weights of the Winograd layers' packed variables (by name: see
    ``tessera.graph.passes.nchwc.plain_weights``)."""
    from tessera.graph.passes.nchwc import plain_weights
    with plain_weights() as found:
        g, values = _capture(model, example_inputs, found)
    if plain is not None:
        plain.update((k, a) for k, a in found.items() if k in g.variables)
    return g, values


def _winograd_weights(ir: Graph) -> set[str]:
    return {n.inputs[1].name for n in ir.nodes
            if n.op.name == "conv2d_nchwc" and n.attrs.get("winograd")}


def _capture(model, example_inputs, found: dict) -> tuple[Graph, dict[str, np.ndarray]]:
    if isinstance(model, (str, os.PathLike)):
        from tessera.graph.passes import run_pipeline
        from tessera.onnx import load
        shapes = None if example_inputs is None else \
            [tuple(t.shape) for t in _check_inputs(example_inputs)]
        om = load(os.fspath(model), shapes)
        values = dict(om.values)
        run_pipeline(om.graph, training=False, values=values)
        ir, tensors = om.graph, values
    else:
        inputs = _check_inputs(example_inputs)
        if isinstance(model, Module):
            if model.training:
                raise ValueError("tessera.deploy.export_c: the module is in training mode; "
                                 "call model.eval() first")
            model = _Wrap(model)
        if not isinstance(model, NNGraph):
            raise TypeError("tessera.deploy.export_c: model must be an nn.Module, an "
                            f"inference nn.Graph or an ONNX path, got {type(model).__name__}")
        if model.training:
            raise ValueError("tessera.deploy.export_c: the nn.Graph has an optimizer (a "
                             "training step); export an inference graph")
        model(*inputs)
        compiled = model._current()
        if not _winograd_weights(compiled.ir) <= found.keys():
            # compiled before: again, to see the weights its Winograd layers were packed from
            found.clear()
            compiled = model._compile(inputs)
        ir, tensors = compiled.ir, compiled.tensors
    g = Graph.parse(str(ir))
    values = {name: np.ascontiguousarray(_array(tensors[name])) for name in g.variables}
    _affine_batch_norms(g, values)
    _fold_constants(g, values)
    return g, values


def _array(t) -> np.ndarray:
    return t.detach().numpy() if isinstance(t, Tensor) else np.asarray(t)


def _affine_batch_norms(g: Graph, values: dict) -> None:
    """An eval-mode batch_norm the passes did not fold into a layer (one after a binary
    convolution or an addition) becomes ``x * s + shift`` per channel, elementwise ops the
    library has loops for (its statistics' results unused, as in any inference graph)."""
    from tessera.graph.passes.bnfold import _affine, _emit
    known = {id(v): Tensor._from_numpy(values[k]) for k, v in g.variables.items()}
    used = {id(v) for n in g.nodes for v in n.tensor_inputs} | {id(v) for v in g.outputs}
    for bn in [n for n in g.nodes if n.op.name == "batch_norm"]:
        y = bn.inputs[0]
        if any(id(v) in used for v in bn.outputs[1:]) or not y.dtype.is_floating_point or \
                len(y.shape) < 2:
            continue
        affine = _affine(bn, known)
        if affine is None:
            continue
        shape = (y.shape[1],) + (1,) * (len(y.shape) - 2)
        made = []
        for part, a in zip(("scale", "shift"), affine):
            name = f"_bn.{part}.{len(values)}"
            values[name] = np.ascontiguousarray(a.reshape(shape), dtype=y.dtype.np)
            made.append(g.add_variable(name, shape, y.dtype))
        mul = _emit("mul", [y, made[0]], {}, bn.name, g)
        add = _emit("add", [mul.outputs[0], made[1]], {"alpha": 1}, bn.name, g)
        at = g.nodes.index(bn)
        g.nodes[at:at + 1] = [mul, add]
        g.replace_uses(bn.outputs[0], add.outputs[0])


def _fold_constants(g: Graph, values: dict) -> None:
    """Nodes whose tensor inputs are all variables become variables (computed now)."""
    kept = []
    for n in g.nodes:
        ins = n.tensor_inputs
        if not ins or any(v.kind != "var" for v in ins) or len(n.outputs) != 1:
            kept.append(n)
            continue
        kernel, casts = compile_kernel(n)
        args = [values[v.name] if isinstance(v, Value) else v for v in n.inputs]
        args = [a.astype(c) if c is not None else a for a, c in zip(args, casts)]
        out = n.outputs[0]
        name = f"_const.{out.name}"
        values[name] = np.ascontiguousarray(np.asarray(kernel(*args, **n.attrs)),
                                            dtype=out.dtype.np)
        g.replace_uses(out, g.add_variable(name, out.shape, out.dtype))
    g.nodes = kept
    used = {id(v) for n in g.nodes for v in n.tensor_inputs} | {id(v) for v in g.outputs}
    for name in [k for k, v in g.variables.items() if id(v) not in used]:
        del g.variables[name]
        values.pop(name, None)
