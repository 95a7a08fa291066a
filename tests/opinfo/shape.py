"""Op-info entries: joining, splitting, flipping, repeating, triangles, broadcasting."""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make as _make, register


def make(*args, **kwargs) -> np.ndarray:
    # core.make gives a NumPy scalar (not a 0-d array) for 0-d bool samples
    return np.asarray(_make(*args, **kwargs))

F = (np.float32, np.float64)
ALL = (np.float32, np.float64, np.int64, np.bool_)
I64 = np.int64


def _s(*args, name="", grad_args=None, **kwargs):
    return Sample(tuple(args), kwargs, grad_args=grad_args, name=name)


# ---- cat and stacks ---------------------------------------------------------------------

def cat_samples(rng, dt):
    m = lambda *s, d=dt: make(rng, s, d)  # noqa: E731
    yield _s([m(2, 3), m(2, 3)], 0)
    yield _s([m(2, 3), m(2, 4), m(2, 1)], 1)
    yield _s([m(2, 3), m(4, 3)], -2)
    yield _s([m(1, 2, 3), m(1, 2, 3)], -1)
    yield _s([m(5)], 0, name="single")
    yield _s([m(0, 3), m(2, 3)], 0, name="zero_size")
    yield _s([m(0), m(2, 3), m(0)], 1, name="legacy_empty")
    yield _s([m(0), m(0)], 0, name="all_legacy")
    yield _s([m(2, 3), make(rng, (1, 3), np.float64)], 0, name="promote_f64")
    yield _s([m(2, 3), make(rng, (2, 2), np.int64)], 1, name="promote_int")
    yield _s([m(2, 3), make(rng, (2, 2), np.bool_)], 1, name="promote_bool")
    yield _s([m(), m()], 0, name="zero_dim")
    yield _s([m(2, 3), m(2, 3, 1)], 0, name="rank_mismatch")
    yield _s([m(2, 3), m(3, 3)], 1, name="size_mismatch")
    yield _s([m(2, 3), m(2, 3)], 2, name="dim_range")
    yield _s([], 0, name="empty_list")


def stack_samples(rng, dt):
    m = lambda *s, d=dt: make(rng, s, d)  # noqa: E731
    for shape in [(), (3,), (2, 3), (0, 2)]:
        for dim in range(-len(shape) - 1, len(shape) + 1):
            yield _s([m(*shape), m(*shape)], dim)
    yield _s([m(2), make(rng, (2,), np.float64)], 0, name="promote")
    yield _s([m(2), m(3)], 0, name="unequal")
    yield _s([m(2), m(2)], 2, name="dim_range")
    yield _s([], 0, name="empty_list")


def hv_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s([m(), m(3)])
    yield _s([m(3), m(2)])
    yield _s([m(2, 3), m(2, 1)])
    yield _s([m(3), m(2, 3)])
    yield _s([m(2, 3, 4), m(2, 3, 1)])
    yield _s([m(2, 3), m(2)])
    yield _s([m(1, 1, 3), m(3)])
    yield _s([m(3), m(3, 2), m()])
    yield _s([m(), m()])
    yield _s([m(3, 2, 2), m(3)])
    yield _s([m(0), m(0)])
    yield _s([])


