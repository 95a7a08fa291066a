"""Tracing: run Python code on symbolic tensors and record every ``dispatch`` as an IR node.

A ``Tracer`` is a dispatch mode (``tessera._dispatch.push_mode``): while it is active, each
op call goes through the same ``infer`` rule as in eager mode, appends a ``Node`` to the
graph, and returns Tensors whose data is a ``Symbol`` naming the IR value. Autograd records
as usual, so ``loss.backward()`` inside a trace runs the ops' ``grad`` rules on symbolic
tensors and the backward pass lands in the same graph. Concrete tensors met on the way
(parameters, buffers, optimizer state, captured constants) become named variables; an
in-place op on one rebinds its current value, and the trace ends with ``assigns``.

A global tensor (``tessera.distributed``) is traced as its tile: its ``GlobalData`` holds a
``Symbol`` for this rank's tile (None on ranks outside its placement), ops on it go through
the SBP dispatch of eager mode, and boxing lands in the graph as collective nodes
(``tessera.distributed.graph_ops``), so each rank records its own local program.

>>> import tessera
>>> from tessera.graph.trace import trace
>>> g, out = trace(lambda x: (x * 2).relu(), tessera.ones(3))
>>> [n.op.name for n in g.nodes]
['mul', 'relu']
"""
from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import NamedTuple

from tessera._dispatch import (
    _finish,
    _infer,
    inplace_begin,
    inplace_end,
    pop_mode,
    push_mode,
    saves_old_self,
)
from tessera._tensor import Tensor
from tessera.autograd.engine import BACKWARD_SCOPES
from tessera.autograd.grad_mode import STATE
from tessera.graph.ir import Graph, Value
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["Symbol", "Tracer", "trace", "GraphTraceError", "is_symbolic", "is_tracing",
           "value_of", "current_tracer"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _static(op, outs) -> None:
    """A graph holds static shapes: an op whose output size depends on the data (``infer``
    gives -1, as for ``nonzero``; ``one_hot`` only without ``num_classes``) cannot be
    traced."""
    if op.dynamic_shape and any(s < 0 for m in outs for s in m.shape):
        raise GraphTraceError(f"nn.Graph: '{op.name}' has an output shape that depends "
                              f"on the data, which a static graph cannot hold; at "
                              f"{_user_frame()}")


class GraphTraceError(RuntimeError):
    """Something in ``build()`` cannot be captured in a static graph."""


def _user_frame() -> str:
    """'file:line' of the innermost frame outside the tessera package."""
    for fr in reversed(traceback.extract_stack()[:-1]):
        if not os.path.abspath(fr.filename).startswith(_PKG):
            return f"{fr.filename}:{fr.lineno} ({fr.line})"
    return "<unknown>"


def _data_dependent(what: str):
    raise GraphTraceError(
        f"nn.Graph: {what} needs a tensor's value, which is unknown while build() is traced "
        f"(data-dependent Python control flow, .item(), .numpy() and printing values are not "
        f"supported in a graph); at {_user_frame()}")


class Symbol:
    """The data of a symbolic tensor: which IR value it is. Anything that would read real
    data raises ``GraphTraceError`` naming the user's line."""

    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value

    @property
    def shape(self) -> tuple:
        return self.value.shape  # known statically (SBP dispatch checks tile shapes)

    # Layout: a symbolic tensor is contiguous. The graph is functional (writes through
    # views become ``view_assign``), so the executor may copy where eager mode would view.
    @property
    def itemsize(self) -> int:
        return self.value.dtype.itemsize

    @property
    def strides(self) -> tuple:
        out, acc = [], self.value.dtype.itemsize
        for s in reversed(self.value.shape):
            out.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(out))

    def __getattr__(self, name):
        _data_dependent(f"reading the array's '{name}'")

    def __array__(self, *a, **k):
        _data_dependent("converting to a NumPy array")

    def __bool__(self):
        _data_dependent("bool()")

    def __float__(self):
        _data_dependent("float()")

    def __int__(self):
        _data_dependent("int()")

    def __index__(self):
        _data_dependent("using a tensor as an index")

    def __getitem__(self, key):
        _data_dependent("indexing the array")

    def __len__(self):
        _data_dependent("len() of the array")

    def __iter__(self):
        _data_dependent("iterating over the array")

    def __repr__(self):
        return f"Symbol(%{self.value.name})"


