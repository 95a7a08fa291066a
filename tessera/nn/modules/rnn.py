"""Recurrent layers: ``RNN``, ``LSTM`` (with ``proj_size``), ``GRU`` and their cells, with
PyTorch's parameter names (``weight_ih_l0``, ``weight_hh_l0_reverse``...), gate order
(LSTM: input, forget, cell, output; GRU: reset, update, new), options, checks and errors.

The input projection of every time step is one GEMM over the whole sequence (with both
biases folded into it where the gate math allows); only the recurrent GEMM and the gate
math run step by step. A ``PackedSequence`` input runs the same way on its packed rows: at
step t only the first ``batch_sizes[t]`` (longest) sequences advance, the others keep their
state, so each sequence's final state is the one at its own length, as in PyTorch.

>>> import tessera
>>> lstm = tessera.nn.LSTM(4, 8, num_layers=2, batch_first=True)
>>> out, (h, c) = lstm(tessera.randn(3, 5, 4))
>>> out.shape, h.shape
(tessera.Size([3, 5, 8]), tessera.Size([2, 3, 8]))
"""
from __future__ import annotations

import math
import numbers
import warnings

from tessera._dispatch import _MODES, composite_args
from tessera.nn import init
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter
from tessera.nn.utils.rnn import PackedSequence
from tessera.ops.creation import empty, zeros
from tessera.ops.shape import cat, stack

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _linear(x, w, b=None):
    from tessera.nn.functional import linear
    return linear(x, w, b)


