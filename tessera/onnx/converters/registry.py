"""The two converter tables and the ways rules enter them.

``EXPORT[op name][first opset] = rule(b, n)`` turns one IR node into ONNX nodes;
``IMPORT[ONNX op type][first opset] = rule(c, *inputs)`` turns one ONNX node into tessera
ops. The family modules fill both tables; nothing else is modified (the ``OpDef``s stay as
``tessera.ops`` registered them).

``simple(op, onnx_op)`` declares a tessera op and an ONNX op that are the same function
(attributes renamed at most): it registers the export rule and derives the import rule
from the same declaration, so the two directions cannot drift apart. Rules for everything
else are written by hand with ``export_rule`` and ``import_rule``, in the same family module.

>>> sorted(EXPORT["gelu"]), sorted(IMPORT["Gelu"])
([13, 20], [1])
>>> newest(EXPORT["gelu"], 17) is EXPORT["gelu"][13]
True
>>> newest(EXPORT["gelu"], 12) is None
True
"""
from __future__ import annotations

from collections.abc import Callable

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera.onnx.converters.helpers import common_dtype, operand, same_dtype
from tessera.ops.registry import REGISTRY

__all__ = ["EXPORT", "IMPORT", "export_rule", "import_rule", "simple", "newest",
           "supported_onnx_ops"]

EXPORT: dict[str, dict[int, Callable]] = {}
IMPORT: dict[str, dict[int, Callable]] = {}


def _add(table: dict, key: str, version: int, fn: Callable) -> None:
    rules = table.setdefault(key, {})
    if version in rules:
        raise ValueError(f"'{key}' has two ONNX converters from opset {version}")
    rules[version] = fn


def export_rule(*ops: str, opset: int = 13):
    """Register the decorated ``rule(b, n)`` as the exporter of tessera ``ops`` from
    ``opset`` on."""
    def deco(fn):
        for op in ops:
            _add(EXPORT, op, opset, fn)
        return fn
    return deco


def import_rule(*onnx_ops: str, since: int = 1):
    """Register the decorated ``rule(c, *inputs)`` as the importer of ONNX ``onnx_ops`` in
    models of opset ``since`` and later."""
    def deco(fn):
        for name in onnx_ops:
            _add(IMPORT, name, since, fn)
        return fn
    return deco


# how a simple export casts its inputs: to the output dtype, to the inputs' common dtype
# (comparisons) or to bool (logical ops)
_INPUT_DTYPES = {"out": lambda n: n.out_dtype(),
                 "common": lambda n: common_dtype(n, range(len(n.ins))),
                 "bool": lambda n: D.bool_}


def simple(op: str, onnx_op: str, *, opset: int = 13, inputs: str = "out",
           attrs: dict | None = None, fixed: dict | None = None, export=None,
           inverse: bool = True) -> None:
    """Declare that tessera op ``op`` is ONNX op ``onnx_op``.

    ``attrs``: ``{tessera attribute: (ONNX attribute, default)}``, copied across in both
    directions. ``inputs``: the dtype the export casts every input to (``"out"``,
    ``"common"`` or ``"bool"``). ``export``: a hand-written export rule, for an op whose
    export needs more than one node for some dtypes or attribute values (the import is
    still the op itself). ``fixed``: tessera attributes the import sets to constants.
    ``inverse=False``: export only (several tessera ops map to ``onnx_op``, or the ONNX
    op is more general than ``op``, so importing it is written by hand).

    >>> EXPORT["abs"][13].__name__, IMPORT["Abs"][1].__name__  # simple("abs", "Abs")
    ('_abs', '_import_abs')
    """
    attrs = attrs or {}
    export_rule(op, opset=opset)(export or _simple_export(onnx_op, _INPUT_DTYPES[inputs],
                                                          attrs))
    if inverse:
        import_rule(onnx_op)(_simple_import(REGISTRY[op], attrs, fixed or {}))


def _simple_export(onnx_op: str, input_dtype, attrs: dict):
    def rule(b, n):
        dt = input_dtype(n)
        values = {o: type(d)(n.attrs.get(t, d)) for t, (o, d) in attrs.items()}
        return b.op(onnx_op, [operand(b, n, i, dt) for i in range(len(n.ins))], **values)
    rule.__name__ = f"_{onnx_op.lower()}"
    return rule


def _simple_import(opdef, attrs: dict, fixed: dict):
    def rule(c, *xs):
        for x in xs[1:]:
            same_dtype(xs[0], x)  # ONNX gives every input of these ops one type
        values = {t: c.attr(o, d) for t, (o, d) in attrs.items()}
        return dispatch(opdef, *xs, **fixed, **values)
    rule.__name__ = f"_import_{opdef.name}"
    return rule


def newest(rules: dict[int, Callable], opset: int) -> Callable | None:
    """The rule with the highest first opset not above ``opset``, or None."""
    versions = [v for v in rules if v <= opset]
    return rules[max(versions)] if versions else None


def supported_onnx_ops() -> list[str]:
    """The ONNX op types tessera imports (the backend skips node tests of any other).

    >>> ops = supported_onnx_ops()
    >>> len(ops) >= 120, "Conv" in ops
    (True, True)
    """
    return sorted(IMPORT)
