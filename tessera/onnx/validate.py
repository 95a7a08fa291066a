"""Validation of an ONNX model before tessera runs any of it.

``validate(proto, opset)`` runs tessera's own checks, then ``onnx.checker.check_model``.
Tessera's checks come first because they name the node (its name, or its index when
unnamed), its op type and the attribute or input at fault, where the checker often names
only the op type, and because the checker misses some of them (an unknown ``auto_pad``, a
``kernel_shape`` that disagrees with the weights). The checker runs without ``full_check``:
ONNX's shape inference, which ``full_check`` adds, aborts the whole process on some invalid
attributes (``LayerNormalization`` with ``axis=2**31``, a ``Split`` whose ``num_outputs``
is not its output count), so it never runs on an unchecked model. What it would check,
tessera checks while it traces the model at load, on the actual shapes: each import rule
checks its axes and geometry against the tensors it receives. The checks here:

* every value (graph input, initializer, node output) is defined once;
* nodes are in topological order (ONNX requires it), and a cycle is reported as one;
* every input a node reads and every graph output is defined;
* each node's input and output counts and its attributes' names and types match its
  schema (``onnx.defs.get_schema``), and required attributes are present;
* convolution and pooling geometry (``check_geometry``): ``kernel_shape``, ``strides``,
  ``dilations`` (and ``output_padding``) of one length, the spatial rank, ``pads`` of
  twice it, positive kernel, strides and dilations, non-negative pads, ``auto_pad`` one of
  ONNX's four values, ``kernel_shape`` equal to the weights' spatial shape, ``group``
  dividing the channels; the import rules check the same again against the tensors they
  receive;
* ``LayerNormalization``'s ``Scale`` and ``B`` broadcast to ``X`` (``check_layer_norm``):
  a rank at most ``X``'s, each dim ``X``'s or 1, as onnxruntime requires; the import rule
  checks it again on the actual tensors;
* no tensor keeps its data in an external file that was not loaded (a model given as
  bytes or a ``ModelProto``; ``onnx.load`` of a path resolves them, inside the model's
  directory).

Every failure is an ``OnnxValidationError``, a ``ValueError`` (through ``OnnxImportError``);
the checker's own ``ValidationError`` or ``InferenceError`` is its ``__cause__``.

>>> from onnx import helper, TensorProto
>>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
>>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
>>> g = helper.make_graph([helper.make_node("Relu", ["nowhere"], ["y"], name="act")],
...                       "g", [x], [y])
>>> validate(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), 17)
Traceback (most recent call last):
    ...
tessera.onnx.errors.OnnxValidationError: node 'act' (Relu) reads 'nowhere', which is not
a graph input, an initializer or the output of any node
"""
from __future__ import annotations

from collections.abc import Sequence

from tessera.onnx.errors import OnnxValidationError

__all__ = ["OnnxValidationError", "validate", "check_geometry", "check_layer_norm", "describe",
           "AUTO_PADS"]

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def describe(node, index: int | None = None) -> str:
    """How messages name ``node``: ``node 'conv1' (Conv)``, or ``node #3 (Conv)`` unnamed.

    >>> from onnx import helper
    >>> describe(helper.make_node("Relu", ["x"], ["y"]), 0)
    'node #0 (Relu)'
    """
    if node.name:
        return f"node '{node.name}' ({node.op_type})"
    return f"node #{index} ({node.op_type})" if index is not None else f"a {node.op_type} node"


def validate(proto, opset: int, path: str | None = None) -> None:
    """Raise ``OnnxValidationError`` unless ``proto`` is a valid ONNX model (see the module
    docstring); ``path``, the file it was read from, lets the checker verify a model too
    large to serialize (over 2 GB)."""
    g = proto.graph
    _external_data(proto)
    _structure(g)
    for i, node in enumerate(g.node):
        _schema(node, i, opset)
    _static_geometry(g)
    _static_layer_norm(g)
    _checker(proto, path)


# ---- structure ---------------------------------------------------------------------------

