import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# the files whose tests spend the longest in C compilers, MPI jobs and model builds, longest
# first: they start at the head of the run, so under `-n 2` the last minutes are the many
# short tests, which the workers share out, and not one long test that a worker started late
# while the other sits idle
HEAVY_FIRST = (
    "tests/deploy/test_export.py",
    "tests/deploy/test_binary_direct.py",
    "tests/deploy/test_index_rules.py",
    "tests/codegen/test_codegen.py",
    "tests/deploy/test_nchwc.py",
    "tests/deploy/test_reduce_rules.py",
    "tests/deploy/test_more_rules.py",
    "tests/kernels/test_max_isa.py",
    "tests/deploy/test_lowp.py",
    "tests/ops/test_matmul_gemm.py",
    "tests/deploy/test_sort_rules.py",
    "tests/deploy/test_opinfo.py",
    "tests/compiler/test_tvm.py",
    "tests/adversarial/test_rank_faults.py",
    "tests/parallel/test_auto_parallel.py",
    "tests/quantization/test_int8_accuracy.py",
    "tests/distributed/test_calibrate.py",
    "tests/nn/test_binary.py",
    "tests/compat/test_drop_in.py",
    "tests/deploy/test_max_isa.py",
    "tests/deploy/test_conv_epilogue.py",
)


def pytest_collection_modifyitems(config, items):
    import pytest

    from tests.known_failures import KNOWN_FAILURES
    for item in items:
        reason = KNOWN_FAILURES.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
    # a stable sort: each file's tests keep their order (and their module fixtures)
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_terminal_summary(terminalreporter):
    try:
        from tessera.ops.registry import REGISTRY
        from tests.opinfo import OP_DB
    except Exception:  # pragma: no cover
        return
    covered = {op for info in OP_DB for op in info.covered_ops()} & set(REGISTRY)
    terminalreporter.write_line(
        f"op-info: {len(OP_DB)} entries cover {len(covered)} of {len(REGISTRY)} registered ops")
