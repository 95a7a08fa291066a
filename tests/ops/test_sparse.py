"""Sparse COO tensors against PyTorch's: construction, conversion, products and their
gradients, arithmetic with dense tensors, and the errors of unsupported ops."""
import numpy as np
import pytest
import torch

import tessera

IDX = [[0, 1, 1, 3, 0], [2, 0, 2, 1, 2]]      # (0, 2) repeats: uncoalesced
VAL = [3.0, 4.0, 5.0, -1.0, 0.5]
SIZE = (4, 3)


def both(values=VAL, requires_grad=False):
    s = tessera.sparse_coo_tensor(tessera.tensor(IDX), tessera.tensor(values), SIZE,
                                  requires_grad=requires_grad)
    t = torch.sparse_coo_tensor(torch.tensor(IDX), torch.tensor(values), SIZE,
                                requires_grad=requires_grad)
    return s, t


def same(a, b, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(a.detach().tolist()), b.detach().numpy(), rtol=rtol,
                               atol=1e-6)


def test_construction_and_conversion():
    s, t = both()
    assert s.shape == tuple(t.shape) and s.is_sparse and s.layout is tessera.sparse_coo
    assert str(s.device) == "cpu" and s._nnz() == t._nnz() == 5
    assert s.is_coalesced() == t.is_coalesced() is False
    same(s.to_dense(), t.to_dense())
    sc, tc = s.coalesce(), t.coalesce()
    assert sc.is_coalesced() and sc.indices().tolist() == tc.indices().tolist()
    same(sc.values(), tc.values())
    with pytest.raises(RuntimeError, match="uncoalesced"):
        s.indices()
    d = np.array([[0, 2.0, 0], [1, 0, 0], [0, 0, 0]], np.float32)
    ds, dt = tessera.tensor(d).to_sparse(), torch.tensor(d).to_sparse()
    assert ds.indices().tolist() == dt.indices().tolist()
    same(ds.values(), dt.values())
    d3 = np.zeros((3, 2, 2), np.float32)
    d3[1, 0] = [1, 2]
    ds, dt = tessera.tensor(d3).to_sparse(2), torch.tensor(d3).to_sparse(2)
    assert ds.indices().tolist() == dt.indices().tolist() and ds.dense_dim() == 1
    same(ds.values(), dt.values())
    same(ds.to_dense(), dt.to_dense())


def test_default_size_and_legacy_constructor():
    s = tessera.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0])
    t = torch.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0])
    assert s.shape == tuple(t.shape)
    legacy = tessera.sparse.FloatTensor(tessera.tensor(IDX), tessera.tensor(VAL),
                                        tessera.Size(SIZE))
    same(legacy.to_dense(), both()[1].to_dense())


@pytest.mark.parametrize("form", ["sparse.mm", "mm", "matmul", "operator", "spmm"])
def test_product_and_gradients(form):
    s, t = both(requires_grad=True)
    rng = np.random.default_rng(0)
    d = rng.standard_normal((3, 5)).astype(np.float32)
    dt = torch.tensor(d, requires_grad=True)
    ds = tessera.tensor(d, requires_grad=True)
    fns = {"sparse.mm": lambda L, a, b: L.sparse.mm(a, b), "mm": lambda L, a, b: L.mm(a, b),
           "matmul": lambda L, a, b: L.matmul(a, b), "operator": lambda L, a, b: a @ b,
           "spmm": lambda L, a, b: L.spmm(a, b)}
    out_s, out_t = fns[form](tessera, s, ds), fns[form](torch, t, dt)
    same(out_s, out_t)
    w = rng.standard_normal(out_t.shape).astype(np.float32)
    (out_s * tessera.tensor(w)).sum().backward()
    (out_t * torch.tensor(w)).sum().backward()
    same(ds.grad, dt.grad)
    # the sparse leaf's gradient: sparse at the stored entries from torch.sparse.mm, dense
    # and in full from torch.mm, matmul, @ and spmm
    assert str(s.grad.layout).split(".")[1] == str(t.grad.layout).split(".")[1]
    same(s.grad.to_dense(), t.grad.to_dense())


@pytest.mark.parametrize("form", ["dense @ sparse", "sparse.mm(dense, sparse)",
                                  "dense + sparse", "add(dense, sparse)", "sub(dense, sparse)",
                                  "sparse.addmm"])
def test_sparse_leaf_gradient_layouts(form):
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    grads = []
    for L in (tessera, torch):
        s = L.sparse_coo_tensor(L.tensor(IDX), L.tensor(VAL), SIZE, requires_grad=True)
        d = L.tensor(np.arange(12, dtype=np.float32).reshape(SIZE))
        out = {"dense @ sparse": lambda: L.tensor(x) @ s,
               "sparse.mm(dense, sparse)": lambda: L.sparse.mm(L.tensor(x), s),
               "dense + sparse": lambda: d + s, "add(dense, sparse)": lambda: L.add(d, s),
               "sub(dense, sparse)": lambda: L.sub(d, s, alpha=2),
               "sparse.addmm": lambda: L.sparse.addmm(L.ones(4, 2), s, L.ones(3, 2))}[form]()
        (out * out).sum().backward()
        grads.append((str(s.grad.layout).split(".")[1], s.grad.to_dense()))
    assert grads[0][0] == grads[1][0]
    same(grads[0][1], grads[1][1])


