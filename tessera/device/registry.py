"""The device registry and the ``tessera.device`` value type."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class device:
    """Where a tensor lives: ``device("cpu")``, ``device("meta")``, ``device("toy", 1)``."""

    __slots__ = ("type", "index")
    type: str
    index: int | None

    def __init__(self, type: str | device, index: int | None = None):
        if isinstance(type, device):
            index = type.index if index is None else index
            type = type.type
        elif not isinstance(type, str):
            raise TypeError(f"device() expected a string or device, got {type.__class__.__name__}")
        else:
            type, index = _parse(type, index)
        if type not in _BACKENDS:
            names = TORCH_DEVICE_TYPES + tuple(sorted(set(_BACKENDS) - set(TORCH_DEVICE_TYPES)))
            raise RuntimeError(f"Expected one of {', '.join(names)} device type at start of "
                               f"device string: {type}")
        self.type = type
        self.index = index

    def __eq__(self, other) -> bool:
        # like torch.device, 'cpu' and 'cpu:0' are different values; strings compare too
        if isinstance(other, str):
            try:
                other = device(other)
            except RuntimeError:
                return False
        return isinstance(other, device) and self.type == other.type and \
            self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))

    def __repr__(self) -> str:
        idx = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{idx})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def _parse(text: str, index) -> tuple[str, int | None]:
    """'cpu' -> ('cpu', None), 'toy:1' -> ('toy', 1); PyTorch's errors for bad strings."""
    if index is not None and (isinstance(index, bool) or not isinstance(index, (int, np.integer))):
        raise TypeError(f"device(): argument 'index' must be int, not {type(index).__name__}")
    if index is not None and index < 0:
        raise RuntimeError(f"Device index must not be negative, got {index}")
    if not text:
        raise RuntimeError("Device string must not be empty")
    name, colon, idx = text.partition(":")
    if colon:
        if not idx.isdigit() or (len(idx) > 1 and idx[0] == "0") or not name:
            raise RuntimeError(f"Invalid device string: '{text}'")
        if index is not None:
            raise RuntimeError("type (string) must not include an index because index was "
                               f"passed explicitly: {text}")
        index = int(idx)
    if not name.replace("_", "").isalnum():
        raise RuntimeError(f"Invalid device string: '{text}'")
    return name, None if index is None else int(index)


class Backend:
    """What a device must provide. Subclass it and pass an instance to ``register_device``.

    A device array is any object with NumPy's ``shape``, ``dtype`` and ``astype(np_dtype)``
    (NumPy and CuPy arrays qualify; a plug-in may wrap its own buffers in a small class).
    ``from_numpy``/``to_numpy`` move data between host NumPy arrays and device arrays.
    ``kernel(op)`` returns the function that runs ``op`` on this device's arrays, or None when
    the device has none (dispatch then raises an error naming the op and the device).
    ``has_storage`` is False for devices that only carry metadata (``meta``).
    """

    name: str = ""
    has_storage: bool = True

    def from_numpy(self, array: np.ndarray, index: int | None) -> Any:
        raise NotImplementedError(f"device {self.name} cannot take NumPy arrays")

    def to_numpy(self, array: Any) -> np.ndarray:
        raise NotImplementedError(f"device {self.name} cannot give NumPy arrays")

    def kernel(self, op) -> Callable | None:
        return op.kernels.get(self.name)

    def inplace_kernel(self, op) -> Callable | None:
        """The kernel that writes ``op``'s result into its target array in place, or None
        (the op then runs out of place and its result is copied in)."""
        return op.inplace_kernels.get(self.name)

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` into the existing array ``dst`` (same shape), casting its dtype; how
        in-place ops store their result."""
        np.copyto(dst, src, casting="unsafe")

    def strides(self, array: Any) -> tuple[int, ...]:
        """Strides in elements (not bytes)."""
        return tuple(s // array.itemsize for s in array.strides)

    def shares_memory(self, a: Any, b: Any) -> bool:
        return False


class CPUBackend(Backend):
    name = "cpu"

    def from_numpy(self, array: np.ndarray, index: int | None) -> np.ndarray:
        return array

    def to_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def shares_memory(self, a, b) -> bool:
        return np.shares_memory(a, b)


class MetaBackend(Backend):
    name = "meta"
    has_storage = False

    def from_numpy(self, array, index):
        return None

    def to_numpy(self, array):
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")

    def kernel(self, op):  # never called: dispatch runs only ``infer`` on meta
        return None


class Unavailable(Backend):
    """A device type PyTorch knows but this build has no backend for (``cuda`` without a
    plug-in): ``device("cuda")`` is a value, and anything that would put data there raises
    what PyTorch's CPU build raises (``AssertionError: Torch not compiled with CUDA
    enabled``). Registering a real backend under the name replaces it."""

    def __init__(self, error: type[Exception], message: str) -> None:
        self.error, self.message = error, message

    def _raise(self) -> Any:
        raise self.error(self.message)

    def from_numpy(self, array, index):
        return self._raise()

    def to_numpy(self, array):
        return self._raise()

    def kernel(self, op):
        return self._raise()

    def inplace_kernel(self, op):
        return self._raise()


# PyTorch's device types, in the order its error messages list them
TORCH_DEVICE_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip",
                      "ve", "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                      "privateuseone")
_BACKENDS: dict[str, Backend] = {}


def register_device(name: str, backend: Backend) -> None:
    """Make ``name`` a device type. ``backend`` is a ``Backend`` instance.

    >>> class Toy(Backend): ...  # doctest: +SKIP
    >>> register_device("toy", Toy())  # doctest: +SKIP
    """
    if not isinstance(backend, Backend):
        raise TypeError(f"register_device expects a Backend instance, got {type(backend)}")
    backend.name = name
    _BACKENDS[name] = backend


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise RuntimeError(f"unknown device type '{name}'; registered: "
                           f"{', '.join(sorted(_BACKENDS))}") from None


def registered_devices() -> list[str]:
    """The device types that can hold tensors (not PyTorch's names this build lacks)."""
    return sorted(k for k, b in _BACKENDS.items() if not isinstance(b, Unavailable))


register_device("cpu", CPUBackend())
register_device("meta", MetaBackend())
for _name in TORCH_DEVICE_TYPES:
    if _name in ("cuda", "xpu"):  # torch.cuda / torch.xpu's lazy init raises these
        register_device(_name, Unavailable(
            AssertionError, f"Torch not compiled with {_name.upper()} enabled"))
    elif _name not in _BACKENDS:
        register_device(_name, Unavailable(
            RuntimeError, f"PyTorch is not linked with support for {_name} devices"))
