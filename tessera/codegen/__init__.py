"""Code generation: fused C kernels for compiled graphs.

The outline pass (``tessera.codegen.passes.outline``) turns each fusion region into one
``fused`` node. ``compile_fused(nodes)`` lowers every fused node of a graph to the loop IR
(``tessera.codegen.loops``), renders them as one C translation unit (each op's ``to_c``
rule gives its expression), compiles it with the system C compiler through a
content-addressed disk cache (``tessera.kernels.cc``) and returns, per node, a function
``fn(out, *arrays)`` that runs the kernel on NumPy buffers.

``TESSERA_CODEGEN=0`` turns code generation off; without a C compiler it is off too, and
compiled graphs say so once (a warning) and run every node with its NumPy kernel.
``TESSERA_DEBUG=2`` prints each generated translation unit and its compile time.
"""
from __future__ import annotations

import os
import warnings

from tessera.codegen.passes import decompose as _decompose, outline as _outline
from tessera.graph import backend
from tessera.graph.passes import register_pass

__all__ = ["enabled", "compile_fused"]

_warned = False


def enabled() -> bool:
    """Whether compiled graphs use generated C kernels (``TESSERA_CODEGEN`` and a compiler)."""
    global _warned
    if os.environ.get("TESSERA_CODEGEN", "1") in ("0", "", "false", "off"):
        return False
    from tessera import kernels
    if not kernels.enabled():
        if not _warned:
            _warned = True
            warnings.warn("tessera: no C compiler found (set CC, or install cc/gcc/clang); "
                          "compiled graphs run with the NumPy executor instead of generated "
                          "C kernels", RuntimeWarning, stacklevel=3)
        return False
    return True


def compile_fused(nodes: list) -> dict:
    """{node: fn(out, *arrays)} for the fused ``nodes`` of one graph (one C library)."""
    from tessera.codegen.build import build
    return build(nodes)


backend.register(backend.CodeGenerator(enabled, compile_fused))
register_pass("decompose", _decompose.run)
register_pass("outline", _outline.run)
