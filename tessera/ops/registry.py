"""The op registry: one ``OpDef`` per op, holding every rule of that op.

Eager execution, autograd, tracing, the graph passes, code generation, distributed
execution and the exporters read the same entry. Every rule is declared in the ``defop``
call of the op's family module; nothing changes an ``OpDef`` after it is registered. A rule
that is missing raises ``MissingRule`` naming op and rule.

>>> from tessera.ops.registry import REGISTRY
>>> REGISTRY["add"].name
'add'
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from tessera._dtype import dtype

if TYPE_CHECKING:
    from tessera.sbp import SbpRule

RULES = ("infer", "kernel:cpu", "meta", "grad", "sbp", "cost", "to_c", "to_jax", "to_relax")

# The traits an op may declare (``defop(..., traits={...})``): facts about the op that the
# layers above act on. A trait outside this table is an error at registration.
TRAITS = {
    "numpy_fast": "NumPy's kernel runs at memory speed when every operand has the output's "
                  "dtype, so eager mode keeps it rather than a C loop (bench kernels)",
    "single_pass": "NumPy computes it in one pass at memory speed: a fusion region of only "
                   "such ops stays with NumPy (the outline pass)",
    "cheap": "cheaper to recompute at each reader than to store (the duplicate pass)",
    "out_form": "its cpu in-place kernel is a general out-form fn(out, *args, **attrs) that "
                "the executor may point at any buffer (with a ``bind(*metas, out_meta, **attrs)`` "
                "attribute, the executor binds it once per node: its kernel planned ahead)",
    "into_variables": "a kernel with several results whose cpu in-place kernel, "
                      "fn(outs, *args, **attrs), writes them into ``outs``: the executor "
                      "uses it when the memory plan puts every result into a variable (so "
                      "nothing is copied into the variables after the step)",
    "c_int": "its to_c rule is exact on int32/int64 too (C's signed overflow wraps)",
    "compare": "a comparison: its C rule computes in the operands' promoted type",
    "logical": "a logical op: its C rule computes on bools",
    "checked_value": "a floating tensor operand it writes into an integer output is a PyTorch "
                     "Scalar, whose conversion raises on NaN or out of range: its C rule, "
                     "whose cast cannot, is not used for those dtypes",
}


class Meta(NamedTuple):
    """What ``infer`` knows about a tensor: shape, dtype, device type."""

    shape: tuple[int, ...]
    dtype: dtype


class MissingRule(NotImplementedError):
    def __init__(self, op: str, rule: str, detail: str = ""):
        super().__init__(f"op '{op}' has no '{rule}' rule" + (f": {detail}" if detail else ""))
        self.op, self.rule = op, rule


# Marks an op whose derivative exists mathematically but is not written.
NOT_DIFFERENTIABLE = None


def _no_grad_written(ctx, *grads):
    raise MissingRule(ctx.op.name, "grad", "the derivative is not implemented")


@dataclass(eq=False)
class OpDef:
    """One operator and all of its rules.

    ``infer(*metas, **attrs) -> Meta | tuple[Meta, ...]``: tensor inputs arrive as ``Meta``,
    Python scalars as themselves, absent optional tensors as None. It validates and raises
    the user-facing error.

    ``kernels[device](*arrays, **attrs) -> array | tuple``: the computation.

    ``grad(ctx, *grad_outputs) -> tuple`` (one entry per input, None where there is none),
    written with tessera ops so it runs eagerly, with ``create_graph`` and traced.
    ``grad=None`` marks an op with no derivative (its outputs never require grad).

    ``save`` names what backward needs: "inputs", "outputs", both, or nothing; autograd keeps
    only that alive, and checks the version counters of what it kept.

    ``promote``: tensor inputs are cast to ``result_type`` of all inputs before the kernel.
    ``aliasing``: "view" ops return arrays sharing memory with input 0.
    ``nondiff_outputs``: output positions that never carry gradients (indices, masks).
    ``dynamic_shape``: ``infer`` gives -1 for sizes that depend on the data (nonzero,
    unique); the kernel's result decides them, and the op cannot run on ``meta``.
    ``input_buffers(*metas, **attrs) -> list``: for a kernel that first copies its inputs
    into a buffer of its own (a collective's bucket), one entry per input: None, or an
    object whose ``take()`` gives the array the kernel would copy that input into. A
    compiled graph has the input's producer write there directly, and the kernel skips
    the copy of an input already in place. An entry whose ``output`` is ``(k, offset)``
    says the kernel puts the input into its result ``k`` at that flat offset: where the
    step writes that result into a variable (a parameter an all-gather assembles), the
    producer writes into the variable there instead, when nothing reads the variable
    after the producer.

    ``sbp(*metas, **attrs)``: the SBP signatures it runs with (a ``tessera.sbp.SbpRule``).
    ``cost(ins, outs, **attrs) -> Cost``: FLOPs and bytes read and written, from the input
    metas (and Python values) and the output metas ``infer`` gave (``tessera.ops.cost``).
    ``to_c(c, args, attrs) -> str``: one element as a C expression (``tessera.kernels.
    c_expr``); an op is fusible exactly when it has one. ``decompose(b, *inputs, **attrs)``:
    the op as reductions and elementwise ops, for the code generator to fuse.
    ``to_jax(jnp, lax, args, attrs)``: the op as ``jax.numpy``/``lax`` calls on JAX arrays
    (``tessera.ops._jax``), for the XLA backend; ``to_relax(R, args, attrs)``: the op as
    TVM Relax expressions (``tessera.ops._relax``), for the TVM backend. Both see inputs
    already cast to the compute type, and the backend casts results to ``infer``'s dtypes;
    an op without one runs on tessera's executor in a graph compiled for that backend
    (``tessera.compiler.partition``). ``traits``:
    names from ``TRAITS``. ``operator``: ``(name, attrs)`` when a Python operator on Tensors
    is this op with these attrs (``add``: ``("__add__", {"alpha": 1})``); ``x + y`` then
    dispatches it directly.
    """

    name: str
    infer: Callable[..., Any]
    kernels: dict[str, Callable] = field(default_factory=dict)
    grad: Callable | None = _no_grad_written
    save: tuple[str, ...] = ("inputs",)
    promote: bool = False
    aliasing: str = "none"
    nondiff_outputs: tuple[int, ...] = ()
    dynamic_shape: bool = False
    inplace_kernels: dict[str, Callable] = field(default_factory=dict)
    sbp: SbpRule | None = None
    cost: Callable | None = None
    to_c: Callable | None = None
    decompose: Callable | None = None
    to_jax: Callable | None = None
    to_relax: Callable | None = None
    traits: frozenset[str] = frozenset()
    operator: tuple[str, dict] | None = None
    input_buffers: Callable | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        self.traits = frozenset(self.traits)
        unknown = self.traits - TRAITS.keys()
        if unknown:
            raise ValueError(f"op '{self.name}': unknown traits {sorted(unknown)} "
                             f"(known: {sorted(TRAITS)})")

    def __setattr__(self, name: str, value: Any) -> None:
        # every rule is declared in defop: a registered op is complete and never changes
        if self.__dict__.get("_registered"):
            raise AttributeError(f"op '{self.name}' is registered: its '{name}' rule belongs "
                                 "in its defop(...)")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"OpDef({self.name})"

    def rule(self, name: str):
        """The rule called ``name``; ``MissingRule`` if this op lacks it."""
        value = {"infer": self.infer, "grad": self.grad, "sbp": self.sbp, "cost": self.cost,
                 "to_c": self.to_c, "to_jax": self.to_jax,
                 "to_relax": self.to_relax}.get(name)
        if name.startswith("kernel:"):
            value = self.kernels.get(name.split(":", 1)[1])
        if value is None or value is _no_grad_written:
            raise MissingRule(self.name, name)
        return value

    def has_rule(self, name: str) -> bool:
        if name == "meta":
            return self.infer is not None
        if name == "grad" and self.grad is None:
            return True  # non-differentiable by definition: nothing is missing
        try:
            self.rule(name)
            return True
        except MissingRule:
            return False


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add ``op`` to the registry; names are unique. From then on the op is read-only.

    >>> REGISTRY["add"].sbp = None
    Traceback (most recent call last):
    ...
    AttributeError: op 'add' is registered: its 'sbp' rule belongs in its defop(...)
    """
    if op.name in REGISTRY:
        raise ValueError(f"op '{op.name}' is already registered")
    op._registered = True
    REGISTRY[op.name] = op
    return op


def defop(name: str, infer: Callable, cpu: Callable, **rules) -> OpDef:
    """Shorthand: register an op with its infer rule and CPU kernel, plus any other rules."""
    kernels = rules.pop("kernels", {})
    kernels.setdefault("cpu", cpu)
    return register(OpDef(name, infer, kernels, **rules))


def coverage_table(extra: dict[str, set[str]] | None = None) -> str:
    """The op × rule table printed by ``python -m tessera opcov``. ``extra``: more columns
    from layers above the registry, ``{column: names of the ops that have that rule}`` (the
    ONNX exporter's table, for one).

    >>> print(coverage_table({"mine": {"add"}}).splitlines()[0].split()[6:])
    ['cost', 'to_c', 'to_jax', 'to_relax', 'mine']
    """
    extra = extra or {}
    cols = RULES + tuple(extra)
    width = max([len(n) for n in REGISTRY] + [4])
    lines = [f"{'op'.ljust(width)}  " + "  ".join(cols)]
    counts = dict.fromkeys(cols, 0)
    for name in sorted(REGISTRY):
        op = REGISTRY[name]
        marks = []
        for c in cols:
            ok = name in extra[c] if c in extra else op.has_rule(c)
            counts[c] += ok
            marks.append(("x" if ok else ".").center(len(c)))
        lines.append(f"{name.ljust(width)}  " + "  ".join(marks))
    lines.append(f"{'total'.ljust(width)}  " +
                 "  ".join(str(counts[c]).center(len(c)) for c in cols))
    lines.append(f"{len(REGISTRY)} ops registered")
    return "\n".join(lines)
