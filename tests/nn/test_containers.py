"""Containers against PyTorch: ``Sequential``, ``ModuleList``, ``ModuleDict``,
``ParameterList`` and ``ParameterDict`` (naming, indexing, slicing, mutation, repr,
state_dict keys, and the forward of a ``Sequential`` with copied weights)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch

import tessera

LIBS = (torch, tessera)


def both(fn):
    """``fn(lib)`` for PyTorch and tessera."""
    return fn(torch), fn(tessera)


def names(m) -> list[str]:
    return [n for n, _ in m.named_children()]


def kinds(m) -> list[str]:
    return [type(c).__name__ for c in m]


def norm_repr(s: str) -> str:
    return s.replace("torch.", "tessera.")


def _seq(L):
    return L.nn.Sequential(L.nn.Linear(2, 3), L.nn.ReLU(), L.nn.Linear(3, 4), L.nn.Tanh())


def test_sequential_forward_matches_torch_with_copied_weights():
    p, t = both(_seq)
    t.load_state_dict({k: tessera.tensor(v.detach().numpy()) for k, v in p.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
    px, tx = torch.tensor(x, requires_grad=True), tessera.tensor(x, requires_grad=True)
    po, to = p(px), t(tx)
    np.testing.assert_allclose(to.detach().numpy(), po.detach().numpy(), rtol=1e-5, atol=1e-6)
    po.sum().backward()
    to.sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-5, atol=1e-6)
    for (n, a), (m, b) in zip(p.named_parameters(), t.named_parameters()):
        assert n == m
        np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_sequential_naming_indexing_and_slicing():
    p, t = both(_seq)
    assert names(t) == names(p) == ["0", "1", "2", "3"]
    assert list(t.state_dict()) == list(p.state_dict())
    assert len(t) == len(p) == 4
    assert type(t[1]).__name__ == "ReLU" and t[-1] is t[3]
    for sl in (slice(1, 3), slice(None, None, 2), slice(-2, None), slice(3, 1, -1)):
        ps, ts = p[sl], t[sl]
        assert type(ts) is tessera.nn.Sequential
        assert names(ts) == names(ps) and kinds(ts) == kinds(ps)
    with pytest.raises(IndexError, match="index 4 is out of range"):
        t[4]
    assert kinds(t) == kinds(p)
    assert [type(m).__name__ for m in iter(t)] == kinds(p)


def test_sequential_from_ordered_dict_and_repr():
    def build(L):
        inner = L.nn.Sequential(L.nn.Linear(3, 3), L.nn.Dropout(0.1))
        return L.nn.Sequential(OrderedDict([("fc", L.nn.Linear(2, 3)), ("act", L.nn.ReLU()),
                                            ("block", inner), ("norm", L.nn.LayerNorm(3))]))
    p, t = both(build)
    assert names(t) == names(p) == ["fc", "act", "block", "norm"]
    assert list(t.state_dict()) == list(p.state_dict())
    assert repr(t) == repr(p)
    assert repr(tessera.nn.Sequential()) == repr(torch.nn.Sequential()) == "Sequential()"
    assert type(t[1:]).__name__ == "Sequential" and names(t[1:]) == names(p[1:])


def test_sequential_mutation_matches_torch():
    def ops(L):
        s = L.nn.Sequential(L.nn.Linear(1, 2), L.nn.ReLU())
        s.append(L.nn.Linear(2, 3))
        s.insert(1, L.nn.Tanh())
        s.insert(-1, L.nn.Sigmoid())
        s.extend([L.nn.ReLU(), L.nn.Identity()])
        s[0] = L.nn.Linear(1, 2, bias=False)
        del s[2]
        popped = s.pop(0)
        s += L.nn.Sequential(L.nn.ELU())
        doubled = s * 2
        added = s + L.nn.Sequential(L.nn.GELU())
        del s[1:3]
        return s, popped, doubled, added
    (ps, pp, pd, pa), (ts, tp, td, ta) = both(ops)
    for a, b in ((ps, ts), (pd, td), (pa, ta)):
        assert names(b) == names(a) and kinds(b) == kinds(a)
        assert repr(b) == repr(a)
    assert repr(tp) == repr(pp)
    assert td[0] is td[len(td) // 2]  # repeats share the modules, like PyTorch


def test_sequential_errors_match_torch():
    for lib in LIBS:
        s = lib.nn.Sequential(lib.nn.ReLU())
        with pytest.raises(ValueError, match="add operator supports only objects"):
            s + [lib.nn.ReLU()]
        with pytest.raises(ValueError, match="Non-positive multiplication factor"):
            s * 0
        with pytest.raises(TypeError, match="unsupported operand type"):
            s * 1.5
        with pytest.raises(IndexError, match="Index out of range: 5"):
            s.insert(5, lib.nn.ReLU())
        with pytest.raises(AssertionError):
            s.insert(0, "not a module")


def test_sequential_imul_and_dir():
    for lib in LIBS:
        s = lib.nn.Sequential(lib.nn.ReLU(), lib.nn.Tanh())
        s *= 3
        assert len(s) == 6 and s[0] is s[2] is s[4]
        assert not any(k.isdigit() for k in dir(s))


def test_module_list():
    def build(L):
        ml = L.nn.ModuleList([L.nn.Linear(2, 2) for _ in range(3)])
        ml.append(L.nn.ReLU())
        ml.extend([L.nn.Tanh(), L.nn.Tanh()])
        ml.insert(1, L.nn.Sigmoid())
        ml += [L.nn.Identity()]
        return ml
    p, t = both(build)
    assert names(t) == names(p) and kinds(t) == kinds(p)
    assert list(t.state_dict()) == list(p.state_dict())
    assert repr(t) == repr(p)   # runs of equal modules print as "(2-3): 2 x Linear(...)"
    assert type(t[1:4]) is tessera.nn.ModuleList and kinds(t[1:4]) == kinds(p[1:4])
    assert kinds(t[::-2]) == kinds(p[::-2])
    del p[0], t[0]
    del p[::3], t[::3]
    assert names(t) == names(p) and kinds(t) == kinds(p)
    assert type(t.pop(-1)).__name__ == type(p.pop(-1)).__name__
    assert kinds(t) == kinds(p)
    combined = t + tessera.nn.ModuleList([tessera.nn.ReLU()])
    assert len(combined) == len(t) + 1
    with pytest.raises(IndexError, match="index 10 is out of range"):
        t[10]
    with pytest.raises(TypeError, match="ModuleList.extend should be called with an iterable"):
        t.extend(5)
    assert repr(tessera.nn.ModuleList()) == repr(torch.nn.ModuleList()) == "ModuleList()"
    t[0] = tessera.nn.GELU()
    assert type(t[0]).__name__ == "GELU"


def test_module_list_shared_module_registers_once():
    for lib in LIBS:
        lin = lib.nn.Linear(2, 2)
        ml = lib.nn.ModuleList([lin, lin])
        assert len(list(ml.parameters())) == 2
        assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias"]
        assert len(list(ml.named_parameters(remove_duplicate=False))) == 4


def test_module_dict():
    def build(L):
        md = L.nn.ModuleDict({"b": L.nn.Linear(1, 2), "a": L.nn.ReLU()})
        md["c"] = L.nn.Tanh()
        md.update([("d", L.nn.Sigmoid()), ("a", L.nn.GELU())])
        md.update(OrderedDict([("e", L.nn.Identity())]))
        return md
    p, t = both(build)
    assert list(t.keys()) == list(p.keys()) == ["b", "a", "c", "d", "e"]
    assert [type(v).__name__ for v in t.values()] == [type(v).__name__ for v in p.values()]
    assert [k for k, _ in t.items()] == list(p.keys()) == list(iter(t))
    assert repr(t) == repr(p)
    assert list(t.state_dict()) == list(p.state_dict())
    assert "c" in t and "z" not in t and len(t) == 5
    assert type(t.pop("c")).__name__ == "Tanh" and "c" not in t
    del t["a"]
    assert list(t.keys()) == ["b", "d", "e"]
    t.clear()
    assert len(t) == 0
    for lib in LIBS:
        with pytest.raises(TypeError, match="should be called with an iterable"):
            lib.nn.ModuleDict().update(3)
        with pytest.raises(ValueError, match="has length 3; 2 is required"):
            lib.nn.ModuleDict([("a", lib.nn.ReLU(), 1)])


def test_parameter_list():
    def build(L):
        pl = L.nn.ParameterList([L.nn.Parameter(L.ones(2, 3)), L.zeros(4)])
        pl.append(L.ones(1, dtype=L.float64))
        pl.extend([L.nn.Parameter(L.ones(2)), "not a tensor"])
        return pl
    p, t = both(build)
    assert len(t) == len(p) == 5
    assert all(isinstance(x, tessera.nn.Parameter) for x in list(t)[:4])
    assert t[4] == "not a tensor"
    assert [n for n, _ in t.named_parameters()] == [n for n, _ in p.named_parameters()]
    assert list(t.state_dict()) == list(p.state_dict())
    assert repr(t) == norm_repr(repr(p))
    sl = t[1:3]
    assert type(sl) is tessera.nn.ParameterList and sl[0] is t[1]
    t[0] = tessera.ones(5)
    assert isinstance(t[0], tessera.nn.Parameter) and tuple(t[0].shape) == (5,)
    with pytest.raises(RuntimeError, match="ParameterList should not be called"):
        t()
    with pytest.raises(TypeError, match="ParameterList.extend should be called"):
        t.extend(tessera.ones(2))
    with pytest.raises(IndexError):
        t[9]
    assert not any(k.isdigit() for k in dir(t))


def test_parameter_dict():
    def build(L):
        pd = L.nn.ParameterDict({"w": L.nn.Parameter(L.ones(2, 3)), "b": L.zeros(3)})
        pd["x"] = L.ones(1, dtype=L.float64)
        pd.update([("y", L.nn.Parameter(L.ones(2)))])
        pd["s"] = "a string"
        return pd
    p, t = both(build)
    assert list(t.keys()) == list(p.keys()) == ["b", "w", "x", "y", "s"]  # dicts sorted
    assert [n for n, _ in t.named_parameters()] == [n for n, _ in p.named_parameters()]
    assert list(t.state_dict()) == list(p.state_dict())
    assert repr(t) == norm_repr(repr(p))
    assert isinstance(t["b"], tessera.nn.Parameter) and t.get("nope", 3) == 3
    assert "w" in t and len(t) == 5
    c = t.copy()
    assert list(c.keys()) == list(t.keys()) and c["w"] is t["w"]
    assert t.setdefault("z", None) is None and "z" in t
    assert t.popitem()[0] == "z"
    assert isinstance(t.pop("w"), tessera.nn.Parameter) and "w" not in t
    merged = t | tessera.nn.ParameterDict({"q": tessera.ones(1)})
    assert list(merged.keys())[-1] == "q" and "q" not in t
    assert list(t.fromkeys(["m", "n"]).keys()) == ["m", "n"]
    assert [k for k in reversed(t)] == list(reversed(list(t.keys())))
    t.clear()
    assert len(t) == 0
    with pytest.raises(TypeError, match="cannot be used as a key"):
        t[3] = tessera.ones(1)
    with pytest.raises(RuntimeError, match="ParameterDict should not be called"):
        t(1)


def test_containers_inside_a_model_state_dict_and_train_flag():
    class Net:
        @staticmethod
        def build(L):
            class M(L.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layers = L.nn.ModuleList([L.nn.Linear(2, 2), L.nn.BatchNorm1d(2)])
                    self.heads = L.nn.ModuleDict({"x": L.nn.Linear(2, 1)})
                    self.extra = L.nn.ParameterList([L.ones(3)])
                    self.table = L.nn.ParameterDict({"t": L.ones(2)})
            return M()
    p, t = both(Net.build)
    assert list(t.state_dict()) == list(p.state_dict())
    assert [n for n, _ in t.named_modules()] == [n for n, _ in p.named_modules()]
    t.eval()
    assert all(not m.training for m in t.modules())
    t.train()
    assert all(m.training for m in t.modules())
    assert repr(t) == norm_repr(repr(p))
