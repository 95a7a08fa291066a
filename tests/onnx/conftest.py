"""Prints the pass/skip/fail counts of ONNX's backend node tests at the end of a run."""
from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = {}
    for key in ("passed", "skipped", "failed", "xfailed", "xpassed", "error"):
        for rep in terminalreporter.stats.get(key, []):
            nodeid = getattr(rep, "nodeid", "")
            if "OnnxBackendNodeModelTest" in nodeid and nodeid.endswith("_cpu"):
                counts[key] = counts.get(key, 0) + 1
    if counts:
        terminalreporter.write_line(
            "ONNX backend node tests (cpu): " + ", ".join(f"{counts.get(k, 0)} {k}" for k in (
                "passed", "skipped", "failed", "xfailed", "xpassed", "error")))
