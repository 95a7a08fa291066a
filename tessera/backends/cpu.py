"""``tessera.backends.cpu``: the vector instruction set the CPU kernels can use.

>>> import tessera
>>> tessera.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2", "AVX512", "SVE256")
True
"""
from __future__ import annotations


def get_cpu_capability() -> str:
    """PyTorch's names: ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"`` on x86 (``"SVE256"``...
    on ARM), read from NumPy's runtime CPU dispatch."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as f
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as f  # type: ignore
    if all(f.get(k) for k in ("AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ")):
        return "AVX512"
    if f.get("AVX2") and f.get("FMA3"):
        return "AVX2"
    if f.get("SVE"):
        return "SVE256"
    return "DEFAULT"
