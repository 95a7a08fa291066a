"""The vision models of tessera.models against plain-torch references with torchvision's
structure (tests/models/torch_vision_ref.py): same state_dict names and shapes, same eval
logits, same train-mode loss, gradients and BatchNorm statistics after copying the weights
through NumPy, and torchvision's initialisation statistics.

Inputs are small (batch 2, 32x32; 48x48 for the ResNet/MobileNetV2 gradient test) so the file
stays fast: ResNet, MobileNetV2 and VGG end in adaptive pooling, and ViT is built for
image_size=32 (2x2 patches of 16). Logits are compared in float32, gradients in float64.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch

import tessera
import tessera.models as tm
from tests.models import torch_vision_ref as ref

# name -> (tessera factory, torch factory, kwargs, input shape, train-test input shape).
# The train test runs ResNet and MobileNetV2 at 48x48 so their last BatchNorms see 2x2 maps:
# at 1x1 with batch 2 every channel's variance is over two values, an ill-conditioned
# normalisation that amplifies float64 rounding to ~1e-7 in both frameworks.
CASES = {
    "lenet5": (tm.lenet5, ref.LeNet5, {}, (2, 1, 28, 28), (2, 1, 28, 28)),
    "resnet18": (tm.resnet18, ref.resnet18, {"num_classes": 10}, (2, 3, 32, 32),
                 (2, 3, 48, 48)),
    "resnet34": (tm.resnet34, ref.resnet34, {"num_classes": 10}, (2, 3, 32, 32),
                 (2, 3, 48, 48)),
    "resnet50": (tm.resnet50, ref.resnet50, {"num_classes": 10}, (2, 3, 32, 32),
                 (2, 3, 48, 48)),
    "mobilenet_v2": (tm.mobilenet_v2, ref.mobilenet_v2, {"num_classes": 10}, (2, 3, 32, 32),
                     (2, 3, 48, 48)),
    "vgg11_bn": (tm.vgg11_bn, ref.vgg11_bn, {"num_classes": 10}, (2, 3, 32, 32),
                 (2, 3, 32, 32)),
    "vit_tiny_2layers": (tm.vit_tiny, ref.vit_tiny,
                         {"num_classes": 10, "image_size": 32, "num_layers": 2}, (2, 3, 32, 32),
                         (2, 3, 32, 32)),
    # the true ViT-Tiny/16 configuration (12 layers, 3 heads, 192 wide) at a small image size
    "vit_tiny": (tm.vit_tiny, ref.vit_tiny, {"num_classes": 10, "image_size": 32},
                 (2, 3, 32, 32), (2, 3, 32, 32)),
}
NAMES = list(CASES)
# resnet34 repeats resnet18's blocks, and the 12-layer ViT the 2-layer one's: the gradient
# test skips them to keep the file fast (their names, logits and init are still checked)
TRAIN_NAMES = [n for n in NAMES if n not in ("resnet34", "vit_tiny")]
# vgg11_bn's classifier holds 120M of its 129M parameters, so converting it between dtypes
# would dominate the file's run time: it is moved to float64 once, after its float32
# initialisation, and its logits and gradients are compared in float64 only.
# (Its float32 gradients cannot be compared tightly anyway: with random weights some units of
# classifier.0 sit within float32 rounding of ReLU's kink, and one flipped unit changes a
# whole row of classifier.0.weight's gradient.)
FLOAT64_ONLY = {"vgg11_bn"}
_NP = {np.float32: (torch.float32, tessera.float32), np.float64: (torch.float64, tessera.float64)}


def _summary(a: np.ndarray) -> dict:
    """What the initialisation test needs of one tensor, without keeping a copy of it."""
    flat = a.ravel()
    sample = flat[:: max(1, flat.size // 1_000_000)].astype(np.float64)  # strided subsample
    const = flat.size > 0 and bool((flat == flat[0]).all())
    return {"n": sample.size, "mean": sample.mean() if sample.size else 0.0,
            "std": sample.std() if sample.size else 0.0,
            "maxabs": float(np.abs(flat).max(initial=0)),
            "const": float(flat[0]) if const else None, "shape": a.shape}


@contextlib.contextmanager
def _skip_torch_init():
    """Initialisers as no-ops while the reference is built: its weights are replaced at once
    by the tessera model's, and filling vgg11_bn's 129M parameters would take seconds."""
    init_names = ("normal_", "uniform_", "trunc_normal_", "kaiming_normal_", "kaiming_uniform_",
                  "xavier_uniform_", "constant_", "zeros_", "ones_")
    saved = [(torch.nn.init, n, getattr(torch.nn.init, n)) for n in init_names]
    saved += [(torch.Tensor, n, getattr(torch.Tensor, n)) for n in ("normal_", "uniform_")]
    try:
        for owner, n, _ in saved:
            setattr(owner, n, lambda t, *args, **kwargs: t)
        yield
    finally:
        for owner, n, fn in saved:
            setattr(owner, n, fn)


class Pair:
    """A tessera model and a torch reference holding the same weights.

    The tessera model is built with its own initialisation (summarised for the statistics
    test), then its constant tensors are randomised. The reference is built without
    initialisation and given the tessera parameters' memory through NumPy
    (``load_state_dict(..., assign=True)`` on ``torch.from_numpy`` views), so the large models
    are never copied; buffers are copied because train mode updates them in place.
    """

    def __init__(self, name: str) -> None:
        tfn, self.rfn, self.kwargs, self.shape, self.train_shape = CASES[name]
        self.only64 = name in FLOAT64_ONLY
        tessera.manual_seed(0)
        self.tess = tfn(**self.kwargs)
        self.init_stats = {k: _summary(v.numpy()) for k, v in self.tess.state_dict().items()}
        self.dtype = np.float32
        if self.only64:
            self.tess.to(tessera.float64)
            self.dtype = np.float64
        _perturb(self.tess)
        # what reset() restores: every entry of the small models (they change dtype), only the
        # buffers of a float64-only one (tests never change parameters)
        params = {k for k, _ in self.tess.named_parameters()}
        self.state = {k: v.numpy().copy() for k, v in self.tess.state_dict().items()
                      if not (self.only64 and k in params)}
        self.torch = None
        self.reset(self.dtype)

    def dtype_for(self, wanted):
        """The dtype a test runs this model in."""
        return np.float64 if self.only64 else wanted

    def reset(self, dtype) -> None:
        """Both models in ``dtype`` holding the reference weights, gradients cleared."""
        assert not self.only64 or dtype is np.float64
        if dtype is not self.dtype:
            self.tess.to(_NP[dtype][1])
            self.dtype = dtype
        # load_state_dict casts float32 arrays to the model's dtype, like PyTorch
        self.tess.load_state_dict({k: tessera.from_numpy(v.copy()) for k, v in self.state.items()},
                                  strict=not self.only64)
        self.tess.zero_grad(set_to_none=True)
        with _skip_torch_init():
            ref_model = self.rfn(**self.kwargs).to(_NP[dtype][0])
        params = {k for k, _ in ref_model.named_parameters()}
        shared = {k: torch.from_numpy(v.numpy() if k in params else v.numpy().copy())
                  for k, v in self.tess.state_dict().items()}
        ref_model.load_state_dict(shared, assign=True)
        self.torch = ref_model

    def inputs(self, dtype, seed: int = 1, shape=None):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape or self.shape).astype(dtype)
        y = rng.integers(0, 10, size=x.shape[0])
        return x, y


_PAIRS: dict[str, Pair] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The oracle on one thread: on a shared, busy machine torch's second thread spin-waits
    and made single calls up to 20x slower; pairs are dropped after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    _PAIRS.clear()


def pair(name: str) -> Pair:
    if name not in _PAIRS:
        _PAIRS[name] = Pair(name)
    return _PAIRS[name]


def _perturb(model) -> None:
    """Randomise every constant-initialised tensor of a tessera model (BatchNorm/LayerNorm
    affine and running statistics, zero biases, ViT's zero head and class token) so the
    comparison exercises them; num_batches_tracked becomes 5."""
    rng = np.random.default_rng(123)
    with tessera.no_grad():
        for name, t in model.state_dict().items():
            a = t.numpy()
            if a.dtype.kind in "iu":
                new = np.full_like(a, 5)
            elif a.size > 0 and bool((a == a.flat[0]).all()):
                new = a + 0.1 * rng.standard_normal(a.shape).astype(a.dtype)
                if name.endswith("running_var"):
                    new = np.abs(new)
            else:
                continue
            t.copy_(tessera.from_numpy(new))


def _t(a: np.ndarray):
    return torch.from_numpy(a)


def _x(a: np.ndarray):
    return tessera.from_numpy(a)


def _assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float,
                  what: str) -> None:
    """``np.testing.assert_allclose`` in slices of the first axis, so that the 100M-element
    gradient of vgg11_bn's classifier.0 is compared without full-size temporaries."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    a = actual.reshape(len(actual), -1) if actual.ndim else actual.reshape(1, 1)
    e = expected.reshape(a.shape)
    step = max(1, 1_000_000 // max(1, a.shape[1]))
    for i in range(0, len(a), step):
        ac, ec = a[i:i + step], e[i:i + step]
        if not (np.abs(ac - ec) <= atol + rtol * np.abs(ec)).all():  # NaN counts as a miss
            np.testing.assert_allclose(ac, ec, rtol=rtol, atol=atol, err_msg=what)


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, what: str) -> None:
    """Elementwise within rtol, relative to the tensor's largest magnitude."""
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-30)
    _assert_close(actual, expected, rtol, rtol * scale, what)


