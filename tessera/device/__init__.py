"""Devices: a registry keyed by name, open to plug-ins.

A device backend says how its arrays are made from and turned into NumPy arrays and which
kernel runs an op on it. ``cpu`` holds NumPy arrays; ``meta`` holds nothing but shapes and
dtypes, so every op runs on it through its ``infer`` rule alone.

>>> import tessera
>>> tessera.zeros(2, 3, device="meta").shape
tessera.Size([2, 3])
"""
from tessera.device.registry import (
    Backend,
    device,
    get_backend,
    register_device,
    registered_devices,
)

__all__ = ["Backend", "device", "get_backend", "register_device", "registered_devices"]
