"""``einsum``: Einstein summation as one op with every rule of the registry.

``tessera.einsum(equation, *operands)`` parses the equation (``_parse``: the grammar's
lexer and recursive-descent parser, the sublist form, and ``bind``, which checks an
equation against shapes and expands ellipses), chooses the contraction path (``_path``:
an exact dynamic programme over subsets for up to 9 operands, greedy beyond, and the cost
report) and dispatches the ``einsum`` op with two attrs: the *canonical* equation (explicit
output, ellipses expanded into letters) and the path. The kernel (``_lower``) runs each
step of the path as permutes/reshapes and one batched matrix product, planned once per
operand layout. ``_rules`` holds the op's sbp and cost rules. In an ``nn.Graph`` the node
holds both attrs, so the path is chosen once, when the graph is traced. Only this module
touches Tensors; the others work on strings, shapes and NumPy arrays.

The gradient of an einsum is an einsum: the output gradient contracted with the other
operands, to the operand's labels (diagonals through an identity matrix, dims the operand
alone sums through ``expand``), so double backward works.

>>> import tessera
>>> a, b = tessera.ones(2, 3), tessera.ones(3, 4)
>>> tessera.einsum("ij,jk->ik", a, b).shape
tessera.Size([2, 4])
"""
from __future__ import annotations

import string
from functools import lru_cache

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops.einsum import _lower, _path
from tessera.ops.einsum._parse import bind, from_sublists, parse
from tessera.ops.einsum._rules import einsum_cost, einsum_sbp
from tessera.ops.registry import Meta, defop

__all__ = ["einsum", "einsum_path"]

_SNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
_NO_OPERAND = ("einsum(): must specify the equation string and at least one operand, or at "
               "least one operand and its subscripts list")


# ---- the op ---------------------------------------------------------------------------

def _infer(*metas, equation: str, path=()):
    if not metas:
        raise ValueError(_NO_OPERAND)
    for i, m in enumerate(metas):
        if type(m) is not Meta:
            raise TypeError(f"einsum(): expected Tensor as element {i} in argument 1, but got "
                            f"{type(m).__name__}")
    dt = metas[0].dtype
    for m in metas[1:]:
        if m.dtype is not dt:
            raise RuntimeError(f"expected scalar type {_SNAME[dt.name]} but found "
                               f"{_SNAME[m.dtype.name]}")
    b = bind(parse(equation), [m.shape for m in metas])
    _check_path(path, len(metas))
    if dt.category < 2:  # integers and bool: PyTorch's rules for sum and bmm
        summed = set("".join(b.inputs)) - set(b.output)
        if len(metas) == 1 and summed:
            dt = D.int64
        elif dt is D.bool_ and summed and len(metas) > 1:
            raise NotImplementedError("\"bmm\" not implemented for 'Bool'")
    return Meta(b.output_shape(), dt)


def _check_path(path, n: int) -> None:
    if len(path) != max(n - 1, 0):
        raise ValueError(f"einsum(): a path for {n} operands has {max(n - 1, 0)} steps, got "
                         f"{len(path)}")
    for k, step in enumerate(path):
        if len(step) != 2 or not 0 <= step[0] < step[1] < n - k:
            raise ValueError(f"einsum(): path step {k} {tuple(step)} must be two increasing "
                             f"positions among the {n - k} operands left")


def _kernel(*arrays, equation: str, path=()):
    return _lower.run(equation, arrays, path)


def _conj(t: Tensor) -> Tensor:
    from tessera.ops.linalg import _conj as conj
    return conj(t)


def _grad(ctx, g):
    xs = ctx.inputs
    b = bind(parse(ctx.attrs["equation"]), [tuple(x.shape) for x in xs])
    free = [c for c in string.ascii_letters if c not in b.canonical]
    return tuple(_operand_grad(b, i, g, xs, free) if need else None
                 for i, need in enumerate(ctx.needs_input_grad))


