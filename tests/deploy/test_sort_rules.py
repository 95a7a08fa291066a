"""sort and argsort, max pooling's indices and nan_to_num in an exported library, each built
with -Werror and run through the C driver (one thread and two) against tessera eager and
PyTorch: stable order among ties, descending, NaN the largest, any dim; 1-d to 3-d max
pooling with ``return_indices=True`` (int64 positions, PyTorch's NaN and tie rule);
nan_to_num's defaults (the dtype's largest finite values) and given values."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import tessera
from tests.deploy.test_export import cycles
from tests.deploy.test_index_rules import LIB, NAN, Fns, _ints, check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

INF = float("inf")


def _sort(dim=-1, descending=False, part=None):
    """``sort`` (stable in both libraries) along dim, or one of its results."""
    def f(t, F, x, *rest):
        res = t.sort(x, dim=dim, descending=descending, stable=True)
        return res if part is None else res[part]
    return f


def test_sort_and_argsort(tmp_path):
    x = np.random.default_rng(11).standard_normal((3, 6, 7)).astype(np.float32)
    y = _ints(4, 9, seed=12)                    # many ties: a stable sort's indices are defined
    y[0, 3] = y[0, 5] = y[1, 0] = y[3, 8] = NAN
    y[2, 1], y[2, 4], y[3, 2] = INF, -INF, -0.0
    ids = np.random.default_rng(13).integers(-3, 3, (5, 6)).astype(np.int64)
    check(tmp_path, "sorts", [x, y, ids],
          _sort(-1, part=0), _sort(-1, part=1),
          _sort(1, True, part=0), _sort(1, True, part=1),
          _sort(0, part=1),
          lambda t, F, x, y, i: t.argsort(y, dim=1, stable=True),
          lambda t, F, x, y, i: t.argsort(y, dim=1, descending=True, stable=True),
          lambda t, F, x, y, i: t.sort(y, dim=0, stable=True)[0],
          lambda t, F, x, y, i: t.sort(y, dim=0, descending=True, stable=True)[1],
          lambda t, F, x, y, i: t.sort(i, dim=-1, stable=True)[1],
          lambda t, F, x, y, i: t.sort(i, dim=0, descending=True, stable=True)[0],
          lambda t, F, x, y, i: t.argsort(i, dim=0, stable=True),
          lambda t, F, x, y, i: t.msort(y),
          lambda t, F, x, y, i: t.sort(x[0, 0, 0], dim=0, stable=True)[1])


def _pool(nd, *args, part, **kwargs):
    def f(t, F, x):
        v = x[:, :, 0, 0] if nd == 1 else x[:, :, 0] if nd == 2 else x
        return getattr(F, f"max_pool{nd}d")(v, *args, return_indices=True, **kwargs)[part]
    return f


def test_max_pool_indices(tmp_path):
    x = _ints(2, 3, 5, 6, 7, hi=5, seed=14)    # ties: the first maximum's position
    x[0, 1, 2, 3, 4] = x[1, 0, 0, 0, 0] = x[1, 0, 0, 0, 1] = NAN   # the last NaN wins
    x[0, 0, 0, 0, 0], x[1, 2, 0, 0, 2] = INF, -INF
    x[0, 2, 0] = -INF                          # a window of -inf only: its first element
    fns = []
    for nd, args, kwargs in (
            (1, (3,), dict(stride=2, padding=1)), (1, (2,), dict(ceil_mode=True)),
            (1, (3,), dict(stride=1, padding=1, dilation=2)),
            (2, (2,), {}), (2, ((3, 2),), dict(stride=(2, 1), padding=(1, 1))),
            (2, (3,), dict(stride=2, padding=1, dilation=2, ceil_mode=True)),
            (3, (2,), {}), (3, ((2, 3, 2),), dict(stride=(1, 2, 2), padding=(1, 1, 0),
                                                   ceil_mode=True)),
            (3, (2,), dict(dilation=(1, 2, 1)))):
        fns += [_pool(nd, *args, part=0, **kwargs), _pool(nd, *args, part=1, **kwargs)]
    check(tmp_path, "pooli", [x], *fns)


def test_nan_to_num(tmp_path):
    x = np.random.default_rng(15).standard_normal((4, 9)).astype(np.float32) * 1e3
    x[0, :4] = [NAN, INF, -INF, 0.0]
    x[2, 5], x[3, 8] = INF, NAN
    ids = np.arange(-3, 3, dtype=np.int64)
    check(tmp_path, "nan2num", [x, ids],
          lambda t, F, x, i: t.nan_to_num(x),
          lambda t, F, x, i: x.nan_to_num(nan=1.5, posinf=2.0, neginf=-7.0),
          lambda t, F, x, i: t.nan_to_num(x.log(), neginf=-100.0) * 2,
          lambda t, F, x, i: t.nan_to_num(x.exp() - x.exp(), nan=-1.0),
          lambda t, F, x, i: t.nan_to_num(i))


def test_split_over_threads(tmp_path):
    """Inputs big enough for each rule to share its rows out over the threads."""
    x = np.random.default_rng(16).standard_normal((4, 16, 48, 64)).astype(np.float32)
    x[0, 0, 0, :8] = NAN
    out = check(tmp_path, "bigsort", [x],
                lambda t, F, x: t.sort(x, dim=-1, stable=True)[0],
                lambda t, F, x: t.sort(x, dim=2, descending=True, stable=True)[1],
                lambda t, F, x: F.max_pool2d(x, 3, 2, 1, return_indices=True)[1],
                lambda t, F, x: F.max_pool3d(x[None], 2, return_indices=True)[0])
    text = (out / f"{LIB}.c").read_text()
    for helper in ("tsr_sort_asc_float32", "tsr_sort_desc_float32", "tsr_maxpool_indices"):
        assert f"tsr_pool_run({helper}" in text, helper


def test_sanitizers(tmp_path):
    """The rules' C under ASan and UBSan: load/run/free cycles on zeros, one thread and
    two."""
    model = Fns(lambda t, F, x: t.sort(x, -1)[1],
                lambda t, F, x: t.sort(x, 0, descending=True)[0],
                lambda t, F, x: F.max_pool1d(x, 2, return_indices=True)[1],
                lambda t, F, x: F.max_pool3d(x[None], 2, padding=1, return_indices=True)[0],
                lambda t, F, x: t.nan_to_num(x.log())).eval()
    cycles(tmp_path, {"model": (model, (tessera.randn(2, 4, 6),))}, 20)
