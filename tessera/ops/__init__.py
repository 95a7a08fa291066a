"""The op registry and the op families (one module per family).

``tessera.ops.REGISTRY`` maps every op name to its ``OpDef``; ``python -m tessera opcov``
prints which rules each op has.
"""
from tessera.ops.registry import REGISTRY, Meta, MissingRule, OpDef, coverage_table, register

__all__ = ["REGISTRY", "Meta", "MissingRule", "OpDef", "coverage_table", "register"]
