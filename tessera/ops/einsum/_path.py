"""Contraction paths: the order in which einsum contracts its operands two at a time.

A path is a list of pairs in ``opt_einsum``'s (and ``numpy.einsum_path``'s) format: each
pair ``(i, j)`` names two of the current operands, which are removed and their contraction
appended at the end. Operands are strings of labels (one letter per distinct dim).

The cost of a step is ``opt_einsum``'s: the product of the sizes of every label of the two
operands, times 2 when some label is summed away by the step (a multiply and an add per
term), else 1. ``optimal`` is an exact dynamic programme over subsets of operands (every
binary contraction tree, outer products included: O(3^n)); ``greedy`` repeatedly
contracts the pair that shrinks the data most. ``choose`` uses the first for up to
``DP_LIMIT`` operands.

>>> optimal(["ab", "bc", "cd"], "ad", {"a": 10, "b": 1000, "c": 10, "d": 1000})
[(0, 1), (0, 1)]
>>> describe(["ab", "bc", "cd"], "ad", {"a": 10, "b": 1000, "c": 10, "d": 1000},
...          [(0, 1), (0, 1)]).opt_flops
400000
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache

__all__ = ["DP_LIMIT", "flop_count", "optimal", "greedy", "choose", "describe", "PathInfo"]

DP_LIMIT = 9   # 3^9 ~ 20k subset splits, a few ms; one more operand triples it


def _size(labels, sizes) -> int:
    return math.prod(sizes[x] for x in labels)


def flop_count(labels, inner: bool, num_terms: int, sizes) -> int:
    """``opt_einsum.helpers.flop_count``: one term per combination of ``labels``, times
    ``num_terms - 1`` multiplies, plus one add when a label is summed."""
    return _size(labels, sizes) * (max(1, num_terms - 1) + bool(inner))


def _step(a: str, b: str, rest: list[str], output: str, sizes) -> tuple[str, int]:
    """The labels of ``a`` contracted with ``b`` (those still needed) and the step's cost."""
    keep = set(output).union(*rest) if rest else set(output)
    both = dict.fromkeys(a + b)
    res = "".join([x for x in output if x in both] +
                  [x for x in both if x in keep and x not in output])
    return res, flop_count(both, len(res) < len(both), 2, sizes)


# ---- exact: dynamic programming over subsets ----------------------------------------------

def optimal(inputs: list[str], output: str, sizes) -> list[tuple[int, int]]:
    """The path of least total cost (ties: the smaller largest intermediate)."""
    return list(_optimal(tuple(inputs), output, tuple(sorted(sizes.items()))))


@lru_cache(maxsize=256)
def _optimal(inputs: tuple, output: str, size_items: tuple) -> tuple:
    n = len(inputs)
    if n < 2:
        return ()
    res, size_of = _subset_tables(inputs, output, dict(size_items))
    # best[s] = (cost, largest intermediate, (half, other half)) of contracting subset s
    best: dict[int, tuple] = {1 << i: (0, 0, None) for i in range(n)}
    for s in sorted(range(1, 1 << n), key=int.bit_count):
        if s & (s - 1) == 0:
            continue
        rs, top = res[s], None
        low = s & -s
        sub = (s - 1) & s
        while sub:
            if sub & low:  # each split once: the half holding the lowest operand
                other = s ^ sub
                b1, b2 = best[sub], best[other]
                both = res[sub] | res[other]
                cand = (b1[0] + b2[0] + size_of(both) * (2 if both != rs else 1),
                        max(b1[1], b2[1], size_of(rs)))
                if top is None or cand < top[:2]:
                    top = (cand[0], cand[1], (sub, other))
            sub = (sub - 1) & s
        assert top is not None  # a subset of two or more operands has a split
        best[s] = top
    return tuple(_tree_path(best, n))


def _subset_tables(inputs: tuple, output: str, sizes: dict):
    """``res[s]``: the labels (a bit mask) of the contraction of operand subset ``s`` (those
    of its operands the output or an operand outside ``s`` needs; a single operand enters
    whole); ``size_of(mask)``: the product of those labels' sizes."""
    n = len(inputs)
    labels = sorted(set("".join(inputs)) | set(output))
    bit = {x: 1 << k for k, x in enumerate(labels)}
    lsize = [sizes[x] for x in labels]
    masks = [sum(bit[x] for x in set(s)) for s in inputs]
    out_mask = sum(bit[x] for x in set(output))
    full = (1 << n) - 1
    union = [0] * (1 << n)
    for s in range(1, 1 << n):
        low = s & -s
        union[s] = union[s ^ low] | masks[low.bit_length() - 1]
    res = [union[s] & (out_mask | union[full ^ s]) for s in range(1 << n)]
    for i in range(n):
        res[1 << i] = masks[i]

    @cache
    def size_of(m: int) -> int:
        return math.prod(lsize[k] for k in range(m.bit_length()) if m >> k & 1)
    return res, size_of


