"""Autograd graph nodes. A ``Node`` is one recorded op; it is also the ``ctx`` its op's grad
rule receives, so a grad rule reads ``ctx.inputs``, ``ctx.outputs``, ``ctx.attrs`` and
``ctx.needs_input_grad``.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

_seq = itertools.count()
# callables told of each node as it is made, and after it saved what backward needs
# (activation checkpointing's log and early stop; the C fast path, which makes nodes
# without them, is off while any is installed)
WATCHERS: list = []
SAVED: list = []

FREED_MSG = ("Trying to backward through the graph a second time (or directly access saved "
             "tensors after they have already been freed). Saved intermediate values of the "
             "graph are freed when you call .backward() or autograd.grad(). Specify "
             "retain_graph=True if you need to backward through the graph a second time or if "
             "you need to access saved tensors after calling backward.")


class _Freed:
    pass


FREED = _Freed()
_NO_VERSION = (None,)
_TENSOR: list = []   # the Tensor class, registered by tessera._tensor (which sits above)


class Deferred:
    """Saved values a node does not hold now (activation checkpointing, DTR): the first
    read of ``ctx.inputs`` or ``ctx.outputs`` calls ``restore(node)``, which puts the saved
    tuples back into the node (``_saved_inputs``, ``_saved_outputs``, ``_versions``)."""

    __slots__ = ()

    def restore(self, node: Node) -> None:
        raise NotImplementedError


def set_tensor_type(cls) -> None:
    """Register the class saved outputs are rebuilt as (``tessera.Tensor``)."""
    _TENSOR[:] = [cls]


class Node:
    """One op in the backward graph (PyTorch's ``grad_fn``)."""

    __slots__ = ("op", "attrs", "next_functions", "needs_input_grad", "input_metas",
                 "output_metas", "_saved_inputs", "_saved_outputs", "_versions", "seq",
                 "_pre_hooks", "_hooks", "_retained", "__weakref__")

    def __init__(self, op, attrs, next_functions, input_metas, output_metas, needs=None):
        self.op = op
        self.attrs = attrs
        self.next_functions = next_functions
        self.needs_input_grad = needs if needs is not None else \
            tuple(e is not None for e in next_functions)
        self.input_metas = input_metas
        self.output_metas = output_metas
        self._saved_inputs = None
        self._saved_outputs = None
        self._versions = None
        self.seq = next(_seq)
        if WATCHERS:
            for w in WATCHERS:
                w(self)
        self._pre_hooks = None   # {output_nr: [hook]} from Tensor.register_hook on outputs
        self._hooks = None       # node hooks (register_hook on the grad_fn itself)
        self._retained = None    # {output_nr: weakref(tensor)} for retain_grad()

    def name(self) -> str:
        custom = getattr(self.op, "node_name", None)
        return custom or f"{_camel(self.op.name)}Backward0"

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    # --- what grad rules read -----------------------------------------------------------
    @property
    def inputs(self) -> tuple:
        saved = self._saved_inputs
        if saved is None:
            raise RuntimeError(f"op '{self.op.name}' did not save its inputs for backward "
                               "(its OpDef's save rule leaves them out)")
        if saved is FREED:
            raise RuntimeError(FREED_MSG)
        if type(saved) is not tuple:
            saved = self._restored("_saved_inputs")
        self._check_versions(saved, 0)
        return saved

    @property
    def outputs(self) -> tuple:
        saved = self._saved_outputs
        if saved is None:
            raise RuntimeError(f"op '{self.op.name}' did not save its outputs for backward")
        if saved is FREED:
            raise RuntimeError(FREED_MSG)
        if not isinstance(saved, tuple):
            saved = self._restored("_saved_outputs")
        Tensor = _TENSOR[0]
        n_in = len(self._saved_inputs) if isinstance(self._saved_inputs, tuple) else 0
        outs: list = []
        for i, (data, meta, version) in enumerate(saved):
            if data is None:
                outs.append(None)
                continue
            t = Tensor._make(data, meta.dtype, version[1], meta.shape)
            t._version = version[0]
            t.grad_fn, t._output_nr, t._requires_grad = self, i, True
            outs.append(t)
        self._check_versions(outs, n_in)
        return tuple(outs)

    def _restored(self, slot: str):
        """The saved tuple in ``slot`` after its ``Deferred`` holder put it back."""
        saved = getattr(self, slot)
        if isinstance(saved, Deferred):
            saved.restore(self)
            saved = getattr(self, slot)
        if saved is FREED:
            raise RuntimeError(FREED_MSG)
        return saved

    def _check_versions(self, tensors, offset: int) -> None:
        versions = self._versions
        if versions is None:
            return
        Tensor = _TENSOR[0]
        for i, t in enumerate(tensors):
            if isinstance(t, Tensor):
                expected = versions[offset + i]
                if expected is not None and t._version[0] != expected:
                    kind = f"output {t._output_nr} of {t.grad_fn.name()}" if t.grad_fn \
                        else "a leaf"
                    raise RuntimeError(
                        "one of the variables needed for gradient computation has been "
                        f"modified by an inplace operation: [{t.dtype} {list(t.shape)}], "
                        f"which is {kind}, is at version {t._version[0]}; expected version "
                        f"{expected} instead.")

    def save(self, inputs, outputs) -> None:
        versions = []
        if inputs is not None:
            self._saved_inputs = inputs
            # a Tensor has a version counter; scalars and None have not
            versions += [getattr(a, "_version", _NO_VERSION)[0] for a in inputs]
        if outputs is not None:
            saved = []
            for t in outputs:
                saved.append((t._data, t.meta(), (t._version, t._device)))
                versions.append(t._version[0])
            self._saved_outputs = tuple(saved)
        self._versions = versions
        if SAVED:
            for w in SAVED:
                w(self)

    def release(self) -> None:
        if self._saved_inputs is not None:
            self._saved_inputs = FREED
        if self._saved_outputs is not None:
            self._saved_outputs = FREED

    def apply(self, grads: tuple) -> tuple:
        return self.op.grad(self, *grads)

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs)`` runs after this node; may return new inputs."""
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        return _Handle(self._hooks, fn)

    def add_pre_hook(self, output_nr: int, fn):
        if self._pre_hooks is None:
            self._pre_hooks = {}
        lst = self._pre_hooks.setdefault(output_nr, [])
        lst.append(fn)
        return _Handle(lst, fn)

    def retain(self, output_nr: int, tensor) -> None:
        if self._retained is None:
            self._retained = {}
        self._retained[output_nr] = weakref.ref(tensor)


class AccumulateGrad:
    """The sink of a leaf tensor: adds the incoming gradient into ``variable.grad``."""

    __slots__ = ("variable", "seq", "next_functions", "_pre_hooks", "_hooks", "_retained",
                 "__weakref__")

    def __init__(self, variable):
        self.variable = variable
        self.seq = next(_seq)
        self.next_functions = ()
        self._pre_hooks = None
        self._hooks = None
        self._retained = None

    def name(self) -> str:
        return "AccumulateGrad"

    def __repr__(self) -> str:
        return f"<AccumulateGrad object at {id(self):#x}>"

    def accumulate(self, grad) -> None:
        var = self.variable
        for hook in var._hooks or ():
            new = hook(grad)
            if new is not None:
                grad = new
        if var._grad is None:
            # Always own the buffer: grad rules may hand the same tensor to several inputs,
            # or a broadcast view, and optimizers later update .grad in place. A taker
            # (DDP with gradient_as_bucket_view) may store it in memory it owns instead, so
            # the gradient is not copied twice; it returns the new .grad, or None to decline
            take = None if grad.requires_grad else var.__dict__.get("_grad_taker")
            owned = None if take is None else take(var, grad)
            if owned is None:
                owned = grad if grad.requires_grad else _owned_like(grad, var)
            var._grad = owned
        elif grad.requires_grad:
            var._grad = var._grad + grad  # create_graph: keep the sum differentiable
        else:
            g = var._grad
            if not g.requires_grad and g._base is None and g._shape == grad._shape and \
                    g._dtype is grad._dtype and type(g._data) is np.ndarray and \
                    type(grad._data) is np.ndarray:
                # in place, as PyTorch accumulates into an owned .grad
                np.add(g._data, grad._data, out=g._data)
                g._version[0] += 1
            else:
                from tessera.autograd.grad_mode import no_grad
                with no_grad():
                    if not g.requires_grad and g._base is None and \
                            g._shape == grad._shape and g._dtype is grad._dtype:
                        g.add_(grad)
                    else:
                        var._grad = g + grad
        for hook in getattr(var, "_post_accumulate_hooks", None) or ():
            hook(var)


def _owned_like(grad, var):
    """A copy of ``grad`` laid out like the dense ``var`` (PyTorch's gradient layout
    contract): the optimizer's in-place updates then walk both in the same memory order."""
    g, v = grad._data, var._data
    if type(g) is np.ndarray and type(v) is np.ndarray and g.strides != v.strides and \
            g.shape == v.shape and g.dtype == v.dtype and \
            (v.flags.c_contiguous or v.flags.f_contiguous):
        out = np.empty_like(v)
        np.copyto(out, g)
        t = grad.detach()
        t._data, t._version = out, [0]
        return t
    return grad.detach().clone()


class _Handle:
    """Returned by register_hook; ``remove()`` unregisters."""

    def __init__(self, lst, fn):
        self._lst, self._fn = lst, fn

    def remove(self) -> None:
        if self._fn in self._lst:
            self._lst.remove(self._fn)


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))
