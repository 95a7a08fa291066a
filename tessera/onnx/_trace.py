"""Tracing for export: a module (in eval mode) or an inference ``nn.Graph`` becomes an IR
graph through the one tracer (``tessera.graph.trace``), with variables named by module path.

With dynamic axes the model is traced once more per axis at another size; the sizes that
change between the traces become ``Sym`` dims (``coef * batch^i * seq^j``), in value
shapes and in node attributes, which the converters turn into shape computations.

>>> import tessera
>>> g, tensors = trace_model(tessera.nn.Linear(3, 2), (tessera.ones(1, 3),))
>>> sorted(tensors)
['bias', 'weight']
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.graph.ir import Graph, Value
from tessera.graph.trace import Tracer
from tessera.nn.modules import module as _module_mod
from tessera.nn.modules.module import Module

__all__ = ["Sym", "trace_model", "symbolic_graph", "ExportError"]


class ExportError(RuntimeError):
    """The model cannot be written as ONNX (the message says which op, where, and why)."""


@dataclass(frozen=True)
class Sym:
    """A dimension that follows the dynamic axes: ``coef * prod(axis ** power)``."""

    coef: int
    powers: tuple  # ((axis name, power), ...)

    def __str__(self) -> str:
        parts = [] if self.coef == 1 else [str(self.coef)]
        parts += [n if p == 1 else f"{n}^{p}" for n, p in self.powers]
        return "*".join(parts)

    __repr__ = __str__

    @property
    def name(self) -> str | None:
        """The axis name when this dim is exactly one dynamic axis."""
        if self.coef == 1 and len(self.powers) == 1 and self.powers[0][1] == 1:
            return self.powers[0][0]
        return None


def _as_tuple(args) -> tuple:
    if isinstance(args, Tensor):
        return (args,)
    return tuple(args)


class _Scopes:
    """While tracing, each module call names its nodes after its module path."""

    def __init__(self, paths: dict[int, str], tracer: Tracer):
        self.paths, self.tracer = paths, tracer

    def wrapper(self, module, call, args, kwargs):
        path = self.paths.get(id(module))
        if path is None:
            return call(*args, **kwargs)
        saved = self.tracer.scope
        self.tracer.scope = [path] if path else []
        try:
            return call(*args, **kwargs)
        finally:
            self.tracer.scope = saved

    def __enter__(self):
        _module_mod._CALL_WRAPPERS.append(self.wrapper)
        return self

    def __exit__(self, *exc):
        _module_mod._CALL_WRAPPERS.pop()
        return False


def _module_names(prefixed: dict[str, Module]) -> tuple[dict[int, str], dict[int, str]]:
    """(id(tensor) -> variable name, id(module) -> path) for modules under prefixes."""
    names: dict[int, str] = {}
    paths: dict[int, str] = {}
    for prefix, mod in prefixed.items():
        join = (lambda n, p=prefix: f"{p}.{n}" if p and n else p or n)
        for n, t in mod.named_parameters(remove_duplicate=True):
            names.setdefault(id(t), join(n))
        for n, b in mod.named_buffers(remove_duplicate=True):
            if b is not None:
                names.setdefault(id(b), join(n))
        for n, m in mod.named_modules():
            paths.setdefault(id(m), join(n))
    return names, paths


def trace_model(model, args, input_names=None) -> tuple[Graph, dict[str, Tensor]]:
    """(IR graph, variable name -> tensor) of ``model(*args)`` in eval mode, no autograd."""
    from tessera.graph.passes import dce
    from tessera.nn.graph import Graph as NNGraph, _flatten

    args = _as_tuple(args)
    for a in args:
        if not isinstance(a, Tensor):
            raise TypeError(f"onnx.export: example inputs must be tensors, got "
                            f"{type(a).__name__}")
    if isinstance(model, NNGraph):
        if model.training:
            raise ExportError("onnx.export: a training nn.Graph (one with an optimizer) "
                              "cannot be exported; export its model or an inference graph")
        modules = dict(model._modules)
        call = model.build
    elif isinstance(model, Module):
        modules = {"": model}
        call = model
    else:
        raise TypeError(f"onnx.export: expected an nn.Module or nn.Graph, got "
                        f"{type(model).__name__}")
    names, paths = _module_names(modules)
    g = Graph()
    tracer = Tracer(g, names)
    input_names = list(input_names or [])
    syms = []
    for i, a in enumerate(args):
        name = input_names[i] if i < len(input_names) else f"input{i}"
        syms.append(tracer.symbolic(g.add_input(name, a._shape, a._dtype), a))
    modes = [(m, m.training) for mod in modules.values() for m in mod.modules()]
    for mod in modules.values():
        mod.eval()
    try:
        with tracer, _Scopes(paths, tracer), no_grad():
            out = call(*syms)
    finally:
        for m, mode in modes:
            m.training = mode
    outs, _ = _flatten(out)
    g.outputs = [tracer.value(o) for o in outs]
    g.assigns = []  # eval mode: buffer updates (if any) are not part of inference
    dce.run(g, None)
    values = {tracer.initial[k].name: t for k, t in tracer.tensors.items()}
    return g, {k: values[k] for k in g.variables}


# ---- dynamic axes ------------------------------------------------------------------------

def _axes_spec(dynamic_axes, names: list[str]) -> dict[str, dict[int, str]]:
    """torch.onnx's ``dynamic_axes`` ({name: {axis: dim name}} or {name: [axes]})."""
    spec: dict[str, dict[int, str]] = {}
    for key, axes in (dynamic_axes or {}).items():
        if isinstance(axes, dict):
            spec[key] = {int(a): str(n) for a, n in axes.items()}
        else:
            spec[key] = {int(a): f"{key}_dynamic_axes_{k + 1}" for k, a in enumerate(axes)}
    return spec


