"""Neural-network building blocks: ``Module``, ``Parameter``, layers, losses, ``init`` and
``functional`` — PyTorch's ``torch.nn`` names and behaviour.
"""
import importlib as _importlib

from tessera.nn.modules.module import Module, RemovableHandle
from tessera.nn.parameter import Buffer, Parameter

__all__ = ["Module", "Parameter", "Buffer", "RemovableHandle"]

# one module per layer family in tessera/nn/modules; each lists its classes in __all__
_FAMILIES = ("container", "linear", "activation", "conv", "pooling", "padding", "vision",
             "normalization", "batchnorm", "dropout", "sparse", "flatten", "loss", "distance",
             "attention", "transformer", "rnn")
for _name in _FAMILIES:
    try:
        _mod = _importlib.import_module(f"tessera.nn.modules.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"tessera.nn.modules.{_name}":
            raise
        continue
    for _cls in _mod.__all__:
        globals()[_cls] = getattr(_mod, _cls)
        __all__.append(_cls)

from tessera.nn import functional, init, utils  # noqa: E402,F401
from tessera.nn.graph import Graph, GraphConfig  # noqa: E402

__all__ += ["Graph", "GraphConfig"]
