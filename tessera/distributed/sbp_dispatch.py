"""Ops on global tensors: the ``global`` branch of ``tessera._dispatch.dispatch``.

For an op with a global input: check that the global inputs share one placement, ask the
op's ``sbp`` rule for its legal signatures at the inputs' logical shapes, pick the one whose
boxing moves the fewest bytes from the inputs' current SBPs (``boxing.cost``; ties go to
the rule's first), box each input into it, and run the op's ordinary local dispatch on the
tiles. Dispatch then wraps the tiles as global tensors with the logical shapes ``infer``
gave and records autograd on the global tensors, so backward is the op's own grad rule
running on global tensors (each of its ops picking a signature in turn).

On an N-D placement the signature is one 1-D signature per mesh axis (OneFlow's N-D SBP,
``choose_nd``): chosen greedily from the outermost axis, each axis's rule seeing the tiles
the outer axes leave; a signature that communicates runs on the last axis only.

On a 1-D placement, what ``run`` works out for a call (the signature, which inputs are
boxed, each output's SBP and tile shape) is kept per op, input metas and SBPs, attrs,
placement and rank (``_plan``): a training step repeats its calls, and working it out again
each time is a large share of an op on small global tensors (bench distributed: mlp, global
tensors).

A 0-d local tensor among global inputs counts as broadcast (every rank must hold the same
value, as for a Python number); any other local tensor is an error naming the op.
"""
from __future__ import annotations

import itertools
from typing import Literal, NamedTuple

import numpy as np

from tessera._tensor import Tensor
from tessera.device.registry import device as Device
from tessera.distributed import comm as C
from tessera.distributed.boxing import box, cost, tile_shape
from tessera.distributed.global_tensor import GlobalData, local_shape, sbp_str
from tessera.graph.trace import is_tracing
from tessera.ops.registry import Meta, MissingRule, OpDef
from tessera.sbp import Signature, broadcast, sbp

__all__ = ["run", "choose", "choose_index"]