register(
    OpInfo("cat", lambda L, ts, dim: L.cat(ts, dim), cat_samples, dtypes=ALL),
    OpInfo("cat_kw", lambda L, ts, dim: L.cat(ts, dim=dim), cat_samples, covers=("cat",)),
    OpInfo("concat", lambda L, ts, dim: L.concat(ts, dim), cat_samples, covers=("cat",)),
    OpInfo("concatenate", lambda L, ts, dim: L.concatenate(ts, axis=dim), cat_samples,
           covers=("cat",)),
    OpInfo("cat_tensor_arg", lambda L, x: L.cat(x), lambda rng, dt: [_s(make(rng, (2, 2), dt))],
           covers=("cat",)),
    OpInfo("cat_out", lambda L, a, b: L.cat([a, b], 1, out=a.new_zeros(2, 5)),
           lambda rng, dt: [_s(make(rng, (2, 3), dt), make(rng, (2, 2), dt))],
           differentiable=False, covers=("cat",)),
    OpInfo("stack", lambda L, ts, dim: L.stack(ts, dim), stack_samples, dtypes=ALL,
           covers=("cat", "view")),
    OpInfo("hstack", lambda L, ts: L.hstack(ts), hv_samples, covers=("cat",)),
    OpInfo("vstack", lambda L, ts: L.vstack(ts), hv_samples, covers=("cat",)),
    OpInfo("row_stack", lambda L, ts: L.row_stack(ts), hv_samples, covers=("cat",)),
    OpInfo("dstack", lambda L, ts: L.dstack(ts), hv_samples, covers=("cat",)),
    OpInfo("column_stack", lambda L, ts: L.column_stack(ts), hv_samples, covers=("cat",)),
)


# ---- split, chunk, unbind ------------------------------------------------------------
# all are the one multi-output view op ``split_view``; its backward is ``split_backward``
_SPLIT_OPS = ("split_view", "split_backward")


def split_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(5, 3), 2)
    yield _s(m(5, 3), 1, dim=1)
    yield _s(m(5, 3), 5)
    yield _s(m(5, 3), 7, dim=-1)
    yield _s(m(5, 3), [1, 4])
    yield _s(m(5, 3), (0, 2, 1), dim=1)
    yield _s(m(0, 3), 0, name="zero_size")
    yield _s(m(0, 3), 2, name="zero_size")
    yield _s(m(5, 3), 0, name="zero_split")
    yield _s(m(5, 3), -1, name="neg_split")
    yield _s(m(5, 3), [1, 1], name="bad_sum")
    yield _s(m(5, 3), [6, -1], name="neg_size")
    yield _s(m(), 1, name="zero_dim")
    yield _s(m(5, 3), 1, dim=2, name="dim_range")


def chunk_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for n, c in [(6, 3), (5, 3), (6, 4), (2, 5), (0, 3), (1, 1)]:
        yield _s(m(n, 2), c)
    yield _s(m(2, 7), 3, dim=-1)
    yield _s(m(2, 7), 0, name="zero_chunks")
    yield _s(m(), 1, name="zero_dim")


def tensor_split_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(7, 2), 3)
    yield _s(m(7, 2), 1)
    yield _s(m(2, 7), 4, dim=1)
    yield _s(m(2, 3), 5, dim=-1)
    yield _s(m(7, 2), [1, 5, 3, 9])
    yield _s(m(7, 2), (-2, 6))
    yield _s(m(7, 2), [5, 2, 6], name="overlapping")
    yield _s(m(2, 7), [3, 1], -1, name="overlapping")
    yield _s(m(6), [-9, 20], name="clamped")
    yield _s(m(7, 2), [])
    yield _s(m(7, 2), 0, name="zero_sections")
    yield _s(m(), 1, name="zero_dim")


def tensor_split_tensor_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(7, 2), np.array([2, 3], I64), name="tensor_indices")
    yield _s(m(2, 7), np.array([-1, 9], I64), 1, name="tensor_indices")
    yield _s(m(7, 2), np.array(2, I64), name="tensor_sections")
    yield _s(m(7, 2), np.array([[2]], I64), name="tensor_2d")
    yield _s(m(7, 2), np.array([2.0]), name="tensor_float", grad_args=(0,))


def unbind_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3, 2))
    yield _s(m(3, 2), 1)
    yield _s(m(2, 3, 4), -1)
    yield _s(m(2, 0), 1)
    yield _s(m(4), name="to_0d")
    yield _s(m(1, 3, 2), 1)
    yield _s(m(0, 2), 0)
    yield _s(m(), 0, name="zero_dim")
    yield _s(m(2), 1, name="dim_range")


