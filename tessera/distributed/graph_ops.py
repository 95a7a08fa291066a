"""Collectives as graph nodes: what boxing becomes inside a traced ``nn.Graph``.

While ``nn.Graph`` traces ``build()`` on global tensors, every rank records its own local
program: a global tensor's tile is a symbolic value, SBP dispatch picks signatures exactly
as in eager mode, and each boxing step becomes a node of one of these ops, whose CPU
kernel calls the communicator when the compiled step runs:

* ``boxing``: one mesh axis of a conversion (``boxing.box_1d``: all-reduce, all-gather,
  reduce-scatter, all-to-all, or a local slice);
* ``send`` / ``recv``: a placement change (how activations and gradients cross pipeline
  stages);
* ``sbp_local``: a signature with its own local computation that communicates
  (synchronised batch norm, the mean loss's global count, dropout's agreed seed);
* ``all_reduce_bucket``: several partial_sum -> broadcast conversions over one group as a
  single all-reduce; ``reduce_scatter_bucket`` and ``all_gather_bucket`` the same for
  ZeRO's partial_sum -> split(0) (with the partial_sum -> broadcast of the parameters it
  leaves whole among them) and split(0) -> broadcast (made by the ``graph_bucket`` pass,
  not by tracing).

They are registered ops (``tessera.ops.REGISTRY``), not a second table beside it:
DESIGN.md section 1 has eager execution, tracing, distributed execution and every
exporter read *one* table, and a graph's text form names its ops by that table, so a
program holding collectives prints, parses back (``Graph.parse``) and runs the same, and
an exporter meeting one fails the way it fails on any op without its rule ("op 'boxing'
has no 'to_onnx' rule"). OneFlow does the same: the collectives its boxing passes insert
into a job (``_nccl_logical_all_reduce``...) are ordinary registered user ops. Being
internal, they have no ``tessera.*`` function and no ``grad`` (a graph's backward boxes
its own gradients), and their attrs are literals (SBPs as ``sbp.short()`` text, metas as
``(shape, dtype)`` pairs) so the text form holds everything a kernel needs.

Ranks must call the collectives in the same order, and the passes keep them so: each
communicating node has a unique ``seq`` attr (CSE never merges two), its kernel refuses to
run outside a graph step (constant folding, which evaluates nodes at compile time, leaves
it alone), a send's token is kept live as a graph output (DCE), and no pass moves a node
it does not fuse.

>>> import tessera, tessera.nn as nn
>>> from tessera.distributed.comm.fake import FakeWorld
>>> class Total(nn.Graph):
...     def build(self, x):
...         return x.sum().to_global(sbp=tessera.sbp.broadcast)
>>> def step():  # on each of two simulated ranks
...     p = tessera.placement("cpu", ranks=[0, 1])
...     x = tessera.ones(4, 3).to_global(p, tessera.sbp.split(0))  # rows 0-3 and 4-7
...     g = Total()
...     return g(x).item(), [(n.op.name, n.attrs.get("dst")) for n in g.ir.nodes]
>>> FakeWorld(2).run(step)
[(24.0, [('sum', None), ('boxing', 'B')]), (24.0, [('sum', None), ('boxing', 'B')])]
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from tessera import _dtype as D
from tessera.autograd.grad_mode import no_grad
from tessera.distributed import comm as C
from tessera.ops import cost
from tessera.ops.registry import Meta, OpDef, register

__all__ = ["BOXING_OP", "ALL_REDUCE_BUCKET_OP", "REDUCE_SCATTER_BUCKET_OP",
           "ALL_GATHER_BUCKET_OP", "SEND_OP", "RECV_OP", "SBP_LOCAL_OP",
           "traced_box", "traced_send", "traced_recv", "traced_local", "in_step",
           "home_variables",
           "step_running", "step_serial"]

_STEP = threading.local()  # per thread: FakeWorld ranks are threads


class in_step:
    """Marks a compiled graph step: the only place collective kernels may run."""

    def __enter__(self):
        _STEP.depth = getattr(_STEP, "depth", 0) + 1
        if _STEP.depth == 1:
            _STEP.serial = getattr(_STEP, "serial", 0) + 1
        return self

    def __exit__(self, *exc):
        _STEP.depth -= 1
        return False


def step_running() -> bool:
    return getattr(_STEP, "depth", 0) > 0


def step_serial() -> int:
    """The number of the compiled step running on this thread (0 outside one): a value
    computed in this step may be reused by a later node of the same step only.

    >>> step_serial()
    0
    """
    return getattr(_STEP, "serial", 0) if step_running() else 0


def _check_step(name: str) -> None:
    if not step_running():
        # constant folding evaluates nodes at compile time: a collective there would run on
        # one rank's schedule only, so it is refused (and the pass leaves the node alone)
        raise RuntimeError(f"{name}: a collective node runs only inside a compiled nn.Graph "
                           "step")


def _fresh(a: np.ndarray, x) -> np.ndarray:
    """The result as its own array (a slice of the input would alias the input's buffer,
    which the memory plan may reuse)."""
    if isinstance(x, np.ndarray) and np.may_share_memory(a, x):
        return np.array(a, copy=True)
    return a


# ---- boxing --------------------------------------------------------------------------------

_COMMUNICATING = {("P", "B"), ("P", "S"), ("S", "B"), ("S", "S")}


def _sbp(text: str):
    """The SBP an attr names (``sbp.short()``: "S(1)", "B", "P"): attrs stay printable."""
    from tessera.sbp import broadcast, partial_sum, split
    if text == "B":
        return broadcast
    if text == "P":
        return partial_sum
    return split(int(text[2:-1]))


def _box_infer(x: Meta, shape, src, dst, group, index, seq):
    from tessera.distributed.boxing import tile_shape
    return Meta(tile_shape(tuple(shape), (_sbp(dst),), (index,), (len(group),)), x.dtype)


def _box_kernel(x, shape, src, dst, group, index, seq):
    from tessera.distributed.boxing import box_1d
    _check_step("boxing")
    rows = _BY_ROWS.get((src, dst))
    if rows is not None and len(group) > 1 and type(x) is np.ndarray and \
            _by_rows(x.dtype, shape, len(group)):
        return rows(x, tuple(shape), tuple(group), index, seq)
    return _fresh(box_1d(x, tuple(shape), _sbp(src), _sbp(dst), tuple(group), index,
                         C.current()), x)


@functools.lru_cache(maxsize=256)
def _rows_layout(shapes: tuple, n: int) -> tuple[list[int], list[list], int]:
    """Where C-ordered tensors of ``shapes``, each split(0) over ``n``, lie in one flat
    bucket: each one's offset, each member's rows of every one as flat ranges, and the
    bucket's size (the same every step: computed once)."""
    from tessera.sbp import split_range
    ranges: list[list]
    offsets, ranges, start = [], [[] for _ in range(n)], 0
    for shape in shapes:
        row = int(np.prod(shape[1:], dtype=np.int64))
        offsets.append(start)
        for k in range(n):
            a, b = split_range(shape[0], n, k)
            ranges[k].append((start + a * row, start + b * row))
        start += shape[0] * row
    return offsets, ranges, start


