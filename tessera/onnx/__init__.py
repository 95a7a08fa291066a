"""ONNX exchange: export (``export``), import (``load``, ``to_module``), ONNX's backend test
suite (``tessera.onnx.backend``) and a simplifier (``simplify``); ``python -m tessera.onnx``
is the command line.

The converters (``tessera.onnx.converters``) are two tables, export rules keyed by op and
opset and import rules keyed by ONNX op type and opset, written side by side per op family;
they need no ``onnx`` package, which is imported only when a function here runs
(``pip install tessera[onnx]``).

>>> import tessera, tessera.onnx
>>> m = tessera.nn.Linear(3, 2)
>>> proto = tessera.onnx.export(m, (tessera.ones(1, 3),))
>>> [n.op_type for n in proto.graph.node]
['Transpose', 'MatMul', 'Add']
"""
from __future__ import annotations

__all__ = ["export", "load", "to_module", "simplify", "ExportError", "UnsupportedOpError",
           "OnnxImportError", "OnnxValidationError"]


def export(model, args, f=None, **kwargs):
    """See ``tessera.onnx.exporter.export``: ``model(*args)`` traced and written as ONNX."""
    from tessera.onnx.exporter import export as _export
    return _export(model, args, f, **kwargs)


def load(model, input_shapes=None):
    """See ``tessera.onnx.importer.load``: an ONNX model (path, bytes or ModelProto) as an
    IR graph whose initializers are its variables. The model is validated first
    (``tessera.onnx.validate``); an invalid one raises ``OnnxValidationError``."""
    from tessera.onnx.importer import load as _load
    return _load(model, input_shapes)


def to_module(model):
    """See ``tessera.onnx.importer.to_module``: an ONNX model as an ``nn.Module``."""
    from tessera.onnx.importer import to_module as _to_module
    return _to_module(model)


def simplify(model, *args, **kwargs):
    """See ``tessera.onnx.simplifier.simplify``."""
    from tessera.onnx.simplifier import simplify as _simplify
    return _simplify(model, *args, **kwargs)


def __getattr__(name):
    if name in ("ExportError", "UnsupportedOpError"):
        from tessera.onnx import exporter as _e
        return getattr(_e, name)
    if name in ("OnnxImportError", "OnnxValidationError"):
        from tessera.onnx import errors as _errors
        return getattr(_errors, name)
    raise AttributeError(f"module 'tessera.onnx' has no attribute '{name}'")