register(
    OpInfo("split", lambda L, x, s, dim=0: L.split(x, s, dim), split_samples,
           covers=_SPLIT_OPS),
    OpInfo("split_method", lambda L, x, s, dim=0: x.split(s, dim), split_samples,
           covers=_SPLIT_OPS),
    OpInfo("chunk", lambda L, x, c, dim=0: x.chunk(c, dim), chunk_samples, covers=_SPLIT_OPS),
    OpInfo("tensor_split", lambda L, x, s, dim=0: L.tensor_split(x, s, dim),
           tensor_split_samples, covers=_SPLIT_OPS),
    # the split points are data: like PyTorch, they must be readable (not on meta)
    OpInfo("tensor_split_tensor", lambda L, x, s, dim=0: x.tensor_split(s, dim),
           tensor_split_tensor_samples, meta=False, covers=_SPLIT_OPS),
    OpInfo("unbind", lambda L, x, dim=0: L.unbind(x, dim), unbind_samples, covers=_SPLIT_OPS),
    OpInfo("unbind_method", lambda L, x, dim=0: x.unbind(dim), unbind_samples,
           covers=_SPLIT_OPS),
)


# ---- flip, roll, rot90 -----------------------------------------------------------------

def flip_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3, 4), (0,))
    yield _s(m(3, 4), (1,))
    yield _s(m(3, 4), (0, 1))
    yield _s(m(2, 3, 4), (-1, 0))
    yield _s(m(2, 3, 4), [])
    yield _s(m(5), (0,))
    yield _s(m(), ())
    yield _s(m(0, 3), (0, 1))
    yield _s(m(3, 4), (0, 0), name="repeated")
    yield _s(m(3, 4), (2,), name="dim_range")


def roll_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3, 4), 1)
    yield _s(m(3, 4), -5)
    yield _s(m(3, 4), 1, 0)
    yield _s(m(3, 4), (1, 2), (0, 1))
    yield _s(m(3, 4), (1, 2), (0, 0))
    yield _s(m(2, 3, 4), (7, -1), (-1, 1))
    yield _s(m(5), 2, 0)
    yield _s(m(), 3)
    yield _s(m(0, 3), 1, 1)
    yield _s(m(3, 4), (1, 2), 0, name="misaligned")
    yield _s(m(3, 4), (), (), name="no_shifts")
    yield _s(m(3, 4), 1, 2, name="dim_range")
    yield _s(m(), 1, 0, name="zero_dim")


def rot90_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for k in range(-1, 6):
        yield _s(m(3, 4), k)
    yield _s(m(2, 3, 4), 1, [2, 0])
    yield _s(m(2, 3, 4), 3, [-1, -2])
    yield _s(m(3, 4), 1, [0], name="one_dim")
    yield _s(m(3, 4), 1, [0, 0], name="same_dims")
    yield _s(m(3, 4), 1, [0, 2], name="dim_range")
    yield _s(m(3), 1, name="rank1")


register(
    OpInfo("flip", lambda L, x, dims: L.flip(x, dims), flip_samples, dtypes=ALL),
    OpInfo("flip_method", lambda L, x, dims: x.flip(*dims) if len(dims) else x.flip(dims),
           flip_samples, covers=("flip",)),
    OpInfo("fliplr", lambda L, x: L.fliplr(x),
           lambda rng, dt: [_s(make(rng, s, dt)) for s in [(3, 4), (2, 3, 4), (3,)]],
           covers=("flip",)),
    OpInfo("flipud", lambda L, x: L.flipud(x),
           lambda rng, dt: [_s(make(rng, s, dt)) for s in [(3, 4), (3,), ()]],
           covers=("flip",)),
    OpInfo("roll", lambda L, x, *a: L.roll(x, *a), roll_samples, dtypes=ALL),
    OpInfo("rot90", lambda L, x, *a: L.rot90(x, *a), rot90_samples, covers=("flip", "permute")),
)


# ---- repeat, tile, repeat_interleave --------------------------------------------------

