"""The C prelude every generated translation unit starts with: headers and the helper
functions the ops' C rules (``OpDef.to_c``) call.

Its transcendental functions are branch-free range reduction plus polynomial, so that a
``#pragma omp simd`` loop calling them vectorises (a libm call keeps the loop scalar), with
inf, NaN, overflow, subnormal results and -0 as libm's; the header describes each and its
error bound, which ``tests/codegen/test_prelude_math.py`` checks against NumPy.

>>> "TSR_INLINE float tsr_expf(float x)" in PRELUDE
True
"""
from __future__ import annotations

from tessera.kernels.csource import source

__all__ = ["PRELUDE"]

PRELUDE = source("prelude.h")
