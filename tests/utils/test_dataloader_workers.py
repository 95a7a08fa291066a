"""DataLoader with worker processes: real processes, order, seeds, errors and shutdown.

Every test ends by checking that no worker process is left behind. Datasets are tiny and
every wait is bounded, so the file runs in seconds.
"""
from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

import tessera
from tessera.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    TensorDataset,
    get_worker_info,
)


def _children_gone(deadline: float = 3.0) -> bool:
    end = time.monotonic() + deadline
    while multiprocessing.active_children():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(autouse=True)
def no_leaked_workers():
    assert _children_gone(), "a previous test leaked processes"
    yield  # no gc.collect(): workers must go when the last reference does, not later
    assert _children_gone(), f"leaked worker processes: {multiprocessing.active_children()}"


class PidDataset(Dataset):
    """Item i is (i, pid of the process that fetched it)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i, os.getpid()


class FailingDataset(Dataset):
    def __init__(self, bad: int, exc: type = ValueError) -> None:
        self.bad = bad
        self.exc = exc

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i):
        if i == self.bad:
            raise_from_helper(self.exc, i)
        return i


def raise_from_helper(exc, i):
    raise exc(f"boom at index {i}")


class SlowDataset(Dataset):
    def __init__(self, delay: float, n: int = 8) -> None:
        self.delay, self.n = delay, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return i


class ShardedStream(IterableDataset):
    """Each worker yields its share of range(n), using get_worker_info()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))

    def __len__(self) -> int:
        return self.n


class UnshardedStream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