def repeat_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(2, 3), (2, 1))
    yield _s(m(2, 3), (1, 3))
    yield _s(m(2, 3), (2, 1, 2))
    yield _s(m(3), (2, 2, 2))
    yield _s(m(), (3,))
    yield _s(m(), ())
    yield _s(m(2, 3), (0, 2))
    yield _s(m(0, 3), (2, 2))
    yield _s(m(2, 3), (2,), name="too_few")
    yield _s(m(2, 3), (2, -1), name="negative")


def tile_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(2, 3), (2,))
    yield _s(m(2, 3), (2, 2))
    yield _s(m(2, 3), (2, 1, 3))
    yield _s(m(2, 3), ())
    yield _s(m(), (2, 2))
    yield _s(m(2, 3), (-1,), name="negative")


def rep_int_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(2, 3), 2)
    yield _s(m(2, 3), 2, 1)
    yield _s(m(2, 3), 3, -2)
    yield _s(m(2, 3), 1, 0)
    yield _s(m(2, 3), 0, 1)
    yield _s(m(), 3)
    yield _s(m(0, 3), 2, 0)
    yield _s(m(2, 3), 2, 1, output_size=6)
    yield _s(m(2, 3), 2, 1, output_size=5, name="bad_output_size")
    yield _s(m(2, 3), -1, 1, name="negative")
    yield _s(m(), 3, 0, name="zero_dim_dim")
    yield _s(m(2, 3), 2, 2, name="dim_range")


def rep_tensor_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    r = lambda *v: np.array(v, I64)  # noqa: E731
    yield _s(m(2, 3), r(1, 2), 0)
    yield _s(m(2, 3), r(0, 2, 1), 1)
    yield _s(m(2, 3), r(3, 1, 0), -1)
    yield _s(m(2, 3), r(1, 0, 2, 1, 1, 3), None)
    yield _s(m(2, 3), r(2), 0, name="one_repeat")
    yield _s(m(2, 3), np.array(2, I64), 1, name="zero_dim_repeat")
    yield _s(m(2, 3), r(1, 2), 0, output_size=3)
    yield _s(m(2, 3), r(1, 2), 0, output_size=4, name="bad_output_size")
    yield _s(m(2, 3), r(1, -2), 0, name="negative")
    yield _s(m(2, 3), r(1, 2), 1, name="size_mismatch")
    yield _s(m(2, 3), np.array([[1, 2]], I64), 0, name="rank2")
    yield _s(m(2, 3), np.array([1.0, 2.0]), 0, name="float_repeats", grad_args=(0,))


register(
    OpInfo("repeat", lambda L, x, r: x.repeat(*r) if r else x.repeat(r), repeat_samples,
           dtypes=ALL),
    OpInfo("repeat_tuple", lambda L, x, r: x.repeat(r), repeat_samples, covers=("repeat",)),
    OpInfo("tile", lambda L, x, r: L.tile(x, r), tile_samples, covers=("repeat",)),
    OpInfo("repeat_interleave_int", lambda L, x, *a, **k: L.repeat_interleave(x, *a, **k),
           rep_int_samples, covers=("expand", "view", "clone")),
    # per-element repeats make the output shape data-dependent: no meta run (nor in PyTorch)
    OpInfo("repeat_interleave", lambda L, x, *a, **k: x.repeat_interleave(*a, **k),
           rep_tensor_samples, meta=False, covers=("repeat_interleave", "index_put")),
    OpInfo("repeat_interleave_counts", lambda L, r: L.repeat_interleave(r),
           lambda rng, dt: [_s(np.array(v, I64)) for v in ([1, 0, 3], [2], [], [[1]])],
           dtypes=(np.int64,), meta=False, differentiable=False,
           covers=("repeat_interleave", "arange")),
)


# ---- triangles, diagonals -------------------------------------------------------------

def tri_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for k in (0, 1, -1, 5, -5):
        yield _s(m(3, 4), k)
    yield _s(m(2, 4, 3), 1)
    yield _s(m(0, 3), 0)
    yield _s(m(3), 0, name="rank1")


