"""``nn.utils``: gradient clipping, parameter/vector conversion and RNN sequence helpers."""
import importlib as _importlib

__all__: list[str] = []
for _name in ("clip_grad", "convert_parameters", "rnn"):
    try:
        _mod = _importlib.import_module(f"tessera.nn.utils.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"tessera.nn.utils.{_name}":
            raise
        continue
    for _fn in getattr(_mod, "__all__", []):
        globals()[_fn] = getattr(_mod, _fn)
        __all__.append(_fn)
