"""Learning-rate schedulers against PyTorch: the lr (and momentum/beta1) sequences over
30-50 steps, state_dict round trips and errors."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import tessera
import tessera.optim  # noqa: F401  (tessera/__init__ does not import it yet)
from tests.optim._common import make_params


def _optimizer(L, kind: str = "sgd"):
    """Two param groups with different lrs (and a momentum the cyclic schedulers move)."""
    w, b = make_params(L, "float32", extra_unused=False)
    groups = [{"params": [w]}, {"params": [b], "lr": 0.05}]
    if kind == "adam":
        return L.optim.Adam(groups, lr=0.1)
    return L.optim.SGD(groups, lr=0.1, momentum=0.9)


def _group_values(opt) -> list:
    out = []
    for g in opt.param_groups:
        out.append((g["lr"], g.get("momentum"), g["betas"][0] if "betas" in g else None))
    return out


def _run(L, make_sched, steps: int, kind: str = "sgd", metrics=None):
    opt = _optimizer(L, kind)
    sched = make_sched(L, opt)
    seq = [(list(sched.get_last_lr()), _group_values(opt))]
    for i in range(steps):
        opt.step()
        if metrics is not None:
            sched.step(metrics[i])
        else:
            sched.step()
        seq.append((list(sched.get_last_lr()), _group_values(opt)))
    return seq, sched


def _flat(x) -> list:
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [x]


def _assert_same(ours, ref):
    """Equal structure and None entries; numbers equal to 1e-12 relative."""
    assert len(ours) == len(ref)
    for step, (o, r) in enumerate(zip(ours, ref)):
        o, r = _flat(o), _flat(r)
        assert len(o) == len(r), f"step {step}"
        for a, b in zip(o, r):
            if a is None or b is None:
                assert a is b, f"step {step}: {a} vs {b}"
            else:
                assert a == pytest.approx(b, rel=1e-12, abs=1e-15), f"step {step}: {o} vs {r}"


def S(L):
    return L.optim.lr_scheduler


SCHEDULERS = {
    "StepLR": (lambda L, o: S(L).StepLR(o, step_size=7, gamma=0.5), 40, "sgd"),
    "MultiStepLR": (lambda L, o: S(L).MultiStepLR(o, milestones=[5, 12, 12, 30], gamma=0.3),
                    40, "sgd"),
    "ExponentialLR": (lambda L, o: S(L).ExponentialLR(o, gamma=0.93), 40, "sgd"),
    "CosineAnnealingLR": (lambda L, o: S(L).CosineAnnealingLR(o, T_max=10, eta_min=0.001),
                          45, "sgd"),
    "CosineAnnealingWarmRestarts": (
        lambda L, o: S(L).CosineAnnealingWarmRestarts(o, T_0=5, T_mult=1, eta_min=0.01), 40,
        "sgd"),
    "CosineAnnealingWarmRestarts-Tmult2": (
        lambda L, o: S(L).CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001), 50,
        "sgd"),
    "LinearLR": (lambda L, o: S(L).LinearLR(o, start_factor=0.25, end_factor=0.9,
                                            total_iters=12), 30, "sgd"),
    "ConstantLR": (lambda L, o: S(L).ConstantLR(o, factor=0.4, total_iters=6), 30, "sgd"),
    "LambdaLR": (lambda L, o: S(L).LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (e + 1)]),
                 35, "sgd"),
    "MultiplicativeLR": (lambda L, o: S(L).MultiplicativeLR(o, lambda e: 0.97 if e % 2 else 1.0),
                         35, "sgd"),
    "PolynomialLR": (lambda L, o: S(L).PolynomialLR(o, total_iters=20, power=2.0), 30, "sgd"),
    "OneCycleLR-cos-sgd": (lambda L, o: S(L).OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=40),
                           39, "sgd"),
    "OneCycleLR-linear-three-phase-adam": (
        lambda L, o: S(L).OneCycleLR(o, max_lr=0.8, epochs=5, steps_per_epoch=8,
                                     anneal_strategy="linear", three_phase=True,
                                     pct_start=0.25, base_momentum=0.8, max_momentum=0.9),
        40, "adam"),
    "OneCycleLR-no-momentum": (lambda L, o: S(L).OneCycleLR(o, max_lr=0.3, total_steps=30,
                                                            cycle_momentum=False), 30, "sgd"),
    "CyclicLR-triangular2": (
        lambda L, o: S(L).CyclicLR(o, base_lr=0.01, max_lr=[0.1, 0.2], step_size_up=4,
                                   step_size_down=6, mode="triangular2"), 40, "sgd"),
    "CyclicLR-exp-range-adam": (
        lambda L, o: S(L).CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=5,
                                   mode="exp_range", gamma=0.97, base_momentum=0.8,
                                   max_momentum=0.95), 40, "adam"),
    "SequentialLR": (
        lambda L, o: S(L).SequentialLR(o, [S(L).LinearLR(o, start_factor=0.1, total_iters=5),
                                           S(L).ExponentialLR(o, gamma=0.9)], milestones=[5]),
        40, "sgd"),
    "SequentialLR-three": (
        lambda L, o: S(L).SequentialLR(o, [S(L).ConstantLR(o, factor=0.5, total_iters=3),
                                           S(L).CosineAnnealingLR(o, T_max=8),
                                           S(L).StepLR(o, step_size=4, gamma=0.5)],
                                       milestones=[3, 12]), 40, "sgd"),
    "ChainedScheduler": (
        lambda L, o: S(L).ChainedScheduler([S(L).ConstantLR(o, factor=0.5, total_iters=4),
                                            S(L).ExponentialLR(o, gamma=0.9)]), 35, "sgd"),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_lr_sequence_matches_torch(name):
    make, steps, kind = SCHEDULERS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's SequentialLR/ChainedScheduler warnings
        ours, _ = _run(tessera, make, steps, kind)
        ref, _ = _run(torch, make, steps, kind)
    _assert_same(ours, ref)


PLATEAU = [
    ({}, [1.0 / (i + 1) if i < 8 else 0.2 for i in range(40)]),
    ({"mode": "max", "factor": 0.5, "patience": 2, "threshold_mode": "abs", "threshold": 0.01,
      "cooldown": 3}, [min(i, 10) * 0.1 + (0.001 * (i % 3)) for i in range(40)]),
    ({"factor": 0.2, "patience": 1, "min_lr": [0.002, 0.001], "eps": 1e-12},
     [5.0 - 0.1 * min(i, 5) for i in range(40)]),
    ({"mode": "min", "threshold_mode": "rel", "threshold": 0.1, "patience": 3, "cooldown": 1},
     [math.cos(i / 3) + 2 for i in range(45)]),
]


@pytest.mark.parametrize("kw,metrics", PLATEAU, ids=[str(k) for k, _ in PLATEAU])
def test_reduce_lr_on_plateau_matches_torch(kw, metrics):
    def make(L, o):
        return S(L).ReduceLROnPlateau(o, **kw)
    ours, o_sched = _run(tessera, make, len(metrics), metrics=metrics)
    ref, r_sched = _run(torch, make, len(metrics), metrics=metrics)
    _assert_same(ours, ref)
    assert o_sched.best == r_sched.best and o_sched.num_bad_epochs == r_sched.num_bad_epochs


def test_plateau_accepts_a_tensor_metric():
    opt = _optimizer(tessera)
    sched = S(tessera).ReduceLROnPlateau(opt, patience=0)
    sched.step(tessera.tensor(1.0))
    sched.step(tessera.tensor(2.0))
    assert sched.get_last_lr() == pytest.approx([0.01, 0.005])


def test_warm_restarts_with_fractional_epochs():
    def run(L):
        opt = _optimizer(L)
        sched = S(L).CosineAnnealingWarmRestarts(opt, T_0=4, T_mult=2, eta_min=0.001)
        lrs = []
        iters = 5
        for epoch in range(12):
            for i in range(iters):
                opt.step()
                sched.step(epoch + i / iters)
                lrs.append(sched.get_last_lr())
        return lrs
    ours, ref = run(tessera), run(torch)
    for o, r in zip(ours, ref):
        assert o == pytest.approx(r, rel=1e-12)


def test_closed_form_with_epoch_argument():
    def run(L):
        opt = _optimizer(L)
        sched = S(L).StepLR(opt, step_size=3, gamma=0.5)
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for epoch in (1, 4, 7, 2, 10):
                opt.step()
                sched.step(epoch)
                out.append(sched.get_last_lr())
        return out
    _assert_same(run(tessera), run(torch))


def test_one_cycle_raises_past_total_steps():
    for L in (tessera, torch):
        opt = _optimizer(L)
        sched = S(L).OneCycleLR(opt, max_lr=0.1, total_steps=3)
        for _ in range(2):
            opt.step()
            sched.step()
        opt.step()
        sched.step()
        with pytest.raises(ValueError, match="Tried to step 4 times"):
            sched.step()


STATEFUL = ["StepLR", "MultiStepLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts-Tmult2",
            "LinearLR", "OneCycleLR-cos-sgd", "CyclicLR-triangular2", "SequentialLR",
            "ChainedScheduler", "LambdaLR", "PolynomialLR"]


@pytest.mark.parametrize("name", STATEFUL)
def test_state_dict_round_trip(name):
    """Stop after 12 steps, rebuild optimizer and scheduler, load both state_dicts, and the
    next steps equal the uninterrupted run's; the saved keys equal PyTorch's."""
    make, steps, kind = SCHEDULERS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = _optimizer(tessera, kind)
        sched = make(tessera, opt)
        for _ in range(12):
            opt.step()
            sched.step()
        saved_opt = copy.deepcopy(opt.state_dict())
        saved = copy.deepcopy(sched.state_dict())
        expected = []
        for _ in range(steps - 12):
            opt.step()
            sched.step()
            expected.append((sched.get_last_lr(), _group_values(opt)))

        opt2 = _optimizer(tessera, kind)
        sched2 = make(tessera, opt2)
        opt2.load_state_dict(saved_opt)
        sched2.load_state_dict(saved)
        got = []
        for _ in range(steps - 12):
            opt2.step()
            sched2.step()
            got.append((sched2.get_last_lr(), _group_values(opt2)))
        _assert_same(got, expected)

        r_opt = _optimizer(torch, kind)
        r_sched = make(torch, r_opt)
        assert _keys(sched.state_dict()) == _keys(r_sched.state_dict())


def _keys(sd):
    if isinstance(sd, dict):
        return {k: _keys(v) for k, v in sd.items() if k not in ("_scale_fn_ref",)}
    if isinstance(sd, list) and sd and isinstance(sd[0], dict):
        return [_keys(v) for v in sd]
    return None


def test_plateau_state_dict_round_trip():
    metrics = [1.0, 0.9, 0.9, 0.95, 0.9, 0.91, 0.92, 0.5, 0.6, 0.7, 0.8, 0.9]
    opt = _optimizer(tessera)
    sched = S(tessera).ReduceLROnPlateau(opt, patience=1, cooldown=1)
    for m in metrics[:6]:
        sched.step(m)
    sd = copy.deepcopy(sched.state_dict())
    sched2 = S(tessera).ReduceLROnPlateau(_optimizer(tessera), mode="max")
    sched2.optimizer.load_state_dict(copy.deepcopy(opt.state_dict()))
    sched2.load_state_dict(sd)
    for m in metrics[6:]:
        sched.step(m)
        sched2.step(m)
        assert sched.get_last_lr() == sched2.get_last_lr()
    r_sched = S(torch).ReduceLROnPlateau(_optimizer(torch))
    assert set(sched.state_dict()) == set(r_sched.state_dict())


def test_initial_lr_and_last_epoch():
    for L in (tessera, torch):
        opt = _optimizer(L)
        sched = S(L).StepLR(opt, step_size=2)
        assert sched.last_epoch == 0 and sched.base_lrs == [0.1, 0.05]
        assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.05]
        with pytest.raises(KeyError):
            S(L).StepLR(_optimizer(L), step_size=2, last_epoch=3)
        resumed = S(L).ExponentialLR(opt, gamma=0.5, last_epoch=3)
        assert resumed.last_epoch == 4


def _same_error(fn):
    with pytest.raises(Exception) as ref:
        fn(torch)
    with pytest.raises(type(ref.value)) as ours:
        fn(tessera)
    assert str(ours.value) == str(ref.value)


BAD = [
    lambda L, o: S(L).ConstantLR(o, factor=1.5),
    lambda L, o: S(L).LinearLR(o, start_factor=0),
    lambda L, o: S(L).LinearLR(o, end_factor=1.5),
    lambda L, o: S(L).ReduceLROnPlateau(o, factor=1.0),
    lambda L, o: S(L).ReduceLROnPlateau(o, mode="up"),
    lambda L, o: S(L).ReduceLROnPlateau(o, threshold_mode="x"),
    lambda L, o: S(L).ReduceLROnPlateau(o, min_lr=[0.1]),
    lambda L, o: S(L).CosineAnnealingWarmRestarts(o, T_0=0),
    lambda L, o: S(L).CosineAnnealingWarmRestarts(o, T_0=2, T_mult=1.5),
    lambda L, o: S(L).OneCycleLR(o, max_lr=0.1),
    lambda L, o: S(L).OneCycleLR(o, max_lr=0.1, total_steps=0),
    lambda L, o: S(L).OneCycleLR(o, max_lr=0.1, total_steps=5, pct_start=1.5),
    lambda L, o: S(L).OneCycleLR(o, max_lr=0.1, total_steps=5, anneal_strategy="exp"),
    lambda L, o: S(L).OneCycleLR(o, max_lr=[0.1], total_steps=5),
    lambda L, o: S(L).LambdaLR(o, [lambda e: 1.0]),
    lambda L, o: S(L).SequentialLR(o, [S(L).StepLR(o, 2)], milestones=[3]),
    lambda L, o: S(L).SequentialLR(o, [], milestones=[]),
    lambda L, o: S(L).SequentialLR(o, [S(L).ReduceLROnPlateau(o)], milestones=[]),
    lambda L, o: S(L).ChainedScheduler([]),
    lambda L, o: S(L).StepLR(object(), 2),
    lambda L, o: S(L).CyclicLR(o, 0.1, 1.0, mode="zigzag"),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_invalid_arguments_raise_like_torch(i):
    def fn(L):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            BAD[i](L, _optimizer(L))
    _same_error(fn)


def test_cycle_momentum_needs_momentum():
    def fn(L):
        p = L.nn.Parameter(L.ones(2))
        S(L).OneCycleLR(L.optim.Adagrad([p]), max_lr=0.1, total_steps=5)
    _same_error(fn)


def test_step_order_warning():
    for L in (tessera, torch):
        opt = _optimizer(L)
        sched = S(L).StepLR(opt, step_size=2)
        with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
            sched.step()
    opt = _optimizer(tessera)
    sched = S(tessera).StepLR(opt, step_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
        sched.step()


def test_every_torch_scheduler_at_its_torch_path():
    """``torch.optim.lr_scheduler.X`` is ``tessera.optim.lr_scheduler.X`` for every X, and
    the module lists the same names (the schedulers live in private parts it gathers)."""
    ours = tessera.optim.lr_scheduler
    assert sorted(ours.__all__) == sorted(torch.optim.lr_scheduler.__all__)
    for name in torch.optim.lr_scheduler.__all__:
        assert issubclass(getattr(ours, name), ours.LRScheduler), name
