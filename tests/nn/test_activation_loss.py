"""Activation, loss and distance modules against PyTorch, plus the nn-op extras the op-info
table does not cover (double backward, the fused kernels against their composites, the
top-level functions and Tensor methods, errors and messages).

Every module is built in both libraries with the same arguments; PyTorch's ``state_dict``
(PReLU's weight, the losses' weight/pos_weight buffers) is copied through NumPy; the same
inputs run in float64 and float32; outputs, input gradients and parameter gradients are
compared, and reprs must be equal.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import tessera
import tessera.nn.functional as F

LIBS = (torch, tessera)
DTYPES = (np.float64, np.float32)


def npy(t) -> np.ndarray:
    return t.detach().numpy()


def tol(dtype) -> dict:
    return dict(atol=1e-10, rtol=1e-9) if dtype == np.float64 else dict(atol=2e-5, rtol=2e-4)


def to_tessera_sd(sd) -> dict:
    return {k: tessera.tensor(v.detach().numpy()) for k, v in sd.items()}


def tensors(lib, arrays, grad: bool):
    out = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            t = lib.tensor(a.copy())
            if grad and a.dtype.kind == "f":
                t.requires_grad_(True)
            out.append(t)
        else:
            out.append(a)
    return out


def check_module(make, arrays, dtype, grad_inputs=None):
    """Same module, same inputs: output, input grads, parameter grads, repr."""
    pm, tm = make(torch), make(tessera)
    assert repr(tm) == repr(pm)
    pm, tm = (pm.double(), tm.double()) if dtype == np.float64 else (pm.float(), tm.float())
    tm.load_state_dict(to_tessera_sd(pm.state_dict()))
    assert sorted(tm.state_dict()) == sorted(pm.state_dict())
    arrays = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
              for a in arrays]
    px, tx = tensors(torch, arrays, True), tensors(tessera, arrays, True)
    if grad_inputs is not None:
        for i, (a, b) in enumerate(zip(px, tx)):
            if i not in grad_inputs and isinstance(a, torch.Tensor):
                a.requires_grad_(False)
                b.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        po, to = pm(*px), tm(*tx)
    np.testing.assert_allclose(npy(to), npy(po), **tol(dtype), err_msg="output")
    assert to.dtype.name == str(po.dtype).split(".")[-1]
    cot = np.random.default_rng(0).standard_normal(tuple(po.shape)).astype(npy(po).dtype)
    po.backward(torch.tensor(cot))
    to.backward(tessera.tensor(cot))
    for a, b in zip(px, tx):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            np.testing.assert_allclose(npy(b.grad), npy(a.grad), **tol(dtype),
                                       err_msg="input grad")
    tp = dict(tm.named_parameters())
    for name, p in pm.named_parameters():
        np.testing.assert_allclose(npy(tp[name].grad), npy(p.grad), **tol(dtype), err_msg=name)
    return pm, tm


rng = np.random.default_rng(1234)
X = rng.uniform(-3, 3, (4, 6))
X4 = rng.uniform(-3, 3, (2, 3, 4, 5))

# (constructor, input arrays) for every activation module
ACTIVATIONS = [
    (lambda L: L.nn.ReLU(), [X]), (lambda L: L.nn.ReLU(inplace=False), [X4]),
    (lambda L: L.nn.ReLU6(), [X * 3]), (lambda L: L.nn.LeakyReLU(0.2), [X]),
    (lambda L: L.nn.ELU(alpha=0.7), [X]), (lambda L: L.nn.SELU(), [X]),
    (lambda L: L.nn.CELU(alpha=1.5), [X]), (lambda L: L.nn.GELU(), [X]),
    (lambda L: L.nn.GELU(approximate="tanh"), [X4]), (lambda L: L.nn.SiLU(), [X]),
    (lambda L: L.nn.Mish(), [X]), (lambda L: L.nn.Softplus(beta=2, threshold=3), [X]),
    (lambda L: L.nn.Softsign(), [X]), (lambda L: L.nn.Softshrink(0.7), [X]),
    (lambda L: L.nn.Hardshrink(lambd=1.1), [X]), (lambda L: L.nn.Tanhshrink(), [X]),
    (lambda L: L.nn.Threshold(0.3, -2.0), [X]), (lambda L: L.nn.Hardtanh(-0.5, 2.0), [X]),
    (lambda L: L.nn.Hardsigmoid(), [X * 2]), (lambda L: L.nn.Hardswish(), [X * 2]),
    (lambda L: L.nn.PReLU(), [X4]), (lambda L: L.nn.PReLU(3, init=0.1), [X4]),
    (lambda L: L.nn.RReLU(0.1, 0.3).eval(), [X]), (lambda L: L.nn.GLU(), [X]),
    (lambda L: L.nn.GLU(dim=0), [X]), (lambda L: L.nn.LogSigmoid(), [X]),
    (lambda L: L.nn.Sigmoid(), [X]), (lambda L: L.nn.Tanh(), [X]),
    (lambda L: L.nn.Softmax(dim=1), [X]), (lambda L: L.nn.Softmax(), [X4]),
    (lambda L: L.nn.LogSoftmax(dim=-1), [X4]), (lambda L: L.nn.Softmin(dim=0), [X]),
    (lambda L: L.nn.Softmax2d(), [X4]), (lambda L: L.nn.Softmax2d(), [X4[0]]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ACTIVATIONS)))
def test_activation_module(case, dtype):
    make, arrays = ACTIVATIONS[case]
    check_module(make, arrays, dtype)


INPLACE = [lambda L: L.nn.ReLU(inplace=True), lambda L: L.nn.ReLU6(True),
           lambda L: L.nn.LeakyReLU(0.1, inplace=True), lambda L: L.nn.ELU(inplace=True),
           lambda L: L.nn.SELU(inplace=True), lambda L: L.nn.CELU(0.5, inplace=True),
           lambda L: L.nn.SiLU(inplace=True), lambda L: L.nn.Mish(inplace=True),
           lambda L: L.nn.Hardtanh(inplace=True), lambda L: L.nn.Hardsigmoid(inplace=True),
           lambda L: L.nn.Hardswish(inplace=True), lambda L: L.nn.Threshold(0.1, 5, True),
           lambda L: L.nn.RReLU(inplace=True).eval()]


@pytest.mark.parametrize("case", range(len(INPLACE)))
def test_inplace_module_writes_input_and_backprops(case):
    """In-place modules overwrite a non-leaf input and still give PyTorch's gradients."""
    outs = []
    for lib in LIBS:
        x = lib.tensor(X.copy(), requires_grad=True)
        y = x * 1.0
        m = INPLACE[case](lib)
        out = m(y)
        assert out is y
        out.backward(lib.tensor(np.cos(X)))
        outs.append((npy(out), npy(x.grad), repr(m)))
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=1e-12, atol=1e-12)
    assert outs[1][2] == outs[0][2]


