"""The blocked layout (NCHWc) for the convolutional trunk of inference graphs.

Activations become (N, C/B, H, W, B) tensors (``tessera.ops.nchwc``): every 2-d
convolution on them is a direct convolution whose inner step broadcasts one input value
against B output channels' weights, bias, activation and residual added in registers, and
nothing changes layout between layers (MLAS's NCHWc). The pass grows maximal regions in
program order:

* ``conv`` and ``conv_pointwise`` (its epilogue kept), ungrouped or depthwise, with weights
  fixed at compile time, become ``conv2d_nchwc``: the weights packed once into a new
  variable ``_nchwc.N`` (the bias zero-padded to a multiple of B); the input is the blocked
  value, else a ``to_nchwc`` of it, or (ungrouped, at most 4 channels: a first layer) the
  plain input read as it is. An ungrouped 3x3 stride-1 one of blocked input runs as
  Winograd F(4x4, 3x3) (``winograd=True``, its weights packed transformed) where that wins
  (``WINOGRAD_MIN_CHANNELS``, ``WINOGRAD_TILE_WEIGHTS``; ``TESSERA_NCHWC_WINOGRAD=0`` never,
  ``=1`` wherever it applies); within ``plain_weights()`` the plain weights of each such
  layer are collected (an exported library transforms them at load);
* relu, hardtanh and clamp of a blocked value fold into the convolution that made it
  (where that value has no other reader and the convolution no activation yet), and so
  does an add of two blocked values (as its residual); otherwise they run on the blocked
  values as they are, when they keep zero at zero (the padding channels stay zero);
* max and average pooling (``max_pool_values``, ``avg_pool``), adaptive average pooling
  to sizes dividing the input (``interpolate`` in area mode: global pooling) and a mean
  over H and W of a blocked value become ``pool2d_nchwc``;
* any other reader of a blocked value, and the graph's results, read a ``from_nchwc`` of
  it (one per value).

Grouped convolutions other than depthwise, convolutions of other dtypes or ranks, of
other padding modes (a ``pad`` before them) and weights that change (a training graph)
are left alone, and so are graphs compiled for another backend (TVM, XLA: the ops are
tessera's executor's and the C library's). Only where the C kernels run
(``tessera.kernels.nchwc.usable``); after ``bnfold`` and ``conv_epilogue`` (folded batch
norms' shifts are biases, epilogues already found), before fusion.

``TESSERA_NCHWC=0`` turns it off, ``=1`` on wherever it applies; by default (``auto``) it
runs on graphs with at least two convolutions it can block (one lone convolution, a ViT's
patch embedding, gains nothing), however few their channels, and leaves plain the large
3x3 layers the plain path runs as Winograd (``WINOGRAD_MACS``) unless the blocked Winograd
takes them. Why, from ``python -m bench
models`` (CPU time at one thread, blocked vs plain): ResNet-18 b1 16 vs 20 ms, b8 124 vs
131; MobileNetV2 b1 4.5 vs 7.4, b8 35 vs 53; ResNet-50 b1 40 vs 55; VGG-11's 0.9-1.9 G MAC
layers 1.3-2.1x slower blocked than Winograd; and from ``python -m bench cputime`` (its
blocked table): channels well under a block pay too, LeNet-5 (1->6, 6->16) b1 0.10 vs 0.19
ms, b64 1.6 vs 2.1, the ``cnn`` workload's model (1->32, 32->64) b1 0.39 vs 0.71, b64 12.9
vs 15.4.

The graph's convolutions run in one C library of the register tiles they reach
(``tessera.kernels.nchwc.expect_tiles``): a second or two of compiling on a cold kernel
cache, where every tile takes half a minute.

>>> from tessera.graph.passes import nchwc
>>> nchwc.mode() in ("0", "1", "auto")
True
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.graph.ir import Graph, Node, Value
from tessera.graph.passes.constfold import known_variables, new_variable
from tessera.graph.passes.conv_epilogue import _activation
from tessera.ops import nchwc as ops
from tessera.ops.registry import REGISTRY, Meta

__all__ = ["run", "mode", "block", "plain_weights"]

PLAIN_CHANNELS = 4   # a first convolution of at most this many channels reads plain input
# auto mode: a graph needs this many blockable convolutions, of any size (one gains nothing;
# LeNet-5's two of 1->6 and 6->16 channels run 1.9x faster blocked: bench cputime)
MIN_CONVS = 2
# auto mode: a 3x3 convolution the plain path runs as Winograd (2.25x fewer products) stays
# plain from this many multiply-adds (bench models, vgg11_bn b1 at one thread: 0.9-1.9 G
# MAC layers 1.3-2.1x faster plain; ResNet-18's 0.12 G and VGG's 0.46 G faster blocked)
WINOGRAD_MACS = 600_000_000
# blocked Winograd F(4x4, 3x3) for 3x3 stride-1 layers of at least these channels in and
# out, and at most this many C x O weight pairs per 4x4 output tile of the batch: each item
# reads U (36 C O floats, 4x the direct weights), which the tiles must amortize. Why,
# ``python -m bench.kernels nchwc_winograd`` (CPU time, one thread, AVX-512): ResNet-18's
# 64ch 56x56 layer at batch 1 (21 pairs a tile) 0.39x the direct one's time, 128ch 28x28
# (334) 0.35x, 256ch 14x14 (4096) 0.48x, 512ch 7x7 (65536) 1.7x, at batch 8 (8192)
# 0.78x; the whole ResNet-18 graph, one thread: batch 1 11.6 ms against 14.1 with its 7x7
# layers too, batch 8 83 against 89 without them. Fewer channels: the transforms' share
# grows (16 keeps LeNet-sized layers direct).
WINOGRAD_MIN_CHANNELS = 16
WINOGRAD_TILE_WEIGHTS = 8192


def mode() -> str:
    """``TESSERA_NCHWC``: "0" (off), "1" (on wherever it applies) or "auto" (the default)."""
    v = os.environ.get("TESSERA_NCHWC", "auto").strip().lower()
    return v if v in ("0", "1") else "auto"


def block() -> int | None:
    """B for this CPU where the C kernels run, else None (the pass does nothing)."""
    try:
        from tessera.kernels import nchwc as K
    except ImportError:  # the kernels are not part of this build
        return None
    return K.block() if K.usable() else None


def _backward(g: Graph) -> bool:
    return any(n.op.name.endswith(("_grad", "_backward")) for n in g.nodes)


def _emit(g: Graph, op: str, inputs: list, attrs: dict, name: str) -> Node:
    opdef = REGISTRY[op]
    m = opdef.infer(*[Meta(v.shape, v.dtype) if isinstance(v, Value) else v
                      for v in inputs], **attrs)
    n = Node(opdef, list(inputs), dict(attrs), [], name)
    n.outputs = [Value(g.fresh(), m.shape, m.dtype, n, 0)]
    return n


def _zero_at_zero(n: Node) -> bool:
    """An elementwise op of one blocked value that maps 0 to 0 (the padding channels)."""
    act = _activation(n)
    if act is None:
        return False
    kind, (lo, hi) = act
    return kind == "relu" or lo <= 0.0 <= hi


class _Rewrite:
    def __init__(self, g: Graph, ctx, known: dict, blk: int, auto: bool):
        self.g, self.ctx, self.known, self.block, self.auto = g, ctx, known, blk, auto
        self.users = g.users()
        self.roots = {id(v) for v in g.live_roots()}
        self.nodes: list[Node] = []
        self.blocked: dict[int, Value] = {}     # id(plain value) -> its blocked value
        self.channels: dict[int, int] = {}      # id(blocked value) -> real channels
        self.made: set[int] = set()             # plain values a from_nchwc gives again
        self.to: dict[int, Value] = {}          # id(plain value) -> its to_nchwc
        self.packed: dict[tuple, Value] = {}
        self.convs = 0

    # ---- helpers -----------------------------------------------------------------------
    def _only_reader(self, v: Value, n: Node) -> bool:
        us = self.users.get(v, [])
        return len(us) == 1 and us[0] is n and id(v) not in self.roots

    def _add(self, n: Node) -> Value:
        self.nodes.append(n)
        return n.outputs[0]

    def _set(self, plain: Value, out: Value, channels: int) -> None:
        self.blocked[id(plain)] = out
        self.channels[id(out)] = channels

    def _blocked_input(self, v: Value, name: str) -> Value:
        if id(v) in self.blocked:
            return self.blocked[id(v)]
        if id(v) not in self.to:
            self.to[id(v)] = self._add(_emit(self.g, "to_nchwc", [v], {"block": self.block},
                                             name))
            self.channels[id(self.to[id(v)])] = v.shape[1]
        return self.to[id(v)]

    def _variable(self, a: np.ndarray) -> Value:
        t = Tensor._from_numpy(np.ascontiguousarray(a, np.float32))
        return new_variable(self.g, self.ctx, t, prefix="_nchwc")

    def _array(self, v) -> np.ndarray | None:
        if not isinstance(v, Value) or id(v) not in self.known:
            return None
        return self.known[id(v)]._to_numpy()

    # ---- rules -------------------------------------------------------------------------
    def conv(self, n: Node) -> bool:
        x, w, b = n.inputs[:3]
        r = n.inputs[3] if len(n.inputs) > 3 else None
        a = n.attrs
        wv = self._array(w)
        if not isinstance(x, Value) or len(x.shape) != 4 or x.dtype is not D.float32 or \
                wv is None or w.dtype is not D.float32 or len(w.shape) != 4 or \
                0 in x.shape or (b is not None and self._array(b) is None) or \
                len(a["stride"]) != 2:
            return False
        o, cg = w.shape[:2]
        c, groups = x.shape[1], a["groups"]
        if not (groups == 1 or groups == c == o and cg == 1):
            return False
        if x.producer is not None and x.producer.op.name == "pad":
            return False  # reflect, replicate or circular padding: a plain layer
        plain = groups == 1 and c <= PLAIN_CHANNELS and id(x) not in self.blocked
        wino = not plain and _blocked_winograd(x.shape, w.shape, n.outputs[0].shape, a)
        if self.auto and not wino and _winograd_wins(x, w, n.outputs[0], a):
            return False
        xin = x if plain else self._blocked_input(x, n.name)
        geo = dict(stride=tuple(a["stride"]), pads=tuple(map(tuple, a["pads"])),
                   dilation=tuple(a["dilation"]))
        key = (id(w), plain, wino)
        if key not in self.packed:
            self.packed[key] = self._variable(ops.pack_conv_weight(
                wv, groups=groups, block=self.block, plain_input=plain, winograd=wino))
            found = _PLAIN.get()
            if wino and found is not None:
                found[self.packed[key].name] = np.ascontiguousarray(wv, np.float32)
        bv = self._array(b)
        bias = None if bv is None else self._variable(ops.pad_bias(bv.reshape(-1), self.block))
        rin = None if r is None else self._blocked_input(r, n.name)
        attrs = dict(geo, groups=groups, block=self.block, plain_input=plain,
                     activation=a.get("activation"), bounds=tuple(a.get("bounds", (0.0, 0.0))),
                     residual_first=bool(a.get("residual_first", False)),
                     weight_shape=tuple(w.shape), winograd=wino)
        out = self._add(_emit(self.g, "conv2d_nchwc", [xin, self.packed[key], bias, rin],
                              attrs, n.name))
        self._set(n.outputs[0], out, o)
        self.convs += 1
        return True

    def _foldable(self, v: Value, n: Node) -> Node | None:
        """The conv2d_nchwc making v's blocked value, if n may fold into it."""
        p = self.blocked[id(v)].producer
        if p is None or p.op.name != "conv2d_nchwc" or not self._only_reader(v, n) or \
                p.attrs["activation"] is not None:
            return None
        return p

    def _moved(self, p: Node) -> None:
        # the folded convolution now also reads what n read: it runs where n did
        self.nodes.remove(p)
        self.nodes.append(p)

    def activation(self, n: Node) -> bool:
        x = n.inputs[0]
        found = _activation(n)
        if not isinstance(x, Value) or id(x) not in self.blocked or found is None or \
                n.outputs[0].dtype is not x.dtype:
            return False
        p = self._foldable(x, n)
        if p is not None:
            p.attrs.update(activation=found[0], bounds=tuple(found[1]),
                           residual_first=p.inputs[3] is not None)
            self._moved(p)
            self._set(n.outputs[0], p.outputs[0], self.channels[id(p.outputs[0])])
            return True
        if not _zero_at_zero(n):
            return False
        xb = self.blocked[id(x)]
        out = self._add(_emit(self.g, n.op.name, [xb] + list(n.inputs[1:]), n.attrs, n.name))
        self._set(n.outputs[0], out, self.channels[id(xb)])
        return True

    def add(self, n: Node) -> bool:
        if n.attrs.get("alpha", 1) != 1 or len(n.inputs) != 2:
            return False
        a, b = n.inputs
        if not all(isinstance(v, Value) for v in (a, b)) or a.shape != b.shape or \
                a.dtype is not b.dtype or n.outputs[0].shape != a.shape:
            return False
        # a plain operand already reordered for another reader counts as blocked
        ab, bb = (self.blocked.get(id(v), self.to.get(id(v))) for v in (a, b))
        if ab is None or bb is None or (id(a) not in self.blocked and id(b) not in self.blocked):
            return False
        for v, other in ((a, bb), (b, ab)):
            p = self._foldable(v, n) if id(v) in self.blocked else None
            if p is not None and p.inputs[3] is None and other is not p.outputs[0]:
                p.inputs[3] = other
                p.attrs["residual_first"] = True
                self._moved(p)
                self._set(n.outputs[0], p.outputs[0], self.channels[id(p.outputs[0])])
                return True
        out = self._add(_emit(self.g, "add", [ab, bb], n.attrs, n.name))
        self._set(n.outputs[0], out, self.channels[id(ab)])
        return True

    def _pool(self, n: Node, kind: str, kernel, stride, padding, ceil_mode, include) -> bool:
        x = n.inputs[0]
        if not isinstance(x, Value) or id(x) not in self.blocked or len(x.shape) != 4:
            return False
        xb = self.blocked[id(x)]
        attrs = dict(kind=kind, kernel_size=tuple(kernel), stride=tuple(stride),
                     padding=tuple(padding), ceil_mode=bool(ceil_mode),
                     count_include_pad=bool(include))
        try:
            m = REGISTRY["pool2d_nchwc"].infer(Meta(xb.shape, xb.dtype), **attrs)
        except RuntimeError:
            return False
        if m.shape[2:4] != n.outputs[0].shape[2:]:
            return False
        out = self._add(_emit(self.g, "pool2d_nchwc", [xb], attrs, n.name))
        self._set(n.outputs[0], out, self.channels[id(xb)])
        return True

    def max_pool(self, n: Node) -> bool:
        a = n.attrs
        if len(a["kernel_size"]) != 2 or tuple(a["dilation"]) != (1, 1):
            return False
        return self._pool(n, "max", a["kernel_size"], a["stride"], a["padding"],
                          a["ceil_mode"], True)

    def avg_pool(self, n: Node) -> bool:
        a = n.attrs
        if len(a["kernel_size"]) != 2 or a.get("divisor_override") is not None:
            return False
        return self._pool(n, "avg", a["kernel_size"], a["stride"], a["padding"],
                          a["ceil_mode"], a["count_include_pad"])

    def adaptive_avg(self, n: Node) -> bool:
        x = n.inputs[0]
        if n.attrs.get("mode") != "area" or not isinstance(x, Value) or len(x.shape) != 4:
            return False
        (h, w), (oh, ow) = x.shape[2:], n.outputs[0].shape[2:]
        if not oh or not ow or h % oh or w % ow:
            return False
        k = (h // oh, w // ow)
        return self._pool(n, "avg", k, k, (0, 0), False, True)

    def mean(self, n: Node) -> bool:
        """A mean over H and W (global average pooling written as ``x.mean((2, 3))``)."""
        x, a = n.inputs[0], n.attrs
        if not isinstance(x, Value) or id(x) not in self.blocked or len(x.shape) != 4 or \
                a.get("dtype") is not None or a.get("dim") is None:
            return False
        dims = a["dim"] if isinstance(a["dim"], (tuple, list)) else (a["dim"],)
        if sorted(d % 4 for d in dims) != [2, 3] or len(dims) != 2:
            return False
        xb, (h, w) = self.blocked[id(x)], x.shape[2:]
        pooled = self._add(_emit(self.g, "pool2d_nchwc", [xb], dict(
            kind="avg", kernel_size=(h, w), stride=(h, w), padding=(0, 0), ceil_mode=False,
            count_include_pad=True), n.name))
        y, c = n.outputs[0], x.shape[1]
        if a.get("keepdim"):
            self._set(y, pooled, c)
            return True
        flat = self._add(_emit(self.g, "from_nchwc", [pooled], {"channels": c}, n.name))
        view = Node(REGISTRY["view"], [flat], {"shape": tuple(y.shape)}, [y], n.name)
        y.producer, y.index = view, 0
        self.nodes.append(view)
        return True

    # ---- the walk ----------------------------------------------------------------------
    def _plain(self, v: Value) -> None:
        """v (a value a blocked op now makes) computed again in the plain layout."""
        if id(v) in self.made:
            return
        xb = self.blocked[id(v)]
        op = REGISTRY["from_nchwc"]
        node = Node(op, [xb], {"channels": v.shape[1]}, [v], xb.producer.name
                    if xb.producer is not None else "")
        v.producer, v.index = node, 0
        self.nodes.append(node)
        self.made.add(id(v))

    def run(self) -> bool:
        rules = {"conv": self.conv, "conv_pointwise": self.conv, "relu": self.activation,
                 "hardtanh": self.activation, "clamp": self.activation, "add": self.add,
                 "max_pool_values": self.max_pool, "avg_pool": self.avg_pool,
                 "interpolate": self.adaptive_avg, "mean": self.mean}
        for n in list(self.g.nodes):
            rule = rules.get(n.op.name)
            if rule is not None and rule(n):
                continue
            for v in n.inputs:
                if isinstance(v, Value) and id(v) in self.blocked:
                    self._plain(v)
            self.nodes.append(n)
        for v in self.g.live_roots():
            if id(v) in self.blocked:
                self._plain(v)
        self.g.nodes = self.nodes
        return self.convs > 0


def winograd_mode() -> str:
    """``TESSERA_NCHWC_WINOGRAD``: "0" (every blocked 3x3 convolution direct), "1" (Winograd
    wherever it applies) or "auto" (the default: where it wins, ``_blocked_winograd``)."""
    v = os.environ.get("TESSERA_NCHWC_WINOGRAD", "auto").strip().lower()
    return v if v in ("0", "1") else "auto"


def _blocked_winograd(x: tuple, w: tuple, y: tuple, a: dict) -> bool:
    """Whether a blocked convolution runs as Winograd F(4x4, 3x3) (an ungrouped 3x3
    stride-1 undilated one of blocked input; ``WINOGRAD_MIN_CHANNELS``,
    ``WINOGRAD_TILE_WEIGHTS``)."""
    m = winograd_mode()
    if m == "0" or a["groups"] != 1 or tuple(w[2:]) != (3, 3) or \
            tuple(a["stride"]) != (1, 1) or tuple(a["dilation"]) != (1, 1):
        return False
    if m == "1":
        return True
    tiles = y[0] * -(-y[2] // 4) * -(-y[3] // 4)
    return min(w[0], w[1]) >= WINOGRAD_MIN_CHANNELS and \
        w[0] * w[1] <= WINOGRAD_TILE_WEIGHTS * tiles


def _winograd_wins(x: Value, w: Value, y: Value, a: dict) -> bool:
    """A large convolution the plain path runs as Winograd (``WINOGRAD_MACS``)."""
    from tessera.ops.conv import _path
    macs = int(np.prod(y.shape)) * int(np.prod(w.shape[1:]))
    if a["groups"] != 1 or macs < WINOGRAD_MACS:
        return False
    return _path("forward", x.shape, w.shape, a["stride"], a["pads"], a["dilation"],
                 y.shape[2:], np.float32) == "winograd"


def _blockable_convs(g: Graph, known: dict) -> int:
    count = 0
    for n in g.nodes:
        if n.op.name in ("conv", "conv_pointwise") and len(n.inputs[1].shape) == 4 and \
                id(n.inputs[1]) in known:
            x, w, groups = n.inputs[0], n.inputs[1], n.attrs["groups"]
            count += groups == 1 or groups == x.shape[1] == w.shape[0]
    return count


# where the pass records the Winograd layers' plain weights (``plain_weights``), if anywhere
_PLAIN: contextvars.ContextVar[dict | None] = contextvars.ContextVar("nchwc_plain",
                                                                      default=None)


@contextlib.contextmanager
def plain_weights() -> Iterator[dict]:
    """Within: {packed variable name: the plain (O, C, 3, 3) float32 weights} of every
    Winograd layer the pass packs, for an exporter that makes the transformed filters at
    load (``tessera.deploy``) instead of storing them, four times as large.

    >>> with plain_weights() as found:
    ...     pass
    >>> found
    {}
    """
    found: dict = {}
    token = _PLAIN.set(found)
    try:
        yield found
    finally:
        _PLAIN.reset(token)


def run(g: Graph, ctx) -> bool:
    m = mode()
    if m == "0" or ctx is None or ctx.training or ctx.backend != "tessera":
        return False
    known = known_variables(g, ctx)
    if not known or _backward(g):
        return False
    # counted before ``block()``: that builds the kernels, which a graph without
    # convolutions must not wait for
    if _blockable_convs(g, known) < (MIN_CONVS if m == "auto" else 1):
        return False
    blk = block()
    if blk is None:
        return False
    if not _Rewrite(g, ctx, known, blk, m == "auto").run():
        return False
    _expect_tiles(g, blk)
    return True


def _expect_tiles(g: Graph, blk: int) -> None:
    """Bind the graph's convolutions to one library of the register tiles they run
    (``tessera.kernels.nchwc.expect_tiles``): a few seconds of compiling, not the half
    minute of every tile."""
    from tessera.kernels import nchwc as K
    if not K.usable():   # (the NumPy kernels run the ops)
        return
    tiles: set = set()
    for n in g.nodes:
        if n.op.name == "conv2d_nchwc":
            tiles |= _conv_plan(n)[0]
    K.expect_tiles(tiles, blk)


def _conv_plan(n: Node) -> tuple[frozenset, int]:
    """The register tiles a conv2d_nchwc node can run and its plan's passes over the input
    blocks (``tessera.kernels.nchwc.conv_tiles``; the exported library's build reads them
    too)."""
    from tessera.kernels import nchwc as K
    x, y, a = n.inputs[0].shape, n.outputs[0].shape, n.attrs
    o, cg = a["weight_shape"][:2]
    (top, _), (left, _) = a["pads"]
    return K.conv_tiles((x[0], cg * a["groups"], x[2], x[3]), (y[0], o, y[2], y[3]),
                        a["weight_shape"], a["stride"], (top, left), a["dilation"],
                        a["groups"], a["block"], a["plain_input"], bool(a.get("winograd")))
