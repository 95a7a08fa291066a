"""``python -m bench --max-isa avx2`` (or ``TESSERA_BENCH_MAX_ISA=avx2``): every framework
capped to AVX2 and FMA, to measure on an AVX-512 machine what an AVX2 one (an AMD Zen 3)
runs. The cap is a set of environment variables, set before any framework loads and
inherited by every child process:

- tessera: ``TESSERA_MAX_ISA`` (every kernel family, and the flags generated C compiles with)
- NumPy's OpenBLAS: ``OPENBLAS_CORETYPE=Haswell`` (the AVX2 kernels a Zen 3 gets too)
- PyTorch: ``ATEN_CPU_CAPABILITY=avx2`` (ATen's kernels and torch.compile's generated C++),
  ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's GEMM)
- JAX: ``--xla_cpu_max_isa=AVX2`` in ``XLA_FLAGS`` (the code XLA generates)

Two peers run AVX-512 under a cap all the same (``UNCAPPED``): the results mark their
columns and leave them out of the best-peer ratios (``compared``).

- onnxruntime has no such switch: MLAS picks its kernels by CPUID.
- JAX: ``--xla_cpu_max_isa`` narrows only the code XLA generates. XLA hands its dots (and
  some reductions and transposes) to YNNPACK (``__ynn_fusion`` in the compiled HLO), whose
  kernels are chosen by CPUID (cpuinfo) with no switch. Under the cap, ``perf record`` of
  the training section's MLP step has 23% of its samples in
  ``ynn::dot_fp32_5x64x1_1x16x1_avx512`` (an inner loop of ``vfmadd231ps`` on zmm
  registers), more in ``ynn::transpose_x32_avx512`` and ``ynn::sum_kn_fp32_avx512``; that
  step's 2.45 GFLOP of products in 8.9 ms on two Zen 5 cores at 4.1 GHz is 275 GFLOP/s,
  above AVX2's FMA peak of 262 (two 8-lane FMAs a cycle and core). Turning YNNPACK off
  (``--xla_cpu_experimental_ynn_fusion_type=``) sends the dots to Eigen instead, which
  would measure a JAX no AVX2 machine runs (there YNNPACK picks its AVX2 kernels), so it
  stays on and out of the ratio.

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
>>> compared(("torch", "jax", "onnxruntime"), "avx2")
('torch',)
"""
from __future__ import annotations

import os

__all__ = ["CAPS", "environment", "apply_cap", "cap", "header_line", "UNCAPPED", "compared",
           "label"]

VARIABLE = "TESSERA_BENCH_MAX_ISA"
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
    """Set this process's (and so its children's) environment for ``cap()``."""
    os.environ.update(environment(cap()))


def compared(peers: tuple, name: str | None = "") -> tuple:
    """``peers`` less those a cap ``name`` (default: this run's, ``cap()``) does not reach:
    the peers a best-peer ratio may compare with."""
    name = cap() if name == "" else name
    return tuple(p for p in peers if name is None or p not in UNCAPPED)


def label(column: str, peer: str) -> str:
    """A results column's heading, marked when ``peer`` ran AVX-512 under this run's cap."""
    return column if cap() is None or peer not in UNCAPPED else f"{column} (AVX-512)"


def header_line(cpu: str) -> str | None:
    """The results' header line saying the run was capped, or None without a cap."""
    name = cap()
    if name is None:
        return None
    env = ", ".join(f"{k}={v}" for k, v in environment(name).items() if k != "XLA_FLAGS")
    return (f"ISA: AVX-512 capped to {name.upper()} on {cpu} (an emulation of an AVX2 "
            f"machine, not one: {env}, XLA_FLAGS={_XLA}); not capped: "
            f"{'; '.join(f'{p} ({why})' for p, why in UNCAPPED.items())}: AVX-512 kernels, "
            "marked in their columns and left out of the best-peer ratios")