def test_inplace_on_leaf_requiring_grad_raises():
    for lib in LIBS:
        x = lib.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable"):
            lib.nn.functional.relu(x, inplace=True)
        with pytest.raises(RuntimeError, match="leaf Variable"):
            lib.nn.functional.elu(x, inplace=True)


def test_rrelu_train_and_eval():
    x = tessera.tensor(X.copy(), requires_grad=True)
    m = tessera.nn.RReLU(0.1, 0.3)
    assert m.training
    y = m(x)
    y.sum().backward()
    neg = X < 0
    slopes = npy(y)[neg] / X[neg]
    assert np.all((slopes >= 0.1 - 1e-12) & (slopes <= 0.3 + 1e-12))
    assert len(np.unique(np.round(slopes, 12))) > 1  # one random slope per element
    np.testing.assert_array_equal(npy(y)[~neg], X[~neg])
    np.testing.assert_allclose(npy(x.grad)[neg], slopes)  # the gradient is the slope used
    m.eval()
    np.testing.assert_allclose(npy(m(tessera.tensor(X))), np.where(X >= 0, X, X * 0.2))


def test_prelu_parameter_and_init():
    for lib in LIBS:
        m = lib.nn.PReLU(4, init=0.3, dtype=lib.float64)
        assert tuple(m.weight.shape) == (4,) and m.weight.dtype == lib.float64
        np.testing.assert_array_equal(npy(m.weight), np.full(4, 0.3))
        assert [n for n, _ in m.named_parameters()] == ["weight"]


