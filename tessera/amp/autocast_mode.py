"""``autocast``: regions where matrix products run in a lower precision (PyTorch's
``torch.amp.autocast``).

The per-device state (enabled, dtype) is PyTorch's. On the CPU an enabled region installs
a dispatch mode that casts the floating inputs of the ops PyTorch runs in lower precision
(matmul, conv, prelu, einsum) to the region's dtype and those it keeps in float32 (the
losses) to float32; every other op runs on its inputs' dtypes. Devices this build lacks
warn and disable the region, as PyTorch's CPU build does.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Literal

from tessera import _dispatch, _dtype as D
from tessera._tensor import Tensor
from tessera.device import device as _device

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available"]

# the ops PyTorch's CPU autocast runs in the region's dtype, and those it runs in float32
LOWER_PRECISION = frozenset({"matmul", "conv", "prelu", "einsum"})
# composites tessera builds from several ops that PyTorch autocasts as one (their bias adds
# would otherwise promote back to float32)
LOWER_PRECISION_COMPOSITES = frozenset({"linear", "addmm", "baddbmm", "addbmm",
                                        "conv_transpose", "lstm", "rnn_tanh", "rnn_relu"})
FLOAT32 = frozenset({"nll_loss", "ctc_loss"})

_AVAILABLE = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "ipu")
_DEFAULT_DTYPE = {"cpu": D.bfloat16, "cuda": D.float16, "xpu": D.bfloat16, "mps": D.float16,
                  "hpu": D.bfloat16, "mtia": D.bfloat16, "maia": D.bfloat16,
                  "xla": D.bfloat16, "ipu": D.float16}
_STATE: dict[str, list] = {k: [False, v] for k, v in _DEFAULT_DTYPE.items()}
_CACHE = {"enabled": True, "nesting": 0}


def is_autocast_available(device_type: str) -> bool:
    """Whether ``autocast`` accepts ``device_type``.

    >>> import tessera
    >>> tessera.amp.is_autocast_available("cpu")
    True
    """
    return device_type in _AVAILABLE


def _state(device_type: str) -> list:
    if device_type not in _STATE:
        raise RuntimeError(f"unsupported autocast device_type '{device_type}'")
    return _STATE[device_type]


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Whether autocast is on for ``device_type`` (the CUDA state without an argument,
    as in PyTorch)."""
    return _state(device_type or "cuda")[0]


def set_autocast_enabled(device_type, enabled=None) -> None:
    if enabled is None:  # PyTorch's one-argument form sets the CUDA state
        device_type, enabled = "cuda", device_type
    _state(device_type)[0] = bool(enabled)


def get_autocast_dtype(device_type: str) -> D.dtype:
    return _state(device_type)[1]


def set_autocast_dtype(device_type: str, dtype) -> None:
    _state(device_type)[1] = D.as_dtype(dtype)


def get_autocast_cpu_dtype() -> D.dtype:
    return get_autocast_dtype("cpu")


def get_autocast_gpu_dtype() -> D.dtype:
    return get_autocast_dtype("cuda")


def is_autocast_cache_enabled() -> bool:
    return bool(_CACHE["enabled"])


def set_autocast_cache_enabled(enabled: bool) -> None:
    _CACHE["enabled"] = bool(enabled)


def clear_autocast_cache() -> None:
    """Autocast keeps no cache of cast weights; kept for PyTorch's API."""


def autocast_increment_nesting() -> int:
    _CACHE["nesting"] += 1
    return _CACHE["nesting"]


def autocast_decrement_nesting() -> int:
    _CACHE["nesting"] -= 1
    return _CACHE["nesting"]


class _CastMode:
    """The dispatch mode of an enabled CPU region: casts the inputs of the listed ops, then
    hands the call on to the mode below it (or eager dispatch)."""

    def dispatch(self, op, args, attrs):
        _dispatch.pop_mode()
        try:
            if _STATE["cpu"][0]:
                args = _cast_args(op.name, args)
            return _dispatch.dispatch(op, *args, **attrs)
        finally:
            _dispatch.push_mode(self)

    def composite_args(self, name, args):
        if _STATE["cpu"][0] and name in LOWER_PRECISION_COMPOSITES:
            return _cast(args, _STATE["cpu"][1])
        return args

    def dispatch_inplace(self, op, target, args, attrs):
        _dispatch.pop_mode()
        try:
            return _dispatch.dispatch_inplace(op, target, *args, **attrs)
        finally:
            _dispatch.push_mode(self)


