"""``DataLoader``: batches from a dataset, in this process or in worker processes.

With ``num_workers=0`` batches are fetched in the calling process. With ``num_workers > 0``
each worker is a real process (``fork`` where the platform has it, else ``spawn``) holding a
copy of the dataset; the main process hands out batches of indices round-robin, keeps
``prefetch_factor`` batches per worker in flight and yields results in order. A worker's
exception is re-raised in the main process with the worker's traceback in its message.
Workers are shut down and joined when an epoch ends (unless ``persistent_workers``), when
an error is raised, and when the iterator or the loader is garbage-collected.

>>> import tessera
>>> from tessera.utils.data import DataLoader, TensorDataset
>>> ds = TensorDataset(tessera.arange(10.0), tessera.arange(10))
>>> [y.tolist() for _, y in DataLoader(ds, batch_size=4)]
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
"""
from __future__ import annotations

import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from tessera.utils.data import _worker
from tessera.utils.data._collate import default_collate, default_convert
from tessera.utils.data._worker import (
    ExceptionWrapper,
    _IterableDatasetStopIteration,
    _ResumeIteration,
    _WorkerArgs,
    create_fetcher,
    get_worker_info,
)
from tessera.utils.data.dataset import Dataset, IterableDataset
from tessera.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    _draw_seed,
)

__all__ = ["DataLoader", "get_worker_info", "default_collate", "default_convert"]

# The main process waits for a batch on the result queue and on the workers' sentinels
# together, so it notices a dead worker at once; it still checks on them this often (seconds).
_STATUS_INTERVAL = 0.5
# How long a worker whose sentinel closed may take to be reaped (it is exiting).
_REAP_TIMEOUT = 0.1
# How long shutdown waits for workers to exit by themselves before terminating them. Idle
# workers exit at once; this grace only delays shutting down a worker busy on a batch
# nobody will read (after an error, a timeout, or a loop left early).
_SHUTDOWN_TIMEOUT = 1.0

_FROZEN_AFTER_INIT = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                      "persistent_workers")


class _InfiniteConstantSampler(Sampler):
    """The sampler of an IterableDataset: ``None`` forever (the data decides the end)."""

    def __iter__(self):
        while True:
            yield None


def _default_context():
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


class DataLoader:
    """Iterate over ``dataset`` in batches, optionally shuffled and in worker processes.

    The arguments and their rules are PyTorch's: ``batch_size`` (None disables batching),
    ``shuffle``, ``sampler`` / ``batch_sampler``, ``drop_last``, ``collate_fn``,
    ``num_workers``, ``prefetch_factor`` (batches in flight per worker), ``worker_init_fn``
    (called in each worker with its id), ``persistent_workers`` (keep workers between
    epochs), ``generator`` (a ``tessera.Generator``: seeds shuffling and the workers'
    seeds, so a seeded generator reproduces the order), ``timeout`` (seconds to wait for a
    batch from the workers), ``multiprocessing_context``. ``pin_memory`` is accepted and
    has no effect (there is no accelerator to pin for).
    """

    __initialized = False

    def __init__(self, dataset: Dataset, batch_size: int | None = 1,
                 shuffle: bool | None = None, sampler: Sampler | Iterable | None = None,
                 batch_sampler: Sampler | Iterable | None = None, num_workers: int = 0,
                 collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context=None, generator: Any = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        _check_worker_args(num_workers, timeout, prefetch_factor, persistent_workers)
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.in_order = in_order
        self.multiprocessing_context = multiprocessing_context
        self._iterable = isinstance(dataset, IterableDataset)
        sampler, batch_sampler, batch_size, drop_last = _resolve_samplers(
            dataset, self._iterable, batch_size, shuffle, sampler, batch_sampler, drop_last,
            generator)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._iterator: _BaseDataLoaderIter | None = None
        self.__initialized = True
        _warn_if_too_many_workers(num_workers)

    @property
    def multiprocessing_context(self):
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, ctx) -> None:
        if ctx is not None:
            if self.num_workers == 0:
                raise ValueError("multiprocessing_context can only be used with multi-process "
                                 "loading (num_workers > 0), but got num_workers="
                                 f"{self.num_workers}")
            if isinstance(ctx, str):
                if ctx not in multiprocessing.get_all_start_methods():
                    raise ValueError("multiprocessing_context option should specify a valid "
                                     "start method in "
                                     f"{multiprocessing.get_all_start_methods()!r}, but got "
                                     f"multiprocessing_context={ctx!r}")
                ctx = multiprocessing.get_context(ctx)
            elif not isinstance(ctx, multiprocessing.context.BaseContext):
                raise TypeError("multiprocessing_context option should be a valid context "
                                "object or a string specifying the start method, but got "
                                f"multiprocessing_context={ctx}")
        self.__multiprocessing_context = ctx

    def __setattr__(self, attr: str, val) -> None:
        if self.__initialized and attr in _FROZEN_AFTER_INIT:
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        # what the iterators draw from: batches of indices, or single indices
        return self.batch_sampler if self._auto_collation else self.sampler

    def _get_iterator(self) -> _BaseDataLoaderIter:
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        return _MultiProcessingDataLoaderIter(self)

    def __iter__(self) -> _BaseDataLoaderIter:
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None or self._iterator._shutdown:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)  # type: ignore[arg-type]
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else \
                    math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)