@pytest.mark.parametrize("make,exc", [
    (lambda L: L.nn.Hardtanh(1.0, 1.0), AssertionError),
    (lambda L: L.nn.Hardtanh(2.0, 1.0), AssertionError),
])
def test_activation_constructor_errors(make, exc):
    for lib in LIBS:
        with pytest.raises(exc):
            make(lib)


def test_activation_forward_errors():
    for lib in LIBS:
        with pytest.raises(ValueError, match="expected input to be 3D or 4D"):
            lib.nn.Softmax2d()(lib.ones(2, 3))
        with pytest.raises(RuntimeError, match="Halving dimension must be even"):
            lib.nn.GLU()(lib.ones(2, 3))
        with pytest.raises(RuntimeError, match="glu does not support scalars"):
            lib.nn.GLU()(lib.tensor(1.0))
        with pytest.raises(RuntimeError, match="Mismatch of parameter numbers"):
            lib.nn.PReLU(3)(lib.ones(2, 4))
        with pytest.raises(RuntimeError, match="approximate argument must be either"):
            lib.nn.functional.gelu(lib.ones(2), approximate="fast")
        with pytest.raises(ValueError, match="min_val cannot be greater"):
            lib.nn.functional.hardtanh(lib.ones(2), 2.0, 1.0)
        with pytest.raises(RuntimeError, match="alpha cannot be 0 for CELU"):
            lib.nn.functional.celu(lib.ones(2), alpha=0.0)
        with pytest.raises(NotImplementedError):
            lib.nn.functional.gelu(lib.ones(2, dtype=lib.int64))


def test_softmax_implicit_dim_warns_and_uses_legacy_rule():
    for shape, dim in (((5,), 0), ((3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4, 5), 1)):
        x = rng.standard_normal(shape)
        with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
            y = F.softmax(tessera.tensor(x))
        np.testing.assert_allclose(npy(y), npy(torch.softmax(torch.tensor(x), dim)))


# ---- losses -----------------------------------------------------------------------------------

N, C = 5, 4
LOGITS = rng.standard_normal((N, C)) * 2
TARGET = np.array([0, 3, 1, 1, 2])
TARGET_IGN = np.array([0, -100, 1, 3, -100])
W = rng.uniform(0.2, 2.0, C)
P = rng.uniform(0.05, 0.95, (N, C))
Y = (rng.random((N, C)) > 0.5).astype(np.float64)
SIGNS = np.where(rng.random(N) > 0.5, 1.0, -1.0)
LOGP = LOGITS - np.log(np.exp(LOGITS).sum(1, keepdims=True))
PROBS = np.exp(LOGP)


def _w(lib, a=W):
    return lib.tensor(a)


