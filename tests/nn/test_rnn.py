"""RNN, LSTM (with projections), GRU, their cells and ``nn.utils.rnn`` against PyTorch.

As in test_attention_transformer.py: PyTorch's ``state_dict`` is copied into tessera, the same
inputs (and initial states) go through both, and the outputs, the final states and the
gradients of the input, of the initial states and of every weight are compared, in float64
tightly and in float32. Inter-layer dropout is compared in eval mode; in train mode its
effect is checked on its own (the random streams differ).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import tessera
from tests.nn.test_attention_transformer import (
    DTYPES,
    compare,
    norm_repr,
    npy,
    raises_like_torch,
    tol,
)

T, N, F_IN, HID = 5, 3, 4, 6


def _make(kind, *args, **kw):
    """``kind`` is RNN_tanh, RNN_relu, LSTM or GRU."""
    def make(L_):
        if kind.startswith("RNN"):
            return L_.nn.RNN(F_IN, HID, *args, nonlinearity=kind[4:], **kw)
        return getattr(L_.nn, kind)(F_IN, HID, *args, **kw)
    return make


def _arrays(rng, kind, num_layers=1, bidirectional=False, batch_first=False, proj_size=0):
    dirs = 2 if bidirectional else 1
    hout = proj_size or HID
    return {"x": rng.standard_normal((N, T, F_IN) if batch_first else (T, N, F_IN)),
            "h0": rng.standard_normal((num_layers * dirs, N, hout)),
            "c0": rng.standard_normal((num_layers * dirs, N, HID)),
            "ux": rng.standard_normal((T, F_IN)),
            "uh0": rng.standard_normal((num_layers * dirs, hout)),
            "uc0": rng.standard_normal((num_layers * dirs, HID))}


def _fwd(with_state=False, unbatched=False):
    def fwd(m, L_, T_):
        x = T_("ux" if unbatched else "x")
        if not with_state:
            return m(x)
        h = T_("uh0" if unbatched else "h0")
        if m.mode == "LSTM":
            return m(x, (h, T_("uc0" if unbatched else "c0")))
        return m(x, h)
    return fwd


KINDS = ("RNN_tanh", "RNN_relu", "LSTM", "GRU")
OPTIONS = [
    ("basic", {}, {}),
    ("two_layers", {"num_layers": 2}, {}),
    ("bidirectional", {"bidirectional": True}, {}),
    ("deep_bidir_batch_first", {"num_layers": 2, "bidirectional": True, "batch_first": True},
     {}),
    ("given_state", {"num_layers": 2}, {"with_state": True}),
    ("given_state_bidir_batch_first", {"bidirectional": True, "batch_first": True},
     {"with_state": True}),
    ("unbatched", {"num_layers": 2}, {"unbatched": True}),
    ("unbatched_state_batch_first", {"bidirectional": True, "batch_first": True},
     {"unbatched": True, "with_state": True}),
    ("no_bias", {"bias": False, "num_layers": 2}, {"with_state": True}),
    ("dropout_eval", {"num_layers": 3, "dropout": 0.4}, {}),
]
LSTM_PROJ = [
    ("proj", {"proj_size": 3}, {}),
    ("proj_deep_bidir_state", {"proj_size": 2, "num_layers": 2, "bidirectional": True},
     {"with_state": True}),
    ("proj_batch_first_unbatched", {"proj_size": 4, "batch_first": True, "bias": False},
     {"unbatched": True, "with_state": True}),
]
CASES = [(k, *o) for k in KINDS for o in OPTIONS] + [("LSTM", *o) for o in LSTM_PROJ]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kind,name,ckw,fkw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_recurrent_layers_match_torch(kind, name, ckw, fkw, dtype):
    akw = {k: v for k, v in ckw.items() if k in ("num_layers", "bidirectional", "batch_first",
                                                 "proj_size")}
    arrays = _arrays(np.random.default_rng(len(name)), kind, **akw)
    make = _make(kind, **ckw)
    if "dropout" not in name:
        compare(make, _fwd(**fkw), arrays, dtype, train=True)
    compare(make, _fwd(**fkw), arrays, dtype, train=False)


@pytest.mark.parametrize("kind", KINDS)
def test_inter_layer_dropout_in_train_mode(kind):
    """Dropout acts between layers only: the first layer's final state is untouched."""
    x = np.random.default_rng(0).standard_normal((T, N, F_IN)).astype(np.float32)
    for L_ in (torch, tessera):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = _make(kind, num_layers=2, dropout=0.5)(L_)
        out_t, h_t = m.train()(L_.tensor(x))
        out_e, h_e = m.eval()(L_.tensor(x))
        h_t, h_e = (h_t[0], h_e[0]) if kind == "LSTM" else (h_t, h_e)
        np.testing.assert_allclose(npy(h_t[0]), npy(h_e[0]), atol=1e-6)
        assert not np.allclose(npy(out_t), npy(out_e))