def _structure(g) -> None:
    """Single definitions, topological order (a cycle named as one), defined inputs and
    outputs."""
    defined: dict[str, str] = {}   # value -> what defines it
    for kind, values in (("initializer", g.initializer), ("graph input", g.input)):
        seen: set[str] = set()
        for v in values:
            if v.name in seen:
                raise OnnxValidationError(f"{kind} '{v.name}' is defined twice")
            seen.add(v.name)
            # a graph input may also be an initializer (its default value)
            defined.setdefault(v.name, f"{kind} '{v.name}'")
    producer: dict[str, int] = {}
    for i, node in enumerate(g.node):
        for name in node.output:
            if not name:
                continue
            if name in defined:
                raise OnnxValidationError(
                    f"{describe(node, i)} defines '{name}', which {defined[name]} already "
                    "defines (ONNX values are assigned once)")
            defined[name] = describe(node, i)
            producer[name] = i
    for i, node in enumerate(g.node):
        for name in node.input:
            if not name:
                continue
            if name not in defined:
                raise OnnxValidationError(
                    f"{describe(node, i)} reads '{name}', which is not a graph input, an "
                    "initializer or the output of any node")
            j = producer.get(name)
            if j is not None and j >= i:
                cycle = _cycle(g, producer, i)
                if cycle:
                    raise OnnxValidationError(
                        "the graph has a cycle: " + " -> ".join(
                            describe(g.node[k], k) for k in cycle + cycle[:1]))
                raise OnnxValidationError(
                    f"{describe(node, i)} reads '{name}', which {describe(g.node[j], j)} "
                    "defines after it: ONNX requires nodes in topological order")
    for v in g.output:
        if v.name not in defined:
            raise OnnxValidationError(f"graph output '{v.name}' is not produced by any node, "
                                      "nor a graph input or initializer")


def _cycle(g, producer: dict[str, int], start: int) -> list[int]:
    """The nodes of a cycle through the producers of ``start``'s inputs, or []."""
    seen: dict[int, int] = {}   # node -> 1 on the current path, 2 done
    path: list[int] = []

    def visit(k: int) -> list[int]:
        seen[k] = 1
        path.append(k)
        for name in g.node[k].input:
            j = producer.get(name)
            if j is None:
                continue
            if seen.get(j) == 1:
                return path[path.index(j):][::-1]
            if j not in seen:
                found = visit(j)
                if found:
                    return found
        seen[k] = 2
        path.pop()
        return []

    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, len(g.node) + 100))
    try:
        return visit(start)
    finally:
        sys.setrecursionlimit(limit)


# ---- per-node schema ---------------------------------------------------------------------

def _schema(node, i: int, opset: int) -> None:
    """Input/output counts and attribute names and types of ``node`` against its schema."""
    from onnx import AttributeProto, defs
    where = describe(node, i)
    try:
        s = defs.get_schema(node.op_type, opset, node.domain)
    except defs.SchemaError:
        raise OnnxValidationError(f"{where}: ONNX has no operator {node.op_type} in opset "
                                  f"{opset}") from None
    for what, n, lo, hi in (("inputs", len(node.input), s.min_input, s.max_input),
                            ("outputs", len(node.output), s.min_output, s.max_output)):
        if not lo <= n <= hi:
            want = f"{lo}" if lo == hi else f"{lo} or more" if hi >= 2 ** 30 \
                else f"{lo} to {hi}"
            raise OnnxValidationError(f"{where} has {n} {what[:-1] if n == 1 else what}; "
                                      f"{node.op_type}-{s.since_version} takes {want}")
    # an output that an op declares but the node names "" is absent, as is a trailing input
    if any(not name for name in node.output[:s.min_output]):
        raise OnnxValidationError(f"{where}: its required output names are empty")
    for k, name in enumerate(node.input):
        if not name and not _optional(s, k):   # only an optional input may be left out
            raise OnnxValidationError(f"{where}: input {k} ('{_formal(s, k)}') is empty; "
                                      f"only an optional input may be")
    names = set()
    for a in node.attribute:
        if a.name in names:
            raise OnnxValidationError(f"{where}: attribute '{a.name}' is given twice")
        names.add(a.name)
        spec = s.attributes.get(a.name)
        if spec is None:
            raise OnnxValidationError(f"{where}: {node.op_type}-{s.since_version} has no "
                                      f"attribute '{a.name}'")
        kind = int(spec.type.value)  # type: ignore[attr-defined]  # a pybind11 enum
        want = AttributeProto.AttributeType.Name(kind)
        if a.ref_attr_name:
            raise OnnxValidationError(f"{where}: attribute '{a.name}' refers to a function "
                                      "attribute outside a function")
        if int(a.type) != kind:
            got = AttributeProto.AttributeType.Name(a.type) if a.type in \
                AttributeProto.AttributeType.values() else str(a.type)
            raise OnnxValidationError(f"{where}: attribute '{a.name}' has type {got}, "
                                      f"{node.op_type} expects {want}")
        if a.name in _FLAGS and a.type == AttributeProto.INT and a.i not in (0, 1):
            raise OnnxValidationError(f"{where}: attribute '{a.name}' is {a.i}; it is a "
                                      "flag, 0 or 1")
    for name, spec in s.attributes.items():
        if spec.required and name not in names:
            raise OnnxValidationError(f"{where}: required attribute '{name}' is missing")
    rule = _OP_RULES.get(node.op_type)
    if rule is not None:
        rule(node, where, s.since_version)


