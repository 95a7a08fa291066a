"""Reductions and movements in an exported library, each built with -Werror and run through
the C driver (one thread and two) against tessera eager and PyTorch; and the prelude's
exponentials on NaN under UBSan."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import tessera
from tests.deploy.test_export import cycles
from tests.deploy.test_index_rules import Fns, _ints, check

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

NAN, INF = float("nan"), float("inf")


def test_exponentials_of_nan_under_ubsan(tmp_path):
    """A NaN's bits reach the power-of-two step of every exponential: its shift must be
    defined (the inputs are zeros: 0 / 0 is the NaN)."""
    def nan(x):
        return x / x
    model = Fns(lambda t, F, x: nan(x).exp(),
                lambda t, F, x: nan(x).expm1(),
                lambda t, F, x: nan(x).sigmoid(),
                lambda t, F, x: nan(x).tanh(),
                lambda t, F, x: F.gelu(nan(x)),
                lambda t, F, x: nan(x).double().exp().float(),
                lambda t, F, x: nan(x).double().expm1().float(),
                lambda t, F, x: nan(x).double().sigmoid().float()).eval()   # (8 outputs)
    cycles(tmp_path, {"model": (model, (tessera.randn(3, 8),))}, 2)


def test_sanitizers(tmp_path):
    """The rules' C under ASan and UBSan: load/run/free cycles on zeros, one thread and
    two."""
    model = Fns(lambda t, F, x: x.repeat(2, 1, 3), lambda t, F, x: x.roll((1, -2), (0, 2)),
                lambda t, F, x: F.adaptive_max_pool2d(x[None], (3, 4), return_indices=True)[1],
                lambda t, F, x: t.aminmax(x, dim=1)[1], lambda t, F, x: x.var(1),
                lambda t, F, x: t.logsumexp(x.log(), 0), lambda t, F, x: x.round(decimals=1),
                lambda t, F, x: F.rms_norm(x, (6,))).eval()
    cycles(tmp_path, {"model": (model, (tessera.randn(2, 4, 6),))}, 20)


def test_whole_max_min(tmp_path):
    x = np.random.default_rng(21).standard_normal((3, 4, 5)).astype(np.float32)
    y = x.copy()
    y[1, 2, 3] = NAN
    check(tmp_path, "whole", [x, y],
          lambda t, F, x, y: x.max(), lambda t, F, x, y: x.min(),
          lambda t, F, x, y: y.max(), lambda t, F, x, y: t.min(y),
          lambda t, F, x, y: (x * 2).max() + 1, lambda t, F, x, y: t.amax(x, (0, 2)),
          lambda t, F, x, y: t.amin(y, -1, keepdim=True))


def test_var_std(tmp_path):
    x = (np.random.default_rng(22).standard_normal((3, 4, 5)) * 3 + 100).astype(np.float32)
    one = np.random.default_rng(23).standard_normal((4, 1)).astype(np.float32)
    check(tmp_path, "var", [x, one],
          lambda t, F, x, o: x.var(), lambda t, F, x, o: x.std(),
          lambda t, F, x, o: x.var(1), lambda t, F, x, o: x.std(-1, keepdim=True),
          lambda t, F, x, o: t.var(x, (0, 2), correction=0),
          lambda t, F, x, o: t.std(x, 0, unbiased=False),
          lambda t, F, x, o: t.var(x, 2, correction=3, keepdim=True),
          lambda t, F, x, o: o.var(1),            # N - correction = 0: NaN (0 / 0)
          lambda t, F, x, o: o.std(1, correction=2),   # below 0: divides by 0 too
          lambda t, F, x, o: t.var_mean(x, 0)[0], lambda t, F, x, o: t.std_mean(x, 2)[1],
          lambda t, F, x, o: t.std_mean(x, (0, 1), keepdim=True)[1])


def test_logsumexp(tmp_path):
    x = np.random.default_rng(24).standard_normal((4, 6)).astype(np.float32) * 30
    x[0] = -INF                       # a row of -inf: -inf, not NaN
    x[1, 2] = INF                     # an inf: inf
    x[2, 4] = NAN
    big = np.random.default_rng(25).standard_normal((2, 3, 7)).astype(np.float32) + 90
    check(tmp_path, "lse", [x, big],
          lambda t, F, x, b: t.logsumexp(x, 1), lambda t, F, x, b: t.logsumexp(x, 0, True),
          lambda t, F, x, b: t.logsumexp(b, -1),       # e^90 overflows without the shift
          lambda t, F, x, b: t.logsumexp(b, (0, 2), keepdim=True),
          lambda t, F, x, b: b.logsumexp(1) * 2)


def test_rms_norm(tmp_path):
    x = np.random.default_rng(26).standard_normal((2, 3, 8)).astype(np.float32)
    w = np.random.default_rng(27).standard_normal(8).astype(np.float32)
    w2 = np.random.default_rng(28).standard_normal((3, 8)).astype(np.float32)
    check(tmp_path, "rms", [x, w, w2],
          lambda t, F, x, w, v: F.rms_norm(x, (8,)),
          lambda t, F, x, w, v: F.rms_norm(x, (8,), w, eps=1e-3),
          lambda t, F, x, w, v: F.rms_norm(x, (3, 8), v),
          lambda t, F, x, w, v: F.rms_norm(x * 0, (8,), eps=1e-5) + x)


def test_repeat_roll_round_flip(tmp_path):
    x = np.random.default_rng(29).standard_normal((2, 3, 4)).astype(np.float32) * 10
    x[0, 0, :4] = [0.5, 1.5, 2.5, -0.5]     # ties: to even
    ids = np.random.default_rng(30).integers(-9, 9, (3, 5)).astype(np.int64)
    check(tmp_path, "moves", [x, ids],
          lambda t, F, x, i: x.repeat(2, 1, 3), lambda t, F, x, i: x.repeat(2, 1, 1, 2),
          lambda t, F, x, i: t.tile(x, (2,)), lambda t, F, x, i: i.repeat(1, 2),
          lambda t, F, x, i: x.roll(1, 0), lambda t, F, x, i: t.roll(x, (-1, 5), (2, 1)),
          lambda t, F, x, i: x.roll(7), lambda t, F, x, i: i.roll((2, -3), (0, 1)),
          lambda t, F, x, i: x.round(), lambda t, F, x, i: t.round(x, decimals=2),
          lambda t, F, x, i: t.round(x * 37, decimals=-1), lambda t, F, x, i: i.round(),
          lambda t, F, x, i: (x.round() * 2).exp(), lambda t, F, x, i: x.flip(0, 2),
          lambda t, F, x, i: i.flip(-1))


def _adaptive(nd, size, part, which):
    def f(t, F, *xs):
        x = xs[which]
        v = x[:, :, 0, 0] if nd == 1 else x[:, :, 0] if nd == 2 else x
        return getattr(F, f"adaptive_max_pool{nd}d")(v, size, return_indices=True)[part]
    return f


def test_adaptive_max_pool(tmp_path):
    y = _ints(2, 3, 5, 6, 7, hi=5, seed=31)        # ties: the first maximum's position
    y[0, 1, 2, 3, 4] = INF
    x = y.copy()
    x[0, 0, 0, 0, 0] = x[0, 0, 0, 0, 2] = NAN      # two NaNs in a window: the last one's
    fns = [_adaptive(nd, size, part, which)
           for nd, size in ((1, 3), (1, 7), (2, (2, 3)), (2, 4), (3, (2, 3, 4)), (3, 1))
           for part in (0, 1) for which in (0, 1)]
    check(tmp_path, "adamax", [x, y], *fns)


def test_integer_extremes_and_aminmax(tmp_path):
    ids = np.random.default_rng(32).integers(-50, 50, (3, 4, 5)).astype(np.int64)
    x = np.random.default_rng(33).standard_normal((3, 4, 5)).astype(np.float32)
    x[1, 2, 3] = NAN
    check(tmp_path, "ext", [ids, x],
          lambda t, F, i, x: i.max(), lambda t, F, i, x: i.min(),
          lambda t, F, i, x: t.amax(i, (1, 2)), lambda t, F, i, x: t.amin(i, 0, True),
          lambda t, F, i, x: t.aminmax(x)[0], lambda t, F, i, x: t.aminmax(x, dim=1)[1],
          lambda t, F, i, x: t.aminmax(i, dim=-1, keepdim=True)[0],
          lambda t, F, i, x: (i > 0).int().amax(1))
