"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and their cells, with PyTorch's parameter
names (``weight_ih_l0``, ``weight_hh_l0_reverse``...), gate order and options.

The input projection of every time step is one GEMM over the whole sequence; only the
recurrent part runs step by step.
"""
from __future__ import annotations

import math

import tessera
from tessera.nn import init
from tessera.nn.modules.module import Module
from tessera.nn.parameter import Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _linear(x, w, b):
    out = x.matmul(w.t())
    return out if b is None else out + b


def _rnn_step(mode, gi, h, w_hh, b_hh, c=None):
    """One recurrent step given the precomputed input projection ``gi``."""
    gh = _linear(h, w_hh, b_hh)
    if mode == "RNN_TANH":
        return (gi + gh).tanh(), None
    if mode == "RNN_RELU":
        return (gi + gh).relu(), None
    if mode == "LSTM":
        i, f, g, o = (gi + gh).chunk(4, dim=-1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c
    r_i, z_i, n_i = gi.chunk(3, dim=-1)
    r_h, z_h, n_h = gh.chunk(3, dim=-1)
    r = (r_i + r_h).sigmoid()
    z = (z_i + z_h).sigmoid()
    n = (n_i + r * n_h).tanh()
    return (1 - z) * n + z * h, None


class RNNBase(Module):
    """The shared machinery of RNN, LSTM and GRU."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        if not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1 or \
                isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError("hidden_size must be an integer greater than zero")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError("num_layers must be an integer greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, \
            proj_size
        gate = _GATES[mode] * hidden_size
        dirs = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        kw = {"device": device, "dtype": dtype}
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(dirs):
                layer_in = input_size if layer == 0 else real_hidden * dirs
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                params = {f"weight_ih{sfx}": (gate, layer_in),
                          f"weight_hh{sfx}": (gate, real_hidden)}
                if bias:
                    params[f"bias_ih{sfx}"] = (gate,)
                    params[f"bias_hh{sfx}"] = (gate,)
                if proj_size > 0:
                    params[f"weight_hr{sfx}"] = (proj_size, hidden_size)
                for name, shape in params.items():
                    setattr(self, name, Parameter(tessera.empty(shape, **kw)))
                    self._flat_weights_names.append(name)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op kept for PyTorch compatibility (weights are always usable as they are)."""

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    def _w(self, kind: str, layer: int, d: int):
        return getattr(self, f"{kind}_l{layer}" + ("_reverse" if d else ""), None)

    def _run(self, x, h0, c0):
        """x: (T, N, F); h0/c0: (layers*dirs, N, H). Returns output, h_n, c_n."""
        import tessera.nn.functional as F
        dirs = 2 if self.bidirectional else 1
        T = x.size(0)
        hs, cs = [], []
        inp = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                idx = layer * dirs + d
                w_ih, w_hh = self._w("weight_ih", layer, d), self._w("weight_hh", layer, d)
                b_ih, b_hh = self._w("bias_ih", layer, d), self._w("bias_hh", layer, d)
                w_hr = self._w("weight_hr", layer, d)
                gi_all = _linear(inp, w_ih, b_ih)            # (T, N, gates): one GEMM
                h, c = h0[idx], (c0[idx] if c0 is not None else None)
                steps = range(T - 1, -1, -1) if d else range(T)
                seq = [None] * T
                for t in steps:
                    h, c = _rnn_step(self.mode, gi_all[t], h, w_hh, b_hh, c)
                    if w_hr is not None:
                        h = h.matmul(w_hr.t())
                    seq[t] = h
                outs.append(tessera.stack(seq) if T else gi_all.new_zeros(0, x.size(1),
                                                                          h.size(-1)))
                hs.append(h)
                cs.append(c)
            inp = outs[0] if dirs == 1 else tessera.cat(outs, dim=-1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        c_n = tessera.stack(cs) if self.mode == "LSTM" else None
        return inp, tessera.stack(hs), c_n

    def forward(self, input, hx=None):
        if isinstance(input, tuple) or type(input).__name__ == "PackedSequence":
            raise NotImplementedError("PackedSequence inputs are not supported; pad the batch "
                                      "(nn.utils.rnn.pad_sequence) instead")
        batched = input.dim() == 3
        if input.dim() not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                             f"{input.dim()}D instead")
        if input.size(-1) != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.size(-1)}")
        x = input if batched else input.unsqueeze(1)
        if self.batch_first and batched:
            x = x.transpose(0, 1)
        n = x.size(1)
        dirs = 2 if self.bidirectional else 1
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        h0 = c0 = None
        if hx is not None:
            if self.mode == "LSTM":
                h0, c0 = hx
            else:
                h0 = hx
            if not batched:
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
            expected = (self.num_layers * dirs, n, real_hidden)
            if tuple(h0.shape) != expected:
                raise RuntimeError(f"Expected hidden size {expected}, got {list(h0.shape)}")
        if h0 is None:
            h0 = tessera.zeros(self.num_layers * dirs, n, real_hidden, dtype=x.dtype)
        if self.mode == "LSTM" and c0 is None:
            c0 = tessera.zeros(self.num_layers * dirs, n, self.hidden_size, dtype=x.dtype)
        out, h_n, c_n = self._run(x, h0, c0)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        return (out, (h_n, c_n)) if self.mode == "LSTM" else (out, h_n)


class RNN(RNNBase):
    """Elman RNN with tanh or relu."""

    def __init__(self, *args, nonlinearity: str = "tanh", **kwargs):
        if len(args) > 3:  # RNN's positional order puts nonlinearity fourth
            args = list(args)
            nonlinearity = args.pop(3)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             "'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", *args,
                         **kwargs)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity != "tanh" else "")


class LSTM(RNNBase):
    """Long short-term memory; gates in PyTorch's order (input, forget, cell, output)."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """Gated recurrent unit; gates in PyTorch's order (reset, update, new)."""

    def __init__(self, *args, **kwargs):
        super().__init__("GRU", *args, **kwargs)


class RNNCellBase(Module):
    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = Parameter(tessera.empty((num_chunks * hidden_size, input_size), **kw))
        self.weight_hh = Parameter(tessera.empty((num_chunks * hidden_size, hidden_size), **kw))
        if bias:
            self.bias_ih = Parameter(tessera.empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(tessera.empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prep(self, input, hx, n_states):
        if input.dim() not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got "
                             f"{input.dim()}D instead")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            z = tessera.zeros(x.size(0), self.hidden_size, dtype=x.dtype)
            hx = z if n_states == 1 else (z, z)
        elif not batched:
            hx = hx.unsqueeze(0) if n_states == 1 else tuple(h.unsqueeze(0) for h in hx)
        return x, hx, batched


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx, 1)
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        h, _ = _rnn_step(mode, _linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                         self.bias_hh)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        x, (h, c), batched = self._prep(input, hx, 2)
        h, c = _rnn_step("LSTM", _linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                         self.bias_hh, c)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        x, h, batched = self._prep(input, hx, 1)
        h, _ = _rnn_step("GRU", _linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                         self.bias_hh)
        return h if batched else h.squeeze(0)