def _split_rule(node, where: str, version: int) -> None:
    """Split's ``num_outputs`` must be its output count (ONNX's shape inference indexes its
    outputs by it: a mismatch aborts the process inside ``onnx``)."""
    from onnx import helper
    for a in node.attribute:
        if a.name == "num_outputs":
            n = helper.get_attribute_value(a)
            if n != len(node.output):
                raise OnnxValidationError(f"{where}: attribute 'num_outputs' is {n}, but the "
                                          f"node has {len(node.output)} outputs")
            if len(node.input) > 1 and node.input[1]:
                raise OnnxValidationError(f"{where}: input 'split' and attribute "
                                          "'num_outputs' cannot be used together")
            return
    if version >= 18 and not (len(node.input) > 1 and node.input[1]):
        raise OnnxValidationError(f"{where}: Split-{version} needs input 'split' or "
                                  "attribute 'num_outputs'")


# per-op rules the schema cannot say, run on every node of that op type (a table: ONNX op
# type -> rule(node, where, the schema's version))
_OP_RULES = {"Split": _split_rule}


# integer attributes that are flags: ONNX's shape inference and onnxruntime's kernels read
# any other value differently (== 1 against != 0)
_FLAGS = frozenset({"keepdims", "ceil_mode", "count_include_pad", "transA", "transB",
                    "largest", "sorted", "select_last_index", "exclusive", "reverse",
                    "noop_with_empty_axes", "storage_order", "upper", "allowzero",
                    "detect_negative", "detect_positive", "exclude_outside", "antialias",
                    "center_point_box", "training_mode"})


def type_params(node, opset: int) -> list[str]:
    """The type parameter (``T``...) each of ``node``'s inputs is bound to by its schema;
    inputs bound to one parameter must have one type."""
    from onnx import defs
    s = defs.get_schema(node.op_type, opset, node.domain)
    params = s.inputs
    if not params:
        return []
    last = params[-1]
    # each input of a heterogeneous variadic parameter has a type of its own
    free = last.option == last.option.Variadic and not last.is_homogeneous
    return [params[min(k, len(params) - 1)].type_str if k < len(params) - 1 or not free
            else f"{last.type_str}#{k}" for k in range(len(node.input))]


def _formal(s, k: int) -> str:
    params = s.inputs
    return params[min(k, len(params) - 1)].name if params else str(k)


def _optional(s, k: int) -> bool:
    from onnx.defs import OpSchema
    params = s.inputs
    if not params:
        return False
    p = params[min(k, len(params) - 1)]
    return p.option == OpSchema.FormalParameterOption.Optional


# ---- convolution and pooling geometry ----------------------------------------------------

_GEOMETRY_OPS = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