def _check_worker_args(num_workers, timeout, prefetch_factor, persistent_workers) -> None:
    if num_workers < 0:
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                         "disable multiprocessing.")
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                         "let num_workers > 0 to enable multiprocessing, otherwise set "
                         "prefetch_factor to None.")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers option needs num_workers > 0")


def _resolve_samplers(dataset, iterable, batch_size, shuffle, sampler, batch_sampler,
                      drop_last, generator):
    """PyTorch's rules for combining shuffle/sampler/batch_sampler/batch_size/drop_last."""
    if iterable:
        if shuffle not in {False, None}:
            raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle}")
        if sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                             f"option, but got sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError("DataLoader with IterableDataset: expected unspecified "
                             f"batch_sampler option, but got batch_sampler={batch_sampler}")
    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually "
                         "exclusive with drop_last")
    if sampler is None:
        if iterable:
            sampler = _InfiniteConstantSampler()
        elif shuffle:
            sampler = RandomSampler(dataset, generator=generator)
        else:
            sampler = SequentialSampler(dataset)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return sampler, batch_sampler, batch_size, drop_last


def _warn_if_too_many_workers(num_workers: int) -> None:
    if num_workers == 0:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    if num_workers > cpus:
        warnings.warn(f"This DataLoader will create {num_workers} worker processes in total. "
                      f"Our suggested max number of worker in current system is {cpus}, which "
                      "is smaller than what this DataLoader is going to create. Excessive "
                      "workers may slow the DataLoader down.", UserWarning, stacklevel=3)


