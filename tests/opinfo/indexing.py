"""Op-info entries: indexing ops (gather/scatter, index_*, take/put, masked_*, one_hot).

Index arrays are int64 NumPy arrays and only the float data requires grad (``grad_args``).
Ops that overwrite (scatter, index_copy, put) get distinct indices, since PyTorch leaves the
winner of a repeated index unspecified; the accumulating ops get repeats on purpose.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F = (np.float32, np.float64)
FI = (np.float32, np.float64, np.int64)


def idx(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def rand_index(rng, shape, n) -> np.ndarray:
    """int64 indices in [0, n) (repeats allowed)."""
    return rng.integers(0, max(n, 1), size=shape).astype(np.int64)


def distinct_index(rng, shape, d, n) -> np.ndarray:
    """int64 indices of ``shape`` whose entries along ``d`` are distinct values in [0, n)."""
    full = list(shape)
    full[d] = n
    perm = np.argsort(rng.random(full), axis=d)
    return np.take(perm, np.arange(shape[d]), axis=d).astype(np.int64)


def other(dt):
    """A float dtype different from ``dt`` (for dtype-mismatch samples)."""
    return np.float64 if np.dtype(dt) != np.float64 else np.float32


# ---- gather --------------------------------------------------------------------------

def gather_samples(rng, dt):
    x = make(rng, (3, 4), dt)
    g = (0,)
    yield Sample((x, 0, rand_index(rng, (2, 4), 3)), grad_args=g)
    yield Sample((x, 1, rand_index(rng, (3, 6), 4)), grad_args=g)
    yield Sample((x, -1, rand_index(rng, (2, 2), 4)), grad_args=g, name="negdim")
    yield Sample((make(rng, (2, 3, 4), dt), 1, rand_index(rng, (2, 2, 3), 3)), grad_args=g)
    yield Sample((make(rng, (), dt), 0, idx(0).reshape(())), grad_args=g, name="0d")
    yield Sample((make(rng, (), dt), 0, idx(0, 0)), grad_args=g, name="0d_x_1d_index")
    yield Sample((make(rng, (5,), dt), 0, idx(3).reshape(())), grad_args=g, name="0d_index")
    yield Sample((make(rng, (0, 3), dt), 1, np.zeros((0, 2), np.int64)), grad_args=g)
    yield Sample((x, 1, np.zeros((3, 0), np.int64)), grad_args=g, name="empty_index")
    yield Sample((x, 1, rand_index(rng, (3, 2), 4).astype(np.int32)), grad_args=g,
                 name="int32_index")
    yield Sample((x, 0, idx([3, 0, 0, 0])), grad_args=g, name="out_of_range")
    yield Sample((x, 0, idx([-1, 0, 0, 0])), grad_args=g, name="negative_index")
    yield Sample((x, 0, idx(0, 1)), grad_args=g, name="wrong_ndim")
    yield Sample((x, 0, np.zeros((4, 5), np.int64)), grad_args=g, name="index_too_big")
    yield Sample((x, 2, np.zeros((1, 1), np.int64)), grad_args=g, name="dim_out_of_range")
    yield Sample((x, 0, np.zeros((1, 1), np.int16)), grad_args=g, name="int16_index")


# ---- scatter -------------------------------------------------------------------------

def scatter_samples(rng, dt):
    g = (0, 3)
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, distinct_index(rng, (2, 4), 0, 3), make(rng, (2, 4), dt)), grad_args=g)
    yield Sample((x, -1, distinct_index(rng, (3, 2), 1, 4), make(rng, (3, 2), dt)),
                 grad_args=g, name="negdim")
    yield Sample((x, 1, distinct_index(rng, (2, 3), 1, 4), make(rng, (3, 5), dt)),
                 grad_args=(0,), name="src_bigger_than_index")
    yield Sample((make(rng, (2, 3, 4), dt), 2, distinct_index(rng, (2, 2, 3), 2, 4),
                  make(rng, (2, 2, 3), dt)), grad_args=g)
    yield Sample((x, 0, distinct_index(rng, (2, 4), 0, 3), 2.5), grad_args=(0,), name="value")
    yield Sample((x, 1, distinct_index(rng, (3, 2), 1, 4), 7), grad_args=(0,),
                 name="int_value")
    yield Sample((make(rng, (), dt), 0, idx(0).reshape(()), make(rng, (), dt)), grad_args=g,
                 name="0d")
    yield Sample((make(rng, (3,), dt), 0, idx(1).reshape(()), make(rng, (), dt)),
                 grad_args=g, name="0d_index")
    yield Sample((make(rng, (0, 3), dt), 0, np.zeros((0, 3), np.int64),
                  make(rng, (0, 3), dt)), grad_args=g, name="zero_size")
    # PyTorch's backward fails when src is larger than index, so src needs no grad there
    yield Sample((x, 1, np.zeros((3, 0), np.int64), make(rng, (3, 2), dt)), grad_args=(0,),
                 name="empty_index")
    yield Sample((x, 0, rand_index(rng, (2, 4), 3), make(rng, (2, 4), dt)), grad_args=(),
                 kwargs=dict(reduce="add"), name="reduce_add")
    yield Sample((x, 0, rand_index(rng, (2, 4), 3), 1.5), grad_args=(),
                 kwargs=dict(reduce="multiply"), name="reduce_multiply_value")
    yield Sample((x, 0, idx([1, 0, 2, 0]), x), kwargs=dict(reduce="sum"), name="bad_reduce")
    yield Sample((x, 0, idx([[3, 0, 0, 0]]), x), grad_args=(0,), name="out_of_range")
    yield Sample((x, 0, idx([[0, -1, 0, 0]]), 1.0), grad_args=(0,), name="negative_index")
    yield Sample((x, 0, np.zeros((1, 4), np.int16), x), grad_args=(0,), name="int16_index")
    yield Sample((x, 0, np.zeros((1, 4), np.int32), x), grad_args=(0,), name="int32_index")
    yield Sample((x, 0, idx([[0, 1, 2, 0]]), x.astype(other(dt))), grad_args=(0,),
                 name="src_dtype")
    yield Sample((x, 0, np.zeros((3, 4), np.int64), make(rng, (2, 4), dt)), grad_args=(0,),
                 name="index_bigger_than_src")
    yield Sample((x, 0, np.zeros((4, 1), np.int64), 1.0), grad_args=(0,),
                 name="index_bigger_than_self")
    yield Sample((x, 0, idx(0, 1), 1.0), grad_args=(0,), name="wrong_ndim")
    yield Sample((x, 0, idx([[0, 1]]), make(rng, (), dt)), grad_args=(0,),
                 name="0d_src_tensor")


def scatter_fn(L, x, dim, index, src, **kw):
    return L.scatter(x, dim, index, src, **kw)


def scatter_inplace_fn(L, x, dim, index, src, **kw):
    return x.clone().scatter_(dim, index, src, **kw)


# ---- scatter_add, scatter_reduce -----------------------------------------------------

def scatter_add_samples(rng, dt):
    g = (0, 3)
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, rand_index(rng, (5, 4), 3), make(rng, (5, 4), dt)), grad_args=g)
    yield Sample((x, -1, rand_index(rng, (3, 6), 4), make(rng, (3, 6), dt)), grad_args=g,
                 name="negdim")
    yield Sample((x, 1, rand_index(rng, (2, 3), 4), make(rng, (3, 5), dt)), grad_args=(0,),
                 name="src_bigger_than_index")
    yield Sample((make(rng, (), dt), 0, idx(0, 0), make(rng, (2,), dt)), grad_args=g,
                 name="0d_self")
    yield Sample((x, 1, np.zeros((3, 0), np.int64), make(rng, (3, 2), dt)), grad_args=(0,),
                 name="empty_index")
    yield Sample((x, 0, idx([[3, 0, 0, 0]]), x), grad_args=(0,), name="out_of_range")
    yield Sample((x, 0, idx([[0, 1, 2, 0]]), x.astype(other(dt))), grad_args=(0,),
                 name="src_dtype")
    yield Sample((x, 0, idx([[0]]), make(rng, (1, 1, 1), dt)), grad_args=(0,),
                 name="src_ndim")
    yield Sample((x, 0, idx([[0, 1]]), 1.0), grad_args=(0,), name="scalar_src")


def scatter_reduce_samples(rng, dt):
    g = (0, 3)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for incl in (True, False):
            kw = dict(reduce=reduce, include_self=incl)
            x = (make(rng, (3, 4), dt, 0.5, 2.0) * rng.choice([-1, 1], (3, 4))).astype(dt)
            yield Sample((x, 0, rand_index(rng, (5, 4), 3),
                          make(rng, (5, 4), dt, 0.5, 2.0)), kw, grad_args=g, name=reduce)
            # with src larger than index PyTorch's backward fails for these reductions
            yield Sample((x, -1, rand_index(rng, (3, 2), 4), make(rng, (3, 3), dt)), kw,
                         grad_args=(0,) if reduce in ("sum", "mean") else (),
                         name=reduce + "_negdim_src_bigger")
            yield Sample((make(rng, (), dt), 0, idx(0, 0), make(rng, (2,), dt)), kw,
                         grad_args=g, name=reduce + "_0d_self")
    # a single zero and a double zero in one product
    src = make(rng, (4, 3), dt, 0.5, 2.0)
    src[1, 0] = 0
    src[0, 2] = src[3, 2] = 0
    yield Sample((make(rng, (2, 3), dt, 0.5, 2.0), 0, idx([[0, 0, 1], [0, 1, 1], [1, 0, 0],
                                                           [1, 1, 1]]), src),
                 dict(reduce="prod"), grad_args=g, name="prod_zeros")
    x = make(rng, (3, 4), dt)
    yield Sample((x, 1, np.zeros((3, 0), np.int64), make(rng, (3, 2), dt)),
                 dict(reduce="amax"), grad_args=(), name="empty_index")
    yield Sample((x, 1, np.zeros((3, 0), np.int64), make(rng, (3, 0), dt)),
                 dict(reduce="mean"), grad_args=g, name="empty_index_and_src")
    yield Sample((x, 0, idx([[0, 1, 2, 0]]), x), dict(reduce="max"), name="bad_reduce")
    yield Sample((x, 0, idx([[3, 0, 0, 0]]), x), dict(reduce="sum"), grad_args=(0,),
                 name="out_of_range")
    yield Sample((x, 0, idx([[0, 1, 2, 0]]), x.astype(other(dt))), dict(reduce="mean"),
                 grad_args=(0,), name="src_dtype")


# ---- index_select, index_add, index_copy, index_fill -----------------------------------

def index_select_samples(rng, dt):
    g = (0,)
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, idx(2, 0, 2, 1)), grad_args=g)
    yield Sample((x, -1, idx(3, 3, 0)), grad_args=g, name="negdim")
    yield Sample((make(rng, (2, 3, 4), dt), 1, idx(1)), grad_args=g)
    yield Sample((x, 1, idx(2).reshape(())), grad_args=g, name="0d_index")
    yield Sample((make(rng, (), dt), 0, idx(0)), grad_args=g, name="0d")
    yield Sample((make(rng, (), dt), 0, idx(0).reshape(())), grad_args=g, name="0d_0d")
    yield Sample((x, 1, np.zeros(0, np.int64)), grad_args=g, name="empty_index")
    yield Sample((make(rng, (0, 3), dt), 1, idx(0, 2)), grad_args=g, name="zero_size")
    yield Sample((x, 0, idx(2, 0).astype(np.int32)), grad_args=g, name="int32_index")
    yield Sample((x, 0, idx(3)), grad_args=g, name="out_of_range")
    yield Sample((x, 0, idx(-1)), grad_args=g, name="negative_index")
    yield Sample((x, 0, idx([0])), grad_args=g, name="2d_index")
    yield Sample((x, 0, idx(0).astype(np.int16)), grad_args=g, name="int16_index")
    yield Sample((make(rng, (), dt), 0, idx(0, 0)), grad_args=g, name="0d_two_values")


def index_add_samples(rng, dt):
    g = (0, 3)
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, idx(2, 0, 2), make(rng, (3, 4), dt)), grad_args=g)
    yield Sample((x, -1, idx(1, 3), make(rng, (3, 2), dt)), dict(alpha=2), grad_args=g,
                 name="negdim_alpha")
    yield Sample((make(rng, (2, 3, 4), dt), 1, idx(0, 0, 2, 1),
                  make(rng, (2, 4, 4), dt)), grad_args=g)
    yield Sample((x, 0, idx(1).reshape(()), make(rng, (1, 4), dt)), grad_args=g,
                 name="0d_index")
    yield Sample((make(rng, (), dt), 0, idx(0).reshape(()), make(rng, (), dt)), grad_args=g,
                 name="0d")
    yield Sample((x, 1, np.zeros(0, np.int64), make(rng, (3, 0), dt)), grad_args=g,
                 name="empty_index")
    yield Sample((x, 0, idx(2, 0).astype(np.int32), make(rng, (2, 4), dt)), grad_args=g,
                 name="int32_index")
    yield Sample((x, 0, idx(5), make(rng, (1, 4), dt)), grad_args=(0,), name="out_of_range")
    yield Sample((x, 0, idx(-1), make(rng, (1, 4), dt)), grad_args=(0,),
                 name="negative_index")
    yield Sample((x, 0, idx(0), make(rng, (2, 4), dt)), grad_args=(0,), name="count")
    yield Sample((x, 0, idx(0), make(rng, (1, 3), dt)), grad_args=(0,), name="slice_shape")
    yield Sample((x, 0, idx([0]), make(rng, (1, 4), dt)), grad_args=(0,), name="2d_index")
    yield Sample((x, 0, idx(0), make(rng, (1, 4), other(dt))), grad_args=(0,),
                 name="source_dtype")


def index_copy_samples(rng, dt):
    g = (0, 3)
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, idx(2, 0), make(rng, (2, 4), dt)), grad_args=g)
    yield Sample((x, -1, idx(3, 1, 0), make(rng, (3, 3), dt)), grad_args=g, name="negdim")
    yield Sample((x, 0, idx(1).reshape(()), make(rng, (1, 4), dt)), grad_args=g,
                 name="0d_index")
    yield Sample((make(rng, (), dt), 0, idx(0), make(rng, (1,), dt)), grad_args=g,
                 name="0d_self")
    yield Sample((make(rng, (), dt), 0, idx(0).reshape(()), make(rng, (), dt)), grad_args=g,
                 name="0d")
    yield Sample((x, 1, np.zeros(0, np.int64), make(rng, (3, 0), dt)), grad_args=g,
                 name="empty_index")
    yield Sample((x, 0, idx(2).astype(np.int32), make(rng, (1, 4), dt)), grad_args=(0,),
                 name="int32_index")
    yield Sample((x, 0, idx(5), make(rng, (1, 4), dt)), grad_args=(0,), name="out_of_range")
    yield Sample((x, 0, idx(-1), make(rng, (1, 4), dt)), grad_args=(0,),
                 name="negative_index")
    yield Sample((x, 0, idx(1), make(rng, (2, 4), dt)), grad_args=(0,), name="count")
    yield Sample((x, 0, idx(1), make(rng, (1, 3), dt)), grad_args=(0,), name="slice_shape")
    yield Sample((x, 0, idx(1).reshape(()), make(rng, (4,), dt)), grad_args=(0,),
                 name="ndim")
    yield Sample((x, 0, idx([0]), make(rng, (1, 4), dt)), grad_args=(0,), name="2d_index")
    yield Sample((x, 0, idx(0), make(rng, (1, 4), other(dt))), grad_args=(0,),
                 name="source_dtype")


def index_fill_samples(rng, dt):
    x = make(rng, (3, 4), dt)
    yield Sample((x, 0, idx(2, 0), -1.5), grad_args=(0,))
    yield Sample((x, -1, idx(3, -1, 0, 0), 2), grad_args=(0,), name="negdim_negative_index")
    yield Sample((x, 1, idx(1, 1, 2), make(rng, (), dt)), grad_args=(0, 3),
                 name="tensor_value")
    yield Sample((x, 0, idx(1).reshape(()), 0.5), grad_args=(0,), name="0d_index")
    yield Sample((make(rng, (), dt), 0, idx(0), make(rng, (), dt)), grad_args=(0, 3),
                 name="0d")
    # PyTorch's value gradient rejects negative indices, so the value needs no grad here
    yield Sample((make(rng, (), dt), 0, idx(-1), make(rng, (), dt)), grad_args=(0,),
                 name="0d_negative_index")
    yield Sample((x, 1, np.zeros(0, np.int64), 1.0), grad_args=(0,), name="empty_index")
    yield Sample((make(rng, (0, 3), dt), 1, idx(2), 1.0), grad_args=(0,), name="zero_size")
    yield Sample((x, 0, idx(0).astype(np.int32), 1.0), grad_args=(0,), name="int32_index")
    yield Sample((x, 0, idx(3), 1.0), grad_args=(0,), name="out_of_range")
    yield Sample((x, 0, idx(-4), 1.0), grad_args=(0,), name="negative_out_of_range")
    yield Sample((x, 0, idx([0]), 1.0), grad_args=(0,), name="2d_index")
    yield Sample((x, 0, idx(0), make(rng, (1,), dt)), grad_args=(0,), name="1d_value")


# ---- take, put, take_along_dim --------------------------------------------------------

def take_samples(rng, dt):
    g = (0,)
    x = make(rng, (3, 4), dt)
    yield Sample((x, idx([2, -1, 11], [0, 0, -12])), grad_args=g)
    yield Sample((x, idx(5).reshape(())), grad_args=g, name="0d_index")
    yield Sample((make(rng, (), dt), idx([0, -1])), grad_args=g, name="0d")
    yield Sample((x, np.zeros((0, 2), np.int64)), grad_args=g, name="empty_index")
    yield Sample((make(rng, (0,), dt), np.zeros(0, np.int64)), grad_args=g, name="zero_size")
    yield Sample((make(rng, (0,), dt), idx(0)), grad_args=g, name="from_empty")
    yield Sample((x, idx(12)), grad_args=g, name="out_of_range")
    yield Sample((x, idx(-13)), grad_args=g, name="negative_out_of_range")
    yield Sample((x, idx(1).astype(np.int32)), grad_args=g, name="int32_index")


def put_samples(rng, dt):
    g = (0, 2)
    x = make(rng, (3, 4), dt)
    yield Sample((x, idx(2, -1, 5), make(rng, (3,), dt)), grad_args=g)
    yield Sample((x, idx([2, 7], [0, 1]), make(rng, (4,), dt)), grad_args=g,
                 name="source_shape")
    yield Sample((x, idx(2, 2, -1, 11, 0), make(rng, (5,), dt)), dict(accumulate=True),
                 grad_args=g, name="accumulate")
    yield Sample((make(rng, (), dt), idx(0).reshape(()), make(rng, (), dt)), grad_args=g,
                 name="0d")
    yield Sample((x, np.zeros(0, np.int64), make(rng, (0,), dt)), grad_args=g,
                 name="empty_index")
    yield Sample((x, idx(12), make(rng, (1,), dt)), grad_args=(0,), name="out_of_range")
    yield Sample((x, idx(0, 1), make(rng, (3,), dt)), grad_args=(0,), name="numel")
    yield Sample((x, idx(0).astype(np.int32), make(rng, (1,), dt)), grad_args=(0,),
                 name="int32_index")
    yield Sample((x, idx(0), make(rng, (1,), other(dt))), grad_args=(0,),
                 name="source_dtype")


def take_along_dim_samples(rng, dt):
    g = (0,)
    x = make(rng, (3, 4), dt)
    yield Sample((x, rand_index(rng, (3, 2), 4), 1), grad_args=g)
    yield Sample((x, rand_index(rng, (2, 1), 3), 0), grad_args=g, name="broadcast_index")
    yield Sample((make(rng, (3, 1), dt), rand_index(rng, (1, 4), 3), 0), grad_args=g,
                 name="broadcast_both")
    yield Sample((x, idx([[-1], [0], [-4]]), -1), grad_args=g, name="negdim_negative_index")
    yield Sample((x, idx([[5, -5]]), 1), grad_args=g, name="wraps_like_torch")
    yield Sample((x, idx([1, -12, 11]), None), grad_args=g, name="flat")
    yield Sample((x, idx([-1]), None), grad_args=g, name="flat_negative")
    yield Sample((make(rng, (), dt), idx(0).reshape(()), 0), grad_args=g, name="0d")
    yield Sample((x, np.zeros((3, 0), np.int64), 1), grad_args=g, name="empty_index")
    yield Sample((x, idx([[1]]).astype(np.int32), 1), grad_args=g, name="int32_index")
    yield Sample((x, idx(1), 1), grad_args=g, name="ndim")


# ---- masked_select, masked_scatter, one_hot -------------------------------------------

def masked_select_samples(rng, dt):
    g = (0,)
    yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), np.bool_)), grad_args=g)
    yield Sample((make(rng, (3, 4), dt), make(rng, (4,), np.bool_)), grad_args=g,
                 name="broadcast_mask")
    yield Sample((make(rng, (4,), dt), make(rng, (3, 1), np.bool_)), grad_args=g,
                 name="broadcast_input")
    yield Sample((make(rng, (), dt), np.array(True)), grad_args=g, name="0d")
    yield Sample((make(rng, (0, 3), dt), np.zeros((0, 3), bool)), grad_args=g,
                 name="zero_size")
    yield Sample((make(rng, (3,), dt), np.zeros(3, bool)), grad_args=g, name="none")
    yield Sample((make(rng, (3,), dt), np.ones(3, np.uint8)), grad_args=g, name="uint8_mask")
    yield Sample((make(rng, (3,), dt), make(rng, (2,), np.bool_)), grad_args=g,
                 name="shape_mismatch")


def masked_scatter_samples(rng, dt):
    g = (0, 2)
    yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), np.bool_), make(rng, (15,), dt)),
                 grad_args=g)
    yield Sample((make(rng, (3, 4), dt), make(rng, (4,), np.bool_), make(rng, (3, 4), dt)),
                 grad_args=g, name="broadcast_mask")
    yield Sample((make(rng, (4,), dt), make(rng, (3, 1), np.bool_), make(rng, (4, 3), dt)),
                 grad_args=g, name="broadcast_input")
    yield Sample((make(rng, (), dt), np.array(True), make(rng, (2,), dt)), grad_args=g,
                 name="0d")
    yield Sample((make(rng, (0, 3), dt), np.zeros((0, 3), bool), make(rng, (2,), dt)),
                 grad_args=g, name="zero_size")
    yield Sample((make(rng, (3,), dt), np.ones(3, bool), make(rng, (2,), dt)),
                 grad_args=(0,), name="source_too_small")
    yield Sample((make(rng, (3,), dt), np.ones(3, np.uint8), make(rng, (3,), dt)),
                 grad_args=(0,), name="uint8_mask")
    yield Sample((make(rng, (3,), dt), np.ones(3, bool), make(rng, (3,), other(dt))),
                 grad_args=(0,), name="source_dtype")


def masked_scatter_inplace_samples(rng, dt):
    g = (0, 2)
    yield Sample((make(rng, (3, 4), dt), make(rng, (4,), np.bool_), make(rng, (12,), dt)),
                 grad_args=g)
    yield Sample((make(rng, (4,), dt), make(rng, (3, 1), np.bool_), make(rng, (12,), dt)),
                 grad_args=(0,), name="cannot_broadcast_self")


def one_hot(L, x, *args):
    nn = getattr(L, "nn", None)
    fn = getattr(getattr(nn, "functional", None), "one_hot", None)
    return (fn or L.one_hot)(x, *args)


def one_hot_samples(rng, dt):
    yield Sample((idx(0, 3, 1),))
    yield Sample((rand_index(rng, (2, 3), 4), 5))
    yield Sample((idx(2).reshape(()), 3), name="0d")
    yield Sample((np.zeros((0, 2), np.int64), 3), name="zero_size")
    yield Sample((idx(0), 0), name="zero_classes")
    yield Sample((np.zeros(0, np.int64),), name="cannot_infer")
    yield Sample((idx(-1, 2),), name="negative")
    yield Sample((idx(0, 2), 2), name="out_of_range")
    yield Sample((idx(0, 2).astype(np.int32),), name="int32")


register(
    OpInfo("gather", lambda L, x, d, i: L.gather(x, d, i), gather_samples, dtypes=FI),
    OpInfo("gather_method", lambda L, x, d, i: x.gather(d, i), gather_samples,
           covers=("gather",)),
    OpInfo("scatter", scatter_fn, scatter_samples, dtypes=FI),
    OpInfo("scatter_", scatter_inplace_fn, scatter_samples, covers=("scatter",)),
    OpInfo("scatter_add", lambda L, x, d, i, s: L.scatter_add(x, d, i, s), scatter_add_samples,
           dtypes=FI),
    OpInfo("scatter_add_", lambda L, x, d, i, s: x.clone().scatter_add_(d, i, s),
           scatter_add_samples, covers=("scatter_add",)),
    OpInfo("scatter_reduce", lambda L, x, d, i, s, **kw: L.scatter_reduce(x, d, i, s, **kw),
           scatter_reduce_samples, dtypes=FI),
    OpInfo("scatter_reduce_",
           lambda L, x, d, i, s, **kw: x.clone().scatter_reduce_(d, i, s, **kw),
           scatter_reduce_samples, covers=("scatter_reduce",)),
    OpInfo("index_select", lambda L, x, d, i: L.index_select(x, d, i), index_select_samples,
           dtypes=FI),
    OpInfo("index_add", lambda L, x, d, i, s, **kw: L.index_add(x, d, i, s, **kw),
           index_add_samples, dtypes=FI),
    OpInfo("index_add_", lambda L, x, d, i, s, **kw: x.clone().index_add_(d, i, s, **kw),
           index_add_samples, covers=("index_add",)),
    OpInfo("index_copy", lambda L, x, d, i, s: L.index_copy(x, d, i, s), index_copy_samples,
           dtypes=FI),
    OpInfo("index_copy_", lambda L, x, d, i, s: x.clone().index_copy_(d, i, s),
           index_copy_samples, covers=("index_copy",)),
    OpInfo("index_fill", lambda L, x, d, i, v: L.index_fill(x, d, i, v), index_fill_samples,
           dtypes=FI),
    OpInfo("index_fill_", lambda L, x, d, i, v: x.clone().index_fill_(d, i, v),
           index_fill_samples, covers=("index_fill",)),
    OpInfo("take", lambda L, x, i: L.take(x, i), take_samples, dtypes=FI),
    OpInfo("put", lambda L, x, i, s, **kw: L.put(x, i, s, **kw), put_samples, dtypes=FI),
    OpInfo("put_", lambda L, x, i, s, **kw: x.clone().put_(i, s, **kw), put_samples,
           covers=("put",)),
    OpInfo("put_method", lambda L, x, i, s, **kw: x.put(i, s, **kw), put_samples,
           covers=("put",)),
    OpInfo("take_along_dim", lambda L, x, i, d: L.take_along_dim(x, i, d),
           take_along_dim_samples, dtypes=FI, covers=("gather",)),
    OpInfo("masked_select", lambda L, x, m: L.masked_select(x, m), masked_select_samples,
           dtypes=FI, meta=False),  # the output size depends on the mask's values
    OpInfo("masked_scatter", lambda L, x, m, s: L.masked_scatter(x, m, s),
           masked_scatter_samples, dtypes=FI),
    OpInfo("masked_scatter_", lambda L, x, m, s: x.clone().masked_scatter_(m, s),
           masked_scatter_inplace_samples, covers=("masked_scatter",)),
    OpInfo("one_hot", one_hot, one_hot_samples, dtypes=(np.int64,), differentiable=False,
           meta=False),  # num_classes=-1 makes the size data-dependent
)
