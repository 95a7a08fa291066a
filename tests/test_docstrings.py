"""Every docstring example in the package runs and prints what it says (``doctest``), with
the module's own names and ``tessera``, ``F`` (``tessera.nn.functional``) and ``np`` in scope."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import tessera

MODULES = sorted(m.name for m in pkgutil.walk_packages(tessera.__path__, "tessera.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:  # optional dependencies (onnx...) of a sub-package
        pytest.skip(f"{name} needs {e.name}")
    globs = {"tessera": tessera, "F": tessera.nn.functional, "np": np}
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, extraglobs=globs):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
