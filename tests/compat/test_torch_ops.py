"""``torch.ops`` and ``torch.library`` against torch 2.13: aten operators and their overloads
called as tessera's functions, the profiler's functional ranges, ``load_library``, and Python
operators defined with ``custom_op`` and ``Library``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera

A = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32)
B = np.array([[1.0, 2.0, -1.0], [0.5, -0.5, 3.0]], np.float32)

ATEN = [
    "aten.add.Tensor(a, b)", "aten.add(a, b, alpha=2)", "aten.add.Scalar(a, 2.0)",
    "aten.sub.Tensor(a, b)", "aten.mul.Tensor(a, b)", "aten.mul.Scalar(a, 3.0)",
    "aten.div.Tensor(a, b)", "aten.mm.default(a, b.t())", "aten.bmm(a[None], b.t()[None])",
    "aten.addmm.default(b[0, :2], a, b.t())", "aten.sum.default(a)",
    "aten.sum.dim_IntList(a, [1])", "aten.mean.dim(a, [0], True)", "aten.relu.default(a)",
    "aten.gelu.default(a)", "aten.tanh(a)", "aten.exp.default(a)", "aten.neg.default(a)",
    "aten.view.default(a, [3, 2])", "aten._unsafe_view.default(a, [6])", "aten.t.default(a)",
    "aten.permute.default(a, [1, 0])", "aten.expand.default(a[:1], [4, 3])",
    "aten.clone.default(a)", "aten.cat.default([a, b], 1)", "aten.stack([a, b])",
    "aten._softmax.default(a, 1, False)", "aten._log_softmax.default(a, 0, False)",
    "aten._to_copy.default(a, dtype=lib.float64)", "aten.where.self(a > 0, a, b)",
    "aten.max.dim(a, 1)[0]", "aten.amax(a, [1])", "aten.add_.Tensor(a.clone(), b)",
    "aten.copy_.default(a.clone(), b)", "aten.zeros_like.default(a)",
    "aten.linear.default(a, b, b[0, :2])", "aten.embedding.default(b, lib.tensor([1, 0, 1]))",
    "aten.transpose.int(a, 0, 1)", "aten.unsqueeze.default(a, 0)", "aten.squeeze.dim(a[:1], 0)",
    "aten.select.int(a, 1, 2)",
]


def run(expr: str, lib):
    env = {"lib": lib, "aten": lib.ops.aten, "a": lib.tensor(A), "b": lib.tensor(B)}
    return eval(expr, env)


@pytest.mark.parametrize("expr", ATEN)
def test_aten_ops_match_torch(expr):
    ref, got = run(expr, torch), run(expr, tessera)
    assert str(got.dtype).split(".")[1] == str(ref.dtype).split(".")[1]
    np.testing.assert_allclose(np.asarray(got.tolist()), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_aten_names_and_errors():
    for lib in (torch, tessera):
        p, o = lib.ops.aten.add, lib.ops.aten.add.Tensor
        assert (repr(p), str(p), repr(o), str(o), o.name(), o.namespace, o._overloadname) == (
            "<OpOverloadPacket(op='aten.add')>", "aten.add",
            "<OpOverload(op='aten.add', overload='Tensor')>", "aten.add.Tensor",
            "aten::add.Tensor", "aten", "Tensor")
        assert o.overloadpacket is not None and lib.ops.aten.mm.default.__name__ == "mm.default"
        with pytest.raises(AttributeError, match="'_OpNamespace' 'aten' object has no "
                                                 "attribute 'no_such_op'"):
            lib.ops.aten.no_such_op
        with pytest.raises(AttributeError, match="'_OpNamespace' 'nons' object has no "
                                                 "attribute 'x'"):
            lib.ops.nons.x
    assert tessera.ops.aten.add.opdef is tessera.ops.REGISTRY["add"]


def test_submodules_still_import_through_the_namespace_fallback():
    from tessera.ops import inplace, registry
    assert registry.REGISTRY is tessera.ops.REGISTRY and callable(inplace.sin_)
    with pytest.raises(AttributeError):
        tessera.ops.__no_such_dunder__  # noqa: B018


def test_load_library_raises_oserror_as_torch():
    for lib in (torch, tessera):
        with pytest.raises(OSError, match="Could not load this library: /no/such/libops.so"):
            lib.ops.load_library("/no/such/libops.so")
    assert tessera.ops.loaded_libraries == set() == torch.ops.loaded_libraries


def test_profiler_ranges_as_ops():
    names = []
    for lib, prefix in ((torch, "aten::"), (tessera, "tessera::")):
        with lib.autograd.profiler.profile() as prof:
            h = lib.ops.profiler._record_function_enter_new("block", None)
            lib.relu(lib.ones(3))
            lib.ops.profiler._record_function_exit._RecordFunction(h) if lib is torch else \
                lib.ops.profiler._record_function_exit(h)
        events = [e.name for e in prof.function_events]
        names.append(("block" in events, f"{prefix}relu" in events))
    assert names[0] == names[1] == (True, True)


def test_profiler_ops_in_an_fx_graph():
    """pytorch/examples fx/profiling_tracer: a tracer emitting record_function's range as
    the two profiler ops, which then run when the GraphModule does."""
    rf = tessera.autograd.profiler.record_function

    class Foo(tessera.nn.Module):
        def forward(self, x):
            with tessera.profiler.record_function("foo"):
                return tessera.relu(x)

    class ProfilerTracer(tessera.fx.Tracer):
        def trace(self, root, concrete_args=None):
            def enter(rec):
                rec._h = self.create_proxy("call_function",
                                           tessera.ops.profiler._record_function_enter,
                                           (rec.name,), {})
                return rec._h

            def exit_(rec, *exc):
                tessera.ops.profiler._record_function_exit(rec._h)

            saved = rf.__enter__, rf.__exit__
            rf.__enter__, rf.__exit__ = enter, exit_
            try:
                return super().trace(root, concrete_args)
            finally:
                rf.__enter__, rf.__exit__ = saved

    tracer = ProfilerTracer()
    graph = tracer.trace(Foo())
    gm = tessera.fx.GraphModule(tracer.root, graph)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[0] == "profiler._record_function_enter" and \
        targets[-1] == "profiler._record_function_exit"
    with tessera.autograd.profiler.profile() as prof:
        out = gm(tessera.tensor([-1.0, 2.0]))
    assert out.tolist() == [0.0, 2.0]
    assert [e.name for e in prof.function_events] == ["foo", "tessera::relu"]


def _custom(lib, ns: str):
    @lib.library.custom_op(f"{ns}::scale", mutates_args=())
    def scale(x: torch.Tensor, k: float) -> torch.Tensor:  # torch resolves the names
        return x * k

    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    scale.register_autograd(lambda ctx, g: (g * ctx.k, None), setup_context=setup_context)

    @lib.library.custom_op(f"{ns}::nograd", mutates_args=())
    def nograd(x: torch.Tensor) -> torch.Tensor:
        return x.clone()
    return scale, nograd


def test_custom_op_matches_torch():
    results = []
    for lib in (torch, tessera):
        scale, nograd = _custom(lib, "tessera_compat_test")
        packet = getattr(lib.ops.tessera_compat_test, "scale")
        x = lib.tensor([1.0, -2.0], requires_grad=True)
        y = packet.default(x, 3.0)
        y.sum().backward()
        with pytest.raises(AttributeError, match="has no overload name 'Tensor'"):
            packet.Tensor
        with pytest.raises(RuntimeError, match="no autograd formula was registered") as e:
            nograd(lib.ones(1, requires_grad=True)).sum().backward()
        results.append((y.tolist(), x.grad.tolist(), packet.overloads(), repr(packet),
                        str(e.value)))
    assert results[0] == results[1]


def test_library_define_and_impl():
    outs = []
    for lib in (torch, tessera):
        my = lib.library.Library("tessera_compat_lib", "DEF")
        my.define("twice(Tensor x) -> Tensor")
        my.impl("twice", lambda x: x * 2, "CPU")
        outs.append(lib.ops.tessera_compat_lib.twice(lib.tensor([1.0, 2.0])).tolist())
        del my
    assert outs[0] == outs[1] == [2.0, 4.0]
    with pytest.raises(NotImplementedError, match="cannot be replaced"):
        tessera.library.Library("aten", "IMPL").impl("add.Tensor", lambda a, b: a, "CPU")
