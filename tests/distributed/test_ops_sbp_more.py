"""The SBP sweep (``test_ops_sbp``) over the scans, sorting and selection, gather/scatter and
index ops, shape ops, padding, resampling, patches, prelu, binary cross-entropy and norms:
every combination of the inputs' SBPs on 2 ranks equals the single-process run, forward
and input gradients."""
import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tests.distributed._helpers import B, S
from tests.distributed.test_ops_sbp import _sweep

rng = np.random.default_rng(1)


def _i(high, *shape):
    """Integer indices in [0, high)."""
    return ("i", high) + shape


def _inputs(shapes):
    out = []
    for s in shapes:
        if isinstance(s, np.ndarray):
            out.append(s)
        elif s[0] == "i":
            out.append(rng.integers(0, s[1], s[2:]))
        else:
            out.append(rng.standard_normal(s))
    return out


_IDX3 = np.array([3, 0, 2])  # distinct (index_copy's writes do not collide)

def _setitem(x, i, v):
    y = x * 1
    y[:, i] = v
    return y


CASES = {
    "cumsum": (lambda a: a.cumsum(1), [(5, 4)]),
    "cumprod": (lambda a: a.cumprod(0), [(5, 4)]),
    "cummax_cummin": (lambda a: a.cummax(1).values + a.cummin(0).values, [(5, 4)]),
    "flip": (lambda a: a.flip(0, 2), [(2, 5, 3)]),
    "roll": (lambda a: a.roll(2, 1) + a.roll(3), [(5, 4)]),
    "tril_triu": (lambda a: a.tril() + a.triu(1) * 2, [(2, 5, 4)]),
    "diagonal": (lambda a: a.diagonal(1, 0, 2), [(4, 3, 5)]),
    "diag_embed": (lambda a: tessera.diag_embed(a, 1), [(3, 4)]),
    "sort": (lambda a: a.sort(1).values + a.sort(0, descending=True).values, [(5, 4)]),
    "topk": (lambda a: a.topk(2, dim=0).values, [(5, 4)]),
    "kthvalue": (lambda a: a.kthvalue(2, 1).values, [(5, 4)]),
    "median_dim": (lambda a: a.median(0).values + a.nanmedian(1, keepdim=True).values.sum(),
                   [(5, 4)]),
    "mode": (lambda a: a.round().mode(1).values, [(5, 4)]),
    "median": (lambda a: a.median() + a.nanmedian(), [(5, 4)]),
    "aminmax": (lambda a: tessera.aminmax(a, dim=1).min * tessera.aminmax(a, dim=1).max,
                [(5, 4)]),
    "quantile": (lambda a: a.quantile(0.3, dim=1) + tessera.nanquantile(a, 0.5, 0, True).sum(),
                 [(5, 4)]),
    "quantile_q_tensor": (lambda a, q: a.quantile(q.sigmoid(), dim=0, keepdim=True),
                          [(5, 4), (3,)]),
    "index": (lambda x, i: x[i] + x[:, i[0]].sum(), [(5, 4), _i(4, 3, 2)]),
    "index_two_apart": (lambda x, i, j: x[i, :, j], [(4, 3, 5), _i(4, 2, 1), _i(5, 3)]),
    "index_put": (lambda x, i, v: x.index_put((i,), v) + x.index_put((i,), v, accumulate=True),
                  [(5, 4), _i(5, 3), (3, 4)]),
    "index_put_middle": (lambda x, i, v: x.index_put((i[None, :],), v.sum(), True)
                         + x[:, i].sum(), [(5, 4), _i(5, 3), (4,)]),
    "setitem": (lambda x, i, v: _setitem(x, i, v), [(5, 4), _i(4, 2), (5, 1)]),
    "embedding_max_norm": (lambda i, w: F.embedding(i, w * 1, max_norm=1.0),
                           [_i(6, 5, 3), (6, 4)]),
    "take": (lambda x, i: tessera.take(x, i), [(5, 4), _i(20, 3, 2)]),
    "put": (lambda x, i, s: x.put(i, s) + x.put(i, s, accumulate=True),
            [(5, 4), _i(20, 3, 2), (3, 2)]),
    "searchsorted": (lambda s, v: tessera.searchsorted(s.cumsum(0), v) * v + s.sum(),
                     [(5,), (3, 4)]),
    "searchsorted_batched": (lambda s, v: tessera.searchsorted(s.sort(1).values, v) * v + s,
                             [(3, 5), (3, 5)]),
    "norm": (lambda a: a.norm(dim=1), [(5, 4)]),
    "norm1": (lambda a: a.norm(p=1, dim=0), [(5, 4)]),
    "norm_all": (lambda a: a.norm(), [(5, 4)]),
    "vdot": (lambda a, b: tessera.vdot(a, b), [(5,), (5,)]),
    "gather": (lambda x, i: tessera.gather(x, 1, i), [(5, 4), _i(4, 5, 3)]),
    "gather_rows": (lambda x, i: tessera.gather(x, 0, i), [(5, 4), _i(5, 3, 4)]),
    "scatter": (lambda x, i, s: x.scatter(1, i, s), [(5, 4), _i(4, 5, 2), (5, 2)]),
    "scatter_value": (lambda x, i: x.scatter(1, i, 2.0), [(5, 4), _i(4, 5, 2)]),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), [(4, 5), _i(4, 6, 5), (6, 5)]),
    "scatter_reduce": (lambda x, i, s: x.scatter_reduce(1, i, s, "amax") +
                       x.scatter_reduce(1, i, s, "mean", include_self=False),
                       [(5, 4), _i(4, 5, 3), (5, 3)]),
    "index_select": (lambda x, i: x.index_select(0, i) * 2 + x.index_select(1, i[:2]).sum(),
                     [(5, 4), _i(4, 3)]),
    "index_add": (lambda x, i, s: x.index_add(1, i, s, alpha=2), [(5, 4), _i(4, 3), (5, 3)]),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s), [(4, 3), _IDX3, (3, 3)]),
    "index_fill": (lambda x, i: x.index_fill(1, i, -1.5), [(5, 4), _i(4, 2)]),
    "repeat": (lambda a: a.repeat(2, 1, 2), [(5, 4)]),
    "unfold": (lambda a: a.unfold(1, 2, 1), [(5, 4)]),
    "pad_reflect": (lambda a: F.pad(a, (1, 2), mode="reflect"), [(3, 2, 5)]),
    "pad_constant": (lambda a: F.pad(a, (1, 1, 0, 0)) + F.pad(a, (0, 0, 1, 1), value=1.5)
                     .sum(), [(5, 4)]),
    "interpolate": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear") +
                    F.interpolate(x, size=(8, 8)), [(3, 2, 4, 4)]),
    "im2col_col2im": (lambda x: F.fold(F.unfold(x, 2) * 2, (4, 4), 2), [(3, 2, 4, 4)]),
    "prelu": (lambda x, w: F.prelu(x, w), [(3, 4, 2), (4,)]),
    "prelu_scalar_weight": (lambda x, w: F.prelu(x, w), [(3, 4), (1,)]),
    # ("mean" builds its lengths tensor with tessera.tensor(device=), not yet global)
    "ctc_loss_sum": (lambda x, t: F.ctc_loss(x.log_softmax(2), t + 1, [6, 5, 6, 4],
                                             [3, 2, 1, 2], reduction="sum"),
                     [(6, 4, 5), _i(4, 4, 3)]),
    "ctc_loss_none": (lambda x, t: F.ctc_loss(x.log_softmax(2), t + 1, [6, 5, 6], [3, 2, 0],
                                              reduction="none"), [(6, 3, 5), _i(4, 3, 3)]),
    "bce_mean": (lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid()),
                 [(5, 4), (5, 4)]),
    "bce_sum_weighted": (lambda a, b, w: F.binary_cross_entropy(
        a.sigmoid(), b.sigmoid(), w, reduction="sum"), [(5, 4), (5, 4), (4,)]),
    "bce_none": (lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(),
                                                     reduction="none"), [(5, 4), (5, 4)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_on_every_sbp_combination(name):
    fn, shapes = CASES[name]
    seen = _sweep(fn, _inputs(shapes), 2)
    assert seen[0] == seen[1]


@pytest.mark.parametrize("name", ["cumsum", "sort", "gather", "index_add", "pad_reflect",
                                  "interpolate", "bce_mean", "norm1"])
def test_uneven_splits_on_three_ranks(name):
    fn, shapes = CASES[name]
    arrays = _inputs(shapes)
    combos = [tuple(S(0) if a.ndim else B for a in arrays),
              tuple(S(a.ndim - 1) for a in arrays)]
    _sweep(fn, arrays, 3, combos)