class InfoDataset(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {"id": info.id, "num_workers": info.num_workers, "seed": info.seed,
                "same_dataset_type": type(info.dataset) is InfoDataset,
                "init": _INIT_MARK.get("worker"), "rand": float(tessera.rand(1).item()),
                "np": float(np.random.rand())}


_INIT_MARK: dict = {}


def mark_init(worker_id: int) -> None:
    _INIT_MARK["worker"] = worker_id


def fail_init(worker_id: int) -> None:
    raise RuntimeError(f"init failed in {worker_id}")


def ids(loader):
    return [int(v) for batch in loader for v in (batch[0] if isinstance(batch, list)
                                                 else batch).tolist()]


# ---- processes and order ---------------------------------------------------------------

def test_workers_are_separate_processes_and_order_is_kept():
    loader = DataLoader(PidDataset(16), batch_size=2, num_workers=2)
    batches = list(loader)
    assert [i for b in batches for i in b[0].tolist()] == list(range(16))
    pids = {p for b in batches for p in b[1].tolist()}
    assert len(pids) == 2 and os.getpid() not in pids


def test_workers_give_the_same_batches_as_single_process():
    x = tessera.arange(60.0).view(30, 2)
    ds = TensorDataset(x, tessera.arange(30))
    for kwargs in ({"batch_size": 4}, {"batch_size": 4, "drop_last": True},
                   {"batch_size": None}):
        ref = [[t.tolist() for t in b] for b in DataLoader(ds, **kwargs)]
        got = [[t.tolist() for t in b] for b in DataLoader(ds, num_workers=2, **kwargs)]
        assert got == ref


def test_seeded_shuffle_is_the_same_with_and_without_workers():
    ds = TensorDataset(tessera.arange(40))

    def epoch(workers):
        g = tessera.Generator().manual_seed(123)
        loader = DataLoader(ds, batch_size=5, shuffle=True, generator=g,
                            num_workers=workers)
        return ids(loader)
    single = epoch(0)
    assert sorted(single) == list(range(40)) and single != list(range(40))
    assert epoch(2) == single
    assert epoch(2) == single


@pytest.mark.parametrize("prefetch_factor", [1, 4])
def test_prefetch_factor_bounds_reading_ahead(prefetch_factor):
    counter = multiprocessing.get_context("fork").Value("i", 0)

    class Counting(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            with counter.get_lock():
                counter.value += 1
            return i
    loader = DataLoader(Counting(), batch_size=2, num_workers=2,
                        prefetch_factor=prefetch_factor)
    it = iter(loader)
    first = next(it)
    assert first.tolist() == [0, 1]
    time.sleep(0.3)
    # batches in flight: prefetch_factor per worker, plus the one just handed out
    assert counter.value <= (prefetch_factor * 2 + 1) * 2
    assert ids(it) == list(range(2, 64))


def test_in_order_false_yields_everything():
    loader = DataLoader(PidDataset(12), batch_size=2, num_workers=2, in_order=False)
    assert sorted(i for b in loader for i in b[0].tolist()) == list(range(12))


# ---- errors ------------------------------------------------------------------------------

def test_worker_exception_is_reraised_with_traceback():
    loader = DataLoader(FailingDataset(bad=7), batch_size=2, num_workers=2)
    seen = []
    with pytest.raises(ValueError) as info:
        for batch in loader:
            seen.extend(batch.tolist())
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker process" in msg
    assert "Traceback (most recent call last)" in msg
    assert "raise_from_helper" in msg and "boom at index 7" in msg
    assert seen == list(range(6))
    assert _children_gone(), "workers must be gone while the exception is still alive"


def test_worker_key_error_message_is_readable():
    loader = DataLoader(FailingDataset(bad=0, exc=KeyError), batch_size=2, num_workers=1)
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    assert "Caught KeyError" in str(info.value) and "\\n" not in str(info.value)


def test_worker_init_fn_error_is_reraised():
    loader = DataLoader(PidDataset(8), batch_size=2, num_workers=2, worker_init_fn=fail_init)
    with pytest.raises(RuntimeError, match="init failed in"):
        list(loader)


def test_unpicklable_batch_is_an_error_not_a_hang():
    class Unpicklable(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return lambda: i
    loader = DataLoader(Unpicklable(), batch_size=None, num_workers=1, timeout=20)
    with pytest.raises(Exception, match="pickling the batch"):
        list(loader)


def test_worker_crash_is_detected():
    class Crashing(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 3:
                os._exit(3)
            return i
    loader = DataLoader(Crashing(), batch_size=1, num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(loader)


def test_timeout():
    loader = DataLoader(SlowDataset(delay=10.0, n=2), batch_size=1, num_workers=1, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        next(iter(loader))
    assert time.monotonic() - start < 5.0  # the busy worker is terminated, not waited for


# ---- shutdown ------------------------------------------------------------------------------

def test_no_leak_when_iterator_deleted_mid_epoch():
    loader = DataLoader(PidDataset(40), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    assert len(multiprocessing.active_children()) == 2
    del it
    assert _children_gone()


def test_no_leak_when_loop_breaks_or_loader_deleted():
    loader = DataLoader(PidDataset(40), batch_size=2, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert _children_gone()
    loader = DataLoader(PidDataset(40), batch_size=2, num_workers=2, persistent_workers=True)
    next(iter(loader))
    assert len(multiprocessing.active_children()) == 2
    del loader
    assert _children_gone()


def test_no_leak_after_an_exception_in_the_loop_body():
    loader = DataLoader(PidDataset(40), batch_size=2, num_workers=2)
    with pytest.raises(ZeroDivisionError):
        for _ in loader:
            1 / 0
    assert _children_gone()


def test_persistent_workers_survive_epochs():
    loader = DataLoader(PidDataset(12), batch_size=3, num_workers=2, persistent_workers=True)
    epochs = [list(loader) for _ in range(3)]
    pids = [{p for b in e for p in b[1].tolist()} for e in epochs]
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2
    for e in epochs:
        assert [i for b in e for i in b[0].tolist()] == list(range(12))
    assert len(multiprocessing.active_children()) == 2
    # starting a new epoch in the middle of one restarts cleanly
    it = iter(loader)
    next(it)
    assert [i for b in iter(loader) for i in b[0].tolist()] == list(range(12))
    del loader, it


def test_non_persistent_workers_are_new_each_epoch():
    loader = DataLoader(PidDataset(8), batch_size=4, num_workers=2)
    first = {p for b in loader for p in b[1].tolist()}
    assert _children_gone()
    second = {p for b in loader for p in b[1].tolist()}
    assert first.isdisjoint(second)


def test_persistent_workers_recover_after_an_error():
    loader = DataLoader(FailingDataset(bad=5), batch_size=2, num_workers=2,
                        persistent_workers=True)
    with pytest.raises(ValueError):
        list(loader)
    assert _children_gone()
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    del it, loader


# ---- worker info, init and seeds ---------------------------------------------------------

def test_worker_init_fn_and_worker_info():
    g = tessera.Generator().manual_seed(9)
    loader = DataLoader(InfoDataset(), batch_size=None, num_workers=2, worker_init_fn=mark_init,
                        generator=g)
    items = list(loader)
    by_worker = {it["id"]: it for it in items}
    assert set(by_worker) == {0, 1}
    for wid, it in by_worker.items():
        assert it["num_workers"] == 2 and it["init"] == wid and it["same_dataset_type"]
    assert by_worker[1]["seed"] == by_worker[0]["seed"] + 1
    firsts = [items[0], items[1]]
    assert firsts[0]["rand"] != firsts[1]["rand"] and firsts[0]["np"] != firsts[1]["np"]
    again = list(DataLoader(InfoDataset(), batch_size=None, num_workers=2,
                            worker_init_fn=mark_init,
                            generator=tessera.Generator().manual_seed(9)))
    assert [(a["seed"], a["rand"], a["np"]) for a in again] == \
        [(a["seed"], a["rand"], a["np"]) for a in items]
    assert get_worker_info() is None and "worker" not in _INIT_MARK


@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (2, False), (3, True)])
def test_iterable_dataset_sharded_by_worker_info(batch_size, drop_last):
    loader = DataLoader(ShardedStream(11), batch_size=batch_size, drop_last=drop_last,
                        num_workers=2)
    got = []
    for b in loader:
        got.extend(b.tolist() if batch_size else [int(b)])
    ref = torch_loader_items(11, batch_size, drop_last)
    assert sorted(got) == sorted(ref)
    if not drop_last:
        assert sorted(got) == list(range(11))
    else:  # each worker drops its own incomplete last batch, as in PyTorch
        assert sorted(got) == [0, 1, 2, 3, 4, 5, 6, 8, 10]


def torch_loader_items(n, batch_size, drop_last):
    import torch.utils.data as tud

    class TorchSharded(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            return iter(range(info.id, n, info.num_workers))
    out = []
    for b in tud.DataLoader(TorchSharded(), batch_size=batch_size, drop_last=drop_last,
                            num_workers=2):
        out.extend(b.tolist() if batch_size else [int(b)])
    return out


def test_iterable_dataset_without_sharding_is_duplicated_per_worker():
    got = sorted(int(v) for v in DataLoader(UnshardedStream(), batch_size=None, num_workers=2))
    assert got == sorted(list(range(5)) * 2)


def test_iterable_dataset_persistent_workers_restart_the_stream():
    loader = DataLoader(ShardedStream(7), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(2):
        assert sorted(v for b in loader for v in b.tolist()) == list(range(7))
    del loader


class SpawnDataset(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return tessera.tensor([i, os.getpid()])


def test_spawn_context():
    loader = DataLoader(SpawnDataset(), batch_size=3, num_workers=2,
                        multiprocessing_context="spawn", timeout=60)
    out = list(loader)
    assert [r[0] for b in out for r in b.tolist()] == list(range(6))
    assert os.getpid() not in {r[1] for b in out for r in b.tolist()}


def test_exception_class_local_to_a_function_still_reaches_the_main_process():
    class LocalError(Exception):
        pass

    class Raising(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise LocalError("local failure")
    with pytest.raises(RuntimeError, match="LocalError: local failure"):
        next(iter(DataLoader(Raising(), batch_size=2, num_workers=1)))
