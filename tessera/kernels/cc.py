"""The system C compiler, and a content-addressed cache of the libraries it builds.

``load(source)`` returns a ``ctypes.CDLL`` of ``source`` compiled with
``cc -O3 -march=native -fopenmp-simd -shared -fPIC`` (narrowed by ``TESSERA_MAX_ISA``, below).
The library is cached on disk under ``$TESSERA_CACHE_DIR`` (default
``~/.cache/tessera/kernels``) by the SHA-256 of everything that decides the binary: the
source, the flags, the compiler's version line and this CPU's instruction-set flags
(``-march=native`` code must not run on another CPU). A second
process compiling the same graph loads the cached library in milliseconds.

Writes are atomic (compile in a ``.build-<pid>-<host>-*`` folder, then ``os.replace``); the
build folders of processes killed mid-compile are removed by the next compile. Next to each
library a ``.sha256`` file records its digest and its name (``sha256sum`` format); a library
whose bytes or name do not match it (truncated, overwritten, swapped with another entry), or
that is not a regular file, is rebuilt, never loaded.

The cache folder must be private: created by this process with mode 0700, or else owned by
this user, not writable by group or others, inside folders others cannot rename it out of. A
folder failing that is refused with a warning, and kernels compile into a private temporary
folder removed at exit: a library in the cache runs with the user's rights once loaded, so
only the user may be able to write there (the digests guard against corruption, not against
someone who can write the folder).

>>> lib = load("int tsr_answer(void) { return 42; }")   # doctest: +SKIP
>>> lib.tsr_answer()                                      # doctest: +SKIP
42

A source given as a list ``[header, *definitions]`` is the same program (the cache key is
its joined text), but a large one compiles as several translation units at once, each the
header plus a share of the definitions, linked into one library: a cold compile of a big
graph takes about 1/cores of the time. The definitions must then see only the header, not
each other's static functions.

``TESSERA_MAX_ISA`` caps the instruction set of every kernel family, to measure or test on an
AVX-512 CPU what an AVX2 one runs: ``avx2`` (AVX2 and FMA as Haswell and Zen 3 have them: no
AVX-512, no AVX-VNNI), ``portable`` (or ``none``: baseline x86-64), ``avx512`` (or unset:
everything the CPU has). Under a cap the libraries compile with ``isa_flags()``
(``-mno-avx512f -mno-avxvnni``, or ``-march=x86-64`` for baseline, and
``-DTSR_MAX_ISA=<level>`` for the C that checks the CPU itself), which the cache key
includes, and each family picks the widest of its paths within the cap. NumPy's
BLAS is not tessera's to cap: ``OPENBLAS_CORETYPE=Haswell`` does that before NumPy loads.

>>> max_isa() in ISA_LEVELS
True
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable

__all__ = ["CompileError", "compiler", "cache_dir", "load", "load_dispatching",
           "load_files", "baseline_flags", "build", "entry", "FLAGS",
           "last_build", "totals", "addresses", "max_isa", "isa_flags", "ISA_LEVELS"]

# -fopenmp-simd: the simd pragmas only; threads come from the runtime, not an OpenMP library
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC", "-std=gnu11",
         # results are unchanged by these two (no errno from sqrt, no FP traps), but
         # they let sqrt and friends vectorise
         "-fno-math-errno", "-fno-trapping-math",
         # integer overflow wraps as NumPy's does, instead of being undefined
         "-fwrapv")
LIBS = ("-lm",)

# TESSERA_MAX_ISA's values, narrowest first: a family's path of level i runs under cap j >= i
ISA_LEVELS = ("portable", "avx2", "avx512")
_ISA_ALIASES = {"": "avx512", "none": "portable", "native": "avx512"}
_X86 = ("x86_64", "amd64", "i386", "i686")


def addresses() -> Callable:
    """``address(a)``: array ``a``'s data address (None for None), as a C kernel's pointer
    argument, remembered for the last array given. A compiled graph calls a bound kernel
    with the same arena views and variables every step, and ``a.ctypes.data`` costs about
    a microsecond, a few percent of a small kernel. The array is held weakly (a graph's
    recycled outputs come back only once the caller's last reference dies): while it lives,
    its identity stands for its address.

    >>> import numpy as np
    >>> address, a = addresses(), np.zeros(3)
    >>> address(a) == a.ctypes.data and address(None) is None
    True
    """
    last: list = [None, None]   # weak reference, address

    def address(a):
        ref = last[0]
        if ref is not None and ref() is a:
            return last[1]
        if a is None:
            return None
        last[0], last[1] = weakref.ref(a), a.ctypes.data
        return last[1]
    return address


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


def max_isa() -> str:
    """The widest instruction set kernels may use, one of ``ISA_LEVELS``:
    ``$TESSERA_MAX_ISA`` (ValueError for another name), ``"avx512"`` when unset (no cap)."""
    raw = os.environ.get("TESSERA_MAX_ISA", "").strip().lower()
    name = _ISA_ALIASES.get(raw, raw)
    if name not in ISA_LEVELS:
        raise ValueError(f"TESSERA_MAX_ISA={raw!r}: expected one of {', '.join(ISA_LEVELS)} "
                         "or none")
    return name


def isa_flags() -> tuple[str, ...]:
    """The compiler flags that keep a library within ``max_isa()`` (after ``FLAGS`` and a
    library's own flags, so they win over ``-march=native``); none without a cap. Function
    target attributes still compile wider bodies, which the families never pick.

    >>> max_isa() != "avx512" or isa_flags() == ()
    True
    """
    level = ISA_LEVELS.index(max_isa())
    if level == len(ISA_LEVELS) - 1 or not _x86():
        return ()
    narrow = ("-mno-avx512f", "-mno-avxvnni") if level == 1 else \
        ("-march=x86-64", "-mtune=generic")
    return (*narrow, f"-DTSR_MAX_ISA={level}")


@functools.cache
def _x86() -> bool:
    import platform
    return platform.machine().lower() in _X86


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
    extra = (*extra, *isa_flags())
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


def baseline_flags() -> tuple[str, ...]:
    """The flags of a library that picks its instruction set at run time (``load_dispatching``):
    baseline x86-64, overriding ``FLAGS``' ``-march=native``, as a deployed library is built;
    only its bodies' target attributes then use wider instructions. None off x86.

    >>> baseline_flags() in ((), ("-march=x86-64", "-mtune=generic"))
    True
    """
    return ("-march=x86-64", "-mtune=generic") if _x86() else ()


def load_dispatching(source: str, signatures) -> ctypes.CDLL:
    """The library of a kernel family compiled once per instruction set under target
    attributes, which picks its path at run time (``gemm.c``, ``nchwc.c``, ``attention.c``):
    ``source`` built with ``baseline_flags()``, each ``(name, argtypes, restype)`` of
    ``signatures`` declared on it.

    >>> import ctypes
    >>> lib = load_dispatching("int tsr_twice(int x) { return 2 * x; }",
    ...                        [("tsr_twice", [ctypes.c_int], ctypes.c_int)])  # doctest: +SKIP
    >>> lib.tsr_twice(21)                                                     # doctest: +SKIP
    42
    """
    lib = load(source, baseline_flags())
    for name, args, res in signatures:
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


def load_files(files: dict[str, str], units: list[str], extra: tuple[str, ...] = ()
               ) -> ctypes.CDLL:
    """The library linked from the translation units ``units``, files of one folder
    ``files`` ({name: text}) that include each other (a deployed model's program and its
    runtime), compiled at once (as many as there are cores) with ``FLAGS``, ``-I`` that
    folder and ``extra``, and cached as ``load`` caches: the key is every file's name and
    text, the units and the flags.

    >>> lib = load_files({"a.h": "int f(void);", "a.c": '#include "a.h"\\nint f(void) '
    ...                   '{ return 1; }'}, ["a.c"])   # doctest: +SKIP
    >>> lib.f()                                         # doctest: +SKIP
    1
    """
    t0 = time.perf_counter()
    extra = (*extra, *isa_flags())
    text = "".join(f"/* file {name} ({len(files[name])}) */\n{files[name]}"
                   for name in sorted(files)) + f"/* units {' '.join(units)} */"
    key = _key(text, extra)
    lib = _LOADED.get(key)
    cached = True
    if lib is None:
        path, cached = _cached_library(key, lambda p: _build_files(files, units, p, extra))
        lib = _LOADED[key] = ctypes.CDLL(path)
    seconds = time.perf_counter() - t0
    last_build.update(key=key, cached=cached, seconds=seconds)
    totals.update(loads=totals["loads"] + 1, compiled=totals["compiled"] + (not cached),
                  seconds=totals["seconds"] + seconds)
    return lib


def build(source: str, extra: tuple[str, ...] = ()) -> str:
    """The path of ``source``'s compiled library, built unless the cache holds a sound
    copy, for loaders other than ctypes (a Python extension module, say)."""
    extra = (*extra, *isa_flags())
    return _library(_key(source, extra), source, extra)[0]


def entry(name: str, make: Callable[[str], None]) -> tuple[str, bool]:
    """(path, whether it was cached) of the cache entry ``name``, a file that ``make(path)``
    writes (another compiler's library: the TVM backend's modules), made unless the cache
    holds a sound copy. The same folder and rules as the kernels': written in a build
    folder and moved into place with its digest, an entry failing its digest made again.

    >>> path, cached = entry("doc-example.txt", lambda p: open(p, "w").write("hi"))
    ... # doctest: +SKIP
    >>> open(path).read()  # doctest: +SKIP
    'hi'
    """
    path = os.path.join(_folder(cache_dir()), name)
    if _sound(path):
        return path, True
    try:
        _make(path, make)
    except _EntryBlocked:
        path = os.path.join(_private_temp("an entry there cannot be replaced"), name)
        _make(path, make)
    return path, False


def _make(path: str, make: Callable[[str], None]) -> None:
    d = os.path.dirname(path)
    _remove_stale_builds(d)
    with tempfile.TemporaryDirectory(dir=d, prefix=f"{_BUILD_PREFIX}{os.getpid()}-{_host()}-"
                                     ) as tmp:
        out = os.path.join(tmp, os.path.basename(path))
        make(out)
        _install(out, path, tmp)


def _text(source: str | list[str]) -> str:
    return source if isinstance(source, str) else "\n\n".join(source) + "\n"


def _key(source: str, extra: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join([_fingerprint(), *extra, source]).encode()).hexdigest()[:32]


def _library(key: str, source: str | list[str], extra: tuple[str, ...],
             split: bool | None = None) -> tuple[str, bool]:
    """(path, whether it was in the cache already)."""
    return _cached_library(key, lambda path: _build(source, path, extra, split))


def _cached_library(key: str, make: Callable[[str], None]) -> tuple[str, bool]:
    """(path, whether it was in the cache already) of library ``key``, which ``make(path)``
    builds unless the cache holds a sound copy."""
    path = os.path.join(_folder(cache_dir()), f"tsr_{key}.so")
    if _sound(path):
        return path, True
    try:
        make(path)
    except _EntryBlocked:  # an entry that cannot be replaced: build it where nothing can be
        path = os.path.join(_private_temp("an entry there cannot be replaced"),
                            os.path.basename(path))
        make(path)
    return path, False


class _EntryBlocked(OSError):
    """A cache entry's name is taken by something that cannot be removed."""


# the folder each configured cache folder resolved to in this process (checked once)
_FOLDERS: dict[str, str] = {}


def _folder(d: str) -> str:
    """The folder to compile into for cache folder ``d``: ``d`` when it is private to this
    user; else ``$TMPDIR/tessera-kernels-<uid>`` under the same rule when ``d`` cannot be
    made (a read-only home), so compiles are still reused across runs; else a private
    temporary folder removed at exit."""
    folder = _FOLDERS.get(d)
    if folder is None or not os.path.isdir(folder):  # (removed while this process ran)
        folder = _FOLDERS[d] = _resolve(d)
    return folder


def _resolve(d: str) -> str:
    why = _refusal(d)
    if why is None:
        return d
    if why is _UNUSABLE:  # a read-only home, say: not a security matter, so no warning
        fallback = os.path.join(tempfile.gettempdir(), f"tessera-kernels-{os.getuid()}")
        d, why = fallback, _refusal(fallback)
        if why is None:
            return d
    return _private_temp(f"the kernel cache folder {d} is refused: {why}")


_UNUSABLE = "it cannot be created or written"


def _refusal(d: str) -> str | None:
    """Why ``d`` may not hold this user's kernels, or None when it may (made here, with mode
    0700, if missing)."""
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError:
        return _UNUSABLE
    if not stat.S_ISDIR(st.st_mode):
        return _UNUSABLE
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by {_who(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):o})"
    parent = os.path.dirname(os.path.realpath(d))
    while True:  # whoever can rename a folder above can swap this one for theirs
        try:
            pst = os.stat(parent)
        except OSError:
            break
        if pst.st_mode & 0o002 and not pst.st_mode & stat.S_ISVTX:
            return f"the folder {parent} above it is writable by others without the " \
                   f"sticky bit (mode {stat.S_IMODE(pst.st_mode):o})"
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.access(d, os.W_OK | os.X_OK):
        return _UNUSABLE
    return None


def _who(mode: int) -> str:
    return " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)


_TEMP: list[str] = []  # this process's private temporary folder, once made


def _private_temp(why: str) -> str:
    """A folder only this process uses (made once, removed at exit), with a warning."""
    if not _TEMP:
        _TEMP.append(tempfile.mkdtemp(prefix="tessera-kernels-"))
        atexit.register(shutil.rmtree, _TEMP[0], ignore_errors=True)
    warnings.warn(f"tessera: {why}; compiling kernels into {_TEMP[0]} instead (removed at "
                  "exit, so nothing is reused across runs)", RuntimeWarning, stacklevel=2)
    return _TEMP[0]


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _record(digest: str, path: str) -> str:
    """The text of ``path``'s ``.sha256`` file: the digest and the name it is the digest of
    (the name holds the cache key), as ``sha256sum`` writes it."""
    return f"{digest}  {os.path.basename(path)}\n"


def _sound(path: str) -> bool:
    """The library is a regular file whose bytes and name match the record written when it
    was built."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode) or \
                not stat.S_ISREG(os.lstat(path + ".sha256").st_mode):
            return False
        with open(path + ".sha256") as f:
            recorded = f.read()
        return recorded == _record(_digest(path), path)
    except (OSError, UnicodeDecodeError):
        return False


def _clear(path: str) -> None:
    """Make way for a new entry at ``path``: whatever is there that is not a regular file
    (a folder, a link) is removed; ``_EntryBlocked`` if that fails."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _EntryBlocked(str(e)) from None
    if stat.S_ISREG(st.st_mode):
        return  # os.replace overwrites it atomically
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as e:
        raise _EntryBlocked(str(e)) from None


# A build folder is named for its process and host; one whose process is gone (killed
# mid-compile) is removed by the next compile. A live pid may be a reused one, but no build
# lasts a day (every compiler call times out after 600 s), so an older folder goes too; so
# does one from another host, which this one cannot ask about.
_BUILD_PREFIX = ".build-"
_BUILD_NAME = re.compile(r"^\.build-(\d+)-(.*)-[^-]*$")
STALE_BUILD_SECONDS = 24 * 3600


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _remove_stale_builds(d: str) -> None:
    try:
        entries = [e for e in os.scandir(d) if e.name.startswith(_BUILD_PREFIX)]
    except OSError:
        return
    now, host = time.time(), _host()
    for e in entries:
        m = _BUILD_NAME.match(e.name)
        try:
            old = now - e.stat(follow_symlinks=False).st_mtime > STALE_BUILD_SECONDS
        except OSError:
            continue
        if m is None or m.group(2) != host or int(m.group(1)) == os.getpid():
            stale = old  # another host's, an unnamed one, or one of this process's pid
        else:
            stale = old or not _alive(int(m.group(1)))
        if stale:
            shutil.rmtree(e.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


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
    _remove_stale_builds(d)
    with tempfile.TemporaryDirectory(dir=d, prefix=f"{_BUILD_PREFIX}{os.getpid()}-{_host()}-"
                                     ) as tmp:
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
        _install(lib, path, tmp)


_QUOTED = re.compile(r'"([\w.-]+)"')


def _closure(files: dict[str, str], unit: str, extra: tuple[str, ...]) -> list[str]:
    """The files of ``files`` that compiling ``unit`` may read: it, and every file named in
    quotes (an ``#include``, or a macro naming a header) by it, by ``extra`` (an
    ``-include``) or by a file so found."""
    seen, todo = set(), [unit, *(x for x in extra if x in files)]
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        todo += _QUOTED.findall(files[name])
    return sorted(seen)


def _build_files(files: dict[str, str], units: list[str], path: str,
                 extra: tuple[str, ...]) -> None:
    """Link the library of ``load_files``. Each unit's object is a cache entry of its own,
    keyed by the files it may read: a unit that several libraries share (the GEMM of every
    program) compiles once."""
    cc = compiler()
    if cc is None:
        raise CompileError("no C compiler found (set CC or install cc/gcc/clang)")
    d = os.path.dirname(path)
    _remove_stale_builds(d)
    with tempfile.TemporaryDirectory(dir=d, prefix=f"{_BUILD_PREFIX}{os.getpid()}-{_host()}-"
                                     ) as tmp:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        flags = [*FLAGS, *extra, "-I", tmp]
        objs, cmds = [], []
        for u in units:
            seen = _closure(files, u, extra)
            key = _key("".join(f"/* file {n} */\n{files[n]}" for n in seen) + f"/* unit {u} */",
                       extra)
            obj = os.path.join(d, f"tsr_{key}.o")
            objs.append(obj)
            if not _sound(obj):
                built = os.path.join(tmp, f"{key}.o")
                cmds.append(([cc, *flags, "-c", os.path.join(tmp, u), "-o", built], built, obj))
        _compile_all(cmds, cc, tmp)
        lib = os.path.join(tmp, "k.so")
        _run([cc, *FLAGS, *extra, *objs, "-o", lib, *LIBS, "-lpthread"], cc)
        _install(lib, path, tmp)


def _compile_all(cmds: list, cc: str, tmp: str) -> None:
    """Run the compiler commands ``(command, output, entry)``, at most one per core at a
    time, installing each output as its cache entry."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    running: list = []
    for item in cmds + [None] * cores:
        if item is not None:
            proc = subprocess.Popen(item[0], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            running.append((proc, item))
        if running and (len(running) >= cores or item is None):
            proc, (_, built, entry) = running.pop(0)
            err = _finish(proc)
            if err is not None:
                for p, _ in running:
                    p.kill()
                    p.communicate()
                raise CompileError(f"{os.path.basename(cc)} failed on generated code:\n"
                                   f"{err[-4000:]}")
            _install(built, entry, tmp)


def _install(lib: str, path: str, tmp: str) -> None:
    """Move the built file ``lib`` (in the build folder ``tmp``) to the entry ``path``."""
    digest = _digest(lib)
    # the library first, then its digest: a crash in between leaves an entry that
    # _sound() rejects, so it is rebuilt
    _clear(path)
    _clear(path + ".sha256")
    os.replace(lib, path)
    with open(os.path.join(tmp, "d"), "w") as f:
        f.write(_record(digest, path))
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