# (constructor, inputs, differentiable input positions)
LOSSES = [
    (lambda L: L.nn.CrossEntropyLoss(), [LOGITS, TARGET], (0,)),
    (lambda L: L.nn.CrossEntropyLoss(weight=_w(L), ignore_index=1, reduction="sum"),
     [LOGITS, TARGET], (0,)),
    (lambda L: L.nn.CrossEntropyLoss(weight=_w(L), label_smoothing=0.2), [LOGITS, TARGET_IGN],
     (0,)),
    (lambda L: L.nn.CrossEntropyLoss(label_smoothing=0.1), [LOGITS, PROBS], (0, 1)),
    (lambda L: L.nn.CrossEntropyLoss(weight=_w(L), reduction="none"),
     [rng.standard_normal((2, C, 3, 2)), rng.integers(0, C, (2, 3, 2))], (0,)),
    (lambda L: L.nn.NLLLoss(), [LOGP, TARGET], (0,)),
    (lambda L: L.nn.NLLLoss(weight=_w(L), reduction="mean"), [LOGP, TARGET_IGN], (0,)),
    (lambda L: L.nn.NLLLoss(size_average=False), [LOGP, TARGET], (0,)),
    (lambda L: L.nn.NLLLoss(reduce=False), [LOGP, TARGET], (0,)),
    (lambda L: L.nn.MSELoss(), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.MSELoss(reduction="sum"), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.L1Loss(reduction="none"), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.SmoothL1Loss(beta=0.5), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.HuberLoss(delta=0.7), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.BCELoss(), [P, Y], (0, 1)),
    (lambda L: L.nn.BCELoss(weight=_w(L), reduction="sum"), [P, Y], (0, 1)),
    (lambda L: L.nn.BCEWithLogitsLoss(), [LOGITS, Y], (0, 1)),
    (lambda L: L.nn.BCEWithLogitsLoss(weight=_w(L), pos_weight=_w(L, W[::-1].copy())),
     [LOGITS, Y], (0, 1)),
    (lambda L: L.nn.KLDivLoss(reduction="batchmean"), [LOGP, PROBS], (0, 1)),
    (lambda L: L.nn.KLDivLoss(reduction="sum", log_target=True), [LOGP, LOGP[::-1].copy()],
     (0, 1)),
    (lambda L: L.nn.PoissonNLLLoss(), [LOGITS, P * 3], (0, 1)),
    (lambda L: L.nn.PoissonNLLLoss(log_input=False, full=True), [P, P[::-1] * 4], (0, 1)),
    (lambda L: L.nn.GaussianNLLLoss(), [LOGITS, P, P[::-1].copy()], (0, 1, 2)),
    (lambda L: L.nn.GaussianNLLLoss(full=True, reduction="none"), [LOGITS, P, P[:, 0].copy()],
     (0, 1, 2)),
    (lambda L: L.nn.MarginRankingLoss(margin=0.3), [LOGITS[:, 0].copy(), LOGITS[:, 1].copy(),
                                                    SIGNS], (0, 1)),
    (lambda L: L.nn.HingeEmbeddingLoss(margin=0.5), [LOGITS[:, 0].copy(), SIGNS], (0,)),
    (lambda L: L.nn.SoftMarginLoss(), [LOGITS[:, 0].copy(), SIGNS], (0,)),
    (lambda L: L.nn.MultiLabelSoftMarginLoss(weight=_w(L)), [LOGITS, Y], (0, 1)),
    (lambda L: L.nn.MultiMarginLoss(), [LOGITS, TARGET], (0,)),
    (lambda L: L.nn.MultiMarginLoss(p=2, margin=0.5, weight=_w(L)), [LOGITS, TARGET], (0,)),
    (lambda L: L.nn.MultiLabelMarginLoss(), [LOGITS, np.array([[3, 0, -1, 1]] * N)], (0,)),
    (lambda L: L.nn.TripletMarginLoss(margin=0.5, p=1.5, swap=True),
     [LOGITS, P, LOGITS[::-1].copy()], (0, 1, 2)),
    (lambda L: L.nn.TripletMarginWithDistanceLoss(margin=2.0), [LOGITS, P, Y], (0, 1, 2)),
    (lambda L: L.nn.CosineEmbeddingLoss(margin=0.2), [LOGITS, P, SIGNS], (0, 1)),
    (lambda L: L.nn.CosineSimilarity(dim=0), [LOGITS, P], (0, 1)),
    (lambda L: L.nn.PairwiseDistance(p=3.0, keepdim=True), [LOGITS, P], (0, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(LOSSES)))
def test_loss_module(case, dtype):
    make, arrays, grads = LOSSES[case]
    check_module(make, arrays, dtype, grads)


def test_loss_buffers_and_legacy_arguments():
    for lib in LIBS:
        m = lib.nn.CrossEntropyLoss(weight=lib.ones(3))
        assert [n for n, _ in m.named_buffers()] == ["weight"]
        assert list(m.state_dict()) == ["weight"]
        assert list(lib.nn.CrossEntropyLoss().state_dict()) == []
        m = lib.nn.BCEWithLogitsLoss(pos_weight=lib.ones(3))
        assert sorted(n for n, _ in m.named_buffers()) == ["pos_weight"]
        with pytest.warns(UserWarning):
            assert lib.nn.MSELoss(size_average=False).reduction == "sum"
        with pytest.warns(UserWarning):
            assert lib.nn.L1Loss(reduce=False).reduction == "none"
        with pytest.warns(UserWarning):
            assert lib.nn.NLLLoss(size_average=True, reduce=True).reduction == "mean"
        assert repr(lib.nn.CrossEntropyLoss(weight=lib.ones(3))) == "CrossEntropyLoss()"
        assert repr(lib.nn.PairwiseDistance()) == "PairwiseDistance()"


@pytest.mark.parametrize("make,exc,msg", [
    (lambda L: L.nn.MultiMarginLoss(p=3), ValueError, "only p == 1 and p == 2"),
    (lambda L: L.nn.MultiMarginLoss(weight=L.ones(2, 2)), ValueError, "expected weight"),
    (lambda L: L.nn.TripletMarginLoss(margin=0.0), ValueError, "greater than 0"),
    (lambda L: L.nn.TripletMarginWithDistanceLoss(margin=-1.0), ValueError, "greater than 0"),
    (lambda L: L.nn.HuberLoss(delta="1"), TypeError, "delta must be a float or int"),
])
def test_loss_constructor_errors(make, exc, msg):
    for lib in LIBS:
        with pytest.raises(exc, match=msg):
            make(lib)


ERRORS = [
    (lambda L: L.nn.functional.cross_entropy(L.zeros(3, 5), L.tensor([1, 0, 4, 2])),
     ValueError),
    (lambda L: L.nn.functional.nll_loss(L.zeros(3, 5), L.tensor([1, 0, 5])), IndexError),
    (lambda L: L.nn.functional.nll_loss(L.zeros(3, 5), L.tensor([1, 0, 4], dtype=L.int32)),
     RuntimeError),
    (lambda L: L.nn.functional.nll_loss(L.zeros(3, 5), L.tensor([1, 0, 4]),
                                        weight=L.ones(4)), RuntimeError),
    (lambda L: L.nn.functional.nll_loss(L.zeros(2, 5, 3), L.zeros(2, 2, dtype=L.int64)),
     RuntimeError),
    (lambda L: L.nn.functional.nll_loss(L.tensor(1.0), L.tensor(0)), ValueError),
    (lambda L: L.nn.functional.cross_entropy(L.zeros(3, 5), L.tensor([1, 0, 4]),
                                             label_smoothing=1.5), RuntimeError),
    (lambda L: L.nn.functional.cross_entropy(L.zeros(3, 5), L.zeros(3, 5), ignore_index=1),
     RuntimeError),
    (lambda L: L.nn.functional.cross_entropy(L.zeros(3, 5), L.tensor([1, 0, 4]),
                                             reduction="avg"), ValueError),
    (lambda L: L.nn.functional.binary_cross_entropy(L.full((2,), 2.0), L.ones(2)),
     RuntimeError),
    (lambda L: L.nn.functional.binary_cross_entropy(L.full((2,), 0.5), L.ones(3)),
     ValueError),
    (lambda L: L.nn.functional.binary_cross_entropy_with_logits(L.ones(2), L.ones(3)),
     ValueError),
    (lambda L: L.nn.functional.kl_div(L.ones(2, dtype=L.int64), L.ones(2)), RuntimeError),
    (lambda L: L.nn.functional.gaussian_nll_loss(L.ones(2, 3), L.ones(2, 3), -L.ones(2, 3)),
     ValueError),
    (lambda L: L.nn.functional.margin_ranking_loss(L.ones(2, 3), L.ones(3), L.ones(3)),
     RuntimeError),
    (lambda L: L.nn.functional.cosine_embedding_loss(L.ones(2, 3), L.ones(2, 3), L.tensor(1.)),
     RuntimeError),
    (lambda L: L.nn.functional.multi_margin_loss(L.ones(2, 3), L.tensor([0, 3])),
     RuntimeError),
    (lambda L: L.nn.functional.pdist(L.ones(2, 3, 4)), RuntimeError),
    (lambda L: L.cdist(L.ones(3, 4), L.ones(2, 3)), RuntimeError),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_loss_errors_match_torch(case):
    """Same exception type and message (up to ``tessera.Size`` for ``torch.Size``)."""
    call = ERRORS[case]
    with pytest.raises(Exception) as ref:
        call(torch)
    with pytest.raises(type(ref.value)) as ours:
        call(tessera)
    # (dispatch may prefix the op's name: "nll_loss: <PyTorch's message>")
    assert str(ours.value).replace("tessera.", "torch.").endswith(str(ref.value))


def test_batch_size_message():
    with pytest.raises(ValueError) as e:
        F.cross_entropy(tessera.zeros(3, 5), tessera.tensor([1, 0, 4, 2]))
    assert str(e.value).endswith("Expected input batch_size (3) to match target batch_size "
                                 "(4).")


def test_cross_entropy_mean_with_weights_divides_by_weight_sum():
    x = tessera.tensor(LOGITS)
    t = tessera.tensor(TARGET_IGN)
    got = float(F.cross_entropy(x, t, weight=tessera.tensor(W)))
    kept = TARGET_IGN != -100
    nll = -LOGP[np.arange(N), np.where(kept, TARGET_IGN, 0)] * W[np.where(kept, TARGET_IGN, 0)]
    assert math.isclose(got, nll[kept].sum() / W[TARGET_IGN[kept]].sum(), rel_tol=1e-12)


def test_cross_entropy_is_log_softmax_plus_nll():
    """The hot path against its definition, values and gradients."""
    x = tessera.tensor(rng.standard_normal((6, 7, 3)), requires_grad=True)
    t = tessera.tensor(rng.integers(0, 7, (6, 3)))
    a = F.cross_entropy(x, t, reduction="sum")
    ga, = tessera.autograd.grad(a, x)
    logp = x - x.logsumexp(1, keepdim=True)
    b = -logp.gather(1, t.unsqueeze(1)).sum()
    gb, = tessera.autograd.grad(b, x)
    np.testing.assert_allclose(npy(a), npy(b), rtol=1e-12)
    np.testing.assert_allclose(npy(ga), npy(gb), rtol=1e-10, atol=1e-12)


def test_stability_at_extreme_logits():
    x = tessera.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4]], dtype=tessera.float32)
    for f in (lambda v: F.cross_entropy(v, tessera.tensor([1, 0])),
              lambda v: F.log_softmax(v, 1).sum(), lambda v: F.softplus(v).sum(),
              lambda v: F.logsigmoid(v).sum(), lambda v: F.silu(v).sum(),
              lambda v: F.binary_cross_entropy_with_logits(v, tessera.ones(2, 3))):
        v = x.clone().requires_grad_(True)
        out = f(v)
        out.backward()
        assert np.isfinite(npy(out)).all() and np.isfinite(npy(v.grad)).all()