def diag_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for k in (0, 1, -2):
        yield _s(m(3), k)
        yield _s(m(3, 4), k)
    yield _s(m(3, 4), 5)
    yield _s(m(0), 1)
    yield _s(m(2, 2, 2), 0, name="rank3")
    yield _s(m(), 0, name="rank0")


def diag_embed_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3))
    yield _s(m(2, 3))
    yield _s(m(2, 3), 1)
    yield _s(m(2, 3), -2, 0, 2)
    yield _s(m(2, 3), 0, 2, 0)
    yield _s(m(2, 3, 4), 1, 1, -1)
    yield _s(m(0, 2), 1)
    yield _s(m(2, 3), 1, 0, 0, name="same_dims")
    yield _s(m(2, 3), 1, 0, 3, name="dim_range")
    yield _s(m(), 1, name="zero_dim")


def trace_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3, 3))
    yield _s(m(2, 4))
    yield _s(m(0, 3))
    yield _s(m(3), name="rank1")


register(
    OpInfo("tril", lambda L, x, k: L.tril(x, k), tri_samples, dtypes=ALL),
    OpInfo("triu", lambda L, x, k: x.triu(diagonal=k), tri_samples, dtypes=ALL),
    OpInfo("tril_", lambda L, x, k: x.clone().tril_(k), tri_samples, covers=("tril", "clone")),
    OpInfo("triu_out", lambda L, x, k: L.triu(x, k, out=x.new_empty(x.shape)),
           tri_samples, differentiable=False, covers=("triu",)),
    OpInfo("diag", lambda L, x, k: L.diag(x, k), diag_samples, dtypes=ALL,
           covers=("diag_embed", "diagonal", "clone")),
    OpInfo("diag_embed", lambda L, x, *a: L.diag_embed(x, *a), diag_embed_samples,
           dtypes=ALL),
    OpInfo("trace", lambda L, x: L.trace(x), trace_samples,
           dtypes=(np.float32, np.float64, np.int64, np.bool_), covers=("diagonal", "sum")),
)


# ---- broadcasting, meshgrid, atleast_nd ---------------------------------------------

def bcast_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    yield _s(m(3, 1), m(4))
    yield _s(m(2, 1, 3), m(4, 1), m())
    yield _s(m(5))
    yield _s(m(0, 1), m(3))
    yield _s(m(3), m(2), name="mismatch")


def mesh_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for ix in ("ij", "xy"):
        yield _s(m(3), m(2), indexing=ix)
        yield _s(m(3), indexing=ix)
        yield _s(m(3), m(2), m(), indexing=ix)
        yield _s(m(2), m(0), m(4), indexing=ix)
    yield _s(m(3), m(2, 2), indexing="ij", name="rank2")
    yield _s(m(3), m(2), indexing="yx", name="bad_indexing")
    yield _s(indexing="ij", name="empty")


def atleast_samples(rng, dt):
    m = lambda *s: make(rng, s, dt)  # noqa: E731
    for s in [(), (3,), (2, 3), (2, 3, 4), (1, 2, 3, 1)]:
        yield _s(m(*s))
    yield _s(m(), m(3), m(2, 3))
    yield _s([m(), m(2, 2)])


register(
    OpInfo("broadcast_tensors", lambda L, *ts: L.broadcast_tensors(*ts), bcast_samples,
           covers=("expand",)),
    OpInfo("meshgrid", lambda L, *ts, **k: L.meshgrid(*ts, **k), mesh_samples,
           covers=("view", "expand")),
    OpInfo("meshgrid_list", lambda L, *ts, **k: L.meshgrid(list(ts), **k), mesh_samples,
           covers=("view", "expand")),
    OpInfo("atleast_1d", lambda L, *ts: L.atleast_1d(*ts), atleast_samples, covers=("view",)),
    OpInfo("atleast_2d", lambda L, *ts: L.atleast_2d(*ts), atleast_samples, covers=("view",)),
    OpInfo("atleast_3d", lambda L, *ts: L.atleast_3d(*ts), atleast_samples, covers=("view",)),
)