def check_geometry(where: str, op: str, attrs: dict, nd: int | None = None,
                   kernel: Sequence[int] | None = None, channels: int | None = None,
                   weight: Sequence[int] | None = None) -> int:
    """Check the window attributes of convolution or pooling ``op`` (``attrs`` by name, as
    Python values) against the spatial rank ``nd`` when known (``x.dim() - 2``), the
    weight shape ``weight`` and input channels ``channels``; returns the spatial rank.

    >>> check_geometry("node 'c' (Conv)", "Conv", {"strides": [1, 1]}, 2)
    2
    >>> check_geometry("node 'c' (Conv)", "Conv", {"dilations": [1, 1, 1]}, 2)
    Traceback (most recent call last):
        ...
    tessera.onnx.errors.OnnxValidationError: node 'c' (Conv): attribute 'dilations' has 3
    values [1, 1, 1]; a 2-d Conv takes 2 (one per spatial dim)
    """
    if nd is not None and nd < 1:
        raise OnnxValidationError(f"{where}: {op} needs an input of rank 3 or more (batch, "
                                  f"channels, spatial dims), got rank {nd + 2}")
    if weight is not None:
        if nd is not None and len(weight) != nd + 2:
            raise OnnxValidationError(
                f"{where}: the weight has shape {list(weight)} (rank {len(weight)}); a "
                f"{nd}-d {op} takes a rank-{nd + 2} weight")
        nd = len(weight) - 2
        if nd < 1:
            raise OnnxValidationError(f"{where}: the weight has shape {list(weight)}; {op} "
                                      "takes a weight of rank 3 or more")
    lists = {k: attrs[k] for k in ("kernel_shape", "strides", "dilations", "output_padding")
             if attrs.get(k) is not None}
    for k, v in lists.items():
        if nd is None:
            nd = len(v)
        if len(v) != nd:
            raise OnnxValidationError(f"{where}: attribute '{k}' has {len(v)} values "
                                      f"{list(v)}; a {nd}-d {op} takes {nd} (one per "
                                      "spatial dim)")
    pads = attrs.get("pads")
    if pads is not None:
        if nd is None:
            nd = len(pads) // 2
        if len(pads) != 2 * nd:
            raise OnnxValidationError(f"{where}: attribute 'pads' has {len(pads)} values "
                                      f"{list(pads)}; a {nd}-d {op} takes {2 * nd} (begin "
                                      "and end per spatial dim)")
        if any(p < 0 for p in pads):
            raise OnnxValidationError(f"{where}: attribute 'pads' {list(pads)} has a negative "
                                      "value")
    for k, lo in (("kernel_shape", 1), ("strides", 1), ("dilations", 1),
                  ("output_padding", 0)):
        v = lists.get(k)
        if v is not None and any(e < lo for e in v):
            raise OnnxValidationError(f"{where}: attribute '{k}' {list(v)} must be "
                                      f"{'positive' if lo else 'non-negative'}")
    auto = attrs.get("auto_pad", "NOTSET")
    if auto not in AUTO_PADS:
        raise OnnxValidationError(f"{where}: attribute 'auto_pad' is '{auto}'; it must be "
                                  f"one of {', '.join(AUTO_PADS)}")
    if auto != "NOTSET" and pads is not None and any(pads):
        raise OnnxValidationError(f"{where}: attributes 'pads' and auto_pad='{auto}' cannot "
                                  "be used together")
    _op_rules(where, op, attrs, lists, nd, weight, channels)
    return nd if nd is not None else 0


