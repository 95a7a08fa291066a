"""Keyword spellings: every keyword PyTorch's Python binding accepts on a function or Tensor
method tessera also has (``tessera.flip(x, dims=...)``, ``x.view(size=...)``).

PyTorch's own signatures come from its stubs (``torch/_C/_VariableFunctions.pyi`` and
``TensorBase`` in ``torch/_C/__init__.pyi``), which list every Python overload; overloads on
named dimensions (``Dimname``) are left out, tessera has no named tensors. PyTorch's argument
parser also takes NumPy's ``axis``/``keepdims`` for ``dim``/``keepdim``; those aliases are
checked separately.
"""
from __future__ import annotations

import ast
import inspect
import pathlib
from collections import defaultdict

import pytest
import torch

import tessera

_C = pathlib.Path(torch.__file__).parent / "_C"

# keywords that truly cannot apply in tessera, each with its reason
EXCEPTIONS = {
    # pinned (page-locked) host memory exists only for copies to a GPU
    "pin_memory": "no accelerator to pin host memory for",
    # tessera tensors are dense and strided only (tessera.strided)
    "layout": "no sparse layouts",
    # matmul accumulating into another dtype is a CUDA-only option in PyTorch 2.13
    "out_dtype": "CUDA-only in PyTorch",
}
# individual (function, keyword) pairs that cannot apply, with the reason
PAIR_EXCEPTIONS = {
    ("Tensor.expand", "implicit"): "a TorchScript-internal flag of expand",
    ("Tensor.view", "dtype"): "tessera has no bit reinterpretation of storage",
    ("Tensor.requires_grad_", "mode"): "TorchScript's name; Python's is requires_grad",
    ("torch.set_num_threads", "num"): "TorchScript's name of the positional argument",
}


def _stub(path: pathlib.Path, cls: str | None = None) -> dict[str, set[str]]:
    tree = ast.parse(path.read_text())
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out: dict[str, set[str]] = defaultdict(set)
    for n in body:
        if not isinstance(n, ast.FunctionDef) or n.name.startswith("_"):
            continue
        a = n.args
        names = [p.arg for p in a.args + a.kwonlyargs]
        anns = " ".join(ast.unparse(p.annotation) for p in a.args + a.kwonlyargs
                        if p.annotation)
        if "Dimname" in anns or "names" in names:
            continue
        out[n.name] |= set(names) - {"self"}
    return out