# ------------------------------------------------------------------- (a) names and shapes

@pytest.mark.parametrize("name", NAMES)
def test_state_dict_names_and_shapes(name):
    p = pair(name)
    ours = {k: (tuple(v.shape), str(v.dtype).split(".")[-1])
            for k, v in p.tess.state_dict().items()}
    theirs = {k: (tuple(v.shape), str(v.dtype).split(".")[-1])
              for k, v in p.torch.state_dict().items()}
    assert list(ours) == list(theirs)
    assert ours == theirs
    assert [n for n, _ in p.tess.named_parameters()] == \
        [n for n, _ in p.torch.named_parameters()]
    assert [n for n, _ in p.tess.named_buffers()] == [n for n, _ in p.torch.named_buffers()]


def test_torchvision_key_names():
    """Spot checks that the references (and so the models) use torchvision's names."""
    keys = {n: set(pair(n).tess.state_dict()) for n in ("resnet50", "mobilenet_v2",
                                                         "vgg11_bn", "vit_tiny")}
    assert {"conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight",
            "layer1.0.downsample.1.num_batches_tracked", "layer4.2.conv3.weight",
            "fc.bias"} <= keys["resnet50"]
    assert {"features.0.0.weight", "features.0.1.weight", "features.1.conv.0.0.weight",
            "features.1.conv.1.weight", "features.2.conv.0.0.weight",
            "features.18.0.weight", "classifier.1.weight"} <= keys["mobilenet_v2"]
    assert {"features.0.weight", "features.1.running_mean", "features.25.weight",
            "classifier.0.weight", "classifier.3.weight", "classifier.6.bias"} <= keys["vgg11_bn"]
    blk = "encoder.layers.encoder_layer_11."
    assert {"conv_proj.weight", "class_token", "encoder.pos_embedding", blk + "ln_1.weight",
            blk + "self_attention.in_proj_weight", blk + "self_attention.out_proj.weight",
            blk + "ln_2.bias", blk + "mlp.0.weight", blk + "mlp.3.bias", "encoder.ln.weight",
            "heads.head.weight"} <= keys["vit_tiny"]
    vit = pair("vit_tiny").tess
    assert isinstance(vit.encoder.layers.encoder_layer_0.self_attention,
                      tessera.nn.MultiheadAttention)
    assert tuple(vit.encoder.pos_embedding.shape) == (1, 5, 192)


