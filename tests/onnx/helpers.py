"""Shared helpers of the ONNX tests: run a model in onnxruntime and compare with eager."""
from __future__ import annotations

import numpy as np

import tessera


def ort_session(proto):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def ort_run(proto, arrays: list[np.ndarray]) -> list[np.ndarray]:
    s = ort_session(proto)
    return s.run(None, {i.name: a for i, a in zip(s.get_inputs(), arrays)})


def flat_tensors(out) -> list:
    if isinstance(out, tessera.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat_tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in flat_tensors(o)]
    return []


def assert_close(got: list, want: list, atol=1e-5, rtol=1e-4, what="output") -> None:
    assert len(got) == len(want), f"{len(got)} outputs, eager gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        w = w.numpy() if isinstance(w, tessera.Tensor) else np.asarray(w)
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what} {k}: shape {g.shape} vs eager {w.shape}"
        assert g.dtype == w.dtype, f"{what} {k}: dtype {g.dtype} vs eager {w.dtype}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, equal_nan=True,
                                       err_msg=f"{what} {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} {k}")
