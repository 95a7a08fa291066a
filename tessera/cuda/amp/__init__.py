"""``tessera.cuda.amp``: PyTorch's deprecated CUDA spellings of ``tessera.amp``. Both warn
that they are deprecated and, with no CUDA here, disable themselves, as in PyTorch's CPU
build."""
from __future__ import annotations

import warnings

from tessera.amp import autocast_mode, grad_scaler

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


class autocast(autocast_mode.autocast):
    """``torch.amp.autocast("cuda", ...)`` under its deprecated name.

    >>> import tessera, warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     with tessera.cuda.amp.autocast():
    ...         tessera.ones(2).dtype
    tessera.float32
    """

    def __init__(self, enabled: bool = True, dtype=None, cache_enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        from tessera import _dtype as D
        super().__init__("cuda", dtype=D.float16 if dtype is None else dtype,
                         enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(grad_scaler.GradScaler):
    """``torch.amp.GradScaler("cuda", ...)`` under its deprecated name."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    warnings.warn("`torch.cuda.amp.custom_fwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_fwd(args..., device_type='cuda')` instead.",
                  FutureWarning, stacklevel=2)
    return autocast_mode.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    warnings.warn("`torch.cuda.amp.custom_bwd(args...)` is deprecated. Please use "
                  "`torch.amp.custom_bwd(args..., device_type='cuda')` instead.",
                  FutureWarning, stacklevel=2)
    return autocast_mode.custom_bwd(bwd, device_type="cuda")