@pytest.mark.parametrize("width", [0.5, 1.4])
def test_mobilenet_width_mult(width):
    ours = tm.mobilenet_v2(num_classes=5, width_mult=width).state_dict()
    theirs = ref.mobilenet_v2(num_classes=5, width_mult=width).state_dict()
    assert [(k, tuple(v.shape)) for k, v in ours.items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.items()]


@pytest.mark.parametrize("name", ["lenet5", "resnet18", "mobilenet_v2", "vit_tiny_2layers"])
def test_load_torch_built_state_dict(name):
    """The user's path: a state_dict of a PyTorch-built model (its own initialisation),
    converted through NumPy, loads strictly into a fresh tessera model with the same logits."""
    tfn, rfn, kwargs, shape, _ = CASES[name]
    torch.manual_seed(1)
    theirs = rfn(**kwargs).eval()
    with torch.no_grad():
        if name.startswith("vit"):  # torchvision zero-initialises the head
            theirs.heads.head.weight.normal_()
        x = torch.randn(*shape)
        expected = theirs(x).numpy()
    ours = tfn(**kwargs)
    result = ours.load_state_dict({k: tessera.from_numpy(v.numpy().copy())
                                   for k, v in theirs.state_dict().items()})
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), theirs.state_dict()[k].numpy(), err_msg=k)
    with tessera.no_grad():
        _close(ours.eval()(_x(x.numpy())).numpy(), expected, 1e-4, name)


