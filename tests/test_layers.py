"""Imports go one way: down the stack of layers that docs/architecture.md describes.

Every ``import`` and ``from ... import`` of a tessera module, at module level and inside
functions, is checked: a module may import its own layer and the layers below it, never one
above. An upper layer extends a lower one by registration (``tessera.graph.backend``,
``tessera.graph.trace.register_global``, ``tessera.sbp.set_communicator``, the Tensor method
table), so this holds without exceptions.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tessera"

# bottom first; a module's layer is the one whose pattern matches its dotted name
LAYERS = [
    ("runtime", r"tessera\._runtime(\..*)?|tessera\._dtype|tessera\.device(\..*)?"),
    ("kernels", r"tessera\.kernels(\..*)?"),
    ("op vocabulary", r"tessera\.ops\.(registry|cost|_sbp)|tessera\.sbp"
                      r"|tessera\.autograd\.(grad_mode|graph)"),
    ("tensor", r"tessera\._tensor(_methods|_str)?"),
    ("dispatch", r"tessera\._dispatch|tessera\._fastpath"),
    ("ops", r"tessera\.ops(?!\.(registry|cost|_sbp)$)(\..*)?|tessera\._tensor_ops"
            r"|tessera\._einsum(\..*)?"),
    ("autograd", r"tessera\.autograd(?!\.(grad_mode|graph)$)(\..*)?"),
    ("graph", r"tessera\.graph(\..*)?"),
    ("codegen", r"tessera\.codegen(\..*)?"),
    ("distributed", r"tessera\.distributed(?!\.optim)(\..*)?"),
    # with PyTorch's device, precision and process namespaces (torch.cuda, torch.amp,
    # torch.backends, torch.accelerator, torch.multiprocessing, the legacy tensor types)
    # and quantization (torch.ao)
    ("nn, optim, utils", r"tessera\.(nn(?!\.parallel)|optim|utils|profiler|distributions|amp"
                         r"|cuda|backends|multiprocessing|ao)(\..*)?|tessera\.(serialization(\..*)?"
                         r"|accelerator|_legacy_types|version|testing|library)"),
    ("parallel", r"tessera\.parallel(\..*)?"),
    ("fx", r"tessera\.fx(\..*)?"),
    ("compiler", r"tessera\.compiler(\..*)?"),
    ("onnx", r"tessera\.onnx(?!\.__main__$)(\..*)?"),
    ("deploy", r"tessera\.deploy(?!\.__main__$)(\..*)?"),
    ("models, datasets", r"tessera\.(models|datasets)(\..*)?"),
    # the package namespace, command-line entry points, and the re-export shims that keep
    # PyTorch's import paths of the parallel strategies (torch.nn.parallel,
    # torch.distributed.optim)
    ("namespace", r"tessera|tessera\.__main__|tessera\.onnx\.__main__|tessera\.deploy\.__main__"
                  r"|tessera\.sparse|tessera\.linalg"
                  r"|tessera\.nn\.parallel(\..*)?|tessera\.distributed\.optim(\..*)?"),
]


def layer_of(module: str) -> str:
    hits = [name for name, pattern in LAYERS if re.fullmatch(pattern, module)]
    if len(hits) != 1:
        raise KeyError(f"{module} matches layers {hits}: give it exactly one in LAYERS "
                       "and docs/architecture.md")
    return hits[0]


def rank(module: str) -> int:
    return [name for name, _ in LAYERS].index(layer_of(module))


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str:
    """The tessera module an import names (``tessera.ops.shape.cat`` -> ``tessera.ops.shape``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str):
    """(imported module, line) for every tessera import in ``module``, lazy ones included."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "tessera":
                target = _resolve(name)
                if target and target != module:
                    yield target, node.lineno


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_goes_up(module):
    up = [f"{module}:{line} imports {target} ({layer_of(target)}), above its layer "
          f"({layer_of(module)})"
          for target, line in imports(module) if rank(target) > rank(module)]
    assert not up, "\n".join(up)


def _cycles() -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    graph = {m: {t for t, _ in imports(m)} for m in MODULES}
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_import_cycle_crosses_a_package_boundary():
    """Modules of one package may import each other both ways (a package is one unit);
    a cycle through two packages would make them one in all but name."""
    crossing = [c for c in _cycles() if len({_package(m) for m in c}) > 1]
    assert not crossing, crossing