def _cell(kind, **kw):
    def make(L_):
        if kind.startswith("RNNCell"):
            return L_.nn.RNNCell(F_IN, HID, nonlinearity=kind[8:], **kw)
        return getattr(L_.nn, kind)(F_IN, HID, **kw)
    return make


def _cell_fwd(with_state, unbatched=False, steps=1):
    def fwd(m, L_, T_):
        x = T_("ux" if unbatched else "x")
        state = None
        if with_state:
            h = T_("uh" if unbatched else "h")
            state = (h, T_("uc" if unbatched else "c")) if isinstance(m, L_.nn.LSTMCell) else h
        outs = []
        for t in range(steps):   # the same cell unrolled: gradients through time
            state = m(x * (t + 1), state)
            outs.append(state)
        return outs
    return fwd


CELL_KINDS = ("RNNCell_tanh", "RNNCell_relu", "LSTMCell", "GRUCell")
CELL_OPTIONS = [("batched", {}, (False,)), ("batched_state", {}, (True,)),
                ("unbatched", {}, (False, True)), ("unbatched_state", {}, (True, True)),
                ("no_bias_unrolled", {"bias": False}, (True, False, 3)),
                ("unrolled", {}, (False, False, 4))]
CELL_CASES = [(k, *o) for k in CELL_KINDS for o in CELL_OPTIONS]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kind,name,ckw,fargs", CELL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CELL_CASES])
def test_cells_match_torch(kind, name, ckw, fargs, dtype):
    rng = np.random.default_rng(len(name))
    arrays = {"x": rng.standard_normal((N, F_IN)), "h": rng.standard_normal((N, HID)),
              "c": rng.standard_normal((N, HID)), "ux": rng.standard_normal(F_IN),
              "uh": rng.standard_normal(HID), "uc": rng.standard_normal(HID)}
    compare(_cell(kind, **ckw), _cell_fwd(*fargs), arrays, dtype, train=True)


def test_state_dicts_reprs_and_weight_lists():
    makes = [lambda L_: L_.nn.RNN(3, 5), lambda L_: L_.nn.RNN(3, 5, 2, "relu"),
             lambda L_: L_.nn.RNN(3, 5, nonlinearity="relu", bias=False, batch_first=True),
             lambda L_: L_.nn.LSTM(3, 5, 2, bidirectional=True, proj_size=2),
             lambda L_: L_.nn.LSTM(3, 5, 2, bias=False, proj_size=2, dropout=0.25),
             lambda L_: L_.nn.GRU(3, 5, 3, batch_first=True, bidirectional=True),
             lambda L_: L_.nn.RNNCell(3, 5, nonlinearity="relu"),
             lambda L_: L_.nn.RNNCell(3, 5, bias=False), lambda L_: L_.nn.LSTMCell(3, 5),
             lambda L_: L_.nn.GRUCell(3, 5, bias=False)]
    for make in makes:
        pm, tm = make(torch), make(tessera)
        assert norm_repr(repr(tm)) == repr(pm)
        ps, ts = pm.state_dict(), tm.state_dict()
        assert list(ps) == list(ts)
        assert [tuple(v.shape) for v in ps.values()] == [tuple(v.shape) for v in ts.values()]
        if hasattr(pm, "all_weights"):
            assert tm._flat_weights_names == pm._flat_weights_names
            assert tm._all_weights == pm._all_weights
            assert [[tuple(w.shape) for w in ws] for ws in tm.all_weights] == \
                   [[tuple(w.shape) for w in ws] for ws in pm.all_weights]
            assert all(w is getattr(tm, n) for w, n in zip(tm._flat_weights,
                                                           tm._flat_weights_names))
            tm.flatten_parameters()
            for attr in ("mode", "input_size", "hidden_size", "num_layers", "bias",
                         "batch_first", "dropout", "bidirectional", "proj_size"):
                assert getattr(tm, attr) == getattr(pm, attr), attr


def test_default_init_is_uniform_over_inverse_sqrt_hidden():
    for m in (tessera.nn.LSTM(16, 64, 2, proj_size=8), tessera.nn.GRUCell(16, 64)):
        bound = 1 / math.sqrt(64)
        for name, p in m.named_parameters():
            a = npy(p)
            assert np.abs(a).max() <= bound and np.abs(a).max() > 0.8 * bound, name


