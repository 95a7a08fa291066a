"""ONNX's own node tests (generated in memory by the ``onnx`` package) run against
``tessera.onnx.backend.TesseraBackend``. Tests of ops not in the import table are
skipped by the backend; every other test must pass, except those listed in
``EXPECTED_FAILURES`` with a reason. ``tests/onnx/conftest.py`` prints the counts."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402

from tessera.onnx.backend import SUPPORTED_OPS, TesseraBackend  # noqa: E402
from tests.onnx.backend_expected import EXPECTED_FAILURES  # noqa: E402

_backend_test = onnx.backend.test.BackendTest(TesseraBackend, __name__)
for _name in EXPECTED_FAILURES:
    _backend_test.xfail(f"^{re.escape(_name)}_cpu$")  # strict: an xpass fails
_backend_test.exclude("_cuda$")

# only the node tests: the "real" models would be downloaded
OnnxBackendNodeModelTest = _backend_test.test_cases["OnnxBackendNodeModelTest"]


def test_supported_ops_list_is_the_import_table():
    from tessera.onnx.converters import IMPORT as IMPORTERS
    assert SUPPORTED_OPS <= set(IMPORTERS)
    assert len(SUPPORTED_OPS) >= 120


def test_expected_failures_have_reasons():
    assert all(isinstance(r, str) and r for r in EXPECTED_FAILURES.values())
