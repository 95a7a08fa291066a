"""The einsum equation grammar: a hand-written lexer, a recursive-descent parser, and
``bind``, which checks a parsed equation against the operands' shapes.

Grammar (spaces are ignored between tokens)::

    equation := term ("," term)* ("->" term)?
    term     := (LETTER | "...")*            LETTER is [a-zA-Z]; at most one "..." a term

Without ``->`` the output is implicit: the ellipsis dims, then every letter that appears
exactly once, in ASCII order (upper case before lower case). ``bind`` expands each ``...``
into letters the equation does not use, so that what the op carries is an explicit,
ellipsis-free equation with one letter per dim (its *canonical* form).

Every error names the problem and points at its index in the equation:

>>> parse("ij,jk->ik").output.labels
('i', 'k')
>>> bind(parse("...ij,jk"), [(5, 2, 3), (3, 4)]).canonical
'aij,jk->aik'
>>> parse("ij->i$")
Traceback (most recent call last):
...
RuntimeError: einsum(): invalid subscript '$' given at index 5 in the equation string, ...
  ij->i$
       ^
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

__all__ = ["ELLIPSIS", "LETTERS", "Term", "Equation", "Bound", "parse", "bind", "from_sublists",
           "einsum_error"]

ELLIPSIS = "..."
# the order PyTorch gives sublist integers: 0-25 are A-Z, 26-51 are a-z
LETTERS = string.ascii_uppercase + string.ascii_lowercase
_LETTER_SET = frozenset(LETTERS)


def einsum_error(problem: str, text: str | None = None, pos: int | None = None,
                 exc: type[Exception] = RuntimeError) -> Exception:
    """``exc("einsum(): problem")``, with the equation and a caret under index ``pos``."""
    msg = f"einsum(): {problem}"
    if text is not None and pos is not None:
        msg += f"\n  {text}\n  {' ' * pos}^"
    return exc(msg)


# ---- lexer -------------------------------------------------------------------------------

class Token(NamedTuple):
    kind: str    # "letter", "ellipsis", "comma", "arrow" or "end"
    value: str
    pos: int


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; an unknown character is an error at its index."""
    toks, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == " ":
            i += 1
            continue
        if c in _LETTER_SET:
            toks.append(Token("letter", c, i))
        elif c == ",":
            toks.append(Token("comma", c, i))
        elif c == ".":
            if not text.startswith(ELLIPSIS, i):
                raise einsum_error(f"found '.' at index {i} that is not part of an ellipsis "
                                   "'...'", text, i)
            toks.append(Token("ellipsis", ELLIPSIS, i))
            i += 3
            continue
        elif c == "-" and text.startswith("->", i):
            toks.append(Token("arrow", "->", i))
            i += 2
            continue
        elif c in "->":
            raise einsum_error(f"found {c!r} at index {i} that is not part of an arrow '->'",
                               text, i)
        else:
            raise einsum_error(f"invalid subscript {c!r} given at index {i} in the equation "
                               "string, subscripts must be in [a-zA-Z]", text, i)
        i += 1
    toks.append(Token("end", "", n))
    return toks


# ---- parser ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One operand's (or the output's) subscripts: letters and at most one ELLIPSIS."""

    labels: tuple[str, ...]
    positions: tuple[int, ...]   # index in the equation of each label
    start: int                   # index where the term starts (for errors about it)

    @property
    def ellipsis(self) -> int | None:
        """Position of the ellipsis among ``labels``, or None."""
        return self.labels.index(ELLIPSIS) if ELLIPSIS in self.labels else None

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(x for x in self.labels if x != ELLIPSIS)