def _operand_grad(b, i: int, g: Tensor, xs, free: list) -> Tensor:
    """d(einsum)/d(operand i), contracted with ``g``: itself an einsum of ``g`` and the other
    operands. A repeated label of operand i (a diagonal) gets a fresh letter tied to the
    first by an identity matrix; a broadcast dim (size 1) is summed and restored as 1; a
    label only operand i holds is absent from the einsum and restored by ``expand``."""
    term, shape = b.inputs[i], b.shapes[i]
    terms = [b.output] + [t for k, t in enumerate(b.inputs) if k != i]
    operands = [g] + [_conj(x) for k, x in enumerate(xs) if k != i]
    fresh = iter(free)
    labels: list[str | None]  # None: a broadcast dim, summed
    labels, seen = [], set()
    for x, n in zip(term, shape):
        if n == 1 and b.sizes[x] != 1:
            labels.append(None)
            continue
        if x in seen:
            y = next(fresh, None)
            if y is None:
                raise RuntimeError(f"einsum(): no letter is left for the gradient of the "
                                   f"diagonal of operand {i} in '{b.canonical}'")
            from tessera.ops.creation import eye
            terms.append(x + y)
            operands.append(eye(b.sizes[x], dtype=g.dtype, device=g.device))
            labels.append(y)
        else:
            seen.add(x)
            labels.append(x)
    # labels some operand of the gradient einsum holds at full size (not broadcast)
    have = set(b.output).union(*terms[len(xs):])  # g's labels, the identity matrices'
    for k, (t, n) in enumerate(zip(b.inputs, b.shapes)):
        if k != i:
            have.update(x for x, m in zip(t, n) if m == b.sizes[x])
    kept = "".join(y for y in labels if y is not None and y in have)
    r = _einsum(",".join(terms) + "->" + kept, operands)
    if len(kept) != len(term):
        r = r.reshape(tuple(n if y is not None and y in have else 1
                            for y, n in zip(labels, shape)))
        if any(y is not None and y not in have for y in labels):
            r = r.expand(*shape)
    return r


def _bound_operands(arrays, equation: str, shape, expand, dtype_of) -> tuple:
    """(canonical equation, the operands with their broadcast size-1 dims expanded): the
    compilers' einsums want every label one size."""
    b = bind(parse(equation), [shape(x) for x in arrays])
    if any(dtype_of(x) in ("bool", "complex64", "complex128") for x in arrays):
        raise NotImplementedError("einsum of bool or complex operands")
    xs = [x if tuple(shape(x)) == tuple(b.sizes[c] for c in t)
          else expand(x, tuple(b.sizes[c] for c in t)) for x, t in zip(arrays, b.inputs)]
    return b.canonical, xs


def _to_jax(jnp, lax, a, at):
    eq, xs = _bound_operands(a, at["equation"], lambda x: x.shape, jnp.broadcast_to,
                             lambda x: str(x.dtype))
    return jnp.einsum(eq, *xs, precision=lax.Precision.HIGHEST)


def _to_relax(R, a, at):
    eq, xs = _bound_operands(a, at["equation"], R.shape, R.broadcast_to, R.dtype)
    return R.einsum(xs, eq)


_EINSUM = defop("einsum", _infer, _kernel, grad=_grad, sbp=einsum_sbp, cost=einsum_cost,
                to_jax=_to_jax, to_relax=_to_relax)


# ---- the public functions ---------------------------------------------------------------

def _arguments(args: tuple) -> tuple[str, list]:
    """(equation, operands) from ``(equation, *operands)``, ``(equation, [operands])`` or
    the sublist form ``(op0, sub0, op1, sub1, ..., [out])``."""
    if not args:
        raise ValueError(_NO_OPERAND)
    first = args[0]
    if isinstance(first, str):
        ops: tuple | list = args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = ops[0]
        return first, list(ops)
    if len(args) >= 2 and isinstance(args[1], (list, tuple)):
        return from_sublists(args)
    raise TypeError(f"einsum(): argument 'equation' (position 1) must be str, not "
                    f"{type(first).__name__}")


@lru_cache(maxsize=4096)
def _plan(equation: str, shapes: tuple) -> tuple[str, tuple]:
    """The canonical equation and the chosen path for these shapes."""
    b = bind(parse(equation), shapes)
    return b.canonical, tuple(_path.choose(_lower.contracted(b), b.output, b.sizes))


