"""The package namespace: static re-exports, and the heavy subpackages loaded on first use."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tessera


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_models_and_onnx_load_on_first_use():
    out = _fresh("import sys, tessera\n"
                 "print(sorted(m for m in ('tessera.models', 'tessera.onnx', 'onnx',"
                 " 'tessera.datasets') if m in sys.modules))\n"
                 "print(tessera.models.resnet18(num_classes=3).fc.out_features)\n"
                 "print('tessera.models' in sys.modules, 'onnx' in sys.modules)")
    assert out.splitlines() == ["[]", "3", "True False"]


def test_an_unknown_attribute_is_an_attribute_error():
    try:
        tessera.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("tessera.no_such_thing did not raise")


def test_every_family_lists_its_public_functions_literally():
    """Static tools resolve ``tessera.add`` through the family's ``__all__``: it must be a
    literal list of names the module defines at its top level, not one filled at run time."""
    root = pathlib.Path(tessera.__file__).parent
    for family in tessera._tensor_ops.FAMILIES:
        path = root.parent / (family.__name__.replace(".", "/") + ".py")
        if not path.exists():
            path = path.with_suffix("") / "__init__.py"
        tree = ast.parse(path.read_text())
        alls = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and
                any(getattr(t, "id", None) == "__all__" for t in
                    (n.targets if isinstance(n, ast.Assign) else [n.target]))]
        assert len(alls) == 1, family.__name__
        names = ast.literal_eval(alls[0].value)
        assert names == list(family.__all__), family.__name__
        targets = [t for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
        targets += [e for t in targets if isinstance(t, ast.Tuple) for e in t.elts]
        defined = {t.id for t in targets if isinstance(t, ast.Name)}
        defined |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef,
                                                                ast.ClassDef))}
        defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        assert set(names) <= defined, (family.__name__, set(names) - defined)
        for name in names:
            assert getattr(tessera, name) is getattr(family, name), name
