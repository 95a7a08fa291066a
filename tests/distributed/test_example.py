"""``examples/train_distributed.py`` under ``mpiexec -n 2`` trains as one process does: the
same epoch losses, eager and compiled, with and without ZeRO."""
import os
import sys

import numpy as np
import pytest

from tests.distributed._mpi import ROOT, outputs, run_mpi

pytest.importorskip("sklearn")  # the digits ship with scikit-learn (the demo extra)
sys.path.insert(0, os.path.join(ROOT, "examples"))

FORMS = [[], ["--zero", "2"], ["--graph"], ["--graph", "--zero", "2"]]


def _one_process(extra):
    from train_distributed import parse_args, run
    return run(parse_args(["--epochs", "1"] + extra))


def test_example_under_mpi_equals_one_process(tmp_path):
    want = _one_process([])
    run_mpi(tmp_path, f"""
        import sys
        sys.path.insert(0, "examples")
        from tests.distributed._mpi import emit
        from train_distributed import parse_args, run
        emit([run(parse_args(["--epochs", "1"] + extra)) for extra in {FORMS!r}])
    """, timeout=240)
    ranks = outputs(tmp_path)
    assert len(ranks) == 2
    for rank in ranks:
        for losses, extra in zip(rank, FORMS):
            np.testing.assert_allclose(losses, want, rtol=1e-4, err_msg=str(extra))
    assert want[0] < 1.5  # it learns (10 classes: ln 10 = 2.3 at chance)