# ------------------------------------------------------------------------- (b) eval logits

@pytest.mark.parametrize("name", NAMES)
def test_eval_logits_match(name):
    p = pair(name)
    dtype = p.dtype_for(np.float32)
    p.reset(dtype)
    x, _ = p.inputs(dtype)
    p.torch.eval()
    p.tess.eval()
    with torch.no_grad():
        expected = p.torch(_t(x)).numpy()
    with tessera.no_grad():
        actual = p.tess(_x(x))
    assert actual.dtype == {np.float32: tessera.float32, np.float64: tessera.float64}[dtype]
    assert tuple(actual.shape) == (p.shape[0], 10)
    _close(actual.numpy(), expected, 1e-4 if dtype is np.float32 else 1e-10, name)
    # eval mode leaves the running statistics alone
    for k, v in p.tess.named_buffers():
        np.testing.assert_array_equal(v.numpy(), p.state[k].astype(v.numpy().dtype), err_msg=k)


# ---------------------------------------------------------------- (c) train loss and grads

def _set_dropout(model, nn_mod, prob):
    old = []
    for m in model.modules():
        if isinstance(m, nn_mod.Dropout):
            old.append(m.p)
            m.p = prob if prob is not None else old.pop(0)
    return old


@pytest.mark.parametrize("name", TRAIN_NAMES)
def test_train_loss_grads_and_running_stats_match(name):
    p = pair(name)
    dtype = np.float64
    rtol = 1e-8
    p.reset(dtype)
    x, y = p.inputs(dtype, seed=2, shape=p.train_shape)
    p.torch.train()
    p.tess.train()
    # the two frameworks draw different dropout masks, so compare without dropout
    drops = [m for m in list(p.torch.modules()) + list(p.tess.modules())
             if isinstance(m, torch.nn.Dropout | tessera.nn.Dropout)]
    saved = [m.p for m in drops]
    try:
        for m in drops:
            m.p = 0.0
        xt = _t(x).requires_grad_()
        loss_t = torch.nn.functional.cross_entropy(p.torch(xt), _t(y))
        loss_t.backward()
        xx = _x(x).requires_grad_()
        loss_x = tessera.nn.functional.cross_entropy(p.tess(xx), _x(y))
        loss_x.backward()
    finally:
        for m, v in zip(drops, saved):
            m.p = v
    assert loss_x.dtype == tessera.float64
    np.testing.assert_allclose(loss_x.item(), loss_t.item(), rtol=rtol * 1e-2)
    _close(xx.grad.numpy(), xt.grad.numpy(), rtol, "input grad")
    theirs = dict(p.torch.named_parameters())
    # an absolute floor from the largest gradient: a conv bias followed by train-mode
    # BatchNorm has a gradient that is zero up to rounding in both frameworks
    floor = rtol * max(float(t.grad.abs().max()) for t in theirs.values())
    for k, v in p.tess.named_parameters():
        assert v.grad is not None, k
        expected = theirs[k].grad.numpy()
        scale = float(np.abs(expected).max())
        _assert_close(v.grad.numpy(), expected, rtol, max(rtol * scale, floor), k)
    # parameters are shared with the reference, so check that nothing wrote to them
    for k, v in p.tess.named_parameters():
        if k in p.state:
            np.testing.assert_array_equal(v.detach().numpy(), p.state[k].astype(dtype), k)
    # BatchNorm in train mode updated the running statistics identically
    theirs = p.torch.state_dict()
    for k, v in p.tess.named_buffers():
        _close(v.numpy(), theirs[k].numpy(), rtol * 1e-2, k)


