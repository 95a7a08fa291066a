"""One generic test for every op-info entry: tessera vs PyTorch on the same inputs."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import tessera
from tests.opinfo import OP_DB

DTYPE_NAME = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}


def _cases(pred=lambda info, dt: True, sample_pred=lambda s: True):
    for info in OP_DB:
        for dt in info.dtypes:
            dt = np.dtype(dt)
            if not pred(info, dt):
                continue
            rng = np.random.default_rng(zlib.crc32(f"{info.name}/{dt}".encode()))
            for i, s in enumerate(info.samples(rng, dt)):
                if sample_pred(s):
                    yield pytest.param(info, s, id=f"{info.name}-{dt.name}-{i}")


def _noncontig(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0 or a.size == 0:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _convert(lib, sample, grad: bool, noncontig: bool = False, device=None):
    leaves = []

    def conv(i, a):
        if isinstance(a, np.ndarray):
            arr = _noncontig(a) if noncontig else a.copy()
            if lib is torch:
                t = torch.from_numpy(arr)
            elif device == "meta":
                t = tessera.empty(a.shape, dtype=tessera.as_tensor(a[:0] if a.ndim else
                                                                   a.reshape(1)[:0]).dtype,
                                  device="meta")
            else:
                t = tessera.from_numpy(arr)
            wants = sample.grad_args is None or i in sample.grad_args
            if grad and wants and a.dtype.kind == "f":
                t.requires_grad_(True)
                leaves.append(t)
            return t
        if isinstance(a, list):
            return [conv(i, x) for x in a]
        if isinstance(a, tuple) and any(isinstance(x, np.ndarray) for x in a):
            return tuple(conv(i, x) for x in a)
        return a
    args = [conv(i, a) for i, a in enumerate(sample.args)]
    kwargs = {k: conv(-1, v) if isinstance(v, np.ndarray) else v
              for k, v in sample.kwargs.items()}
    return args, kwargs, leaves


def _small(sample):
    return all(a.size <= 60 for a in _flat(list(sample.args))
               if isinstance(a, np.ndarray))


def _flat(out):
    if isinstance(out, (tuple, list)):
        res = []
        for o in out:
            res.extend(_flat(o))
        return res
    return [out]


def _np(t):
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return t.detach()._to_numpy() if isinstance(t, tessera.Tensor) else np.asarray(t)


def _compare(info, ours, ref, what="output", atol=None, rtol=None):
    fo, fr = _flat(ours), _flat(ref)
    assert len(fo) == len(fr), f"{what}: {len(fo)} outputs, torch gives {len(fr)}"
    for k, (o, r) in enumerate(zip(fo, fr)):
        if isinstance(r, torch.Tensor):
            assert isinstance(o, tessera.Tensor), f"{what} {k}: expected a Tensor, got {type(o)}"
            assert tuple(o.shape) == tuple(r.shape), \
                f"{what} {k}: shape {tuple(o.shape)} vs torch {tuple(r.shape)}"
            assert o.dtype.name == str(r.dtype).split(".")[-1], \
                f"{what} {k}: dtype {o.dtype} vs torch {r.dtype}"
            if info.random or k in info.skip_value_outputs:
                continue
            np.testing.assert_allclose(_np(o).astype(np.float64) if o.dtype.category >= 2
                                       else _np(o), _np(r).astype(np.float64)
                                       if o.dtype.category >= 2 else _np(r),
                                       atol=atol or info.atol, rtol=rtol or info.rtol,
                                       equal_nan=True, err_msg=f"{what} {k}")
        elif r is None:
            assert o is None
        else:
            if info.random:
                continue
            assert type(o) in (type(r), int, float, bool) or isinstance(o, type(r)), \
                f"{what} {k}: {type(o)} vs {type(r)}"
            np.testing.assert_allclose(np.asarray(o, dtype=float), np.asarray(r, dtype=float),
                                       atol=info.atol, rtol=info.rtol, equal_nan=True)


def _run(lib, info, sample, **kw):
    args, kwargs, leaves = _convert(lib, sample, **kw)
    return info.fn(lib, *args, **kwargs), leaves


@pytest.mark.parametrize("info,sample", list(_cases()))
def test_forward_backward_vs_torch(info, sample):
    grad = info.differentiable and not info.random
    try:
        ref, ref_leaves = _run(torch, info, sample, grad=grad)
    except Exception as e:  # torch rejects the sample: tessera must reject it the same way
        with pytest.raises(type(e) if isinstance(e, (TypeError, IndexError, ValueError))
                           else (RuntimeError, NotImplementedError, ValueError, TypeError,
                                 IndexError)):
            _run(tessera, info, sample, grad=grad)
        return
    ours, our_leaves = _run(tessera, info, sample, grad=grad)
    _compare(info, ours, ref)
    if not grad or not ref_leaves:
        return
    rs = [r for r in _flat(ref) if isinstance(r, torch.Tensor) and r.requires_grad]
    os_ = [o for o, r in zip(_flat(ours), _flat(ref))
           if isinstance(r, torch.Tensor) and r.requires_grad]
    if not rs:
        return
    rng = np.random.default_rng(0)
    cots = [rng.standard_normal(tuple(r.shape)).astype(_np(r).dtype) for r in rs]
    rg = torch.autograd.grad(rs, ref_leaves, [torch.from_numpy(c) for c in cots],
                             allow_unused=True)
    og = tessera.autograd.grad(os_, our_leaves, [tessera.from_numpy(c.copy()) for c in cots],
                               allow_unused=True)
    for k, (a, b) in enumerate(zip(og, rg)):
        b = torch.zeros_like(ref_leaves[k]) if b is None else b
        a = tessera.zeros_like(our_leaves[k]) if a is None else a
        _compare(info, a, b, what=f"grad of input {k}", atol=info.grad_atol,
                 rtol=info.grad_rtol)


def _layout_dtype(info, dt) -> bool:
    """Layout and shape checks (non-contiguous, meta) do not depend on float32 vs float64:
    run them once per sample structure, on float64 only when the entry has no float32."""
    return not (dt == np.float64 and np.dtype(np.float32) in map(np.dtype, info.dtypes))


@pytest.mark.parametrize("info,sample", list(_cases(
    lambda info, dt: info.noncontiguous and dt.kind == "f" and _layout_dtype(info, dt))))
def test_noncontiguous_inputs(info, sample):
    try:
        ref, _ = _run(torch, info, sample, grad=False)
    except Exception:
        return
    ours, _ = _run(tessera, info, sample, grad=False, noncontig=True)
    _compare(info, ours, ref)


@pytest.mark.parametrize("info,sample", list(_cases(
    lambda info, dt: info.meta and _layout_dtype(info, dt))))
def test_meta_device(info, sample):
    try:
        ours, _ = _run(tessera, info, sample, grad=False)
    except Exception:
        return
    meta, _ = _run(tessera, info, sample, grad=False, device="meta")
    fo, fm = _flat(ours), _flat(meta)
    assert len(fo) == len(fm)
    for o, m in zip(fo, fm):
        if isinstance(o, tessera.Tensor):
            assert m.device.type == "meta" and tuple(m.shape) == tuple(o.shape), \
                f"meta shape {tuple(m.shape)} vs cpu {tuple(o.shape)}"
            assert m.dtype is o.dtype


# gradcheck costs two forward passes per input element: it runs on the small samples
@pytest.mark.parametrize("info,sample", list(_cases(
    lambda info, dt: info.differentiable and info.gradcheck and not info.random
    and dt == np.float64, _small)))
def test_gradcheck_float64(info, sample):
    args, kwargs, leaves = _convert(tessera, sample, grad=True)
    if not leaves:
        return
    try:
        info.fn(tessera, *args, **kwargs)
    except Exception:
        return
    assert tessera.autograd.gradcheck(lambda *a: info.fn(tessera, *a, **kwargs), args,
                                      atol=1e-5, rtol=1e-3)


def test_every_registered_op_has_an_entry():
    from tessera.ops.registry import REGISTRY
    covered = {op for info in OP_DB for op in info.covered_ops()}
    unknown = covered - set(REGISTRY)
    assert not unknown, f"op-info entries name ops that are not registered: {sorted(unknown)}"
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"registered ops without an op-info entry: {missing}"