# ---- double backward, fused kernels vs composites ------------------------------------------

SECOND_ORDER = [
    lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"), lambda x: F.silu(x),
    lambda x: F.softmax(x, 1), lambda x: F.log_softmax(x, 0), lambda x: F.elu(x, 0.7),
    lambda x: F.selu(x), lambda x: F.softplus(x, 2.0), lambda x: F.mish(x),
    lambda x: F.leaky_relu(x, 0.1), lambda x: F.logsigmoid(x), lambda x: F.hardswish(x),
    lambda x: F.prelu(x, tessera.tensor([0.3, -0.2, 0.5], dtype=tessera.float64)),
    lambda x: F.cross_entropy(x, tessera.tensor([0, 2, 1, 2])),
    lambda x: F.cross_entropy(x, tessera.tensor([0, 2, -100, 2]), label_smoothing=0.2,
                              weight=tessera.tensor([0.5, 1.0, 2.0], dtype=tessera.float64)),
    lambda x: F.nll_loss(x, tessera.tensor([0, 2, 1, 2]), reduction="none"),
    lambda x: F.binary_cross_entropy(x.sigmoid(), tessera.full((4, 3), 0.3,
                                                               dtype=tessera.float64)),
    lambda x: F.cosine_similarity(x, x.flip(0)),
]


