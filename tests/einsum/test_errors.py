"""Every einsum error: its type is PyTorch's (torch raises on each of these inputs too), the
message names the problem, and the caret points at the index of the offending character."""
from __future__ import annotations

import pytest
import torch

import tessera
from tessera.ops.einsum._parse import parse

# (equation, operand shapes, exception type, message fragment, index the caret points at)
ERRORS = [
    ("i$,jk", [(2, 2), (2, 2)], RuntimeError, "invalid subscript '$' given at index 1", 1),
    ("ij->i7", [(2, 2)], RuntimeError, "invalid subscript '7' given at index 5", 5),
    ("ij->i->j", [(2, 2)], RuntimeError, "'->' appears more than once", 5),
    ("ij-i", [(2, 2)], RuntimeError, "'-' at index 2 that is not part of an arrow", 2),
    ("ij>i", [(2, 2)], RuntimeError, "'>' at index 2 that is not part of an arrow", 2),
    ("i,j->ij,", [(2,), (2,)], RuntimeError, "',' at index 7 in the output", 7),
    ("ij->k", [(2, 2)], RuntimeError, "output subscript k (index 4) does not appear", 4),
    ("ij->ii", [(2, 2)], RuntimeError, "output subscript i appears more than once", 5),
    ("ij,jk->ik", [(2, 3)], RuntimeError, "fewer operands were provided (1) than", 3),
    ("ij->", [(2, 2), (2,)], RuntimeError, "more operands were provided (2) than", 2),
    ("ij,jk->ik", [(2, 3), (4, 5)], RuntimeError,
     "subscript j has size 4 for operand 1 which does not broadcast with previously seen "
     "size 3", 3),
    ("ii", [(2, 3)], RuntimeError, "subscript i is repeated for operand 0 but the sizes "
     "don't match, 2 != 3", 1),
    ("...i...j", [(2, 3, 4)], RuntimeError, "second ellipsis at index 4 for operand 0", 4),
    ("i,......", [(2,), (2,)], RuntimeError, "second ellipsis at index 5 for operand 1", 5),
    ("ij->...j...", [(2, 2)], RuntimeError, "second ellipsis at index 8 for the output", 8),
    ("i.j", [(2, 2)], RuntimeError, "'.' at index 1 that is not part of an ellipsis", 1),
    ("ij->j..", [(2, 2)], RuntimeError, "'.' at index 5 that is not part of an ellipsis", 5),
    ("ijk", [(2, 2)], RuntimeError, "number of subscripts in the equation (3) does not match "
     "the number of dimensions (2) for operand 0", 0),
    ("i,jk", [(2,), (2,)], RuntimeError, "(2) does not match the number of dimensions (1) "
     "for operand 1", 2),
    ("ij...", [(2,)], RuntimeError, "(2) is more than the number of dimensions (1)", 0),
    ("...i,...i", [(2, 3), (4, 3)], RuntimeError, "dimension 0 covered by the ellipsis in "
     "operand 1 has size 4 which does not broadcast with previously seen ellipsis with size 2",
     5),
]


def _ids(e):
    return f"{e[0]}:{e[1]}"


@pytest.mark.parametrize("eq,shapes,exc,fragment,index", ERRORS, ids=[_ids(e) for e in ERRORS])
def test_error(eq, shapes, exc, fragment, index):
    with pytest.raises(exc) as info:
        tessera.einsum(eq, *[tessera.ones(s) for s in shapes])
    msg = str(info.value)
    assert msg.startswith("einsum(): ") and fragment in msg, msg
    lines = msg.split("\n")
    assert lines[1] == "  " + eq and lines[2] == "  " + " " * index + "^", msg
    with pytest.raises(exc):  # PyTorch rejects the same input with the same type
        torch.einsum(eq, *[torch.ones(s) for s in shapes])


def test_error_on_meta_too():
    with pytest.raises(RuntimeError, match="subscript j has size 4"):
        tessera.einsum("ij,jk", tessera.empty(2, 3, device="meta"),
                       tessera.empty(4, 5, device="meta"))


def test_argument_errors():
    a = tessera.ones(2, 3)
    with pytest.raises(ValueError, match="must specify the equation string and at least one"):
        tessera.einsum()
    with pytest.raises(ValueError, match="must specify the equation string"):
        tessera.einsum("ij")
    with pytest.raises(TypeError, match=r"argument 'equation' \(position 1\) must be str, not"
                                        " int"):
        tessera.einsum(1, a)
    with pytest.raises(TypeError, match="expected Tensor as element 1 in argument 1, but got "
                                        "float"):
        tessera.einsum("ij,jk", a, 2.0)
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Double"):
        tessera.einsum("ij,jk", a, tessera.ones(3, 2, dtype=tessera.float64))
    with pytest.raises(NotImplementedError, match="bmm"):
        tessera.einsum("ij,jk", a.bool(), a.bool().T)


def test_sublist_errors():
    a = tessera.ones(2, 3)
    with pytest.raises(ValueError, match=r"subscript 52 at position 1 of the sublist of "
                                         r"operand 0 is not within the valid range \[0, 52\)"):
        tessera.einsum(a, [0, 52])
    with pytest.raises(ValueError, match="subscript -1"):
        tessera.einsum(a, [0, -1])
    with pytest.raises(TypeError, match="subscript at position 1 of the sublist of operand 0 "
                                        "must be an int or Ellipsis, not str"):
        tessera.einsum(a, [0, "b"])
    with pytest.raises(TypeError, match="the subscripts of the output must be a list"):
        tessera.einsum(a, [0, 1], 5)
    with pytest.raises(RuntimeError, match="output subscript C"):  # the sublist, as letters
        tessera.einsum(a, [0, 1], [2])


def test_parse_is_a_recursive_descent_over_tokens():
    eq = parse(" a...b , bc -> ...ac ")
    assert [t.labels for t in eq.inputs] == [("a", "...", "b"), ("b", "c")]
    assert eq.output.labels == ("...", "a", "c")
    assert eq.inputs[0].positions == (1, 2, 5) and eq.inputs[0].ellipsis == 1
    assert parse("ij").output is None and parse("ij->").output.labels == ()
    assert [t.labels for t in parse(",").inputs] == [(), ()]
    with pytest.raises(TypeError, match="must be str"):
        parse(3)


def test_path_attr_is_validated():
    from tessera.ops.registry import REGISTRY
    a = tessera.ones(2, 2)
    op = REGISTRY["einsum"]
    with pytest.raises(ValueError, match="a path for 3 operands has 2 steps, got 1"):
        tessera._dispatch.dispatch(op, a, a, a, equation="ij,jk,kl->il", path=((0, 1),))
    with pytest.raises(ValueError, match=r"path step 1 \(0, 2\) must be two increasing"):
        tessera._dispatch.dispatch(op, a, a, a, equation="ij,jk,kl->il",
                                   path=((0, 1), (0, 2)))