def test_sparse_leaf_autograd_grad_and_accumulation():
    for L in (tessera, torch):
        s = L.sparse_coo_tensor(L.tensor(IDX), L.tensor(VAL), SIZE, requires_grad=True)
        out = L.mm(s, L.ones(3, 2))
        (g,) = L.autograd.grad(out.sum(), s)
        assert g.layout == L.strided and g.tolist() == [[2.0] * 3] * 4
        L.mm(s, L.ones(3, 2)).sum().backward()
        L.mm(s, L.ones(3, 2)).sum().backward()
        assert s.grad.tolist() == [[4.0] * 3] * 4
        s.grad = None
        assert s.grad is None


def test_dense_times_sparse_and_to_sparse_gradient():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    s, t = both()
    xs, xt = tessera.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    same(xs @ s, xt @ t)
    d = np.array([[0, 2.0], [1.5, 0]], np.float32)
    a, b = tessera.tensor(d, requires_grad=True), torch.tensor(d, requires_grad=True)
    tessera.sparse.mm(a.to_sparse(), tessera.ones(2, 3)).sum().backward()
    torch.sparse.mm(b.to_sparse(), torch.ones(2, 3)).sum().backward()
    same(a.grad, b.grad)


def test_arithmetic():
    s, t = both()
    dense = np.arange(12, dtype=np.float32).reshape(SIZE)
    same(tessera.tensor(dense) + s, torch.tensor(dense) + t)
    for a, b in ((s, tessera.tensor(dense)), (t, torch.tensor(dense))):
        with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
            a + b
    same(tessera.tensor(dense) - s, torch.tensor(dense) - t)
    for call in ("L.add(d, s)", "L.add(d, s, alpha=2)", "L.sub(d, s)", "d.add(s)",
                 "d.clone().add_(s)", "d.clone().sub_(s, alpha=0.5)", "L.add(s, s)",
                 "L.mul(d, s)", "L.mul(s, d)", "d.mul(s)"):
        r = [eval(call, {"L": L, "d": L.tensor(dense), "s": x})
             for L, x in ((tessera, s), (torch, t))]
        assert r[0].is_sparse == r[1].is_sparse, call
        same(r[0].to_dense(), r[1].to_dense())
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        tessera.add(s, tessera.tensor(dense))
    same((s + s).to_dense(), (t + t).to_dense())
    assert (s + s).is_sparse and (s * 2).is_sparse
    same((s * 2).to_dense(), (t * 2).to_dense())
    same((2 * s).to_dense(), (2 * t).to_dense())
    same((s / 4).to_dense(), (t / 4).to_dense())
    same((-s).to_dense(), (-t).to_dense())
    same((s * tessera.tensor(dense)).to_dense(), (t * torch.tensor(dense)).to_dense())
    same(s.t().to_dense(), t.t().to_dense())
    same(s.sum(), t.sum())
    same(tessera.sparse.sum(s, 1).to_dense(), torch.sparse.sum(t, 1).to_dense())
    same(tessera.sparse.sum(s, 0).to_dense(), torch.sparse.sum(t, 0).to_dense())
    i = tessera.sparse_coo_tensor(tessera.tensor(IDX), tessera.ones(5), SIZE, dtype=tessera.int64)
    j = torch.sparse_coo_tensor(torch.tensor(IDX), torch.ones(5), SIZE, dtype=torch.int64)
    same(tessera.eye(4, 3) + i, torch.eye(4, 3) + j)   # gcn's adjacency with self-loops


def test_softmax_over_stored_entries():
    s, t = both()
    same(tessera.sparse.softmax(s, 1).to_dense(), torch.sparse.softmax(t, 1).to_dense())
    same(tessera.sparse.log_softmax(s, 1).to_dense(),
         torch.sparse.log_softmax(t.coalesce(), 1).to_dense())


def test_unsupported_ops_raise_clearly():
    s, _ = both()
    with pytest.raises(NotImplementedError, match="'aten::exp' with arguments from the "
                                                  "'SparseCPU' backend"):
        s.exp()
    with pytest.raises(NotImplementedError, match="SparseCPU"):
        tessera.relu(s)
    with pytest.raises(TypeError, match="to_dense"):
        s.numpy()
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        tessera.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,))
    with pytest.raises(RuntimeError, match="negative index"):
        tessera.sparse_coo_tensor([[0, -1]], [1.0, 2.0], (3,))
    with pytest.raises(RuntimeError, match="same nnz"):
        tessera.sparse_coo_tensor([[0, 1]], [1.0, 2.0, 3.0], (3,))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        tessera.sparse.mm(s, tessera.ones(4, 2))


def test_graph_convolution_trains_as_in_pytorch():
    """The gcn example's layer: support = x @ W; out = spmm(adj, support), a few SGD steps."""
    rng = np.random.default_rng(2)
    n, f, h = 6, 5, 3
    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0]])
    x = rng.standard_normal((n, f)).astype(np.float32)
    w0 = rng.standard_normal((f, h)).astype(np.float32)
    y = rng.integers(0, h, n)
    results = []
    for L in (tessera, torch):
        adj = L.sparse_coo_tensor(L.tensor(edges.T.copy()), L.ones(len(edges)), (n, n))
        adj = (L.eye(n) + adj).to_sparse()
        feats = L.tensor(x).to_sparse()
        w = L.tensor(w0, requires_grad=True)
        opt = L.optim.SGD([w], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            out = L.spmm(adj, L.mm(feats, w))
            loss = L.nn.functional.cross_entropy(out, L.tensor(y))
            loss.backward()
            opt.step()
        results.append((loss.item(), w.detach().numpy().copy()))
    assert abs(results[0][0] - results[1][0]) < 1e-5
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)
