import os

import pytest

from tests.deploy import _cc_cache


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One compile cache (tests/deploy/_cc_cache.py) for the run, every worker's builds."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent   # the run's folder, where each worker has its own
    path = root / "cc-cache"
    path.mkdir(exist_ok=True)
    _cc_cache.DIR = str(path)
    yield path
    _cc_cache.DIR = None
