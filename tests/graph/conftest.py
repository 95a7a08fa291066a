"""The graph layer's tests exercise its executor: inference graphs that would run as compiled
programs (``tessera.deploy.program``, tested in tests/deploy) run on the executor here."""
import pytest


@pytest.fixture(autouse=True)
def _executor_only(monkeypatch):
    monkeypatch.setenv("TESSERA_GRAPH_PROGRAM", "0")
