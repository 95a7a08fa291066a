"""``tessera.nn.functional``: PyTorch's functional API (activations, conv, pooling, norms,
losses, ...). Each family module here is thin: argument handling and composites over
tessera ops; the ops themselves (with their grad rules) live in ``tessera.ops``.
"""
import importlib as _importlib

_FAMILIES = ("activation", "linear", "conv", "pooling", "vision", "norm", "dropout",
             "sparse", "loss", "distance", "attention")
__all__: list[str] = []
for _name in _FAMILIES:
    try:
        _mod = _importlib.import_module(f"tessera.nn.functional.{_name}")
    except ModuleNotFoundError as _e:  # a family not written yet
        if _e.name != f"tessera.nn.functional.{_name}":
            raise
        continue
    for _fn in _mod.__all__:
        globals()[_fn] = getattr(_mod, _fn)
        __all__.append(_fn)
