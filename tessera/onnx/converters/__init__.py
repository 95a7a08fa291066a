"""ONNX converters in both directions, one module per op family (STYLE.md rule 9; onnx_chainer's
``@support``): each family module holds its export rules and its import rules side by side.

``EXPORT[op name][first opset]`` turns an IR node into ONNX nodes; the exporter picks, per
node, the rule with the highest opset not above the one requested. ``IMPORT[ONNX op type]
[first opset]`` turns an ONNX node into tessera ops. Where a tessera op and an ONNX op are
the same function, one ``simple`` declaration gives both rules (``registry``). The tables
need no ``onnx`` package, and ``import tessera`` does not load them.

Families: ``elementwise``, ``activation``, ``reduce`` (and sorting), ``shape``, ``indexing``,
``linalg``, ``nn`` (convolution, pooling, resampling), ``normalization``, ``loss``,
``creation``, ``quantized`` (QDQ and QOperator INT8), ``binary`` (binary networks and the
custom domain ``ai.tessera.binary``); ``helpers`` holds what they share.

>>> from tessera.onnx.converters import EXPORT, IMPORT
>>> sorted(EXPORT["layer_norm"]), sorted(IMPORT["Abs"])
([13, 17], [1])
"""
from __future__ import annotations

from tessera.onnx.converters import (  # noqa: F401  (each family fills the tables)
    activation,
    binary,
    creation,
    elementwise,
    indexing,
    linalg,
    loss,
    nn,
    normalization,
    quantized,
    reduce,
    shape,
)
from tessera.onnx.converters.registry import (
    EXPORT,
    IMPORT,
    export_rule,
    import_rule,
    newest,
    simple,
    supported_onnx_ops,
)

# custom operator domains -> the function registering their schemas with onnx
DOMAINS = {binary.DOMAIN: binary.register_schemas,
           quantized.MS_DOMAIN: quantized.register_schemas}

__all__ = ["EXPORT", "IMPORT", "DOMAINS", "export_rule", "import_rule", "newest", "simple",
           "supported_onnx_ops"]
