"""The code generator registers itself with the graph layer when tessera is imported, so
compiled graphs run generated C whenever a compiler is present."""
from __future__ import annotations

import os
import subprocess
import sys

from tessera import kernels
from tessera.graph import backend, passes


def test_import_tessera_registers_the_code_generator():
    code = ("import tessera\nfrom tessera.graph import backend, passes\n"
            "print(backend.enabled(), passes.get_pass('outline').__module__)")
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_CODEGEN"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == [str(kernels.enabled()), "tessera.codegen.passes.outline"]


def test_without_a_generator_the_codegen_passes_are_no_ops():
    saved, registered = backend._GENERATOR[:], dict(passes._REGISTERED)
    try:
        backend._GENERATOR.clear()
        for name in ("decompose", "outline"):
            del passes._REGISTERED[name]
        assert not backend.enabled()
        assert backend.compile_fused([]) == {}
        assert passes.get_pass("outline")(None, None) is False
        assert passes.get_pass("fuse") is passes.fuse.run
    finally:
        backend._GENERATOR[:] = saved
        passes._REGISTERED.update(registered)


def test_import_tessera_registers_every_pass_of_the_pipeline():
    """The pipeline's passes owned by upper layers (code generation; the parallel
    strategies' 1F1B schedule and gradient bucketing) are there after a plain import."""
    code = ("import tessera\nfrom tessera.graph import passes\n"
            "print(*(passes.get_pass(n).__module__ for n in passes.PIPELINE))")
    mods = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()
    assert "tessera.parallel.pipeline" in mods and "tessera.parallel.graph_buckets" in mods
    assert "tessera.codegen.passes.outline" in mods
    assert all(m.startswith("tessera.") for m in mods)