def _einsum(equation: str, operands) -> Tensor:
    if not operands:
        raise ValueError(_NO_OPERAND)
    for i, t in enumerate(operands):
        if not isinstance(t, Tensor):
            raise TypeError(f"einsum(): expected Tensor as element {i} in argument 1, but got "
                            f"{type(t).__name__}")
    canonical, path = _plan(equation, tuple(t._shape for t in operands))
    return dispatch(_EINSUM, *operands, equation=canonical, path=path)


def einsum(*args) -> Tensor:
    """Einstein summation: ``tessera.einsum(equation, *operands)``.

    The equation names each operand's dims with letters (``a-z``, ``A-Z``); a letter shared
    by operands is multiplied along, a letter missing from the output is summed over.
    ``->`` gives the output explicitly; without it the output is every letter that appears
    once, in alphabetical order. ``...`` stands for any number of leading (or middle) dims,
    which broadcast like elementwise ops; a dim of size 1 broadcasts against any size. A
    letter repeated in one operand takes its diagonal. Also accepted: the operands as one
    list, and the sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``.

    With three or more operands the contraction order is chosen to minimise FLOPs (see
    ``tessera.einsum_path``); every pairwise step is one batched matrix product.

    >>> import tessera
    >>> a = tessera.arange(6.).reshape(2, 3)
    >>> b = tessera.arange(12.).reshape(3, 4)
    >>> tessera.einsum("ij,jk->ik", a, b)
    tensor([[20., 23., 26., 29.],
            [56., 68., 80., 92.]])
    >>> tessera.einsum("ii", tessera.eye(3))       # trace
    tensor(3.)
    >>> tessera.einsum("i,j", tessera.ones(2), tessera.arange(3.))   # outer product
    tensor([[0., 1., 2.],
            [0., 1., 2.]])
    >>> tessera.einsum("...ij->...ji", tessera.ones(5, 2, 3)).shape
    tessera.Size([5, 3, 2])
    >>> tessera.einsum(a, [0, 1], b, [1, 2], [0, 2]).shape    # sublist form
    tessera.Size([2, 4])
    >>> tessera.einsum("ij,jk->ik", a, a)
    Traceback (most recent call last):
    ...
    RuntimeError: einsum(): subscript j has size 2 for operand 1 which does not broadcast with ...
      ij,jk->ik
         ^
    """
    equation, operands = _arguments(args)
    return _einsum(equation, operands)


def einsum_path(*args) -> tuple[list, _path.PathInfo]:
    """The contraction path ``tessera.einsum`` takes for these operands, and a report.

    Returns ``(path, info)``: ``path`` is a list of pairs in ``numpy.einsum_path``'s
    format (contract the two operands at these positions, append the result); ``info``
    holds the naive and optimised FLOP counts, the largest intermediate and each step,
    and prints as a table. Only shapes are read, so meta tensors will do.

    >>> import tessera
    >>> a = tessera.empty(10, 1000, device="meta")
    >>> b = tessera.empty(1000, 10, device="meta")
    >>> c = tessera.empty(10, 1000, device="meta")
    >>> path, info = tessera.einsum_path("ab,bc,cd->ad", a, b, c)
    >>> path
    [(0, 1), (0, 1)]
    >>> info.opt_flops, info.naive_flops
    (400000, 300000000)
    >>> print(info)   # doctest: +ELLIPSIS
      Complete contraction:  ab,bc,cd->ad
    ...
    0       (0, 1)    ab,bc->ac                      2.000e+05
    1       (0, 1)    cd,ac->ad                      2.000e+05
    """
    equation, operands = _arguments(args)
    if not operands:
        raise ValueError(_NO_OPERAND)
    shapes = tuple(tuple(t.shape) for t in operands)
    canonical, path = _plan(equation, shapes)
    b = bind(parse(canonical), shapes)
    info = _path.describe(list(b.reduced()), b.output, b.sizes, list(path), canonical)
    return list(path), info
