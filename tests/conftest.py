import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
    import pytest

    from tests.known_failures import KNOWN_FAILURES
    for item in items:
        reason = KNOWN_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))


def pytest_terminal_summary(terminalreporter):
    try:
        from tessera.ops.registry import REGISTRY
        from tests.opinfo import OP_DB
    except Exception:  # pragma: no cover
        return
    covered = {op for info in OP_DB for op in info.covered_ops()} & set(REGISTRY)
    terminalreporter.write_line(
        f"op-info: {len(OP_DB)} entries cover {len(covered)} of {len(REGISTRY)} registered ops")