@dataclass(frozen=True)
class Equation:
    text: str
    inputs: tuple[Term, ...]
    output: Term | None          # None: implicit output

    def at(self, operand: int, k: int) -> int:
        """Index in the text of label ``k`` of input ``operand``."""
        return self.inputs[operand].positions[k]


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.i = 0

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def equation(self) -> Equation:
        inputs = [self.term(0)]
        while self.peek().kind == "comma":
            self.take()
            inputs.append(self.term(len(inputs)))
        output = None
        if self.peek().kind == "arrow":
            self.take()
            output = self.term(None)
        t = self.peek()
        if t.kind == "arrow":
            raise einsum_error(f"'->' appears more than once (again at index {t.pos})",
                               self.text, t.pos)
        if t.kind == "comma":
            raise einsum_error(f"found ',' at index {t.pos} in the output, which is a single "
                               "term", self.text, t.pos)
        eq = Equation(self.text, tuple(inputs), output)
        if output is not None:
            seen = {x for term in inputs for x in term.letters}
            for x, p in zip(output.labels, output.positions):
                if x != ELLIPSIS and x not in seen:
                    raise einsum_error(f"output subscript {x} (index {p}) does not appear in "
                                       "the equation for any input operand", self.text, p)
        return eq

    def term(self, operand: int | None) -> Term:
        """The labels up to the next ',' / '->' / end; ``operand`` None is the output."""
        who = "the output" if operand is None else f"operand {operand}"
        labels, positions = [], []
        start = self.peek().pos
        ell = None
        while self.peek().kind in ("letter", "ellipsis"):
            t = self.take()
            if t.kind == "ellipsis":
                if ell is not None:
                    raise einsum_error(f"found a second ellipsis at index {t.pos} for {who}, "
                                       f"which already has one at index {ell}", self.text,
                                       t.pos)
                ell = t.pos
            elif operand is None and t.value in labels:
                raise einsum_error(f"output subscript {t.value} appears more than once in "
                                   f"the output (again at index {t.pos})", self.text, t.pos)
            labels.append(t.value)
            positions.append(t.pos)
        return Term(tuple(labels), tuple(positions), start)


@lru_cache(maxsize=1024)
def parse(text: str) -> Equation:
    """The parsed equation; RuntimeError naming the problem and its index."""
    if not isinstance(text, str):
        raise TypeError(f"einsum(): argument 'equation' (position 1) must be str, not "
                        f"{type(text).__name__}")
    return _Parser(text).equation()


def from_sublists(args: tuple) -> tuple[str, list]:
    """The sublist form ``(op0, [0, 1], op1, [1, 2], [0, 2])`` as an equation string and
    the operands. Integers 0-51 stand for A-Z then a-z; ``...`` is Python's Ellipsis."""
    terms: list[str]
    operands, terms = [], []
    rest = list(args)
    while len(rest) >= 2:
        operands.append(rest.pop(0))
        terms.append(_sublist(rest.pop(0), f"operand {len(terms)}"))
    out = _sublist(rest.pop(0), "the output") if rest else None
    eq = ",".join(terms) + ("" if out is None else "->" + out)
    return eq, operands


def _sublist(sub, who: str) -> str:
    if not isinstance(sub, (list, tuple)):
        raise TypeError(f"einsum(): the subscripts of {who} must be a list of ints (and "
                        f"Ellipsis), not {type(sub).__name__}")
    parts = []
    for k, s in enumerate(sub):
        if s is Ellipsis:
            parts.append(ELLIPSIS)
        elif hasattr(s, "__index__"):  # ints, NumPy integers
            s = int(s)
            if not 0 <= s < len(LETTERS):
                raise einsum_error(f"subscript {s} at position {k} of the sublist of {who} is "
                                   f"not within the valid range [0, {len(LETTERS)})",
                                   exc=ValueError)
            parts.append(LETTERS[s])
        else:
            raise TypeError(f"einsum(): subscript at position {k} of the sublist of {who} must "
                            f"be an int or Ellipsis, not {type(s).__name__}")
    return "".join(parts)


# ---- binding to shapes ---------------------------------------------------------------------

@dataclass(frozen=True)
class Bound:
    """An equation checked against operand shapes.

    ``inputs``/``output``: one letter per dim (ellipses expanded); ``sizes``: each letter's
    size after broadcasting (a dim of size 1 broadcasts against any size, as in PyTorch);
    ``canonical``: the explicit equation ``inputs -> output``.
    """

    inputs: tuple[str, ...]
    output: str
    sizes: dict
    shapes: tuple[tuple[int, ...], ...]

    @property
    def canonical(self) -> str:
        return ",".join(self.inputs) + "->" + self.output

    def output_shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[x] for x in self.output)

    def reduced(self) -> tuple[str, ...]:
        """Each operand's labels without its broadcast dims (size 1 against a larger size):
        the operand does not depend on such a label, so it drops out of that operand."""
        return tuple("".join(x for x, n in zip(term, shape) if n != 1 or self.sizes[x] == 1)
                     for term, shape in zip(self.inputs, self.shapes))


def bind(eq: Equation, shapes) -> Bound:
    """Check ``eq`` against operand ``shapes``: operand count, dims per term, sizes that
    agree (or broadcast); expand ellipses. Errors name the letter, sizes and index."""
    shapes = tuple(tuple(int(n) for n in s) for s in shapes)
    return _bind(eq, shapes)


