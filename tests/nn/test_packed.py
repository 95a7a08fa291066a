"""``PackedSequence`` and the packing utilities of ``nn.utils.rnn``, and RNN/LSTM/GRU on
packed input, against PyTorch.

The recurrent layers get PyTorch's weights (``compare`` copies the state_dict), a padded
batch of sequences of different lengths is packed in both libraries (sorted, or unsorted
with ``enforce_sorted=False``), and the packed outputs (data, batch_sizes, sorted and
unsorted indices), the final states (each sequence's own last step) and the gradients of the
padded input, of the initial states and of every weight are compared.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera
from tests.nn.test_attention_transformer import DTYPES, compare, npy, raises_like_torch

T, N, F_IN, HID = 6, 4, 3, 5
SORTED, UNSORTED = [6, 4, 4, 1], [3, 6, 1, 4]


def _make(kind, **kw):
    def make(L_):
        if kind.startswith("RNN"):
            return L_.nn.RNN(F_IN, HID, nonlinearity=kind[4:], **kw)
        return getattr(L_.nn, kind)(F_IN, HID, **kw)
    return make


def _fwd(lengths, batch_first=False, with_state=False, unpack=False):
    def fwd(m, L_, T_):
        rnn = L_.nn.utils.rnn
        packed = rnn.pack_padded_sequence(T_("x"), lengths, batch_first=batch_first,
                                          enforce_sorted=lengths == SORTED)
        hx = None
        if with_state:
            hx = (T_("h0"), T_("c0")) if m.mode == "LSTM" else T_("h0")
        out, state = m(packed, hx)
        assert isinstance(out, rnn.PackedSequence)
        if unpack:
            return rnn.pad_packed_sequence(out, batch_first=batch_first, padding_value=-2.0,
                                           total_length=T + 1), state
        return out, state
    return fwd


def _arrays(rng, num_layers=1, bidirectional=False, batch_first=False, proj_size=0):
    dirs = 2 if bidirectional else 1
    return {"x": rng.standard_normal((N, T, F_IN) if batch_first else (T, N, F_IN)),
            "h0": rng.standard_normal((num_layers * dirs, N, proj_size or HID)),
            "c0": rng.standard_normal((num_layers * dirs, N, HID))}


OPTIONS = [
    ("sorted", {}, {"lengths": SORTED}),
    ("unsorted", {}, {"lengths": UNSORTED}),
    ("deep_bidir_unsorted_state", {"num_layers": 2, "bidirectional": True},
     {"lengths": UNSORTED, "with_state": True}),
    ("batch_first_bidir_unpack", {"bidirectional": True, "batch_first": True},
     {"lengths": UNSORTED, "batch_first": True, "unpack": True}),
    ("sorted_state_no_bias", {"bias": False, "num_layers": 2},
     {"lengths": SORTED, "with_state": True}),
]
KINDS = ("RNN_tanh", "RNN_relu", "LSTM", "GRU")
CASES = [(k, *o) for k in KINDS for o in OPTIONS] + [
    ("LSTM", "proj_bidir_state", {"proj_size": 2, "bidirectional": True, "num_layers": 2},
     {"lengths": UNSORTED, "with_state": True})]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("kind,name,ckw,fkw", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_recurrent_layers_on_packed_input_match_torch(kind, name, ckw, fkw, dtype):
    akw = {k: v for k, v in ckw.items() if k in ("num_layers", "bidirectional", "batch_first",
                                                 "proj_size")}
    arrays = _arrays(np.random.default_rng(len(name)), **akw)
    compare(_make(kind, **ckw), _fwd(**fkw), arrays, dtype, train=True)


def test_final_state_is_each_sequences_own_last_step():
    """h_n of a packed batch equals running each sequence alone (both directions)."""
    rng = np.random.default_rng(5)
    seqs = [tessera.tensor(rng.standard_normal((n, F_IN))) for n in UNSORTED]
    gru = tessera.nn.GRU(F_IN, HID, bidirectional=True).double()
    _, h_n = gru(tessera.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False))
    for b, s in enumerate(seqs):
        _, h_alone = gru(s)                                   # unbatched (L, F)
        np.testing.assert_allclose(npy(h_n[:, b]), npy(h_alone), rtol=1e-12, atol=1e-12)


def test_dropout_between_layers_runs_on_packed_data():
    lstm = tessera.nn.LSTM(F_IN, HID, num_layers=2, dropout=0.5)
    x = tessera.randn(T, N, F_IN)
    p = tessera.nn.utils.rnn.pack_padded_sequence(x, SORTED)
    out, _ = lstm(p)
    assert tuple(out.data.shape) == (sum(SORTED), HID)


# ---- the utilities -----------------------------------------------------------------------------

def _both(fn, arrays, grads=True):
    """Run ``fn(L, tensors)`` in both libraries; compare outputs and input gradients."""
    res = {}
    for L_ in (torch, tessera):
        ts = {k: L_.tensor(v.copy(), requires_grad=grads and v.dtype.kind == "f")
              for k, v in arrays.items()}
        out = fn(L_, ts)
        flat = [o for o in (out if isinstance(out, (tuple, list)) else [out])]
        flat = [x for o in flat for x in (o if isinstance(o, (tuple, list)) else [o])]
        diff = [o for o in flat if o is not None and o.requires_grad]
        if diff:
            sum((o * (o.detach() * 0 + 1.5)).sum() for o in diff).backward()
        res[L_] = flat, {k: t.grad for k, t in ts.items()}
    (fo, go), (fr, gr) = res[tessera], res[torch]
    assert len(fo) == len(fr)
    for o, r in zip(fo, fr):
        if r is None:
            assert o is None
            continue
        assert o.dtype.name == str(r.dtype).split(".")[-1]
        np.testing.assert_array_equal(npy(o), npy(r))
    for k in arrays:
        if gr[k] is not None:
            np.testing.assert_array_equal(npy(go[k]), npy(gr[k]))


@pytest.mark.parametrize("lengths,kw", [
    (SORTED, {}), (UNSORTED, {"enforce_sorted": False}),
    ([2, 1, 2, 1], {"enforce_sorted": False}),
    ([6, 6, 6, 6], {}),
    (torch.tensor(SORTED, dtype=torch.int32), {}),
    ([4.0, 2.0, 2.0, 1.0], {}),
])
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_then_pad_matches_torch(lengths, kw, batch_first):
    x = np.random.default_rng(0).standard_normal((N, T, 2) if batch_first else (T, N, 2))

    def fn(L_, ts):
        lens = L_.tensor(lengths.numpy()) if isinstance(lengths, torch.Tensor) else lengths
        p = L_.nn.utils.rnn.pack_padded_sequence(ts["x"], lens, batch_first=batch_first, **kw)
        padded = L_.nn.utils.rnn.pad_packed_sequence(p, batch_first=batch_first,
                                                     padding_value=0.5)
        return tuple(p), padded
    _both(fn, {"x": x})


def test_pack_sequence_unpack_sequence_and_total_length():
    rng = np.random.default_rng(1)
    arrays = {f"s{i}": rng.standard_normal((n, 2)) for i, n in enumerate((3, 5, 1))}

    def fn(L_, ts):
        rnn = L_.nn.utils.rnn
        p = rnn.pack_sequence(list(ts.values()), enforce_sorted=False)
        return (tuple(p), rnn.unpack_sequence(p),
                rnn.pad_packed_sequence(p, total_length=7, batch_first=True))
    _both(fn, arrays)


def test_packed_sequence_is_a_named_tuple_with_torchs_methods():
    rnn = tessera.nn.utils.rnn
    p = rnn.pack_sequence([tessera.ones(3, 2), tessera.ones(1, 2)])
    data, batch_sizes, sorted_indices, unsorted_indices = p
    assert p._fields == ("data", "batch_sizes", "sorted_indices", "unsorted_indices")
    assert sorted_indices is None and unsorted_indices is None
    assert batch_sizes.tolist() == [2, 1, 1] and batch_sizes.dtype is tessera.int64
    assert p.double().data.dtype is tessera.float64 and p.to(tessera.float32) is p
    assert not p.is_cuda and isinstance(p.double(), rnn.PackedSequence)
    q = rnn.PackedSequence(data, batch_sizes, tessera.tensor([1, 0]))
    assert q.unsorted_indices.tolist() == [1, 0]
    assert rnn.invert_permutation(tessera.tensor([2, 0, 1])).tolist() == [1, 2, 0]
    assert repr(rnn.invert_permutation(None)) == "None"


@pytest.mark.parametrize("fn", [
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(4, 3, 2), [2, 4, 1]),
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(4, 3, 2), [4, 2, 0]),
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(4, 3, 2), [4, 2]),
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(4, 0, 2), []),
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(4, 3, 2), [[4, 2, 1]]),
    lambda L_: L_.nn.utils.rnn.pack_padded_sequence(L_.ones(3), [3]),
    lambda L_: L_.nn.utils.rnn.pack_sequence([L_.ones(1), L_.ones(2)]),
    lambda L_: L_.nn.utils.rnn.pad_packed_sequence(
        L_.nn.utils.rnn.pack_sequence([L_.ones(3), L_.ones(2)]), total_length=2),
    # a packed input's hidden state must match its batch (batch_sizes[0])
    lambda L_: L_.nn.GRU(2, 3)(L_.nn.utils.rnn.pack_sequence([L_.ones(3, 2), L_.ones(2, 2)]),
                               L_.zeros(1, 3, 3)),
    lambda L_: L_.nn.RNN(2, 3)(L_.nn.utils.rnn.pack_sequence([L_.ones(3, 4)])),
    lambda L_: L_.nn.RNN(2, 3)(L_.nn.utils.rnn.pack_sequence([L_.ones(3, 2).double()])),
])
def test_errors_match_torch(fn):
    raises_like_torch(fn)


def test_packed_lstm_checks_its_state_sizes():
    """PyTorch's LSTM.forward skips check_forward_args for packed input (and its kernel then
    returns states of the wrong batch); tessera checks them as for padded input."""
    p = tessera.nn.utils.rnn.pack_sequence([tessera.ones(3, 2)])
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size"):
        tessera.nn.LSTM(2, 3)(p, (tessera.zeros(1, 2, 3), tessera.zeros(1, 1, 3)))
