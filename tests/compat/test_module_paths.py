"""PyTorch's module paths: every public class and function of ``torch.nn``,
``torch.optim`` (with ``lr_scheduler``) and ``torch.utils.data`` that tessera has (by name,
in the same namespace) is importable from PyTorch's dotted path with ``torch`` replaced by
``tessera``, and a class's ``__module__``/``__qualname__`` name that path, so pickles and
``add_safe_globals`` refer to it where PyTorch's do."""
from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest
import torch
import torch.nn
import torch.optim
import torch.optim.lr_scheduler
import torch.utils.data

import tessera

ROOTS = ["torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.utils",
         "torch.nn.utils.rnn", "torch.nn.parameter", "torch.optim", "torch.optim.lr_scheduler",
         "torch.utils.data"]
# PyTorch's subpackages whose names are other classes of the same name (quantized and
# fused layers), not the float layers tessera has
SKIP = ("torch.nn.quantized", "torch.nn.qat", "torch.nn.intrinsic", "torch.nn.quantizable",
        "torch.nn.utils.prune", "torch.utils.data.datapipes")


def _public(modname: str) -> bool:
    return not any(p.startswith("_") for p in modname.split(".")) and \
        not modname.startswith(SKIP)


def _objects():
    """(torch's home module, name, tessera's object) for every public class or function
    of the packages above that tessera has in the namespace PyTorch exports it from."""
    seen = {}
    mods = list(ROOTS)
    for pkg in (torch.nn, torch.optim, torch.utils.data):
        mods += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
                 if _public(m.name)]
    for modname in mods:
        try:
            mod = importlib.import_module(modname)
            tmod = importlib.import_module(modname.replace("torch", "tessera", 1))
        except ImportError:
            continue
        for name, obj in vars(mod).items():
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith(("torch.nn", "torch.optim", "torch.utils.data")) or \
                    not _public(home):
                continue
            mine = getattr(tmod, name, None)
            if mine is not None:
                seen[(home, name)] = mine
    return sorted(seen.items(), key=lambda kv: kv[0])


OBJECTS = _objects()


def test_walk_found_the_usual_names():
    names = {n for (_, n), _ in OBJECTS}
    assert {"Conv2d", "MultiheadAttention", "PixelShuffle", "Adam", "StepLR", "DataLoader",
            "Parameter", "pad_sequence"} <= names


@pytest.mark.parametrize("home,name", [k for k, _ in OBJECTS])
def test_reachable_at_pytorch_path(home, name):
    path = home.replace("torch", "tessera", 1)
    mine = dict(OBJECTS)[(home, name)]
    module = importlib.import_module(path)
    assert getattr(module, name, None) is mine, f"{path}.{name} is missing"
    if inspect.isclass(mine):
        ref = getattr(importlib.import_module(home), name)
        assert (mine.__module__, mine.__qualname__) == (path, ref.__qualname__)


def test_pickle_names_pytorch_path():
    for obj, path in ((tessera.nn.PixelShuffle(2), b"tessera.nn.modules.pixelshuffle"),
                      (tessera.nn.InstanceNorm2d(3), b"tessera.nn.modules.instancenorm"),
                      (tessera.nn.MultiheadAttention(4, 2), b"tessera.nn.modules.activation")):
        data = pickle.dumps(obj)
        assert path in data
        assert type(pickle.loads(data)) is type(obj)
    opt = tessera.optim.SGD([tessera.nn.Parameter(tessera.ones(1))], lr=0.1)
    assert b"tessera.optim.lr_scheduler" in pickle.dumps(
        tessera.optim.lr_scheduler.StepLR(opt, 2))


def test_legacy_scheduler_base():
    from tessera.optim.lr_scheduler import _LRScheduler
    assert issubclass(_LRScheduler, tessera.optim.lr_scheduler.LRScheduler)
    assert issubclass(torch.optim.lr_scheduler._LRScheduler, torch.optim.lr_scheduler.LRScheduler)