@lru_cache(maxsize=4096)
def _bind(eq: Equation, shapes: tuple) -> Bound:
    _check_count(eq, len(shapes))
    ell_counts = [_ellipsis_dims(eq, i, shape) for i, shape in enumerate(shapes)]
    n_ell = max(ell_counts, default=0)
    used = {x for term in eq.inputs for x in term.letters}
    free = [x for x in string.ascii_lowercase + string.ascii_uppercase if x not in used]
    if n_ell > len(free):
        raise einsum_error(f"the ellipsis covers {n_ell} dims but only {len(free)} letters are "
                           f"unused by the equation (at most {len(LETTERS)} labels in all)",
                           eq.text, eq.inputs[0].start)
    ell = "".join(free[:n_ell])
    ell_sizes = [1] * n_ell
    sizes: dict[str, int] = {}
    inputs = []
    for i, (term, shape, k) in enumerate(zip(eq.inputs, shapes, ell_counts)):
        labels: list[str]
        labels, where = [], []
        for x, p in zip(term.labels, term.positions):
            expanded = ell[n_ell - k:] if x == ELLIPSIS else x
            labels.extend(expanded)
            where.extend([p] * len(expanded))
        _sizes(eq.text, i, labels, shape, where, ell, ell_sizes, sizes)
        inputs.append("".join(labels))
    sizes.update(zip(ell, ell_sizes))
    if eq.output is None:  # implicit: the ellipsis, then the letters seen once, sorted
        counts: dict[str, int] = {}
        for term in eq.inputs:
            for x in term.letters:
                counts[x] = counts.get(x, 0) + 1
        output = ell + "".join(sorted(x for x, c in counts.items() if c == 1))
    else:
        output = "".join(ell if x == ELLIPSIS else x for x in eq.output.labels)
    return Bound(tuple(inputs), output, sizes, shapes)


def _check_count(eq: Equation, n: int) -> None:
    """As many operands as terms."""
    if n < len(eq.inputs):
        term = eq.inputs[n]
        raise einsum_error(f"fewer operands were provided ({n}) than specified in the "
                           f"equation ({len(eq.inputs)}); operand {n} starts at index "
                           f"{term.start}", eq.text, term.start)
    if n > len(eq.inputs):
        last = eq.inputs[-1]
        end = last.positions[-1] + 1 if last.positions else last.start
        raise einsum_error(f"more operands were provided ({n}) than specified in the "
                           f"equation ({len(eq.inputs)})", eq.text, end)


def _ellipsis_dims(eq: Equation, i: int, shape: tuple) -> int:
    """How many dims the ellipsis of operand ``i`` covers (0 without one)."""
    term = eq.inputs[i]
    nl = len(term.letters)
    if term.ellipsis is None:
        if nl != len(shape):
            raise einsum_error(f"the number of subscripts in the equation ({nl}) does not "
                               f"match the number of dimensions ({len(shape)}) for operand "
                               f"{i} and no ellipsis was given", eq.text, term.start)
        return 0
    if nl > len(shape):
        raise einsum_error(f"the number of subscripts in the equation ({nl}) is more than "
                           f"the number of dimensions ({len(shape)}) for operand {i}",
                           eq.text, term.start)
    return len(shape) - nl


def _sizes(text: str, i: int, labels: list, shape: tuple, where: list, ell: str,
           ell_sizes: list, sizes: dict) -> None:
    """Record operand ``i``'s dim sizes in ``sizes`` (letters) and ``ell_sizes`` (the
    ellipsis dims, right-aligned): equal, or 1 broadcasting against any size."""
    own: dict[str, int] = {}
    n_ell = len(ell)
    k = sum(1 for x in labels if x in ell)
    for x, n, p in zip(labels, shape, where):
        if x in ell:
            e = ell.index(x)
            m = ell_sizes[e]
            if n != m and m != 1 and n != 1:
                raise einsum_error(f"dimension {e - (n_ell - k)} covered by the ellipsis in "
                                   f"operand {i} has size {n} which does not broadcast with "
                                   f"previously seen ellipsis with size {m} for the respective "
                                   "dimension", text, p)
            ell_sizes[e] = m if n == 1 else n
            continue
        if x in own and own[x] != n:
            raise einsum_error(f"subscript {x} is repeated for operand {i} but the sizes don't "
                               f"match, {own[x]} != {n} (index {p})", text, p)
        own[x] = n
        m = sizes.get(x)
        if m is not None and n != m and m != 1 and n != 1:
            raise einsum_error(f"subscript {x} has size {n} for operand {i} which does not "
                               f"broadcast with previously seen size {m} (index {p})", text, p)
        sizes[x] = n if m is None or m == 1 else m