def _op_rules(where: str, op: str, attrs: dict, lists: dict, nd, weight, channels) -> None:
    ks = lists.get("kernel_shape")
    if op in ("MaxPool", "AveragePool", "LpPool"):
        pads = attrs.get("pads")
        if ks is not None and pads is not None and nd:
            for d in range(nd):
                if max(pads[d], pads[d + nd]) >= ks[d]:
                    raise OnnxValidationError(
                        f"{where}: attribute 'pads' {list(pads)} pads spatial dim {d} by "
                        f"{max(pads[d], pads[d + nd])}; a {op} pad must be smaller than "
                        f"the kernel ({ks[d]})")
        return
    group = attrs.get("group", 1)
    if group < 1:
        raise OnnxValidationError(f"{where}: attribute 'group' is {group}; it must be "
                                  "positive")
    if weight is None:
        return
    if ks is not None and tuple(ks) != tuple(weight[2:]):
        raise OnnxValidationError(
            f"{where}: attribute 'kernel_shape' {list(ks)} does not match the weight's "
            f"spatial shape {list(weight[2:])} (weight {list(weight)})")
    if op == "Conv":
        if weight[0] % group:
            raise OnnxValidationError(
                f"{where}: attribute 'group' {group} does not divide the weight's "
                f"{weight[0]} output channels (weight {list(weight)})")
        if channels is not None and channels != weight[1] * group:
            raise OnnxValidationError(
                f"{where}: the input has {channels} channels; weight {list(weight)} with "
                f"group={group} takes {weight[1] * group}")
    else:  # ConvTranspose: weight (C, M / group, k...)
        if weight[0] % group:
            raise OnnxValidationError(
                f"{where}: attribute 'group' {group} does not divide the weight's "
                f"{weight[0]} input channels (weight {list(weight)})")
        if channels is not None and channels != weight[0]:
            raise OnnxValidationError(
                f"{where}: the input has {channels} channels; weight {list(weight)} "
                f"takes {weight[0]}")
        out_shape = attrs.get("output_shape")
        if out_shape is not None and nd is not None:
            if len(out_shape) not in (nd, nd + 2):
                raise OnnxValidationError(
                    f"{where}: attribute 'output_shape' has {len(out_shape)} values "
                    f"{list(out_shape)}; a {nd}-d ConvTranspose takes {nd}")
            if any(s < 1 for s in out_shape[-nd:]):
                raise OnnxValidationError(f"{where}: attribute 'output_shape' "
                                          f"{list(out_shape)} must be positive")


def _static_geometry(g) -> None:
    """``check_geometry`` for every convolution and pooling node, with the rank and weight
    shape known before running: weights that are initializers, declared input ranks."""
    from onnx import helper
    inits = {t.name: tuple(t.dims) for t in g.initializer}
    ranks = {}
    for v in list(g.input) + list(g.value_info):
        t = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape"):
            ranks[v.name] = len(t.shape.dim)
    for i, node in enumerate(g.node):
        if node.op_type not in _GEOMETRY_OPS:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if isinstance(attrs.get("auto_pad"), bytes):
            attrs["auto_pad"] = attrs["auto_pad"].decode(errors="replace")
        x = node.input[0] if node.input else ""
        rank = len(inits[x]) if x in inits else ranks.get(x)
        w = node.input[1] if len(node.input) > 1 and node.op_type.startswith("Conv") else ""
        check_geometry(describe(node, i), node.op_type, attrs,
                       None if rank is None else rank - 2, weight=inits.get(w))


# ---- LayerNormalization's scale and bias ------------------------------------------------

def check_layer_norm(where: str, x: Sequence, scale: Sequence | None,
                     bias: Sequence | None = None, axis: int | None = None) -> None:
    """Raise ``OnnxValidationError`` unless ``LayerNormalization``'s ``Scale`` and ``B``
    (shapes; None: absent or unknown) broadcast to its input of shape ``x`` without
    changing it, as onnxruntime requires (a rank above ``x``'s, or a dim neither ``x``'s
    nor 1, would make the output another shape than ``X``'s), and, with ``axis`` (in
    ``[0, rank)``), unless ``X.shape[axis:]`` holds at least one element. A dim given as
    None (a symbolic dim) matches anything.

    >>> check_layer_norm("node 'ln' (LayerNormalization)", (2, 3, 4), (3, 4), (1, 4))
    >>> check_layer_norm("node 'ln' (LayerNormalization)", (2, 3, 4), (3,))
    Traceback (most recent call last):
        ...
    tessera.onnx.errors.OnnxValidationError: node 'ln' (LayerNormalization): input 'Scale'
    of shape [3] does not broadcast to X's shape [2, 3, 4]: dim -1 is 3, where X has 4 (it
    must be X's or 1)
    """
    for name, s in (("Scale", scale), ("B", bias)):
        if s is None:
            continue
        if len(s) > len(x):
            raise OnnxValidationError(
                f"{where}: input '{name}' of shape {list(s)} has rank {len(s)}, more than "
                f"X's {len(x)} (shape {list(x)}); it must broadcast to X's shape")
        for d in range(1, len(s) + 1):
            a, b = s[-d], x[-d]
            if a is not None and b is not None and a != 1 and a != b:
                raise OnnxValidationError(
                    f"{where}: input '{name}' of shape {list(s)} does not broadcast to X's "
                    f"shape {list(x)}: dim {-d} is {a}, where X has {b} (it must be X's or 1)")
    if axis is not None and any(n == 0 for n in x[axis:]):
        raise OnnxValidationError(f"{where}: X of shape {list(x)} has no elements to "
                                  f"normalize from axis {axis} on")


