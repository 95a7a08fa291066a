"""The kernel cache against someone else who can write where it looks: a library planted in a
cache folder that is not private to the user must never be loaded (its constructor would run
with the user's rights), and entries that are swapped or are not files must be rebuilt.

Each scenario runs the cache in a child process, so that what the parent process has loaded
already (ctypes keeps a library open by its path) cannot hide what the child would load.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="needs a C compiler")

# the kernel the child asks for; the planted library claims to be its cache entry
SOURCE = "int tsr_adversarial(void) { return 42; }"


def _planted_library(tmp_path, marker) -> bytes:
    """A shared library whose constructor writes ``marker``, as an attacker would plant."""
    src = tmp_path / "evil.c"
    src.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void tsr_planted(void) {{
            FILE *f = fopen("{marker}", "w");
            if (f) {{ fputs("ran", f); fclose(f); }}
        }}
        int tsr_adversarial(void) {{ return -1; }}
    """))
    out = tmp_path / "evil.so"
    subprocess.run([cc.compiler(), "-shared", "-fPIC", str(src), "-o", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out.read_bytes()


def _plant(folder, library: bytes, mode: int) -> None:
    """``library`` as the cache entry of SOURCE in ``folder``, with a digest record that
    matches it in every way the cache checks."""
    folder.mkdir(exist_ok=True)
    path = folder / f"tsr_{cc._key(SOURCE, ())}.so"
    path.write_bytes(library)
    path.with_name(path.name + ".sha256").write_text(cc._record(cc._digest(str(path)),
                                                                str(path)))
    os.chmod(folder, mode)


_CHILD = """
import json, sys, warnings
warnings.simplefilter("always")
from tessera.kernels import cc
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = cc.load(sys.argv[1]).tsr_adversarial()
print(json.dumps({"value": value, "warnings": [str(w.message) for w in caught]}))
"""


def _run_child(tmp_path, cache_dir, source: str = SOURCE) -> dict:
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    env = dict(os.environ, TESSERA_CACHE_DIR=str(cache_dir), TMPDIR=str(tmpdir),
               TESSERA_FASTPATH="0")
    out = subprocess.run([sys.executable, "-c", _CHILD, source], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def planted(tmp_path):
    marker = tmp_path / "constructor-ran"
    return marker, _planted_library(tmp_path, marker)


def test_the_planted_library_runs_from_a_private_folder(tmp_path, planted):
    # the control: in a folder only the user can write, the cache trusts what is there (the
    # digest guards against corruption, not against a writer): so the cases below test the
    # folder checks, not the digest
    marker, library = planted
    _plant(tmp_path / "cache", library, 0o700)
    result = _run_child(tmp_path, tmp_path / "cache")
    assert marker.exists() and result["value"] == -1


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757], ids=oct)
def test_a_cache_folder_others_can_write_is_refused(tmp_path, planted, mode):
    marker, library = planted
    _plant(tmp_path / "cache", library, mode)
    result = _run_child(tmp_path, tmp_path / "cache")
    assert not marker.exists()
    assert result["value"] == 42
    (warning,) = [w for w in result["warnings"] if "kernel cache folder" in w]
    assert str(tmp_path / "cache") in warning and "writable by" in warning
    # the private folder it compiled into instead is gone
    assert not [p for p in (tmp_path / "tmpdir").iterdir()
                if p.name.startswith("tessera-kernels-")]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_cache_folder_owned_by_another_user_is_refused(tmp_path, planted):
    marker, library = planted
    _plant(tmp_path / "cache", library, 0o755)
    other = os.geteuid() + 4242
    for p in (tmp_path / "cache", *(tmp_path / "cache").iterdir()):
        os.chown(p, other, other)
    result = _run_child(tmp_path, tmp_path / "cache")
    assert not marker.exists() and result["value"] == 42
    assert any(f"owned by uid {other}" in w for w in result["warnings"])


def test_the_shared_fallback_folder_is_checked_too(tmp_path, planted):
    # a cache folder that cannot be made sends the cache to $TMPDIR/tessera-kernels-<uid>,
    # which anyone could have made first
    marker, library = planted
    (tmp_path / "tmpdir").mkdir()
    _plant(tmp_path / "tmpdir" / f"tessera-kernels-{os.getuid()}", library, 0o777)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _run_child(tmp_path, blocker / "kernels")
    assert not marker.exists() and result["value"] == 42
    assert any(f"tessera-kernels-{os.getuid()} is refused" in w for w in result["warnings"])


def test_a_private_fallback_folder_is_used_silently(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _run_child(tmp_path, blocker / "kernels")
    assert result == {"value": 42, "warnings": []}
    fallback = tmp_path / "tmpdir" / f"tessera-kernels-{os.getuid()}"
    assert (fallback / f"tsr_{cc._key(SOURCE, ())}.so").is_file()
    assert os.stat(fallback).st_mode & 0o777 == 0o700


def test_a_folder_above_that_others_can_rename_in_is_refused(tmp_path, planted):
    marker, library = planted
    (tmp_path / "open").mkdir()
    _plant(tmp_path / "open" / "cache", library, 0o700)
    os.chmod(tmp_path / "open", 0o777)  # not sticky: anyone may swap "cache" for their own
    result = _run_child(tmp_path, tmp_path / "open" / "cache")
    assert not marker.exists() and result["value"] == 42
    assert any("above it is writable by others" in w for w in result["warnings"])
    os.chmod(tmp_path / "open", 0o1777)  # sticky, as /tmp: only the owner may rename
    assert _run_child(tmp_path, tmp_path / "open" / "cache")["value"] == -1


def test_a_new_cache_folder_is_private(tmp_path):
    _run_child(tmp_path, tmp_path / "new" / "kernels")
    assert os.stat(tmp_path / "new" / "kernels").st_mode & 0o777 == 0o700


_TWO = ["int tsr_adversarial(void) { return 1; }", "int tsr_adversarial(void) { return 2; }"]


def test_swapped_entries_are_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    assert [_run_child(tmp_path, cache, s)["value"] for s in _TWO] == [1, 2]
    a, b = (cache / f"tsr_{cc._key(s, ())}.so" for s in _TWO)
    assert a.stat().st_size == b.stat().st_size  # nothing but the digest tells them apart
    for suffix in ("", ".sha256"):  # each library moves with its own digest
        x, y = (p.with_name(p.name + suffix) for p in (a, b))
        tmp = x.with_name("swap")
        x.rename(tmp)
        y.rename(x)
        tmp.rename(y)
    assert [_run_child(tmp_path, cache, s)["value"] for s in _TWO] == [1, 2]
    assert [_run_child(tmp_path, cache, s)["value"] for s in _TWO] == [1, 2]  # rewritten


def test_an_old_digest_record_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    _run_child(tmp_path, cache)
    lib = cache / f"tsr_{cc._key(SOURCE, ())}.so"
    record = lib.with_name(lib.name + ".sha256")
    record.write_text(cc._digest(str(lib)))  # the digest alone, naming nothing
    assert _run_child(tmp_path, cache)["value"] == 42
    assert record.read_text() == cc._record(cc._digest(str(lib)), str(lib))


@pytest.mark.parametrize("kind", ["folder", "symlink", "fifo"])
def test_an_entry_that_is_not_a_file_is_rebuilt(tmp_path, kind):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    lib = cache / f"tsr_{cc._key(SOURCE, ())}.so"
    if kind == "folder":
        (lib / "inside").mkdir(parents=True)
    elif kind == "symlink":
        good = tmp_path / "elsewhere.so"
        _run_child(tmp_path, tmp_path / "other")
        shutil.copy(tmp_path / "other" / lib.name, good)
        lib.symlink_to(good)
    else:
        os.mkfifo(lib)
    (cache / (lib.name + ".sha256")).mkdir()
    assert _run_child(tmp_path, cache)["value"] == 42
    assert lib.is_file() and not lib.is_symlink()
    assert _run_child(tmp_path, cache) == {"value": 42, "warnings": []}