_ACTIVE: list = []  # the tracers currently tracing (innermost last)


def is_tracing() -> bool:
    """Whether an ``nn.Graph`` trace is running (then even concrete tensors are graph
    variables whose values change between steps, so Python must not read them)."""
    return bool(_ACTIVE)


def current_tracer():
    """The innermost active tracer (None when not tracing)."""
    return _ACTIVE[-1] if _ACTIVE else None


def _is_global(t: Tensor) -> bool:
    return t._device.type == "global"


class GlobalHooks(NamedTuple):
    """What tracing a global tensor needs of ``tessera.distributed`` (which registers it:
    the distributed layer sits above the graph): this process's rank, the ``GlobalData``
    type, the SBP dispatch ``run(op, args, metas, attrs, outs)`` and ``to_global``."""

    rank: Callable[[], int]
    global_data: type
    run: Callable
    to_global: Callable


_GLOBAL: list[GlobalHooks] = []


def register_global(hooks: GlobalHooks) -> None:
    """Called by ``tessera.distributed`` on import."""
    _GLOBAL[:] = [hooks]


def is_symbolic(t) -> bool:
    """A traced tensor: its data (a global tensor: its tile) is a ``Symbol``."""
    if not isinstance(t, Tensor):
        return False
    data = t._data
    return type(data) is Symbol or (_is_global(t) and type(data.local) is Symbol)


def value_of(t: Tensor) -> Value:
    data = t._data
    return data.value if type(data) is Symbol else data.local.value


