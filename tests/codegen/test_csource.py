"""The hand-written C files of tessera.kernels.c: read whole, local includes inlined (so the
compiler cache's key covers them), and each compiles on its own."""
from __future__ import annotations

import os
import subprocess

import pytest

from tessera.kernels import cc, csource

FILES = sorted(os.listdir(csource.DIRECTORY))

# the -D flags a file needs to compile on its own, and what follows a header
_GEOMETRY = csource.defines(T="float", KH=3, KW=3, SH=2, SW=2, PH=1, PW=1, DH=1, DW=1)
_FLAGS = {"maxpool.c": _GEOMETRY + csource.defines(INDEX=1), "depthwise.c": _GEOMETRY,
          "threadpool.c": csource.defines(BLASINT="int"), "conv.h": csource.defines(BLASINT="int"),
          "conv_gemm.c": csource.defines(BLASINT="int")}
_AFTER = {
    "conv.h": "GEMM_TYPE(float, f32)\nIM2COL_BLOCK(float, im2col_block_f32)\n"
              "COL2IM(float, col2im_plane_f32)\nDRIVERS(float, f32)\nWINOGRAD(float, f32)\n"
              "WINO_FWD(float, f32, wino, WGEOMETRY, 16)\nWINOGRAD4(float, f32)\n"
              "WINO_WGRAD(float, f32, wino4, W4GEOMETRY, 36)\n",
    "direct_conv.h": "typedef float v_f32 __attribute__((vector_size(32)));\n"
                     "typedef float u_f32 __attribute__((vector_size(32), aligned(4), "
                     "may_alias));\nCOMMON(float, f32)\nFWD(float, f32, v_f32, u_f32, 8, 6, 2)\n",
    "prelude.h": "float tsr_probe(float x) { return tsr_gelu_gradf(x) + tsr_logf(x); }\n",
}

# files that are parts of another, which includes them after the definitions they use
_PART_OF = {"winograd.h": "conv.h", "winograd4.h": "conv.h", "window.h": "window.c",
            "attention.h": "attention.c", "int8_amx.h": "int8.c",
            "binary_planes.h": "binary.c"}


def test_parts_are_included_by_their_file():
    for part, whole in _PART_OF.items():
        assert csource.source(part).strip() in csource.source(whole), (part, whole)


def test_files_are_c_sources():
    assert FILES and all(f.endswith((".c", ".h")) for f in FILES), FILES
    assert {"prelude.h", "window.c", "conv.h", "threadpool.c", "optim.c"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_includes_inlined(name):
    text = csource.source(name)
    assert '#include "' not in text
    with open(os.path.join(csource.DIRECTORY, name), encoding="utf-8") as f:
        raw = f.read()
    for inc in csource._INCLUDE.findall(raw):
        assert csource.source(inc).strip() in text


def test_included_file_in_the_text(tmp_path, monkeypatch):
    """An edit to an included header changes the including file's text, the cache key."""
    monkeypatch.setattr(csource, "DIRECTORY", str(tmp_path))
    (tmp_path / "a.h").write_text("int a(void) { return 1; }\n")
    (tmp_path / "b.c").write_text('/* b */\n#include "a.h"\n#include <stdint.h>\nint b;\n')
    csource.source.cache_clear()
    try:
        first = csource.source("b.c")
        assert first == "/* b */\nint a(void) { return 1; }\n#include <stdint.h>\nint b;\n"
        (tmp_path / "a.h").write_text("int a(void) { return 2; }\n")
        csource.source.cache_clear()
        assert csource.source("b.c") != first
    finally:
        csource.source.cache_clear()


@pytest.mark.skipif(cc.compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("name", FILES)
def test_compiles_on_its_own(name):
    """With -I the directory and its -D flags (a header: with an instantiation after it),
    each file is C the compiler takes as it is."""
    # a part of another file (it uses that file's definitions): compiled as that file
    name = _PART_OF.get(name, name)
    src = f'#include "{name}"\n' + _AFTER.get(name, "")
    proc = subprocess.run([cc.compiler(), "-std=gnu11", "-fsyntax-only", "-fopenmp-simd",
                           "-I", csource.DIRECTORY, *_FLAGS.get(name, ()), "-x", "c", "-"],
                          input=src, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
