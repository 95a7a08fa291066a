"""Run a peer's native libraries as on a CPU whose OS does not enable AVX-512, for
``--max-isa avx2`` (``bench/isa.py``).

onnxruntime's MLAS and jaxlib's YNNPACK choose their kernels by CPUID and have no switch to
cap them. Before any of them uses AVX-512 it asks whether the OS saves the AVX-512 registers:
``xgetbv`` reads XCR0, whose bits 5-7 (opmask, ZMM_Hi256, Hi16_ZMM) say so (17-18 for AMX's
tiles). An OS without them makes every such library run its AVX2 kernels, whatever CPUID says.
So ``masked_site`` mirrors a package into a cache directory, each shared library copied with
its ``xgetbv`` instructions (found by objdump's disassembly, never by a byte search: the
three bytes also occur inside other instructions) replaced by ``int3; nop; nop``, the other
files symlinked; and ``shim`` builds a small library, preloaded, whose SIGTRAP handler
executes ``xgetbv`` for the trapped site and returns XCR0 without those bits. MLAS's platform
setup, cpuinfo and LLVM's host-feature query (XLA's code generator) all read XCR0 this way,
once, when they start: the traps cost nothing afterwards. The copies are cached by each
library's path, size and modification time.

>>> sorted(MASKED)
['jaxlib', 'onnxruntime']
>>> hex(HIDDEN)
'0x600e0'
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile

__all__ = ["MASKED", "HIDDEN", "masked_site", "shim", "environment"]

# the packages whose libraries choose kernels by CPUID, and the peer each belongs to
MASKED = {"onnxruntime": "onnxruntime", "jaxlib": "jax"}
HIDDEN = 0xE0 | 0x60000   # XCR0's AVX-512 state bits (5-7) and AMX's tile state (17-18)
_TRAP = b"\xcc\x90\x90"    # int3; nop; nop: as long as xgetbv (0f 01 d0)

_SHIM = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <ucontext.h>

/* A trap from a patched site (int3 followed by two nops): run xgetbv for it and hide the
   AVX-512 and AMX state bits of XCR0; any other SIGTRAP gets the default action. */
static void on_trap(int sig, siginfo_t *info, void *ctx) {
    greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    (void)info;
    if (ip[0] == 0x90 && ip[1] == 0x90) {
        uint32_t lo, hi, which = (uint32_t)g[REG_RCX];
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(which));
        if (which == 0) lo &= ~(uint32_t)HIDDEN;
        g[REG_RAX] = lo;
        g[REG_RDX] = hi;
        g[REG_RIP] += 2;
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa = {0};
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, 0);
}
"""


def _cache() -> str:
    from tessera.kernels.cc import cache_dir
    return os.path.join(cache_dir(), "xcr0-masked")


def shim() -> str:
    """The preloaded trap handler, compiled once into the cache; its path."""
    path = os.path.join(_cache(), f"shim-{hashlib.sha1(_SHIM.encode()).hexdigest()[:12]}.so")
    if not os.path.exists(path):
        os.makedirs(_cache(), exist_ok=True)
        with tempfile.TemporaryDirectory(dir=_cache()) as tmp:
            src = os.path.join(tmp, "shim.c")
            with open(src, "w") as f:
                f.write(_SHIM)
            out = os.path.join(tmp, "shim.so")
            subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC",
                            f"-DHIDDEN={HIDDEN:#x}", "-o", out, src], check=True)
            os.replace(out, path)
    return path


def _sites(lib: str) -> list[int]:
    """File offsets of the ``xgetbv`` instructions in the ELF library ``lib``."""
    heads = subprocess.run(["objdump", "-h", lib], capture_output=True, text=True,
                           check=True).stdout
    sections = [(int(vma, 16), int(size, 16), int(off, 16)) for size, vma, off in re.findall(
        r"^\s*\d+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", heads, re.M)]
    proc = subprocess.Popen(["objdump", "-d", "--no-show-raw-insn", lib],
                            stdout=subprocess.PIPE, text=True)
    found = []
    assert proc.stdout is not None
    for line in proc.stdout:   # streamed: jaxlib's disassembly is gigabytes
        if "xgetbv" in line:
            m = re.match(r"\s*([0-9a-f]+):\s+xgetbv\s*$", line)
            if m:
                found.append(int(m.group(1), 16))
    if proc.wait():
        raise RuntimeError(f"objdump -d {lib} failed ({proc.returncode})")
    return [a - vma + off for a in found for vma, size, off in sections if vma <= a < vma + size]


def _mirror(src: str, dst: str) -> int:
    """``dst`` as ``src`` with its shared libraries patched and the rest symlinked; the number
    of sites patched."""
    patched = 0
    os.makedirs(dst)
    for name in sorted(os.listdir(src)):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(s) and not os.path.islink(s):
            patched += _mirror(s, d)
            continue
        sites = _sites(s) if ".so" in name and os.path.isfile(s) else []
        if not sites:
            os.symlink(s, d)
            continue
        with open(s, "rb") as f:
            data = bytearray(f.read())
        for o in sites:
            if data[o:o + 3] != b"\x0f\x01\xd0":
                raise RuntimeError(f"{s}: no xgetbv at file offset {o:#x}")
            data[o:o + 3] = _TRAP
        with open(d, "wb") as f:
            f.write(data)
        os.chmod(d, os.stat(s).st_mode)
        patched += len(sites)
    return patched


def _libraries(root: str):
    for base, _dirs, files in os.walk(root):
        for name in sorted(files):
            if ".so" in name:
                p = os.path.join(base, name)
                st = os.stat(p)
                yield f"{p}:{st.st_size}:{st.st_mtime_ns}"


def masked_site(packages=tuple(MASKED)) -> tuple[str, tuple[str, ...]]:
    """A directory to put first on ``PYTHONPATH`` holding ``packages`` with their AVX-512
    state hidden, built once (about a minute for jaxlib's 350 MB library), and the packages
    it holds (an uninstalled one is left out)."""
    roots = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots[name] = list(spec.submodule_search_locations)[0]
    key = hashlib.sha1("\n".join(line for name in sorted(roots)
                                 for line in _libraries(roots[name])).encode()).hexdigest()[:16]
    site = os.path.join(_cache(), f"site-{key}")
    if not os.path.isdir(site):
        os.makedirs(_cache(), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=_cache(), prefix=".site-")
        try:
            for name, root in roots.items():
                _mirror(root, os.path.join(tmp, name))
            os.replace(tmp, site)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return site, tuple(sorted(roots))


def environment() -> tuple[dict[str, str], tuple[str, ...]]:
    """The variables that run the masked packages in every child process (``PYTHONPATH`` and
    ``LD_PRELOAD``) and the peers they cap; none when objdump or a C compiler is missing."""
    if shutil.which("objdump") is None:
        return {}, ()
    site, names = masked_site()
    path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    preload = " ".join(p for p in (shim(), os.environ.get("LD_PRELOAD", "")) if p)
    return {"PYTHONPATH": path, "LD_PRELOAD": preload}, tuple(MASKED[n] for n in names)
