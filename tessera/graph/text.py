"""The IR's text form: ``print_graph`` and ``parse_graph``, inverse of each other.

::

    graph(%x: float32[8, 4]) {
      var %fc.weight: float32[3, 4]
      %0: float32[8, 3] = linear(%x, %fc.weight, None)  # fc
      %1: float32[8, 3] = mul(%0, 2.0) [region=0]  # scale
      return (%1)
      assign %fc.weight = %0
    }

Attribute values are Python literals plus dtype names (``float32``), ``inf``/``nan`` and
``device('cpu')``; parsing evaluates only those, never arbitrary code.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Any

from tessera import _dtype as D
from tessera.device.registry import device
from tessera.graph.ir import Graph, IRError, Value
from tessera.ops.registry import REGISTRY

__all__ = ["print_graph", "parse_graph"]


# ---- printing ------------------------------------------------------------------------

def _fmt(v) -> str:
    if isinstance(v, Value):
        return f"%{v.name}"
    if isinstance(v, D.dtype):
        return v.name
    if isinstance(v, device):
        return f"device('{v}')"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, tuple):
        inner = ", ".join(_fmt(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if v is None or isinstance(v, (bool, int, str, slice)):
        return repr(v)
    from tessera.ops.random import Generator, default_generator
    if v is default_generator:  # random ops draw from it when the graph runs
        return "default_generator"
    if isinstance(v, Generator):
        raise IRError("a graph drawing from a user Generator object has no text form (only "
                      "the default generator can be named)")
    raise IRError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def _typed(v: Value) -> str:
    return f"%{v.name}: {v.type_str()}"


def print_graph(g: Graph) -> str:
    lines = [f"graph({', '.join(_typed(v) for v in g.inputs)}) {{"]
    for v in g.variables.values():
        lines.append(f"  var {_typed(v)}")
    for n in g.nodes:
        outs = ", ".join(_typed(v) for v in n.outputs)
        args = ", ".join(_fmt(v) for v in n.inputs)
        attrs = ", ".join(f"{k}={_fmt(v)}" for k, v in n.attrs.items())
        line = f"  {outs} = {n.op.name}({args})"
        if attrs:
            line += f" {{{attrs}}}"
        if n.notes:
            line += " [" + ", ".join(f"{k}={_fmt(v)}" for k, v in n.notes.items()) + "]"
        if n.name:
            line += f"  # {n.name}"
        lines.append(line)
    lines.append(f"  return ({', '.join(_fmt(v) for v in g.outputs)})")
    for name, v in g.assigns:
        lines.append(f"  assign %{name} = {_fmt(v)}")
    lines.append("}")
    return "\n".join(lines)


# ---- parsing -------------------------------------------------------------------------

_NAMES: dict[str, Any] = {d.name: d for d in D.ALL + D.QUANTIZED}
_NAMES.update({"inf": math.inf, "nan": math.nan, "None": None, "True": True, "False": False})
_TYPE = re.compile(r"%([\w.\-]+):\s*(\w+)\[([^\]]*)\]")


def _literal(node: ast.AST, values: dict):
    """Evaluate a literal expression: constants, tuples, lists, names of dtypes, -x,
    ``device('...')``, ``slice(a, b, c)`` and ``%value`` references (pre-substituted)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, values) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e, values) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        x = _literal(node.operand, values)
        return -x if isinstance(node.op, ast.USub) else +x
    if isinstance(node, ast.Name):
        if node.id in values:
            return values[node.id]
        if node.id in _NAMES:
            return _NAMES[node.id]
        if node.id == "default_generator":
            from tessera.ops.random import default_generator
            return default_generator
        raise IRError(f"unknown name '{node.id}'")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_literal(a, values) for a in node.args]
        if node.func.id == "device":
            return device(*args)
        if node.func.id == "slice":
            return slice(*args)
    raise IRError(f"not a literal: {ast.dump(node)}")


