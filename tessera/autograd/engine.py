"""Reverse-mode autograd: walk the graph of ``Node``s from the outputs back to the leaves.

Each node runs once all gradients flowing into it have arrived (dependency counting), in
reverse creation order among the ready ones. Grad rules are ordinary tessera code: with
``create_graph=True`` they run with grad mode on and are recorded, so double backward works.

>>> import tessera
>>> x = tessera.tensor([2.0], requires_grad=True)
>>> (g,) = tessera.autograd.grad(x ** 3, x, create_graph=True)
>>> tessera.autograd.grad(g, x)[0]
tensor([12.])
"""
from __future__ import annotations

import heapq

import numpy as np

from tessera.autograd.grad_mode import STATE
from tessera.autograd.graph import AccumulateGrad, Node

# one entry per running backward: whether it computes gradients of given ``inputs`` only
# (``autograd.grad``, ``backward(inputs=...)``), which a reentrant checkpoint cannot honour
TARGETED: list[bool] = []


def _edge(t):
    if t.grad_fn is not None:
        return t.grad_fn, t._output_nr
    if t._requires_grad:
        return t._grad_accumulator(), 0
    return None


def _make_grads(outputs, grad_outputs):
    from tessera._tensor import Tensor
    grads = []
    for out, g in zip(outputs, grad_outputs):
        if g is None:
            if out.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if not out.dtype.is_floating_point and not out.dtype.is_complex:
                raise RuntimeError("grad can be implicitly created only for real scalar "
                                   f"outputs but got {out.dtype}")
            if type(out._data) is np.ndarray:  # eager CPU: no op needed for a constant
                g = Tensor._make(np.ones(out._shape, out._dtype.np), out._dtype, out._device,
                                 out._shape)
            else:
                from tessera.ops.creation import ones_like
                g = ones_like(out)
        elif not isinstance(g, Tensor):
            raise TypeError(f"gradient must be a Tensor or None, got {type(g).__name__}")
        elif tuple(g.shape) != tuple(out.shape):
            raise RuntimeError(f"Mismatch in shape: grad_output[0] has a shape of "
                               f"{g.shape} and output[0] has a shape of {out.shape}.")
        elif g.dtype is not out.dtype:
            g = g.to(out.dtype)  # PyTorch rounds the cotangent to the output's dtype
        grads.append(g)
    return grads


def run_backward(outputs, grad_outputs, retain_graph: bool, create_graph: bool,
                 inputs=None, accumulate: bool = True, allow_unused: bool = False):
    """The engine. Returns the captured gradients of ``inputs`` when ``accumulate`` is False.

    Three steps: the roots and the capture targets (``_roots``, ``_captures``), the
    dependency count of every reachable node (``_dependencies``), then the nodes run in
    reverse creation order as their gradients complete (``_execute``).

    >>> import tessera
    >>> x = tessera.ones(2, requires_grad=True)
    >>> run_backward([(x * 3).sum()], [None], False, False, inputs=[x], accumulate=False)
    [tensor([3., 3.])]
    """
    roots = _roots(outputs, _make_grads(outputs, grad_outputs))
    capture = _captures(inputs)
    captured = [None] * (len(inputs) if inputs is not None else 0)
    deps, nodes = _dependencies(roots)
    needed = _needed(nodes, {k[0] for k in capture}) if inputs is not None else None
    prev = STATE.enabled
    STATE.enabled = create_graph
    TARGETED.append(inputs is not None)
    try:
        _execute(roots, deps, capture, captured, needed, retain_graph, accumulate)
    finally:
        STATE.enabled = prev
        TARGETED.pop()
    if inputs is not None and not allow_unused:
        for k, g in enumerate(captured):
            if g is None:
                raise RuntimeError("One of the differentiated Tensors appears to not have "
                                   "been used in the graph. Set allow_unused=True if this is "
                                   "the desired behavior.")
    return captured


def _roots(outputs, grads) -> list:
    """((node, output_nr), gradient) for each output backward starts from."""
    roots = []
    for i, out in enumerate(outputs):
        e = _edge(out)
        if e is None:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not "
                               "have a grad_fn")
        roots.append((e, grads[i]))
    return roots


def _captures(inputs) -> dict:
    """(node, output_nr) -> position in ``inputs``, for ``autograd.grad``'s targets."""
    capture: dict = {}
    if inputs is not None:
        for k, t in enumerate(inputs):
            e = _edge(t)
            if e is None:
                raise RuntimeError(f"One of the differentiated Tensors (index {k}) does not "
                                   "require grad")
            capture[(e[0], e[1])] = k
    return capture


def _dependencies(roots) -> tuple[dict, dict]:
    """How many edges reach each node of the graph reachable from ``roots``, and those
    nodes (insertion-ordered). Nodes hash by identity, so they key the dicts directly."""
    deps: dict = {}
    nodes: dict = {e[0]: None for e, _ in roots}
    stack = list(nodes)  # a node with two root outputs is expanded once
    while stack:  # each node is pushed once, when first reached
        for e in stack.pop().next_functions:
            if e is None:
                continue
            nxt = e[0]
            n = deps.get(nxt)
            if n is None:
                deps[nxt] = 1
                if nxt not in nodes:
                    nodes[nxt] = None
                    stack.append(nxt)
            else:
                deps[nxt] = n + 1
    return deps, nodes


