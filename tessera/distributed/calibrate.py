"""The machine profile the auto-parallel cost model prices plans with, and its calibration.

A ``Profile`` holds GEMM FLOP/s by the product's FLOPs (a curve, measured on the product
kernel the steps run; three shape classes in a profile saved before it) and by its smallest
dimension (a product with one small dimension, a batch's rows or a weight gradient's
reduction over them, runs below a square one of its FLOPs), memory bandwidth,
the fused optimizer update's rate by the bytes it moves, and, for each collective of the
communicator and each number of ranks measured, its latency and bandwidth (``alpha``
seconds, ``beta`` bytes per second) in the model ``time = alpha + bytes / beta``, where
``bytes`` is what a rank sends in a ring algorithm (``tessera.distributed.boxing.cost``'s
figure), so the profile and the boxing table price a conversion on one scale.

Every figure is a median over rounds of calls lasting about a training step each, after
warm-up calls, so that on a host shared with other work it is the rate a step sees, not an
unloaded peak (see ``_rounds``). The boxing steps a compiled step runs are measured too
(``boxing[transition][n]``), copies and all, beside the bare collectives.

``python -m tessera.distributed.calibrate`` measures the machine it runs on (under ``mpiexec -n N``:
the MPI communicator on 1..N ranks; in one process: the simulated world's collectives) and
saves the profile as JSON (written to a temporary file and renamed, so a reader never sees
half of it) at ``TESSERA_PROFILE`` or ``~/.cache/tessera/profile.json``. ``load()`` reads it
back, and gives ``DEFAULT`` when none was measured.

>>> p = DEFAULT
>>> p.gemm_seconds(2 * 512 ** 3) > 0, p.comm_seconds("all_reduce", 4, 1 << 20) > 0
(True, True)
>>> p.comm_seconds("all_reduce", 1, 1 << 20)
0.0
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import tempfile
import time

import numpy as np

__all__ = ["Profile", "DEFAULT", "COLLECTIVES", "TRANSITIONS", "profile_path", "load", "save",
           "measure", "main"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# the FLOPs of one product that separate the GEMM shape classes
_SMALL, _LARGE = 2e6, 2e8
# a collective of at least these bytes takes more than one meeting of the ranks (the MPI
# communicator's all-reduce goes through shared memory between two barriers from 64 KiB,
# MPICH's large messages move in pieces, each a rendezvous): its ``sync`` is measured apart
SYNC_LARGE_BYTES = 1 << 16


@dataclasses.dataclass
class Profile:
    """Rates the cost model reads: ``gemm`` FLOP/s per shape class, ``bandwidth`` bytes/s of
    memory, ``comm[kind][n] = (alpha, beta)`` per collective and number of ranks,
    ``op_overhead`` seconds per op call, and
    ``boxing[transition][n] = (alpha, beta)`` of a boxing step between SBP kinds
    (``"S->B"``, ``"P->B"``, ``"B->S"``, ``"S->S"``, ``"P->S"``) with bytes the whole
    tensor's; ``sync[n]`` what a collective adds to a step between computations on ``n``
    ranks beyond its own time (the ranks' skew since the last one, which it waits out);
    ``collective[n]`` the fixed seconds each collective adds to a step on ``n`` ranks as a
    compiled step pays it (computation between collectives, ranks not in step) beyond the
    price ``comm`` gives it, the least ``sync`` it is charged: fitted from steps with and
    without collectives (none measured, as in a profile saved before it was: 0)."""

    gemm: dict = dataclasses.field(default_factory=lambda: {
        "small": 2e9, "medium": 1e10, "large": 2e10})
    # FLOP/s by one product's FLOPs: [(flops, flop/s), ...] (empty: the classes of ``gemm``)
    gemm_curve: list = dataclasses.field(default_factory=list)
    # FLOP/s by a product's smallest dimension, the others large: [(dim, flop/s), ...]
    # (empty: by FLOPs alone)
    thin_curve: list = dataclasses.field(default_factory=list)
    bandwidth: float = 5e9
    # memory bytes/s by the bytes an op moves: [(bytes, bytes/s), ...] (empty: bandwidth)
    bandwidth_curve: list = dataclasses.field(default_factory=list)
    comm: dict = dataclasses.field(default_factory=dict)
    # the optimizer update's bytes/s by the bytes it moves: [(bytes, bytes/s), ...] (empty:
    # the memory curve's)
    update_curve: list = dataclasses.field(default_factory=list)
    # seconds each op (and each conversion between SBPs) adds whatever its size
    op_overhead: float = 1e-5
    boxing: dict = dataclasses.field(default_factory=dict)
    # seconds a collective costs a step beyond its own time: the ranks' skew it absorbs
    sync: dict = dataclasses.field(default_factory=dict)
    # the same by the computation since the previous collective: [(seconds, sync), ...]
    sync_curve: dict = dataclasses.field(default_factory=dict)
    # the same for a collective of at least SYNC_LARGE_BYTES (empty: as a small one's)
    sync_large: dict = dataclasses.field(default_factory=dict)
    # seconds each collective costs a step whatever the computation around it
    collective: dict = dataclasses.field(default_factory=dict)
    # alpha and beta for numbers of ranks not measured: per ring step, and bytes/s
    default_alpha: float = 2e-5
    default_beta: float = 2e9
    source: str = "default"

    def gemm_seconds(self, flops: float, products: int = 1, dim: int | None = None) -> float:
        """Seconds of ``products`` matrix products of ``flops`` in all at the rate of one
        product of their size (a batch of small products, as attention's per head, runs at
        the small products' rate, not at the rate of one product of the batch's FLOPs):
        ``gemm_curve`` interpolated in log FLOPs (constant beyond its ends), else the rate of
        the product's shape class; with ``dim``, the product's smallest dimension, at most
        ``thin_curve``'s rate there (interpolated likewise; no bound past its last point,
        where a product is as good as square).

        >>> p = Profile(gemm={"small": 1e9, "medium": 2e9, "large": 4e9})
        >>> p.gemm_seconds(4e6), p.gemm_seconds(4e6, products=8)
        (0.002, 0.004)
        >>> q = Profile(gemm_curve=[(1e6, 1e9), (1e8, 4e9)], thin_curve=[(16, 1e9), (64, 3e9)])
        >>> round(q.gemm_seconds(1e7), 9), round(q.gemm_seconds(1e7, dim=16), 9)
        (0.005, 0.01)
        """
        each = flops / max(products, 1)
        if self.gemm_curve and each > 0:
            rate = _loglog(self.gemm_curve, each)
            if dim is not None and self.thin_curve and dim <= max(self.thin_curve)[0]:
                rate = min(rate, _loglog(self.thin_curve, max(dim, 1)))
            return flops / rate
        cls = "small" if each < _SMALL else "large" if each >= _LARGE else "medium"
        return flops / self.gemm[cls]

    def memory_seconds(self, nbytes: float) -> float:
        """Seconds of moving ``nbytes`` (read and written) at the rate of an op moving that
        many (``bandwidth_curve``, interpolated in log bytes, constant beyond its ends:
        what fits in the caches moves several times faster than a stream from memory),
        or ``bandwidth`` when no curve was measured.

        >>> p = Profile(bandwidth_curve=[(1e6, 1e11), (1e8, 1e10)])
        >>> [round(p.memory_seconds(b), 6) for b in (1e6, 1e7, 1e8)]
        [1e-05, 0.000316, 0.01]
        """
        if not self.bandwidth_curve or nbytes <= 0:
            return nbytes / self.bandwidth
        return nbytes / _loglog(self.bandwidth_curve, nbytes)

    def update_seconds(self, nbytes: float) -> float:
        """Seconds of an optimizer update moving ``nbytes`` (a parameter's, its
        gradient's and its state's reads and writes) at the fused update's measured rate
        for that many (``update_curve``), else ``memory_seconds``: one pass of arithmetic
        over a few streams keeps more loads in flight than a copy of one array, and moved
        its bytes at about twice a copy's rate of the same size.

        >>> round(Profile(update_curve=[(1e6, 1e10), (1e8, 1e10)]).update_seconds(2e7), 9)
        0.002
        """
        if not self.update_curve or nbytes <= 0:
            return self.memory_seconds(nbytes)
        return nbytes / _loglog(self.update_curve, nbytes)

    def alpha_beta(self, kind: str, n: int) -> tuple[float, float]:
        """(alpha, beta) of collective ``kind`` on ``n`` ranks: measured, else the nearest
        measured count's beta with alpha grown by its ring steps, else the defaults."""
        table = self.comm.get(kind, {})
        if n in table:
            a, b = table[n]
            return a, b
        if table:
            m = min(table, key=lambda k: abs(k - n))
            a, b = table[m]
            return a * max(n - 1, 1) / max(m - 1, 1), b
        return self.default_alpha * max(n - 1, 1), self.default_beta

    def comm_seconds(self, kind: str, n: int, nbytes: float) -> float:
        """Seconds of collective ``kind`` on ``n`` ranks sending ``nbytes`` per rank."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        a, b = self.alpha_beta(kind, n)
        return a + nbytes / b

    def boxing_seconds(self, src, dst, n: int, nbytes: float) -> float | None:
        """Seconds of a boxing step from ``src`` to ``dst`` (SBPs, or kinds ``"S"``,
        ``"B"``, ``"P"``) of a tensor of ``nbytes`` on ``n`` ranks as measured (the nearest
        measured count of ranks), or None when that transition was not measured. A split
        of a dim other than 0 takes the figure measured on dim 1 (``"S(1)->B"``), one of
        dim 0 that of dim 0 (``"P->S(0)"``), where measured, else the kind's.

        >>> p = Profile(boxing={"S->B": {2: (0.0, 1e9)}, "S(1)->B": {2: (0.0, 2.5e8)}})
        >>> from tessera.sbp import broadcast, split
        >>> [p.boxing_seconds(split(d), broadcast, 2, 1e6) for d in (0, 2)]
        [0.001, 0.004]
        """
        def name(s) -> str:
            if isinstance(s, str):
                return s
            return s.kind if s.kind != "S" else "S(0)" if s.dim == 0 else "S(1)"
        a, b = name(src), name(dst)
        table = self.boxing.get(f"{a}->{b}") or self.boxing.get(f"{a[0]}->{b[0]}")
        if n <= 1 or not table:
            return None if n > 1 else 0.0
        a, b = table[n] if n in table else table[min(table, key=lambda k: abs(k - n))]
        return a + nbytes / b

    def sync_seconds(self, n: int, gap: float | None = None, nbytes: float = 0.0) -> float:
        """``sync`` for ``n`` ranks (the nearest measured count; 0 when none was); with
        ``gap``, after that many seconds of computation since the previous collective
        (``sync_curve``, interpolated, never lower after a longer computation, constant
        beyond its ends); a collective of
        ``nbytes`` of at least ``SYNC_LARGE_BYTES`` on ``sync_large``'s curve, where
        measured (each meeting of the ranks it takes waits out their skew); at least the
        per-collective cost of a step (``collective_seconds``), which holds the skew as a
        whole step's collectives wait it out.

        >>> p = Profile(sync={2: 1e-3}, sync_curve={2: [(1e-3, 2e-4), (4e-3, 1e-3)]},
        ...             sync_large={2: [(1e-3, 5e-4), (4e-3, 2e-3)]})
        >>> p.sync_seconds(2), round(p.sync_seconds(2, 2.5e-3), 6), p.sync_seconds(2, 1.0)
        (0.001, 0.0006, 0.001)
        >>> p.sync_seconds(2, 4e-3, nbytes=1e6)
        0.002
        >>> Profile(sync={2: 1e-3}, sync_curve={2: [(1e-3, 1e-3), (4e-3, 2e-4)]}
        ...         ).sync_seconds(2, 4e-3)
        0.001
        >>> Profile(sync={2: 1e-3}, collective={2: 3e-3}).sync_seconds(2)
        0.003
        """
        if n <= 1:
            return 0.0
        return max(self._skew(n, gap, nbytes), self.collective_seconds(n))

    def collective_seconds(self, n: int) -> float:
        """``collective`` for ``n`` ranks (the nearest measured count; 0 when none was).

        >>> Profile(collective={2: 3e-3}).collective_seconds(4), Profile().collective_seconds(2)
        (0.003, 0.0)
        """
        if n <= 1 or not self.collective:
            return 0.0
        near = n if n in self.collective else min(self.collective, key=lambda k: abs(k - n))
        return float(self.collective[near])

    def _skew(self, n: int, gap: float | None, nbytes: float) -> float:
        if not self.sync:
            return 0.0
        near = n if n in self.sync else min(self.sync, key=lambda k: abs(k - n))
        curve = self.sync_curve.get(near)
        if nbytes >= SYNC_LARGE_BYTES and self.sync_large.get(near):
            curve = self.sync_large[near]
            if gap is None:  # (as ``sync``: after a few layers' computation)
                return float(curve[min(1, len(curve) - 1)][1])
        if gap is None or not curve:
            return float(self.sync[near])
        xs, ys = zip(*sorted(curve))
        # (the ranks drift at least as far in a longer computation as in a shorter one: a
        # point below an earlier one is the noise of a difference of two timings)
        return float(np.interp(gap, xs, np.maximum.accumulate(ys)))

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("sync", "collective"):
            d[key] = {str(n): v for n, v in getattr(self, key).items()}
        for key in ("sync_curve", "sync_large"):
            d[key] = {str(n): [list(p) for p in v] for n, v in getattr(self, key).items()}
        for key in _CURVES:
            d[key] = [list(p) for p in getattr(self, key)]
        for key in ("comm", "boxing"):
            d[key] = {k: {str(n): list(v) for n, v in t.items()}
                      for k, t in getattr(self, key).items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        d = dict(d)
        for key in ("sync", "collective"):
            d[key] = {int(n): float(v) for n, v in d.get(key, {}).items()}
        for key in ("sync_curve", "sync_large"):
            d[key] = {int(n): [tuple(p) for p in v] for n, v in d.get(key, {}).items()}
        for key in _CURVES:
            d[key] = [tuple(p) for p in d.get(key, [])]
        for key in ("comm", "boxing"):
            d[key] = {k: {int(n): tuple(v) for n, v in t.items()}
                      for k, t in d.get(key, {}).items()}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


DEFAULT = Profile()
_CURVES = ("bandwidth_curve", "gemm_curve", "thin_curve", "update_curve")


def _loglog(curve: list, x: float) -> float:
    """``curve``'s rate at ``x``: interpolated in log-log between its points, constant
    beyond its ends."""
    xs, ys = zip(*sorted(curve))
    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


def profile_path() -> str:
    """Where the profile is kept: ``$TESSERA_PROFILE``, else the user's cache directory."""
    env = os.environ.get("TESSERA_PROFILE")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "tessera", "profile.json")