def _tree_path(best: dict, n: int) -> list[tuple[int, int]]:
    """The contraction tree in ``best`` as a path: post-order, each pair as positions in
    the shrinking list of operands."""
    current = [1 << i for i in range(n)]
    path = []

    def emit(s: int) -> None:
        split = best[s][2]
        if split is None:
            return
        emit(split[0])
        emit(split[1])
        i, j = sorted((current.index(split[0]), current.index(split[1])))
        path.append((i, j))
        del current[j], current[i]
        current.append(s)

    emit((1 << n) - 1)
    return path


# ---- beyond DP_LIMIT: greedy --------------------------------------------------------------

def greedy(inputs: list[str], output: str, sizes) -> list[tuple[int, int]]:
    """Repeatedly contract the pair whose result is smallest relative to its operands
    (``opt_einsum``'s greedy cost), preferring pairs that share a label; ties by cost."""
    ops = list(inputs)
    path = []
    while len(ops) > 1:
        best = None
        for i in range(len(ops)):
            for j in range(i + 1, len(ops)):
                rest = [ops[k] for k in range(len(ops)) if k != i and k != j]
                r, flops = _step(ops[i], ops[j], rest, output, sizes)
                shares = bool(set(ops[i]) & set(ops[j]))
                key = (not shares, _size(r, sizes) - _size(ops[i], sizes) -
                       _size(ops[j], sizes), flops)
                if best is None or key < best[0]:
                    best = (key, i, j, r)
        assert best is not None  # two or more operands make at least one pair
        _, i, j, r = best
        path.append((i, j))
        del ops[j], ops[i]
        ops.append(r)
    return path


def choose(inputs: list[str], output: str, sizes) -> list[tuple[int, int]]:
    """The exact optimum for up to ``DP_LIMIT`` operands, the greedy path beyond."""
    if len(inputs) <= DP_LIMIT:
        return optimal(inputs, output, sizes)
    return greedy(inputs, output, sizes)


# ---- the report ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PathInfo:
    """What ``tessera.einsum_path`` reports: the path, its cost against the naive single
    loop nest, and each step. ``str()`` prints it as a table."""

    equation: str
    path: list
    steps: list             # (pair, step equation, flops) per contraction
    naive_flops: int
    opt_flops: int
    largest_intermediate: int
    naive_scaling: int
    opt_scaling: int

    @property
    def speedup(self) -> float:
        return self.naive_flops / max(self.opt_flops, 1)

    def __str__(self) -> str:
        lines = [f"  Complete contraction:  {self.equation}",
                 f"         Naive scaling:  {self.naive_scaling}",
                 f"     Optimized scaling:  {self.opt_scaling}",
                 f"      Naive FLOP count:  {self.naive_flops:.3e}",
                 f"  Optimized FLOP count:  {self.opt_flops:.3e}",
                 f"   Theoretical speedup:  {self.speedup:.3f}",
                 f"  Largest intermediate:  {self.largest_intermediate:.3e} elements",
                 "-" * 60,
                 f"{'step':<8}{'pair':<10}{'contraction':<28}{'FLOPs':>12}",
                 "-" * 60]
        for k, (pair, eq, flops) in enumerate(self.steps):
            lines.append(f"{k:<8}{str(pair):<10}{eq:<28}{flops:>12.3e}")
        return "\n".join(lines)


def describe(inputs: list[str], output: str, sizes, path, equation: str = "") -> PathInfo:
    """Cost of ``path`` and its steps (``opt_einsum.contract_path``'s accounting)."""
    ops = list(inputs)
    steps, total, largest, scaling = [], 0, 0, 0
    for i, j in path:
        rest = [ops[k] for k in range(len(ops)) if k != i and k != j]
        r, flops = _step(ops[i], ops[j], rest, output, sizes)
        steps.append(((i, j), f"{ops[i]},{ops[j]}->{r}", flops))
        total += flops
        largest = max(largest, _size(r, sizes))
        scaling = max(scaling, len(set(ops[i] + ops[j])))
        del ops[j], ops[i]
        ops.append(r)
    every = set("".join(inputs))
    inner = sum(len(set(s)) for s in inputs) > len(every)  # as opt_einsum counts it
    naive = flop_count(every, inner, len(inputs), sizes)
    if not path:  # one operand: its own reduction is the whole cost
        total = naive
        largest = _size(output, sizes)
        scaling = len(every)
    return PathInfo(equation or ",".join(inputs) + "->" + output, list(path), steps, naive,
                    total, largest, len(every), scaling)
