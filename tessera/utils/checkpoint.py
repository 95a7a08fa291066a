"""Activation checkpointing at PyTorch's path (``torch.utils.checkpoint``): run a block
without keeping what its backward needs, and recompute it when backward gets there.

Two variants, as in PyTorch:

* non-reentrant (``use_reentrant=False``, recommended): the block runs with grad mode on, so
  autograd records its nodes as usual; then the values those nodes saved are dropped and
  each node holds a ``Deferred`` instead (``tessera.autograd.graph``). The first backward
  read of one of them reruns the block (same RNG state, so dropout draws the same mask),
  and the recomputed nodes' saved values move into the original nodes, matched in creation
  order. ``autograd.grad``, keyword arguments and nested checkpoints work; under
  ``nn.Graph`` the rerun is traced into the backward as nodes named ``<path>.remat``.
* reentrant (``use_reentrant=True``): a ``Function`` that runs the block under ``no_grad``
  and, in its backward, reruns it with grad on and calls ``backward`` on the rerun's
  outputs (gradients reach parameters by accumulation, so ``autograd.grad`` is refused).

>>> import tessera
>>> from tessera.utils.checkpoint import checkpoint
>>> lin = tessera.nn.Linear(3, 3)
>>> x = tessera.ones(2, 3, requires_grad=True)
>>> y = checkpoint(lambda t: lin(t).relu() * 2, x, use_reentrant=False)
>>> y.sum().backward(); x.grad.shape
tessera.Size([2, 3])
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from tessera._tensor import Tensor
from tessera.autograd import engine, graph as _ag
from tessera.autograd.function import Function
from tessera.autograd.grad_mode import STATE, enable_grad, no_grad
from tessera.ops import random as _random

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError", "noop_context_fn",
           "set_checkpoint_early_stop", "set_checkpoint_debug_enabled"]

_DEFAULT_DETERMINISM_MODE = "default"
_DETERMINISM_CHECKS = ("default", "none")


class CheckpointError(RuntimeError):
    """The recomputation saved different tensors than the original forward."""


_EARLY_STOP: list = [None]   # set_checkpoint_early_stop's override (None: the argument's)
_DEBUG: list = [None]        # set_checkpoint_debug_enabled's override

_DEBUG_TIP = (
    "\nTip: To see a more detailed error message, either pass `debug=True` to\n"
    "`tessera.utils.checkpoint.checkpoint(...)` or wrap the code block\n"
    "with `with tessera.utils.checkpoint.set_checkpoint_debug_enabled(True):` to\n"
    "enable checkpoint-debug mode globally.\n")


class _StopRecomputation(Exception):
    """Raised through the block's rerun once every node it must remake is made."""


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool):
    """Within the block, whether non-reentrant checkpoints stop recomputing once every
    saved value is made again (overrides ``early_stop``), as PyTorch's.

    >>> with set_checkpoint_early_stop(False):
    ...     pass
    """
    prev = _EARLY_STOP[0]
    _EARLY_STOP[0] = enable
    try:
        yield
    finally:
        _EARLY_STOP[0] = prev


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled: bool | None):
    """Within the block, whether checkpoint errors log the ops of the forward and the
    recomputation (overrides ``debug``; None: the argument's), as PyTorch's.

    >>> with set_checkpoint_debug_enabled(True):
    ...     pass
    """
    prev = _DEBUG[0]
    _DEBUG[0] = enabled
    try:
        yield
    finally:
        _DEBUG[0] = prev


def noop_context_fn():
    """The default ``context_fn``: no context around the forward or the recomputation.

    >>> noop_context_fn()[0].__class__.__name__
    'nullcontext'
    """
    return contextlib.nullcontext(), contextlib.nullcontext()


_REENTRANT_WARNING = (
    "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
    "Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an "
    "exception. use_reentrant=False is recommended, but if you need to preserve the current "
    "default behavior, you can pass use_reentrant=True. Refer to docs for more details on "
    "the differences between the two variants.")

