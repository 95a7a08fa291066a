"""The op-info table machinery (STYLE.md rule 7).

An ``OpInfo`` names one op, a function ``fn(*args, **kwargs)`` that works unchanged on
tessera tensors and on torch tensors (methods, operators, or ``lib``-style calls through the
``L`` argument), and a sample generator. The generic tests in ``tests/ops`` run every
sample through both libraries and compare values, dtypes, shapes and gradients, run a
float64 numerical gradcheck, the meta device, and non-contiguous inputs.

Sample arguments are NumPy arrays (made tensors by the harness, float arrays requiring grad
when ``requires_grad`` says so) or plain Python values passed through as they are.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Sample:
    args: tuple
    kwargs: dict = field(default_factory=dict)
    # indices of args that require grad; None means every floating-point array
    grad_args: tuple[int, ...] | None = None
    name: str = ""

    def __repr__(self) -> str:
        def short(a):
            if isinstance(a, np.ndarray):
                return f"{a.dtype}{list(a.shape)}"
            return repr(a)
        parts = [short(a) for a in self.args] + [f"{k}={short(v)}" for k, v in self.kwargs.items()]
        return f"{self.name}(" + ", ".join(parts) + ")"


@dataclass
class OpInfo:
    """One entry of the table.

    fn(L, *args, **kwargs): L is the library module (``tessera`` or ``torch``).
    samples(rng, dtype) -> iterable of Sample.
    covers: registry op names this entry exercises (default: ``[name]``).
    """

    name: str
    fn: Callable[..., Any]
    samples: Callable[[np.random.Generator, np.dtype], Iterable[Sample]]
    dtypes: tuple = (np.float32, np.float64)
    covers: tuple[str, ...] = ()
    differentiable: bool = True
    gradcheck: bool = True          # float64 finite differences on tessera alone
    meta: bool = True               # run on the meta device and compare shapes/dtypes
    noncontiguous: bool = True      # also run with strided (non-contiguous) inputs
    atol: float = 1e-5
    rtol: float = 1.3e-6
    grad_atol: float = 1e-4
    grad_rtol: float = 1e-4
    # output positions compared only by shape/dtype (e.g. random or unordered results)
    skip_value_outputs: tuple[int, ...] = ()
    random: bool = False            # outputs depend on the RNG: compare shapes/dtypes only

    def covered_ops(self) -> tuple[str, ...]:
        return self.covers or (self.name,)


# ---- sample helpers -----------------------------------------------------------------------

def make(rng: np.random.Generator, shape, dtype=np.float32, low=-2.0, high=2.0) -> np.ndarray:
    """A random array: uniform in [low, high) for floats, integers in [low, high) otherwise."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else int(low)
        return rng.integers(lo, max(int(high), lo + 1), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def positive(rng, shape, dtype=np.float32, low=0.1, high=2.0):
    return make(rng, shape, dtype, low, high)


UNARY_SHAPES = [(), (1,), (5,), (3, 4), (2, 3, 4), (0, 3)]
BINARY_SHAPES = [((), ()), ((5,), (5,)), ((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)),
                 ((2, 3, 4), (3, 1)), ((), (3, 2)), ((0, 3), (1, 3))]


def unary_samples(low=-2.0, high=2.0, **kwargs):
    def gen(rng, dtype):
        for s in UNARY_SHAPES:
            yield Sample((make(rng, s, dtype, low, high),), dict(kwargs))
    return gen


def binary_samples(low=-2.0, high=2.0, rhs_low=None, rhs_high=None, scalars=(2.5, 3),
                   **kwargs):
    rl = low if rhs_low is None else rhs_low
    rh = high if rhs_high is None else rhs_high

    def gen(rng, dtype):
        for sa, sb in BINARY_SHAPES:
            yield Sample((make(rng, sa, dtype, low, high), make(rng, sb, dtype, rl, rh)),
                         dict(kwargs))
        for sc in scalars:
            yield Sample((make(rng, (3, 2), dtype, low, high), sc), dict(kwargs))
    return gen


def product(**axes):
    """Every combination of keyword values: ``product(dim=[0, 1], keepdim=[True, False])``."""
    keys = list(axes)
    for vals in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, vals))


# ---- the table ---------------------------------------------------------------------------

OP_DB: list[OpInfo] = []


def register(*infos: OpInfo) -> None:
    OP_DB.extend(infos)
