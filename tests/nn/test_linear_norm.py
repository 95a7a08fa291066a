"""Linear, normalisation, dropout, embedding and flatten layers against PyTorch.

Every module is built in both libraries with the same arguments; PyTorch's ``state_dict``
is copied into tessera through NumPy; then outputs, input gradients, every parameter
gradient and the buffers (running statistics) are compared over several training steps,
and once more in eval mode. Dropout, whose masks come from different generators, is
checked by its statistics and by the consistency of mask and gradient.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tessera
import tessera.nn.functional as F

LIBS = (torch, tessera)


def to_tessera_sd(sd) -> dict:
    return {k: tessera.tensor(v.detach().numpy()) for k, v in sd.items()}


def npy(t) -> np.ndarray:
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t.detach().numpy()


def tol(dtype) -> dict:
    return dict(atol=1e-10, rtol=1e-9) if dtype == np.float64 else dict(atol=2e-5, rtol=2e-4)


def build_pair(make, dtype):
    """The same module in both libraries, with PyTorch's (random) state copied over."""
    pm, tm = make(torch), make(tessera)
    if dtype == np.float64:
        pm, tm = pm.double(), tm.double()
    tm.load_state_dict(to_tessera_sd(pm.state_dict()))
    return pm, tm


def _inputs(arrays, lib, grad: bool):
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


def run_step(pm, tm, arrays, dtype, rng, check_input_grad=True):
    """One forward/backward in both; compares output, input and parameter grads."""
    px, tx = _inputs(arrays, torch, True), _inputs(arrays, tessera, True)
    po, to = pm(*px), tm(*tx)
    np.testing.assert_allclose(npy(to), npy(po), **tol(dtype), err_msg="output")
    assert to.dtype.name == str(po.dtype).split(".")[-1]
    if not po.requires_grad:
        return
    cot = rng.standard_normal(tuple(po.shape)).astype(npy(po).dtype)
    po.backward(torch.tensor(cot))
    to.backward(tessera.tensor(cot))
    if check_input_grad:
        for a, b in zip(px, tx):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                np.testing.assert_allclose(npy(b.grad), npy(a.grad), **tol(dtype),
                                           err_msg="input grad")
    tp = dict(tm.named_parameters())
    for name, p in pm.named_parameters():
        q = tp[name]
        if p.grad is None:
            assert q.grad is None or not np.any(npy(q.grad)), name
        else:
            np.testing.assert_allclose(npy(q.grad), npy(p.grad), **tol(dtype), err_msg=name)
    pm.zero_grad()
    tm.zero_grad()


def compare_state(pm, tm, dtype) -> None:
    ps, ts = pm.state_dict(), tm.state_dict()
    assert list(ps) == list(ts)
    for k in ps:
        np.testing.assert_allclose(npy(ts[k]), npy(ps[k]), **tol(dtype), err_msg=k)


