"""The ONNX simplifier: import, run the graph compiler's passes, export again.

The model is imported into the IR at static shapes (``tessera.onnx.load``; shape
arithmetic is folded on the way), then the pipeline's graph-level passes run: DCE,
algebraic identities (identity/no-op removal), CSE, constant folding, conv+batch-norm
folding, DCE again, then folds views of weights (transposes, reshapes: free at run time
inside tessera, so the constant folding pass keeps them, but nodes in a file). The exporter
writes the result at the model's opset (13-21) with the same input and output names, and a
peephole turns MatMul + Add of 2-d weights into Gemm. The code-generation passes
(decompose, fuse, outline) do not run: their fused nodes have no ONNX form.

>>> import tessera, tessera.onnx
>>> m = tessera.nn.Sequential(tessera.nn.Conv2d(1, 2, 3), tessera.nn.BatchNorm2d(2))
>>> before = tessera.onnx.export(m, (tessera.ones(1, 1, 5, 5),))
>>> after = tessera.onnx.simplify(before)
>>> [n.op_type for n in before.graph.node], [n.op_type for n in after.graph.node]
(['Conv', 'BatchNormalization'], ['Conv'])
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["simplify", "PASSES"]

# the graph compiler's passes, in its pipeline's order, that keep every op exportable
PASSES = ["dce", "algebraic", "dce", "cse", "constfold", "bnfold", "dce", "cse", "dce"]


def simplify(model, out=None, *, input_shapes=None, opset_version: int | None = None):
    """A simplified copy of ``model`` (path, bytes or ModelProto); written to ``out`` if
    given. Symbolic input dims need ``input_shapes``; the result has static shapes."""
    from tessera.graph.passes import PassContext, get_pass
    from tessera.onnx.exporter import MAX_OPSET, MIN_OPSET, export_graph, save
    from tessera.onnx.importer import load

    m = load(model, input_shapes)
    values = dict(m.values)
    ctx = PassContext(training=False, values=values, codegen=False)
    for name in PASSES:
        get_pass(name)(m.graph, ctx)
    if _fold_weight_views(m.graph, ctx) | _unflatten_matmuls(m.graph):
        get_pass("dce")(m.graph, ctx)
    if _merge_sibling_linears(m.graph, ctx):
        get_pass("dce")(m.graph, ctx)
    opset = opset_version or min(max(m.opset, MIN_OPSET), MAX_OPSET)
    inputs = {v.name: n for v, n in zip(m.graph.inputs, m.input_names)}
    for v in m.graph.inputs:
        v.name = inputs[v.name]
    proto = export_graph(m.graph, {k: values[k] for k in m.graph.variables}, opset,
                         output_names=m.output_names, producer="tessera.onnx.simplify")
    _gemm_peephole(proto)
    _where_not_peephole(proto)
    if out is not None:
        save(proto, os.fspath(out))
    else:
        from tessera.onnx.exporter import _check
        _check(proto)
    return proto


_VIEWS = frozenset({"permute", "view", "squeeze", "unsqueeze", "slice"})


def _fold_weight_views(g, ctx) -> bool:
    """A view op of a fixed variable becomes a new folded variable."""
    from tessera._dispatch import dispatch
    from tessera.autograd.grad_mode import no_grad
    from tessera.graph.ir import Value
    from tessera.graph.passes.constfold import known_variables, new_variable
    known = known_variables(g, ctx)
    changed = False
    for n in list(g.nodes):
        if n.op.name not in _VIEWS or len(n.outputs) != 1:
            continue
        ins = [v for v in n.inputs if isinstance(v, Value)]
        if not ins or any(v.kind != "var" or id(v) not in known for v in ins):
            continue
        args = [known[id(v)] if isinstance(v, Value) else v for v in n.inputs]
        with no_grad():
            out = dispatch(n.op, *args, **n.attrs).contiguous()
        new = new_variable(g, ctx, out.clone())
        known[id(new)] = ctx.values[new.name]
        g.replace_uses(n.outputs[0], new)
        changed = True
    return changed


def _unflatten_matmuls(g) -> bool:
    """``view(matmul(view(x, (n, k)), w), lead + (m,))`` with a 2-d ``w`` and
    ``prod(lead) == n`` is ``matmul(view(x, lead + (k,)), w)`` (matmul broadcasts over
    leading dims), and just ``matmul(x, w)`` when ``x`` already has shape lead + (k,): a
    linear layer's flatten and unflatten go. Every user of the flattening view must be such
    a matmul (q, k and v projections share one)."""
    from tessera.graph.ir import Value
    users = g.users()
    outputs = {id(v) for v in g.live_roots()}
    changed = False
    for flat in list(g.nodes):
        if flat.op.name != "view" or len(flat.outputs[0].shape) != 2:
            continue
        a = flat.outputs[0]
        x = flat.inputs[0]
        n_rows, k = a.shape
        plan, lead = [], None
        for mm in users.get(a, []):
            w = mm.inputs[1] if mm.op.name == "matmul" and len(mm.inputs) == 2 else None
            if not (isinstance(w, Value) and len(w.shape) == 2 and mm.inputs[0] is a):
                break
            out = mm.outputs[0]
            use = users.get(out, [])
            if len(use) != 1 or use[0].op.name != "view" or id(out) in outputs:
                break
            back = use[0].outputs[0]
            this = tuple(back.shape[:-1])
            if back.shape[-1] != w.shape[1] or int(np.prod(this)) != n_rows or \
                    len(this) < 2 or lead not in (None, this):
                break
            lead = this
            plan.append((mm, back))
        else:
            if not plan or id(a) in outputs:
                continue
            assert lead is not None  # set with the plan's first entry
            if tuple(x.shape) == lead + (k,):
                src = x
            else:  # the flattening view becomes the (smaller) unflattened one
                flat.attrs = dict(flat.attrs, shape=lead + (k,))
                a.shape = lead + (k,)
                src = a
            for mm, back in plan:
                mm.inputs = [src, mm.inputs[1]]
                mm.outputs[0].shape = back.shape
                g.replace_uses(back, mm.outputs[0])
            changed = True
            users = g.users()
    return changed


def _merge_sibling_linears(g, ctx) -> bool:
    """Linear layers reading the same input (``add(matmul(x, w_i), b_i)`` with fixed 2-d
    ``w_i`` and 1-d ``b_i``: attention's q, k, v) become one matmul by the concatenated
    weights, one bias add and a split."""
    from tessera.graph.passes.constfold import known_variables
    known = known_variables(g, ctx)
    users = g.users()
    outputs = {id(v) for v in g.live_roots()}
    changed = False
    for src in list(users):
        group = [lin for mm in users.get(src, [])
                 if (lin := _linear_of(mm, src, users, known, outputs)) is not None]
        if len(group) < 2:
            continue
        _merge_linears(g, ctx, src, group, known)
        users = g.users()
        changed = True
    return changed


def _linear_of(mm, src, users, known, outputs):
    """``(matmul, add, weight, bias)`` when node ``mm`` is ``matmul(src, w)`` whose only use
    is ``add(., b)``, ``w`` a fixed 2-d variable and ``b`` a fixed 1-d one of its width (the
    matmul's output not a graph output); else None."""
    from tessera.graph.ir import Value
    if mm.op.name != "matmul" or mm.inputs[0] is not src or len(mm.inputs) != 2:
        return None
    w = mm.inputs[1]
    out = mm.outputs[0]
    use = users.get(out, [])
    if not (isinstance(w, Value) and id(w) in known and len(w.shape) == 2) or \
            len(use) != 1 or use[0].op.name != "add" or id(out) in outputs:
        return None
    add = use[0]
    bias = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if not (isinstance(bias, Value) and id(bias) in known and
            tuple(bias.shape) == (w.shape[1],) and add.attrs.get("alpha", 1) == 1
            and bias.dtype is w.dtype is out.dtype):
        return None
    return mm, add, w, bias


def _merge_linears(g, ctx, src, group, known) -> None:
    """Replace the linear layers ``group`` reading ``src`` by one matmul, one add and a
    split, placed where the first of them was."""
    from tessera._tensor import Tensor
    from tessera.graph.ir import Node
    from tessera.graph.passes.constfold import new_variable
    ws = np.concatenate([known[id(w)].numpy() for _, _, w, _ in group], axis=1)
    bs = np.concatenate([known[id(b)].numpy() for _, _, _, b in group])
    wv = new_variable(g, ctx, Tensor._from_numpy(ws))
    bv = new_variable(g, ctx, Tensor._from_numpy(bs))
    first = min(g.nodes.index(mm) for mm, _, _, _ in group)
    lead = tuple(group[0][0].outputs[0].shape[:-1])
    dt = group[0][0].outputs[0].dtype
    total = ws.shape[1]
    mm_out = g.add_node("matmul", [src, wv], {}, [(lead + (total,), dt)])[0]
    add_out = g.add_node("add", [mm_out, bv], {"alpha": 1}, [(lead + (total,), dt)])[0]
    bounds, lo = [], 0
    for _, _, w, _ in group:
        bounds.append((lo, lo + w.shape[1]))
        lo += w.shape[1]
    parts = g.add_node("split_view", [add_out], {"dim": len(lead), "bounds": tuple(bounds),
                                                 "squeeze": False},
                       [(lead + (hi - lo,), dt) for lo, hi in bounds])
    new: list[Node] = g.nodes[-3:]
    del g.nodes[-3:]
    for k, node in enumerate(new):
        node.name = group[0][0].name
        g.nodes.insert(first + k, node)
    for (_, add, _, _), part in zip(group, parts):
        g.replace_uses(add.outputs[0], part)


def _gemm_peephole(proto) -> None:
    """MatMul(A, W) + B with A of rank 2, W a 2-d initializer and B a 1-d initializer (or
    one broadcastable to the output) -> Gemm(A, W, B)."""
    import onnx
    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    inferred = onnx.shape_inference.infer_shapes(proto)
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in
            list(inferred.graph.value_info) + list(g.input)
            if v.type.tensor_type.HasField("shape")}
    users: dict = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    dead = set()
    for n in g.node:
        if n.op_type != "MatMul" or n.input[1] not in inits or rank.get(n.input[0]) != 2:
            continue
        if len(inits[n.input[1]].dims) != 2 or n.output[0] in outputs:
            continue
        use = users.get(n.output[0], [])
        if len(use) != 1 or use[0].op_type != "Add":
            continue
        add = use[0]
        bias = add.input[1] if add.input[0] == n.output[0] else add.input[0]
        t = inits.get(bias)
        if t is None or len(t.dims) > 1 or (t.dims and t.dims[0] not in
                                             (1, inits[n.input[1]].dims[1])):
            continue
        gemm = onnx.helper.make_node("Gemm", [n.input[0], n.input[1], bias],
                                     list(add.output), name=n.name.replace("MatMul", "Gemm"))
        add.CopyFrom(gemm)
        dead.add(id(n))
    keep = [n for n in g.node if id(n) not in dead]
    del g.node[:]
    g.node.extend(keep)


def _where_not_peephole(proto) -> None:
    """Where(Not(c), x, y) -> Where(c, y, x) when the Not has no other use."""
    g = proto.graph
    uses: dict = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output}
    dead = set()
    for n in g.node:
        if n.op_type != "Where":
            continue
        neg = producer.get(n.input[0])
        if neg is None or neg.op_type != "Not" or uses[neg.output[0]] != 1 or \
                neg.output[0] in outputs:
            continue
        n.input[:] = [neg.input[0], n.input[2], n.input[1]]
        dead.add(id(neg))
    if dead:
        keep = [n for n in g.node if id(n) not in dead]
        del g.node[:]
        g.node.extend(keep)