# -------------------------------------------------------------------- (d) initialisation

def _fans(shape: tuple) -> tuple[int, int]:
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _expected_init(model_name: str, key: str, module, shape: tuple):
    """torchvision's initialisation of one state_dict entry: ("normal", std),
    ("uniform", bound) or ("const", value)."""
    nn = tessera.nn
    leaf = key.rsplit(".", 1)[-1]
    fan_in, fan_out = _fans(shape) if len(shape) >= 2 else (0, 0)
    if leaf in ("running_mean", "num_batches_tracked"):
        return ("const", 0.0)
    if leaf == "running_var":
        return ("const", 1.0)
    if isinstance(module, nn.BatchNorm2d | nn.LayerNorm):
        return ("const", 1.0 if leaf == "weight" else 0.0)
    if model_name == "lenet5":  # PyTorch's defaults: U(+-1/sqrt(fan_in)) for weight and bias
        return ("uniform", 1 / math.sqrt(module.weight[0].numel()))
    if model_name.startswith("vit"):
        return _expected_vit_init(key, leaf, module, shape, fan_in, fan_out)
    if isinstance(module, nn.Conv2d):
        if leaf == "bias":
            return ("const", 0.0)
        return ("normal", math.sqrt(2.0 / fan_out))  # kaiming_normal_, fan_out, relu gain
    if isinstance(module, nn.Linear):
        if model_name.startswith("resnet"):  # ResNet leaves fc at PyTorch's default
            return ("uniform", 1 / math.sqrt(module.in_features))
        return ("normal", 0.01) if leaf == "weight" else ("const", 0.0)
    raise AssertionError(f"no expected initialisation for {key}")


def _expected_vit_init(key, leaf, module, shape, fan_in, fan_out):
    nn = tessera.nn
    if key == "class_token" or key.startswith("heads.head"):
        return ("const", 0.0)
    if key == "encoder.pos_embedding":
        return ("normal", 0.02)
    if key.startswith("conv_proj"):
        return ("normal", math.sqrt(1 / fan_in)) if leaf == "weight" else ("const", 0.0)
    if isinstance(module, nn.MultiheadAttention):
        if key.endswith("in_proj_weight"):
            return ("uniform", math.sqrt(6 / (fan_in + fan_out)))  # xavier_uniform_
        return ("const", 0.0)  # in_proj_bias
    if key.endswith("out_proj.weight"):  # NonDynamicallyQuantizableLinear's default init
        return ("uniform", 1 / math.sqrt(shape[1]))
    if key.endswith("out_proj.bias"):
        return ("const", 0.0)
    if isinstance(module, nn.Linear):  # MLP: xavier_uniform_ weight, N(0, 1e-6) bias
        return ("uniform", math.sqrt(6 / (fan_in + fan_out))) if leaf == "weight" \
            else ("normal", 1e-6)
    raise AssertionError(f"no expected initialisation for {key}")


def _check_stats(key: str, st: dict, rule) -> None:
    kind, val = rule
    if kind == "const":
        assert st["const"] == val or st["n"] == 0, (key, st, val)
        return
    n = st["n"]
    std = val if kind == "normal" else val / math.sqrt(3)
    if kind == "uniform":
        assert st["maxabs"] <= val * (1 + 1e-6), (key, st, val)
    if n < 64:  # too few values for statistics: a loose bound only
        assert st["maxabs"] <= 6 * std, (key, st, std)
        return
    assert abs(st["mean"]) <= 5 * std / math.sqrt(n), (key, st, std)
    assert abs(st["std"] / std - 1) <= max(0.05, 6 / math.sqrt(2 * n)), (key, st, std)


@pytest.mark.parametrize("name", NAMES)
def test_default_init_statistics(name):
    p = pair(name)
    modules = dict(p.tess.named_modules())
    for key, st in p.init_stats.items():
        owner = key.rsplit(".", 1)[0] if "." in key else ""
        if key == "encoder.pos_embedding":
            owner = "encoder"
        _check_stats(key, st, _expected_init(name, key, modules[owner], st["shape"]))


