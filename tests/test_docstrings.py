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


@pytest.fixture
def backend_switches():
    """Puts back the process-wide ``tessera.backends`` switches that examples set
    (``cudnn.deterministic = True``...), so the tests after them see the defaults."""
    import tessera.backends as B
    plain = (bool, int, float, str, type(None))
    modules = [B.cpu, B.cudnn, B.mkl, B.mkldnn, B.mps, B.openmp, B.opt_einsum]
    saved = [(m, {k: v for k, v in vars(m).items() if not k.startswith("_")
                  and isinstance(v, plain)}) for m in modules]
    dicts = [(d, dict(d)) for d in (B._SETTINGS, B.cuda.matmul._values, B.cuda._SDP)]
    yield
    for m, values in saved:
        for k, v in values.items():
            setattr(m, k, v)
    for d, values in dicts:
        d.clear()
        d.update(values)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, backend_switches):
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