def _resize(a: Tensor, axis: int, size: int) -> Tensor:
    """``a`` with ``axis`` resized to ``size`` by repeating its entries (ids stay valid)."""
    arr = a.numpy()
    idx = np.arange(size) % arr.shape[axis]
    return Tensor._from_numpy(np.ascontiguousarray(np.take(arr, idx, axis=axis)))


def _other_size(s: int) -> int:
    return s - 1 if s >= 3 else s + 1


def symbolic_graph(model, args, input_names, dynamic_axes):
    """Trace ``model`` and mark what follows the dynamic axes. Returns (graph, tensors,
    shapes: {Value: symbolic shape}, attrs: {Node: attrs with Syms}, axes: {dim name:
    (input name, axis)}).

    >>> import tessera
    >>> g, _, shapes, _, axes = symbolic_graph(tessera.nn.Linear(3, 2), tessera.ones(4, 3),
    ...                                        None, {"input0": {0: "n"}})
    >>> shapes[g.outputs[0]], axes
    ((n, 2), {'n': ('input0', 0)})
    """
    args = _as_tuple(args)
    g, tensors = trace_model(model, args, input_names)
    spec = _axes_spec(dynamic_axes, [v.name for v in g.inputs])
    axes, base = _dynamic_dims(g, spec)
    shapes = {v: v.shape for v in _values(g)}
    attrs = {n: n.attrs for n in g.nodes}
    if not axes:
        return g, tensors, shapes, attrs, axes
    alts = {d: _other_size(size) for d, size in base.items()}
    solver = _Solver(base, alts)
    others = {d: _retrace(model, args, input_names, g, spec, {d: alts[d]}) for d in base}
    shapes.update(_fit_shapes(g, others, solver))
    attrs.update(_fit_attrs(g, others, solver))
    if len(base) > 1:  # check the monomials against a trace with every axis changed
        _check_monomials(g, _retrace(model, args, input_names, g, spec, alts), solver, shapes,
                         alts)
    return g, tensors, shapes, attrs, axes


def _dynamic_dims(g: Graph, spec: dict) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """({dim name: (input name, axis)} of its first input, {dim name: its example size})."""
    axes: dict[str, tuple[str, int]] = {}
    base: dict[str, int] = {}
    for v in g.inputs:
        for axis, dim in spec.get(v.name, {}).items():
            if axis < -len(v.shape) or axis >= len(v.shape):
                raise ExportError(f"onnx.export: dynamic axis {axis} of input '{v.name}' is "
                                  f"out of range for its shape {list(v.shape)}")
            axis %= len(v.shape)
            size = v.shape[axis]
            if dim in base and base[dim] != size:
                raise ExportError(f"onnx.export: dynamic axis '{dim}' has size {base[dim]} and "
                                  f"{size} in the example inputs")
            base[dim] = size
            axes.setdefault(dim, (v.name, axis))
    return axes, base


# ---- retracing at other sizes ------------------------------------------------------------

def _retrace(model, args: tuple, input_names, g: Graph, spec: dict,
             sizes: dict[str, int]) -> Graph:
    """``model`` traced again with the dynamic axes in ``sizes`` resized; it must give the
    same ops as ``g``."""
    new = []
    for a, v in zip(args, g.inputs):
        for axis, dim in spec.get(v.name, {}).items():
            axis %= len(v.shape)
            if dim in sizes:
                a = _resize(a, axis, sizes[dim])
        new.append(a)
    g2, _ = trace_model(model, new, input_names)
    if [n.op.name for n in g2.nodes] != [n.op.name for n in g.nodes]:
        raise ExportError("onnx.export: the traced graph changes with the sizes of the "
                          "dynamic axes (Python control flow on shapes); export with "
                          "static shapes instead")
    return g2


