"""The op registry and the op families (one module per family); as ``torch.ops``, the
operators by namespace (``tessera.ops.aten.add.Tensor``, ``tessera.library.custom_op``'s).

``tessera.ops.REGISTRY`` maps every op name to its ``OpDef``; ``python -m tessera opcov``
prints which rules each op has. Any other attribute that is no submodule is a namespace of
operators (``tessera.ops.library``).

>>> import tessera
>>> tessera.ops.aten.relu(tessera.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""
import importlib as _importlib
import importlib.util as _importlib_util

from tessera.ops.library import import_module, load_library, loaded_libraries
from tessera.ops.registry import REGISTRY, Meta, MissingRule, OpDef, coverage_table, register

__all__ = ["REGISTRY", "Meta", "MissingRule", "OpDef", "coverage_table", "register",
           "load_library", "loaded_libraries", "import_module"]


def __getattr__(name: str):
    # a submodule not imported yet is the submodule (``from tessera.ops import _jax``);
    # anything else is a namespace of operators, as in PyTorch
    if name.startswith("__"):
        raise AttributeError(f"module 'tessera.ops' has no attribute '{name}'")
    if _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")
    from tessera.ops.library import namespace
    ns = globals()[name] = namespace(name)   # found directly from now on
    return ns