def _step(mode: str, gi, h, c, w_hh_t, b_hh):
    """One time step from the input projection ``gi``: returns the new (h, c).

    ``w_hh_t`` is the transposed recurrent weight; ``b_hh`` is None when it was folded into
    ``gi`` already (everything but GRU, whose reset gate multiplies the hidden projection
    including its bias).
    """
    gh = h.matmul(w_hh_t)
    if b_hh is not None:
        gh = gh + b_hh
    if mode == "RNN_TANH":
        return (gi + gh).tanh(), None
    if mode == "RNN_RELU":
        return (gi + gh).relu(), None
    if mode == "LSTM":
        i, f, g, o = (gi + gh).chunk(4, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c
    sizes = [2 * h.size(-1), h.size(-1)]
    (gi_rz, gi_n), (gh_rz, gh_n) = gi.split(sizes, -1), gh.split(sizes, -1)
    r, z = (gi_rz + gh_rz).sigmoid().chunk(2, -1)
    n = (gi_n + r * gh_n).tanh()
    return n + z * (h - n), None   # = (1 - z) * n + z * h


class RNNBase(Module):
    """The shared machinery of RNN, LSTM and GRU."""

    __constants__ = ["mode", "input_size", "hidden_size", "num_layers", "bias", "batch_first",
                     "dropout", "bidirectional", "proj_size"]

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional = float(dropout), bidirectional
        self.proj_size = proj_size
        _check_rnn_args(mode, input_size, hidden_size, num_layers, bias, batch_first, dropout,
                        proj_size)
        gate = _GATES[mode] * hidden_size
        dirs = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        kw = {"device": device, "dtype": dtype}
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for d in range(dirs):
                layer_in = input_size if layer == 0 else real_hidden * dirs
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                shapes: dict[str, tuple[int, ...]] = {f"weight_ih{sfx}": (gate, layer_in),
                          f"weight_hh{sfx}": (gate, real_hidden)}
                if bias:
                    shapes[f"bias_ih{sfx}"] = (gate,)
                    shapes[f"bias_hh{sfx}"] = (gate,)
                if proj_size > 0:
                    shapes[f"weight_hr{sfx}"] = (proj_size, hidden_size)
                for name, shape in shapes.items():
                    setattr(self, name, Parameter(empty(shape, **kw)))
                self._flat_weights_names.extend(shapes)
                self._all_weights.append(list(shapes))
        self.reset_parameters()

    @property
    def _flat_weights(self) -> list:
        return [getattr(self, n, None) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list:
        return [[getattr(self, w) for w in ws] for ws in self._all_weights]

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op kept for PyTorch compatibility (cuDNN's packed weights do not apply)."""

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)

    # -- PyTorch's argument checks (public methods there too) --

    def check_input(self, input, batch_sizes=None) -> None:
        w0 = self._flat_weights[0]
        if input.dtype != w0.dtype:
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype "
                             f"({w0.dtype}). Convert input: input.to({w0.dtype}), or convert "
                             f"model: model.to({input.dtype})")
        expected = 2 if batch_sizes is not None else 3
        if input.dim() != expected:
            raise RuntimeError(f"input must have {expected} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.size(-1)}")

    def _mini_batch(self, input, batch_sizes) -> int:
        if batch_sizes is not None:
            return int(batch_sizes[0])
        return input.size(0) if self.batch_first else input.size(1)

    def get_expected_hidden_size(self, input, batch_sizes=None) -> tuple[int, int, int]:
        mini_batch = self._mini_batch(input, batch_sizes)
        dirs = 2 if self.bidirectional else 1
        hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        return (self.num_layers * dirs, mini_batch, hidden)

    def check_hidden_size(self, hx, expected_hidden_size,
                          msg: str = "Expected hidden size {}, got {}") -> None:
        if tuple(hx.shape) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(tuple(expected_hidden_size), list(hx.shape)))

    def check_forward_args(self, input, hidden, batch_sizes=None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    def permute_hidden(self, hx, permutation):
        return hx if permutation is None else hx.index_select(1, permutation)

    # -- the computation --

    def _layer_weights(self, layer: int, d: int):
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        return tuple(getattr(self, f"{k}{sfx}", None)
                     for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"))

    def _direction(self, inp, h, c, layer: int, d: int, batch_sizes=None):
        """One direction of one layer over the whole (T, N, F) sequence, or over the rows of
        packed data with its ``batch_sizes``."""
        w_ih, w_hh, b_ih, b_hh, w_hr = self._layer_weights(layer, d)
        fold = b_hh is not None and self.mode != "GRU"
        gi_all = _linear(inp, w_ih, (b_ih + b_hh) if fold else b_ih)   # (T, N, gates)
        steps = gi_all.unbind(0) if batch_sizes is None else gi_all.split(batch_sizes)
        w_hh_t = w_hh.t()
        w_hr_t = w_hr.t() if w_hr is not None else None
        seq = [None] * len(steps)
        for t in (range(len(steps) - 1, -1, -1) if d else range(len(steps))):
            n = steps[t].size(0)
            if n == h.size(0):
                h, c = self._cell_step(steps[t], h, c, w_hh_t, w_hr_t, fold, b_hh)
                seq[t] = h
                continue
            # packed: only the n longest sequences run at step t; the rest keep their state
            h_t, c_t = self._cell_step(steps[t], h[:n], None if c is None else c[:n], w_hh_t,
                                       w_hr_t, fold, b_hh)
            seq[t] = h_t
            h = cat([h_t, h[n:]])
            c = None if c is None else cat([c_t, c[n:]])
        return stack(seq) if batch_sizes is None else cat(seq), h, c

    def _cell_step(self, gi, h, c, w_hh_t, w_hr_t, fold: bool, b_hh):
        h, c = _step(self.mode, gi, h, c, w_hh_t, None if fold else b_hh)
        return (h if w_hr_t is None else h.matmul(w_hr_t)), c

    def _run(self, x, h0, c0=None, batch_sizes=None):
        """x: (T, N, F), or packed (rows, F) with ``batch_sizes``; h0/c0: (layers*dirs, N,
        H). Returns output, h_n, c_n."""
        import tessera.nn.functional as F
        if _MODES:  # autocast runs LSTM and RNN (not GRU) in its dtype, states included
            x, h0, c0 = composite_args(self.mode.lower(), (x, h0, c0))
        if batch_sizes is None and x.size(0) == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        dirs = 2 if self.bidirectional else 1
        hs, cs, inp = [], [], x
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                idx = layer * dirs + d
                out, h, c = self._direction(inp, h0[idx], c0[idx] if c0 is not None else None,
                                            layer, d, batch_sizes)
                outs.append(out)
                hs.append(h)
                cs.append(c)
            inp = outs[0] if dirs == 1 else cat(outs, dim=-1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        return inp, stack(hs), (stack(cs) if c0 is not None else None)

    def _forward_packed(self, packed, hx):
        """A PackedSequence in, a PackedSequence out; states in the caller's batch order."""
        data, batch_sizes, sorted_indices, unsorted_indices = packed
        sizes = [int(b) for b in batch_sizes.tolist()]
        dirs = 2 if self.bidirectional else 1
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        lstm = self.mode == "LSTM"
        if hx is None:
            hx = self._zeros(self.num_layers * dirs, sizes[0], real_hidden, data)
            if lstm:
                hx = (hx, self._zeros(self.num_layers * dirs, sizes[0], self.hidden_size,
                                      data))
        else:
            hx = self.permute_hidden(hx, sorted_indices)
        self.check_forward_args(data, hx, batch_sizes)
        h0, c0 = hx if lstm else (hx, None)
        out, h_n, c_n = self._run(data, h0, c0, sizes)
        hidden = (h_n, c_n) if lstm else h_n
        return (PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices),
                self.permute_hidden(hidden, unsorted_indices))

    def _zeros(self, n_layers_dirs: int, batch: int, size: int, like):
        return zeros(n_layers_dirs, batch, size, dtype=like.dtype, device=like.device)

    def _forward_single_state(self, input, hx):
        """RNN and GRU: one hidden state tensor."""
        name = "RNN" if self.mode.startswith("RNN") else self.mode
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D "
                             "tensor instead")
        batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not batched:
            input = input.unsqueeze(batch_dim)
            if hx is not None:
                if hx.dim() != 2:
                    raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but "
                                       f"got {hx.dim()}-D tensor")
                hx = hx.unsqueeze(1)
        elif hx is not None and hx.dim() != 3:
            raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got "
                               f"{hx.dim()}-D tensor")
        batch = input.size(0) if self.batch_first else input.size(1)
        dirs = 2 if self.bidirectional else 1
        if hx is None:
            hx = self._zeros(self.num_layers * dirs, batch, self.hidden_size, input)
        self.check_forward_args(input, hx, None)
        x = input.transpose(0, 1) if self.batch_first else input
        out, h_n, _ = self._run(x, hx)
        if self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out, h_n = out.squeeze(batch_dim), h_n.squeeze(1)
        return out, h_n