# ---- fitting symbolic dims -----------------------------------------------------------------

def _fit_shapes(g: Graph, others: dict[str, Graph], solver: _Solver) -> dict:
    """The symbolic shape of every value of ``g``, from its shapes in the retraces
    ``others`` (one per dynamic axis)."""
    values = {d: _values(o) for d, o in others.items()}
    shapes = {}
    for k, v in enumerate(_values(g)):
        per = {d: vs[k].shape for d, vs in values.items()}
        shapes[v] = tuple(solver.dim(x, {d: s[i] for d, s in per.items()},
                                     f"a dimension of %{v.name}")
                          for i, x in enumerate(v.shape))
    return shapes


def _fit_attrs(g: Graph, others: dict[str, Graph], solver: _Solver) -> dict:
    """The attributes (with ``Sym``s) of the nodes of ``g`` whose attributes change in the
    retraces; a Python number input that changes is an error."""
    attrs = {}
    for k, n in enumerate(g.nodes):
        per = {d: o.nodes[k] for d, o in others.items()}
        what = f"op '{n.op.name}' at '{n.name or '<top>'}'"
        if any(n2.attrs != n.attrs for n2 in per.values()):
            attrs[n] = _sym_attrs(n.attrs, {d: p.attrs for d, p in per.items()}, solver, what)
        for i, x in enumerate(n.inputs):
            if not isinstance(x, Value) and any(p.inputs[i] != x for p in per.values()):
                raise ExportError(f"onnx.export: a Python number passed to {what} depends on "
                                  "the dynamic axes")
    return attrs


def _check_monomials(g: Graph, both: Graph, solver: _Solver, shapes: dict,
                     sizes: dict[str, int]) -> None:
    """The symbolic shapes evaluated at ``sizes`` are the shapes of ``both``, the trace
    with every dynamic axis at those sizes."""
    for v, w in zip(_values(g), _values(both)):
        want = tuple(solver.value(s, sizes) for s in shapes[v])
        if want != w.shape:
            raise ExportError(f"onnx.export: a dimension of %{v.name} is not a product "
                              f"of the dynamic axes ({shapes[v]}, got {w.shape})")


def _values(g: Graph) -> list[Value]:
    out = list(g.inputs)
    for n in g.nodes:
        out.extend(n.outputs)
    return out


class _Solver:
    """Which monomial of the dynamic axes an integer is, from its values in the traces."""

    def __init__(self, base: dict[str, int], alts: dict[str, int]):
        self.base, self.alts = base, alts

    def dim(self, x0, others: dict[str, Any], what: str):
        if all(o == x0 for o in others.values()):
            return x0
        if not isinstance(x0, int) or isinstance(x0, bool) or x0 == 0:
            raise ExportError(f"onnx.export: {what} depends on the dynamic axes in a way "
                              "ONNX export cannot express")
        powers = []
        denom = Fraction(1)
        for d, x1 in others.items():
            if x1 == x0:
                continue
            ratio = Fraction(x1, x0)
            step = Fraction(self.alts[d], self.base[d])
            for p in range(1, 5):
                if step ** p == ratio:
                    powers.append((d, p))
                    denom *= self.base[d] ** p
                    break
            else:
                raise ExportError(f"onnx.export: {what} ({x0}, or {x1} when '{d}' is "
                                  f"{self.alts[d]}) is not a product of the dynamic axes")
        coef = Fraction(x0) / denom
        if coef.denominator != 1:
            raise ExportError(f"onnx.export: {what} is a fraction of the dynamic axes")
        return Sym(int(coef), tuple(powers))

    def value(self, s, sizes: dict[str, int]) -> int:
        if not isinstance(s, Sym):
            return s
        return s.coef * math.prod(sizes[n] ** p for n, p in s.powers)


def _sym_attrs(a0, others: dict, solver: _Solver, what: str):
    """``a0`` with every int that differs in ``others`` replaced by its ``Sym``."""
    if isinstance(a0, dict):
        return {k: _sym_attrs(v, {d: o[k] for d, o in others.items()}, solver, what)
                for k, v in a0.items()}
    if isinstance(a0, (tuple, list)):
        return type(a0)(_sym_attrs(v, {d: o[i] for d, o in others.items()}, solver, what)
                        for i, v in enumerate(a0))
    if isinstance(a0, slice):
        parts = [_sym_attrs(getattr(a0, f), {d: getattr(o, f) for d, o in others.items()},
                            solver, what) for f in ("start", "stop", "step")]
        return slice(*parts)
    if all(o == a0 for o in others.values()):
        return a0
    return solver.dim(a0, others, f"an attribute of {what}")
