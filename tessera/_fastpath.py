"""The C fast path of ``dispatch``: ``_fastpath.c``, built by the system C compiler.

``accelerate(dispatch)`` returns a C function that runs the common case of the Python
``dispatch`` (CPU tensors of one float dtype, or mixed dtypes for a non-promoting op
without gradients; Python numbers, one output, a memoised infer result) and calls the
Python function for everything else, so the Python function stays the one definition of
dispatch. The extension is compiled once per machine into the kernel
cache (``tessera.kernels.cc``); without a C compiler, or with ``TESSERA_FASTPATH=0``,
``accelerate`` returns the Python function itself.

>>> import tessera
>>> from tessera import _dispatch, _fastpath
>>> _dispatch.dispatch is _dispatch._py_dispatch or _fastpath.MODULE is not None
True
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

MODULE: ModuleType | None = None  # the loaded extension, once accelerate() succeeded


def _load() -> ModuleType | None:
    from tessera.kernels import cc
    if cc.compiler() is None:
        return None
    with open(os.path.join(os.path.dirname(__file__), "_fastpath.c")) as f:
        source = f.read()
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None
    # the interpreter's ABI decides the binary as much as the source does
    tag = f"/* {sysconfig.get_config_var('SOABI')} */\n"
    path = cc.build(tag + source, (f"-I{include}", "-O2"))
    loader = importlib.machinery.ExtensionFileLoader("tessera._fastpath_c", path)
    spec = importlib.util.spec_from_file_location("tessera._fastpath_c", path, loader=loader)
    assert spec is not None  # a spec is always made when the loader is given
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def accelerate(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """The C dispatch calling ``dispatch`` for what it does not handle, or ``dispatch``
    itself when the extension cannot be built (with a warning) or is switched off."""
    global MODULE
    if os.environ.get("TESSERA_FASTPATH", "1") == "0":
        return dispatch
    try:
        MODULE = _load()
    except Exception as e:  # a broken compiler must not break ``import tessera``
        warnings.warn(f"tessera: the C dispatch fast path could not be built ({e}); "
                      "dispatch runs in Python", RuntimeWarning, stacklevel=2)
        MODULE = None
    return dispatch if MODULE is None else MODULE.dispatch


def bind_operators(tensor: type, table: dict) -> None:
    """Put a C operator in place of each of ``tensor``'s operator methods that ``table``
    maps to an op (``{"__add__": (add's OpDef, {"alpha": 1}), ...}``): Tensor and number
    operands dispatch straight from C, others call the Python method it replaces.

    >>> import tessera
    >>> (tessera.ones(2) + 1).tolist()
    [2.0, 2.0]
    """
    if MODULE is None:
        return
    for name, (op, attrs) in table.items():
        setattr(tensor, name, MODULE.operator(op, attrs, tensor.__dict__[name]))