@pytest.mark.parametrize("case", range(len(SECOND_ORDER)))
def test_double_backward(case):
    x = tessera.tensor(rng.uniform(-2, 2, (4, 3)), requires_grad=True)
    assert tessera.autograd.gradgradcheck(SECOND_ORDER[case], (x,))


def test_double_backward_matches_torch():
    xs = rng.uniform(-2, 2, (4, 3))
    res = []
    for lib in LIBS:
        x = lib.tensor(xs, requires_grad=True)
        y = (lib.nn.functional.gelu(x) * lib.nn.functional.softmax(x, 1)).sum() + \
            lib.nn.functional.cross_entropy(x, lib.tensor([0, 1, 2, 1]))
        g, = lib.autograd.grad(y, x, create_graph=True)
        gg, = lib.autograd.grad((g * g).sum(), x)
        res.append(npy(gg))
    np.testing.assert_allclose(res[1], res[0], rtol=1e-10, atol=1e-12)


def test_fused_backward_kernels_match_composites():
    """gelu/silu/softmax/log_softmax backward ops against the derivative written out."""
    from tessera.ops import activation as A
    x = tessera.tensor(rng.uniform(-4, 4, (5, 6)))
    g = tessera.tensor(rng.standard_normal((5, 6)))
    phi = (-0.5 * x * x).exp() / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + (x / math.sqrt(2)).erf())
    np.testing.assert_allclose(npy(A.gelu_backward(g, x)), npy(g * (cdf + x * phi)),
                               rtol=1e-12, atol=1e-14)
    s = x.sigmoid()
    np.testing.assert_allclose(npy(A.silu_backward(g, x)), npy(g * s * (1 + x * (1 - s))),
                               rtol=1e-12, atol=1e-14)
    y = tessera.softmax(x, 1)
    np.testing.assert_allclose(npy(A.softmax_backward(g, y, 1)),
                               npy(y * (g - (g * y).sum(1, keepdim=True))), rtol=1e-12,
                               atol=1e-14)
    ly = tessera.log_softmax(x, 0)
    np.testing.assert_allclose(npy(A.log_softmax_backward(g, ly, 0)),
                               npy(g - ly.exp() * g.sum(0, keepdim=True)), rtol=1e-12,
                               atol=1e-14)


