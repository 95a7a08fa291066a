"""Deployment: a model as a standalone C library with a C API (``export_c``).

``export_c(model, example_inputs, out_dir, name=...)`` writes a folder that builds with a C
compiler alone (``make``): ``<name>.h`` (the API: ``<name>_load``, ``_run``, ``_free``...),
the generated program ``<name>.c`` and its fused regions (``<name>_regions.c``, and
``<name>_regions_avx2.c`` for CPUs with AVX2 and FMA), the runtime and kernel sources it
needs (copied in), ``<name>.weights``, a ``Makefile`` for ``lib<name>.so``, ``lib<name>.a``
and the driver ``run_<name>`` (which reads and writes ``.npy`` files), and a short README.

The model is an ``nn.Module`` in eval mode or an inference ``nn.Graph`` (traced and
optimised as ``nn.Graph`` does: conv+BN folding, fusion), or the path of an ONNX file
(``tessera.onnx.load``). The program's C is the graph compiler's own where it has it (the
fused regions' loops, tessera's GEMM, the window kernels); its buffers are the static memory
plan's arena. An op without a C rule raises ``NotImplementedError`` naming the op and the
module it was called from.

>>> import tempfile, tessera, tessera.deploy
>>> m = tessera.nn.Sequential(tessera.nn.Linear(4, 3), tessera.nn.ReLU()).eval()
>>> d = tempfile.mkdtemp()
>>> info = tessera.deploy.export_c(m, (tessera.randn(2, 4),), d, name="mlp")
>>> sorted(p for p in info["files"] if p.startswith("mlp"))
['mlp.c', 'mlp.h', 'mlp.weights', 'mlp_regions.c', 'mlp_regions_avx2.c', 'mlp_rename.h']
"""
from __future__ import annotations

import os
import re

__all__ = ["export_c"]


def export_c(model, example_inputs, out_dir: str, name: str = "model") -> dict:
    """Export ``model`` (an eval-mode ``nn.Module``, an inference ``nn.Graph`` or an ONNX
    path) for inputs shaped like ``example_inputs`` as a C library folder ``out_dir``.

    Returns ``{"folder", "weights", "files"}``. ``name`` prefixes every C symbol, so two
    exported models link into one program.

    >>> import tempfile, tessera, tessera.deploy
    >>> info = tessera.deploy.export_c(tessera.nn.Linear(2, 2).eval(), (tessera.ones(1, 2),),
    ...                                tempfile.mkdtemp(), name="lin")
    >>> os.path.basename(info["weights"])
    'lin.weights'
    """
    from tessera.deploy._capture import capture
    from tessera.deploy._emit import emit
    from tessera.deploy._files import write_folder
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise ValueError(f"tessera.deploy.export_c: name must be a C identifier, got {name!r}")
    from tessera.deploy._files import KERNEL_FILES, RUNTIME_FILES
    if f"{name}.c" in KERNEL_FILES + RUNTIME_FILES or name in ("tsr_pool", "tsr_attention",
                                                                 "tsr_nchwc"):
        raise ValueError(f"tessera.deploy.export_c: name {name!r} is a file the folder "
                         "already holds (one of the runtime's sources); choose another")
    plain: dict = {}
    g, values = capture(model, example_inputs, plain)
    prog = emit(name, g, values, plain)
    info = write_folder(prog, values, out_dir)
    info["files"] = sorted(os.listdir(out_dir))
    return info
