"""The direct lowering (``to_relax`` rules) against TVM's own ONNX frontend on tessera's
exported ONNX: both Relax modules compiled for the same CPU must compute the same outputs,
and both must equal eager tessera."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera import nn
from tests.compiler._cases import TVM_CI_ZOO, TVM_FULL, Forward, first_tensor, zoo

pytest.importorskip("tvm")
pytest.importorskip("onnx")
ZOO = zoo()


class _Main(nn.Module):
    """The model's main output only (GPT returns (logits, None) without targets)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return first_tensor(self.model(*args))


def _via_onnx(model, args) -> np.ndarray:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import tessera.onnx
    from tessera.compiler.tvm import target
    proto = tessera.onnx.export(_Main(model), args)
    mod = from_onnx(proto, keep_params_in_input=False)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target()), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    out = out[0] if not hasattr(out, "numpy") else out
    return out.numpy()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_direct_lowering_matches_tvm_onnx_frontend(name):
    if not TVM_FULL and name not in TVM_CI_ZOO[:2]:
        pytest.skip("TESSERA_TVM_FULL=1 compares every zoo model")
    make, inputs = ZOO[name]
    tessera.manual_seed(0)
    model = make().eval()
    args = inputs()
    with tessera.no_grad():
        want = first_tensor(model(*args)).numpy()
    g = Forward(model)
    g.config.set_backend("tvm", strict=True)
    direct = g(*args).numpy()
    onnx = _via_onnx(model, args)
    np.testing.assert_allclose(direct, onnx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(direct, want, rtol=1e-4, atol=1e-5)