_SEQUENTIAL_WARNING = (
    "torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be "
    "passed explicitly. In version 2.9 we will raise an exception if use_reentrant is not "
    "passed. use_reentrant=False is recommended, but if you need to preserve the current "
    "default behavior, you can pass use_reentrant=True. Refer to docs for more details on "
    "the differences between the two variants.")


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None,
               context_fn: Callable = noop_context_fn,
               determinism_check: str = _DEFAULT_DETERMINISM_MODE, debug: bool = False,
               early_stop: bool = True, **kwargs):
    """``function(*args, **kwargs)`` whose intermediate values are recomputed in backward
    instead of kept (PyTorch's ``torch.utils.checkpoint.checkpoint``; ``preserve_rng_state``
    is a keyword argument, default True).

    >>> import tessera
    >>> x = tessera.tensor([1.0, 2.0], requires_grad=True)
    >>> checkpoint(lambda t: (t * t).exp(), x, use_reentrant=False).sum().backward()
    >>> [round(v, 3) for v in x.grad.tolist()]
    [5.437, 218.393]
    """
    if use_reentrant is None:
        warnings.warn(_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only supported when "
                             "use_reentrant=False.")
        return _Reentrant.apply(function, preserve, *args)
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(_DETERMINISM_CHECKS)}, "
                         f"but got {determinism_check}")
    debug = debug if _DEBUG[0] is None else _DEBUG[0]
    if debug and context_fn is not noop_context_fn:
        raise ValueError("debug=True is incompatible with non-default context_fn")
    early_stop = early_stop if _EARLY_STOP[0] is None else _EARLY_STOP[0]
    return _non_reentrant(function, preserve, context_fn, determinism_check, args, kwargs,
                          bool(debug), bool(early_stop))


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None,
                          **kwargs):
    """Run ``functions`` (an ``nn.Sequential`` or a list) in ``segments`` chunks, each but
    the last checkpointed (PyTorch's ``checkpoint_sequential``).

    >>> import tessera
    >>> seq = tessera.nn.Sequential(tessera.nn.Linear(2, 2), tessera.nn.Tanh(),
    ...                             tessera.nn.Linear(2, 1))
    >>> x = tessera.ones(3, 2, requires_grad=True)
    >>> checkpoint_sequential(seq, 2, x, use_reentrant=False).shape
    tessera.Size([3, 1])
    """
    if use_reentrant is None:
        warnings.warn(_SEQUENTIAL_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(arg for arg in kwargs))

    def run_function(start, end, functions):
        def forward(input):
            for j in range(start, end + 1):
                input = functions[j](input)
            return input
        return forward

    from tessera.nn import Sequential
    if isinstance(functions, Sequential):
        functions = list(functions.children())
    segment_size = len(functions) // segments
    end = -1
    for start in range(0, segment_size * (segments - 1), segment_size):
        end = start + segment_size - 1
        input = checkpoint(run_function(start, end, functions), input,
                           use_reentrant=use_reentrant, preserve_rng_state=preserve)
    return run_function(end + 1, len(functions) - 1, functions)(input)


# ---- non-reentrant: drop what the block's nodes saved, rerun on first read --------------

def _non_reentrant(function, preserve, context_fn, check, args, kwargs, debug=False,
                   early_stop=True):
    if not STATE.enabled:
        return function(*args, **kwargs)
    rng = _random.get_rng_state() if preserve else None
    forward_ctx, recompute_ctx = context_fn()
    tracer = _tracer()
    scope = list(tracer.scope) if tracer is not None else None
    log: list | None = [] if debug else None
    start = next(_ag._seq)
    with forward_ctx, _watching(log.append if log is not None else None):
        out = function(*args, **kwargs)
    nodes = _recorded_since(start, out)
    if nodes:
        group = _Recompute(function, args, kwargs, rng, recompute_ctx, check, nodes, scope)
        group.start, group.early_stop = start, early_stop
        group.log = None if log is None else [_op_line(n) for n in log]
        for n in nodes:
            group.defer(n)
    return out


def _tracer():
    from tessera.graph.trace import current_tracer
    return current_tracer()