def save(profile: Profile, path: str | None = None) -> str:
    """Write ``profile`` as JSON atomically (a temporary file renamed over ``path``)."""
    path = path or profile_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(profile.to_json(), f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


_LOADED: dict[str, Profile] = {}


def load(path: str | None = None) -> Profile:
    """The saved profile at ``path`` (default ``profile_path()``), or ``DEFAULT`` when
    there is none (or it cannot be read as a profile).

    >>> load("/nonexistent/profile.json") is DEFAULT
    True
    """
    path = path or profile_path()
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        return DEFAULT
    key = f"{path}:{mtime}"
    if key not in _LOADED:
        try:
            with open(path) as f:
                _LOADED[key] = Profile.from_json(json.load(f))
        except (OSError, ValueError, TypeError):
            return DEFAULT
    return _LOADED[key]


# ---- measuring ----------------------------------------------------------------------------

# how long one timed round of calls lasts, about a training step's scale: a call much
# shorter than the scheduler's time slice runs whole between two preemptions, so timing it
# alone gives the rate of a core the process owns, not of one it shares with other loads
_ROUND_SECONDS = 0.02
_MAX_BATCH = 200


def _rounds(fn, repeat: int, sync=None, agree=None, seconds: float = _ROUND_SECONDS
            ) -> float:
    """Seconds per call of ``fn``: ``_interleaved`` of it alone."""
    return _interleaved([fn], repeat, sync, agree, seconds)[0]


def _interleaved(fns: list, repeat: int, sync=None, agree=None,
                 seconds: float = _ROUND_SECONDS) -> list[float]:
    """Seconds per call of each of ``fns``: the median over ``repeat`` rounds of calls in
    a row lasting about ``seconds`` each (after four untimed calls: a first call makes
    caches, communicators and shared buffers). The rounds of the functions alternate, so
    a burst of another program's load falls on one round of several functions rather than
    on every round of one (it would bend the fitted line). The median, not the fastest: on
    a shared host the fastest round is an unloaded peak the training step does not see.
    ``sync`` (a barrier) starts each round on every rank together and ``agree`` (the
    largest over the ranks, of the negated batches) makes them run the same number of
    calls, the slowest rank's, made smaller after a round whose calls were slower;
    collectives are timed in a row, as a step runs them, not one per barrier, which would
    charge each call a rank's late exit from it. Without ``agree`` a round runs until its
    ``seconds`` have passed. (Batches from calls timed once ran rounds tens of times longer
    than ``seconds`` on a loaded host, whose calls slow down as the rounds go on.)"""
    def batch(per_call: float) -> int:
        # (at most _MAX_BATCH: a call that was fast once may be slow the next thousand)
        b = min(max(1, int(seconds / max(per_call, 1e-7))), _MAX_BATCH)
        return -agree(-b) if agree is not None else b
    batches = []
    for fn in fns:
        fn()
        once = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            once.append(time.perf_counter() - t)
        batches.append(batch(float(np.median(once))))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            if sync is not None:
                sync()
            calls, t = 0, time.perf_counter()
            while calls < batches[k] and (agree is not None or calls == 0 or
                                          time.perf_counter() - t < seconds):
                fn()
                calls += 1
            times[k].append((time.perf_counter() - t) / calls)
            if agree is not None:  # (never larger: a fast round may precede slow ones)
                batches[k] = min(batches[k], batch(times[k][-1]))
    return [float(np.median(ts)) for ts in times]


# the square products whose rates make the GEMM curve (a class's size among them)
_GEMM_SIZES = (64, 128, 256, 512, 1024)
_GEMM_CLASSES = {"small": 64, "medium": 256, "large": 1024}
# the smallest dimensions of the thin products (the other two _THIN_WIDE): a data-parallel
# MLP's 32 rows of 1024-wide layers run at under two thirds of a square product's rate
_THIN_DIMS, _THIN_WIDE = (8, 16, 32, 64, 128, 256, 512), 1024
# the arrays whose copy measures the memory rate (elements of float32): from a tile that
# stays in the first caches to a stream from memory; an op's rate is the one of its bytes
_BANDWIDTH_SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
# the parameters (elements) whose fused Adam update measures the update's rate
_UPDATE_SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
# what Adam's update moves per element, in elements: the parameter, its gradient and its
# two moments read, the parameter and the moments written
_ADAM_WORDS = 7
# the elements of each of the four arrays the updates take their operands from in turn, so
# that an update finds them out of the caches as a step's does (its moments untouched since
# the previous step's update): 128 MB in all, past a server's last-level cache. A step's
# updates of 1M-element parameters ran at the rate of 110 MB streams, 0.6x the rate of the
# same update on arrays the caches held (bench autoparallel: the MLP's fused kernels)
_COLD_WORDS = 1 << 23


def _rates(quick: bool, sync=None) -> dict:
    """The per-rank rates: ``gemm`` (FLOP/s by class) and ``gemm_curve`` of square products
    through the matrix product kernel the steps run (``ops.linalg``: tessera's GEMM or
    NumPy's BLAS, as dispatch chooses), and ``thin_curve`` of products with one small
    dimension (``_THIN_DIMS``) through it; the ``bandwidth_curve`` of copies
    (``_BANDWIDTH_SIZES``): a training step's elementwise ops move tensors of a few MB that
    the caches hold, faster than a stream from memory; the ``update_curve`` of the fused
    Adam update (``kernels.optim``, what an optimizer's step runs as one loop) by the bytes
    it moves, on operands out of the caches (``_COLD_WORDS``). Each kind's sizes are
    interleaved (a burst of the host's load falls on a round of each size rather than on
    every round of one), the kinds apart: under MPI, copies interleaved with products and
    updates measured a tenth of their rate at 0.5 MB. Every rank measures at once, as the
    ranks of a step compute at once and share the memory's rate and the cores: ``sync``
    (a barrier of every rank) starts each kind on all of them together, and the rounds run
    on back to back (a barrier between rounds lets the ranks that finish first give their
    cores to the others: with more ranks than cores, products measured that way ran at
    twice a step's rate)."""
    from tessera.kernels import optim
    from tessera.ops.linalg import _matmul_kernel
    rng = np.random.default_rng(0)
    repeat = 5 if quick else 9
    out: dict = {}
    pairs = [(np.ones(n, np.float32), np.empty(n, np.float32))
             for n in (_BANDWIDTH_SIZES[:-1] if quick else _BANDWIDTH_SIZES)]
    def timed(fns: list) -> list[float]:
        if sync is not None:
            sync()
        return _interleaved(fns, repeat)
    ts = timed([lambda a=a, b=b: np.copyto(b, a) for a, b in pairs])
    out["bandwidth_curve"] = [(2.0 * a.nbytes, 2.0 * a.nbytes / t) for (a, _), t in zip(pairs, ts)]
    sizes = _GEMM_SIZES[:-1] if quick else _GEMM_SIZES
    mats = [(rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32),
             np.empty((n, n), np.float32)) for n in sizes]
    ts = timed([lambda a=a, b=b, c=c: _matmul_kernel(a, b, c) for a, b, c in mats])
    out["gemm_curve"] = [(2.0 * n ** 3, 2.0 * n ** 3 / t) for n, t in zip(sizes, ts)]
    rate = dict(zip(sizes, (r for _, r in out["gemm_curve"])))
    out["gemm"] = {cls: rate.get(n, out["gemm_curve"][-1][1]) for cls, n in _GEMM_CLASSES.items()}
    # a product with one small dimension in each of a training step's three places: the
    # rows of a forward product (a weight read transposed), of an input's gradient, and the
    # reduction of a weight's gradient over the rows
    dims = _THIN_DIMS[:-1] if quick else _THIN_DIMS
    wide = rng.standard_normal((_THIN_WIDE, _THIN_WIDE), np.float32)
    thin = [(rng.standard_normal((d, _THIN_WIDE), np.float32),
             rng.standard_normal((d, _THIN_WIDE), np.float32)) for d in dims]

    def three(x, y):
        _matmul_kernel(x, wide.T)
        _matmul_kernel(x, wide)
        _matmul_kernel(x.T, y)
    ts = timed([lambda x=x, y=y: three(x, y) for x, y in thin])
    out["thin_curve"] = [(d, 3 * 2.0 * d * _THIN_WIDE ** 2 / t) for d, t in zip(dims, ts)]
    out["update_curve"] = []
    if optim.available(np.float32):
        pool = [np.full(_COLD_WORDS, 0.5, np.float32) for _ in range(4)]
        sizes = _UPDATE_SIZES[:-1] if quick else _UPDATE_SIZES

        def update(n: int):
            turns = itertools.cycle([[a[i * n:(i + 1) * n] for a in pool]
                                     for i in range(_COLD_WORDS // n)])

            def step() -> None:
                p, g, m, v = next(turns)
                optim.adam_step(p, g, m, v, None, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8,
                                weight_decay=0.01, decoupled=True, maximize=False, step=1)
            return step
        ts = timed([update(n) for n in sizes])
        out["update_curve"] = [(_ADAM_WORDS * 4.0 * n, _ADAM_WORDS * 4.0 * n / t)
                               for n, t in zip(sizes, ts)]
    return out


def _sent(kind: str, nbytes: float, n: int) -> float:
    """Bytes a rank sends in a ring ``kind`` of ``nbytes`` (boxing.cost's figures)."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    if kind == "all_to_all":
        return (n - 1) / n / n * nbytes
    return (n - 1) / n * nbytes


def _collective(comm, kind: str, x: np.ndarray, group: tuple):
    n = len(group)
    if kind == "all_reduce":
        # in place on the communicator's reduce buffer, as a gradient bucket runs it (its
        # copies in are priced apart; ``all_reduce`` copies in and out of a scratch buffer
        # and allocates its result, which priced an 8 MB bucket at twice what it took)
        key = (id(comm), comm.rank, x.size, group)
        buf = _reduce_buffers.get(key)
        if buf is None:
            buf = _reduce_buffers[key] = comm.reduce_buffer(x.size, x.dtype, group)
            buf[...] = 0   # (sums of zeros stay finite however many times it runs)
        return comm.iall_reduce_(buf, group).wait()
    if kind == "all_gather":
        return comm.all_gather(x[: len(x) // n], group)
    chunks = np.array_split(x, n)
    if kind == "reduce_scatter":
        return comm.reduce_scatter(chunks, group)
    return comm.all_to_all(chunks, group)


_reduce_buffers: dict = {}


def _fit(points: list) -> tuple[float, float]:
    """(alpha, beta) of ``time = alpha + bytes / beta``: ``1 / beta`` the median of the
    slopes between every two points (Theil-Sen), alpha the median of what each point
    leaves after its bytes (robust to one slow point on a loaded host, which a
    least-squares line, or the line through the smallest and the largest, is not).

    >>> a, b = _fit([(0, 1.0), (1e9, 2.0), (2e9, 3.0), (3e9, 4.0), (4e9, 12.0)])  # one slow
    >>> round(a, 6), round(b / 1e9, 6)
    (1.0, 1.0)
    """
    slope = _slope(points)
    beta = 1.0 / slope if slope > 0 else DEFAULT.default_beta
    return max(float(np.median([t - x / beta for x, t in points])), 0.0), beta


def _slope(points: list) -> float:
    """The median of the slopes between every two of ``points`` (x, y) (Theil-Sen; 0 with
    fewer than two distinct x)."""
    slopes = [(t1 - t0) / (x1 - x0) for (x0, t0), (x1, t1) in
              ((a, b) for k, a in enumerate(sorted(points)) for b in sorted(points)[k + 1:])
              if x1 > x0]
    return float(np.median(slopes)) if slopes else 0.0


def _op_overhead(quick: bool, sync=None) -> float:
    """Seconds of one node of a compiled ``nn.Graph`` step on tiny tensors: the executor's
    work per node (the kernel's call, its arguments and results) beside the kernel's own
    arithmetic, which is what a training step pays per op beyond the roofline. Measured on
    steps of chains of 2 x 2 matrix products (one node each: nothing fuses them), the
    slope between a short and a long chain (a step's own fixed work left out); an eager
    op's dispatch, timed alone, is about a third of a step's node. ``sync`` as in
    ``_rates`` (measured while the other ranks waited, with more ranks than cores, it came
    out half what it is while they all run)."""
    from tessera.graph.executor import Executor
    from tessera.graph.trace import trace
    from tessera.ops.creation import ones

    def chain(k: int):
        def build(x):
            for _ in range(k):
                x = x @ x
            return x
        a = ones(2, 2) * 0.5
        ex = Executor(trace(build, a)[0])  # (what an nn.Graph step's executor runs)
        return (lambda: ex.run([a._data], {})), len(ex.steps)
    (short, n0), (long, n1) = chain(_CHAIN), chain(4 * _CHAIN)
    if sync is not None:
        sync()
    t0, t1 = _interleaved([short, long], 5 if quick else 9)
    return max((t1 - t0) / max(n1 - n0, 1), 0.0)


# the nodes of _op_overhead's step
_CHAIN = 64


# the boxing transitions measured on one mesh axis: by kind, from and to the dims a
# kind's figure stands for (``S->B`` from S(0), ``P->S`` and ``B->S`` to S(1), ``S->S``
# S(0) -> S(1)), and the other dim where it costs differently: a split of the leading dim
# is contiguous rows, which the step gathers and reduce-scatters in place, while one of
# another dim is strided and packed and unpacked around the collective (about three
# times the leading dim's time for a tensor of a few MB)
TRANSITIONS = ("S->B", "P->B", "B->S", "S->S", "P->S", "S(1)->B", "P->S(0)")


def _transition(tr: str) -> tuple:
    """The (source, destination) SBPs timed for transition ``tr`` of ``TRANSITIONS``."""
    from tessera.sbp import broadcast, partial_sum, split

    def one(text: str, default_dim: int):
        if text == "B":
            return broadcast
        if text == "P":
            return partial_sum
        return split(int(text[2:-1]) if len(text) > 1 else default_dim)
    a, b = tr.split("->")
    return one(a, 0), one(b, 1)


def _boxing_rank(comm, n: int, quick: bool, agree) -> dict:
    """On this rank, among ranks ``0..n-1``: (alpha, beta) of each boxing transition of
    ``TRANSITIONS`` in ``time = alpha + bytes / beta``, ``bytes`` the whole tensor's. Timed
    is the kernel of a compiled ``nn.Graph`` step's boxing node on a tile: the collective
    with the slicing, packing and concatenation around it (a split of the leading dim by
    rows in the node's buffer)."""
    from tessera.distributed.graph_ops import _box_kernel, in_step
    from tessera.sbp import split_sizes
    group = tuple(range(n))
    i = group.index(comm.rank)
    rows = [64, 512] if quick else [16, 256, 2048, 8192]   # (to 8 MB, a ZeRO bucket's)
    fns: list = []
    for tr in TRANSITIONS:
        src, dst = _transition(tr)
        for r in rows:
            shape = (r, 256)
            tile = list(shape)
            if src.kind == "S":
                tile[src.dim] = split_sizes(shape[src.dim], n)[i]
            x = np.ones(tile, np.float32)
            seq = -1 - len(fns)  # (each its own buffer, none a compiled step's)

            def fn(x=x, src=src.short(), dst=dst.short(), shape=shape, seq=seq):
                with in_step():
                    _box_kernel(x, shape, src, dst, group, i, seq)
            fns.append(fn)
    # every transition's rounds interleaved: a burst of load falls on all of them alike
    ts = _interleaved(fns, 5 if quick else 9, lambda: comm.barrier(group), agree)
    k = len(rows)
    return {tr: _fit([(r * 256 * 4.0, t) for r, t in zip(rows, ts[j * k:(j + 1) * k])])
            for j, tr in enumerate(TRANSITIONS)}


# the GEMMs (256 x 256) between two collectives at which ``sync`` is measured: a tensor-
# parallel layer's gap, a few layers', and a data-parallel step's forward and backward
# (the skew keeps growing with the gap on a loaded host: beyond the longest measured the
# curve is flat, which priced a collective after a whole backward at a third of its wait)
_SYNC_GEMMS = (1, 4, 16, 64)


def _sync_rank(comm, n: int, quick: bool, agree, own: dict
               ) -> dict[str, list[tuple[float, float]]]:
    """On this rank, among ranks ``0..n-1``: what an all-reduce adds to a loop of
    computations beyond the computations and its own price (``own``, by size: what the
    profile's fit charges it, so that price and sync together are what the loop paid; not
    its back-to-back time measured apart, which on a loaded host is itself mostly waits
    for the other rank and swings from a fraction of a millisecond to tens), for computations
    of a few lengths between two collectives (``_SYNC_GEMMS``): (the computation's seconds,
    the collective's added seconds) each, for a small all-reduce (``"small"``, one meeting
    of the ranks) and one of ``SYNC_LARGE_BYTES`` (``"large"``: the shared-memory path's
    two barriers, as the steps' activations and gradient buckets take). On an idle host
    nearly nothing; on one shared with other work the ranks are preempted at different
    times, and each meeting waits for the slowest: that skew, not the collective's
    microseconds, is what a step pays per collective, and it grows with the computation
    since the previous collective (the longer the ranks run apart, the further they
    drift), up to a time slice."""
    group = tuple(range(n))
    # (quick: products of an eighth of the work, as in ``_collective_rank``)
    a = np.ones((128, 128) if quick else (256, 256), np.float32)
    xs = {"small": np.ones(64, np.float32),
          "large": np.ones(SYNC_LARGE_BYTES // 4, np.float32)}

    def work(k: int, x=None) -> None:
        for _ in range(k):
            a @ a
        if x is not None:
            comm.all_reduce(x, group)
    fns: list = []
    for k in _SYNC_GEMMS[:2] if quick else _SYNC_GEMMS:  # (quick: the shorter gaps)
        fns += [lambda k=k: work(k)] + [lambda k=k, x=x: work(k, x) for x in xs.values()]
    # (rounds of several time slices: the skew is what a slice's preemption leaves)
    ts = _interleaved(fns, 5 if quick else 9, lambda: comm.barrier(group), agree, 0.1)
    step = 1 + len(xs)
    out = {}
    for j, size in enumerate(xs):
        out[size] = [(ts[i], max(ts[i + 1 + j] - ts[i] - own[size], 0.0))
                     for i in range(0, len(ts), step)]
    return out


# the collectives in a step of ``_STEP_GEMMS`` GEMMs (256 x 256, a small model's step) at
# which ``collective`` is measured: none, one after every 16 GEMMs (a few layers') and
# every 4 (a tensor-parallel layer's gap). The cost is not linear in the collectives: the
# first few of a step wait out most of the ranks' drift, so the fit spans the range
_STEP_COLLECTIVES = (0, 4, 16)
_STEP_GEMMS = 64


def _collective_rank(comm, n: int, quick: bool, agree, own: float) -> float:
    """On this rank, among ranks ``0..n-1``: the seconds each collective adds to a step as
    a compiled step pays it, beyond its own price ``own`` (what the profile's fit charges
    an all-reduce of its size: the model adds this beside it). Timed are steps of the same
    computation (``_STEP_GEMMS`` products) with ``_STEP_COLLECTIVES`` all-reduces of
    ``SYNC_LARGE_BYTES`` (an activation's or a gradient bucket's path) spread between the
    products, run back to back as training steps are (no barrier between steps: the ranks
    drift apart as the host's other load preempts them, and each collective waits for the
    later rank); the cost is the slope of the step's time over its collectives
    (Theil-Sen), less ``own``. ``sync``, timed in rounds of one gap each, sees one gap's
    skew; this sees what a whole step's collectives cost together, which on a loaded host
    is milliseconds each: at a load of about 10 on 2 cores, about 10 ms for every
    collective of a compiled GPT-mini step, whatever its kind and size (each meeting of
    the ranks waits until both are scheduled at once). Subtracted is the fit's price, not
    an all-reduce's back-to-back time timed beside the steps: on such a host that time is
    itself mostly the same waits and swings from under a millisecond to more than the
    slope (the difference was clamped at 0: a profile charging a collective its
    microseconds)."""
    group = tuple(range(n))
    # (quick: a quarter of the step in products of an eighth of the work, as a simulated
    # world's threads run a product many times slower than a process does)
    gemms, a = (_STEP_GEMMS // 4, np.ones((128, 128), np.float32)) if quick else \
        (_STEP_GEMMS, np.ones((256, 256), np.float32))
    x = np.ones(SYNC_LARGE_BYTES // 4, np.float32)

    def step(k: int) -> None:
        every = gemms // k if k else 0
        for i in range(gemms):
            a @ a
            if every and i % every == every - 1:
                comm.all_reduce(x, group)
    fns: list = [lambda k=k: step(k) for k in _STEP_COLLECTIVES]
    # (rounds of several steps: the ranks drift within a round as within training)
    ts = _interleaved(fns, 3 if quick else 7, lambda: comm.barrier(group), agree,
                      0.1 if quick else 0.25)
    return max(_slope(list(zip(_STEP_COLLECTIVES, ts))) - own, 0.0)


def _comm_rank(comm, ranks: list[int], quick: bool, steps: bool = True) -> dict:
    """On this rank of ``comm``: (alpha, beta) of each collective for each group size (and,
    with ``steps``, the per-collective cost of a step, ``_collective_rank``)."""
    # (to 16 MB: a step's gradient bucket is several MB)
    sizes = [1 << 12, 1 << 16, 1 << 20] if quick else [1 << 10, 1 << 14, 1 << 18, 1 << 22,
                                                       1 << 24]
    out: dict = {k: {} for k in COLLECTIVES}
    for n in ranks:
        group = tuple(range(n))
        if comm.rank not in group:
            continue

        def agree(k: int, group=group) -> int:
            return int(comm.all_reduce(np.array([k], np.int64), group, op="max")[0])
        xs = [np.ones(s // 4, np.float32) for s in sizes]
        # every collective's rounds interleaved: a burst of load falls on all of them alike
        ts = _interleaved([lambda x=x, kind=kind: _collective(comm, kind, x, group)
                           for kind in COLLECTIVES for x in xs], 5 if quick else 9,
                          lambda: comm.barrier(group), agree)
        for j, kind in enumerate(COLLECTIVES):
            out[kind][n] = _fit([(_sent(kind, x.nbytes, n), t)
                                 for x, t in zip(xs, ts[j * len(xs):(j + 1) * len(xs)])])
    if comm.rank < max(ranks, default=0):
        n = max(ranks)
        out["boxing"] = {n: _boxing_rank(comm, n, quick, agree)}
        a, b = out["all_reduce"][n]

        def own(nbytes: float) -> float:  # the fit's price of an all-reduce of nbytes
            return a + _sent("all_reduce", nbytes, n) / b
        out["sync_curve"] = {n: _sync_rank(comm, n, quick, agree,
                                           {"small": own(256), "large": own(SYNC_LARGE_BYTES)})}
        if steps:
            out["collective"] = {n: _collective_rank(comm, n, quick, agree,
                                                     own(SYNC_LARGE_BYTES))}
    return out


def _apply(prof: Profile, res: dict) -> None:
    """``_comm_rank``'s figures into ``prof``."""
    res = dict(res)
    for n, curves in res.pop("sync_curve", {}).items():
        curve = curves["small"]
        prof.sync_curve[n] = [tuple(p) for p in curve]
        prof.sync[n] = curve[min(1, len(curve) - 1)][1]  # after 4 GEMMs: a few layers'
        prof.sync_large[n] = [tuple(p) for p in curves["large"]]
    prof.collective.update(res.pop("collective", {}))
    for n, table in res.pop("boxing", {}).items():
        for tr, ab in table.items():
            prof.boxing.setdefault(tr, {})[n] = ab
    prof.comm = res


def measure(world: int | None = None, quick: bool = False) -> Profile:
    """Measure the machine it runs on: GEMM and memory rates in this process, and the collectives of
    the communicator in use on 2..N ranks (under MPI: the launched ranks; otherwise the
    simulated world of ``world`` ranks, default 2).

    >>> p = measure(world=2, quick=True)
    >>> sorted(p.comm) == sorted(COLLECTIVES) and 2 in p.comm["all_reduce"]
    True
    """
    from tessera.distributed import comm as C
    comm = C.current() if C.launched_by_mpi() else None
    sync = comm.barrier if comm is not None else None
    rates = _rates(quick, sync)
    curve = rates["bandwidth_curve"]
    prof = Profile(gemm=rates["gemm"], gemm_curve=rates["gemm_curve"],
                   thin_curve=rates["thin_curve"], bandwidth=curve[-1][1],
                   bandwidth_curve=curve, update_curve=rates["update_curve"],
                   op_overhead=_op_overhead(quick, sync), source="measured")
    if comm is not None:
        res = _comm_rank(comm, list(range(2, comm.world_size + 1)), quick)
        comm.barrier()
        _apply(prof, res)
        prof.source = f"measured (MPI, {comm.world_size} ranks)"
        return prof
    from tessera.distributed.comm.fake import FakeWorld
    n = world or 2
    _apply(prof, FakeWorld(n).run(
        # (no step cost: the simulated ranks are threads of one process, whose products
        # take turns at the interpreter, which says nothing of a launched job's steps)
        lambda: _comm_rank(C.current(), list(range(2, n + 1)), quick, False))[0])
    prof.source = f"measured (simulated world, {n} ranks)"
    return prof


def main(argv: list[str] | None = None) -> Profile:
    """``python -m tessera.distributed.calibrate [--world N] [--quick] [--out PATH]``."""
    ap = argparse.ArgumentParser(prog="python -m tessera.distributed.calibrate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=None,
                    help="ranks of the simulated world outside mpiexec (default 2)")
    ap.add_argument("--quick", action="store_true", help="fewer and smaller measurements")
    ap.add_argument("--out", default=None, help="where to save (default: profile_path())")
    args = ap.parse_args(argv)
    prof = measure(args.world, args.quick)
    from tessera.distributed import comm as C
    if not C.launched_by_mpi() or C.current().rank == 0:
        path = save(prof, args.out)
        print(_describe(prof, path))
    return prof


def _describe(p: Profile, path: str) -> str:
    lines = [f"profile ({p.source}) saved to {path}",
             "gemm GFLOP/s: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in p.gemm.items()),
             f"memory bandwidth: {p.bandwidth / 1e9:.2f} GB/s" + (
                 " (" + ", ".join(f"{r / 1e9:.0f} at {b / 2 ** 20:.2g} MiB"
                                  for b, r in p.bandwidth_curve) + ")"
                 if p.bandwidth_curve else ""),
             f"op overhead: {p.op_overhead * 1e6:.1f} us"]
    if p.gemm_curve:
        lines.insert(2, "gemm curve: " + ", ".join(f"{r / 1e9:.0f} GFLOP/s at {f / 1e6:.3g} MFLOP"
                                                    for f, r in p.gemm_curve))
    if p.thin_curve:
        lines.insert(3, "thin products: " + ", ".join(f"{r / 1e9:.0f} GFLOP/s at {d} wide"
                                                       for d, r in p.thin_curve))
    if p.update_curve:
        lines.append("optimizer update: " + ", ".join(
            f"{r / 1e9:.0f} GB/s at {b / 2 ** 20:.2g} MiB" for b, r in p.update_curve))
    for kind, table in p.comm.items():
        for n, (a, b) in sorted(table.items()):
            lines.append(f"{kind:>15} n={n}: alpha {a * 1e6:.1f} us, beta {b / 1e9:.2f} GB/s")
    for n, v in sorted(p.sync.items()):
        curve = ", ".join(f"{s * 1e6:.0f} us after {g * 1e3:.1f} ms"
                          for g, s in p.sync_curve.get(n, []))
        lines.append(f"{'sync':>15} n={n}: {v * 1e6:.1f} us per collective in a step"
                     + (f" ({curve})" if curve else ""))
        large = ", ".join(f"{s * 1e6:.0f} us after {g * 1e3:.1f} ms"
                          for g, s in p.sync_large.get(n, []))
        if large:
            lines.append(f"{'sync':>15} n={n}, {SYNC_LARGE_BYTES >> 10} KiB or more: {large}")
    for n, v in sorted(p.collective.items()):
        lines.append(f"{'collective':>15} n={n}: {v * 1e6:.1f} us per collective in a step "
                     "(beyond its latency and sync)")
    for tr, table in p.boxing.items():
        for n, (a, b) in sorted(table.items()):
            lines.append(f"{'boxing ' + tr:>15} n={n}: alpha {a * 1e6:.1f} us, "
                         f"beta {b / 1e9:.2f} GB/s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
