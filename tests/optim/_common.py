"""Helpers shared by the optimizer and scheduler tests: the same parameters, loss and
state_dict conversions on tessera and on torch (the oracle)."""
from __future__ import annotations

import numpy as np
import torch

import tessera
import tessera.nn  # noqa: F401  (tessera/__init__ does not import these yet)
import tessera.optim  # noqa: F401

RNG = np.random.default_rng(1234)
W0 = RNG.standard_normal((3, 4))
B0 = RNG.standard_normal((4,))
C = RNG.uniform(0.5, 2.0, (3, 4))
T = RNG.standard_normal((3, 4))
D = RNG.uniform(0.5, 1.5, (4,))
NP_DTYPE = {"float32": np.float32, "float64": np.float64}


def make_params(L, dtype: str, extra_unused: bool = True) -> list:
    """W (3, 4) and b (4,) with fixed values, plus one parameter that never gets a grad."""
    arrays = [W0, B0] + ([np.ones(2)] if extra_unused else [])
    return [L.nn.Parameter(L.tensor(a.astype(NP_DTYPE[dtype]))) for a in arrays]


def loss_fn(params):
    """A smooth, non-quadratic loss written with basic ops that both libraries have."""
    w, b = params[0], params[1]
    c, t, d = (_like(w, x) for x in (C, T, D))
    r = w + b - t
    return (c * r ** 2).sum() + 0.1 * (w ** 4).mean() + (d * b * b).sum() + (r ** 3).mean()


def _like(ref, arr):
    L = torch if isinstance(ref, torch.Tensor) else tessera
    return L.tensor(arr.astype(NP_DTYPE[str(ref.dtype).split(".")[-1]]))


def snapshot(params) -> list[np.ndarray]:
    return [np.array(p.detach().numpy(), copy=True) for p in params]


def run_steps(opt, params, n: int) -> list[list[np.ndarray]]:
    """``n`` steps of ``opt`` on ``loss_fn(params)``: the parameters after each."""
    traj = []
    for _ in range(n):
        opt.zero_grad()
        loss_fn(params).backward()
        opt.step()
        traj.append(snapshot(params))
    return traj


def to_torch(obj):
    """A tessera state_dict (nested dicts/lists of tensors) as PyTorch's, through NumPy."""
    if isinstance(obj, tessera.Tensor):
        return torch.from_numpy(np.array(obj.detach().numpy(), copy=True))
    if isinstance(obj, dict):
        return {k: to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_torch(v) for v in obj)
    return obj


def to_tessera(obj):
    """A PyTorch state_dict as tessera's, through NumPy."""
    if isinstance(obj, torch.Tensor):
        return tessera.from_numpy(np.array(obj.detach().numpy(), copy=True))
    if isinstance(obj, dict):
        return {k: to_tessera(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_tessera(v) for v in obj)
    return obj


def tol(dtype: str) -> dict:
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == "float32" else {"rtol": 1e-10, "atol": 1e-12}
