"""The errors of ONNX import, in a module of their own so that the importer, its validation
(``tessera.onnx.validate``) and the converters' import rules share them without importing
one another.

>>> issubclass(OnnxValidationError, OnnxImportError), issubclass(OnnxImportError, ValueError)
(True, True)
"""
from __future__ import annotations

__all__ = ["OnnxImportError", "OnnxValidationError"]


class OnnxImportError(ValueError):
    """The model uses something tessera cannot run, or is not valid ONNX
    (``OnnxValidationError``); the message names it."""


class OnnxValidationError(OnnxImportError):
    """The model is not valid ONNX: the message names the node (its name, or its index when
    it has none), its op type and the attribute or input at fault."""