def _check_rnn_args(mode, input_size, hidden_size, num_layers, bias, batch_first,
                    dropout: float, proj_size) -> None:
    """PyTorch's constructor checks, in its order, with its exception types."""
    if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
            or not 0 <= dropout <= 1):
        raise ValueError("dropout should be a number in range [0, 1] representing the "
                         "probability of an element being zeroed")
    if dropout > 0 and num_layers == 1:
        warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                      "non-zero dropout expects num_layers greater than 1, but got "
                      f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
    for name, value, kind in (("bias", bias, bool), ("batch_first", batch_first, bool),
                              ("input_size", input_size, int)):
        if not isinstance(value, kind):
            raise TypeError(f"{name} should be of type {kind.__name__}, got: "
                            f"{type(value).__name__}")
    if input_size <= 0:
        raise ValueError("input_size must be greater than zero")
    if not isinstance(hidden_size, int):
        raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
    if hidden_size <= 0:
        raise ValueError("hidden_size must be greater than zero")
    if num_layers <= 0:
        raise ValueError("num_layers must be greater than zero")
    if not isinstance(num_layers, int):
        raise TypeError(f"'{type(num_layers).__name__}' object cannot be interpreted as an "
                        "integer")
    if proj_size < 0:
        raise ValueError("proj_size should be a positive integer or zero to disable "
                         "projections")
    if proj_size >= hidden_size:
        raise ValueError("proj_size has to be smaller than hidden_size")
    if mode not in _GATES:
        raise ValueError("Unrecognized RNN mode: " + mode)


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu).

    ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None)``
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:  # RNN's positional order puts nonlinearity fourth
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' "
                             "or 'relu'.")
        super().__init__(mode, *args, **kwargs)

    def forward(self, input, hx=None):
        """Returns ``(output, h_n)``."""
        return self._forward_single_state(input, hx)


