"""cc.load_files: a library linked from several translation units of one folder, each unit's
object a cache entry of its own (shared between libraries), entries failing their digest
rebuilt."""
from __future__ import annotations

import os

import pytest

from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="needs a C compiler")

HEADER = "int tsr_twice(int x);\nint tsr_answer(void);\n"
TWICE = '#include "files.h"\nint tsr_twice(int x) { return 2 * x; }\n'


def _files(answer: int) -> dict:
    return {"files.h": HEADER, "twice.c": TWICE,
            "answer.c": '#include "files.h"\n'
                        f"int tsr_answer(void) {{ return tsr_twice({answer}); }}\n"}


def _corrupt(path) -> None:
    """Half the file, put in its place as a new file (this process maps the old one)."""
    data = open(path, "rb").read()
    with open(f"{path}.new", "wb") as f:
        f.write(data[:len(data) // 2])
    os.replace(f"{path}.new", path)


def test_units_link_share_objects_and_corrupt_entries_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    units = ["answer.c", "twice.c"]
    assert cc.load_files(_files(21), units).tsr_answer() == 42
    first = cc.last_build["key"]
    objects = sorted(p.name for p in tmp_path.glob("tsr_*.o"))
    assert len(objects) == 2 and cc.last_build["cached"] is False
    # another library with the same twice.c: only answer.c compiles
    assert cc.load_files(_files(5), units).tsr_answer() == 10
    assert len(list(tmp_path.glob("tsr_*.o"))) == 3
    for p in [tmp_path / f"tsr_{first}.so", *tmp_path.glob("tsr_*.o")]:
        _corrupt(p)
    monkeypatch.delitem(cc._LOADED, first)  # as in a new process
    assert cc.load_files(_files(21), units).tsr_answer() == 42
    assert cc.last_build == {"key": first, "cached": False, "seconds": cc.last_build["seconds"]}
    with pytest.raises(cc.CompileError, match="failed on generated code"):
        cc.load_files({"bad.c": "int tsr_bad(void) { return }"}, ["bad.c"])
