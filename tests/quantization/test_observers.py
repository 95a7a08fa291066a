"""Observers against ``torch.ao.quantization``'s on the same batches: the statistics they
keep and the scale and zero point they choose (symmetric and affine, quint8 and qint8,
reduce_range, per tensor and per channel, and the histogram's L2-error search)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.ao.quantization as tao

import tessera
from tessera.ao import quantization as tq

_SCHEMES = {"affine": (torch.per_tensor_affine, tessera.per_tensor_affine),
            "symmetric": (torch.per_tensor_symmetric, tessera.per_tensor_symmetric),
            "pc_affine": (torch.per_channel_affine, tessera.per_channel_affine),
            "pc_symmetric": (torch.per_channel_symmetric, tessera.per_channel_symmetric)}
_DTYPES = {"quint8": (torch.quint8, tessera.quint8), "qint8": (torch.qint8, tessera.qint8)}


def _pair(name: str, scheme: str, dtype: str, **kw):
    t_s, o_s = _SCHEMES[scheme]
    t_d, o_d = _DTYPES[dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: reduce_range will be deprecated
        t = getattr(tao, name)(qscheme=t_s, dtype=t_d, **kw)
    return t, getattr(tq, name)(qscheme=o_s, dtype=o_d, **kw)


def _batches(shape=(4, 3, 5), n=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):  # ranges that grow, shift and shrink, with an outlier
        a = (rng.standard_normal(shape) * (1 + k % 3) + 0.3 * k).astype(np.float32)
        a.reshape(-1)[k] = 9.0 * (k + 1) * (-1) ** k
        out.append(a)
    return out


def _feed(t, o, batches):
    for a in batches:
        t(torch.from_numpy(a))
        o(tessera.from_numpy(a))


def _check_qparams(t, o, rtol=1e-6, zp_atol=0):
    ts, tz = t.calculate_qparams()
    os_, oz = o.calculate_qparams()
    np.testing.assert_allclose(os_.numpy().reshape(-1), ts.numpy().reshape(-1), rtol=rtol)
    np.testing.assert_allclose(oz.numpy().reshape(-1), tz.numpy().reshape(-1), atol=zp_atol)


@pytest.mark.parametrize("name", ["MinMaxObserver", "MovingAverageMinMaxObserver"])
@pytest.mark.parametrize("scheme", ["affine", "symmetric"])
@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_per_tensor_observers_match_torch(name, scheme, dtype, reduce_range):
    if (scheme, dtype, reduce_range) == ("symmetric", "quint8", True):
        with pytest.raises(NotImplementedError, match="symmetric"):
            _pair(name, scheme, dtype, reduce_range=reduce_range)
        return
    t, o = _pair(name, scheme, dtype, reduce_range=reduce_range)
    _feed(t, o, _batches())
    np.testing.assert_allclose(float(o.min_val), float(t.min_val), rtol=1e-6)
    np.testing.assert_allclose(float(o.max_val), float(t.max_val), rtol=1e-6)
    _check_qparams(t, o)


@pytest.mark.parametrize("name", ["PerChannelMinMaxObserver",
                                  "MovingAveragePerChannelMinMaxObserver"])
@pytest.mark.parametrize("scheme", ["pc_affine", "pc_symmetric"])
@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
@pytest.mark.parametrize("ch_axis", [0, 1])
def test_per_channel_observers_match_torch(name, scheme, dtype, ch_axis):
    t, o = _pair(name, scheme, dtype, ch_axis=ch_axis)
    _feed(t, o, _batches())
    np.testing.assert_allclose(o.min_val.numpy(), t.min_val.numpy(), rtol=1e-6)
    np.testing.assert_allclose(o.max_val.numpy(), t.max_val.numpy(), rtol=1e-6)
    _check_qparams(t, o)


@pytest.mark.parametrize("scheme", ["affine", "symmetric"])
@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("bins", [2048, 256])
def test_histogram_observer_matches_torch(scheme, dtype, reduce_range, bins):
    t, o = _pair("HistogramObserver", scheme, dtype, reduce_range=reduce_range, bins=bins)
    _feed(t, o, _batches((2000,), n=5))
    assert float(o.min_val) == float(t.min_val) and float(o.max_val) == float(t.max_val)
    # re-binning a histogram into a wider range sums in another order: float32 rounding
    np.testing.assert_allclose(o.histogram.numpy(), t.histogram.numpy(), atol=0.1)
    _check_qparams(t, o, rtol=1e-4, zp_atol=1)


@pytest.mark.filterwarnings("ignore:torch.inf detected")
def test_histogram_observer_edge_cases_match_torch():
    t, o = _pair("HistogramObserver", "affine", "quint8", bins=64)
    _feed(t, o, [np.full(10, 2.5, np.float32), np.array([1.0, np.inf, 4.0], np.float32),
                 np.zeros(0, np.float32)])
    np.testing.assert_allclose(o.histogram.numpy(), t.histogram.numpy(), atol=1e-5)
    _check_qparams(t, o, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="per_tensor"):
        tq.HistogramObserver(qscheme=tessera.per_channel_affine)


def test_histogram_qconfig_calibrates_a_model():
    """A qconfig with a histogram activation observer runs the eager flow end to end."""
    from tessera import nn
    qc = tq.QConfig(activation=tq.HistogramObserver.with_args(reduce_range=True),
                    weight=tq.default_per_channel_weight_observer)
    m = nn.Sequential(tq.QuantStub(), nn.Linear(6, 4), tq.DeQuantStub()).eval()
    m.qconfig = qc
    p = tq.prepare(m)
    x = tessera.randn(32, 6)
    p(x)
    q = tq.convert(p)
    assert (q(x) - m(x)).abs().max().item() < 0.1


@pytest.mark.parametrize("which", ["default_fused_act_fake_quant", "default_fused_wt_fake_quant",
                                   "default_fused_per_channel_wt_fake_quant"])
@pytest.mark.parametrize("span", [3.0, 1e-6, 0.0])
def test_fused_fake_quant_qparams_match_torch(which, span):
    """PyTorch's fused kernel chooses qparams its own way (ATen's ChooseQuantizationParams:
    symmetric ranges of -128..127 steps, a floor on tiny scales)."""
    t, o = getattr(tao, which)(), getattr(tq, which)()
    rng = np.random.default_rng(1)
    for k in range(3):
        a = (rng.standard_normal((4, 6)) * span + (0.2 * span if k else 0)).astype(np.float32)
        ty = t(torch.from_numpy(a))
        oy = o(tessera.from_numpy(a))
        np.testing.assert_allclose(oy.numpy(), ty.numpy(), atol=1e-7)
    np.testing.assert_allclose(o.scale.numpy(), t.scale.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(o.zero_point.numpy(), t.zero_point.numpy())
    _check_qparams(t, o)  # what convert uses: the observer's, not the kernel's