class LSTM(RNNBase):
    """Long short-term memory; with ``proj_size > 0`` the hidden state is projected by
    ``weight_hr`` (the cell state keeps ``hidden_size``).

    ``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None)``
    """

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, input, batch_sizes=None) -> tuple[int, int, int]:
        mini_batch = self._mini_batch(input, batch_sizes)
        return (self.num_layers * (2 if self.bidirectional else 1), mini_batch,
                self.hidden_size)

    def check_forward_args(self, input, hidden, batch_sizes=None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden[0], self.get_expected_hidden_size(input, batch_sizes),
                               "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hidden[1], self.get_expected_cell_size(input, batch_sizes),
                               "Expected hidden[1] size {}, got {}")

    def permute_hidden(self, hx, permutation):
        if permutation is None:
            return hx
        return hx[0].index_select(1, permutation), hx[1].index_select(1, permutation)

    def forward(self, input, hx=None):
        """Returns ``(output, (h_n, c_n))``."""
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if input.dim() not in (2, 3):
            raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D "
                             "instead")
        batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not batched:
            input = input.unsqueeze(batch_dim)
        batch = input.size(0) if self.batch_first else input.size(1)
        dirs = 2 if self.bidirectional else 1
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        if hx is None:
            hx = (self._zeros(self.num_layers * dirs, batch, real_hidden, input),
                  self._zeros(self.num_layers * dirs, batch, self.hidden_size, input))
        else:
            want = 3 if batched else 2
            if hx[0].dim() != want or hx[1].dim() != want:
                kind = "batched 3-D" if batched else "unbatched 2-D"
                raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but "
                                   f"got ({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
            if not batched:
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        self.check_forward_args(input, hx, None)
        x = input.transpose(0, 1) if self.batch_first else input
        out, h_n, c_n = self._run(x, hx[0], hx[1])
        if self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out, h_n, c_n = out.squeeze(batch_dim), h_n.squeeze(1), c_n.squeeze(1)
        return out, (h_n, c_n)


class GRU(RNNBase):
    """Gated recurrent unit: ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``,
    ``h' = (1 - z) * n + z * h``.

    ``GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None)``
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    def forward(self, input, hx=None):
        """Returns ``(output, h_n)``."""
        return self._forward_single_state(input, hx)


class RNNCellBase(Module):
    """The shared parameters of the cells: ``weight_ih``, ``weight_hh``, ``bias_ih``,
    ``bias_hh`` with ``num_chunks`` gates."""

    __constants__ = ["input_size", "hidden_size", "bias"]

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = Parameter(empty((num_chunks * hidden_size, input_size), **kw))
        self.weight_hh = Parameter(empty((num_chunks * hidden_size, hidden_size), **kw))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if "bias" in self.__dict__ and self.bias is not True:
            s += ", bias={bias}"
        if "nonlinearity" in self.__dict__ and self.nonlinearity != "tanh":
            s += ", nonlinearity={nonlinearity}"
        return s.format(**self.__dict__)

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def _check_dims(self, input, states) -> bool:
        """PyTorch's rank checks; returns whether the input is batched."""
        name = type(self).__name__
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D "
                             "instead")
        for label, s in states:
            if s.dim() not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {s.dim()}D "
                                 "instead")
        return input.dim() == 2

    def _check_sizes(self, x, hs) -> None:
        """The checks PyTorch's cell kernels make on the (batched) input and states."""
        if x.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {x.size(1)} expected "
                               f"{self.input_size}")
        for i, h in enumerate(hs):
            if x.size(0) != h.size(0):
                raise RuntimeError(f"Input batch size {x.size(0)} doesn't match hidden{i} "
                                   f"batch size {h.size(0)}")
            if h.size(1) != self.hidden_size:
                raise RuntimeError(f"hidden{i} has inconsistent hidden_size: got {h.size(1)}, "
                                   f"expected {self.hidden_size}")

    def _cell(self, mode: str, x, h, c=None):
        gi = _linear(x, self.weight_ih, self.bias_ih)
        return _step(mode, gi, h, c, self.weight_hh.t(), self.bias_hh)


class RNNCell(RNNCellBase):
    """One Elman RNN step: ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu)."""

    __constants__ = ["input_size", "hidden_size", "bias", "nonlinearity"]

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        batched = self._check_dims(input, [("hidden", hx)] if hx is not None else [])
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            hx = zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
        elif not batched:
            hx = hx.unsqueeze(0)
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        self._check_sizes(x, [hx])
        h, _ = self._cell("RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU", x, hx)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step: returns ``(h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        states = [(f"hx[{i}]", s) for i, s in enumerate(hx)] if hx is not None else []
        batched = self._check_dims(input, states)
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            z = zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
            hx = (z, z)
        elif not batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        self._check_sizes(x, hx)
        h, c = self._cell("LSTM", x, hx[0], hx[1])
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        batched = self._check_dims(input, [("hidden", hx)] if hx is not None else [])
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            hx = zeros(x.size(0), self.hidden_size, dtype=x.dtype, device=x.device)
        elif not batched:
            hx = hx.unsqueeze(0)
        self._check_sizes(x, [hx])
        h, _ = self._cell("GRU", x, hx)
        return h if batched else h.squeeze(0)
