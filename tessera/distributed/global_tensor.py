"""Global tensors: a Tensor whose data is this rank's tile plus the placement and SBP.

A global tensor is an ordinary ``Tensor`` with the logical shape, on the ``global`` device
(registered here), whose ``_data`` is a ``GlobalData``. Dispatch sends every op with a
global input to ``tessera.distributed._dispatch``; ``numpy()`` gathers; in-place writes
box the result into the target's SBP (``GlobalBackend.copy_into``).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera._tensor_methods import _OPS
from tessera.autograd.grad_mode import STATE
from tessera.device.registry import Backend, device, register_device
from tessera.distributed import comm as C
from tessera.distributed.boxing import box, move, tile_shape
from tessera.distributed.placement import placement as Placement
from tessera.ops.registry import Meta, OpDef
from tessera.sbp import as_sbp_tuple, broadcast, partial_sum, split_range

__all__ = ["GlobalData", "GlobalDevice", "global_device", "is_global", "make_global",
           "local_shape", "to_global", "to_local", "gather"]


class GlobalData:
    """The data of a global tensor: this rank's tile (None on ranks outside the placement),
    the placement, the SBP tuple (one per mesh axis) and the logical shape."""

    __slots__ = ("local", "placement", "sbp", "shape", "dtype")

    def __init__(self, local, placement: Placement, sbp: tuple, shape: tuple, dtype):
        self.local, self.placement, self.sbp, self.shape = local, placement, sbp, shape
        self.dtype = np.dtype(dtype)

    def copy(self) -> GlobalData:
        return GlobalData(None if self.local is None else self.local.copy(), self.placement,
                          self.sbp, self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"GlobalData({self.placement}, {sbp_str(self.sbp)}, shape={self.shape})"


def sbp_str(sbps) -> str:
    return "(" + ", ".join(s.short() for s in sbps) + ")"


_run: Callable[..., list] | None = None  # tessera.distributed.sbp_dispatch.run


class GlobalBackend(Backend):
    """The ``global`` device: data is a ``GlobalData``; ops never run here (dispatch hands
    global inputs to tessera.distributed), but copies, NumPy reads and strides do."""

    has_storage = True

    def __init__(self) -> None:
        self._inplace: dict = {}   # OpDef -> its in-place kernel on tiles, or None

    def from_numpy(self, array, index):
        raise RuntimeError("a NumPy array becomes a global tensor through "
                           "tensor.to_global(placement, sbp)")

    def to_numpy(self, data: GlobalData) -> np.ndarray:
        return gather(data)

    def kernel(self, op):
        return None

    def inplace_kernel(self, op):
        """For an elementwise op (its sbp rule says so) with a cpu in-place kernel: that
        kernel run on aligned tiles (``inplace_kernel`` below), made once per op."""
        fast = self._inplace.get(op)
        if fast is None and op not in self._inplace:
            cpu = op.inplace_kernels.get("cpu")
            if cpu is not None and op.sbp is not None and op.sbp.elementwise:
                fast = inplace_kernel(op, cpu)
            self._inplace[op] = fast
        return fast

    def run(self, op, args, metas, attrs, outs):
        global _run
        if _run is None:  # (tessera.distributed.sbp_dispatch imports this module)
            from tessera.distributed.sbp_dispatch import run as _run
        return _run(op, args, metas, attrs, outs)  # type: ignore[misc]  # bound above

    def copy_into(self, dst: GlobalData, src: GlobalData | np.ndarray) -> None:
        if dst.local is None:
            return
        if isinstance(src, GlobalData):
            boxed = _boxed(src, dst.placement, dst.sbp)
            assert boxed is not None  # this rank is on dst's placement: it gets a tile
            src = boxed
        np.copyto(dst.local, src, casting="unsafe")

    def strides(self, data) -> tuple[int, ...]:
        st, acc = [], 1
        for s in reversed(data.shape):
            st.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(st))


_BACKEND = GlobalBackend()
register_device("global", _BACKEND)


def inplace_kernel(op: OpDef, kernel):
    """The ``global`` in-place kernel of an elementwise ``op`` (``add_``, ``mul_``: the
    optimizers' updates) from its ``cpu`` one: when every tensor operand has the target's
    placement, SBP and shape, and none is partial_sum (``add_(1)`` on partial tiles would add
    1 on every rank), each element of the target is computed from the same element of the
    operands, so the cpu kernel runs on the tiles in place. Otherwise the op runs out of
    place on the global tensors and is boxed into the target, as without this kernel.
    (Dispatch uses an in-place kernel only where autograd does not record the write.)"""
    def run(t: GlobalData, *args, **attrs):
        if _tiles_align(t, args):
            if t.local is not None:
                kernel(t.local, *(a.local if type(a) is GlobalData else a for a in args),
                       **attrs)
            return
        from tessera._dispatch import dispatch
        tensors = [_as_tensor(a) if type(a) is GlobalData else
                   Tensor._from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
        out = dispatch(op, *tensors, **attrs)
        _BACKEND.copy_into(t, out._data)
    return run


def _tiles_align(t: GlobalData, args) -> bool:
    if type(t.local) is not np.ndarray and t.local is not None:
        return False  # (a traced tile)
    for s in t.sbp:
        if s.kind == "P":
            return False
    for a in args:
        if type(a) is GlobalData:
            if a is not t and (a.placement != t.placement or a.sbp != t.sbp or
                               a.shape != t.shape or type(a.local) is not type(t.local)):
                return False
        elif isinstance(a, np.ndarray) and a.ndim != 0:
            return False
    return True


def _as_tensor(data: GlobalData) -> Tensor:
    return Tensor._make(data, D.from_numpy_dtype(data.dtype), global_device(data.placement),
                        tuple(data.shape))


class GlobalDevice(device):
    """The device of a global tensor: type ``global``, and it knows the placement, so that
    ``tessera.zeros(shape, device=x.device)`` (common in models and in grad rules) makes a
    broadcast global tensor on ``x``'s placement."""

    __slots__ = ("placement",)

    def __init__(self, placement: Placement):
        super().__init__("global")
        self.placement = placement

    def __repr__(self) -> str:
        return f"device(type='global', placement={self.placement})"

    def __reduce__(self):
        return (GlobalDevice, (self.placement,))


_DEVICES: dict = {}


def global_device(placement: Placement) -> GlobalDevice:
    dev = _DEVICES.get(placement)
    if dev is None:
        dev = _DEVICES[placement] = GlobalDevice(placement)
    return dev


def is_global(t) -> bool:
    return isinstance(t, Tensor) and t._device.type == "global"


def _rank() -> int:
    return C.current().rank


def local_shape(shape: tuple, placement: Placement, sbps: tuple, rank: int | None = None
                ) -> tuple | None:
    """The shape of ``rank``'s tile (None when ``rank`` is not on the placement)."""
    coords = placement.coords(_rank() if rank is None else rank)
    if coords is None:
        return None
    return tile_shape(tuple(shape), sbps, coords, placement.hierarchy)


def local_index(shape: tuple, placement: Placement, sbps: tuple, rank: int) -> tuple:
    """The index of ``rank``'s tile in the logical tensor (slices; nested splits compose)."""
    coords = placement.coords(rank)
    assert coords is not None, f"rank {rank} is not on {placement}"
    starts, sizes = [0] * len(shape), list(shape)
    for s, c, n in zip(sbps, coords, placement.hierarchy):
        if s.kind == "S":
            a, b = split_range(sizes[s.dim], n, c)
            starts[s.dim] += a
            sizes[s.dim] = b - a
    return tuple(slice(a, a + n) for a, n in zip(starts, sizes))


def make_global(local, dtype: D.dtype, placement: Placement, sbps: tuple, shape: tuple
                ) -> Tensor:
    """A global Tensor (no autograd history) from this rank's tile."""
    return Tensor._make(GlobalData(local, placement, sbps, tuple(shape), dtype.np), dtype,
                        global_device(placement), tuple(shape))


def _check_placement(p, what: str) -> Placement:
    if not isinstance(p, Placement):
        raise TypeError(f"{what}: placement must be a tessera.placement, got {p!r}")
    n = C.current().world_size
    bad = [r for r in p.flat_ranks if r >= n]
    if bad:
        raise ValueError(f"{what}: {p} names rank(s) {bad}, but the world has {n} "
                         "process(es)")
    return p


def _boxed(data: GlobalData, placement: Placement, sbps: tuple) -> np.ndarray | None:
    """This rank's tile of ``data`` converted to ``placement`` and ``sbps``."""
    if placement != data.placement:
        tag = 0  # eager: transfers between two ranks stay in program order
        tracer = _tracer()
        if tracer is not None:  # traced: numbered (every rank traces every move), so the
            tag = tracer.moves % 32768  # pipeline schedule's reordering keeps them matched
            tracer.moves += 1
        return move(data.local, data.shape, data.dtype, data.placement, data.sbp, placement,
                    sbps, _rank(), C.current(), tag)
    if data.local is None:
        return None
    return box(data.local, data.shape, placement, data.sbp, sbps, _rank(), C.current())


def _tracer():
    from tessera.graph.trace import current_tracer
    return current_tracer()


def _traced(t: Tensor) -> GlobalData:
    """``t``'s data; while nn.Graph traces, a concrete tile becomes the graph's variable."""
    tracer = _tracer()
    return t._data if tracer is None else tracer.traced_data(t)


def _owned(local, data: GlobalData, copy: bool):
    """``local`` as an array of its own where it could alias ``data``'s tile (eager only:
    traced tiles are values)."""
    if type(local) is not np.ndarray or type(data.local) is not np.ndarray:
        return local
    if copy or np.may_share_memory(local, data.local):
        return np.array(local, copy=True)
    return local


def gather(data: GlobalData) -> np.ndarray:
    """The whole logical value on every rank (broadcast, then this rank's tile)."""
    p = data.placement
    full = _boxed(data, p, (broadcast,) * p.ndim)
    comm = C.current()
    if p.size < comm.world_size:  # ranks outside the placement get it from its first rank
        root = p.flat_ranks[0]
        if full is None:
            full = np.empty(data.shape, data.dtype)
        full = comm.broadcast(full, root)
    assert full is not None  # every rank of a placement of the whole world has its tile
    return full


# ---- conversions, with autograd ------------------------------------------------------------
# Unregistered OpDefs (like a custom autograd.Function's): they exist to be autograd nodes.

def _l2g_grad(ctx, g):
    a = ctx.attrs
    return (to_local(to_global(g, a["placement"], a["grad_sbp"])),)


def _g2g_grad(ctx, g):
    a = ctx.attrs
    return (to_global(g, a["placement"], a["grad_sbp"]),)


def _g2l_grad(ctx, g):
    a = ctx.attrs
    return (_local_to_global(g, a["placement"], a["sbp"], a["shape"]),)


# (no infer rule: ``_record`` makes their nodes, never dispatch)
_L2G = OpDef("local_to_global", infer=None, grad=_l2g_grad, save=())  # type: ignore[arg-type]
_G2G = OpDef("to_global", infer=None, grad=_g2g_grad, save=())  # type: ignore[arg-type]
_G2L = OpDef("to_local", infer=None, grad=_g2l_grad, save=())  # type: ignore[arg-type]


def _record(op, src: Tensor, out: Tensor, attrs: dict) -> Tensor:
    """``out`` (made from ``src``) joins the autograd graph through ``op``."""
    from tessera._dispatch import _finish
    meta = Meta(out._shape, out._dtype)
    if not (src._requires_grad and STATE.enabled):
        return out
    return _finish(op, (src,), attrs, [Meta(src._shape, src._dtype)], meta, (out._data,),
                   out._device, True)


def _backward_sbp(sbps: tuple, grad_sbp) -> tuple:
    if grad_sbp is not None:
        return grad_sbp
    return tuple(broadcast if s == partial_sum else s for s in sbps)


def to_global(t: Tensor, placement=None, sbp=None, *, grad_sbp=None, check_meta: bool = True,
              copy: bool = False) -> Tensor:
    """``t`` as a global tensor on ``placement`` with ``sbp`` (see ``Tensor.to_global``)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"to_global: expected a Tensor, got {type(t).__name__}")
    if is_global(t):
        data = _traced(t)
        p = data.placement if placement is None else _check_placement(placement, "to_global")
        sbps = data.sbp if sbp is None else as_sbp_tuple(sbp, p.ndim, t.ndim, "to_global")
        gs = None if grad_sbp is None else as_sbp_tuple(grad_sbp, data.placement.ndim, t.ndim,
                                                          "to_global(grad_sbp)")
        if p == data.placement and sbps == data.sbp and not copy:
            return t
        local = _owned(_boxed(data, p, sbps), data, copy)
        out = make_global(local, t._dtype, p, sbps, t._shape)
        return _record(_G2G, t, out, {"placement": data.placement,
                                      "grad_sbp": gs if gs is not None else data.sbp})
    if placement is None or sbp is None:
        raise ValueError("to_global: a local tensor needs both placement= and sbp= "
                         f"(got placement={placement!r}, sbp={sbp!r})")
    p = _check_placement(placement, "to_global")
    sbps = as_sbp_tuple(sbp, p.ndim, t.ndim, "to_global")
    gs = None if grad_sbp is None else as_sbp_tuple(grad_sbp, p.ndim, t.ndim,
                                                      "to_global(grad_sbp)")
    if t._device.type != "cpu":
        raise RuntimeError(f"to_global: a local tensor on {t._device} cannot become a global "
                           f"tensor on {p} (move it to '{p.type}' first)")
    shape = _logical_shape(tuple(t._shape), p, sbps, check_meta)
    local = t._data if p.has_rank(_rank()) else None
    if copy and local is not None:
        local = local.copy()
    out = make_global(local, t._dtype, p, sbps, shape)
    return _record(_L2G, t, out, {"placement": p, "grad_sbp": _backward_sbp(sbps, gs)})


def _local_to_global(t: Tensor, p: Placement, sbps: tuple, shape: tuple) -> Tensor:
    """A local tile whose logical shape is known (no metadata exchange)."""
    local = t._data if p.has_rank(_rank()) else None
    out = make_global(local, t._dtype, p, sbps, shape)
    return _record(_L2G, t, out, {"placement": p, "grad_sbp": _backward_sbp(sbps, None)})


def to_local(t: Tensor) -> Tensor:
    """This rank's tile of a global tensor (an empty tensor on ranks outside its placement);
    a local tensor is returned as it is."""
    if not is_global(t):
        return t
    data = _traced(t)
    local = data.local if data.local is not None else np.empty((0,), data.dtype)
    out = Tensor._make(local, t._dtype, data.placement.device, tuple(local.shape))
    out._version = t._version
    return _record(_G2L, t, out, {"placement": data.placement, "sbp": data.sbp,
                                  "shape": t._shape})


def _logical_shape(local: tuple, p: Placement, sbps: tuple, check: bool) -> tuple:
    """The logical shape of a tensor whose tiles have these shapes: split dims add up over
    the mesh axes that split them. The tiles are exchanged (metadata only) when a dim is
    split or a rank outside the placement must learn the shape."""
    comm = C.current()
    split = any(s.kind == "S" for s in sbps)
    if not split and p.size == comm.world_size:
        return local
    shapes = comm.all_gather_object(local if p.has_rank(comm.rank) else None)
    members = {r: tuple(shapes[r]) for r in p.flat_ranks}
    first = members[p.flat_ranks[0]]
    ndims = {len(s) for s in members.values()}
    if len(ndims) != 1:
        raise ValueError(f"to_global: the local tensors have different numbers of dims on the "
                         f"ranks of {p}: {_fmt_shapes(members)}")
    sizes = list(first)
    for d in range(len(first)):
        axes = [a for a, s in enumerate(sbps) if s.kind == "S" and s.dim == d]
        if axes:
            # (coords is never None: r is on the placement)
            sizes[d] = sum(members[r][d] for r in p.flat_ranks
                           if all(c == 0 for a, c in enumerate(p.coords(r))  # type: ignore[arg-type]
                                  if a not in axes))
    logical = tuple(sizes)
    for r, s in members.items():
        want = local_shape(logical, p, sbps, r)
        assert want is not None  # r is on the placement
        if want != s:
            raise ValueError(
                f"to_global: with sbp {sbp_str(sbps)} on {p}, a logical shape of "
                f"{list(logical)} gives rank {r} a tile of {list(want)}, but it has "
                f"{list(s)} (splits are uneven by OneFlow's rule: the first ranks take one "
                f"more); local shapes: {_fmt_shapes(members)}")
    return logical


def _fmt_shapes(members: dict) -> str:
    return ", ".join(f"rank {r}: {list(s)}" for r, s in members.items())


# Tensor.to_global / Tensor.to_local (Tensor sits below this layer)
_OPS["to_global"], _OPS["to_local"] = to_global, to_local
