"""``TesseraBackend``: tessera as an ONNX backend (``onnx.backend.base.Backend``), so ONNX's
own node tests run against the importer.

A model runs eagerly through the import table (``tessera.onnx.converters.IMPORT``). The ops
tessera supports are that table's keys (``SUPPORTED_OPS``); ``prepare`` raises
``unittest.SkipTest`` for a model using any other op, so the backend test suite skips those
tests instead of failing them.

>>> import numpy as np
>>> from onnx import helper, TensorProto
>>> node = helper.make_node("Relu", ["x"], ["y"])
>>> TesseraBackend.run_node(node, [np.array([-1.0, 2.0], np.float32)])[0]
array([0., 2.], dtype=float32)
"""
from __future__ import annotations

import unittest

import numpy as np
from onnx.backend.base import Backend, BackendRep

from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.onnx.converters import supported_onnx_ops
from tessera.onnx.importer import OnnxImportError, OnnxProgram, OnnxValidationError

__all__ = ["TesseraBackend", "TesseraRep", "SUPPORTED_OPS", "prepare", "run_model",
           "run_node", "supports_device"]

# the ONNX op types tessera imports (the backend skips node tests of any other)
SUPPORTED_OPS = frozenset(supported_onnx_ops())


def _foreign_types(model) -> str | None:
    """A description of the first input/output/initializer type that is not a tessera
    tensor type (uint16/32/64, float8, int4, strings, sequences, optionals), or None."""
    import onnx

    from tessera.onnx.converters.helpers import DTYPES
    g = model.graph
    for v in list(g.input) + list(g.output):
        kind = v.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"a {kind.replace('_type', '')} value ('{v.name}')"
        if v.type.tensor_type.elem_type not in DTYPES:
            return onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)
    for t in g.initializer:
        if t.data_type not in DTYPES:
            return onnx.TensorProto.DataType.Name(t.data_type)
    for n in g.node:
        for a in n.attribute:
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT \
                    and a.i not in DTYPES:
                return onnx.TensorProto.DataType.Name(a.i)
    return None


class TesseraRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns its outputs as NumPy arrays."""

    def __init__(self, program: OnnxProgram):
        self.program = program

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            inputs = [inputs[n] for n in self.program.input_names]
        elif not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        tensors = [Tensor._from_numpy(np.array(a, copy=True)) for a in inputs]
        with no_grad():
            outs = self.program.run(tensors, {})
        return tuple(o.numpy() if isinstance(o, Tensor) else np.asarray(o) for o in outs)


class TesseraBackend(Backend):
    """ONNX models on tessera (CPU)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return all(n.op_type in SUPPORTED_OPS for n in model.graph.node)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> TesseraRep:
        super().prepare(model, device, **kwargs)
        missing = sorted({n.op_type for n in model.graph.node} - SUPPORTED_OPS)
        if missing:
            raise unittest.SkipTest(f"tessera does not support ONNX op(s) {', '.join(missing)}")
        bad = _foreign_types(model)
        if bad:
            raise unittest.SkipTest(f"the model uses {bad}, which tessera does not have")
        try:
            return TesseraRep(OnnxProgram(model, opset_range=None))
        except OnnxValidationError:
            raise  # an invalid model (or a validation bug): a failure, never a skip
        except OnnxImportError as e:
            raise unittest.SkipTest(str(e)) from None

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one node on NumPy ``inputs``."""
        from onnx import helper
        names = [i for i in node.input]
        graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(
            np.asarray(a).dtype), np.asarray(a).shape) for n, a in zip(names, inputs) if n]
        outputs = [helper.make_empty_tensor_value_info(o) for o in node.output]
        graph = helper.make_graph([node], "node", graph_inputs, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(
            "", kwargs.get("opset_version", 21))])
        if node.op_type not in SUPPORTED_OPS:
            raise unittest.SkipTest(f"tessera does not support ONNX op {node.op_type}")
        rep = TesseraRep(OnnxProgram(model, opset_range=None))  # outputs are untyped
        return rep.run([a for n, a in zip(names, inputs) if n])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = TesseraBackend.prepare
run_model = TesseraBackend.run_model
run_node = TesseraBackend.run_node
supports_device = TesseraBackend.supports_device