# ---- top level and Tensor methods -----------------------------------------------------------

TOP_LEVEL = [
    lambda L, x: L.softmax(x, 1), lambda L, x: L.log_softmax(x, 0, dtype=L.float32),
    lambda L, x: x.softmax(-1), lambda L, x: x.log_softmax(1), lambda L, x: L.selu(x),
    lambda L, x: L.celu(x, 0.5), lambda L, x: L.threshold(x, 0.1, 3.0),
    lambda L, x: L.hardshrink(x, 0.7), lambda L, x: x.hardshrink(0.3),
    lambda L, x: L.prelu(x, L.tensor([0.2], dtype=x.dtype)),
    lambda L, x: x.prelu(L.tensor([0.2], dtype=x.dtype)), lambda L, x: L.rrelu(x),
    lambda L, x: L.relu_(x.clone()), lambda L, x: L.selu_(x.clone()),
    lambda L, x: L.sigmoid_(x.clone()), lambda L, x: L.tanh_(x.clone()),
    lambda L, x: L.cosine_similarity(x, x.flip(0)), lambda L, x: L.pairwise_distance(x, x * 2),
    lambda L, x: L.pdist(x), lambda L, x: L.cdist(x, x * 3, p=1.0),
    lambda L, x: L.kl_div(x.log_softmax(1), x.softmax(0)),
    lambda L, x: L.kl_div(x, x * 0.5, 2, log_target=True),
    lambda L, x: L.binary_cross_entropy_with_logits(x, x.sigmoid(), None, None, 0),
    lambda L, x: L.poisson_nll_loss(x, x.abs(), True, False, 1e-8, 1),
    lambda L, x: L.margin_ranking_loss(x, x.flip(0), x.sign(), 0.1, 2),
    lambda L, x: L.hinge_embedding_loss(x, x.sign()),
    lambda L, x: L.triplet_margin_loss(x, x * 2, x.flip(1)),
    lambda L, x: L.cosine_embedding_loss(x, x.flip(1), x[:, 0].sign(), 0.0, 0),
]


@pytest.mark.parametrize("case", range(len(TOP_LEVEL)))
def test_top_level_functions(case):
    xs = rng.uniform(-2, 2, (4, 3))
    outs = [npy(TOP_LEVEL[case](lib, lib.tensor(xs))) for lib in LIBS]
    assert outs[1].dtype == outs[0].dtype and outs[1].shape == outs[0].shape
    np.testing.assert_allclose(outs[1], outs[0], **tol(outs[0].dtype))


def test_normalize_out_and_zero_rows():
    x = rng.standard_normal((3, 4))
    x[1] = 0
    out = tessera.empty(3, 4, dtype=tessera.float64)
    r = F.normalize(tessera.tensor(x), out=out)
    assert r is out
    np.testing.assert_allclose(npy(out), npy(torch.nn.functional.normalize(torch.tensor(x))))
