"""The transformations of torch.fx's own tutorials and docs, written as a PyTorch user
writes them (``import tessera as torch``), checked against eager mode and against torch.fx
doing the same edit."""
from __future__ import annotations

import copy

import torch as real_torch
import torch.fx as real_fx

import tessera as torch
import tessera.fx as fx
from tessera import nn


def test_replace_add_with_mul_by_graph_manipulation():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.add(x, y) + torch.add(y, y)

    def transform(m, tracer_class=fx.Tracer):
        graph = tracer_class().trace(m)
        for node in graph.nodes:
            if node.op == "call_function" and node.target == torch.add:
                node.target = torch.mul
        graph.lint()
        return fx.GraphModule(m, graph)

    gm = transform(M())
    x, y = torch.tensor([2.0, 3.0]), torch.tensor([4.0, 5.0])
    assert gm(x, y).tolist() == (x * y + y * y).tolist()


def test_shape_propagation_by_hand_interpretation():
    """The docs' hand-written ShapeProp: walk the nodes, keep values in an env."""
    class ShapePropByHand:
        def __init__(self, mod):
            self.mod, self.graph = mod, mod.graph
            self.modules = dict(self.mod.named_modules())

        def propagate(self, *args):
            args_iter = iter(args)
            env: dict = {}

            def load_arg(a):
                return fx.graph.map_arg(a, lambda n: env[n.name])

            def fetch_attr(target):
                obj = self.mod
                for atom in target.split("."):
                    obj = getattr(obj, atom)
                return obj

            for node in self.graph.nodes:
                if node.op == "placeholder":
                    result = next(args_iter)
                elif node.op == "get_attr":
                    result = fetch_attr(node.target)
                elif node.op == "call_function":
                    result = node.target(*load_arg(node.args), **load_arg(node.kwargs))
                elif node.op == "call_method":
                    self_obj, *rest = load_arg(node.args)
                    result = getattr(self_obj, node.target)(*rest, **load_arg(node.kwargs))
                elif node.op == "call_module":
                    result = self.modules[node.target](*load_arg(node.args),
                                                       **load_arg(node.kwargs))
                else:
                    return load_arg(node.args[0])
                if isinstance(result, torch.Tensor):
                    node.shape, node.dtype = result.shape, result.dtype
                env[node.name] = result

    model = torch.models.resnet18(num_classes=7).eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(1, 3, 32, 32)
    out = ShapePropByHand(gm).propagate(x)
    assert torch.allclose(out, model(x))
    shapes = {n.name: tuple(n.shape) for n in gm.graph.nodes if hasattr(n, "shape")}
    assert shapes["layer4_1_relu_1"] == (1, 512, 1, 1) and shapes["fc"] == (1, 7)


# ---- the "(beta) Building a Convolution/Batch Norm fuser in FX" tutorial -------------------

def _fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    if conv_b is None:
        conv_b = torch.zeros_like(bn_rm)
    bn_var_rsqrt = torch.rsqrt(bn_rv + bn_eps)
    conv_w = conv_w * (bn_w * bn_var_rsqrt).reshape([-1] + [1] * (len(conv_w.shape) - 1))
    conv_b = (conv_b - bn_rm) * bn_var_rsqrt * bn_w + bn_b
    return torch.nn.Parameter(conv_w), torch.nn.Parameter(conv_b)


def _fuse_conv_bn_eval(conv, bn):
    assert not (conv.training or bn.training), "Fusion only for eval!"
    fused_conv = copy.deepcopy(conv)
    fused_conv.weight, fused_conv.bias = _fuse_conv_bn_weights(
        fused_conv.weight, fused_conv.bias, bn.running_mean, bn.running_var, bn.eps,
        bn.weight, bn.bias)
    return fused_conv


def _parent_name(target):
    *parent, name = target.rsplit(".", 1)
    return parent[0] if parent else "", name


def _replace_node_module(node, modules, new_module):
    parent_name, name = _parent_name(node.target)
    setattr(modules[parent_name], name, new_module)


def _fuse(model):
    model = copy.deepcopy(model)
    fx_model = fx.symbolic_trace(model)
    modules = dict(fx_model.named_modules())
    for node in fx_model.graph.nodes:
        if node.op != "call_module":
            continue
        if type(modules[node.target]) is nn.BatchNorm2d and \
                type(modules[node.args[0].target]) is nn.Conv2d:
            if len(node.args[0].users) > 1:
                continue
            conv, bn = modules[node.args[0].target], modules[node.target]
            _replace_node_module(node.args[0], modules, _fuse_conv_bn_eval(conv, bn))
            node.replace_all_uses_with(node.args[0])
            fx_model.graph.erase_node(node)
    fx_model.graph.lint()
    fx_model.recompile()
    return fx_model


def test_conv_bn_fusion_on_resnet18():
    model = torch.models.resnet18(num_classes=10)
    for m in model.modules():       # batch statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    model.eval()
    fused = _fuse(model)
    kinds = {type(m) for m in fused.modules()}
    assert nn.BatchNorm2d not in {type(dict(fused.named_modules())[n.target])
                                  for n in fused.graph.nodes if n.op == "call_module"}
    assert nn.Conv2d in kinds
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(fused(x), model(x), rtol=1e-4, atol=1e-4)


def test_inserting_after_adds_a_relu_like_torch():
    def edit(T, fxm):
        def f(x, y):
            return T.add(x, y) * 2
        gm = fxm.symbolic_trace(f)
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target == T.add:
                with gm.graph.inserting_after(node):
                    new_node = gm.graph.call_function(T.relu, args=(node,))
                    node.replace_all_uses_with(new_node,
                                               delete_user_cb=lambda u: u is not new_node)
        gm.graph.lint()
        gm.recompile()
        return gm

    t, s = edit(real_torch, real_fx), edit(torch, fx)
    assert str(s.graph) == str(t.graph).replace("torch.", "tessera.")
    x, y = torch.tensor([1.0, -3.0]), torch.tensor([1.0, 1.0])
    assert s(x, y).tolist() == [4.0, 0.0]


def test_replace_pattern_of_two_ops():
    class M(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            return torch.sigmoid(x) * x + torch.sigmoid(y) * y

    def pattern(a):
        return torch.sigmoid(a) * a

    def replacement(a):
        return torch.nn.functional.silu(a)

    gm = fx.symbolic_trace(M())
    assert len(fx.replace_pattern(gm, pattern, replacement)) == 2
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(
        torch.nn.functional.silu) == 2
    x = torch.randn(5)
    assert torch.allclose(gm(x), M()(x))


def test_print_tabular_is_available():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    assert callable(gm.graph.print_tabular)   # output: tests/fx/test_graph.py
