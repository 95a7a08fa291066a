"""The code generator registers itself with the graph layer when tessera is imported, so
compiled graphs run generated C whenever a compiler is present."""
from __future__ import annotations

import os
import subprocess
import sys

from tessera import kernels
from tessera.graph import backend


def test_import_tessera_registers_the_code_generator():
    code = ("import tessera\nfrom tessera.graph import backend\n"
            "print(backend.enabled(), backend.codegen_pass('outline') is not None)")
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_CODEGEN"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == [str(kernels.enabled()), "True"]


def test_without_a_generator_the_codegen_passes_are_no_ops():
    saved = backend._GENERATOR[:]
    try:
        backend._GENERATOR.clear()
        assert not backend.enabled()
        assert backend.compile_fused([]) == {}
        assert backend.codegen_pass("outline")(None, None) is False
        assert backend.codegen_pass("fuse") is None
    finally:
        backend._GENERATOR[:] = saved