def _execute(roots, deps: dict, capture: dict, captured: list, needed, retain_graph: bool,
             accumulate: bool) -> None:
    """Run each node once all its gradients have arrived, latest-created first; sum the
    gradients flowing into each (node, output), fill ``captured``, accumulate into leaves."""
    buffers: dict = {}   # node -> {output_nr: gradient summed so far}
    for (node, nr), g in roots:
        _add(buffers, node, nr, g)
    ready: list = []
    for (node, _), _g in roots:
        if node not in deps and all(r[2] is not node for r in ready):
            heapq.heappush(ready, (-node.seq, id(node), node))
    while ready:
        node = heapq.heappop(ready)[2]
        got = buffers.pop(node, None) or {}
        if node._pre_hooks or node._retained:
            got = _pre_hooks(node, got)
        if capture:
            for nr, g in got.items():
                k = capture.get((node, nr))
                if k is not None:
                    captured[k] = g
        if needed is not None and node not in needed:
            continue
        if type(node) is AccumulateGrad:
            if accumulate and got:
                node.accumulate(got[0])
            continue
        in_grads = _apply(node, got, retain_graph)
        for e, g in zip(node.next_functions, in_grads):
            if e is None:
                continue
            nxt, nr = e
            if g is not None:
                slot = buffers.get(nxt)
                if slot is None:
                    buffers[nxt] = {nr: g}
                else:
                    old = slot.get(nr)
                    slot[nr] = g if old is None else old + g
            n = deps[nxt] - 1
            deps[nxt] = n
            if n == 0:
                heapq.heappush(ready, (-nxt.seq, id(nxt), nxt))


def _needed(nodes, targets: set) -> set:
    """The nodes from which some capture target is reachable (including the targets)."""
    memo: dict = {}
    stack = list(nodes)
    visiting = set()
    while stack:  # iterative post-order, so deep graphs do not hit the recursion limit
        n = stack[-1]
        if n in memo:
            stack.pop()
            continue
        if n not in visiting:
            visiting.add(n)
            stack.extend(e[0] for e in n.next_functions if e is not None and e[0] not in memo)
            continue
        stack.pop()
        memo[n] = n in targets or any(
            memo.get(e[0], False) for e in n.next_functions if e is not None)
    return {k for k, v in memo.items() if v}


def _add(buffers, node, nr, g):
    slot = buffers.setdefault(node, {})
    prev = slot.get(nr)
    slot[nr] = g if prev is None else prev + g


def _pre_hooks(node, got: dict) -> dict:
    if node._pre_hooks:
        for nr, hooks in node._pre_hooks.items():
            if nr in got:
                for h in hooks:
                    new = h(got[nr])
                    if new is not None:
                        got[nr] = new
    if node._retained:
        for nr, ref in node._retained.items():
            t = ref()
            if t is not None and nr in got:
                g = got[nr]
                if t._grad is None:
                    t._grad = g if g.requires_grad else g.detach().clone()
                else:
                    t._grad = t._grad + g
    return got


def _output_grads(node: Node, got: dict, metas) -> tuple:
    """Each output's gradient; outputs nothing flowed into get zeros, on the device the
    other gradients are on."""
    from tessera.ops.creation import zeros
    nondiff = node.op.nondiff_outputs
    dev = next((g.device for g in got.values() if g is not None), None)
    grads = []
    for i, m in enumerate(metas):
        g = got.get(i)
        if g is None and i not in nondiff and m is not None:
            g = zeros(m.shape, dtype=m.dtype, device=dev)
        grads.append(g)
    return tuple(grads)


# scope hooks of active nn.Graph tracers: ``begin(node)`` names the ops a grad rule makes
# after its forward op's module path, ``end(token)`` restores
BACKWARD_SCOPES: list = []


def _apply(node: Node, got: dict, retain_graph: bool) -> tuple:
    if BACKWARD_SCOPES:
        token = BACKWARD_SCOPES[-1].begin(node)
        try:
            return _apply_rule(node, got, retain_graph)
        finally:
            BACKWARD_SCOPES[-1].end(token)
    return _apply_rule(node, got, retain_graph)


def _apply_rule(node: Node, got: dict, retain_graph: bool) -> tuple:
    metas = node.output_metas
    if len(metas) == 1 and 0 in got:  # the common case: one output, its gradient arrived
        grads = (got[0],)
    else:
        grads = _output_grads(node, got, metas)
    result = node.apply(grads)
    if not isinstance(result, tuple):
        result = (result,)
    if len(result) != len(node.next_functions):
        raise RuntimeError(f"grad rule of '{node.op.name}' returned {len(result)} gradients, "
                           f"expected {len(node.next_functions)}")
    out: list = []
    for k, (g, e) in enumerate(zip(result, node.next_functions)):
        if e is None or g is None:
            out.append(None)
            continue
        m = node.input_metas[k]
        if g._shape != m.shape and tuple(g._shape) != tuple(m.shape):
            raise RuntimeError(f"Function {node.name()} returned an invalid gradient at index "
                               f"{k} - got {list(g.shape)} but expected shape compatible with "
                               f"{list(m.shape)}")
        if g._dtype is not m.dtype:
            g = g.to(m.dtype)
        out.append(g)
    if node._hooks:
        for h in node._hooks:
            new = h(tuple(out), tuple(grads))
            if new is not None:
                out = list(new)
    if not retain_graph:
        node.release()
    return tuple(out)