def _tensors(out) -> list:
    """The tensors of a (nested tuple/list/dict) result."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def _recorded_since(start: int, out) -> list:
    """The autograd nodes created after ``start`` that ``out`` depends on, in creation
    order (a block's nodes; a rerun of the same block finds its nodes in the same order)."""
    seen: dict = {}
    stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    while stack:
        n = stack.pop()
        if type(n) is not _ag.Node or n.seq <= start or n in seen:
            continue
        seen[n] = None
        stack.extend(e[0] for e in n.next_functions if e is not None)
    return sorted(seen, key=lambda n: n.seq)


def _detached(a):
    if not isinstance(a, Tensor):
        return a
    d = a.detach()
    d.requires_grad_(a.requires_grad)
    return d


@contextlib.contextmanager
def _watching(made=None, saved=None):
    """Within the block, ``made`` told of each autograd node as it is made and ``saved``
    after each saved its values (None: not told); dispatch's C fast path, which makes
    nodes without telling, is off meanwhile."""
    if made is None and saved is None:
        yield
        return
    from tessera import _fastpath
    fast = _fastpath.MODULE.set_enabled(False) if _fastpath.MODULE is not None else None
    for lst, fn in ((_ag.WATCHERS, made), (_ag.SAVED, saved)):
        if fn is not None:
            lst.append(fn)
    try:
        yield
    finally:
        for lst, fn in ((_ag.WATCHERS, made), (_ag.SAVED, saved)):
            if fn is not None:
                lst.remove(fn)
        if fast is not None and _fastpath.MODULE is not None:
            _fastpath.MODULE.set_enabled(fast)


def _op_line(n) -> str:
    """A node's line in the debug log: its op and the shapes it was given."""
    shapes = ", ".join(str(list(m.shape)) if m is not None else "None"
                       for m in (n.input_metas or ()))
    return f"{n.op.name}({shapes})"


class _Recompute(_ag.Deferred):
    """What one checkpointed block's nodes saved, recomputed on first read."""

    __slots__ = ("function", "args", "kwargs", "rng", "ctx", "check", "nodes", "index",
                 "metas", "scope", "saving", "start", "early_stop", "log", "__weakref__")

    def __init__(self, function, args, kwargs, rng, ctx, check, nodes, scope):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.rng, self.ctx, self.check, self.scope = rng, ctx, check, scope
        # weak: the nodes hold this object, not the other way round
        self.nodes = [weakref.ref(n) for n in nodes]
        self.index = {id(n): k for k, n in enumerate(nodes)}
        self.metas = [_saved_metas(n) for n in nodes]
        # which nodes saved values (a nested checkpoint's nodes did, deferred)
        self.saving = [n._saved_inputs is not None or n._saved_outputs is not None
                       for n in nodes]
        self.start, self.early_stop, self.log = 0, False, None

    def defer(self, node) -> None:
        if node._saved_inputs is not None and node._saved_inputs is not _ag.FREED:
            node._saved_inputs = self
        if node._saved_outputs is not None and node._saved_outputs is not _ag.FREED:
            node._saved_outputs = self

    def rebind(self, old, new) -> None:
        """``new`` (an enclosing checkpoint's original node) takes ``old``'s place."""
        k = self.index.pop(id(old), None)
        if k is not None:
            self.nodes[k] = weakref.ref(new)
            self.index[id(new)] = k

    def restore(self, node) -> None:
        made: list = []
        fresh = self._rerun(made)
        if self.check == "default":
            try:
                self._compare(fresh)
            except CheckpointError as e:
                if self.log is None:
                    raise CheckpointError(f"{e}{_DEBUG_TIP}") from None
                raise CheckpointError(_debug_report(self.log, [_op_line(n) for n in made],
                                                    str(e))) from None
        for ref, new in zip(self.nodes, fresh):
            old = ref()
            if old is None or new is None:
                continue
            for slot in ("_saved_inputs", "_saved_outputs"):
                if getattr(old, slot) is self:
                    value = getattr(new, slot)
                    if isinstance(value, _Recompute):   # a nested checkpoint's deferral
                        value.rebind(new, old)
                    setattr(old, slot, value)
            old._versions = new._versions

    def _rerun(self, made: list) -> list:
        """The block run again (``made``: every node it makes); the nodes matching the
        original's, in order. With early stop the rerun ends once as many nodes saved
        values as in the original block (as PyTorch's, after its last save: the rest of
        the block does not run); the k-th of them stands for the original's k-th."""
        args = tuple(_detached(a) for a in self.args)
        tracer = _tracer()
        first = len(tracer.graph.nodes) if tracer is not None else 0
        prev_scope = tracer.scope if tracer is not None else None
        if tracer is not None and self.scope is not None:
            tracer.scope = list(self.scope)
        wanted = sum(self.saving)
        remade: list = []   # the nodes that saved values, in order

        def saved(n):
            remade.append(n)
            if len(remade) == wanted:
                raise _StopRecomputation

        start = next(_ag._seq)

        stopped = False
        with _fork_rng(self.rng), enable_grad(), self.ctx, \
                _watching(made.append, saved if self.early_stop else None):
            try:
                out = self.function(*args, **self.kwargs)
            except _StopRecomputation:
                stopped = True
            finally:
                if tracer is not None:
                    tracer.scope = prev_scope
        if tracer is not None:   # the rerun, traced: name it and keep CSE from merging it
            for n in tracer.graph.nodes[first:]:
                n.name = f"{n.name}.remat" if n.name else "remat"
                n.notes["remat"] = True
        if not stopped:
            return _recorded_since(start, out)
        it = iter(remade)   # the k-th node saving values stands for the original k-th
        return [next(it) if s else None for s in self.saving]

    def _compare(self, fresh: list) -> None:
        # (an early stop leaves None for nodes past the last that saved anything)
        made = sum(n is not None or not s for n, s in zip(fresh, self.saving))
        if len(fresh) != len(self.nodes) or made != len(self.nodes):
            raise CheckpointError(
                "torch.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.nodes)}\n"
                "Number of tensors saved during recomputation: "
                f"{len(fresh) if len(fresh) != len(self.nodes) else made}.")
        bad = [(k, m, _saved_metas(n)) for k, (m, n) in enumerate(zip(self.metas, fresh))
               if n is not None and m != _saved_metas(n)]
        if bad:
            lines = "".join(f"tensor at position {k}:\nsaved metadata: {m}\n"
                            f"recomputed metadata: {r}\n" for k, m, r in bad)
            raise CheckpointError(
                "torch.utils.checkpoint: Recomputed values for the following tensors have "
                f"different metadata than during the forward pass.\n{lines}.")


def _debug_report(forward: list, recompute: list, error: str) -> str:
    """PyTorch's debug report, with the op logs of the forward and the recomputation."""
    return (
        "An error happened while unpacking tensors; dumping logs of latest computation\n"
        "because you passed `debug=True` to `tessera.utils.checkpoint.checkpoint()`.\n\n"
        "Operations executed during the original forward:\n\n" + "\n".join(forward) +
        "\n\nOperations executed during recomputation:\n\n" + "\n".join(recompute) +
        "\n\n ERROR: Detected non-determinism while running activation checkpointing\n\n"
        " You are seeing this error because you passed `debug=True` to checkpoint and\n"
        " tensors to be saved during the original forward and differ between those saved\n"
        " during recomputation. This can happen if different operators were ran in the\n"
        " original forward and in the recomputation.\n\n" + error)


def _saved_metas(n) -> tuple:
    """(op, shapes and dtypes of what the node saved): the determinism check's key."""
    ins = n._saved_inputs
    ins_m = tuple((tuple(a.shape), a.dtype) if isinstance(a, Tensor) else None
                  for a in ins) if isinstance(ins, tuple) else ()
    outs = n._saved_outputs
    outs_m = tuple((tuple(m.shape), m.dtype) if m is not None else None
                   for _, m, _ in outs) if isinstance(outs, tuple) else ()
    return (n.op.name, ins_m, outs_m)


@contextlib.contextmanager
def _fork_rng(state):
    """Run with the generator at ``state`` (None: as it is), and put it back after."""
    if state is None:
        yield
        return
    outer = _random.get_rng_state()
    _random.set_rng_state(state)
    try:
        yield
    finally:
        _random.set_rng_state(outer)


# ---- reentrant: a Function whose backward reruns the block ------------------------------

class _Reentrant(Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be "
                          "None", UserWarning, stacklevel=2)
        ctx.run_function = run_function
        ctx.rng = _random.get_rng_state() if preserve_rng_state else None
        ctx.inputs = args
        with no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        if engine.TARGETED and engine.TARGETED[-1]:
            raise RuntimeError(
                "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() "
                "or passing an `inputs` parameter to .backward(). To resolve this error, you "
                "can either set use_reentrant=False, or call .backward() without passing the "
                "`inputs` argument.")
        inputs = tuple(_detached(a) for a in ctx.inputs)
        with _fork_rng(ctx.rng), enable_grad():
            outputs = ctx.run_function(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, Tensor) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is "
                               "not necessary")
        from tessera.autograd import backward
        backward([o for o, _ in pairs], [g for _, g in pairs])
        grads_in: list[Any] = [a.grad if isinstance(a, Tensor) else None for a in inputs]
        return (None, None, *grads_in)
