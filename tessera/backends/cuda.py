"""``tessera.backends.cuda``: cuBLAS and attention switches, recorded (no CUDA here).

>>> import tessera
>>> tessera.backends.cuda.matmul.allow_tf32 = True
>>> tessera.backends.cuda.matmul.allow_tf32, tessera.backends.cuda.is_built()
(True, False)
"""
from __future__ import annotations

from typing import Any


def is_built() -> bool:
    return False


class cuBLASModule:
    """``torch.backends.cuda.matmul``: its known attributes only, as in PyTorch."""

    _FIELDS = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
               "allow_bf16_reduced_precision_reduction": True,
               "allow_fp16_accumulation": False, "fp32_precision": "none"}

    def __init__(self) -> None:
        object.__setattr__(self, "_values", dict(self._FIELDS))

    def __getattr__(self, name: str) -> Any:
        if name in self._FIELDS:
            return self._values[name]
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._FIELDS:
            raise AttributeError(f"Unknown attribute {name}")
        self._values[name] = value

    def _set(self, name: str, value: Any) -> None:
        self._values[name] = value


matmul = cuBLASModule()
_SDP = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def enable_flash_sdp(enabled: bool) -> None:
    _SDP["flash"] = enabled


def enable_mem_efficient_sdp(enabled: bool) -> None:
    _SDP["mem_efficient"] = enabled


def enable_math_sdp(enabled: bool) -> None:
    _SDP["math"] = enabled


def enable_cudnn_sdp(enabled: bool) -> None:
    _SDP["cudnn"] = enabled


def flash_sdp_enabled() -> bool:
    return _SDP["flash"]


def mem_efficient_sdp_enabled() -> bool:
    return _SDP["mem_efficient"]


def math_sdp_enabled() -> bool:
    return _SDP["math"]


def cudnn_sdp_enabled() -> bool:
    return _SDP["cudnn"]


def is_flash_attention_available() -> bool:
    return False


def preferred_linalg_library(backend=None):
    return None


def preferred_blas_library(backend=None):
    return None