def check_module(make, shapes, dtype, steps=3, eval_too=True, ints=None, seed=0):
    """Train-mode steps (with state comparison after each), then one eval-mode step."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    pm, tm = build_pair(make, dtype)

    def arrays():
        if ints is not None:
            return ints(rng)
        return [rng.standard_normal(s).astype(dtype) for s in shapes]
    for _ in range(steps):
        run_step(pm, tm, arrays(), dtype, rng)
        compare_state(pm, tm, dtype)
    if eval_too:
        pm.eval()
        tm.eval()
        run_step(pm, tm, arrays(), dtype, rng)
        compare_state(pm, tm, dtype)


# (id, constructor, input shapes)
CASES = [
    ("linear", lambda L: L.nn.Linear(5, 3), [(4, 5)]),
    ("linear_nobias", lambda L: L.nn.Linear(5, 3, bias=False), [(4, 5)]),
    ("linear_3d", lambda L: L.nn.Linear(5, 3), [(2, 4, 5)]),
    ("linear_1d", lambda L: L.nn.Linear(5, 3), [(5,)]),
    ("bilinear", lambda L: L.nn.Bilinear(3, 4, 2), [(5, 3), (5, 4)]),
    ("bilinear_nobias", lambda L: L.nn.Bilinear(3, 4, 2, bias=False), [(2, 5, 3), (2, 5, 4)]),
    ("identity", lambda L: L.nn.Identity(3, unused=True), [(2, 3)]),
    ("flatten", lambda L: L.nn.Flatten(), [(2, 3, 4)]),
    ("flatten_0_1", lambda L: L.nn.Flatten(0, 1), [(2, 3, 4)]),
    ("unflatten", lambda L: L.nn.Unflatten(1, (2, 3)), [(4, 6)]),
    ("batchnorm1d", lambda L: L.nn.BatchNorm1d(3), [(6, 3)]),
    ("batchnorm1d_3d", lambda L: L.nn.BatchNorm1d(3, momentum=0.3), [(4, 3, 5)]),
    ("batchnorm1d_noaffine", lambda L: L.nn.BatchNorm1d(3, affine=False), [(6, 3)]),
    ("batchnorm1d_nobias", lambda L: L.nn.BatchNorm1d(3, bias=False), [(6, 3)]),
    ("batchnorm1d_notrack", lambda L: L.nn.BatchNorm1d(3, track_running_stats=False),
     [(6, 3)]),
    ("batchnorm1d_cma", lambda L: L.nn.BatchNorm1d(3, momentum=None), [(6, 3)]),
    ("batchnorm2d", lambda L: L.nn.BatchNorm2d(4, eps=1e-3), [(3, 4, 5, 2)]),
    ("batchnorm3d", lambda L: L.nn.BatchNorm3d(2), [(2, 2, 3, 2, 2)]),
    ("syncbatchnorm", lambda L: L.nn.SyncBatchNorm(3), [(2, 3, 4, 2)]),
    ("layernorm", lambda L: L.nn.LayerNorm(4), [(3, 5, 4)]),
    ("layernorm_2d", lambda L: L.nn.LayerNorm([5, 4], eps=1e-3), [(3, 5, 4)]),
    ("layernorm_noaffine", lambda L: L.nn.LayerNorm(4, elementwise_affine=False), [(3, 4)]),
    ("layernorm_nobias", lambda L: L.nn.LayerNorm(4, bias=False), [(3, 4)]),
    ("groupnorm", lambda L: L.nn.GroupNorm(2, 4), [(3, 4, 5)]),
    ("groupnorm_2d", lambda L: L.nn.GroupNorm(3, 6, eps=1e-3), [(2, 6, 3, 3)]),
    ("groupnorm_noaffine", lambda L: L.nn.GroupNorm(1, 4, affine=False), [(3, 4, 2)]),
    ("instancenorm1d", lambda L: L.nn.InstanceNorm1d(3), [(2, 3, 6)]),
    ("instancenorm1d_unbatched", lambda L: L.nn.InstanceNorm1d(3, affine=True), [(3, 6)]),
    ("instancenorm2d_affine_track",
     lambda L: L.nn.InstanceNorm2d(3, affine=True, track_running_stats=True), [(2, 3, 4, 4)]),
    ("instancenorm3d", lambda L: L.nn.InstanceNorm3d(2, affine=True), [(2, 2, 3, 2, 2)]),
    ("rmsnorm", lambda L: L.nn.RMSNorm(4), [(3, 5, 4)]),
    ("rmsnorm_2d", lambda L: L.nn.RMSNorm([5, 4], eps=1e-3), [(3, 5, 4)]),
    ("rmsnorm_noaffine", lambda L: L.nn.RMSNorm(4, elementwise_affine=False), [(3, 4)]),
    ("lrn", lambda L: L.nn.LocalResponseNorm(3), [(2, 5, 4, 4)]),
    ("lrn_3d", lambda L: L.nn.LocalResponseNorm(2, alpha=0.1, beta=0.5, k=2.0), [(2, 5, 4)]),
    ("dropout_p0", lambda L: L.nn.Dropout(0.0), [(3, 4)]),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_module_matches_torch(case, dtype):
    _, make, shapes = case
    check_module(make, shapes, dtype)


def _index_inputs(*arrays_fn):
    return lambda rng: arrays_fn[0](rng)


EMB_CASES = [
    ("embedding", lambda L: L.nn.Embedding(10, 4),
     lambda rng: [rng.integers(0, 10, (3, 5))]),
    ("embedding_padding", lambda L: L.nn.Embedding(10, 4, padding_idx=0),
     lambda rng: [rng.integers(0, 4, (3, 5))]),
    ("embedding_negative_padding", lambda L: L.nn.Embedding(10, 4, padding_idx=-2),
     lambda rng: [rng.integers(6, 10, (7,))]),
    ("embedding_freq", lambda L: L.nn.Embedding(10, 4, scale_grad_by_freq=True),
     lambda rng: [rng.integers(0, 4, (3, 5))]),
    ("embedding_max_norm", lambda L: L.nn.Embedding(10, 4, max_norm=1.0),
     lambda rng: [rng.integers(0, 10, (3, 5))]),
    ("embedding_max_norm_l1", lambda L: L.nn.Embedding(10, 4, max_norm=1.5, norm_type=1.0),
     lambda rng: [rng.integers(0, 10, (6,))]),
    ("embeddingbag_mean", lambda L: L.nn.EmbeddingBag(10, 4),
     lambda rng: [rng.integers(0, 10, (3, 5))]),
    ("embeddingbag_sum_offsets", lambda L: L.nn.EmbeddingBag(10, 4, mode="sum"),
     lambda rng: [rng.integers(0, 10, (8,)), np.array([0, 3, 3, 6])]),
    ("embeddingbag_max", lambda L: L.nn.EmbeddingBag(10, 4, mode="max"),
     lambda rng: [rng.permutation(10)[:8], np.array([0, 2, 5])]),
    ("embeddingbag_padding", lambda L: L.nn.EmbeddingBag(10, 4, mode="mean", padding_idx=1),
     lambda rng: [rng.integers(0, 3, (4, 3))]),
    ("embeddingbag_last_offset",
     lambda L: L.nn.EmbeddingBag(10, 4, mode="sum", include_last_offset=True),
     lambda rng: [rng.integers(0, 10, (6,)), np.array([0, 2, 6])]),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", EMB_CASES, ids=[c[0] for c in EMB_CASES])
def test_embedding_modules_match_torch(case, dtype):
    _, make, ints = case
    check_module(make, None, dtype, ints=ints)


def test_embedding_bag_per_sample_weights():
    rng = np.random.default_rng(3)
    pm, tm = build_pair(lambda L: L.nn.EmbeddingBag(6, 3, mode="sum"), np.float32)
    idx, offs = rng.integers(0, 6, (7,)), np.array([0, 3, 5])
    psw = rng.standard_normal(7).astype(np.float32)
    pw, tw = torch.tensor(psw, requires_grad=True), tessera.tensor(psw, requires_grad=True)
    po = pm(torch.tensor(idx), torch.tensor(offs), pw)
    to = tm(tessera.tensor(idx), tessera.tensor(offs), tw)
    np.testing.assert_allclose(npy(to), npy(po), rtol=1e-5, atol=1e-6)
    po.sum().backward()
    to.sum().backward()
    np.testing.assert_allclose(npy(tw.grad), npy(pw.grad), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(npy(tm.weight.grad), npy(pm.weight.grad), rtol=1e-5, atol=1e-6)


def test_embedding_bag_scale_grad_by_freq_by_hand():
    """Each row's gradient divided by its count in the batch (PyTorch 2.13's CPU kernel
    miscounts here, so the reference is written out)."""
    w = tessera.ones(6, 2, requires_grad=True)
    out = F.embedding_bag(tessera.tensor([1, 4, 4, 0, 5]), w, tessera.tensor([0, 1, 3]),
                          mode="sum", scale_grad_by_freq=True)
    out.sum().backward()
    expected = np.array([1, 1, 0, 0, 1, 1], np.float32)[:, None].repeat(2, 1)
    np.testing.assert_array_equal(npy(w.grad), expected)


def test_embedding_double_backward_scales_by_freq():
    """d/dg of the (frequency-scaled) weight gradient, against finite differences."""
    idx = tessera.tensor([[1, 0], [1, 3]])
    w = tessera.randn(4, 3, dtype=tessera.float64, requires_grad=True)

    def weight_grad(g):
        out = F.embedding(idx, w, scale_grad_by_freq=True, padding_idx=3)
        return tessera.autograd.grad(out, w, g, create_graph=True)[0]
    g = tessera.randn(2, 2, 3, dtype=tessera.float64, requires_grad=True)
    gg = tessera.randn(4, 3, dtype=tessera.float64)
    (ours,) = tessera.autograd.grad(weight_grad(g), g, gg)
    # weight_grad is linear in g: its vjp is row idx of gg, over the count, 0 at padding
    counts = {1: 2, 0: 1, 3: 1}
    ref = np.stack([[npy(gg)[i] / counts[i] * (i != 3) for i in row]
                    for row in [[1, 0], [1, 3]]])
    np.testing.assert_allclose(npy(ours), ref, rtol=1e-12)


def test_embedding_max_norm_renormalises_rows_in_place():
    w0 = np.random.default_rng(0).standard_normal((5, 3)) * 3
    for lib in LIBS:
        w = lib.tensor(w0.copy())
        lib.nn.functional.embedding(lib.tensor([1, 1, 3]), w, max_norm=1.0)
        norms = np.linalg.norm(npy(w), axis=1)
        assert np.all(norms[[1, 3]] <= 1.0 + 1e-6)
        np.testing.assert_array_equal(npy(w)[[0, 2, 4]], w0[[0, 2, 4]])


def test_embedding_from_pretrained():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    for lib in LIBS:
        src = lib.tensor(table)
        emb = lib.nn.Embedding.from_pretrained(src)
        assert not emb.weight.requires_grad
        np.testing.assert_array_equal(npy(emb(lib.tensor([2]))), table[[2]])
        assert lib.nn.Embedding.from_pretrained(src, freeze=False).weight.requires_grad
        bag = lib.nn.EmbeddingBag.from_pretrained(src, mode="sum")
        np.testing.assert_array_equal(npy(bag(lib.tensor([[0, 1]]))), table[[0, 1]].sum(0,
                                                                                         keepdims=True))
        with pytest.raises(AssertionError):
            lib.nn.Embedding.from_pretrained(lib.ones(3))
    t = tessera.tensor(table)
    emb = tessera.nn.Embedding.from_pretrained(t)
    t[0, 0] = 100.0  # the table is shared, not copied, like PyTorch
    assert float(emb.weight[0, 0]) == 100.0


def test_module_reprs_match_torch():
    ctors = [c[1] for c in CASES + EMB_CASES] + [
        lambda L: L.nn.Dropout(0.2, inplace=True), lambda L: L.nn.Dropout1d(),
        lambda L: L.nn.Dropout2d(0.1), lambda L: L.nn.Dropout3d(), lambda L: L.nn.AlphaDropout(),
        lambda L: L.nn.FeatureAlphaDropout(0.3), lambda L: L.nn.LazyLinear(3),
        lambda L: L.nn.Embedding(5, 2, padding_idx=1, max_norm=2.0, norm_type=1.0,
                                 scale_grad_by_freq=True, sparse=True),
        lambda L: L.nn.EmbeddingBag(5, 2, max_norm=1.0, norm_type=3.0, scale_grad_by_freq=True,
                                    mode="sum", padding_idx=-1),
        lambda L: L.nn.RMSNorm(3, eps=1e-6), lambda L: L.nn.BatchNorm2d(3, momentum=None),
        lambda L: L.nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
    ]
    for make in ctors:
        assert repr(make(tessera)) == repr(make(torch))


def _errors(make, *inputs):
    """The exception type (and message) PyTorch raises, and that tessera raises the same."""
    caught = []
    for lib in LIBS:
        with pytest.raises(Exception) as info:
            make(lib)(*[lib.tensor(a) for a in inputs])
        caught.append(info.value)
    (pe, te) = caught
    assert type(te) is type(pe), (pe, te)
    return pe, te


@pytest.mark.parametrize("make,shape", [
    (lambda L: L.nn.BatchNorm1d(3), (2, 3, 4, 5)),
    (lambda L: L.nn.BatchNorm2d(3), (2, 3, 4)),
    (lambda L: L.nn.BatchNorm3d(3), (2, 3, 4, 4)),
    (lambda L: L.nn.SyncBatchNorm(3), (3,)),
    (lambda L: L.nn.BatchNorm1d(3), (1, 3)),
    (lambda L: L.nn.BatchNorm1d(4), (2, 3)),
    (lambda L: L.nn.InstanceNorm1d(3, affine=True), (2, 4, 5)),
    (lambda L: L.nn.InstanceNorm2d(3), (2, 3)),
    (lambda L: L.nn.InstanceNorm1d(3), (2, 3, 1)),
    (lambda L: L.nn.LayerNorm(4), (2, 3)),
    (lambda L: L.nn.GroupNorm(2, 4), (2, 6, 3)),
    (lambda L: L.nn.RMSNorm(4), (2, 3)),
    (lambda L: L.nn.Linear(4, 2), (2, 3)),
    (lambda L: L.nn.LocalResponseNorm(2), (2, 3)),
    (lambda L: L.nn.Unflatten(1, (2, 2)), (2, 6)),
])
def test_forward_errors_match_torch(make, shape):
    pe, te = _errors(make, np.zeros(shape, np.float32))
    if isinstance(pe, ValueError):  # Python-level checks: the very same message
        assert str(te) == str(pe).replace("torch.", "tessera.")


@pytest.mark.parametrize("make", [
    lambda L: L.nn.GroupNorm(3, 4),
    lambda L: L.nn.Dropout(1.5),
    lambda L: L.nn.Dropout2d(-0.1),
    lambda L: L.nn.Embedding(5, 2, padding_idx=5),
    lambda L: L.nn.Embedding(5, 2, padding_idx=-6),
    lambda L: L.nn.EmbeddingBag(5, 2, padding_idx=7),
    lambda L: L.nn.Embedding(5, 2, _weight=L.ones(4, 2)),
    lambda L: L.nn.Unflatten(1, 6),
    lambda L: L.nn.Unflatten(1, (2, 3.0)),
])
def test_constructor_errors_match_torch(make):
    caught = []
    for lib in LIBS:
        with pytest.raises(Exception) as info:
            make(lib)
        caught.append(info.value)
    assert type(caught[1]) is type(caught[0])
    assert str(caught[1]) == str(caught[0])


# ---- default initialisation ------------------------------------------------------------

def test_linear_and_bilinear_default_init_distribution():
    tessera.manual_seed(0)
    lin = tessera.nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w, b = npy(lin.weight), npy(lin.bias)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    # U(-bound, bound) has std bound / sqrt(3)
    assert abs(w.std() - bound / math.sqrt(3)) < 0.02 * bound
    assert abs(w.mean()) < 0.01 * bound
    bil = tessera.nn.Bilinear(50, 20, 30)
    assert np.abs(npy(bil.weight)).max() <= 1 / math.sqrt(50)
    assert abs(npy(bil.weight).std() - 1 / math.sqrt(50) / math.sqrt(3)) < 0.03 / math.sqrt(50)


def test_norm_and_embedding_default_init():
    bn = tessera.nn.BatchNorm2d(5)
    assert npy(bn.weight).tolist() == [1.0] * 5 and npy(bn.bias).tolist() == [0.0] * 5
    assert npy(bn.running_mean).tolist() == [0.0] * 5
    assert npy(bn.running_var).tolist() == [1.0] * 5
    assert bn.num_batches_tracked.dtype is tessera.int64 and int(bn.num_batches_tracked) == 0
    ln = tessera.nn.LayerNorm((2, 3))
    assert tuple(ln.weight.shape) == (2, 3) and float(ln.weight.sum()) == 6.0
    tessera.manual_seed(1)
    emb = tessera.nn.Embedding(2000, 50, padding_idx=3)
    w = npy(emb.weight)
    assert not np.any(w[3])
    assert abs(w.std() - 1.0) < 0.02 and abs(w.mean()) < 0.02


def test_lazy_linear_becomes_linear():
    m = tessera.nn.LazyLinear(4)
    weight = m.weight
    out = m(tessera.randn(2, 7))
    assert type(m) is tessera.nn.Linear and m.in_features == 7
    assert tuple(out.shape) == (2, 4) and tuple(m.weight.shape) == (4, 7)
    assert m.weight is weight  # an optimizer made before the first call still holds it
    assert np.abs(npy(m.weight)).max() <= 1 / math.sqrt(7)
    assert repr(m) == "Linear(in_features=7, out_features=4, bias=True)"


# ---- dropout ---------------------------------------------------------------------------

def test_dropout_statistics_and_scale():
    tessera.manual_seed(0)
    x = tessera.ones(200, 500)
    for p in (0.1, 0.5, 0.8):
        y = npy(F.dropout(x, p))
        assert abs((y == 0).mean() - p) < 0.01
        np.testing.assert_allclose(np.unique(y[y != 0]), [1 / (1 - p)], rtol=1e-6)


def test_dropout_gradient_uses_the_forward_mask():
    tessera.manual_seed(1)
    x = tessera.randn(50, 40, requires_grad=True)
    y = F.dropout(x, 0.3)
    g = tessera.randn(50, 40)
    y.backward(g)
    keep = npy(y) != 0
    np.testing.assert_allclose(npy(x.grad), np.where(keep, npy(g) / 0.7, 0), rtol=1e-6)
    # double backward: the gradient, as a function of the cotangent, is the same mask
    x2 = tessera.randn(6, 5, dtype=tessera.float64, requires_grad=True)
    y2 = F.dropout(x2, 0.5)
    g2 = tessera.randn(6, 5, dtype=tessera.float64, requires_grad=True)
    (gx,) = tessera.autograd.grad(y2, x2, g2, create_graph=True)
    (gg,) = tessera.autograd.grad(gx, g2, tessera.ones_like(gx))
    np.testing.assert_array_equal(npy(gg), np.where(npy(y2) != 0, 2.0, 0.0))
    assert tessera.autograd.gradcheck(
        lambda t: (tessera.manual_seed(7), F.dropout(t, 0.4))[1], (x2,))


def test_dropout_is_reproducible_under_manual_seed():
    x = tessera.ones(100)
    tessera.manual_seed(5)
    a = npy(F.dropout(x, 0.5))
    tessera.manual_seed(5)
    b = npy(F.dropout(x, 0.5))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, npy(F.dropout(x, 0.5)))


def test_dropout_eval_inplace_and_extremes():
    x = tessera.randn(4, 5)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    assert tessera.nn.Dropout(0.5).eval()(x) is x
    np.testing.assert_array_equal(npy(F.dropout(x, 1.0)), np.zeros((4, 5), np.float32))
    y = x.clone()
    out = F.dropout(y, 0.5, inplace=True)
    assert out is y and np.all((npy(y) == 0) | np.isclose(npy(y), 2 * npy(x)))
    # in place on a non-leaf, through autograd
    leaf = tessera.randn(3, 4, requires_grad=True)
    h = leaf * 1
    F.dropout(h, 0.5, inplace=True).sum().backward()
    np.testing.assert_allclose(npy(leaf.grad), np.where(npy(h) != 0, 2.0, 0.0))


@pytest.mark.parametrize("fn,shape,per", [
    (F.dropout1d, (8, 6, 10), (8, 6, 1)), (F.dropout1d, (6, 10), (6, 1)),
    (F.dropout2d, (8, 6, 4, 4), (8, 6, 1, 1)), (F.dropout3d, (4, 6, 2, 3, 3), (4, 6, 1, 1, 1)),
    (F.dropout3d, (6, 2, 3, 3), (6, 1, 1, 1)),
])
def test_feature_dropout_zeroes_whole_channels(fn, shape, per):
    tessera.manual_seed(2)
    y = npy(fn(tessera.ones(*shape), 0.5))
    channel = y.reshape(per[:len(per) - sum(s == 1 for s in per)] + (-1,))
    assert np.all(channel.min(-1) == channel.max(-1))
    assert set(np.unique(y)) <= {0.0, 2.0} and 0 < (y == 0).mean() < 1


def test_alpha_dropout_keeps_mean_and_variance():
    tessera.manual_seed(3)
    x = tessera.randn(400, 500)
    for fn, p in ((F.alpha_dropout, 0.2), (F.alpha_dropout, 0.5)):
        y = npy(fn(x, p, training=True))
        assert abs(y.mean()) < 0.02 and abs(y.std() - 1) < 0.02
    y = npy(F.feature_alpha_dropout(tessera.randn(200, 100, 50), 0.3, training=True))
    assert abs(y.mean()) < 0.05 and abs(y.std() - 1) < 0.05
    x = tessera.randn(3, 4)
    assert F.alpha_dropout(x, 0.5) is x  # training defaults to False
    x.requires_grad_(True)
    y = F.alpha_dropout(x, 0.5, training=True)
    y.backward(tessera.ones_like(y))
    a = 1 / math.sqrt((1.7580993408473766 ** 2 * 0.5 + 1) * 0.5)
    kept = ~np.isclose(npy(y), -1.7580993408473766 * a + 1.7580993408473766 * a * 0.5)
    np.testing.assert_allclose(npy(x.grad), np.where(kept, a, 0.0), rtol=1e-6)


def test_dropout_modules_follow_training_flag():
    tessera.manual_seed(4)
    for m in (tessera.nn.Dropout(0.5), tessera.nn.Dropout2d(0.5), tessera.nn.AlphaDropout(0.5)):
        x = tessera.ones(4, 3, 5, 5)
        assert not np.array_equal(npy(m(x)), npy(x))
        m.eval()
        assert m(x) is x


# ---- double backward of the norms ------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda L, x, w, b: L.nn.functional.layer_norm(x, (4,), w, b),
    lambda L, x, w, b: L.nn.functional.batch_norm(x, None, None, w[:3], b[:3], training=True),
    lambda L, x, w, b: L.nn.functional.batch_norm(
        x, L.zeros(3, dtype=x.dtype), L.ones(3, dtype=x.dtype) * 2, w[:3], b[:3]),
    lambda L, x, w, b: L.nn.functional.rms_norm(x, (4,), w),
    lambda L, x, w, b: L.nn.functional.group_norm(x.reshape(2, 6, 2), 3),
    lambda L, x, w, b: L.nn.functional.instance_norm(x, weight=w[:3], bias=b[:3]),
], ids=["layer", "batch_train", "batch_eval", "rms", "group", "instance"])
def test_norm_double_backward_matches_torch(fn):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((2, 3, 4)), rng.standard_normal(4), rng.standard_normal(4)]
    g, gg = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    results = []
    for lib in LIBS:
        ins = [lib.tensor(a, requires_grad=True) for a in arrays]
        out = fn(lib, *ins)
        first = lib.autograd.grad(out, ins, lib.tensor(g).reshape(tuple(out.shape)),
                                  create_graph=True, allow_unused=True)
        x_grad = first[0]
        second = lib.autograd.grad(x_grad, ins, lib.tensor(gg), allow_unused=True)
        results.append([npy(t) if t is not None else None for t in second])
    for ours, ref in zip(results[1], results[0]):
        if ref is None:
            assert ours is None or not np.any(ours)
        else:
            np.testing.assert_allclose(ours, ref, rtol=1e-7, atol=1e-9)


# ---- gradient utilities ----------------------------------------------------------------

def _params_with_grads(lib, rng_seed=0, scale=1.0):
    rng = np.random.default_rng(rng_seed)
    ps = []
    for shape in [(3, 4), (5,), (2, 2, 2)]:
        p = lib.nn.Parameter(lib.tensor(rng.standard_normal(shape)))
        p.grad = lib.tensor(rng.standard_normal(shape) * scale)
        ps.append(p)
    ps.append(lib.nn.Parameter(lib.ones(2, dtype=lib.float64)))  # no grad
    return ps


@pytest.mark.parametrize("norm_type", [2.0, 1, float("inf"), 0.5, 3])
@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    res = []
    for lib in LIBS:
        ps = _params_with_grads(lib)
        total = lib.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type, foreach=None)
        assert isinstance(total, lib.Tensor) and total.dim() == 0
        res.append((float(total), [npy(p.grad) for p in ps[:3]]))
    assert res[1][0] == pytest.approx(res[0][0], rel=1e-12)
    for a, b in zip(res[1][1], res[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_clip_grad_helpers_match_torch():
    res = []
    for lib in LIBS:
        u = lib.nn.utils
        ps = _params_with_grads(lib)
        total = u.get_total_norm([p.grad for p in ps[:3]], 2.0)
        u.clip_grads_with_norm_(ps, 1.0, total)
        qs = _params_with_grads(lib, 1)
        u.clip_grad_value_(qs, 0.3)
        single = _params_with_grads(lib, 2)[0]
        t1 = u.clip_grad_norm_(single, 0.1)
        empty = u.get_total_norm([])
        res.append([float(total)] + [npy(p.grad) for p in ps[:3] + qs[:3]] +
                   [float(t1), npy(single.grad), float(empty)])
    for a, b in zip(res[1], res[0]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_clip_grad_norm_nonfinite_and_empty_generator():
    for lib in LIBS:
        ps = _params_with_grads(lib)
        ps[0].grad[0, 0] = float("inf")
        with pytest.raises(RuntimeError, match="non-finite"):
            lib.nn.utils.clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
        assert math.isinf(float(lib.nn.utils.clip_grad_norm_(ps, 1.0)))
        with pytest.warns(UserWarning, match="empty generator"):
            lib.nn.utils.clip_grad_norm_((p for p in []), 1.0)


def test_parameters_to_vector_round_trip_matches_torch():
    out = []
    for lib in LIBS:
        m = lib.nn.Sequential(lib.nn.Linear(3, 2), lib.nn.Linear(2, 1))
        m.load_state_dict({k: lib.tensor(np.arange(v.numel(), dtype=np.float32)
                                         .reshape(tuple(v.shape)))
                           for k, v in m.state_dict().items()})
        vec = lib.nn.utils.parameters_to_vector(m.parameters())
        lib.nn.utils.vector_to_parameters(vec * 2, m.parameters())
        out.append((npy(vec), [npy(p) for p in m.parameters()]))
    np.testing.assert_array_equal(out[1][0], out[0][0])
    for a, b in zip(out[1][1], out[0][1]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError):
        tessera.nn.utils.vector_to_parameters([1.0], [])
    # the vector is differentiable with respect to the parameters
    lin = tessera.nn.Linear(2, 2)
    (tessera.nn.utils.parameters_to_vector(lin.parameters()) ** 2).sum().backward()
    np.testing.assert_allclose(npy(lin.weight.grad), 2 * npy(lin.weight))
