"""Every converter against onnxruntime, driven by the op-info table (STYLE.md rule 7).

Each entry's first small float32 sample is wrapped in a module, exported (opset 17, and the
other opsets where an op has more than one rule) and run in onnxruntime; the outputs must
equal eager tessera. An entry that uses an op without a converter must fail to export with
an ``UnsupportedOpError`` naming that op. Known mismatches are listed with their reasons.
"""
from __future__ import annotations

import pytest

import tessera
import tessera.onnx
from tessera import nn
from tessera.graph import GraphTraceError
from tessera.onnx.converters import EXPORT
from tessera.onnx.exporter import UnsupportedOpError
from tests.onnx.helpers import assert_close, flat_tensors, ort_run
from tests.opinfo import OP_DB
from tests.ops.test_opinfo import _convert
from tests.ops.test_opinfo_graph import UNCAPTURABLE, _closure, _samples

pytest.importorskip("onnxruntime")

# entry name -> why onnxruntime's answer differs from eager (strict xfail)
EXPECTED_FAILURES: dict[str, str] = {
    # tests/nn/test_binary.py imports these back into tessera instead
    "packed_binary_conv2d": "a custom-domain op (ai.tessera.binary), no onnxruntime kernel",
    "packed_binary_linear": "a custom-domain op (ai.tessera.binary), no onnxruntime kernel",
}
# entry name -> why its (convertible) op cannot be exported with these arguments; the export
# must raise UnsupportedOpError
UNSUPPORTED: dict[str, str] = {
    "nn.functional.adaptive_max_pool2d_indices": "indices of adaptive max pooling with "
                                                 "unequal windows",
    "nn.functional.adaptive_max_pool3d_indices": "indices of adaptive max pooling with "
                                                 "unequal windows",
    "scaled_dot_product_attention_dropout": "dropout inside fused attention (export in eval "
                                            "mode)",
}


class _Fn(nn.Module):
    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, *ts):
        return tuple(flat_tensors(self.call(*ts)))


def _opsets(g) -> list[int]:
    """17, plus the other opsets at which an op of this graph changes its rule."""
    out = {17}
    for n in g.nodes:
        out.update(v for v in EXPORT.get(n.op.name, ()) if v > 13)
    return sorted(out)


def _check(info) -> None:
    from tessera.onnx._trace import trace_model
    for sample in _samples(info)[:2]:
        args, kwargs, _ = _convert(tessera, sample, grad=False)
        try:
            with tessera.no_grad():
                want = flat_tensors(info.fn(tessera, *args, **kwargs))
        except Exception:
            continue  # an error sample: eager tests cover it
        args, kwargs, _ = _convert(tessera, sample, grad=False)
        tensors, call = _closure(info, args, kwargs)
        if not tensors or not want:
            continue
        model = _Fn(call)
        try:
            g, _ = trace_model(model, tensors)
        except GraphTraceError:
            continue
        missing = [n for n in g.nodes if n.op.name not in EXPORT]
        if info.name in UNSUPPORTED and not missing:
            with pytest.raises(UnsupportedOpError):
                tessera.onnx.export(model, tensors)
            continue
        if missing:
            with pytest.raises(UnsupportedOpError, match=f"op '{missing[0].op.name}'"):
                tessera.onnx.export(model, tensors)
            continue
        if any(t.dtype is tessera.bfloat16 for t in tensors + want):
            continue  # onnxruntime's Python API has no bfloat16 arrays
        exported = 0
        for opset in _opsets(g):
            try:
                proto = tessera.onnx.export(model, tensors, opset_version=opset)
            except UnsupportedOpError as e:
                if "opset" not in str(e):
                    raise
                continue  # a rule that needs a newer opset: the next one must work
            exported += 1
            got = ort_run(proto, [t.numpy() for t in tensors])
            if info.random:
                continue
            keep = [k for k in range(len(want)) if k not in info.skip_value_outputs]
            assert_close([got[k] for k in keep], [want[k] for k in keep],
                         atol=max(info.atol, 1e-5), rtol=max(info.rtol, 1e-4),
                         what=f"{sample!r} opset {opset}")
        assert exported, "no opset exports this sample"


def _params():
    seen: dict[str, int] = {}
    for info in OP_DB:
        k = seen.get(info.name, 0)
        seen[info.name] = k + 1
        if info.name in UNCAPTURABLE:
            continue
        marks = ()
        if info.name in EXPECTED_FAILURES:
            marks = pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[info.name])
        yield pytest.param(info, id=info.name if k == 0 else f"{info.name}#{k}", marks=marks)


@pytest.mark.parametrize("info", list(_params()))
def test_converter_matches_eager(info):
    _check(info)


def test_unsupported_op_error_names_op_and_module():
    class Inner(nn.Module):
        def forward(self, x):
            return tessera.median(x, 0).values

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Inner()

        def forward(self, x):
            return self.block(x.relu())

    with pytest.raises(UnsupportedOpError, match=r"op 'median_dim'.*module 'block'"):
        tessera.onnx.export(Outer(), (tessera.ones(3, 4),))


def test_every_converter_is_exercised():
    """Each op with a converter appears, fully exportable, in some entry's trace."""
    from tessera.onnx._trace import trace_model
    covered = set()
    for info in OP_DB:
        if info.name in UNCAPTURABLE:
            continue
        for sample in _samples(info)[:2]:
            args, kwargs, _ = _convert(tessera, sample, grad=False)
            tensors, call = _closure(info, args, kwargs)
            try:
                g, _ = trace_model(_Fn(call), tensors)
            except Exception:
                continue
            if all(n.op.name in EXPORT for n in g.nodes):
                covered.update(n.op.name for n in g.nodes)
    missing = sorted(set(EXPORT) - covered - {"fused"})
    assert not missing, f"converters no op-info sample exports: {missing}"

