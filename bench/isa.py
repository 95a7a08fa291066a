"""``python -m bench --max-isa avx2`` (or ``TESSERA_BENCH_MAX_ISA=avx2``): every framework
capped to AVX2 and FMA, to measure on an AVX-512 machine what an AVX2 one (an AMD Zen 3)
runs. The cap is a set of environment variables, set before any framework loads and
inherited by every child process:

- tessera: ``TESSERA_MAX_ISA`` (every kernel family, and the flags generated C compiles with)
- NumPy's OpenBLAS: ``OPENBLAS_CORETYPE=Haswell`` (the AVX2 kernels a Zen 3 gets too)
- PyTorch: ``ATEN_CPU_CAPABILITY=avx2`` (ATen's kernels and torch.compile's generated C++),
  ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's GEMM)
- JAX: ``--xla_cpu_max_isa=AVX2`` in ``XLA_FLAGS`` (the code XLA generates)

Two peers have no such variable: onnxruntime (MLAS picks its kernels by CPUID) and JAX
(``--xla_cpu_max_isa`` narrows only the code XLA generates; XLA hands its dots, and some
reductions and transposes, to YNNPACK, whose kernels are chosen by CPUID: uncapped, ``perf``
shows the MLP step in ``ynn::dot_fp32_5x64x1_1x16x1_avx512``). Both are capped by hiding
the AVX-512 state from their libraries (``bench/xcr0.py``: XCR0 as an OS without AVX-512
support reports it), after which MLAS runs its FMA3 kernels and YNNPACK
``ynn::dot_fp32_6x16x1_1x8x1_fma3``; a 1024x1024 product runs 1.8-1.9x slower in each.
Where that cannot be done (no objdump), they run AVX-512 (``uncapped``): the results mark
their columns and leave them out of the best-peer ratios (``compared``).

PyTorch is capped: under these variables its GEMM is MKL's ``mkl_blas_def_sgemm_kernel_0_zen``
(ymm registers only), and torch.compile's generated kernels compile for AVX2.
The results' header says the machine is capped (``header_line``), so that nobody reads the
figures as an AVX2 machine's.

>>> sorted(environment("avx2"))[:3]
['ATEN_CPU_CAPABILITY', 'MKL_ENABLE_INSTRUCTIONS', 'ONEDNN_MAX_CPU_ISA']
>>> environment(None)
{}
>>> compared(("torch", "jax", "onnxruntime"), None)
('torch', 'jax', 'onnxruntime')
>>> compared(("torch", "jax", "onnxruntime"), "avx2", masked=("onnxruntime",))
('torch', 'onnxruntime')
"""
from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["CAPS", "environment", "apply_cap", "cap", "header_line", "UNCAPPED", "uncapped",
           "compared", "label"]

VARIABLE = "TESSERA_BENCH_MAX_ISA"
MASKED = "TESSERA_BENCH_XCR0_MASKED"   # the peers whose AVX-512 state is hidden, set once
CAPS = ("avx2",)
# the peers no environment variable caps, and why (they choose kernels by CPUID)
UNCAPPED = {"onnxruntime": "MLAS picks its kernels by CPUID",
            "jax": "XLA's dots run YNNPACK, which picks its kernels by CPUID"}
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
    """Set this process's (and so its children's) environment for ``cap()``, and hide the
    AVX-512 state from the peers no variable caps (once: children inherit it)."""
    name = cap()
    os.environ.update(environment(name))
    if name is not None and MASKED not in os.environ:
        from bench import xcr0
        try:
            env, peers = xcr0.environment()
        except (OSError, subprocess.SubprocessError, RuntimeError) as e:
            print(f"# bench: AVX-512 state not hidden from {', '.join(UNCAPPED)}: {e}",
                  file=sys.stderr)
            env, peers = {}, ()
        os.environ.update(env)
        os.environ[MASKED] = ",".join(peers)
        if env:   # this process too (it imports onnxruntime itself in some sections)
            import ctypes
            sys.path.insert(0, env["PYTHONPATH"].split(os.pathsep)[0])
            ctypes.CDLL(env["LD_PRELOAD"].split()[0])


def uncapped(masked: tuple | None = None) -> dict[str, str]:
    """The peers of ``UNCAPPED`` that still run AVX-512 under a cap: those whose AVX-512
    state is not hidden (``masked``, default this run's)."""
    if masked is None:
        masked = tuple(p for p in os.environ.get(MASKED, "").split(",") if p)
    return {p: why for p, why in UNCAPPED.items() if p not in masked}


def compared(peers: tuple, name: str | None = "", masked: tuple | None = None) -> tuple:
    """``peers`` less those a cap ``name`` (default: this run's, ``cap()``) does not reach:
    the peers a best-peer ratio may compare with."""
    name = cap() if name == "" else name
    return tuple(p for p in peers if name is None or p not in uncapped(masked))


def label(column: str, peer: str) -> str:
    """A results column's heading, marked when ``peer`` ran AVX-512 under this run's cap."""
    return column if cap() is None or peer not in uncapped() else f"{column} (AVX-512)"


def header_line(cpu: str) -> str | None:
    """The results' header line saying the run was capped, or None without a cap."""
    name = cap()
    if name is None:
        return None
    env = ", ".join(f"{k}={v}" for k, v in environment(name).items() if k != "XLA_FLAGS")
    masked = [p for p in UNCAPPED if p not in uncapped()]
    left = uncapped()
    return (f"ISA: AVX-512 capped to {name.upper()} on {cpu} (an emulation of an AVX2 "
            f"machine, not one: {env}, XLA_FLAGS={_XLA}"
            + (f"; {' and '.join(masked)} with XCR0's AVX-512 state hidden (bench/xcr0.py)"
               if masked else "") + ")"
            + (f"; not capped: {'; '.join(f'{p} ({why})' for p, why in left.items())}: "
               "AVX-512 kernels, marked in their columns and left out of the best-peer ratios"
               if left else ""))