@functools.lru_cache(maxsize=256)
def _scatter_layout(shapes: tuple, whole: tuple, n: int) -> tuple:
    """``_rows_layout`` of a reduce-scatter bucket whose members at the positions ``whole``
    are all-reduced (partial_sum -> broadcast): those are shared among the ``n`` members
    by elements rather than by rows, and spread. (offsets, ranges, spread, size)."""
    from tessera.sbp import split_range
    offsets: list[int] = []
    ranges: list[list] = [[] for _ in range(n)]
    spread: list[list] = [[] for _ in range(n)]
    start = 0
    for j, shape in enumerate(shapes):
        size = int(np.prod(shape, dtype=np.int64))
        row = 1 if j in whole else _row(shape)
        offsets.append(start)
        for k in range(n):
            a, b = split_range(size if j in whole else shape[0], n, k)
            ranges[k].append((start + a * row, start + b * row))
            if j in whole:
                spread[k].append(ranges[k][-1])
        start += size
    return offsets, ranges, spread, start


def _scatter_rows(xs, group: tuple, index: int, seq: int, whole: tuple = ()) -> tuple:
    """partial_sum -> split(0) of the tiles ``xs`` (ZeRO's gradients), each copied into the
    node's reduce buffer, which is reduce-scattered by rows in place: one collective for
    all of them. The results are views of this rank's rows (shared memory under MPI on one
    machine: no messages). The members at the positions ``whole`` are all-reduced in the
    same collective (the gradients of parameters ZeRO leaves whole): their results are the
    whole sums."""
    shapes = tuple(tuple(x.shape) for x in xs)
    offsets, ranges, spread, total = _scatter_layout(shapes, tuple(whole), len(group))
    flat = _reduce_buffer(total, xs[0].dtype, group, seq)
    for x, o in zip(xs, offsets):  # (a strided copy when a gradient is a transposed view)
        _put(flat[o:o + x.size].reshape(x.shape), x)
    C.current().reduce_scatter_ranges_(flat, ranges, group, spread=spread if whole else None)
    return tuple(flat[o:o + x.size].reshape(s) if j in whole else
                 flat[a:b].reshape(((b - a) // _row(s),) + s[1:])
                 for j, (x, o, (a, b), s) in enumerate(zip(xs, offsets, ranges[index], shapes)))


def _gather_rows(xs, shapes, group: tuple, index: int, seq: int) -> tuple:
    """split(0) -> broadcast of the tiles ``xs`` to the logical ``shapes`` (ZeRO's updated
    parameters): this rank's rows written into the node's reduce buffer, which is
    all-gathered by rows in place; the results are views of the buffer."""
    offsets, ranges, total = _rows_layout(tuple(shapes), len(group))
    flat = _reduce_buffer(total, xs[0].dtype, group, seq)
    for x, (a, b) in zip(xs, ranges[index]):
        _put(flat[a:b].reshape(x.shape), x)
    C.current().all_gather_ranges_(flat, ranges, group)
    return tuple(flat[o:o + int(np.prod(s, dtype=np.int64))].reshape(s)
                 for o, s in zip(offsets, shapes))


def _row(shape: tuple) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def _p_to_s0(x, shape, group, index, seq):
    return _scatter_rows((x,), group, index, seq)[0]


def _s0_to_b(x, shape, group, index, seq):
    return _gather_rows((x,), (shape,), group, index, seq)[0]


def rows_bucketable(x: Meta, shape: tuple, group: tuple) -> bool:
    """Whether a partial_sum -> split(0) or split(0) -> broadcast of a tile ``x`` of the
    logical ``shape`` runs on a reduce buffer by rows (and so may join a bucket of them).

    >>> rows_bucketable(Meta((4, 3), D.float32), (4, 3), (0, 1))
    True
    >>> rows_bucketable(Meta((1,), D.float32), (1,), (0, 1))  # fewer rows than ranks
    False
    """
    return _by_rows(x.dtype.np, shape, len(group))


def _by_rows(dtype, shape: tuple, n: int) -> bool:
    """A float tensor of ``shape`` (numpy ``dtype``) with at least a row for each of ``n``
    ranks: its split(0) conversions run on a reduce buffer by rows."""
    return np.dtype(dtype).char in "fd" and len(shape) > 0 and shape[0] >= n and \
        int(np.prod(shape)) > 0


# conversions that run on the node's own reduce buffer (see _reduce_buffer)
_BY_ROWS = {("P", "S(0)"): _p_to_s0, ("S(0)", "B"): _s0_to_b}


def _reducing(ins, outs, group, **attrs) -> cost.Cost:
    """A collective that sums the group's tiles (from partial_sum): each output element
    adds the other ranks' values into this rank's."""
    flops = (len(group) - 1) * sum(cost.numel(m) for m in outs)
    return cost.Cost(flops, *cost.io(ins, outs))


def _box_cost(ins, outs, src, **attrs) -> cost.Cost:
    """The tile read and the result written; from partial_sum, the sums."""
    if src == "P":
        return _reducing(ins, outs, **attrs)
    return cost.Cost(0, *cost.io(ins, outs))


BOXING_OP = register(OpDef("boxing", _box_infer, {"cpu": _box_kernel}, grad=None, save=(),
                           cost=_box_cost,
                           doc="one mesh axis of an SBP conversion of a tile "
                               "(boxing.box_1d)"))


# ---- a bucket of all-reduces ---------------------------------------------------------------

def _bucket_infer(*xs: Meta, group, index, seq):
    if not xs or any(x.dtype is not xs[0].dtype for x in xs):
        raise TypeError("all_reduce_bucket: needs tiles of one dtype")
    return tuple(xs)


def _bucket_kernel(*xs, group, index, seq):
    """The tiles copied into one flat buffer, which is all-reduced in place (no result
    buffer: MPI reduces in place in about half the time), then handed out as views.

    The buffer is the node's own reduce buffer, made at its first step and kept (shared
    memory under MPI on one machine, where the all-reduce is sums and copies between two
    barriers instead of MPI's messages; bench distributed: mlp, compiled). Its
    views never outlive a step: the step copies a view it returns, and an assigned value
    into its variable."""
    _check_step("all_reduce_bucket")
    flat = _reduce_buffer(sum(x.size for x in xs), xs[0].dtype, tuple(group), seq)
    start = 0
    for x in xs:  # (one strided copy: a gradient is often a transposed view)
        _put(flat[start:start + x.size].reshape(x.shape), x)
        start += x.size
    C.current().iall_reduce_(flat, tuple(group)).wait()
    out, start = [], 0
    for x in xs:
        out.append(flat[start:start + x.size].reshape(x.shape))
        start += x.size
    return tuple(out)


def _put(place: np.ndarray, x) -> None:
    """``x`` copied into its ``place`` in a reduce buffer, unless it is already there (its
    producer wrote it in place: ``input_buffers``)."""
    if not (type(x) is np.ndarray and x.ctypes.data == place.ctypes.data and
            x.strides == place.strides):
        np.copyto(place, x)


class _Place:
    """Where member ``k`` of a bucket node goes in the node's reduce buffer (its
    ``input_buffers`` entry): ``take()`` is that part of the buffer, once the node's first
    step has made it, else a fresh array (and the kernel copies it in, that once).
    ``output``: (result, flat offset) where the node puts the member in its own results
    (an all-gather's: this rank's rows), or None."""

    def __init__(self, key: tuple, start: int, shape: tuple, dtype,
                 output: tuple[int, int] | None = None):
        self.key, self.start, self.shape, self.dtype = key, start, shape, np.dtype(dtype)
        self.stop = start + int(np.prod(shape, dtype=np.int64))
        self.output = output

    def take(self) -> np.ndarray:
        buf = C.current().__dict__.get("_graph_buckets", {}).get(self.key)
        if buf is None:
            return np.empty(self.shape, self.dtype)
        return buf[self.start:self.stop].reshape(self.shape)


def _places(metas, starts, count: int, group, seq, outputs=None) -> list:
    dt = metas[0].dtype.np
    key = _buffer_key(count, dt, group, seq)
    outputs = outputs or [None] * len(metas)
    return [_Place(key, a, tuple(m.shape), dt, o) for m, a, o in zip(metas, starts, outputs)]


def _buffer_key(count: int, dtype, group, seq: int) -> tuple:
    """What names the reduce buffer of node ``seq`` on a communicator."""
    return tuple(group), seq, np.dtype(dtype), count


def _reduce_buffer(count: int, dtype, group: tuple, seq: int) -> np.ndarray:
    """The reduce buffer of the collective node ``seq`` over ``group`` (collective the
    first time: every member runs the node at the same point of the same program). Kept
    for the next steps, so a graph holds one such buffer per node that uses one (an
    all-reduce bucket; a parameter's partial_sum -> split(0) and split(0) -> broadcast
    under ZeRO): memory traded for collectives without messages on one machine."""
    comm = C.current()
    buffers = comm.__dict__.setdefault("_graph_buckets", {})
    key = _buffer_key(count, dtype, group, seq)
    buf = buffers.get(key)
    if buf is None:
        buf = buffers[key] = comm.reduce_buffer(count, dtype, group)
    return buf


def _bucket_places(*xs: Meta, group, index, seq):
    starts = np.cumsum([0] + [int(np.prod(x.shape, dtype=np.int64)) for x in xs]).tolist()
    return _places(xs, starts[:-1], starts[-1], group, seq)


ALL_REDUCE_BUCKET_OP = register(OpDef(
    "all_reduce_bucket", _bucket_infer, {"cpu": _bucket_kernel}, grad=None, save=(),
    input_buffers=_bucket_places, cost=_reducing,
    doc="partial_sum -> broadcast of several tiles as one all-reduce (graph_bucket)"))



# ---- buckets of ZeRO's reduce-scatters and all-gathers -------------------------------------

def _rows_check(name: str, xs, shapes, group) -> None:
    if not xs or any(x.dtype is not xs[0].dtype for x in xs):
        raise TypeError(f"{name}: needs tiles of one dtype")
    bad = [s for x, s in zip(xs, shapes) if not rows_bucketable(x, s, tuple(group))]
    if bad:
        raise ValueError(f"{name}: cannot split a {xs[0].dtype} tensor of shape {list(bad[0])} "
                         f"by rows over {len(group)} rank(s)")


def _scatter_bucket_infer(*xs: Meta, group, index, seq, whole=()):
    from tessera.distributed.boxing import tile_shape
    from tessera.sbp import split
    if any(not 0 <= j < len(xs) for j in whole):
        raise ValueError(f"reduce_scatter_bucket: whole={tuple(whole)} names members of a "
                         f"bucket of {len(xs)}")
    rows = [x for j, x in enumerate(xs) if j not in whole]
    if rows or not xs:
        _rows_check("reduce_scatter_bucket", rows, [x.shape for x in rows], group)
    if any(xs[j].dtype is not xs[0].dtype or xs[j].dtype.np.char not in "fd"
           for j in whole):
        raise TypeError("reduce_scatter_bucket: needs float tiles of one dtype")
    return tuple(x if j in whole else
                 Meta(tile_shape(x.shape, (split(0),), (index,), (len(group),)), x.dtype)
                 for j, x in enumerate(xs))


def _scatter_bucket_kernel(*xs, group, index, seq, whole=()):
    _check_step("reduce_scatter_bucket")
    return _scatter_rows(xs, tuple(group), index, seq, tuple(whole))


def _gather_bucket_infer(*xs: Meta, shapes, group, index, seq):
    from tessera.distributed.boxing import tile_shape
    from tessera.sbp import split
    if len(shapes) != len(xs):
        raise ValueError(f"all_gather_bucket: {len(xs)} tiles for {len(shapes)} shapes")
    _rows_check("all_gather_bucket", xs, shapes, group)
    for x, s in zip(xs, shapes):
        want = tile_shape(tuple(s), (split(0),), (index,), (len(group),))
        if x.shape != want:
            raise ValueError(f"all_gather_bucket: member {index} of {len(group)} holds rows "
                             f"of shape {list(want)} of a {list(s)} tensor, got a tile of "
                             f"shape {list(x.shape)}")
    return tuple(Meta(tuple(s), x.dtype) for x, s in zip(xs, shapes))


def _gather_bucket_kernel(*xs, shapes, group, index, seq):
    _check_step("all_gather_bucket")
    return _gather_rows(xs, tuple(tuple(s) for s in shapes), tuple(group), index, seq)


def _gather_bucket_into(outs, *xs, shapes, group, index, seq):
    """The out-form of ``all_gather_bucket``, which a compiled step uses when each result
    goes into a variable (ZeRO's gathered parameters): the results written into ``outs``,
    those variables. When they are the segments of one buffer of the bucket's layout
    (``home_variables``), this rank's rows are written there and the others' gathered in
    place: the parameters are the bucket, nothing is copied out of it. Otherwise gathered
    as the kernel gathers, then copied into them."""
    _check_step("all_gather_bucket")
    shapes, group = tuple(tuple(s) for s in shapes), tuple(group)
    offsets, ranges, total = _rows_layout(shapes, len(group))
    flat = _home_of(outs, offsets, total)
    if flat is None:
        for o, r in zip(outs, _gather_rows(xs, shapes, group, index, seq)):
            np.copyto(o, r)
        return
    for x, (a, b) in zip(xs, ranges[index]):
        _put(flat[a:b].reshape(x.shape), x)
    C.current().all_gather_ranges_(flat, ranges, group)


def _home_of(outs, offsets: list, total: int) -> np.ndarray | None:
    """The home buffer (``home_variables``) whose segments at ``offsets`` the arrays
    ``outs`` are, or None."""
    homes = C.current().__dict__.get("_graph_homes")
    start = outs[0].ctypes.data if homes else None
    flat = homes.get(start) if homes else None
    if flat is None or flat.size != total or flat.dtype != outs[0].dtype:
        return None
    size = flat.itemsize
    if all(o.flags.c_contiguous and o.dtype == flat.dtype and
           o.ctypes.data == start + off * size for o, off in zip(outs, offsets)):
        return flat
    return None


def home_variables(nodes, value_var: dict, tensors: dict, kept: dict) -> int:
    """Give the variables that the compiled step's ``all_gather_bucket`` nodes write
    (``value_var``: id(result) -> variable name, the memory plan's) a home: one flat buffer
    per node from the communicator's ``reduce_buffer`` (shared memory under MPI on one
    machine), each variable's tile the segment the node gathers it into, so the step
    gathers the updated shards straight into the parameters (as the eager
    ``ZeroBucket`` does). ``tensors``: variable name -> tensor; ``kept``: the homes made
    for earlier compilations of the graph, by layout, reused (a home is allocated once).
    Collective: every rank of a group makes its homes in the same order. Returns how many
    variables were given one.

    >>> home_variables([], {}, {}, {})  # a step without an all-gather bucket
    0
    """
    comm, homed = C.current(), 0
    for n in nodes:
        if n.op is not ALL_GATHER_BUCKET_OP:
            continue
        names = [value_var.get(id(v)) for v in n.outputs]
        ts = [tensors.get(k) for k in names]
        if any(t is None or not t.is_global or type(t._data.local) is not np.ndarray
               or t._data.local.shape != v.shape for t, v in zip(ts, n.outputs)):
            continue
        shapes = tuple(v.shape for v in n.outputs)
        dtype = np.dtype(n.outputs[0].dtype.np)
        group = tuple(n.attrs["group"])
        offsets, _, total = _rows_layout(shapes, len(group))
        key = (tuple(names), shapes, dtype, group)
        if key not in kept:
            kept[key] = comm.reduce_buffer(total, dtype, group)
        flat = kept[key]
        comm.__dict__.setdefault("_graph_homes", {})[flat.ctypes.data] = flat
        for t, o, s in zip(ts, offsets, shapes):
            assert t is not None  # (checked above)
            seg = flat[o:o + int(np.prod(s, dtype=np.int64))].reshape(s)
            if t._data.local.ctypes.data != seg.ctypes.data:
                np.copyto(seg, t._data.local)
                t._data.local = seg
                t._version[0] += 1
            homed += 1
    return homed


def _scatter_places(*xs: Meta, group, index, seq, whole=()):
    offsets, _, _, total = _scatter_layout(tuple(tuple(x.shape) for x in xs), tuple(whole),
                                           len(group))
    return _places(xs, offsets, total, group, seq)


def _gather_places(*xs: Meta, shapes, group, index, seq):
    offsets, ranges, total = _rows_layout(tuple(tuple(s) for s in shapes), len(group))
    starts = [a for a, _ in ranges[index]]
    # each member is also this rank's rows of its own result (a parameter, under ZeRO)
    return _places(xs, starts, total, group, seq,
                   [(k, a - o) for k, (a, o) in enumerate(zip(starts, offsets))])


REDUCE_SCATTER_BUCKET_OP = register(OpDef(
    "reduce_scatter_bucket", _scatter_bucket_infer, {"cpu": _scatter_bucket_kernel},
    grad=None, save=(), input_buffers=_scatter_places, cost=_reducing,
    doc="partial_sum -> split(0) of several tiles as one reduce-scatter, with those at "
        "``whole`` partial_sum -> broadcast in the same collective (graph_bucket)"))
ALL_GATHER_BUCKET_OP = register(OpDef(
    "all_gather_bucket", _gather_bucket_infer, {"cpu": _gather_bucket_kernel}, grad=None,
    save=(), input_buffers=_gather_places, cost=cost.movement(),
    inplace_kernels={"cpu": _gather_bucket_into}, traits=frozenset({"into_variables"}),
    doc="split(0) -> broadcast of several tiles as one all-gather (graph_bucket)"))

# ---- send / recv ---------------------------------------------------------------------------

def _send_infer(x: Meta, dst, tag, seq):
    return Meta((), D.float32)


def _send_kernel(x, dst, tag, seq):
    _check_step("send")
    C.current().send(np.ascontiguousarray(x), dst, tag)
    return np.zeros((), np.float32)  # a token: graph outputs keep the send alive


def _recv_infer(shape, dtype, src, tag, seq):
    return Meta(tuple(shape), dtype)


def _recv_kernel(shape, dtype, src, tag, seq):
    _check_step("recv")
    return C.current().recv(tuple(shape), dtype.np, src, tag)


SEND_OP = register(OpDef("send", _send_infer, {"cpu": _send_kernel}, grad=None, save=(),
                         cost=cost.movement(),
                         doc="send this rank's tile to rank dst (a placement change)"))
RECV_OP = register(OpDef("recv", _recv_infer, {"cpu": _recv_kernel}, grad=None, save=(),
                         cost=cost.movement(),
                         doc="receive a tile from rank src (a placement change)"))


# ---- a signature's own local computation ---------------------------------------------------

_LOCAL_KEYS = ("sbp_op", "sbp_sig", "sbp_metas", "sbp_group", "sbp_outs", "sbp_logical",
               "seq", "sbp_mesh", "sbp_in")


def _meta(m):
    """A Meta again: the text form prints one as its ``(shape, dtype)`` pair and parses it
    back as a plain tuple. Scalars and None (non-tensor arguments) stay as they are."""
    if isinstance(m, Meta):
        return m
    if isinstance(m, list):
        return [_meta(x) for x in m]
    if isinstance(m, tuple) and len(m) == 2 and isinstance(m[1], D.dtype):
        return Meta(tuple(m[0]), m[1])
    return m


def _metas(items) -> list:
    return [_meta(m) for m in items]


def _local_fn(attrs: dict):
    """The signature's local function, found again from printable attrs: the op's SBP
    rule at the logical metas (and the logical values of its shape attrs)."""
    from tessera.ops.registry import REGISTRY
    op = REGISTRY[attrs["sbp_op"]]
    assert op.sbp is not None  # the signature was chosen from it
    rule_attrs = {k: v for k, v in attrs.items() if k not in _LOCAL_KEYS}
    rule_attrs.update(dict(attrs["sbp_logical"]))
    sigs = op.sbp(*_metas(attrs["sbp_metas"]), mesh_size=len(attrs["sbp_group"]),
                  **rule_attrs)
    return op, sigs[attrs["sbp_sig"]].local


def _placement(mesh: tuple):
    """The placement an ``sbp_mesh`` attr names: (its hierarchy, its ranks in order)."""
    from tessera.distributed.placement import placement
    hierarchy, ranks = mesh
    return placement("cpu", np.array(ranks, dtype=np.int64).reshape(hierarchy).tolist())


def _local_infer(*metas, **attrs):
    outs = tuple(_metas(attrs["sbp_outs"]))
    return outs if len(outs) > 1 else outs[0]


def _local_kernel(*arrays, **attrs):
    from tessera._tensor import Tensor
    _check_step(f"{attrs['sbp_op']} (SBP signature)")
    inner = {k: v for k, v in attrs.items() if k not in _LOCAL_KEYS}
    args = [Tensor._from_numpy(np.asarray(a)) if isinstance(a, np.ndarray) else a
            for a in arrays]
    metas = _metas(attrs["sbp_metas"])
    if "sbp_mesh" in attrs:  # the rule's computation over the whole N-D placement
        from tessera.ops.registry import REGISTRY
        op = REGISTRY[attrs["sbp_op"]]
        assert op.sbp is not None and op.sbp.whole is not None  # traced from it
        mesh = _placement(attrs["sbp_mesh"])
        sbps = [None if t is None else tuple(_sbp(x) for x in t) for t in attrs["sbp_in"]]
        with no_grad():
            res = op.sbp.whole(op, args, inner, metas, mesh, sbps, C.current().rank)
    else:
        op, fn = _local_fn(attrs)
        with no_grad():
            res = fn(op, args, inner, metas, tuple(attrs["sbp_group"]))
    if isinstance(res, tuple):
        return tuple(r._data for r in res)
    return res._data


def _local_cost(ins, outs, **attrs) -> cost.Cost:
    """The cost of the op whose signature this computation is, on the tiles (its
    communication aside); moving the tiles when that op has no cost rule."""
    from tessera.ops.registry import REGISTRY
    op = REGISTRY[attrs["sbp_op"]]
    if op.cost is None:
        return cost.Cost(0, *cost.io(ins, outs))
    return op.cost(ins, outs, **{k: v for k, v in attrs.items() if k not in _LOCAL_KEYS})


SBP_LOCAL_OP = register(OpDef("sbp_local", _local_infer, {"cpu": _local_kernel}, grad=None,
                              save=(), cost=_local_cost,
                              doc="an SBP signature's own local computation (it may "
                                  "communicate)"))


# ---- recording them while tracing -----------------------------------------------------------

def _tracer():
    from tessera.graph.trace import current_tracer
    t = current_tracer()
    if t is None:
        raise RuntimeError("a symbolic tile outside an nn.Graph trace")
    return t


def _seq() -> int:
    t = _tracer()
    t.comm_seq += 1
    return t.comm_seq - 1


def _sym_tensor(x):
    from tessera._tensor import _CPU, Tensor
    return Tensor._make(x, x.value.dtype, _CPU, x.shape)


def traced_box(x, shape: tuple, src, dst, group: tuple, index: int):
    """The symbolic tile after one mesh axis of boxing (a ``boxing`` node; broadcast ->
    split, this rank's part of the whole, a ``slice`` view: the memory plan knows a view
    of its input for one, and no copy is made)."""
    from tessera._dispatch import dispatch
    if src == dst or len(group) == 1:  # on one rank every SBP's tile is the whole
        return x
    if src.kind == "B" and dst.kind == "S":
        from tessera.ops.views import slice_view
        from tessera.sbp import split_range
        a, b = split_range(shape[dst.dim], len(group), index)
        return slice_view(_sym_tensor(x), (slice(None),) * dst.dim + (slice(a, b),))._data
    # a conversion that communicates is numbered (never merged); a local one (B->S
    # slice, B->P, S->P) may be shared, as any pure node
    seq = _seq() if (src.kind, dst.kind) in _COMMUNICATING else None
    out = dispatch(BOXING_OP, _sym_tensor(x), shape=tuple(shape), src=src.short(),
                   dst=dst.short(), group=tuple(group), index=index, seq=seq)
    return out._data


def traced_send(x, dst: int, tag: int) -> None:
    from tessera._dispatch import dispatch
    token = dispatch(SEND_OP, _sym_tensor(x), dst=dst, tag=tag, seq=_seq())
    _tracer().effects.append(token._data.value)


def traced_recv(shape: tuple, dtype, src: int, tag: int):
    from tessera._dispatch import dispatch
    dt = dtype if isinstance(dtype, D.dtype) else D.from_numpy_dtype(np.dtype(dtype))
    return dispatch(RECV_OP, shape=tuple(shape), dtype=dt, src=src, tag=tag,
                    seq=_seq())._data


def traced_local(op, index: int, args: list, attrs: dict, logical: dict, metas,
                 group: tuple, outs: list, mesh=None, in_sbps=None):
    """The local computation of signature ``index`` of ``op`` (``Signature.local``) as one
    ``sbp_local`` node on the symbolic tiles ``args``; ``attrs`` are the local attrs,
    ``logical`` the logical values of those that differ; ``outs`` the tiles' metas. With
    ``mesh`` (an N-D placement) and ``in_sbps`` (each input's SBP tuple): the rule's
    computation over the whole placement (``SbpRule.whole``) instead."""
    from tessera._dispatch import dispatch
    clash = [k for k in _LOCAL_KEYS if k in attrs]
    if clash:
        raise RuntimeError(f"{op.name}: attribute {clash[0]!r} clashes with sbp_local's")
    whole = {} if mesh is None else {
        "sbp_mesh": (tuple(mesh.hierarchy), tuple(mesh.flat_ranks)),
        "sbp_in": tuple(None if t is None else tuple(x.short() for x in t) for t in in_sbps)}
    return dispatch(SBP_LOCAL_OP, *args, **attrs, sbp_op=op.name, sbp_sig=index,
                    sbp_metas=tuple(metas), sbp_group=tuple(group), sbp_outs=tuple(outs),
                    sbp_logical=tuple(sorted(logical.items())), seq=_seq(), **whole)
