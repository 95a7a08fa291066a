"""View semantics checked against PyTorch: shared storage, strides and offsets, reshape's
view-or-copy choice, shared version counters, autograd through in-place writes into views,
the errors PyTorch raises, and property tests of random view chains and index keys."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import tessera

LIBS = (tessera, torch)


def _np(t) -> np.ndarray:
    return t.detach().numpy().copy() if isinstance(t, torch.Tensor) else \
        t.detach()._to_numpy().copy()


def _version(t) -> int:
    return t._version if isinstance(t, torch.Tensor) else t._version[0]


def _base(L, shape=(2, 3, 4)):
    n = int(np.prod(shape))
    return L.arange(float(n), dtype=L.float64).reshape(shape)


def _layout(t):
    return tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous()


# ---- writes through views, strides and offsets --------------------------------------------

# views that do not overlap themselves, so writing through them is allowed in PyTorch
VIEWS = {
    "view": lambda x: x.view(6, 4),
    "view_flat": lambda x: x.view(-1),
    "reshape_viewable": lambda x: x.reshape(3, 8),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "T_2d": lambda x: x[0].T,
    "mT": lambda x: x.mT,
    "select": lambda x: x[1],
    "select_neg": lambda x: x.select(1, -1),
    "slice": lambda x: x[:, 1:3],
    "slice_step": lambda x: x[..., ::2],
    "slice_chain": lambda x: x[1:][:, ::2][..., 1:],
    "none": lambda x: x[None, :, None],
    "none_slice": lambda x: x[1, None, 1:, None],
    "narrow": lambda x: x.narrow(2, 1, 2),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:, :1].squeeze(1),
    "flatten": lambda x: x.flatten(0, 1),
    "unflatten": lambda x: x.unflatten(2, (2, 2)),
    "movedim": lambda x: x.movedim(0, -1),
    "diagonal": lambda x: x.diagonal(0, 1, 2),
    "diagonal_offset": lambda x: x.diagonal(1, -1, -2),
    "unfold": lambda x: x.unfold(2, 2, 2),
    "split": lambda x: x.split(2, dim=2)[1],
    "chunk": lambda x: x.chunk(3, 1)[2],
    "unbind": lambda x: x.unbind(1)[0],
    "tensor_split": lambda x: x.tensor_split(3, 2)[1],
    "detach": lambda x: x.detach(),
    "view_as": lambda x: x.view_as(x.new_zeros(4, 6)),
    "transpose_view": lambda x: x.transpose(1, 2)[:, 1].view(2, 1, 3),
}

# views whose elements overlap (read-only in PyTorch)
READ_VIEWS = {
    "expand": lambda x: x[:, :1].expand(2, 5, 4),
    "expand_new_dims": lambda x: x.expand(3, 2, 3, 4),
    "broadcast_to": lambda x: x[0, 0].broadcast_to((2, 4)),
    "unfold_overlap": lambda x: x.unfold(2, 3, 1),
    "expand_column": lambda x: x[0, 0].unsqueeze(1).expand(4, 2),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_write_through_view_and_base(name):
    fn = VIEWS[name]
    res = {}
    for L in LIBS:
        x = _base(L)
        v = fn(x)
        layout = _layout(v)
        v.mul_(-1)             # a write through the view shows in the base ...
        after_view = _np(x)
        x.add_(100)            # ... and a write to the base shows in the view
        res[L] = (layout, after_view, _np(v))
    (lo, xo, vo), (lr, xr, vr) = res[tessera], res[torch]
    assert lo == lr, f"shape/stride/offset/contiguous {lo} vs torch {lr}"
    np.testing.assert_array_equal(xo, xr)
    np.testing.assert_array_equal(vo, vr)


@pytest.mark.parametrize("name", sorted(READ_VIEWS))
def test_overlapping_views_see_base_writes(name):
    fn = READ_VIEWS[name]
    res = {}
    for L in LIBS:
        x = _base(L)
        v = fn(x)
        x.mul_(3)
        res[L] = (_layout(v), _np(v))
    assert res[tessera][0] == res[torch][0]
    np.testing.assert_array_equal(res[tessera][1], res[torch][1])


def test_atleast_nd_returns_the_input_itself():
    x = tessera.ones(2, 3, 4)
    assert tessera.atleast_1d(x) is x and tessera.atleast_3d(x) is x
    y = tessera.ones(3)
    tessera.atleast_2d(y).fill_(5.0)
    assert y.tolist() == [5.0, 5.0, 5.0]


def test_meshgrid_outputs_are_views_of_the_inputs():
    for L in LIBS:
        a, b = L.zeros(3), L.zeros(2)
        ga, gb = L.meshgrid(a, b, indexing="xy")
        a.add_(1)
        assert _np(ga).tolist() == [[1.0, 1.0, 1.0]] * 2
        assert tuple(ga.stride()) == (0, 1) and tuple(gb.stride()) == (1, 0)


@pytest.mark.xfail(strict=True, reason="Tensor.stride() in _tensor.py reports contiguous "
                   "strides for every zero-element tensor, also for views (see report)")
def test_zero_size_view_strides():
    lo, lr = (_layout(_base(L)[:, 0:0]) for L in LIBS)
    assert lo == lr


# ---- reshape: a view when strides allow it, else a copy --------------------------------------

RESHAPES = {
    "contiguous": (lambda x: x, (4, 6)),
    "contiguous_flat": (lambda x: x, (-1,)),
    "transposed": (lambda x: x.transpose(0, 1), (6, 4)),
    "transposed_keep_last": (lambda x: x.transpose(0, 1), (3, 2, 2, 2)),
    "sliced_rows": (lambda x: x[:, 1:], (2, 8)),
    "sliced_rows_split": (lambda x: x[:, 1:], (2, 2, 4)),
    "sliced_step": (lambda x: x[:, ::2], (2, 8)),
    "sliced_step_merge_ok": (lambda x: x[:, ::2], (4, 4)),
    "expanded": (lambda x: x[:, :1].expand(2, 3, 4), (6, 4)),
    "expanded_split": (lambda x: x[:, :1].expand(2, 3, 4), (2, 3, 2, 2)),
    "permuted_same_shape": (lambda x: x.permute(2, 0, 1), (4, 2, 3)),
    "size1_dims": (lambda x: x[:, :1, :], (2, 1, 1, 4)),
}


@pytest.mark.parametrize("name", sorted(RESHAPES))
def test_reshape_view_or_copy_like_torch(name):
    prep, shape = RESHAPES[name]
    res = {}
    for L in LIBS:
        x = _base(L)
        src = prep(x)
        y = src.reshape(shape)
        before = _np(src)
        layout = _layout(y)
        rel = y.data_ptr() - x.data_ptr()
        with (tessera.no_grad() if L is tessera else torch.no_grad()):
            y.fill_(-1.0)
        aliased = not np.array_equal(_np(src), before)
        res[L] = (aliased, layout, rel if aliased else None)
    assert res[tessera] == res[torch]


def test_view_raises_where_torch_does():
    for L in LIBS:
        x = _base(L).transpose(0, 1)
        with pytest.raises(RuntimeError):
            x.view(-1)
        with pytest.raises(RuntimeError):
            x[..., ::2].view(12)


# ---- version counters ------------------------------------------------------------------

def _version_script(L):
    x = L.zeros(4, 3)
    d = x.detach()
    v = x[1]
    w = v.unsqueeze(0).t()
    seen = [(_version(x), _version(v), _version(w), _version(d))]
    steps = [lambda: v.add_(1), lambda: x.mul_(2), lambda: w.zero_(),
             lambda: x.__setitem__(0, 1.0), lambda: x.__setitem__((slice(None), 0), 5.0),
             lambda: d.sub_(1), lambda: x.t_(), lambda: x.unsqueeze_(0)]
    for s in steps:
        s()
        seen.append((_version(x), _version(v), _version(w), _version(d)))
    return seen


def test_version_counter_is_shared_by_views_and_detach():
    assert _version_script(tessera) == _version_script(torch)


def test_advanced_setitem_bumps_version_once():
    res = []
    for L in LIBS:
        x = L.zeros(4, 3)
        out = [_version(x)]
        x[L.tensor([0, 2])] = 1.0
        out.append(_version(x))
        x[x > 0] = 2.0
        out.append(_version(x))
        x.index_put_((L.tensor([1]),), L.tensor(3.0), accumulate=True)
        out.append(_version(x))
        res.append(out)
    assert res[0] == res[1]


# ---- autograd through in-place writes into views of non-leaves ---------------------------

def _ip_mul_row(L, x, w):
    y = x * 1
    y[0].mul_(2)
    return (y * y).sum()


def _ip_setitem_col(L, x, w):
    y = x * 1
    y[:, 1] = w
    return (y * y).sum()


def _ip_chain(L, x, w):
    y = x.clone()
    y.t()[1:].mul_(w[1:, None])
    return (y.sin() * y).sum()


def _ip_view_after_base_write(L, x, w):
    y = x * 2
    v = y[0]
    y.mul_(3)
    return (v * v).sum() + y.sum()


def _ip_diagonal(L, x, w):
    y = x.exp()
    z = y * 1
    z.diagonal().copy_(w)
    return (z * y).sum()


def _ip_saves_input(L, x, w):
    y = x * 1
    y[1:, 1:].sin_()
    y[0].pow_(2)
    return (y * x).sum()


def _ip_advanced(L, x, w):
    y = x * 1
    y[L.tensor([0, 2])] = w
    y[y > 1.0] = 0.0
    return (y * y).sum()


def _ip_advanced_after_basic(L, x, w):
    y = x * 1
    y[1, L.tensor([2, 0])] = w[:2]
    y[:, L.tensor([1])] += w[:, None]
    return (y * y * y).sum()


def _ip_nested_views(L, x, w):
    y = x + 0
    a = y[:, 1:]
    b = a.t()
    b[0].add_(w)
    a.mul_(2)
    return (y * y).sum() + (b * b).sum()


def _ip_index_put_(L, x, w):
    y = x * 1
    y.index_put_((L.tensor([1, 1]),), w, accumulate=True)
    return (y * y).sum()


def _ip_on_split(L, x, w):
    y = x * 1
    with L.no_grad():
        y.split(1)[0].mul_(0.5)  # allowed under no_grad
    return (y * y).sum()


INPLACE = [_ip_mul_row, _ip_setitem_col, _ip_chain, _ip_view_after_base_write, _ip_diagonal,
           _ip_saves_input, _ip_advanced, _ip_index_put_, _ip_on_split]
# Known failures outside the view/indexing files (see the report):
# - ``y[i] += v`` on a non-leaf: the ``index`` node saves all its inputs, ``y`` included, so
#   the write into ``y`` trips the saved-version check; PyTorch saves only the indices.
# - an in-place op on a view whose base was written after the view was taken:
#   dispatch_inplace snapshots the view's stale history (it never calls _refresh_view).
_DISPATCH_BUGS = {
    _ip_advanced_after_basic: "index saves its data input; PyTorch saves only the indices",
}
INPLACE.append(_ip_nested_views)
INPLACE += [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=r))
            for f, r in _DISPATCH_BUGS.items()]


@pytest.mark.parametrize("fn", INPLACE, ids=lambda f: f.__name__[4:])
def test_inplace_on_views_gradients(fn):
    rng = np.random.default_rng(0)
    xv, wv = rng.uniform(-1.5, 1.5, (3, 3)), rng.uniform(-1, 1, (3,))
    res = []
    for L in LIBS:
        x = L.tensor(xv, requires_grad=True)
        w = L.tensor(wv, requires_grad=True)
        loss = fn(L, x, w)
        loss.backward()
        zero = np.zeros_like(wv)
        res.append((float(loss.detach()), _np(x.grad), zero if w.grad is None else _np(w.grad)))
    (lo, gxo, gwo), (lr, gxr, gwr) = res
    np.testing.assert_allclose(lo, lr, rtol=1e-12)
    np.testing.assert_allclose(gxo, gxr, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gwo, gwr, rtol=1e-10, atol=1e-12)


def test_inplace_on_view_double_backward():
    res = []
    for L in LIBS:
        x = L.tensor([[0.5, -1.0], [2.0, 0.3]], dtype=L.float64, requires_grad=True)
        y = x * x
        y[0].mul_(x[1])
        (g,) = L.autograd.grad(y.sum(), x, create_graph=True)
        (gg,) = L.autograd.grad((g * g).sum(), x)
        res.append((_np(g), _np(gg)))
    np.testing.assert_allclose(res[0][0], res[1][0])
    np.testing.assert_allclose(res[0][1], res[1][1])


# ---- errors ------------------------------------------------------------------------------

def _err_saved_modified(L, x):
    a = x * 1
    b = a * a
    a.add_(1)
    b.sum().backward()


def _err_saved_modified_through_view(L, x):
    a = x * 1
    b = a.sin()
    a[0].mul_(2)
    b.sum().backward()


def _err_view_saved_base_modified(L, x):
    a = x * 1
    v = a[0]
    b = v * v
    a.add_(1)
    b.sum().backward()


def _err_detach_modified(L, x):
    b = x * x
    x.detach().add_(1)
    b.sum().backward()


def _err_leaf_inplace(L, x):
    x.add_(1)


def _err_leaf_setitem(L, x):
    x[0] = 1.0


def _err_leaf_view_inplace(L, x):
    x[0].mul_(2)


def _err_leaf_view_chain_inplace(L, x):
    x.t()[1:].zero_()


def _err_leaf_advanced_setitem(L, x):
    x[L.tensor([0])] = 0.0


ERRORS = [_err_saved_modified, _err_saved_modified_through_view, _err_view_saved_base_modified,
          _err_detach_modified, _err_leaf_inplace, _err_leaf_setitem, _err_leaf_view_inplace,
          _err_leaf_view_chain_inplace, _err_leaf_advanced_setitem]


@pytest.mark.parametrize("fn", ERRORS, ids=lambda f: f.__name__[5:])
def test_inplace_errors_like_torch(fn):
    for L in LIBS:
        x = L.ones(3, 3, requires_grad=True)
        with pytest.raises(RuntimeError):
            fn(L, x)


def test_inplace_on_leaf_allowed_under_no_grad():
    for L in LIBS:
        x = L.ones(3, 3, requires_grad=True)
        with L.no_grad():
            x[0].mul_(2)
            x.add_(1)
            x[:, 1] = 0.0
        assert _np(x).tolist() == [[3.0, 0.0, 3.0], [2.0, 0.0, 2.0], [2.0, 0.0, 2.0]]
        assert x.is_leaf and x.grad_fn is None


@pytest.mark.xfail(strict=True, reason="dispatch_inplace does not check internal overlap "
                   "(PyTorch refuses in-place writes into expanded tensors)")
def test_inplace_into_expanded_tensor_raises():
    with pytest.raises(RuntimeError):
        tessera.zeros(3).expand(2, 3).add_(1)


def test_inplace_on_multi_output_view_raises():
    """Like PyTorch: refused under autograd, allowed without it."""
    x = tessera.ones(4, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        (x * 1).unbind(0)[0].mul_(2)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        (x * 1).split(2)[1].add_(1)
    tessera.ones(4, 3).unbind(0)[0].mul_(2)
    with tessera.no_grad():
        (x * 1).chunk(2)[0].mul_(2)


# ---- property tests: random view chains ---------------------------------------------------

@st.composite
def view_chains(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    steps, cur = [], list(shape)
    for _ in range(draw(st.integers(1, 6))):
        step, cur = _draw_view_step(draw, cur)
        steps.append(step)
    return shape, steps


def _draw_view_step(draw, cur):
    nd = len(cur)
    kinds = ["unsqueeze", "reshape", "none"]
    if nd:
        kinds += ["permute", "transpose", "slice", "select", "movedim", "unfold", "flip_dims"]
    if 1 in cur:
        kinds += ["squeeze", "expand"]
    if nd >= 2:
        kinds += ["diagonal"]
    kind = draw(st.sampled_from(kinds))
    if kind == "flip_dims":  # a negative-dim transpose
        return ("transpose", -1, 0), [cur[-1]] + cur[1:-1] + [cur[0]] if nd > 1 else cur
    if kind == "unsqueeze":
        d = draw(st.integers(-nd - 1, nd))
        dd = d % (nd + 1)
        return ("unsqueeze", d), cur[:dd] + [1] + cur[dd:]
    if kind == "none":
        d = draw(st.integers(0, nd))
        return ("none", d), cur[:d] + [1] + cur[d:]
    if kind == "permute":
        perm = draw(st.permutations(range(nd)))
        return ("permute", tuple(perm)), [cur[p] for p in perm]
    if kind == "transpose":
        a, b = draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))
        new = list(cur)
        new[a], new[b] = new[b], new[a]
        return ("transpose", a, b), new
    if kind == "movedim":
        a, b = draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))
        new = list(cur)
        new.insert(b, new.pop(a))
        return ("movedim", a, b), new
    if kind == "slice":
        d = draw(st.integers(0, nd - 1))
        n = cur[d]
        start = draw(st.integers(0, n - 1))
        stop = draw(st.integers(start + 1, n))
        step = draw(st.integers(1, 3))
        new = list(cur)
        new[d] = len(range(start, stop, step))
        return ("slice", d, start, stop, step), new
    if kind == "select":
        d = draw(st.integers(0, nd - 1))
        i = draw(st.integers(-cur[d], cur[d] - 1))
        return ("select", d, i), cur[:d] + cur[d + 1:]
    if kind == "unfold":
        d = draw(st.integers(0, nd - 1))
        size = draw(st.integers(1, cur[d]))
        step = draw(st.integers(1, 3))
        new = list(cur)
        new[d] = (cur[d] - size) // step + 1
        return ("unfold", d, size, step), new + [size]
    if kind == "diagonal":
        a, b = draw(st.lists(st.integers(0, nd - 1), min_size=2, max_size=2, unique=True))
        off = draw(st.integers(-1, 1))
        n1, n2 = cur[a], cur[b]
        n = max(0, min(n1, n2 - off) if off >= 0 else min(n1 + off, n2))
        if n == 0:
            off = 0
            n = min(n1, n2)
        rest = [s for i, s in enumerate(cur) if i not in (a, b)]
        return ("diagonal", off, a, b), rest + [n]
    if kind == "squeeze":
        ones = [i for i, s in enumerate(cur) if s == 1]
        d = draw(st.sampled_from(ones))
        return ("squeeze", d), cur[:d] + cur[d + 1:]
    if kind == "expand":
        new = [draw(st.integers(1, 3)) if s == 1 else s for s in cur]
        lead = draw(st.lists(st.integers(1, 2), max_size=1))
        return ("expand", tuple(lead + new)), lead + new
    return _draw_reshape(draw, cur)


def _draw_reshape(draw, cur):
    n = int(np.prod(cur)) if cur else 1
    choice = draw(st.integers(0, 3))
    if choice == 0 or not cur:
        return ("reshape", (-1,)), [n]
    if choice == 1 and len(cur) >= 2:
        d = draw(st.integers(0, len(cur) - 2))
        new = cur[:d] + [cur[d] * cur[d + 1]] + cur[d + 2:]
        return ("reshape", tuple(new)), new
    d = draw(st.integers(0, len(cur) - 1))
    divs = [k for k in range(1, cur[d] + 1) if cur[d] % k == 0]
    k = draw(st.sampled_from(divs))
    new = cur[:d] + [k, cur[d] // k] + cur[d + 1:]
    return ("reshape", tuple(new)), new


def _apply(x, step):
    kind, *a = step
    if kind == "none":
        return x[(slice(None),) * a[0] + (None,)]
    if kind == "slice":
        d, start, stop, step_ = a
        return x[(slice(None),) * d + (slice(start, stop, step_),)]
    if kind == "select":
        return x.select(*a)
    if kind == "expand":
        return x.expand(*a[0])
    if kind in ("permute", "reshape"):
        return getattr(x, kind)(a[0])
    return getattr(x, kind)(*a)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(view_chains())
def test_random_view_chains_match_torch(chain):
    shape, steps = chain
    outs = []
    for L in LIBS:
        x = L.arange(float(max(int(np.prod(shape)), 1)), dtype=L.float64).reshape(shape)
        layouts = []
        y = x
        for s in steps:
            y = _apply(y, s)
            layouts.append(_layout(y))
        outs.append((layouts, _np(y)))
    assert outs[0][0] == outs[1][0], f"layouts after {steps}"
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


# ---- property tests: random index keys ---------------------------------------------------

@st.composite
def index_keys(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    idx_shape = draw(st.sampled_from([(2,), (3,), (1,), (2, 2), (2, 1), (0,)]))
    key, d = [], 0
    ellipsis = draw(st.booleans())
    while d < len(shape):
        if ellipsis and draw(st.integers(0, 3)) == 0:
            key.append(Ellipsis)
            ellipsis = False
            d = len(shape) - draw(st.integers(0, len(shape) - d))
            continue
        n = shape[d]
        kind = draw(st.sampled_from(["int", "slice", "full", "index", "mask", "none", "stop"]))
        if kind == "stop":
            break
        if kind == "none":
            key.append(None)
            continue
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "full":
            key.append(slice(None))
        elif kind == "slice":
            key.append(slice(draw(st.one_of(st.none(), st.integers(-n - 2, n + 2))),
                             draw(st.one_of(st.none(), st.integers(-n - 2, n + 2))),
                             draw(st.one_of(st.none(), st.integers(1, 3)))))
        elif kind == "index":
            key.append(np.array(draw(st.lists(st.integers(-n, n - 1),
                                              min_size=int(np.prod(idx_shape)),
                                              max_size=int(np.prod(idx_shape)))),
                                np.int64).reshape(idx_shape))
        else:
            key.append(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        d += 1
    return shape, tuple(key)


def _lib_key(L, key):
    return tuple(L.from_numpy(k.copy()) if isinstance(k, np.ndarray) else k for k in key)


def _run_index(L, shape, key, cot):
    x = L.arange(float(np.prod(shape)), dtype=L.float64).reshape(shape).requires_grad_()
    try:
        y = x[_lib_key(L, key)]
    except (IndexError, RuntimeError) as e:
        return type(e)
    y.backward(L.from_numpy(np.asarray(cot(tuple(y.shape)))))
    z = x.detach().clone()
    z[_lib_key(L, key)] = -1.0
    return tuple(y.shape), _np(y), _np(x.grad), _np(z)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index_keys())
def test_random_index_keys_match_torch(case):
    shape, key = case

    def cot(s):
        return np.random.default_rng(0).standard_normal(s)
    ref = _run_index(torch, shape, key, cot)
    ours = _run_index(tessera, shape, key, cot)
    if isinstance(ref, type):
        assert ours is ref, f"torch raised {ref.__name__}, tessera gave {ours}"
        return
    assert not isinstance(ours, type), f"tessera raised {ours.__name__}, torch did not"
    assert ours[0] == ref[0]
    for a, b in zip(ours[1:], ref[1:]):
        np.testing.assert_array_equal(a, b)


# ---- broadcast_shapes (no tensors involved) ---------------------------------------------

@pytest.mark.parametrize("shapes", [((2, 3), (3,)), ((2, 1), 3, [1, 1, 1]), ((0, 1), (1, 3)),
                                    (), ((5,),), ((1,), ()), ((2, 3), (4,)), ((2, -1),),
                                    ((3, 1), (1, 0))])
def test_broadcast_shapes(shapes):
    def run(L):
        try:
            return tuple(L.broadcast_shapes(*shapes))
        except Exception as e:  # noqa: BLE001  (the type is what is compared)
            return type(e)
    assert run(tessera) == run(torch)