def _describe(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            parts.append(sbp_str(a._data.sbp) if a._device.type == "global" else
                         f"local{list(a._shape)}")
        elif a is not None:
            parts.append(type(a).__name__)
    return ", ".join(parts)


def _inputs(op: OpDef, args, attrs):
    """The common placement and each argument's current SBP (None for non-tensors)."""
    placement = None
    current: list = []
    local_scalar = False
    for i, a in enumerate(args):
        if not isinstance(a, Tensor):
            current.append(None)
            continue
        if a._device.type == "global":
            p = a._data.placement
            if placement is None:
                placement = p
            elif p is not placement and p != placement:
                raise RuntimeError(f"{op.name}: expected all global inputs on one placement, "
                                   f"but found {placement} and {p} (input {i}); move them "
                                   "with .to_global(placement=...)")
            current.append(a._data.sbp)
        elif a._shape == ():
            current.append(None)  # set to broadcast below, once the mesh is known
            local_scalar = True
        else:
            raise RuntimeError(f"{op.name}: input {i} is a local tensor of shape "
                               f"{list(a._shape)} among global inputs; make it global with "
                               ".to_global(placement, sbp)")
    if placement is None:
        placement = getattr(attrs.get("device"), "placement", None)
    if placement is None:
        raise RuntimeError(f"{op.name}: a global tensor needs a placement and an sbp (use "
                           "placement= and sbp= to make one)")
    if local_scalar:
        b = (broadcast,) * placement.ndim
        current = [b if c is None and isinstance(a, Tensor) else c
                   for a, c in zip(args, current)]
    return placement, current


def choose(op: OpDef, metas, attrs, current, n: int, args=()) -> Signature:
    """The signature of ``op`` with the least boxing from the ``current`` 1-D SBPs."""
    return choose_index(op, metas, attrs, current, n, args)[1]


def choose_index(op: OpDef, metas, attrs, current, n: int, args=(), key=False
                 ) -> tuple[int, Signature]:
    """``choose``, and the signature's position in the rule's list (a graph node names its
    signature by it).

    The choice is a function of the op, the input metas and SBPs, the attrs and the mesh
    size, and is remembered: listing the rule's signatures and costing each costs far more
    than the local op on small tensors. ``key``: ``_choice_key``'s, when the caller has it."""
    if key is False:
        key = _choice_key(op, metas, attrs, current, n)
    if key is not None:
        hit = _CHOICES.get(key)
        if hit is not None and hit[0] is op:
            return hit[1], hit[2]
    rule = op.sbp
    if rule is None:
        raise MissingRule(op.name, "sbp", f"it cannot run on global tensors "
                                          f"(inputs: {_describe(args)})")
    sigs = rule(*metas, mesh_size=n, **attrs)
    sizes = [_nbytes(m) if c is not None else 0.0 for m, c in zip(metas, current)]
    index, best = _cheapest(sigs, sizes, [None if c is None else c[0] for c in current], n)
    if best is None:
        raise RuntimeError(f"{op.name}: no SBP signature fits inputs ({_describe(args)})")
    if key is not None:
        if len(_CHOICES) >= _MAX_CHOICES:  # (a dropout seed in the attrs: a key per call)
            _CHOICES.clear()
        _CHOICES[key] = (op, index, best)
    return index, best


_CHOICES: dict = {}
_MAX_CHOICES = 4096


def _choice_key(op: OpDef, metas, attrs, current, n: int):
    """A hashable key of what the choice depends on, or None (an attr that cannot be
    hashed)."""
    items: tuple = ()
    if attrs:
        items = tuple((k, tuple(v) if type(v) is list else v) for k, v in attrs.items())
    key = (id(op), tuple(metas), tuple(current), n, items)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _cheapest(sigs, sizes, current, n: int):
    """(index, signature) of the signature whose boxing from the inputs' ``current`` SBPs
    (None: not a global tensor) moves the fewest bytes, first on ties; (-1, None) when none
    takes every global input."""
    best, best_cost, index = None, None, -1
    for k, sig in enumerate(sigs):
        total = 0.0
        for nbytes, cur, want in zip(sizes, current, sig.ins):
            if cur is None:
                continue
            if want is None:
                break
            total += cost(cur, want, nbytes, n)
        else:
            if best_cost is None or total < best_cost:
                best, best_cost, index = sig, total, k
    return index, best


def choose_nd(op: OpDef, metas, attrs, current, placement, outs, args=()
              ) -> tuple[list[Signature], list, list]:
    """The N-D signature of ``op``: one 1-D signature per mesh axis, chosen greedily from the
    outermost axis in (OneFlow's hierarchical N-D SBP). Axis ``k``'s rule sees the tiles the
    outer axes' chosen signatures leave (inputs and, for ``shape_attrs``, the output), on
    every tile shape those axes make (uneven splits give two): a signature is legal only if
    the rule gives it for each. Its cost is the 1-D boxing on axis ``k`` from the inputs'
    current SBP there, at the tile's size.

    A signature with a local computation of its own (``Signature.local``) may be chosen on
    the last axis only, where it runs on the outer axes' tiles as if they were the whole
    tensor, communicating within that axis's ranks. On an outer axis its result would have
    to commute with the inner axes' signatures, which nothing guarantees (a mean loss's
    count over a batch split on two axes). A rule with a computation over the whole
    placement (``SbpRule.whole``: dropout) may take any signature on every axis.

    Returns the signature of each axis, and each input's and output's SBP tuple (None for a
    non-tensor input)."""
    rule = op.sbp
    if rule is None:
        raise MissingRule(op.name, "sbp", f"it cannot run on global tensors "
                                          f"(inputs: {_describe(args)})")
    hier = placement.hierarchy
    chosen: list[Signature] = []
    for axis, n in enumerate(hier):
        last = axis == len(hier) - 1
        sigs, dropped = None, False
        for coords in itertools.product(*(range(m) for m in hier[:axis])):
            tiled, tiled_attrs = _tiled(op, metas, attrs, current, chosen, coords, hier, outs)
            every = rule(*tiled, mesh_size=n, **tiled_attrs)
            got = [s for s in every if last or s.local is None or rule.whole is not None]
            dropped = dropped or len(got) < len(every)
            sigs = got if sigs is None else [s for s in sigs if _find(s, got) >= 0]
        tiled = _tiled(op, metas, attrs, current, chosen, (0,) * axis, hier, outs)[0]
        sizes = [_nbytes(m) if c is not None else 0.0 for m, c in zip(tiled, current)]
        best = _cheapest(sigs, sizes, [None if c is None else c[axis] for c in current], n)[1]
        if best is None and dropped:
            raise NotImplementedError(
                f"{op.name}: every SBP signature of its inputs ({_describe(args)}) on mesh "
                f"axis {axis} of {placement} computes across ranks (synchronised batch norm, "
                "a mean loss's count), which on an N-D placement only the last mesh axis "
                "may do")
        if best is None:
            raise RuntimeError(f"{op.name}: no SBP signature fits inputs ({_describe(args)}) "
                               f"on mesh axis {axis} of {placement}")
        chosen.append(best)
    ins = [None if c is None else tuple(s.ins[i] for s in chosen)
           for i, c in enumerate(current)]
    out_sbps = [tuple(s.outs[j] for s in chosen) for j in range(len(chosen[0].outs))]
    return chosen, ins, out_sbps


def _tiled(op, metas, attrs, current, chosen, coords, hier, outs) -> tuple[list, dict]:
    """``metas`` and ``attrs`` as the rule of the axis after the ``chosen`` ones sees them at
    outer mesh ``coords``: each tensor input's shape (and each shape attr, the output's)
    cut by the chosen signatures' splits."""
    if not chosen:
        return list(metas), attrs
    out = []
    for i, (m, c) in enumerate(zip(metas, current)):
        if c is None:
            out.append(m)
            continue
        sbps = tuple(s.ins[i] for s in chosen)
        out.append(m._replace(shape=tile_shape(tuple(m.shape), sbps, coords, hier)))
    names = [k for k in op.sbp.shape_attrs if k in attrs]
    if names:
        shape = tile_shape(tuple(outs[0].shape), tuple(s.outs[0] for s in chosen), coords, hier)
        attrs = dict(attrs, **{k: shape for k in names})
    return out, attrs


def _find(sig: Signature, sigs) -> int:
    """The position in ``sigs`` of the signature with ``sig``'s SBPs (-1: none)."""
    return next((k for k, s in enumerate(sigs) if sig.ins == s.ins and sig.outs == s.outs), -1)


def _nbytes(m: Meta) -> float:
    size = float(m.dtype.itemsize)
    for d in m.shape:
        size *= d
    return size


def run(op: OpDef, args: tuple, metas: list, attrs: dict, outs: tuple) -> list:
    """The GlobalData of each output of ``op`` on these (partly) global ``args``: choose a
    signature, box the inputs into it, run the op on this rank's tiles, wrap the results."""
    if op.dynamic_shape:
        raise NotImplementedError(f"{op.name}: its output shape depends on the data, so it "
                                  "cannot run on global tensors")
    placement, current = _inputs(op, args, attrs)
    if current.count(None) == len(current):
        return _factory(op, args, attrs, outs, placement)
    comm = C.current()
    key = None
    if placement.ndim == 1:
        key = _choice_key(op, metas, attrs, current, placement.size)
        plan = _plan(op, metas, attrs, current, placement, comm.rank, outs, args, key)
        if plan is not None:
            return _run_plan(plan, args, current, attrs, outs, placement, comm)
    choice = _choose(op, metas, attrs, current, placement, outs, args, key)
    rank = comm.rank
    if not placement.has_rank(rank):
        return [GlobalData(None, placement, s, m.shape, m.dtype.np)
                for s, m in zip(choice.outs, outs)]
    local_attrs, tile = _tile_attrs(op, attrs, outs, placement, choice.outs, rank)
    local_args = _box_inputs(op, args, current, choice.ins, placement, rank, comm, tile)
    res = _run_local(op, choice, local_args, local_attrs, metas, attrs, current, placement,
                     rank, outs)
    return _wrapped(op, res, choice.outs, outs, placement, rank, choice.sig)


class _Choice(NamedTuple):
    """The signature ``run`` chose for a call."""

    sig: Signature  # the signature (on an N-D placement, the last axis's)
    # its position in the rule's list (1-D; -1 on an N-D placement); hides tuple.index
    index: int  # type: ignore[assignment]
    chosen: list  # the signature of each mesh axis
    ins: list  # per argument: None (not a global tensor) or the SBP tuple it is boxed to
    outs: list  # per output: its SBP tuple


def _choose(op: OpDef, metas, attrs, current, placement, outs, args, key) -> _Choice:
    """The cheapest signature on a 1-D placement (``choose_index``, remembered under
    ``key``), one per mesh axis on an N-D one (``choose_nd``)."""
    if placement.ndim == 1:
        index, sig = choose_index(op, metas, attrs, current, placement.size, args, key)
        return _Choice(sig, index, [sig], [None if w is None else (w,) for w in sig.ins],
                       [(s,) for s in sig.outs])
    chosen, ins, out_sbps = choose_nd(op, metas, attrs, current, placement, outs, args)
    return _Choice(chosen[-1], -1, chosen, ins, out_sbps)


def _tile_attrs(op: OpDef, attrs, outs, placement, out_sbps, rank: int
                ) -> tuple[dict, tuple | None]:
    """The attrs the op takes on this rank's tiles (its rule's shape attrs set to the
    output's tile), and that tile (None when the rule has no shape attrs)."""
    assert op.sbp is not None  # a signature was chosen from it
    names = op.sbp.shape_attrs
    if not names:
        return attrs, None
    tile = local_shape(outs[0].shape, placement, out_sbps[0], rank)
    return dict(attrs, **{name: tile for name in names}), tile


def _box_inputs(op: OpDef, args, current, ins, placement, rank: int, comm, tile) -> list:
    """Each argument as the op takes it on this rank: a global tensor's tile boxed into
    the signature's SBP (made contiguous where the rule asks), a 0-d local tensor detached,
    anything else as it is."""
    assert op.sbp is not None  # a signature was chosen from it
    contiguous = op.sbp.contiguous
    local_args = []
    for a, cur, want in zip(args, current, ins):
        if cur is None:
            local_args.append(a)
        elif a._device.type != "global":
            local_args.append(a.detach())
        else:
            x = box(a._data.local, a._shape, placement, cur, want, rank, comm)
            if contiguous and type(x) is np.ndarray and not x.flags.c_contiguous and \
                    not _views_as(x, tile):
                x = np.ascontiguousarray(x)  # (a traced tile is a value: always contiguous)
            local_args.append(Tensor._make(x, a._dtype, placement.device, tuple(x.shape)))
    return local_args


def _run_local(op: OpDef, choice: _Choice, local_args, local_attrs, metas, attrs, current,
               placement, rank: int, outs):
    """The op on this rank's tiles: the rule's computation over the whole placement, the
    signature's own local computation (communicating within its group), or else the op's
    ordinary local dispatch; while tracing, the first two become one graph node."""
    rule, sig = op.sbp, choice.sig
    assert rule is not None  # the signature was chosen from it
    if rule.whole is not None and placement.ndim > 1:
        if not is_tracing():
            return rule.whole(op, local_args, local_attrs, metas, placement, choice.ins, rank)
        from tessera.distributed.graph_ops import traced_local
        return traced_local(op, -1, local_args, local_attrs, {}, metas, placement.flat_ranks,
                            _tile_metas(choice.outs, outs, placement, rank), mesh=placement,
                            in_sbps=choice.ins)
    if sig.local is None:
        return _local_dispatch()(op, *local_args, **local_attrs)
    group, sig_metas, sig_attrs, index = placement.flat_ranks, metas, attrs, choice.index
    if placement.ndim > 1:
        # the last axis's signature, on the outer axes' tiles as if they were the whole
        coords = placement.coords(rank)
        sig_metas, sig_attrs = _tiled(op, metas, attrs, current, choice.chosen[:-1],
                                      coords[:-1], placement.hierarchy, outs)
        group = placement.group(rank, placement.ndim - 1)
        index = _find(sig, rule(*sig_metas, mesh_size=len(group), **sig_attrs))
    if not is_tracing():
        return sig.local(op, local_args, local_attrs, sig_metas, group)
    from tessera.distributed.graph_ops import traced_local  # one node, run at each step
    logical = {k: sig_attrs[k] for k in rule.shape_attrs if k in sig_attrs}
    return traced_local(op, index, local_args, local_attrs, logical, sig_metas, group,
                        _tile_metas(choice.outs, outs, placement, rank))


def _tile_metas(out_sbps, outs, placement, rank: int) -> list:
    """Each output's tile on this rank, as a Meta (a traced local computation's results)."""
    return [Meta(local_shape(m.shape, placement, s, rank), m.dtype)  # type: ignore[arg-type]
            for s, m in zip(out_sbps, outs)]  # (rank is on the placement: never None)


def _wrapped(op, res, out_sbps, outs, placement, rank: int, sig) -> list:
    """The GlobalData of each of the local results ``res``, their tile shapes checked."""
    res = res if isinstance(res, tuple) else (res,)
    datas = []
    for r, s, m in zip(res, out_sbps, outs):
        x = r._data
        want = tuple(m.shape)
        for t in s:
            if t.kind == "S":
                tile = local_shape(m.shape, placement, s, rank)
                assert tile is not None  # rank is on the placement
                want = tile
                break
        if tuple(x.shape) != want:
            raise AssertionError(f"{op.name}: signature {sig} gave rank {rank} a tile of "
                                 f"{list(x.shape)}, expected {list(want)}")
        datas.append(GlobalData(x, placement, s, m.shape, m.dtype.np))
    return datas


class _Plan(NamedTuple):
    """What ``run`` works out for an op on a 1-D placement from the op, the input metas
    and SBPs, the attrs, the placement and the rank, kept for the next call with the same
    (a training step repeats them): the signature, whether each input is boxed, and each
    output's SBP and tile shape on this rank."""

    op: OpDef
    sig: Signature
    ins: tuple  # per argument: None (not a global tensor) or the SBP tuple it is boxed to
    boxed: tuple  # per argument: its current SBP differs from the signature's
    outs: tuple  # per output: its SBP tuple
    tiles: tuple  # per output: this rank's tile shape
    shape_attrs: dict  # the op's shape attrs, set to the output's tile
    tile: tuple | None  # the output's tile, for a rule that makes its inputs contiguous
    device: Device


_PLANS: dict[tuple, _Plan | Literal[False]] = {}  # False: the general path runs


def _plan(op: OpDef, metas, attrs, current, placement, rank: int, outs, args, key
          ) -> _Plan | None:
    """The remembered plan of this call, made on a miss; None where the general path runs
    (an unhashable attr, a signature with a local computation of its own, a rank outside
    the placement)."""
    if key is None:
        return None
    pkey = (key, placement, rank)
    plan = _PLANS.get(pkey)
    if plan is not None:
        return plan if plan is not False and plan.op is op else None
    index, sig = choose_index(op, metas, attrs, current, placement.size, args, key)
    if sig.local is not None or not placement.has_rank(rank):
        plan = False
    else:
        out_sbps = tuple((s,) for s in sig.outs)
        # (local_shape is never None: rank is on the placement)
        tiles = tuple(tuple(local_shape(m.shape, placement, s, rank))  # type: ignore[arg-type]
                      for s, m in zip(out_sbps, outs))
        rule = op.sbp
        assert rule is not None  # the signature was chosen from it
        tile = tiles[0] if rule.shape_attrs or rule.contiguous else None
        ins = tuple(None if c is None else (w,) for c, w in zip(current, sig.ins))
        plan = _Plan(op, sig, ins, tuple(c is not None and c != w for c, w in zip(current, ins)),
                     out_sbps, tiles, {k: tiles[0] for k in rule.shape_attrs}, tile,
                     placement.device)
    if len(_PLANS) >= _MAX_CHOICES:
        _PLANS.clear()
    _PLANS[pkey] = plan
    return plan or None


def _run_plan(plan: _Plan, args, current, attrs, outs, placement, comm) -> list:
    """``run`` on a 1-D placement by a plan: the same steps without working them out."""
    op, rank = plan.op, comm.rank
    assert op.sbp is not None  # the plan's signature was chosen from it
    contiguous = plan.tile is not None and op.sbp.contiguous
    local_args = []
    for a, cur, want, boxed in zip(args, current, plan.ins, plan.boxed):
        if cur is None:
            local_args.append(a)
        elif a._device.type != "global":
            local_args.append(a.detach())
        else:
            x = a._data.local
            if boxed:
                x = box(x, a._shape, placement, cur, want, rank, comm)
            if contiguous and type(x) is np.ndarray and not x.flags.c_contiguous and \
                    not _views_as(x, plan.tile):
                x = np.ascontiguousarray(x)
            local_args.append(Tensor._make(x, a._dtype, plan.device, tuple(x.shape)))
    local_attrs = dict(attrs, **plan.shape_attrs) if plan.shape_attrs else attrs
    res = _local_dispatch()(op, *local_args, **local_attrs)
    res = res if type(res) is tuple else (res,)
    datas = []
    for r, s, m, tile in zip(res, plan.outs, outs, plan.tiles):
        x = r._data
        if tuple(x.shape) != tile:
            raise AssertionError(f"{op.name}: signature {plan.sig} gave rank {rank} a tile "
                                 f"of {list(x.shape)}, expected {list(tile)}")
        datas.append(GlobalData(x, placement, s, m.shape, m.dtype.np))
    return datas


_DISPATCH: list = []


def _local_dispatch():
    """``tessera._dispatch.dispatch`` (imported on first use: it imports this module; an
    import statement in ``run`` went through importlib on every op)."""
    if not _DISPATCH:
        from tessera._dispatch import dispatch
        _DISPATCH.append(dispatch)
    return _DISPATCH[0]


def _views_as(x: np.ndarray, shape) -> bool:
    """``x`` takes ``shape`` without a copy (a reshape to its own shape, which
    ``linear``'s weight gradient goes through, keeps a transposed tile as it is)."""
    if shape is None:
        return False
    if tuple(shape) == x.shape:
        return True
    v = x.view()
    try:
        v.shape = tuple(shape)
    except (AttributeError, ValueError):
        return False
    return True


def _factory(op: OpDef, args, attrs, outs, placement) -> list:
    """An op without tensor inputs given a global tensor's device (``zeros(shape,
    device=x.device)``): the whole value, broadcast on that placement."""
    if "generator" in attrs:
        raise NotImplementedError(f"{op.name}: random values with device= of a global tensor "
                                  "would differ across ranks; use placement= and sbp=")
    b = (broadcast,) * placement.ndim
    if not placement.has_rank(C.current().rank):
        return [GlobalData(None, placement, b, m.shape, m.dtype.np) for m in outs]
    from tessera._dispatch import dispatch
    res = dispatch(op, *args, **dict(attrs, device=placement.device))
    res = res if isinstance(res, tuple) else (res,)
    return [GlobalData(r._data, placement, b, m.shape, m.dtype.np) for r, m in zip(res, outs)]


def split_dims(sbps) -> list[int | None]:
    return [s.dim for s in sbps if isinstance(s, sbp) and s.kind == "S"]


_ = Meta  # (re-exported for rule modules)