class Tracer:
    """The dispatch mode that builds ``graph``. ``names`` maps ``id(tensor)`` of known
    persistent tensors to variable names (module paths)."""

    def __init__(self, graph: Graph, names: dict[int, str] | None = None):
        self.graph = graph
        self.names = dict(names or {})
        self.current: dict[int, Value] = {}    # id(concrete tensor) -> its current value
        self.initial: dict[int, Value] = {}    # id(concrete tensor) -> its variable
        self.tensors: dict[int, Tensor] = {}   # id -> the concrete tensor (kept alive)
        self.scope: list[str] = []
        self.node_scope: dict[int, str] = {}  # id(autograd node) -> forward module path
        self._consts = 0
        self.comm_seq = 0    # collectives recorded so far (numbers them: see graph_ops)
        self.moves = 0       # placement changes traced (every rank counts each: p2p tags)
        self.effects: list[Value] = []  # values the step must compute though unread (sends)
        self.stage = None    # (micro-batch, "F" | "B") of the nodes being recorded, or None

    # ---- values of tensors ---------------------------------------------------------
    def value(self, t: Tensor) -> Value:
        data = t._data
        if type(data) is Symbol:
            return data.value
        if _is_global(t) and type(data.local) is Symbol:
            return data.local.value
        key = id(t)
        v = self.current.get(key)
        if v is None:
            v = self._variable(t)
        return v

    def _variable(self, t: Tensor) -> Value:
        if t._data is None:
            raise GraphTraceError(f"nn.Graph: a tensor on the '{t.device}' device cannot be "
                                  f"captured in a graph; at {_user_frame()}")
        shape = t._shape
        if _is_global(t):  # the variable is this rank's tile
            if t._data.local is None:
                raise GraphTraceError(f"nn.Graph: rank {_GLOBAL[0].rank()} reads a global tensor "
                                      f"on {t._data.placement}, which leaves it out; at "
                                      f"{_user_frame()}")
            shape = tuple(t._data.local.shape)
        name = self.names.get(id(t))
        if name is None:
            name = f"_const{self._consts}"
            self._consts += 1
        v = self.graph.add_variable(name, shape, t._dtype)
        self.current[id(t)] = self.initial[id(t)] = v
        self.tensors[id(t)] = t
        return v

    def symbolic(self, v: Value, like: Tensor | None = None) -> Tensor:
        """A new symbolic tensor for ``v`` (a graph input, typically)."""
        from tessera._tensor import _CPU
        return Tensor._make(Symbol(v), v.dtype, like._device if like is not None else _CPU,
                            v.shape)

    def traced_data(self, t: Tensor):
        """``t``'s data as traced values: a Symbol, or for a global tensor a GlobalData whose
        tile is a Symbol (None on ranks outside its placement)."""
        if not _is_global(t):
            return Symbol(self.value(t))
        d = t._data
        if d.local is None or type(d.local) is Symbol:
            return d
        return _GLOBAL[0].global_data(Symbol(self.value(t)), d.placement, d.sbp, d.shape, d.dtype)

    def _rebind(self, t: Tensor, v: Value) -> None:
        if type(t._data) is Symbol:
            t._data = Symbol(v)
        elif _is_global(t) and type(t._data.local) is Symbol:
            d = t._data
            t._data = type(d)(Symbol(v), d.placement, d.sbp, d.shape, d.dtype)
        else:
            self.value(t)  # make sure it is a variable first
            self.current[id(t)] = v

    # ---- the dispatch mode ---------------------------------------------------------
    def dispatch(self, op, args, attrs):
        for a in args:
            if isinstance(a, Tensor) and a._device.type == "global":
                return self._dispatch_global(op, args, attrs)
        if getattr(attrs.get("device"), "type", None) == "global":
            return self._dispatch_global(op, args, attrs)
        dev = None
        grad = scalars = False
        metas, inputs = [], []
        for a in args:
            if isinstance(a, Tensor):
                if dev is None:
                    dev = a._device
                metas.append(Meta(a._shape, a._dtype))
                inputs.append(self.value(a))
                if a._requires_grad:
                    grad = True
            else:
                metas.append(a)
                inputs.append(a)
                scalars = scalars or a is not None
        if dev is None:
            from tessera._tensor import _CPU
            dev = _CPU
        for k, v in attrs.items():
            if isinstance(v, Tensor):
                raise GraphTraceError(f"nn.Graph: '{op.name}' got a tensor as its attribute "
                                      f"'{k}', which a graph cannot hold; at {_user_frame()}")
        out = _infer(op, metas, attrs, scalars)
        outs = out if type(out) is tuple else (out,)
        _static(op, outs)
        scope = ".".join(self.scope)
        values = self.graph.add_node(op, inputs, attrs, [(m.shape, m.dtype) for m in outs],
                                     name=scope)
        if self.stage is not None:  # the pipeline schedule orders nodes by micro-batch
            values[0].producer.notes["micro_batch"] = self.stage
        res = _finish(op, args, attrs, metas, out, [Symbol(v) for v in values], dev, grad)
        return self._scoped(res, scope)

    def _scoped(self, res, scope: str):
        first = res[0] if type(res) is tuple else res
        if first is not None and first.grad_fn is not None and scope:
            self.node_scope[id(first.grad_fn)] = scope
        return res

    def _dispatch_global(self, op, args, attrs):
        """An op with a global input: eager mode's SBP dispatch on traced tiles (its
        boxing and local ops come back here as nodes); autograd on the global tensors."""
        run = _GLOBAL[0].run
        dev = attrs.get("device") if not any(isinstance(a, Tensor) for a in args) else None
        grad = scalars = False
        metas, traced = [], []
        for a in args:
            if isinstance(a, Tensor):
                if dev is None and _is_global(a):
                    dev = a._device
                metas.append(Meta(a._shape, a._dtype))
                traced.append(Tensor._make(self.traced_data(a), a._dtype, a._device,
                                           a._shape))
                grad = grad or a._requires_grad
            else:
                metas.append(a)
                traced.append(a)
                scalars = scalars or a is not None
        out = _infer(op, metas, attrs, scalars)
        outs = out if type(out) is tuple else (out,)
        _static(op, outs)
        datas = run(op, tuple(traced), metas, attrs, outs)
        res = _finish(op, args, attrs, metas, out, datas, dev, grad)
        return self._scoped(res, ".".join(self.scope))

    # ---- backward scopes (called by the autograd engine) ----------------------------
    def begin(self, node):
        if self.stage is not None:
            self.stage = (self.stage[0], "B")
        prev = self.scope
        path = self.node_scope.get(id(node))
        self.scope = [f"{path}.grad"] if path else []
        return prev

    def end(self, prev) -> None:
        self.scope = prev

    def dispatch_inplace(self, op, target, args, attrs):
        """``target`` takes the op's result as its new value (functionally: a new SSA value
        rebinds the tensor; a view's base is rebound through ``view_assign``)."""
        record = inplace_begin(op, target, args)
        if saves_old_self(op, target, args, record):
            # the old value stays valid (values are immutable): a fresh alias keeps it
            args = (self._alias(target),) + tuple(args[1:])
        return inplace_end(op, target, self.dispatch(op, args, attrs), record, self._write)

    def _alias(self, t: Tensor) -> Tensor:
        a = Tensor._make(self.traced_data(t), t._dtype, t._device, t._shape)
        a.grad_fn, a._output_nr, a._requires_grad = t.grad_fn, t._output_nr, t._requires_grad
        if t.grad_fn is None and t._requires_grad:
            a._grad_acc = t._grad_acc
        return a

    def _write(self, target: Tensor, out: Tensor) -> None:
        if _is_global(target):
            self._write_global(target, out)
            return
        base = target._base
        if base is not None:
            prev = STATE.enabled
            STATE.enabled = False  # values only; autograd of the write is _rebase_view's
            try:
                new_base = self.dispatch(REGISTRY["view_assign"],
                                         (self._alias(base), out), {"chain":
                                                                    target._view_chain})
            finally:
                STATE.enabled = prev
            self._rebind(base, self.value(new_base))
        self._rebind(target, self.value(out))

    def _write_global(self, target: Tensor, out: Tensor) -> None:
        """As eager ``copy_into``: the result is boxed into the target's placement and SBP."""
        to_global = _GLOBAL[0].to_global
        if target._base is not None:
            raise GraphTraceError("nn.Graph: an in-place write into a view of a global tensor "
                                  f"cannot be traced yet; at {_user_frame()}")
        d = target._data
        prev = STATE.enabled
        STATE.enabled = False
        try:
            out = to_global(out, d.placement, d.sbp)
        finally:
            STATE.enabled = prev
        if d.local is not None:  # (ranks outside the placement hold nothing to write)
            self._rebind(target, self.value(out))

    # ---- scopes --------------------------------------------------------------------
    def push_scope(self, name: str) -> None:
        self.scope.append(name)

    def pop_scope(self) -> None:
        self.scope.pop()

    def __enter__(self):
        push_mode(self)
        _ACTIVE.append(self)
        BACKWARD_SCOPES.append(self)
        return self

    def __exit__(self, *exc):
        BACKWARD_SCOPES.pop()
        _ACTIVE.pop()
        pop_mode()
        return False

    def updated(self) -> list[tuple[str, Value]]:
        """(variable name, new value) of every concrete tensor the trace wrote."""
        return [(self.initial[k].name, v) for k, v in self.current.items()
                if v is not self.initial[k]]


def trace(fn, *inputs: Tensor, names: dict[int, str] | None = None):
    """Trace ``fn(*inputs)`` into a Graph; returns (graph, symbolic output(s))."""
    g = Graph()
    tracer = Tracer(g, names)
    syms = []
    for i, x in enumerate(inputs):
        v = g.add_input(f"input{i}", x._shape, x._dtype)
        s = tracer.symbolic(v, x)
        s._requires_grad = x._requires_grad
        syms.append(s)
    with tracer:
        out = fn(*syms)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    g.outputs = [tracer.value(o) for o in outs]
    g.assigns = tracer.updated()
    return g, out
