"""Op-info entries: view ops (view/reshape, permute, expand, slice, diagonal, unfold) and
writes into views (``view_assign``)."""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make as _make, register


def make(*args, **kwargs) -> np.ndarray:
    # core.make gives a NumPy scalar (not a 0-d array) for 0-d bool samples
    return np.asarray(_make(*args, **kwargs))

ALL = (np.float32, np.float64, np.int64, np.bool_)


def _s(*args, name="", grad_args=None, **kwargs):
    return Sample(tuple(args), kwargs, grad_args=grad_args, name=name)


def _shapes(*shapes):
    """Samples of one random array for each shape, plus the listed extra arguments."""
    def gen(rng, dt):
        for shape, *rest in shapes:
            yield _s(make(rng, shape, dt), *rest)
    return gen


# ---- view / reshape --------------------------------------------------------------------

reshape_samples = _shapes(((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1, 2)),
                          ((2, 3), (3, 2)), ((), (1, 1)), ((1,), ()), ((0, 3), (3, -1, 0)),
                          ((0, 3), (-1,)), ((2, 3), (7,)), ((2, 3), (-1, -1)),
                          ((0, 3), (0, -1)), ((2, 3), (2, -2)))

register(
    OpInfo("view", lambda L, x, s: x.view(s), reshape_samples, dtypes=ALL),
    OpInfo("view_varargs", lambda L, x, s: x.view(*s), reshape_samples, covers=("view",)),
    OpInfo("reshape", lambda L, x, s: x.reshape(s), reshape_samples, covers=("view",)),
    OpInfo("reshape_fn", lambda L, x, s: L.reshape(x, s), reshape_samples, covers=("view",)),
    # a transposed input cannot be viewed flat: reshape copies, view raises like PyTorch
    OpInfo("reshape_transposed", lambda L, x, s: x.t().reshape(s), _shapes(
        ((2, 3), (6,)), ((2, 3), (3, 2)), ((2, 3), (3, 1, 2)), ((1, 3), (3,))),
        covers=("view", "permute", "clone")),
    OpInfo("view_transposed", lambda L, x, s: x.t().view(s), _shapes(
        ((2, 3), (6,)), ((2, 3), (3, 1, 2)), ((1, 3), (3,)), ((3, 1), (3,))),
        covers=("view", "permute")),
    OpInfo("view_as", lambda L, x, y: x.view_as(y), lambda rng, dt: [
        _s(make(rng, (2, 3), dt), make(rng, (3, 2), dt), grad_args=(0,))], covers=("view",)),
    OpInfo("flatten", lambda L, x, *a: x.flatten(*a), _shapes(
        ((2, 3, 4),), ((2, 3, 4), 1), ((2, 3, 4), 0, 1), ((2, 3, 4), -2, -1), ((),),
        ((5,), 0, 0), ((2, 3), 1, 0), ((2, 3), 0, 3)), covers=("view",)),
    OpInfo("unflatten", lambda L, x, d, s: x.unflatten(d, s), _shapes(
        ((6, 4), 0, (2, 3)), ((6, 4), -1, (2, -1)), ((6, 4), 1, (4,)), ((6, 4), 0, (4, 2))),
        covers=("view",)),
    OpInfo("ravel", lambda L, x: L.ravel(x), _shapes(((2, 3),), ((),)), covers=("view",)),
    OpInfo("squeeze", lambda L, x, *a: x.squeeze(*a), _shapes(
        ((1, 3, 1),), ((1, 3, 1), 0), ((1, 3, 1), 1), ((1, 3, 1), -1), ((1, 3, 1), (0, 2)),
        ((),), ((), 0), ((1, 3), 2))),
    OpInfo("unsqueeze", lambda L, x, d: x.unsqueeze(d), _shapes(
        ((2, 3), 0), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0), ((2, 3), 3))),
    OpInfo("squeeze_", lambda L, x, *a: x.clone().unsqueeze_(0).squeeze_(*a), _shapes(
        ((3, 1),), ((3, 1), 0)), covers=("squeeze", "unsqueeze", "clone")),
)


# ---- permute, transpose, t, movedim ------------------------------------------------------

