"""einsum's machinery, behind the op in ``tessera/ops/einsum.py``.

* ``_parse``: the equation grammar (lexer, recursive-descent parser, sublist form) and
  ``bind``, which checks an equation against shapes and expands ellipses;
* ``_path``: contraction paths (exact dynamic programme over subsets, greedy beyond) and
  their cost report;
* ``_lower``: the kernel, each pairwise step as permutes/reshapes and one batched matmul,
  a plan per operand layout, each product done the way that measures fastest;
* ``_bmm``: a batch of small products split over C kernel threads;
* ``_rules``: the op's SBP and cost rules.

None of these modules touches Tensors; they work on strings, shapes and NumPy arrays.
"""
