"""einsum against torch.einsum and numpy.einsum on a table of equations: values, dtypes,
gradients (against torch's, and float64 gradcheck), double backward, the meta device."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera

# (equation, operand shapes): every kind of equation, sizes 0 and 1 among them
CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),                       # matmul
    ("ij,jk", [(2, 0), (0, 3)]),                           # empty contraction
    ("ij,jk->ik", [(0, 4), (4, 5)]),
    ("ij,jk->ik", [(1, 1), (1, 1)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),              # batched matmul
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),        # bilinear
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),     # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 6), (2, 3, 6, 4)]),     # attention output
    ("ii", [(4, 4)]),                                      # trace
    ("ii->", [(0, 0)]),
    ("ii->i", [(3, 3)]),                                   # diagonal
    ("iij->ji", [(2, 2, 3)]),
    ("iii->i", [(2, 2, 2)]),
    ("i,j->ij", [(3,), (4,)]),                             # outer
    ("i,j", [(0,), (2,)]),
    ("ij->ji", [(3, 4)]),                                  # transposes
    ("ijk->kij", [(2, 3, 4)]),
    ("ij", [(2, 3)]),
    ("ji", [(2, 3)]),
    ("ij->", [(2, 3)]),                                    # sums
    ("ijk->j", [(2, 3, 4)]),
    ("i,i->", [(5,), (5,)]),                               # dot
    ("i,i", [(1,), (1,)]),
    ("bi,bi->b", [(6, 5), (6, 5)]),                        # batched dot
    ("ij,ij->ij", [(3, 4), (3, 4)]),                       # Hadamard
    ("ij,j->i", [(3, 4), (4,)]),                           # matrix-vector
    ("ij,j->i", [(3, 4), (1,)]),                           # size-1 broadcast
    ("ij,ij->ij", [(3, 1), (1, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),     # ellipsis broadcasting
    ("...ij,...jk", [(3, 4), (2, 4, 5)]),
    ("i...j,j...->...i", [(2, 3, 4, 5), (5, 4)]),
    ("...,...->...", [(2, 3), (3,)]),
    ("...->", [(2, 3)]),
    ("ij...->ij", [(2, 3, 4)]),                            # ellipsis summed
    ("ij->...ij", [(2, 3)]),
    ("a...a->...", [(2, 3, 2)]),
    ("", [()]),                                            # scalars
    ("->", [()]),
    (",i->i", [(), (3,)]),
    ("ab,bc,cd->ad", [(3, 4), (4, 5), (5, 2)]),            # chains, 3-6 operands
    ("ab,bc,cd,de->ae", [(2, 8), (8, 3), (3, 7), (7, 2)]),
    ("ab,bc,cd,de,ef->af", [(5, 4), (4, 3), (3, 6), (6, 2), (2, 5)]),
    ("ab,bc,cd,de,ef,fg->ag", [(2, 3), (3, 2), (2, 4), (4, 1), (1, 3), (3, 2)]),
    ("ij,jk,kl,li->", [(2, 3), (3, 4), (4, 5), (5, 2)]),   # a cycle
    ("ab,cd,ef->abcdef", [(1, 2), (2, 1), (2, 2)]),        # outer products of three
    ("abc,cd,bde->ae", [(2, 3, 4), (4, 5), (3, 5, 2)]),
    ("ea,fb,abcd,gc,hd->efgh", [(2, 3), (2, 3), (3, 3, 3, 3), (2, 3), (2, 3)]),
    ("i,j,k->", [(2,), (0,), (3,)]),
    ("Ab,bC->AC", [(2, 3), (3, 4)]),                       # upper case
    ("Ba,aC", [(2, 3), (3, 4)]),
    (" i j , j k -> i k ", [(2, 3), (3, 4)]),              # spaces
    ("aab,bcc->ac", [(2, 2, 3), (3, 4, 4)]),               # diagonals in a product
    ("ab,ab,ab->", [(2, 3), (2, 3), (1, 3)]),
]


def _inputs(shapes, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _id(case):
    eq, shapes = case
    return f"{eq.strip() or 'empty'}:{'x'.join(map(str, shapes))}".replace(" ", "")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_matches_torch_and_numpy(case, dtype):
    eq, shapes = case
    arrays = _inputs(shapes, dtype)
    ours = tessera.einsum(eq, *[tessera.from_numpy(a) for a in arrays])
    ref = torch.einsum(eq, *[torch.from_numpy(a) for a in arrays])
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ours.dtype.name == str(ref.dtype).split(".")[1]
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=tol, atol=tol)
    if not any(1 in s for s in shapes[1:]) or "..." in eq:  # numpy broadcasts less
        try:
            expected = np.einsum(eq, *arrays)
        except ValueError:
            return
        np.testing.assert_allclose(ours.numpy(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_gradients_match_torch(case):
    eq, shapes = case
    arrays = _inputs(shapes, seed=1)
    xs = [tessera.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, ref = tessera.einsum(eq, *xs), torch.einsum(eq, *ts)
    g = np.random.default_rng(2).standard_normal(tuple(ref.shape))
    out.backward(tessera.tensor(g))
    ref.backward(torch.tensor(g))
    for x, t in zip(xs, ts):
        assert tuple(x.grad.shape) == tuple(t.grad.shape)
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", [c for c in CASES if 0 not in sum(map(tuple, c[1]), ())
                                  and sum(int(np.prod(s)) for s in c[1]) <= 120],
                         ids=_id)
def test_gradcheck_float64(case):
    eq, shapes = case
    xs = [tessera.tensor(a, requires_grad=True) for a in _inputs(shapes, seed=3)]
    assert tessera.autograd.gradcheck(lambda *a: tessera.einsum(eq, *a), xs)


DOUBLE = ["ij,jk->ik", "ii->i", "i,j->ij", "bij,bjk->bik", "ij,j->i", "ab,bc,cd->ad",
          "...ij,...jk", "ij->"]


@pytest.mark.parametrize("eq", DOUBLE)
def test_double_backward_matches_torch(eq):
    shapes = next(s for e, s in CASES if e == eq)
    arrays = _inputs(shapes, seed=4)
    xs = [tessera.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]

    def second(lib, vs):
        out = lib.einsum(eq, *vs)
        gs = lib.autograd.grad((out * out).sum(), vs, create_graph=True)
        total = sum((g * g).sum() for g in gs)
        return lib.autograd.grad(total, vs)

    for a, b in zip(second(tessera, xs), second(torch, ts)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-9, atol=1e-9)


def test_gradgradcheck():
    xs = [tessera.tensor(a, requires_grad=True) for a in _inputs([(2, 3), (3, 3), (3, 2)])]
    assert tessera.autograd.gradgradcheck(lambda *a: tessera.einsum("ab,bb,bc->ac", *a), xs)


def test_only_needed_gradients():
    a = tessera.randn(3, 4, requires_grad=True)
    b = tessera.randn(4, 5)
    tessera.einsum("ij,jk->ik", a, b).sum().backward()
    assert a.grad is not None and b.grad is None


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_meta_device(case):
    eq, shapes = case
    metas = [tessera.empty(s, device="meta") for s in shapes]
    out = tessera.einsum(eq, *metas)
    ref = torch.einsum(eq, *[torch.empty(s, device="meta") for s in shapes])
    assert out.device.type == "meta" and tuple(out.shape) == tuple(ref.shape)


def test_operand_list_and_sublist_forms():
    a, b = tessera.randn(2, 3), tessera.randn(3, 4)
    expected = tessera.einsum("ij,jk->ik", a, b).numpy()
    np.testing.assert_allclose(tessera.einsum("ij,jk->ik", [a, b]).numpy(), expected)
    np.testing.assert_allclose(tessera.einsum(a, [0, 1], b, [1, 2], [0, 2]).numpy(), expected)
    np.testing.assert_allclose(tessera.einsum(a, [0, 1], b, [1, 2]).numpy(), expected)
    x = tessera.randn(2, 3, 4)
    ref = torch.einsum(torch.from_numpy(x.numpy()), [Ellipsis, 1], [1, Ellipsis])
    ours = tessera.einsum(x, [Ellipsis, 1], [1, Ellipsis])
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-6)
    ours = tessera.einsum(x, [np.int64(51), 0, 26])
    ref = torch.einsum(torch.from_numpy(x.numpy()), [51, 0, 26])
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integers(dtype):
    rng = np.random.default_rng(5)
    a = rng.integers(-5, 5, (3, 4)).astype(dtype)
    b = rng.integers(-5, 5, (4, 2)).astype(dtype)
    for eq, ops in [("ij,jk->ik", (a, b)), ("ij->j", (a,)), ("ij->ji", (a,)),
                    ("ij,ij->ij", (a, a))]:
        ours = tessera.einsum(eq, *map(tessera.from_numpy, ops))
        ref = torch.einsum(eq, *map(torch.from_numpy, ops))
        assert ours.dtype.name == str(ref.dtype).split(".")[1], eq
        np.testing.assert_array_equal(ours.numpy(), ref.numpy())


def test_float16_accumulates_in_float32():
    a = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float16)
    ours = tessera.einsum("ij,kj->ik", tessera.from_numpy(a), tessera.from_numpy(a))
    assert ours.dtype is tessera.float16
    ref = np.einsum("ij,kj->ik", a.astype(np.float32), a.astype(np.float32))
    np.testing.assert_allclose(ours.numpy().astype(np.float32), ref, rtol=2e-3, atol=2e-2)


def test_complex_forward_and_gradient():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3)))
    b = (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2)))
    ours = tessera.einsum("ij,jk->ik", tessera.tensor(a), tessera.tensor(b))
    np.testing.assert_allclose(ours.numpy(), a @ b)


def test_result_is_new_memory():
    """Pure permutes and diagonals copy: writing the result leaves the input alone."""
    x = tessera.arange(9.).reshape(3, 3)
    for eq in ("ij->ji", "ii->i", "ij", "ij->ij"):
        y = tessera.einsum(eq, x)
        y.add_(100)
        assert float(x.sum()) == 36.0, eq


def test_path_attr_is_chosen_before_dispatch():
    """The op carries the canonical equation and the path; the kernel follows it."""
    from tessera.ops.registry import REGISTRY
    a, b, c = tessera.randn(2, 9), tessera.randn(9, 9), tessera.randn(9, 3)
    out = tessera.einsum("ab,bc,cd->ad", a, b, c)
    for path in (((0, 1), (0, 1)), ((1, 2), (0, 1)), ((0, 2), (0, 1))):
        other = tessera._dispatch.dispatch(REGISTRY["einsum"], a, b, c,
                                           equation="ab,bc,cd->ad", path=path)
        np.testing.assert_allclose(other.numpy(), out.numpy(), rtol=1e-5, atol=1e-5)


def test_batch_split_over_threads(monkeypatch):
    """Batched steps big enough run their batch in chunks on the kernel threads, each with
    single-threaded BLAS; forced here on small sizes, the results must not change."""
    from tessera.ops.einsum import _lower
    if _lower._blas_local() is None:
        pytest.skip("NumPy's BLAS is not OpenBLAS >= 0.3.27")
    monkeypatch.setattr(_lower, "_SPLIT_MIN", 0)
    monkeypatch.setattr(_lower, "_batch_split", lambda nb: 2 if nb >= 2 else 0)
    for eq, shapes in [("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),
                       ("bij,bjk->bik", [(5, 3, 4), (5, 4, 2)]),
                       ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])]:
        for dtype in (np.float32, np.float64):
            arrays = _inputs(shapes, dtype)
            ours = tessera.einsum(eq, *map(tessera.from_numpy, arrays)).numpy()
            ref = torch.einsum(eq, *map(torch.from_numpy, arrays)).numpy()
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
