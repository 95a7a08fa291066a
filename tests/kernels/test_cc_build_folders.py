"""The compile cache's build folders: named for their process and host, and removed by the
next compile once their process is gone (killed mid-compile)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tessera.kernels import cc

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="needs a C compiler")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_build_folder_names_its_process_and_host(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    seen = []
    run = cc._run

    def spy(cmd, compiler):
        seen.extend(p.name for p in tmp_path.iterdir() if p.name.startswith(".build-"))
        run(cmd, compiler)
    monkeypatch.setattr(cc, "_run", spy)
    cc.load(f"int tsr_named(void) {{ return {len(str(tmp_path))}; }}")
    (name,) = seen
    m = cc._BUILD_NAME.match(name)
    assert m and int(m.group(1)) == os.getpid() and m.group(2) == cc._host()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]


def test_stale_build_folders_are_removed_by_the_next_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    host = cc._host()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        folders = {
            "dead": f".build-{_dead_pid()}-{host}-abc123",
            "live": f".build-{live.pid}-{host}-def456",
            # a live pid on a folder older than any build: the pid was reused
            "reused": f".build-{live.pid}-{host}-ghi789",
            "other host": f".build-{_dead_pid()}-elsewhere.example-jkl012",
            "other host, old": f".build-{live.pid}-elsewhere.example-mno345",
            "unnamed": ".build-pqr678",  # as older versions named them
            "unnamed, old": ".build-stu901",
        }
        for name in folders.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "k0.c").write_text("half a source")
        old = time.time() - cc.STALE_BUILD_SECONDS - 60
        for what in ("reused", "other host, old", "unnamed, old"):
            os.utime(tmp_path / folders[what], (old, old))
        cc.load(f"int tsr_sweep(void) {{ return {len(str(tmp_path))}; }}")
        left = {what for what, name in folders.items() if (tmp_path / name).exists()}
        assert left == {"live", "other host", "unnamed"}
    finally:
        live.kill()
        live.wait()


def test_a_compile_killed_midway_is_cleaned_up_next_time(tmp_path):
    # a child stops inside the compiler call (as if killed), leaving its build folder
    child = """
import os, signal
from tessera.kernels import cc
def hang(cmd, compiler):
    print("compiling", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
cc._run = hang
cc.load("int tsr_killed(void) { return 1; }")
"""
    env = dict(os.environ, TESSERA_CACHE_DIR=str(tmp_path), TESSERA_FASTPATH="0")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == -9 and "compiling" in out.stdout
    (stale,) = [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]
    again = subprocess.run([sys.executable, "-c", "from tessera.kernels import cc; "
                            "print(cc.load('int tsr_killed(void) { return 1; }').tsr_killed())"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.split() == ["1"], again.stderr
    assert not stale.exists()