def _accepted(fn, method: bool) -> set[str] | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if method:
        params = params[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None  # takes any keyword: nothing to compare
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _gaps(numpy_aliases: bool) -> dict[str, list[str]]:
    gaps = {}
    tables = [("torch", _stub(_C / "_VariableFunctions.pyi"), tessera, False),
              ("Tensor", _stub(_C / "__init__.pyi", "TensorBase"), tessera.Tensor, True)]
    for prefix, table, ns, method in tables:
        for name, theirs in table.items():
            if not hasattr(ns, name):
                continue
            mine = _accepted(getattr(ns, name), method)
            if mine is None:
                continue
            if numpy_aliases:
                theirs = ({"axis"} if "dim" in theirs else set()) | \
                    ({"keepdims"} if "keepdim" in theirs else set())
            key = f"{prefix}.{name}"
            missing = sorted(k for k in theirs - mine if k not in EXCEPTIONS and
                             (key, k) not in PAIR_EXCEPTIONS)
            if missing:
                gaps[key] = missing
    return gaps


# gaps found by this scan and not closed yet (not exceptions: each should be accepted). The
# test fails on a gap missing from this list, and on an entry that has been closed, so the
# list only shrinks.
NOT_YET: dict[str, list[str]] = {}


def test_pytorch_keywords_accepted():
    gaps = _gaps(numpy_aliases=False)
    new = {k: v for k, v in gaps.items() if NOT_YET.get(k) != v}
    closed = sorted(set(NOT_YET) - set(gaps))
    assert not new, "keywords PyTorch accepts and tessera does not:\n" + "\n".join(
        f"  {k}: {', '.join(v)}" for k, v in sorted(new.items()))
    assert not closed, f"closed, remove from NOT_YET: {closed}"


def test_numpy_aliases_accepted():
    gaps = _gaps(numpy_aliases=True)
    assert not gaps, "NumPy aliases PyTorch accepts and tessera does not:\n" + "\n".join(
        f"  {k}: {', '.join(v)}" for k, v in sorted(gaps.items()))


@pytest.mark.parametrize("call", [
    "lib.flip(x, dims=(0,))", "x.flip(dims=[1])", "lib.permute(x, dims=(1, 0))",
    "x.permute(dims=(1, 0))", "x.view(size=(3, 2))", "lib.reshape(x, shape=(6,))",
    "x.reshape(shape=(3, 2))", "lib.sum(input=x, dim=0)", "lib.is_nonzero(input=x[0, :1])",
    # the keywords of PyTorch's other overloads
    "x.expand(size=(4, 2, 3))", "lib.max(x, other=x.flip(0))", "x.min(other=x.flip(1))",
    "x.new_zeros(size=(2,))", "x.new_ones(size=[3])", "x.new_empty(size=(2,)).shape",
    "lib.zeros(size=(2, 1))", "lib.ones(size=(1, 2))", "lib.empty(size=(2, 2)).shape",
    "x.repeat(repeats=(2, 1))", "x.split(split_size=1)", "x.swapaxes(axis0=0, axis1=1)",
    "lib.swapaxes(x, axis0=1, axis1=0)", "lib.tensor_split(x, sections=2, dim=1)",
    "lib.tensor_split(x, indices=[1], dim=1)",
    "x.tensor_split(tensor_indices_or_sections=lib.tensor([1, 2]), dim=1)",
    "lib.argsort(x, stable=True, dim=1, out=lib.zeros(2, 3, dtype=lib.long))",
    "lib.nonzero(x, out=lib.zeros(5, 2, dtype=lib.long))",
    "lib.logspace(0, 2, 3, out=lib.zeros(3))", "lib.concatenate([x, x], dim=1)",
    "lib.hardshrink(x, 1.0, out=lib.zeros(2, 3))", "lib.threshold(x, 2, 0.5, out=lib.zeros(2, 3))",
    "str(lib.promote_types(type1=lib.int32, type2=lib.float32))",
    "str(lib.result_type(tensor=x.long(), other=2.5))",
    "str(lib.result_type(scalar=2, tensor=x.int()))",
    "str(lib.result_type(scalar1=2, scalar2=2.5))",
    "lib.asarray(obj=[1.0, 2.0], requires_grad=True).requires_grad",
    "lib.asarray(x, copy=True).data_ptr() != x.data_ptr()",
    "lib.complex(x, x, out=lib.zeros(2, 3, dtype=lib.complex64))",
    "lib.polar(x, x * 0, out=lib.zeros(2, 3, dtype=lib.complex64))",
    # NumPy's spellings of dim and keepdim
    "x.sum(axis=0)", "lib.mean(x, axis=1, keepdims=True)", "x.max(axis=1).values",
    "lib.argmax(x, axis=1, keepdims=True)", "lib.softmax(x, axis=1).argmax(1)", "x.cumsum(axis=1)",
    "lib.cat([x, x], axis=1)", "lib.stack([x, x], axis=2)", "x.unsqueeze(axis=0)",
    "lib.gather(x, axis=1, index=lib.tensor([[0], [2]]))",
    "lib.narrow(x, axis=1, start=1, length=2)",
    "lib.select(x, axis=1, index=0)", "lib.std(x, axis=0, keepdims=True)",
    "lib.logsumexp(x, axis=0)", "lib.all(x > 0, axis=1)",
    "x.index_select(axis=1, index=lib.tensor([2]))",
    "x.size(axis=1)", "lib.squeeze(x[None], axis=0)", "x.sort(axis=0, descending=True).values"])
def test_keyword_calls_match_torch(call):
    def plain(r):
        if hasattr(r, "tolist"):
            return r.tolist()
        if isinstance(r, (tuple, list)):
            return [plain(v) for v in r]
        return r.replace("torch.", "tessera.") if isinstance(r, str) else r
    vals = []
    for lib in (torch, tessera):
        x = lib.arange(6.0).view(2, 3)
        vals.append(plain(eval(call, {"lib": lib, "x": x})))
    assert vals[0] == vals[1]
