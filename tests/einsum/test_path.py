"""Contraction paths: the DP's path is optimal (against a brute-force enumeration of every
contraction order), greedy paths are valid, costs are opt_einsum's, and einsum_path's
report."""
from __future__ import annotations

import itertools
import string

import numpy as np
import pytest

import tessera
from tessera.ops.einsum import _path
from tessera.ops.einsum._path import describe, greedy, optimal


def brute_force(inputs, output, sizes):
    """The least total cost over every sequence of pairwise contractions."""
    best = None

    def go(ops, cost):
        nonlocal best
        if len(ops) == 1:
            best = cost if best is None else min(best, cost)
            return
        for i, j in itertools.combinations(range(len(ops)), 2):
            rest = [ops[k] for k in range(len(ops)) if k not in (i, j)]
            res, flops = _path._step(ops[i], ops[j], rest, output, sizes)
            go(rest + [res], cost + flops)
    go(list(inputs), 0)
    return best


def random_network(rng, n_ops, n_labels=6):
    letters = string.ascii_lowercase[:n_labels]
    sizes = {x: int(rng.choice([1, 2, 3, 5, 8, 13])) for x in letters}
    inputs = ["".join(rng.choice(list(letters), size=rng.integers(0, 4), replace=False))
              for _ in range(n_ops)]
    used = sorted(set("".join(inputs)))
    output = "".join(x for x in used if rng.random() < 0.3)
    return inputs, output, sizes


@pytest.mark.parametrize("seed", range(40))
def test_dp_is_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    inputs, output, sizes = random_network(rng, int(rng.integers(2, 6)))
    path = optimal(inputs, output, sizes)
    assert describe(inputs, output, sizes, path).opt_flops == brute_force(inputs, output, sizes)


@pytest.mark.parametrize("seed", range(10))
def test_greedy_is_a_valid_path(seed):
    rng = np.random.default_rng(100 + seed)
    inputs, output, sizes = random_network(rng, int(rng.integers(2, 6)))
    path = greedy(inputs, output, sizes)
    assert len(path) == len(inputs) - 1
    greedy_cost = describe(inputs, output, sizes, path).opt_flops
    assert greedy_cost >= brute_force(inputs, output, sizes)


def test_order_matters_and_is_found():
    sizes = {"a": 100, "b": 2, "c": 100, "d": 2, "e": 100}
    inputs, output = ["ab", "bc", "cd", "de"], "ae"
    path = optimal(inputs, output, sizes)
    left_to_right = describe(inputs, output, sizes, [(0, 1), (0, 1), (0, 1)]).opt_flops
    assert describe(inputs, output, sizes, path).opt_flops < left_to_right / 2


def test_many_operands_use_greedy_and_stay_correct():
    n = _path.DP_LIMIT + 2
    rng = np.random.default_rng(0)
    letters = string.ascii_lowercase
    eq = ",".join(letters[k] + letters[k + 1] for k in range(n)) + f"->a{letters[n]}"
    arrays = [rng.standard_normal((3, 3)) for _ in range(n)]
    path, info = tessera.einsum_path(eq, *map(tessera.from_numpy, arrays))
    assert len(path) == n - 1
    ours = tessera.einsum(eq, *map(tessera.from_numpy, arrays)).numpy()
    np.testing.assert_allclose(ours, np.einsum(eq, *arrays, optimize=True), rtol=1e-9)


def test_costs_equal_opt_einsum():
    oe = pytest.importorskip("opt_einsum")
    rng = np.random.default_rng(1)
    for eq, shapes in [("ab,bc,cd,de,ef->af",
                        [(8, 64), (64, 2), (2, 128), (128, 4), (4, 32)]),
                       ("ea,fb,abcd,gc,hd->efgh", [(4, 8)] * 2 + [(8, 8, 8, 8)] + [(4, 8)] * 2),
                       ("ij,jk,kl,li->", [(5, 6), (6, 7), (7, 8), (8, 5)])]:
        arrays = [np.empty(s) for s in shapes]
        _, info = tessera.einsum_path(eq, *[tessera.empty(s, device="meta") for s in shapes])
        _, ref = oe.contract_path(eq, *arrays, optimize="optimal")
        assert info.opt_flops == ref.opt_cost, eq
        assert info.naive_flops == ref.naive_cost, eq
        assert info.largest_intermediate <= ref.largest_intermediate, eq
    _ = rng


def test_einsum_path_report():
    a, b, c = (tessera.empty(s, device="meta") for s in [(10, 1000), (1000, 10), (10, 1000)])
    path, info = tessera.einsum_path("ab,bc,cd->ad", a, b, c)
    assert path == [(0, 1), (0, 1)]
    assert info.naive_scaling == 4 and info.opt_scaling == 3
    assert info.largest_intermediate == 10 * 1000
    assert info.speedup == pytest.approx(300000000 / 400000)
    text = str(info)
    assert "Optimized FLOP count:  4.000e+05" in text and "ab,bc->ac" in text
    # one operand: no steps
    path, info = tessera.einsum_path("ii->", tessera.ones(3, 3))
    assert path == [] and info.opt_flops == info.naive_flops
    # the sublist form and a list of operands are accepted too
    assert tessera.einsum_path(a, [0, 1], b, [1, 2])[0] == [(0, 1)]
    assert tessera.einsum_path("ab,bc", [a, b])[0] == [(0, 1)]


def test_broadcast_dims_do_not_count():
    """A size-1 dim broadcasting against a larger one is not a dim of that operand."""
    a, v = tessera.empty(3, 4, device="meta"), tessera.empty(1, device="meta")
    _, info = tessera.einsum_path("ij,j->i", a, v)
    assert info.steps[0][1] == "ij,->i"
