"""A DataLoader worker killed while it works is reported by the main process, which waits on
the workers' process sentinels together with the result queue."""
from __future__ import annotations

import os
import signal

import pytest

from tessera.utils.data import DataLoader, Dataset


class _KilledAt(Dataset):
    """Item ``at`` kills the worker reading it (after writing the worker's pid to ``pid_file``)."""

    def __init__(self, at: int, pid_file, n: int = 8) -> None:
        self.at, self.pid_file, self.n = at, str(pid_file), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            with open(self.pid_file, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return i


@pytest.mark.parametrize("num_workers", [1, 3])
def test_a_killed_worker_is_named(tmp_path, num_workers):
    loader = DataLoader(_KilledAt(5, tmp_path / "pid"), batch_size=1, num_workers=num_workers)
    with pytest.raises(RuntimeError, match="exited unexpectedly") as e:
        list(loader)
    pid = (tmp_path / "pid").read_text()
    assert f"DataLoader worker (pid(s) {pid} killed by signal SIGKILL)" in str(e.value)


def test_a_killed_worker_with_a_timeout_is_not_reported_as_a_timeout(tmp_path):
    loader = DataLoader(_KilledAt(0, tmp_path / "pid"), batch_size=1, num_workers=2,
                        timeout=60)
    with pytest.raises(RuntimeError, match="killed by signal SIGKILL"):
        list(loader)


def test_the_batches_before_the_death_arrive(tmp_path):
    got = []
    loader = DataLoader(_KilledAt(6, tmp_path / "pid"), batch_size=2, num_workers=1)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for batch in loader:
            got.append(batch.tolist())
    # in order, and none past the fourth batch, which holds item 6 (a batch the worker had
    # queued but not yet written to the pipe dies with it)
    assert got == [[0, 1], [2, 3], [4, 5]][:len(got)]