class _BaseDataLoaderIter:
    _shutdown = True  # nothing to shut down until a subclass starts workers

    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._iterable = loader._iterable
        self._index_sampler = loader._index_sampler
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._collate_fn = loader.collate_fn
        self._num_workers = loader.num_workers
        self._persistent_workers = loader.persistent_workers
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = _draw_seed(loader.generator)
        self._num_yielded = 0

    def __iter__(self) -> _BaseDataLoaderIter:
        return self

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0

    def _next_index(self):
        return next(self._sampler_iter)

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._fetcher = create_fetcher(self._iterable, self._dataset, self._auto_collation,
                                       self._collate_fn, self._drop_last)

    def _next_data(self):
        index = self._next_index()  # StopIteration here (or in fetch) ends the epoch
        return self._fetcher.fetch(index)


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    """Workers, their index queues, one result queue, and in-order reassembly.

    ``_task_info[i]`` is ``(worker_id,)`` while task ``i`` is in flight and
    ``(worker_id, data)`` once its result arrived ahead of an earlier task.
    """

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._prefetch_factor: int = loader.prefetch_factor or 2
        self._owner_pid = os.getpid()
        ctx = loader.multiprocessing_context or _default_context()
        self._workers: list = []
        self._index_queues: list = []
        self._worker_result_queue = ctx.Queue()
        self._workers_done_event = ctx.Event()
        self._shutdown = False
        self._exiting: set[int] = set()  # pids whose sentinel fired while they lived on
        args = _WorkerArgs(self._iterable, self._dataset, self._auto_collation,
                           self._collate_fn, self._drop_last, self._base_seed,
                           loader.worker_init_fn, self._num_workers, self._persistent_workers)
        try:
            for i in range(self._num_workers):
                index_queue = ctx.Queue()
                index_queue.cancel_join_thread()  # never block interpreter exit on it
                w = ctx.Process(target=_worker._worker_loop,
                                args=(args, i, index_queue, self._worker_result_queue,
                                      self._workers_done_event), daemon=True)
                w.start()
                self._index_queues.append(index_queue)
                self._workers.append(w)
            self._reset(loader, first_iter=True)
        except BaseException:
            self._shutdown_workers()
            raise

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # persistent workers: start a new epoch once every worker has drained the old one
            for q in self._index_queues:
                q.put(_ResumeIteration())
            pending = self._num_workers
            while pending > 0:
                idx, _ = self._get_data()
                if isinstance(idx, _ResumeIteration):
                    pending -= 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self) -> None:
        if self._tasks_outstanding >= self._prefetch_factor * self._num_workers:
            return
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return  # every worker's IterableDataset copy is exhausted
        self._index_queues[worker_id].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _get_data(self):
        """The next ``(task_index, data)`` from any worker; errors if a worker died or
        ``timeout`` passed. Waits on the result queue and on the workers' process sentinels
        at once, so a worker's death is noticed as it happens, not at the next poll."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _STATUS_INTERVAL
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            self._wait_for_result_or_exit(wait)
            try:
                idx, payload = self._worker_result_queue.get(timeout=0)
                return idx, pickle.loads(payload)
            except queue.Empty:
                self._check_workers_alive()
                if deadline is not None and time.monotonic() >= deadline:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} "
                                       "seconds") from None

    def _wait_for_result_or_exit(self, timeout: float) -> None:
        """Block until a result is readable, a serving worker exits, or ``timeout``."""
        reader = getattr(self._worker_result_queue, "_reader", None)
        if reader is None:  # a queue without a connection to wait on: poll
            time.sleep(min(timeout, _STATUS_INTERVAL / 10))
            return
        sentinels = [w.sentinel for i, w in enumerate(self._workers)
                     if self._workers_status[i] and w.pid not in self._exiting]
        ready = multiprocessing.connection.wait([reader, *sentinels], timeout)
        if reader not in ready:
            for w in self._workers:
                if w.sentinel in ready:
                    # closed as the process ends; is_alive() turns False once it is reaped
                    # (not join(): it would block on a worker that closed the pipe itself)
                    end = time.monotonic() + _REAP_TIMEOUT
                    while w.is_alive() and time.monotonic() < end:
                        time.sleep(0.001)
                    if w.is_alive():  # alive with its sentinel closed: polled from now on
                        self._exiting.add(w.pid)

    def _check_workers_alive(self) -> None:
        failed = [w for i, w in enumerate(self._workers)
                  if self._workers_status[i] and not w.is_alive()]
        if failed:
            details = ", ".join(_describe_exit(w) for w in failed)
            self._shutdown_workers()
            raise RuntimeError(f"DataLoader worker (pid(s) {details}) exited unexpectedly")

    def _next_data(self):
        while True:
            # skip tasks whose worker stopped (exhausted IterableDataset) without a result
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info:
                    if len(info) == 2 or self._workers_status[info[0]]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                data = self._task_info.pop(self._rcvd_idx)[1]
                self._rcvd_idx += 1
                return self._process_data(data)
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if isinstance(data, _IterableDatasetStopIteration):
                self._workers_status[data.worker_id] = False
                self._try_put_index()
                continue
            if idx == self._rcvd_idx:
                del self._task_info[idx]
                self._rcvd_idx += 1
                return self._process_data(data)
            if not self._in_order:
                del self._task_info[idx]
                return self._process_data(data)
            self._task_info[idx] += (data,)

    def _process_data(self, data):
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            # shut down first: the exception's traceback keeps this iterator alive
            self._shutdown_workers()
            data.reraise()
        return data

    def _shutdown_workers(self) -> None:
        """Stop and join every worker (terminating stragglers), then close the queues."""
        if self._shutdown or os.getpid() != self._owner_pid:
            return  # already done, or a forked copy of this iterator in another process
        self._shutdown = True
        try:
            self._workers_done_event.set()
            for q in self._index_queues:
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + _SHUTDOWN_TIMEOUT
            for w in self._workers:
                w.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for w in self._workers:
                if w.is_alive():
                    w.terminate()
                    w.join(timeout=1.0)
                    if w.is_alive():
                        w.kill()
                        w.join()
            for q in (*self._index_queues, self._worker_result_queue):
                q.cancel_join_thread()
                q.close()

    def __del__(self) -> None:
        try:
            self._shutdown_workers()
        except Exception:  # interpreter teardown: modules may already be gone
            pass


def _describe_exit(w) -> str:
    code = w.exitcode
    if code is not None and code < 0:
        import signal
        try:
            return f"{w.pid} killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"{w.pid} killed by signal {-code}"
    return f"{w.pid} exit code {code}"
