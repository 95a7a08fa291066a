"""Op-info entries: advanced indexing (``index``), ``index_put`` and ``nonzero``.

Index arrays in samples are NumPy int64/bool arrays, which the harness turns into tensors;
``grad_args`` names the data inputs so only they require grad.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make as _make, register


def make(*args, **kwargs) -> np.ndarray:
    # core.make gives a NumPy scalar (not a 0-d array) for 0-d bool samples
    return np.asarray(_make(*args, **kwargs))

ALL = (np.float32, np.float64, np.int64, np.bool_)
I = np.int64  # noqa: E741


def _s(*args, name="", grad_args=(0,), **kwargs):
    return Sample(tuple(args), kwargs, grad_args=grad_args, name=name)


def _idx(*v):
    return np.array(v, I)


# ---- x[key] with advanced parts ----------------------------------------------------------

def _get(L, template, x, *idx):
    """``x[template]`` with each ``"T"`` slot taking the next index tensor."""
    it = iter(idx)
    return x[tuple(next(it) if k == "T" else k for k in template)]


B = np.array
INDEX_CASES = [  # (key template, data shape, index arrays, sample name)
    (("T",), (5, 3), [_idx(0, 2, 4)], ""),
    (("T",), (5, 3), [_idx(-1, 0, 0, 3)], "negative_repeated"),
    (("T",), (5, 3), [_idx([1, 2], [0, 4])], "2d_index"),
    (("T",), (5,), [np.zeros((0,), I)], "empty_index"),
    (("T",), (4,), [_idx(1).reshape(())], "0d_index"),
    (("T",), (5, 3), [_idx(5)], "out_of_range"),
    (("T",), (5, 3), [_idx(-6)], "out_of_range_neg"),
    ((slice(None), "T"), (5, 3), [_idx(2, 0)], ""),
    (("T", "T"), (5, 3), [_idx(0, 4), _idx(2, 1)], "two"),
    (("T", "T"), (5, 3), [_idx([0], [4]), _idx(2, 1)], "two_broadcast"),
    (("T", "T"), (5, 3), [_idx(0, 4, 1), _idx(2, 1)], "shape_mismatch"),
    (("T", slice(None), "T"), (4, 2, 3), [_idx(0, 3), _idx(1, 2)], "separated"),
    ((slice(None), "T", "T"), (2, 4, 3), [_idx(0, 3), _idx(1, 2)], "adjacent"),
    ((Ellipsis, "T"), (2, 4, 3), [_idx([0, 1], [2, 2])], "ellipsis"),
    ((None, "T", slice(1, None)), (5, 3), [_idx(1, 1)], "none"),
    (("T", None, 1), (5, 3), [_idx(1, 3)], "int_after"),
    ((1, slice(None), "T"), (3, 4, 5), [_idx(0, 4)], "int_before"),
    (("T", 1, "T"), (3, 4, 5), [_idx(0, 2), _idx(4, 0)], "int_between"),
    ((slice(None, None, 2), "T"), (4, 3), [_idx(2, 2, 0)], "step"),
    (("T",), (4, 3), [B([1.0])], "float_index"),
]
# bool masks become index tensors through nonzero, so their shapes depend on the data
MASK_CASES = [
    (("T",), (4, 3), [B([True, False, True, True])], "mask"),
    (("T",), (2, 3), [B([[True, False, True], [False, False, True]])], "mask_2d"),
    ((slice(None), "T"), (2, 3), [B([False, True, True])], "mask_dim1"),
    (("T", "T"), (4, 3), [B([True, False, True, False]), _idx(0, 2)], "mask_and_index"),
    (("T",), (4, 3), [B([False] * 4)], "mask_none"),
    (("T",), (2, 3), [B([True, False, True])], "mask_mismatch"),
    (("T",), (), [B(True)], "0d_true"),
    (("T",), (), [B(False)], "0d_false"),
]


def _index_samples(cases):
    def gen(rng, dt):
        for template, shape, idx, name in cases:
            yield Sample((template, make(rng, shape, dt), *idx), grad_args=(1,), name=name)
    return gen


register(
    OpInfo("index", _get, _index_samples(INDEX_CASES), dtypes=ALL, covers=("index", "slice")),
    OpInfo("index_mask", _get, _index_samples(MASK_CASES), dtypes=ALL, meta=False,
           covers=("index", "nonzero", "slice")),
    OpInfo("index_list_key", lambda L, x: x[[0, 2], 1:], lambda rng, dt: [
        _s(make(rng, (3, 4), dt))], covers=("index",)),
    OpInfo("index_nested_list_key", lambda L, x: x[[[0, 1], [2, 2]], [1, 0]], lambda rng, dt: [
        _s(make(rng, (3, 4), dt))], covers=("index",)),
    OpInfo("index_tensor_scalar", lambda L, x, i: x[i, 1], lambda rng, dt: [
        _s(make(rng, (3, 4), dt), _idx(2).reshape(()))], covers=("slice",)),
    OpInfo("index_bool_scalar_key", lambda L, x: (x[True], x[False], x[None, True]),
           lambda rng, dt: [_s(make(rng, (2, 3), dt))], covers=("index",)),
)


# ---- x[key] = v with advanced parts, index_put ------------------------------------------

def _set(template, accumulate=None):
    def f(L, x, v, *idx):
        y = x.clone()
        it = iter(idx)
        key = tuple(next(it) if k == "T" else k for k in template)
        if accumulate is None:
            y[key] = v
            return y
        return y.index_put(key, v, accumulate=accumulate)
    return f


def setitem_samples(rng, dt):
    x = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(x(5, 3), x(2, 3), _idx(0, 3), grad_args=(0, 1))
    yield _s(x(5, 3), x(3), _idx(4, 1), grad_args=(0, 1))
    yield _s(x(5, 3), x(), _idx(-1, 2), grad_args=(0, 1))
    yield _s(x(5, 3), 1.5, _idx(0, 1))
    yield _s(x(5, 3), x(1, 1, 3), _idx(2), grad_args=(0, 1))
    yield _s(x(5, 3), x(0, 3), np.zeros(0, I), grad_args=(0, 1))
    yield _s(x(5, 3), x(2, 2), _idx(0), name="shape_mismatch", grad_args=(0, 1))
    yield _s(x(5, 3), x(2, 3), _idx(0, 9), name="out_of_range", grad_args=(0, 1))


def setitem_mask_samples(rng, dt):
    x = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(x(4, 3), x(2, 3), np.array([True, False, False, True]), grad_args=(0, 1))
    yield _s(x(4, 3), x(3), np.array([False, True, True, True]), grad_args=(0, 1))
    yield _s(x(4, 3), 0.0, np.array([True, False, False, True]))


def setitem_2idx_samples(rng, dt):
    x = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(x(4, 3, 2), x(2, 3), _idx(0, 3), _idx(1, 0), grad_args=(0, 1))
    yield _s(x(4, 3, 2), x(3), _idx(2, 3), _idx(1, 0), grad_args=(0, 1))


def index_put_samples(rng, dt):
    x = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(x(5, 3), x(4, 3), _idx(0, 3, 0, 1), grad_args=(0, 1))   # duplicates add up
    yield _s(x(5, 3), x(3), _idx(4, 4), grad_args=(0, 1))
    yield _s(x(5,), x(), _idx(1, 1, 1), grad_args=(0, 1))
    yield _s(x(5, 3), x(2, 2), _idx(0, 1), name="shape_mismatch", grad_args=(0, 1))


def index_put_dtype_samples(rng, dt):
    yield _s(make(rng, (5, 3), dt), make(rng, (2, 3), np.float16), _idx(0, 3), grad_args=(0,),
             name="dtype_mismatch")


register(
    OpInfo("setitem_index", _set(("T",)), setitem_samples,
           covers=("index_put", "index", "clone")),
    OpInfo("setitem_index_slice", _set((slice(None), "T")), lambda rng, dt: [
        _s(make(rng, (3, 5), dt), make(rng, (3, 2), dt), _idx(4, 0), grad_args=(0, 1)),
        _s(make(rng, (3, 5), dt), make(rng, (2,), dt), _idx(4, 0), grad_args=(0, 1))],
        covers=("index_put",)),
    OpInfo("setitem_mask", _set(("T",)), setitem_mask_samples, meta=False,
           covers=("index_put", "nonzero")),
    OpInfo("setitem_two_indices", _set(("T", slice(None), "T")), setitem_2idx_samples,
           covers=("index_put",)),
    OpInfo("index_put", _set(("T",), accumulate=False), setitem_samples,
           covers=("index_put",)),
    OpInfo("index_put_accumulate", _set(("T",), accumulate=True), index_put_samples,
           covers=("index_put",)),
    OpInfo("index_put_two_indices", _set(("T", "T"), accumulate=True), lambda rng, dt: [
        _s(make(rng, (4, 3), dt), make(rng, (3,), dt), _idx(0, 3, 0), _idx(1, 2, 1),
           grad_args=(0, 1))], covers=("index_put",)),
    OpInfo("index_put_dtype", _set(("T",), accumulate=False), index_put_dtype_samples,
           covers=("index_put",)),
    OpInfo("index_put_", lambda L, x, v, i: x.clone().index_put_((i,), v), lambda rng, dt: [
        _s(make(rng, (5, 3), dt), make(rng, (2, 3), dt), _idx(0, 3), grad_args=(0, 1))],
        covers=("index_put",)),
)


# ---- nonzero -------------------------------------------------------------------------------

def nonzero_samples(rng, dt):
    for shape in [(), (6,), (3, 4), (2, 3, 2), (0, 3)]:
        x = make(rng, shape, dt)
        if x.ndim:
            x = np.where(rng.random(shape) > 0.5, x, np.zeros_like(x))
        yield _s(x)
    yield _s(np.zeros((), dt))
    yield _s(np.zeros((3, 2), dt))


register(
    OpInfo("nonzero", lambda L, x: L.nonzero(x), nonzero_samples, dtypes=ALL,
           differentiable=False, meta=False),
    OpInfo("nonzero_tuple", lambda L, x: x.nonzero(as_tuple=True), nonzero_samples,
           dtypes=ALL, differentiable=False, meta=False, covers=("nonzero", "slice", "view")),
    OpInfo("argwhere", lambda L, x: L.argwhere(x), nonzero_samples, differentiable=False,
           meta=False, covers=("nonzero",)),
)
