"""Op-info entries: nn.functional pooling (max, avg, adaptive avg/max, lp, max_unpool).

Samples sweep kernel/stride/padding/dilation, ceil_mode (incl. the rule that drops a last
window starting in the right padding), count_include_pad, divisor_override, return_indices,
unbatched and zero-batch inputs, and PyTorch's errors. Max-pool inputs are a shuffled range
(no ties), so indices and gradients are well defined.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

MAX_OPS = ("max_pool", "max_pool_backward", "max_pool_values")
AVG_OPS = ("avg_pool", "avg_pool_backward")
AREA_OPS = ("interpolate", "interpolate_backward")


def distinct(rng, shape, dtype):
    n = int(np.prod(shape))
    v = rng.permutation(n).reshape(shape) - n // 2
    return (v * 0.37).astype(dtype) if np.dtype(dtype).kind == "f" else v.astype(dtype)


SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}
SMALL = {1: (6,), 2: (4, 5), 3: (3, 3, 4)}


def _max_cases(nd):
    s, sm = SPATIAL[nd], SMALL[nd]
    t = tuple(range(2, nd + 2))
    return [
        ((2, 3) + s, (2,), {}),
        ((1, 2) + sm, (2,), dict(stride=1)),                               # gradcheck size
        ((2, 3) + s, (3,), dict(stride=2, padding=1)),
        ((2, 3) + s, (3,), dict(stride=2, padding=1, ceil_mode=True)),
        ((2, 3) + s, (2,), dict(stride=2, ceil_mode=True)),
        ((1, 2) + sm, (2,), dict(stride=3, padding=1, ceil_mode=True)),   # last window dropped
        ((2, 3) + s, (2,), dict(stride=1, padding=1, dilation=2)),
        ((2, 3) + s, (t,), dict(stride=(1,) * nd)),
        ((2, 3) + s, (3,), dict(stride=[])),
        ((3,) + s, (2,), {}),                                              # unbatched
        ((0, 3) + s, (2,), {}),                                            # zero batch
        ((2, 3) + s, (2,), dict(padding=2)),                               # pad > k/2
        ((2, 3) + s, (2,), dict(padding=-1)),
        ((2, 3) + s, (2,), dict(stride=0)),
        ((2, 3) + s, (0,), {}),
        ((2, 3) + (1,) * nd, (3,), {}),                                    # output too small
        ((2, 0) + s, (2,), {}),
        (s, (2,), {}),                                                     # too few dims
        ((2, 3) + s, ((2,) * (nd + 1),), {}),
    ]


def max_samples(nd, indices):
    def gen(rng, dtype):
        for xs, args, kw in _max_cases(nd):
            if indices:
                kw = dict(kw, return_indices=True)
            yield Sample((distinct(rng, xs, dtype),) + args, kw)
    return gen


def _avg_cases(nd):
    s, sm = SPATIAL[nd], SMALL[nd]
    t = tuple(range(2, nd + 2))
    cases = [
        ((2, 3) + s, (2,), {}),
        ((1, 2) + sm, (2,), dict(stride=1)),
        ((2, 3) + s, (3,), dict(stride=2, padding=1)),
        ((2, 3) + s, (3,), dict(stride=2, padding=1, count_include_pad=False)),
        ((2, 3) + s, (3,), dict(stride=2, padding=1, ceil_mode=True)),
        ((2, 3) + s, (3,), dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
        ((1, 2) + sm, (2,), dict(stride=3, padding=1, ceil_mode=True)),
        ((2, 3) + s, (t,), dict(stride=(1,) * nd, padding=(1,) * nd)),
        ((3,) + s, (2,), {}),
        ((0, 3) + s, (2,), {}),
        ((2, 3) + s, (3,), dict(padding=2)),
        ((2, 3) + s, (2,), dict(stride=0)),
        ((2, 3) + (1,) * nd, (3,), {}),
        ((2, 0) + s, (2,), {}),
        (s, (2,), {}),
        ((1, 1, 1) + s, (2,), {}),
    ]
    if nd > 1:
        cases += [((2, 3) + s, (2,), dict(divisor_override=3)),
                  ((2, 3) + s, (3,), dict(padding=1, divisor_override=5, ceil_mode=True)),
                  ((2, 3) + s, (2,), dict(divisor_override=0))]
    return cases


def avg_samples(nd):
    def gen(rng, dtype):
        for xs, args, kw in _avg_cases(nd):
            yield Sample((make(rng, xs, dtype),) + args, kw)
    return gen


def _int_pool(rng, dtype):
    x = make(rng, (2, 3, 7, 6), np.int64, -9, 9)
    yield Sample((x, 3), dict(stride=2, padding=1))
    yield Sample((x, 3), dict(stride=2, padding=1, count_include_pad=False, ceil_mode=True))


def _adaptive_cases(nd):
    s, sm = SPATIAL[nd], SMALL[nd]
    none_size = tuple([None] + [2] * (nd - 1))
    return [
        ((2, 3) + s, 1),
        ((2, 3) + s, 3),                     # overlapping, uneven windows
        ((1, 2) + sm, 2),
        ((2, 3) + s, tuple(range(2, nd + 2))),
        ((2, 3) + s, tuple(x + 3 for x in s)),   # upsampling windows
        ((2, 3) + s, s),                     # identity
        ((2, 3) + s, none_size),
        ((3,) + s, 2),                       # unbatched
        ((0, 3) + s, 2),
        ((2, 3) + s, 0),
        ((2, 3) + s, -1),
        ((2, 0) + s, 2),
        (s[:-1] if nd > 1 else (), 2),
        ((2, 3) + s, (2,) * (nd + 1)),
    ]


def adaptive_samples(nd, indices=None):
    def gen(rng, dtype):
        for xs, out in _adaptive_cases(nd):
            if nd == 1 and isinstance(out, tuple) and None in out:
                continue  # adaptive_*_pool1d takes ints only (a TypeError in PyTorch too)
            x = distinct(rng, xs, dtype) if xs else make(rng, (4,), dtype)
            kw = {} if indices is None else dict(return_indices=indices)
            # PyTorch's backward rejects an empty output: compare the forward only
            empty = out == 0 or 0 in xs[:2]
            yield Sample((x, out), kw, grad_args=() if empty else None)
    return gen


def _lp_cases(nd):
    s, sm = SPATIAL[nd], SMALL[nd]
    return [
        ((2, 3) + s, 2, 2, {}),
        ((1, 2) + sm, 2, 2, dict(stride=1)),
        ((2, 3) + s, 3, 3, dict(stride=2, ceil_mode=True)),
        ((2, 3) + s, 1.5, 2, {}),
        ((2, 3) + s, float("inf"), 2, {}),
        ((3,) + s, 2, 2, {}),
    ]


def lp_samples(nd):
    def gen(rng, dtype):
        for xs, p, k, kw in _lp_cases(nd):
            # positive inputs keep x ** p real for fractional p
            yield Sample((make(rng, xs, dtype, 0.2, 2.0), p, k), kw)
    return gen


def unpool_samples(nd):
    """(values, indices) of a k=2 s=2 max pool: one random position per window."""
    def gen(rng, dtype):
        for lead, sp, kw in [((2, 3), (3,) * nd, {}), ((1, 2), (2,) * nd, {}),
                             ((3,), (2,) * nd, {}),
                             ((2, 3), (3,) * nd, dict(output_size=(7,) * nd)),
                             ((2, 3), (3,) * nd, dict(output_size=(2, 3) + (7,) * nd)),
                             ((2, 3), (3,) * nd, dict(output_size=(9,) * nd))]:
            full = tuple(2 * s + (1 if "output_size" in kw else 0) for s in sp)
            idx = np.zeros(lead + sp, np.int64)
            for d in range(nd):
                shape = [1] * (len(lead) + nd)
                shape[len(lead) + d] = sp[d]
                pos = 2 * np.arange(sp[d]).reshape(shape) + rng.integers(0, 2, lead + sp)
                idx = idx * full[d] + pos
            yield Sample((make(rng, lead + sp, dtype), idx, 2), kw)
    return gen


def _f(name):
    return lambda L, *a, **k: getattr(L.nn.functional, name)(*a, **k)


for _nd in (1, 2, 3):
    register(
        OpInfo(f"nn.functional.max_pool{_nd}d", _f(f"max_pool{_nd}d"),
               max_samples(_nd, False), covers=MAX_OPS),
        OpInfo(f"nn.functional.max_pool{_nd}d_indices", _f(f"max_pool{_nd}d"),
               max_samples(_nd, True), covers=MAX_OPS),
        OpInfo(f"nn.functional.avg_pool{_nd}d", _f(f"avg_pool{_nd}d"), avg_samples(_nd),
               covers=AVG_OPS),
        OpInfo(f"nn.functional.adaptive_avg_pool{_nd}d", _f(f"adaptive_avg_pool{_nd}d"),
               adaptive_samples(_nd), covers=AREA_OPS),
        OpInfo(f"nn.functional.adaptive_max_pool{_nd}d", _f(f"adaptive_max_pool{_nd}d"),
               adaptive_samples(_nd, False), covers=("adaptive_max_pool",
                                                     "max_pool_backward")),
        OpInfo(f"nn.functional.adaptive_max_pool{_nd}d_indices", _f(f"adaptive_max_pool{_nd}d"),
               adaptive_samples(_nd, True), covers=("adaptive_max_pool", "max_pool_backward")),
        OpInfo(f"nn.functional.lp_pool{_nd}d", _f(f"lp_pool{_nd}d"), lp_samples(_nd),
               covers=AVG_OPS + MAX_OPS, atol=1e-5, rtol=1e-5),
        OpInfo(f"nn.functional.max_unpool{_nd}d", _f(f"max_unpool{_nd}d"), unpool_samples(_nd),
               covers=("max_pool_backward",)),
    )

register(OpInfo("nn.functional.avg_pool2d_int", _f("avg_pool2d"), _int_pool,
                dtypes=(np.int64,), covers=("avg_pool",), differentiable=False))
