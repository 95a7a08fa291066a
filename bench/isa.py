"""``python -m bench --max-isa avx2`` (or ``TESSERA_BENCH_MAX_ISA=avx2``): every framework
capped to AVX2 and FMA, to measure on an AVX-512 machine what an AVX2 one (an AMD Zen 3)
runs. The cap is a set of environment variables, set before any framework loads and
inherited by every child process:

- tessera: ``TESSERA_MAX_ISA`` (every kernel family, and the flags generated C compiles with)
- NumPy's OpenBLAS: ``OPENBLAS_CORETYPE=Haswell`` (the AVX2 kernels a Zen 3 gets too)
- PyTorch: ``ATEN_CPU_CAPABILITY=avx2`` (ATen's kernels and torch.compile's generated C++),
  ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's GEMM)
- JAX: ``--xla_cpu_max_isa=AVX2`` in ``XLA_FLAGS`` (the code XLA generates)

onnxruntime has no such switch: MLAS picks its kernels by CPUID, so under a cap it still
runs AVX-512, and the results mark its column and leave it out of the best-peer ratio.
The results' header says the machine is capped (``header_line``), so that nobody reads the
figures as an AVX2 machine's.

>>> sorted(environment("avx2"))[:3]
['ATEN_CPU_CAPABILITY', 'MKL_ENABLE_INSTRUCTIONS', 'ONEDNN_MAX_CPU_ISA']
>>> environment(None)
{}
"""
from __future__ import annotations

import os

__all__ = ["CAPS", "environment", "apply_cap", "cap", "header_line", "UNCAPPED"]

VARIABLE = "TESSERA_BENCH_MAX_ISA"
CAPS = ("avx2",)
# the peers no environment variable caps (they choose by CPUID)
UNCAPPED = ("onnxruntime",)
_XLA = "--xla_cpu_max_isa=AVX2"


def cap() -> str | None:
    """The cap this run is under (``$TESSERA_BENCH_MAX_ISA``), or None; ValueError for a
    name not in ``CAPS``."""
    name = os.environ.get(VARIABLE, "").strip().lower() or None
    if name is not None and name not in CAPS:
        raise ValueError(f"{VARIABLE}={name!r}: expected one of {', '.join(CAPS)}")
    return name


def environment(name: str | None) -> dict[str, str]:
    """The environment variables that cap every framework to ``name`` (none for None)."""
    if name is None:
        return {}
    xla = os.environ.get("XLA_FLAGS", "")
    return {"TESSERA_MAX_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell",
            "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "XLA_FLAGS": xla if _XLA in xla else f"{xla} {_XLA}".strip()}


def apply_cap() -> None:
    """Set this process's (and so its children's) environment for ``cap()``."""
    os.environ.update(environment(cap()))


def header_line(cpu: str) -> str | None:
    """The results' header line saying the run was capped, or None without a cap."""
    name = cap()
    if name is None:
        return None
    env = ", ".join(f"{k}={v}" for k, v in environment(name).items() if k != "XLA_FLAGS")
    return (f"ISA: AVX-512 capped to {name.upper()} on {cpu} (an emulation of an AVX2 "
            f"machine, not one: {env}, XLA_FLAGS={_XLA}); not capped: "
            f"{', '.join(UNCAPPED)} (MLAS picks AVX-512 kernels by CPUID), marked in its "
            "column and left out of the best-peer ratios")