register(
    OpInfo("permute", lambda L, x, d: x.permute(d), _shapes(
        ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (-1, 0, 1)), ((2, 3), (0, 1)), ((), ()),
        ((0, 3), (1, 0)), ((2, 3), (0,)), ((2, 3), (0, 0)), ((2, 3), (0, 2))), dtypes=ALL),
    OpInfo("permute_varargs", lambda L, x, d: x.permute(*d), _shapes(
        ((2, 3, 4), (1, 2, 0)), ((2, 3), (1, 0))), covers=("permute",)),
    OpInfo("transpose", lambda L, x, a, b: x.transpose(a, b), _shapes(
        ((2, 3, 4), 0, 1), ((2, 3, 4), -1, 0), ((2, 3), 1, 1), ((5,), 0, 0), ((), 0, -1),
        ((2, 3), 0, 2)), covers=("permute",)),
    OpInfo("swapaxes", lambda L, x: L.swapaxes(x, 0, -1), _shapes(((2, 3, 4),)),
           covers=("permute",)),
    OpInfo("t", lambda L, x: x.t(), _shapes(((2, 3),), ((3,),), ((),), ((2, 3, 4),)),
           covers=("permute", "view")),
    OpInfo("T_mT", lambda L, x: (x.mT, x.adjoint()), _shapes(((2, 3),), ((2, 3, 4),)),
           covers=("permute",)),
    OpInfo("movedim", lambda L, x, s, d: x.movedim(s, d), _shapes(
        ((2, 3, 4), 0, -1), ((2, 3, 4), (0, 1), (2, 0)), ((2, 3, 4), -1, 0),
        ((2, 3, 4), (0, 1), (0,)), ((2, 3, 4), 3, 0)), covers=("permute",)),
    OpInfo("moveaxis", lambda L, x: L.moveaxis(x, 1, 0), _shapes(((2, 3, 4),)),
           covers=("permute",)),
)


# ---- expand ------------------------------------------------------------------------------

expand_samples = _shapes(((3, 1), (3, 4)), ((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 2)),
                         ((3, 1), (-1, 4)), ((2, 1), (0, 2, 3)), ((3, 1), (3, 0)),
                         ((3, 2), (3, 4)), ((3, 1), (4,)), ((3, 1), (-1, 3, 4)))

register(
    OpInfo("expand", lambda L, x, s: x.expand(s), expand_samples, dtypes=ALL),
    OpInfo("expand_varargs", lambda L, x, s: x.expand(*s), expand_samples, covers=("expand",)),
    OpInfo("expand_as", lambda L, x, y: x.expand_as(y), lambda rng, dt: [
        _s(make(rng, (3, 1), dt), make(rng, (2, 3, 4), dt), grad_args=(0,))],
        covers=("expand",)),
    OpInfo("broadcast_to", lambda L, x, s: L.broadcast_to(x, s), expand_samples,
           covers=("expand",)),
    # a view of an expanded tensor: the gradient sums over the broadcast dim
    OpInfo("expand_then_slice", lambda L, x: x.expand(4, 3)[1:, ::2].t(),
           _shapes(((3,),), ((1, 3),)), covers=("expand", "slice", "permute")),
)


# ---- slice (basic indexing), narrow, select ----------------------------------------------

BASIC_KEYS = [
    (slice(1, 3),), (slice(None, None, 2),), (1,), (-1,), (slice(None), 1),
    (slice(None), slice(1, 3)), (Ellipsis, 0), (None,), (Ellipsis, None),
    (slice(None), None, slice(None, None, 3)), (0, Ellipsis, slice(-2, None)),
    (slice(5, 1),), (slice(-100, 100),), (1, 2), (slice(None), -2, None),
]


def basic_samples(rng, dt):
    for key in BASIC_KEYS:
        yield _s(make(rng, (4, 5), dt), key)
    yield _s(make(rng, (2, 3, 4), dt), (Ellipsis, slice(1, None), 0))
    yield _s(make(rng, (), dt), (None,))
    yield _s(make(rng, (), dt), (Ellipsis,))
    yield _s(make(rng, (0, 3), dt), (slice(None), 1))
    yield _s(make(rng, (4, 5), dt), (4,), name="out_of_range")
    yield _s(make(rng, (4, 5), dt), (0, 0, 0), name="too_many")
    yield _s(make(rng, (4, 5), dt), (slice(None, None, -1),), name="neg_step")
    yield _s(make(rng, (4, 5), dt), (Ellipsis, Ellipsis), name="two_ellipses")


register(
    OpInfo("slice", lambda L, x, key: x[key], basic_samples, dtypes=ALL),
    OpInfo("slice_chain", lambda L, x: x[1:][:, ::2][0], _shapes(((4, 5),), ((3, 4, 2),)),
           covers=("slice",)),
    OpInfo("narrow", lambda L, x, *a: x.narrow(*a), _shapes(
        ((4, 5), 0, 1, 2), ((4, 5), -1, 2, 3), ((4, 5), 1, -2, 2), ((4, 5), 0, 4, 0),
        ((4, 5), 0, 3, 2), ((4, 5), 2, 0, 1), ((), 0, 0, 1)), covers=("slice",)),
    OpInfo("select", lambda L, x, *a: x.select(*a), _shapes(
        ((4, 5), 0, 1), ((4, 5), 1, -1), ((2, 3, 4), -2, 2), ((4, 5), 0, 4),
        ((4, 5), 2, 0), ((), 0, 0)), covers=("slice",)),
)


# ---- diagonal, unfold --------------------------------------------------------------------