@pytest.mark.parametrize("factory, block_bn", [(tm.resnet18, "bn2"), (tm.resnet50, "bn3")])
def test_zero_init_residual(factory, block_bn):
    m = factory(num_classes=3, zero_init_residual=True)
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    for b in blocks:
        assert float(getattr(b, block_bn).weight.abs().sum()) == 0.0
        assert float(b.bn1.weight.sum()) == b.bn1.num_features
    assert float(m.bn1.weight.sum()) == 64


# ------------------------------------------------------------- num_classes, modes, saving

@pytest.mark.parametrize("factory, kwargs, shape", [
    (tm.lenet5, {}, (1, 1, 28, 28)),
    (tm.resnet18, {}, (1, 3, 32, 32)),
    (tm.resnet50, {}, (1, 3, 32, 32)),
    (tm.mobilenet_v2, {}, (1, 3, 32, 32)),
    (tm.vit_tiny, {"image_size": 32, "num_layers": 1}, (1, 3, 32, 32)),
])
def test_num_classes(factory, kwargs, shape):
    m = factory(num_classes=7, **kwargs).eval()
    with tessera.no_grad():
        assert tuple(m(tessera.randn(*shape)).shape) == (1, 7)


def test_defaults():
    assert tm.resnet18().fc.out_features == 1000
    assert tm.lenet5().fc3.out_features == 10
    mb = tm.mobilenet_v2()
    assert mb.classifier[1].out_features == 1000 and mb.classifier[0].p == 0.2
    assert isinstance(mb.features[1].conv[0][2], tessera.nn.ReLU6)
    vgg = pair("vgg11_bn").tess  # built with num_classes=10 (a 1000-class one is slow to build)
    assert tuple(vgg.classifier[6].weight.shape) == (10, 4096)
    assert [vgg.classifier[i].p for i in (2, 5)] == [0.5, 0.5]
    assert isinstance(vgg.avgpool, tessera.nn.AdaptiveAvgPool2d)
    vit = tm.vit_tiny(num_layers=1)
    assert (vit.patch_size, vit.hidden_dim, vit.mlp_dim, vit.seq_length) == (16, 192, 768, 197)
    assert vit.heads.head.out_features == 1000
    assert vit.encoder.layers.encoder_layer_0.self_attention.num_heads == 3
    assert len(tm.vit_tiny(image_size=32).encoder.layers) == 12
    with pytest.raises(AssertionError):
        tm.vit_tiny(image_size=33)
    with pytest.raises(AssertionError):
        tm.vit_tiny(image_size=32, num_layers=1)(tessera.zeros(1, 3, 48, 48))


def test_train_eval_modes():
    tessera.manual_seed(0)
    m = tm.mobilenet_v2(num_classes=10)
    assert m.training and all(s.training for s in m.modules())
    assert m.eval() is m and not any(s.training for s in m.modules())
    x = tessera.randn(2, 3, 32, 32)
    with tessera.no_grad():
        a, b = m(x), m(x)
    assert tessera.equal(a, b)
    assert int(m.features[0][1].num_batches_tracked) == 0
    m.train()
    assert all(s.training for s in m.modules())
    with tessera.no_grad():
        c, d = m(x), m(x)
    assert int(m.features[0][1].num_batches_tracked) == 2
    # dropout (p=0.2) is active in train mode only
    assert not tessera.equal(c, d)


def test_save_load_round_trip(tmp_path):
    p = pair("resnet18")
    p.reset(np.float32)
    path = tmp_path / "resnet18.safetensors"
    tessera.save(p.tess.state_dict(), str(path))
    loaded = tessera.load(str(path))
    assert list(loaded) == list(p.tess.state_dict())
    fresh = tm.resnet18(num_classes=10)
    fresh.load_state_dict(loaded)
    for k, v in fresh.state_dict().items():
        assert v.dtype == p.tess.state_dict()[k].dtype, k
        np.testing.assert_array_equal(v.numpy(), p.state[k], err_msg=k)
    x, _ = p.inputs(np.float32)
    fresh.eval()
    p.tess.eval()
    with tessera.no_grad():
        assert tessera.equal(fresh(_x(x)), p.tess(_x(x)))
