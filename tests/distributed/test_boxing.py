"""Boxing: every (src, dst) SBP pair on 1-D meshes of 2 and 3 ranks (uneven splits) and
pairs of SBP tuples on a 2x2 mesh, each checked against the whole value."""
import numpy as np
import pytest

import tessera
from tessera.distributed import boxing
from tessera.distributed.comm import current
from tessera.distributed.global_tensor import local_index
from tessera.distributed.placement import placement
from tests.distributed._helpers import B, P, S, global_from, run, sbps_1d, sbps_nd

FULL = np.arange(35, dtype=np.float64).reshape(5, 7) * 0.5 - 3


def _check_tile(y, full, p, sbps):
    """The local tile of ``y`` is what ``sbps`` says (for P: the tiles add up, checked by
    gathering them all)."""
    rank = current().rank
    local = y.to_local().numpy()
    idx = local_index(full.shape, p, sbps, rank)
    if P not in sbps:
        np.testing.assert_allclose(local, full[idx])
    tiles = current().all_gather_object((idx, local))
    acc = np.zeros_like(full)
    seen = np.zeros(full.shape, bool)
    for i, t in tiles:
        if P in sbps:
            acc[i] += t
        else:
            acc[i] = t
            seen[i] = True
    if P in sbps:
        # each distinct tile appears once per rank that holds it (B axes); divide that out
        reps = int(np.prod([n for n, s in zip(p.hierarchy, sbps) if s == B]))
        np.testing.assert_allclose(acc / reps, full, atol=1e-12)
    else:
        assert seen.all()


@pytest.mark.parametrize("n", [2, 3])
def test_every_1d_pair(n):
    def fn():
        p = placement("cpu", list(range(n)))
        done = []
        for src in sbps_1d(2):
            for dst in sbps_1d(2):
                x = global_from(FULL, p, (src,))
                y = x.to_global(sbp=dst)
                assert y.sbp == (dst,) and y.shape == x.shape
                np.testing.assert_allclose(y.numpy(), FULL)
                _check_tile(y, FULL, p, (dst,))
                done.append((src.short(), dst.short()))
        return done
    res = run(n, fn)
    assert len(res[0]) == 16


def test_2d_mesh_pairs():
    def fn():
        p = placement("cpu", [[0, 1], [2, 3]])
        count = 0
        for src in sbps_nd(2, 2):
            for dst in [(S(0), S(1)), (S(0), S(0)), (B, S(1)), (S(1), B), (P, B), (B, P),
                        (B, B), (S(1), P), (P, S(0))]:
                x = global_from(FULL, p, src)
                y = x.to_global(sbp=dst)
                np.testing.assert_allclose(y.numpy(), FULL, atol=1e-12)
                _check_tile(y, FULL, p, dst)
                count += 1
        return count
    assert run(4, fn) == [144] * 4


def test_to_global_backward_boxes_the_gradient_back():
    W = np.linspace(-1, 1, 35).reshape(5, 7)

    def fn():
        p = placement("cpu", [0, 1])
        x = global_from(FULL, p, (S(0),), requires_grad=True)
        y = x.to_global(sbp=S(1))
        w = tessera.tensor(W).to_global(p, B)
        (y * w).sum().backward()
        return x.grad.sbp, x.grad.numpy()
    for sbp, g in run(2, fn):
        assert sbp == (S(0),)
        np.testing.assert_allclose(g, W)


def test_cost_ranks_conversions():
    n, nbytes = 4, 1000.0
    assert boxing.cost(S(0), S(0), nbytes, n) == 0
    assert boxing.cost(B, S(0), nbytes, n) < boxing.cost(S(0), S(1), nbytes, n) < \
        boxing.cost(S(0), B, nbytes, n) < boxing.cost(P, B, nbytes, n)
    assert boxing.cost(P, B, nbytes, n) == pytest.approx(2 * 3 / 4 * nbytes)  # ring


def test_unsupported_pair_names_it(monkeypatch):
    monkeypatch.delitem(boxing.BOXING, ("P", "S"))
    with pytest.raises(boxing.BoxingError, match=r"boxing P -> S\(1\) is not supported"):
        boxing.box_1d(FULL, FULL.shape, P, S(1), (0,), 0, current())


