"""Graph, Node and GraphModule editing, against torch.fx doing the same edits."""
from __future__ import annotations

import copy
import operator
import pickle

import pytest
import torch
import torch.fx

import tessera
import tessera.fx
from tessera import nn


def _build(fx):
    """The same hand-built graph with ``fx`` (torch.fx or tessera.fx)."""
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default_value=3)
    a = g.call_function(operator.add, (x, y))
    s = g.call_method("sum", (a,), {"dim": 0})
    g.output((s, [a, x]))
    return g


def test_hand_built_graph_prints_like_torch():
    assert str(_build(tessera.fx)) == str(_build(torch.fx))
    t, s = _build(torch.fx), _build(tessera.fx)
    assert t.python_code("self").src == s.python_code("self").src


def test_edits_keep_uses_in_both_directions():
    g = _build(tessera.fx)
    x, y, add, sm, out = g.nodes
    assert list(add.users) == [sm, out] and add.all_input_nodes == [x, y]
    with g.inserting_after(add):
        neg = g.call_function(operator.neg, (add,))
        mul = g.call_function(operator.mul, (neg, 2))
    assert [n.name for n in g.nodes] == ["x", "y", "add", "neg", "mul", "sum_1", "output"]
    sm.replace_input_with(add, mul)
    assert sm.args == (mul,) and sm not in add.users and sm in mul.users
    changed = x.replace_all_uses_with(y, delete_user_cb=lambda u: u.op == "output")
    assert changed == [out] and out.args[0][1] == [add, y]
    with pytest.raises(RuntimeError, match="still had 2 users"):
        g.erase_node(add)
    with g.inserting_before(add):
        first = g.call_function(operator.pos, (x,))
    assert first.next is add and add.prev is first
    add.prepend(mul)  # moving mul before add breaks the order, which lint reports
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        g.lint()
    neg.append(mul)
    g.lint()


def test_dead_code_elimination_keeps_impure_nodes():
    g = tessera.fx.Graph()
    x = g.placeholder("x")
    g.call_function(tessera.relu, (x,))              # unused: removed
    g.call_function(tessera.relu_, (x,))             # in place: kept
    g.call_function(tessera.rand, (3,))              # random: kept
    g.output(x)
    assert g.eliminate_dead_code()
    assert [n.name for n in g.nodes] == ["x", "relu_", "rand", "output"]
    assert not g.eliminate_dead_code()


def test_node_copy_and_graph_copy():
    src = _build(tessera.fx)
    dst = tessera.fx.Graph()
    val_map: dict = {}
    out = dst.graph_copy(src, val_map)
    dst.output(out)
    assert str(dst) == str(src)
    assert all(a is not b and a.graph is dst for b, a in val_map.items())


def test_find_nodes_and_output_node():
    g = _build(tessera.fx)
    assert [n.name for n in g.find_nodes(op="placeholder")] == ["x", "y"]
    assert g.find_nodes(op="call_function", target=operator.add)[0].name == "add"
    assert g.output_node.op == "output"


def test_print_tabular_needs_tabulate_as_in_torch(capsys):
    try:
        import tabulate  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            _build(torch.fx).print_tabular()
        expected = capsys.readouterr().out
        with pytest.raises(ImportError):
            _build(tessera.fx).print_tabular()
        assert capsys.readouterr().out == expected
    else:
        _build(torch.fx).print_tabular()
        expected = capsys.readouterr().out
        _build(tessera.fx).print_tabular()
        assert capsys.readouterr().out == expected


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.b(self.a(x)) + self.a.weight.sum()


def test_graph_module_copies_what_the_graph_names():
    m = _Net()
    gm = tessera.fx.symbolic_trace(m)
    assert not hasattr(gm, "unused")
    assert gm.a is m.a and getattr(gm.b, "0") is m.b[0]
    assert type(gm.b).__name__ == "Module"      # an intermediate level, as in torch
    assert sorted(gm.state_dict()) == ["a.bias", "a.weight", "b.0.bias", "b.0.weight"]
    x = tessera.randn(2, 3)
    assert tessera.equal(gm(x), m(x))
    assert "# To see more debug info" in str(gm)
    text = gm.print_readable(print_output=False)
    assert text.startswith("class _Net(tessera.nn.Module):\n    def forward(self, x):")


def test_recompile_after_editing_the_graph():
    gm = tessera.fx.symbolic_trace(lambda x: tessera.add(x, 1))
    for n in gm.graph.nodes:
        if n.target is tessera.add:
            n.target = tessera.mul
    gm.recompile()
    assert "tessera.mul(x, 1)" in gm.code
    assert gm(tessera.full((2,), 5.0)).tolist() == [5.0, 5.0]


def test_submodule_management():
    gm = tessera.fx.symbolic_trace(_Net())
    assert gm.add_submodule("extra.deep", nn.ReLU())
    assert isinstance(gm.extra.deep, nn.ReLU)
    assert not gm.add_submodule("a.weight.x", nn.ReLU())
    assert gm.delete_submodule("extra.deep") and not gm.delete_submodule("extra.deep")
    gm.add_submodule("spare", nn.Linear(1, 1))
    gm.delete_all_unused_submodules()
    assert sorted(n for n, _ in gm.named_modules()) == ["", "a", "b", "b.0", "b.1"]


def test_get_attr_of_a_missing_target_warns():
    gm = tessera.fx.symbolic_trace(_Net())
    with pytest.warns(UserWarning, match="no underlying reference"):
        gm.graph.get_attr("nope")


def test_deepcopy_and_pickle_give_independent_working_modules():
    m = _Net()
    gm = tessera.fx.symbolic_trace(m)
    x = tessera.randn(2, 3)
    for clone in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        assert type(clone).__name__ == "_Net" and type(clone) is not type(gm)
        assert clone.code == gm.code
        assert tessera.allclose(clone(x), gm(x))
        assert clone.a.weight is not gm.a.weight
    clone = copy.deepcopy(gm)
    for n in clone.graph.nodes:
        if n.target is operator.add:
            n.target = operator.sub
    clone.recompile()
    assert not tessera.allclose(clone(x), gm(x))  # the original keeps its own forward
