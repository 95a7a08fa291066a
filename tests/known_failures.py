"""Tests that fail, each with the reason: known deviations from PyTorch, marked as
expected failures (not skipped) by conftest.py so that they stay visible in every run.
Remove an entry when its bug is fixed (the run then reports it as XPASS)."""

KNOWN_FAILURES: dict[str, str] = {
}