def _cast_args(name: str, args: tuple) -> tuple:
    if name in LOWER_PRECISION:
        dtype = _STATE["cpu"][1]
    elif name in FLOAT32:
        dtype = D.float32
    else:
        return args
    return tuple(a.to(dtype) if isinstance(a, Tensor) and a.dtype.is_floating_point else a
                 for a in args)


class autocast:
    """Runs the region's matrix products in ``dtype`` (``bfloat16`` on the CPU by default).

    Usable as a context manager or a decorator; ``enabled=False`` turns it off inside an
    enabled region.

    >>> import tessera
    >>> a, b = tessera.randn(2, 3), tessera.randn(3, 2)
    >>> with tessera.autocast("cpu", dtype=tessera.bfloat16):
    ...     (a @ b).dtype
    tessera.bfloat16
    """

    def __init__(self, device_type: str, dtype=None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.device = device_type
        _device(device_type)  # PyTorch's error for a string that is no device type
        if not is_autocast_available(device_type):
            raise RuntimeError(
                f"User specified an unsupported autocast device_type '{device_type}'")
        self.fast_dtype = get_autocast_dtype(device_type) if dtype is None else dtype
        self._cache_enabled = (is_autocast_cache_enabled() if cache_enabled is None
                               else cache_enabled)
        supported = (D.bfloat16, D.float16)
        name = device_type.upper()
        if enabled:
            if device_type == "cuda":
                warnings.warn("CUDA is not available or torch_xla is imported. Disabling "
                              "autocast.", stacklevel=2)
                enabled = False
            elif device_type != "cpu":
                enabled = False  # no such device in this build: the region does nothing
            elif self.fast_dtype not in supported:
                warnings.warn(f"In {name} autocast, but the target dtype is not supported. "
                              f"Disabling autocast.\n{name} Autocast only supports dtypes of "
                              + ", ".join(map(str, supported)) + " currently.", stacklevel=2)
                enabled = False
        self._enabled = enabled
        self._mode: _CastMode | None = None

    def __enter__(self) -> autocast:
        self.prev_cache_enabled = is_autocast_cache_enabled()
        self.prev = is_autocast_enabled(self.device)
        self.prev_fastdtype = get_autocast_dtype(self.device)
        set_autocast_enabled(self.device, self._enabled)
        set_autocast_dtype(self.device, self.fast_dtype)
        autocast_increment_nesting()
        set_autocast_cache_enabled(self._cache_enabled)
        if self.device == "cpu" and self._enabled:
            self._mode = _CastMode()
            _dispatch.push_mode(self._mode)
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Literal[False]:
        if self._mode is not None:
            _dispatch._MODES.remove(self._mode)
            self._mode = None
        autocast_decrement_nesting()
        set_autocast_enabled(self.device, self.prev)
        set_autocast_dtype(self.device, self.prev_fastdtype)
        set_autocast_cache_enabled(self.prev_cache_enabled)
        return False

    def __call__(self, func):
        if not callable(func):
            raise TypeError(
                f"autocast()(func) requires a callable, but got {type(func).__name__}. Did you "
                "mean to use autocast as a context manager? For example:\n"
                "    with torch.autocast(device_type=...):\n        output = model(input)")

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return decorate_autocast


def _cast(value, dtype):
    if isinstance(value, Tensor):
        return value.to(dtype) if value.dtype.is_floating_point else value
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def custom_fwd(fwd=None, *, device_type: str, cast_inputs=None):
    """Decorates a custom ``Function.forward``: with ``cast_inputs``, inside an enabled
    region its floating inputs are cast and it runs with autocast off."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        args[0]._dtype = get_autocast_dtype(device_type)
        on = is_autocast_enabled(device_type)
        if cast_inputs is None:
            args[0]._fwd_used_autocast = on
            return fwd(*args, **kwargs)
        args[0]._fwd_used_autocast = False
        if not on:
            return fwd(*args, **kwargs)
        with autocast(device_type=device_type, enabled=False):
            return fwd(*_cast(args, cast_inputs), **_cast(kwargs, cast_inputs))
    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str):
    """Decorates a custom ``Function.backward`` to run in the autocast state of its
    forward."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        with autocast(device_type=device_type, enabled=args[0]._fwd_used_autocast,
                      dtype=args[0]._dtype):
            return bwd(*args, **kwargs)
    return decorate_bwd
