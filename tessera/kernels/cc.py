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

A source given as a list ``[header, *definitions]`` is the same program (the cache key is
its joined text), but a large one compiles as several translation units at once, each the
header plus a share of the definitions, linked into one library: a cold compile of a big
graph takes about 1/cores of the time. The definitions must then see only the header, not
each other's static functions.
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


def load(source: str | list[str], extra: tuple[str, ...] = (), split: bool | None = None
         ) -> ctypes.CDLL:
    """The compiled library of ``source`` (built with ``FLAGS`` and ``extra``), from the
    cache when it holds a sound copy. ``source`` may be ``[header, *definitions]``, which
    large sources compile in parallel (see the module's docstring); ``split=True`` says the
    definitions are large whatever their length (macro instantiations)."""
    t0 = time.perf_counter()
    key = _key(_text(source), extra)
    lib = _LOADED.get(key)
    cached = True
    if lib is None:
        path, cached = _library(key, source, extra, split)
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


def _text(source: str | list[str]) -> str:
    return source if isinstance(source, str) else "\n\n".join(source) + "\n"


def _key(source: str, extra: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join([_fingerprint(), *extra, source]).encode()).hexdigest()[:32]


def _library(key: str, source: str | list[str], extra: tuple[str, ...],
             split: bool | None = None) -> tuple[str, bool]:
    """(path, whether it was in the cache already)."""
    path = os.path.join(_writable(cache_dir()), f"tsr_{key}.so")
    if _sound(path):
        return path, True
    _build(source, path, extra, split)
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


# below this many characters of definitions one compiler process is about as fast
PARALLEL_MIN_CHARS = 16_000


def _units(source: str | list[str], split: bool | None = None) -> list[str]:
    """The translation units to compile: the source, or its header plus a share of its
    definitions each, one share per core, balanced by length (``split``: see ``load``)."""
    if isinstance(source, str):
        return [source]
    header, defs = source[0], source[1:]
    n = min(len(defs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    if n < 2 or split is False or (not split and sum(map(len, defs)) < PARALLEL_MIN_CHARS):
        return [_text(source)]
    shares: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for d in sorted(defs, key=len, reverse=True):  # longest first, onto the lightest share
        k = sizes.index(min(sizes))
        shares[k].append(d)
        sizes[k] += len(d)
    return [_text([header, *share]) for share in shares]


def _build(source: str | list[str], path: str, extra: tuple[str, ...] = (),
           split: bool | None = None) -> None:
    cc = compiler()
    if cc is None:
        raise CompileError("no C compiler found (set CC or install cc/gcc/clang)")
    d = os.path.dirname(path)
    units = _units(source, split)
    with tempfile.TemporaryDirectory(dir=d, prefix=".build-") as tmp:
        lib = os.path.join(tmp, "k.so")
        srcs = [os.path.join(tmp, f"k{i}.c") for i in range(len(units))]
        for src, text in zip(srcs, units):
            with open(src, "w") as f:
                f.write(text)
        if len(srcs) == 1:
            _run([cc, *FLAGS, *extra, srcs[0], "-o", lib, *LIBS], cc)
        else:  # the units at once, then one link
            objs = [src[:-2] + ".o" for src in srcs]
            procs = [subprocess.Popen([cc, *FLAGS, *extra, "-c", src, "-o", obj],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for src, obj in zip(srcs, objs)]
            errors = [_finish(p) for p in procs]
            for err in errors:
                if err is not None:
                    raise CompileError(f"{os.path.basename(cc)} failed on generated code:\n"
                                       f"{err[-4000:]}")
            _run([cc, *FLAGS, *extra, *objs, "-o", lib, *LIBS], cc)
        digest = _digest(lib)
        # the library first, then its digest: a crash in between leaves an entry that
        # _sound() rejects, so it is rebuilt
        os.replace(lib, path)
        with open(os.path.join(tmp, "d"), "w") as f:
            f.write(digest)
        os.replace(os.path.join(tmp, "d"), path + ".sha256")


def _finish(proc: subprocess.Popen) -> str | None:
    """Wait for a compiler process: None when it succeeded, else its error log."""
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "timed out after 600 s"
    return None if proc.returncode == 0 else err


def _run(cmd: list[str], cc: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise CompileError(f"{os.path.basename(cc)} failed on generated code:\n"
                           f"{proc.stderr[-4000:]}")
