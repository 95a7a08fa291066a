"""einsum's sbp and cost rules, called directly.

The SBP rule is checked by simulation: for every signature it lists, the inputs are cut into
two tiles as the signature says (split: ``np.array_split`` along the dim, as OneFlow splits
unevenly; broadcast: whole; partial_sum: two random summands), the op runs on each rank's
tiles, and the outputs reassembled by the output SBP must equal the einsum of the whole.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera._dispatch import dispatch
from tessera.ops.cost import Cost, cost_of
from tessera.ops.registry import REGISTRY, Meta
from tessera.sbp import broadcast, partial_sum, split

OP = REGISTRY["einsum"]
RANKS = 2

CASES = [
    ("ij,jk->ik", [(4, 3), (3, 5)]),
    ("bij,bjk->bik", [(3, 2, 4), (3, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 3, 5)]),
    ("ab,bc,cd->ad", [(3, 4), (4, 5), (5, 2)]),
    ("ij,j->i", [(3, 4), (1,)]),
    ("ii->i", [(3, 3)]),
    ("iij,jk->ik", [(2, 2, 3), (3, 4)]),
    ("ij->", [(5, 2)]),
    ("i,j->ij", [(3,), (2,)]),
    ("...ij,...jk", [(2, 1, 2, 3), (3, 3, 2)]),
]


def _attrs(eq, arrays):
    from tessera.ops.einsum import _plan
    canonical, path = _plan(eq, tuple(a.shape for a in arrays))
    return {"equation": canonical, "path": path}


def _tiles(rng, a: np.ndarray, s) -> list[np.ndarray]:
    if s == broadcast:
        return [a] * RANKS
    if s == partial_sum:
        parts = [rng.standard_normal(a.shape) for _ in range(RANKS - 1)]
        return parts + [a - sum(parts)]
    return np.array_split(a, RANKS, axis=s.dim)


def _run(arrays, attrs):
    return dispatch(OP, *map(tessera.from_numpy, arrays), **attrs).numpy()


@pytest.mark.parametrize("eq,shapes", CASES, ids=[c[0] for c in CASES])
def test_every_signature_computes_the_einsum(eq, shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    attrs = _attrs(eq, arrays)
    metas = [Meta(a.shape, tessera.float64) for a in arrays]
    whole = _run(arrays, attrs)
    sigs = OP.sbp(*metas, **attrs)
    assert sigs, eq
    for sig in sigs:
        assert len(sig.ins) == len(arrays) and len(sig.outs) == 1
        tiles = [_tiles(rng, a, s) for a, s in zip(arrays, sig.ins)]
        outs = [_run([t[r] for t in tiles], attrs) for r in range(RANKS)]
        (out_sbp,) = sig.outs
        if out_sbp == partial_sum:
            got = sum(outs)
        elif out_sbp == broadcast:
            got = outs[0]
            np.testing.assert_allclose(outs[1], got)
        else:
            got = np.concatenate(outs, axis=out_sbp.dim)
        np.testing.assert_allclose(got, whole, rtol=1e-10, atol=1e-10, err_msg=str(sig))


def test_signatures_of_matmul():
    m = Meta((4, 3), tessera.float32), Meta((3, 2), tessera.float32)
    sigs = OP.sbp(*m, equation="ij,jk->ik", path=((0, 1),))
    S, B, P = split, broadcast, partial_sum
    assert [(s.ins, s.outs) for s in sigs] == [
        ((S(0), B), (S(0),)),        # split on i, kept: output split on its dim
        ((S(1), S(0)), (P,)),        # split on j, contracted: partial sums
        ((B, S(1)), (S(1),)),
        ((B, B), (B,)),
        ((P, B), (P,)), ((B, P), (P,)),  # linear in each operand
    ]
    assert str(sigs[1]) == "(S(1), S(0)) -> (P)"
    assert OP.sbp.shape_attrs == ()


def test_no_split_on_a_diagonal_or_a_broadcast_dim():
    sigs = OP.sbp(Meta((3, 3, 2), tessera.float32), equation="iij->j", path=())
    assert all(s.ins[0] in (broadcast, partial_sum, split(2)) for s in sigs)
    sigs = OP.sbp(Meta((3, 4), tessera.float32), Meta((1,), tessera.float32),
                  equation="ij,j->i", path=((0, 1),))
    j = next(s for s in sigs if s.ins[0] == split(1))
    assert j.ins[1] == broadcast and j.outs == (partial_sum,)


def test_cost_of_a_matmul():
    m = Meta((4, 3), tessera.float32), Meta((3, 5), tessera.float32)
    cost = cost_of(OP, *m, equation="ij,jk->ik", path=((0, 1),))
    assert cost == Cost(flops=2 * 4 * 3 * 5, bytes_read=4 * (12 + 15), bytes_written=4 * 20)


def test_cost_of_a_chain_counts_intermediates():
    m = [Meta(s, tessera.float64) for s in [(10, 1000), (1000, 10), (10, 1000)]]
    good = cost_of(OP, *m, equation="ab,bc,cd->ad", path=((0, 1), (0, 1)))
    bad = cost_of(OP, *m, equation="ab,bc,cd->ad", path=((1, 2), (0, 1)))
    assert good.flops == 400_000 and bad.flops == 40_000_000
    # inputs, the 10x10 intermediate written and read (both inside the op), the 10x1000 output
    assert good.bytes_read == 8 * (30_000 + 2 * 100) and good.bytes_written == 8 * 10_000
    assert bad.bytes_read > good.bytes_read


def test_cost_of_one_operand():
    cost = cost_of(OP, Meta((3, 3), tessera.float32), equation="ii->", path=())
    assert (cost.bytes_read, cost.bytes_written) == (4 * 9, 4 * 1)


# ---- on global tensors (simulated ranks) -------------------------------------------------

GLOBAL_CASES = [("ij,jk->ik", [(4, 3), (3, 5)]), ("bqd,bkd->bqk", [(2, 3, 4), (2, 5, 4)]),
                ("ab,bc,cd->ad", [(3, 4), (4, 2), (2, 3)]), ("ii->i", [(3, 3)]),
                ("ij,j->i", [(3, 4), (1,)])]


@pytest.mark.parametrize("eq,shapes", GLOBAL_CASES, ids=[c[0] for c in GLOBAL_CASES])
def test_global_tensors_on_every_sbp_combination(eq, shapes):
    """With every combination of input SBPs on 2 ranks, the forward value and the input
    gradients equal the single-process run (the op picks one of its signatures, boxing
    moves the inputs there; backward is einsums on global tensors too)."""
    import itertools

    from tessera.distributed.placement import placement
    from tests.distributed._helpers import B as BB, global_from, run, sbps_1d
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in shapes]
    xs = [tessera.tensor(a, requires_grad=True) for a in arrays]
    want = tessera.einsum(eq, *xs)
    w = np.linspace(-1, 1, want.numel()).reshape(tuple(want.shape))
    (want * tessera.tensor(w)).sum().backward()
    grads = [x.grad.numpy() for x in xs]

    def body():
        p = placement("cpu", [0, 1])
        for sbps in itertools.product(*[sbps_1d(a.ndim) for a in arrays]):
            gs = [global_from(a, p, (s,), requires_grad=True) for a, s in zip(arrays, sbps)]
            y = tessera.einsum(eq, *gs)
            msg = f"{eq} with {[s.short() for s in sbps]}"
            np.testing.assert_allclose(y.detach().numpy(), want.detach().numpy(), rtol=1e-10,
                                       atol=1e-12, err_msg=msg)
            (y * tessera.tensor(w).to_global(p, BB)).sum().backward()
            for x, g in zip(gs, grads):
                np.testing.assert_allclose(x.grad.numpy(), g, rtol=1e-10, atol=1e-12,
                                           err_msg="grad " + msg)
    run(2, body)