_REF = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|%([\w.\-]+)""")


def _eval(text: str, values: dict):
    # value references %a.b become identifiers v_<n> the evaluator maps back
    refs: dict[str, Value] = {}

    def sub(m):
        if m.group(1):  # a string literal (a fused node's body): its %names are its own
            return m.group(1)
        key = f"_v{len(refs)}"
        name = m.group(2)
        if name not in values:
            raise IRError(f"use of undefined value %{name}")
        refs[key] = values[name]
        return key
    text = _REF.sub(sub, text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise IRError(f"cannot parse '{text.strip()}': {e.msg}") from None
    return _literal(tree.body, refs)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts: list[str]
    cur: list[str]
    quote: str | None
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _types(text: str) -> list[tuple[str, tuple, D.dtype]]:
    out = []
    for m in _TYPE.finditer(text):
        dims = tuple(int(s) for s in m.group(3).split(",") if s.strip())
        if m.group(2) not in _NAMES or not isinstance(_NAMES[m.group(2)], D.dtype):
            raise IRError(f"unknown dtype '{m.group(2)}'")
        out.append((m.group(1), dims, _NAMES[m.group(2)]))
    return out


def parse_graph(text: str) -> Graph:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("graph(") or lines[-1] != "}":
        raise IRError("IR text must start with 'graph(' and end with '}'")
    g = Graph()
    values: dict[str, Value] = {}
    for name, shape, dt in _types(lines[0]):
        values[name] = g.add_input(name, shape, dt)
    count = 0
    for lineno, line in enumerate(lines[1:-1], start=2):
        try:
            count = _parse_line(g, line, values, count)
        except IRError as e:
            raise IRError(f"line {lineno}: {e}") from None
    g._count = count
    return g


def _parse_line(g: Graph, line: str, values: dict, count: int) -> int:
    if line.startswith("var "):
        ((name, shape, dt),) = _types(line)
        values[name] = g.add_variable(name, shape, dt)
    elif line.startswith("return"):
        inner = line[len("return"):].strip()
        g.outputs = list(_as_tuple(_eval(inner, values)))
    elif line.startswith("assign "):
        lhs, rhs = line[len("assign "):].split("=", 1)
        name = lhs.strip().lstrip("%")
        if name not in g.variables:
            raise IRError(f"assign to unknown variable %{name}")
        g.assigns.append((name, _eval(rhs, values)))
    else:
        count = _parse_node(g, line, values, count)
    return count


def _as_tuple(v):
    return v if isinstance(v, tuple) else (v,)


def _parse_node(g: Graph, line: str, values: dict, count: int) -> int:
    line, _, scope = line.partition("  # ")
    lhs, eq, rhs = line.partition(" = ")
    if not eq:
        raise IRError(f"cannot parse '{line}'")
    m = re.match(r"([\w.]+)\((.*?)\)\s*(\{.*\})?\s*(\[.*\])?\s*$", rhs.strip())
    if not m:
        raise IRError(f"cannot parse node '{rhs.strip()}'")
    opname, args, attrs, notes = m.group(1), m.group(2), m.group(3), m.group(4)
    if opname not in REGISTRY:
        raise IRError(f"unknown op '{opname}'")
    inputs = [_eval(a, values) for a in _split_top(args)]
    kw = {}
    if attrs:
        for item in _split_top(attrs[1:-1]):
            k, _, v = item.partition("=")
            kw[k.strip()] = _eval(v, values)
    outs = _types(lhs)
    vals = g.add_node(opname, inputs, kw, [(s, d) for _, s, d in outs], name=scope.strip())
    if notes:
        for item in _split_top(notes[1:-1]):
            k, _, v = item.partition("=")
            vals[0].producer.notes[k.strip()] = _eval(v, values)
    for (name, _, _), val in zip(outs, vals):
        val.name = name
        values[name] = val
        if name.isdigit():
            count = max(count, int(name) + 1)
    return count