def _static_layer_norm(g) -> None:
    """``check_layer_norm`` for every ``LayerNormalization`` node whose shapes are known
    before running: initializers and declared shapes of inputs and values."""
    shapes: dict[str, tuple] = {t.name: tuple(t.dims) for t in g.initializer}
    for v in list(g.input) + list(g.value_info):
        t = v.type.tensor_type if v.type.HasField("tensor_type") else None
        if t is not None and t.HasField("shape") and v.name not in shapes:
            shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                   for d in t.shape.dim)
    for i, node in enumerate(g.node):
        if node.op_type != "LayerNormalization" or not node.input:
            continue
        x = shapes.get(node.input[0])
        if x is None:
            continue
        scale, bias = (shapes.get(n) if k < len(node.input) and (n := node.input[k]) else None
                       for k in (1, 2))
        check_layer_norm(describe(node, i), x, scale, bias)


# ---- external data and the ONNX checker --------------------------------------------------

def _external_data(proto) -> None:
    """Tensors whose data lives in a file ``onnx.load`` did not read: reading it now would
    resolve the file against the working directory, not the model's."""
    from onnx import TensorProto
    for t in _tensors(proto.graph):
        if t.data_location == TensorProto.EXTERNAL:
            raise OnnxValidationError(
                f"tensor '{t.name}' keeps its data in an external file that was not loaded; "
                "load the model from its path (its external data is read from the model's "
                "directory) or load it with onnx.load first")


def _tensors(g):
    """The initializers and tensor attributes of graph ``g`` and its subgraphs."""
    yield from g.initializer
    for node in g.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for sub in a.graphs:
                yield from _tensors(sub)


def copy_with_typed_outputs(proto, outputs: list[int]):
    """A copy of ``proto`` whose graph outputs ``outputs`` have a placeholder type."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    for k in outputs:
        t = m.graph.output[k].type
        if not t.HasField("tensor_type") or not t.tensor_type.elem_type:
            t.tensor_type.elem_type = onnx.TensorProto.FLOAT
        t.tensor_type.shape.SetInParent()
    return m


def _typed(v) -> bool:
    t = v.type
    return t.HasField("tensor_type") and t.tensor_type.HasField("shape") or \
        t.HasField("sequence_type") or t.HasField("optional_type") or t.HasField("map_type")


def _checker(proto, path: str | None) -> None:
    """``onnx.checker.check_model`` (not ``full_check``: see the module docstring). The
    checker wants a type and shape on every graph output, which onnxruntime and tessera
    infer: outputs without them are checked on a copy where they have a placeholder type
    (the checker without ``full_check`` does not compare it with anything)."""
    import onnx
    bare = [k for k, v in enumerate(proto.graph.output) if not _typed(v)]
    if bare:
        proto = copy_with_typed_outputs(proto, bare)
    try:
        try:
            onnx.checker.check_model(proto)
        except ValueError as e:
            if path is None or "2GB" not in str(e) or bare:
                raise
            onnx.checker.check_model(path)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise OnnxValidationError(f"the ONNX checker rejects the model: "
                                  f"{text or type(e).__name__}") from e
