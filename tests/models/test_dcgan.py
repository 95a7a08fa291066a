"""DCGAN generator and discriminator against a plain-``torch.nn`` reference.

The reference networks below are written in PyTorch following the DCGAN tutorial's
structure (``self.main = nn.Sequential(...)``) at 28x28 and 32x32. PyTorch's random state is
copied into tessera through NumPy, then outputs, input gradients, parameter gradients and
BatchNorm running statistics are compared in train and eval mode.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import tessera
from tessera.models.gan import DCGANDiscriminator, DCGANGenerator, dcgan, weights_init

SIZES = (28, 32)


def ref_generator(nz: int, ngf: int, nc: int, image_size: int) -> nn.Module:
    k0, k1, p1 = (3, 3, 0) if image_size == 28 else (4, 4, 1)
    m = nn.Module()
    m.main = nn.Sequential(
        nn.ConvTranspose2d(nz, ngf * 4, k0, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 4, ngf * 2, k1, 2, p1, bias=False), nn.BatchNorm2d(ngf * 2),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf),
        nn.ReLU(True),
        nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())
    m.forward = m.main.forward
    return m


def ref_discriminator(nc: int, ndf: int, image_size: int) -> nn.Module:
    k2, p2, k3 = (3, 0, 3) if image_size == 28 else (4, 1, 4)
    m = nn.Module()
    m.main = nn.Sequential(
        nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(ndf * 2, ndf * 4, k2, 2, p2, bias=False), nn.BatchNorm2d(ndf * 4),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(ndf * 4, 1, k3, 1, 0, bias=False), nn.Sigmoid())
    m.forward = m.main.forward
    return m


def npy(t) -> np.ndarray:
    return t.detach().numpy()


def tol(dtype) -> dict:
    return dict(atol=1e-10, rtol=1e-8) if dtype == np.float64 else dict(atol=1e-4, rtol=1e-3)


def copy_into(pm: nn.Module, tm: tessera.nn.Module, dtype) -> None:
    """PyTorch's state (with BatchNorm weights and running stats perturbed so that they
    matter) copied into tessera through NumPy."""
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for t in pm.state_dict().values():
            if t.dtype.is_floating_point and t.dim() == 1:  # BN weight, bias, running stats
                t.add_(torch.from_numpy(rng.uniform(0.1, 0.5, t.shape)).to(t.dtype))
    if dtype == np.float64:
        pm.double()
        tm.double()
    sd = pm.state_dict()
    assert list(sd) == list(tm.state_dict())
    tm.load_state_dict({k: tessera.tensor(v.numpy()) for k, v in sd.items()})


def pair(kind: str, image_size: int, dtype):
    torch.manual_seed(image_size)
    if kind == "G":
        pm = ref_generator(12, 4, 2, image_size)
        tm = DCGANGenerator(nz=12, ngf=4, nc=2, image_size=image_size)
        shape = (5, 12, 1, 1)
    else:
        pm = ref_discriminator(2, 4, image_size)
        tm = DCGANDiscriminator(nc=2, ndf=4, image_size=image_size)
        shape = (5, 2, image_size, image_size)
    copy_into(pm, tm, dtype)
    return pm, tm, shape


@pytest.mark.parametrize("image_size", SIZES)
def test_output_shapes(image_size):
    netG, netD = dcgan(nz=20, ngf=8, ndf=8, nc=3, image_size=image_size)
    fake = netG(tessera.randn(4, 20, 1, 1))
    assert tuple(fake.shape) == (4, 3, image_size, image_size)
    assert float(fake.abs().max()) <= 1.0           # Tanh output
    prob = netD(fake)
    assert tuple(prob.shape) == (4, 1, 1, 1)
    assert 0.0 <= float(prob.min()) and float(prob.max()) <= 1.0   # Sigmoid output
    # the tutorial's defaults: nz=100, ngf=ndf=64, one channel
    g, d = DCGANGenerator(), DCGANDiscriminator()
    out = g(tessera.randn(2, 100, 1, 1))
    assert tuple(out.shape) == (2, 1, 28, 28)
    assert tuple(d(out).shape) == (2, 1, 1, 1)


@pytest.mark.parametrize("image_size", SIZES)
def test_parameter_names_match_reference(image_size):
    pm, tm = ref_generator(100, 64, 1, image_size), DCGANGenerator(image_size=image_size)
    assert {k: tuple(v.shape) for k, v in pm.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    pm, tm = ref_discriminator(1, 64, image_size), DCGANDiscriminator(image_size=image_size)
    assert {k: tuple(v.shape) for k, v in pm.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in tm.state_dict().items()}


def _step(pm, tm, shape, dtype):
    """One forward/backward in both; compares output, input grad and parameter grads."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(dtype)
    px = torch.tensor(x, requires_grad=True)
    tx = tessera.tensor(x.copy(), requires_grad=True)
    po, to = pm(px), tm(tx)
    assert tuple(to.shape) == tuple(po.shape)
    assert to.dtype.name == str(po.dtype).split(".")[-1]
    np.testing.assert_allclose(npy(to), npy(po), **tol(dtype), err_msg="output")
    cot = rng.standard_normal(tuple(po.shape)).astype(dtype)
    po.backward(torch.tensor(cot))
    to.backward(tessera.tensor(cot))
    np.testing.assert_allclose(npy(tx.grad), npy(px.grad), **tol(dtype), err_msg="input grad")
    tp = dict(tm.named_parameters())
    for name, p in pm.named_parameters():
        np.testing.assert_allclose(npy(tp[name].grad), npy(p.grad), **tol(dtype), err_msg=name)
    tb = dict(tm.named_buffers())
    for name, b in pm.named_buffers():
        np.testing.assert_allclose(npy(tb[name]), npy(b), **tol(dtype), err_msg=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("kind", ["G", "D"])
@pytest.mark.parametrize("image_size", SIZES)
def test_matches_torch(image_size, kind, mode, dtype):
    pm, tm, shape = pair(kind, image_size, dtype)
    pm.train(mode == "train")
    tm.train(mode == "train")
    _step(pm, tm, shape, dtype)
    _step(pm, tm, shape, dtype)   # a second step sees the updated running statistics


def test_gan_step_matches_torch():
    """One tutorial-style training iteration (BCE on D(real), D(G(z)).detach(), then G)
    with Adam gives the same losses and weights."""
    pG, tG, _ = pair("G", 28, np.float64)
    pD, tD, _ = pair("D", 28, np.float64)
    rng = np.random.default_rng(2)
    real = rng.uniform(-1, 1, (6, 2, 28, 28))
    z = rng.standard_normal((6, 12, 1, 1))
    results = []
    for L, G, D in ((torch, pG, pD), (tessera, tG, tD)):
        optD = L.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
        optG = L.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
        crit = L.nn.BCELoss()
        ones, zeros = L.ones(6, dtype=L.float64), L.zeros(6, dtype=L.float64)
        D.zero_grad()
        fake = G(L.tensor(z))
        errD = crit(D(L.tensor(real)).view(-1), ones) + crit(D(fake.detach()).view(-1), zeros)
        errD.backward()
        optD.step()
        G.zero_grad()
        errG = crit(D(fake).view(-1), ones)
        errG.backward()
        optG.step()
        results.append((errD.item(), errG.item(), G.state_dict(), D.state_dict()))
    (pd, pg, psg, psd), (td, tg, tsg, tsd) = results
    np.testing.assert_allclose([td, tg], [pd, pg], rtol=1e-9)
    for p_sd, t_sd in ((psg, tsg), (psd, tsd)):
        for k, v in p_sd.items():
            np.testing.assert_allclose(npy(t_sd[k]), npy(v), atol=1e-10, rtol=1e-8, err_msg=k)


def test_weights_init_statistics():
    tessera.manual_seed(0)
    netG, netD = dcgan(image_size=32)
    convs, bn_w = [], []
    for net in (netG, netD):
        for m in net.modules():
            name = type(m).__name__
            if "Conv" in name:
                assert m.bias is None
                convs.append(npy(m.weight).ravel())
            elif "BatchNorm" in name:
                bn_w.append(npy(m.weight).ravel())
                assert np.all(npy(m.bias) == 0)
                assert np.all(npy(m.running_mean) == 0) and np.all(npy(m.running_var) == 1)
    w, g = np.concatenate(convs), np.concatenate(bn_w)
    # 5-sigma bounds for the sample mean / std of N(mu, 0.02) with these many draws
    assert abs(w.mean()) < 5 * 0.02 / np.sqrt(w.size)
    assert abs(w.std() - 0.02) < 5 * 0.02 / np.sqrt(2 * w.size)
    assert abs(g.mean() - 1.0) < 5 * 0.02 / np.sqrt(g.size)
    assert abs(g.std() - 0.02) < 5 * 0.02 / np.sqrt(2 * g.size)
    # each layer on its own, too: no layer left with its default (kaiming-uniform) init
    for c in convs:
        assert abs(c.std() - 0.02) < 0.2 * 0.02


def test_weights_init_via_apply_matches_tutorial_rule():
    """``weights_init`` touches only conv and BatchNorm modules, like the tutorial's."""
    seq = tessera.nn.Sequential(tessera.nn.Linear(50, 50), tessera.nn.Conv2d(20, 20, 5),
                                tessera.nn.BatchNorm1d(500))
    before = npy(seq[0].weight).copy()
    seq.apply(weights_init)
    np.testing.assert_array_equal(npy(seq[0].weight), before)
    assert abs(npy(seq[1].weight).std() - 0.02) < 0.002
    assert abs(npy(seq[2].weight).mean() - 1.0) < 0.01
    assert np.all(npy(seq[2].bias) == 0)


def test_seeded_construction_is_reproducible():
    tessera.manual_seed(3)
    a = DCGANGenerator(nz=8, ngf=4)
    tessera.manual_seed(3)
    b = DCGANGenerator(nz=8, ngf=4)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(npy(v), npy(w), err_msg=k)


@pytest.mark.parametrize("kwargs", [dict(image_size=64), dict(image_size=28.0),
                                    dict(nz=0), dict(ngf=-1), dict(nc=True)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="DCGAN"):
        DCGANGenerator(**kwargs)


def test_bad_discriminator_arguments():
    with pytest.raises(ValueError, match="image_size must be 28 or 32"):
        DCGANDiscriminator(image_size=64)
    with pytest.raises(ValueError, match="ndf"):
        DCGANDiscriminator(ndf=0)


def test_wrong_input_size_raises():
    netD = DCGANDiscriminator(ndf=4, image_size=32)
    with pytest.raises(RuntimeError):
        netD(tessera.randn(2, 1, 8, 8))


def test_lazy_public_name_stays_a_function():
    import tessera.models
    first = tessera.models.dcgan
    second = tessera.models.dcgan
    assert callable(first) and callable(second)
    assert tessera.models.DCGANGenerator is DCGANGenerator