register(
    OpInfo("diagonal", lambda L, x, *a: x.diagonal(*a), _shapes(
        ((3, 4),), ((3, 4), 1), ((3, 4), -2), ((3, 4), 5), ((2, 3, 4), 0, 0, 2),
        ((2, 3, 4), 1, -1, -2), ((2, 3, 4), -1, 2, 1), ((0, 3), 0), ((3, 4), 0, 1, 1),
        ((3,), 0), ((3, 4), 0, 0, 2)), dtypes=ALL),
    OpInfo("diagonal_fn", lambda L, x: L.diagonal(x, offset=1, dim1=-1, dim2=0),
           _shapes(((3, 4, 2),)), covers=("diagonal",)),
)


def unfold_samples(rng, dt):
    for shape, args in [((7,), (0, 2, 1)), ((7,), (0, 3, 2)), ((2, 6), (1, 3, 3)),
                        ((5, 3), (0, 5, 1)), ((5, 3), (-2, 1, 4)), ((2, 3, 4), (1, 2, 1)),
                        ((), (0, 1, 1)), ((0, 3), (1, 2, 1)), ((4,), (0, 5, 1)),
                        ((4,), (0, 2, 0)), ((4,), (1, 2, 1))]:
        yield _s(make(rng, shape, dt), *args)


def _unfold_double_backward(L, x, v, dim, size, step):
    # d(unfold)/dx applied to v is unfold_backward(v); differentiating that in v checks
    # unfold_backward's own grad (unfold again)
    with L.enable_grad():  # gradcheck evaluates under no_grad
        y = x.unfold(dim, size, step)
        return L.autograd.grad(y, x, v, create_graph=True)[0]


def unfold_bw_samples(rng, dt):
    for shape, (dim, size, step) in [((7,), (0, 3, 2)), ((7,), (0, 2, 1)), ((2, 6), (1, 3, 1)),
                                     ((4, 3), (0, 4, 1)), ((3, 5), (-1, 1, 3))]:
        x = make(rng, shape, dt)
        out = list(shape)
        d = dim % len(shape)
        out[d] = (shape[d] - size) // step + 1
        yield _s(x, make(rng, out + [size], dt), dim, size, step)


register(
    OpInfo("unfold", lambda L, x, *a: x.unfold(*a), unfold_samples, dtypes=ALL,
           covers=("unfold", "unfold_backward")),
    OpInfo("unfold_backward", _unfold_double_backward, unfold_bw_samples, meta=False,
           noncontiguous=False, covers=("unfold", "unfold_backward")),
)


# ---- writes into views: view_assign --------------------------------------------------------

def _setitem(key):
    def f(L, x, v):
        y = x.clone()
        y[key] = v
        return y
    return f


def _setitem_samples(shape, vshapes):
    def gen(rng, dt):
        for vs in vshapes:
            v = make(rng, vs, dt) if vs is not None else 2.5
            yield _s(make(rng, shape, dt), v)
    return gen


def _inplace_on_view(L, x, v):
    y = x * 1
    y[0].mul_(2)
    y[:, 1].add_(v)
    y.t()[2].copy_(v.flip(0) if v.dim() else v)
    return y


def _inplace_chain(L, x, v):
    y = x.clone()
    d = y.diagonal()
    d.mul_(v)
    y.unsqueeze(0).expand(2, -1, -1)[0, 1:, 0].sub_(1.5)
    return y * 2


register(
    OpInfo("setitem_slice", _setitem(slice(1, 3)), _setitem_samples((4, 3), [(2, 3), (3,), (),
           None, (1, 3), (2, 2)]), covers=("view_assign", "copy", "slice", "clone")),
    OpInfo("setitem_int", _setitem((1, slice(None, None, 2))), _setitem_samples(
        (3, 4), [(2,), (), None, (1, 2)]), covers=("view_assign", "copy", "slice")),
    OpInfo("setitem_ellipsis", _setitem((Ellipsis, 0)), _setitem_samples(
        (2, 3, 4), [(2, 3), (3,), (4, 3)]), covers=("view_assign", "copy")),
    OpInfo("setitem_none", _setitem((None, 0)), _setitem_samples((2, 3), [(1, 3), (3,)]),
           covers=("view_assign", "copy")),
    OpInfo("inplace_on_views", _inplace_on_view, lambda rng, dt: [
        _s(make(rng, (3, 3), dt), make(rng, (3,), dt)),
        _s(make(rng, (3, 3), dt), make(rng, (), dt))],
        covers=("view_assign", "mul", "add", "copy", "flip", "permute")),
    OpInfo("inplace_diagonal_chain", _inplace_chain, lambda rng, dt: [
        _s(make(rng, (3, 3), dt), make(rng, (3,), dt)),
        _s(make(rng, (3, 4), dt), make(rng, (), dt))],
        covers=("view_assign", "diagonal", "expand", "sub")),
)
