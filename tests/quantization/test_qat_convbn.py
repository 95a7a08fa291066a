"""Quantization-aware training with the batch norm kept (``ConvBn2d``, ``ConvBnReLU2d``)
against ``torch.ao``: the same fused modules from ``fuse_modules`` in train mode, the same
training steps (outputs, running statistics) before and after ``freeze_bn_stats``, and the
same INT8 model from ``convert``, which folds the batch norm."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.ao.nn.intrinsic.qat as tnniqat
import torch.ao.quantization as tao

import tessera
from tessera import nn
from tessera.ao import quantization as tq
from tessera.ao.nn.intrinsic import qat as nniqat


class _TNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tao.QuantStub()
        self.conv, self.bn, self.relu = torch.nn.Conv2d(3, 6, 3, padding=1), \
            torch.nn.BatchNorm2d(6), torch.nn.ReLU()
        self.conv2, self.bn2 = torch.nn.Conv2d(6, 4, 3, bias=False), torch.nn.BatchNorm2d(4)
        self.dequant = tao.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.bn2(self.conv2(x)))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), \
            nn.ReLU()
        self.conv2, self.bn2 = nn.Conv2d(6, 4, 3, bias=False), nn.BatchNorm2d(4)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.bn2(self.conv2(x)))


FUSE = [["conv", "bn", "relu"], ["conv2", "bn2"]]


def _qconfigs(version):
    """Both libraries' default QAT qconfigs (version 1: PyTorch's fused fake quantizers)."""
    return tao.get_default_qat_qconfig("x86", version), tq.get_default_qat_qconfig("x86",
                                                                                  version)


def _models(version=1):
    torch.manual_seed(0)
    t, o = _TNet(), _Net()
    o.load_state_dict({k: tessera.from_numpy(v.detach().numpy().copy())
                       for k, v in t.state_dict().items()})
    t = tao.fuse_modules_qat(t.train(), FUSE)
    o = tq.fuse_modules(o.train(), FUSE)   # train mode: the batch norms stay
    tq_, oq = _qconfigs(version)
    t.qconfig, o.qconfig = tq_, oq
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tao.prepare_qat(t), tq.prepare_qat(o)


def test_fuse_in_train_mode_gives_convbn_modules():
    _, o = _models()
    assert type(o.conv) is nniqat.ConvBnReLU2d and type(o.conv2) is nniqat.ConvBn2d
    assert isinstance(o.bn, nn.Identity) and isinstance(o.conv.bn, nn.BatchNorm2d)
    m = tq.fuse_modules(_Net().eval(), FUSE)  # eval mode still folds at once
    assert type(m.conv).__name__ == "ConvReLU2d" and type(m.conv2) is nn.Conv2d


@pytest.mark.parametrize("version", [0, 1])
def test_convbn_qat_matches_torch_through_freeze_bn_and_convert(version):
    t, o = _models(version)
    topt = torch.optim.SGD(t.parameters(), lr=0.1)
    oopt = tessera.optim.SGD(o.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for step in range(5):
        if step == 3:
            t.apply(tnniqat.freeze_bn_stats)
            o.apply(nniqat.freeze_bn_stats)
            assert not o.conv.bn.training and o.conv.freeze_bn
            o.train()  # a frozen batch norm stays in eval mode
            assert not o.conv.bn.training
        x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
        ty, oy = t(torch.from_numpy(x)), o(tessera.from_numpy(x))
        np.testing.assert_allclose(oy.detach().numpy(), ty.detach().numpy(), atol=1e-5)
        for opt, loss in ((topt, ty.square().mean()), (oopt, oy.square().mean())):
            opt.zero_grad()
            loss.backward()
            opt.step()
        np.testing.assert_allclose(o.conv.bn.running_mean.numpy(),
                                   t.conv.bn.running_mean.numpy(), atol=1e-5)
        np.testing.assert_allclose(o.conv.weight.detach().numpy(),
                                   t.conv.weight.detach().numpy(), atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tint8, oint8 = tao.convert(t.eval()), tq.convert(o.eval())
    assert type(oint8.conv).__name__ == "Conv2d" and oint8.conv._RELU
    assert not any(isinstance(m, nn.BatchNorm2d) for m in oint8.modules())
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = tint8(torch.from_numpy(x)).numpy()
    got = oint8(tessera.from_numpy(x)).numpy()
    step = float(oint8.conv2.scale)
    assert np.abs(got - want).max() <= step * 1.01


@pytest.mark.parametrize("cls", [nniqat.ConvBn2d, nniqat.ConvBnReLU2d])
def test_convbn_state_dict_and_update_bn_stats(cls):
    qc = tq.get_default_qat_qconfig("x86")
    m = cls(2, 3, 3, bias=True, qconfig=qc)
    keys = set(m.state_dict())
    assert {"weight", "bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
            "weight_fake_quant.scale"} <= keys
    m.freeze_bn_stats()
    m.apply(nniqat.update_bn_stats)
    assert m.bn.training and not m.freeze_bn
