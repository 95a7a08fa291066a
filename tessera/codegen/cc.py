"""The system C compiler, and a content-addressed cache of the libraries it builds.

``load(source)`` returns a ``ctypes.CDLL`` of ``source`` compiled with
``cc -O3 -march=native -fopenmp-simd -shared -fPIC``. The library is cached on disk under
``$TESSERA_CACHE_DIR`` (default ``~/.cache/tessera/kernels``) by the SHA-256 of everything
that decides the binary: the source, the flags, the compiler's version line and this CPU's
instruction-set flags (``-march=native`` code must not run on another CPU). A second
process compiling the same graph loads the cached library in milliseconds.

Writes are atomic (compile to a temporary name, then ``os.replace``). Next to each library
a ``.sha256`` file records its digest; a library whose bytes do not match it (truncated,
overwritten) is rebuilt, never loaded.

>>> lib = load("int tsr_answer(void) { return 42; }")   # doctest: +SKIP
>>> lib.tsr_answer()                                      # doctest: +SKIP
42
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

__all__ = ["CompileError", "compiler", "cache_dir", "load", "build", "FLAGS", "last_build",
           "totals"]

# -fopenmp-simd: the simd pragmas only; threads come from the runtime, not an OpenMP library
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC", "-std=gnu11",
         # results are unchanged by these two (no errno from sqrt, no FP traps), but
         # they let sqrt and friends vectorise
         "-fno-math-errno", "-fno-trapping-math",
         # integer overflow wraps as NumPy's does, instead of being undefined
         "-fwrapv")
LIBS = ("-lm",)


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a codegen bug: the message has the log)."""


@functools.cache
def compiler() -> str | None:
    """Path of the C compiler: ``$CC`` if set, else ``cc``/``gcc``/``clang`` on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if os.path.isfile(cc) else None)
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


@functools.cache
def _fingerprint() -> str:
    """What besides the source decides the binary: compiler version, flags, CPU features."""
    cc = compiler() or ""
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return "\n".join([cc, *version, " ".join(FLAGS + LIBS), cpu])


def cache_dir() -> str:
    """``$TESSERA_CACHE_DIR``, else ``$XDG_CACHE_HOME/tessera/kernels``, else
    ``~/.cache/tessera/kernels``."""
    d = os.environ.get("TESSERA_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        d = os.path.join(base, "tessera", "kernels")
    return d


_LOADED: dict[str, ctypes.CDLL] = {}
last_build: dict = {}  # how the last load() went: {"key", "cached", "seconds"} (for stats)
# every load() of this process: how many, how many compiled (cache misses), seconds spent
totals: dict = {"loads": 0, "compiled": 0, "seconds": 0.0}


def load(source: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The compiled library of ``source`` (built with ``FLAGS`` and ``extra``), from the
    cache when it holds a sound copy."""
    t0 = time.perf_counter()
    key = _key(source, extra)
    lib = _LOADED.get(key)
    cached = True
    if lib is None:
        path, cached = _library(key, source, extra)
        lib = _LOADED[key] = ctypes.CDLL(path)
    seconds = time.perf_counter() - t0
    last_build.update(key=key, cached=cached, seconds=seconds)
    totals.update(loads=totals["loads"] + 1, compiled=totals["compiled"] + (not cached),
                  seconds=totals["seconds"] + seconds)
    return lib


def build(source: str, extra: tuple[str, ...] = ()) -> str:
    """The path of ``source``'s compiled library, built unless the cache holds a sound
    copy, for loaders other than ctypes (a Python extension module, say)."""
    return _library(_key(source, extra), source, extra)[0]


def _key(source: str, extra: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join([_fingerprint(), *extra, source]).encode()).hexdigest()[:32]


def _library(key: str, source: str, extra: tuple[str, ...]) -> tuple[str, bool]:
    """(path, whether it was in the cache already)."""
    path = os.path.join(_writable(cache_dir()), f"tsr_{key}.so")
    if _sound(path):
        return path, True
    _build(source, path, extra)
    return path, False


def _writable(d: str) -> str:
    """``d``, created if needed; a private temporary directory when ``d`` cannot be written
    (a read-only home), so that compiling still works, only without reuse across runs."""
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"tessera-kernels-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    return fallback


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _sound(path: str) -> bool:
    """The library exists and its bytes match the digest recorded when it was built."""
    try:
        with open(path + ".sha256") as f:
            recorded = f.read().strip()
        return _digest(path) == recorded
    except OSError:
        return False


def _build(source: str, path: str, extra: tuple[str, ...] = ()) -> None:
    cc = compiler()
    if cc is None:
        raise CompileError("no C compiler found (set CC or install cc/gcc/clang)")
    d = os.path.dirname(path)
    with tempfile.TemporaryDirectory(dir=d, prefix=".build-") as tmp:
        src, lib = os.path.join(tmp, "k.c"), os.path.join(tmp, "k.so")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([cc, *FLAGS, *extra, src, "-o", lib, *LIBS], capture_output=True,
                              text=True, timeout=600)
        if proc.returncode != 0:
            raise CompileError(f"{os.path.basename(cc)} failed on generated code:\n"
                               f"{proc.stderr[-4000:]}")
        digest = _digest(lib)
        # the library first, then its digest: a crash in between leaves an entry that
        # _sound() rejects, so it is rebuilt
        os.replace(lib, path)
        with open(os.path.join(tmp, "d"), "w") as f:
            f.write(digest)
        os.replace(os.path.join(tmp, "d"), path + ".sha256")