def test_training_steps_stay_in_step():
    """A few SGD steps of an LSTM language model keep the two libraries together."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((7, 2, F_IN)), rng.standard_normal((7, 2, 3))
    models = {}
    for L_ in (torch, tessera):
        class Model(L_.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = L_.nn.LSTM(F_IN, HID, 2, proj_size=4)
                self.head = L_.nn.Linear(4, 3)

            def forward(self, t):
                return self.head(self.rnn(t)[0])
        models[L_] = Model().double()
    models[tessera].load_state_dict({k: tessera.tensor(v.detach().numpy())
                                     for k, v in models[torch].state_dict().items()})
    for L_, m in models.items():
        opt = L_.optim.SGD(m.parameters(), lr=0.2, momentum=0.9)
        for _ in range(4):
            opt.zero_grad()
            loss = ((m(L_.tensor(x)) - L_.tensor(y)) ** 2).mean()
            loss.backward()
            opt.step()
    for (k, p), (_, t) in zip(models[torch].state_dict().items(),
                              models[tessera].state_dict().items()):
        np.testing.assert_allclose(npy(t), npy(p), **tol(np.float64), err_msg=k)


def _error_cases():
    def run(L_, make, x_shape, hx=None, dtype=None):
        m = make(L_)
        x = L_.randn(*x_shape) if dtype is None else L_.randn(*x_shape, dtype=dtype)
        return m(x) if hx is None else m(x, hx(L_))
    rnn, lstm = (lambda L_: L_.nn.RNN(3, 5, 2)), (lambda L_: L_.nn.LSTM(3, 5, 2, proj_size=2))
    return [
        lambda L_: run(L_, rnn, (4, 2, 4)),                                  # input size
        lambda L_: run(L_, rnn, (4, 2, 3, 1)),                               # 4-d input
        lambda L_: run(L_, rnn, (4, 2, 3), lambda L_: L_.zeros(2, 3, 5)),    # batch of h0
        lambda L_: run(L_, rnn, (4, 2, 3), lambda L_: L_.zeros(2, 5)),       # 2-d h0, batched
        lambda L_: run(L_, rnn, (4, 3), lambda L_: L_.zeros(2, 1, 5)),       # 3-d h0, unbatched
        lambda L_: run(L_, rnn, (0, 2, 3)),                                  # empty sequence
        lambda L_: run(L_, rnn, (4, 2, 3), dtype=L_.float64),                # dtype mismatch
        lambda L_: run(L_, lstm, (4, 2, 3), lambda L_: (L_.zeros(2, 2, 2), L_.zeros(2, 2, 2))),
        lambda L_: run(L_, lstm, (4, 2, 3), lambda L_: (L_.zeros(2, 2, 5), L_.zeros(2, 2, 5))),
        lambda L_: run(L_, lstm, (4, 2, 3), lambda L_: (L_.zeros(2, 2, 2), L_.zeros(2, 5))),
        lambda L_: run(L_, lstm, (4, 3), lambda L_: (L_.zeros(2, 1, 2), L_.zeros(2, 1, 5))),
        lambda L_: run(L_, lambda L_: L_.nn.GRU(3, 5), (4, 2, 3), lambda L_: L_.zeros(1, 2, 4)),
        lambda L_: L_.nn.RNN(3, 5, proj_size=0),
        lambda L_: L_.nn.GRU(3, 5, proj_size=2),
        lambda L_: L_.nn.RNN(3, 0),
        lambda L_: L_.nn.RNN(0, 5),
        lambda L_: L_.nn.RNN(3.0, 5),
        lambda L_: L_.nn.RNN(3, 5, bias=1),
        lambda L_: L_.nn.RNN(3, 5, batch_first=1),
        lambda L_: L_.nn.LSTM(3, 5, num_layers=0),
        lambda L_: L_.nn.LSTM(3, 5, num_layers=1.5),
        lambda L_: L_.nn.LSTM(3, 5, proj_size=5),
        lambda L_: L_.nn.LSTM(3, 5, proj_size=-1),
        lambda L_: L_.nn.GRU(3, 5, dropout=2),
        lambda L_: L_.nn.GRU(3, 5, dropout=True),
        lambda L_: L_.nn.RNN(3, 5, nonlinearity="sigmoid"),
        lambda L_: L_.nn.RNNCell(3, 5, nonlinearity="sigmoid")(L_.randn(2, 3)),
        lambda L_: L_.nn.RNNCell(3, 5)(L_.randn(2, 2, 3)),
        lambda L_: L_.nn.RNNCell(3, 5)(L_.randn(2, 3), L_.randn(1, 2, 5)),
        lambda L_: L_.nn.GRUCell(3, 5)(L_.randn(2, 4)),
        lambda L_: L_.nn.GRUCell(3, 5)(L_.randn(2, 3), L_.randn(3, 5)),
        lambda L_: L_.nn.RNNCell(3, 5)(L_.randn(2, 3), L_.randn(2, 4)),
        lambda L_: L_.nn.LSTMCell(3, 5)(L_.randn(2, 3), (L_.randn(2, 5), L_.randn(2, 2, 5))),
        lambda L_: L_.nn.LSTMCell(3, 5)(L_.randn(1, 2, 3)),
    ]


@pytest.mark.parametrize("fn", _error_cases())
def test_errors_match_torch(fn):
    raises_like_torch(fn)


def test_dropout_with_one_layer_warns():
    for L_ in (torch, tessera):
        with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater"):
            L_.nn.GRU(3, 5, dropout=0.3)


# ---- nn.utils.rnn ------------------------------------------------------------------------------

def _seqs(rng, lengths, trailing=()):
    return {f"s{i}": rng.standard_normal((n,) + trailing) for i, n in enumerate(lengths)}


PAD_CASES = [((3, 1, 4), (), {}), ((2, 5), (3,), {"batch_first": True}),
             ((4, 4), (2, 1), {"padding_value": -1.5}),
             ((1, 3, 2), (), {"padding_side": "left", "batch_first": True}),
             ((2, 0, 3), (2,), {"padding_side": "left", "padding_value": 7.0}),
             ((3,), (), {})]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("lengths,trailing,kw", PAD_CASES)
def test_pad_sequence_matches_torch(lengths, trailing, kw, dtype):
    arrays = _seqs(np.random.default_rng(0), lengths, trailing)

    def fwd(m, L_, T_):
        return L_.nn.utils.rnn.pad_sequence([T_(k) for k in arrays], **kw)
    compare(lambda L_: L_.nn.Identity(), fwd, arrays, dtype)


def test_pad_sequence_inputs_and_dtypes():
    from tessera.nn.utils.rnn import pad_sequence
    for L_ in (torch, tessera):
        seqs = (L_.ones(2), L_.ones(3))
        assert tuple(L_.nn.utils.rnn.pad_sequence(seqs).shape) == (3, 2)     # a tuple
        gen = (L_.ones(i) for i in (1, 2))
        assert tuple(L_.nn.utils.rnn.pad_sequence(gen).shape) == (2, 2)      # a generator
        assert tuple(L_.nn.utils.rnn.pad_sequence(L_.ones(2, 3)).shape) == (3, 2)
    out = pad_sequence([tessera.ones(2, dtype=tessera.int64), tessera.ones(3)], padding_value=1.5)
    ref = torch.nn.utils.rnn.pad_sequence([torch.ones(2, dtype=torch.int64), torch.ones(3)],
                                          padding_value=1.5)
    assert out.dtype is tessera.int64
    np.testing.assert_array_equal(npy(out), npy(ref))


@pytest.mark.parametrize("fn", [
    lambda L_: L_.nn.utils.rnn.pad_sequence([]),
    lambda L_: L_.nn.utils.rnn.pad_sequence([L_.ones(2, 3), L_.ones(3, 4)]),
    lambda L_: L_.nn.utils.rnn.pad_sequence([L_.ones(2)], padding_side="middle"),
    lambda L_: L_.nn.utils.rnn.pad_sequence(5),
    lambda L_: L_.nn.utils.rnn.pad_sequence([L_.ones(()), L_.ones(())]),
])
def test_pad_sequence_errors_match_torch(fn):
    raises_like_torch(fn)


@pytest.mark.parametrize("batch_first", [False, True])
def test_unpad_sequence_round_trip(batch_first):
    rng = np.random.default_rng(2)
    seqs = [rng.standard_normal((n, 2)) for n in (3, 1, 4)]
    lengths = [3, 1, 4]
    p = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in seqs], batch_first)
    t = tessera.nn.utils.rnn.pad_sequence([tessera.tensor(s) for s in seqs], batch_first)
    ref = torch.nn.utils.rnn.unpad_sequence(p.clone(), torch.tensor(lengths), batch_first)
    ours = tessera.nn.utils.rnn.unpad_sequence(t, tessera.tensor(lengths), batch_first)
    assert len(ours) == len(ref)
    for a, b, s in zip(ours, ref, seqs):
        np.testing.assert_array_equal(npy(a), npy(b))
        np.testing.assert_array_equal(npy(a), s)
