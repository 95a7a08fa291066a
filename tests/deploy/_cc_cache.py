"""A compile cache for the tests' builds of exported folders, used as the folder's compiler:
``make CC="python -S _cc_cache.py DIR"``. A compile (``-c``) whose preprocessed source and
flags are those of an earlier one in DIR gets that object; every other call is ``cc`` as
given. The folders the tests build differ in their model's C and mostly share gemm.c and
the runtime, whose objects (seconds of -O2 each) are then compiled once per run.

The key is what the compiler reads: the source after the preprocessor (every header and
-include in it) with the folder's path left out, and the flags. An object enters DIR only
after a compile that succeeded, and -Werror makes every warning a failure, so a cached
object stands for a compile that printed nothing."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

DIR: str | None = None   # the run's cache (tests/deploy/conftest.py); None: plain cc


def main(cache: str, args: list[str]) -> int:
    if "-c" not in args or "-o" not in args:
        return subprocess.run(["cc", *args]).returncode
    i = args.index("-o")
    out, flags = args[i + 1], args[:i] + args[i + 2:]
    pre = subprocess.run(["cc", "-E", *[a for a in flags if a != "-c"]], capture_output=True)
    if pre.returncode:
        return subprocess.run(["cc", *args]).returncode   # the compiler says what is wrong
    key = hashlib.sha256("\0".join(flags).encode() + b"\0" +
                         pre.stdout.replace(os.getcwd().encode(), b".")).hexdigest()
    hit = os.path.join(cache, key + ".o")
    if os.path.exists(hit):
        shutil.copyfile(hit, out)
        return 0
    rc = subprocess.run(["cc", *args]).returncode
    if rc == 0:
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        os.close(fd)
        shutil.copyfile(out, tmp)
        os.replace(tmp, hit)   # whole or absent, for the other worker's builds too
    return rc


def make_args() -> list[str]:
    """The arguments of ``make`` that compile through the run's cache."""
    return [f"CC={sys.executable} -S {os.path.abspath(__file__)} {DIR}"] if DIR else []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
