"""What runs inside a DataLoader worker process, and the fetchers both the workers and the
single-process loader use to turn a batch of indices into a batch.

A worker reads ``(task_index, indices)`` from its own index queue, fetches and collates the
batch, and puts ``(task_index, batch)`` on the shared result queue. Tensors cross the
process boundary as NumPy arrays (``Tensor.__reduce_ex__``). An exception becomes an
``ExceptionWrapper`` carrying the worker's traceback text, which the main process re-raises.
``None`` on the index queue asks the worker to exit; ``_ResumeIteration`` starts a new epoch
for persistent workers.
"""
from __future__ import annotations

import os
import pickle
import queue
import random
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera.ops.creation import tensor
from tessera.ops.random import manual_seed

# How often a waiting worker checks that its parent process is still alive (seconds).
WORKER_STATUS_INTERVAL = 1.0

_worker_info: WorkerInfo | None = None


class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker: ``id``, ``num_workers``,
    ``seed`` and ``dataset`` (this worker's copy). Read-only once made."""

    __initialized = False

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.__keys = tuple(kwargs)
        self.__initialized = True

    def __setattr__(self, key: str, val: Any) -> None:
        if self.__initialized:
            raise RuntimeError(f"Cannot assign attributes to {self.__class__.__name__} "
                               "objects")
        super().__setattr__(key, val)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__keys)
        return f"{self.__class__.__name__}({items})"


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker process, its ``WorkerInfo``; in the main process, None.

    An ``IterableDataset`` uses it to give each worker its own shard:

    >>> info = get_worker_info()
    >>> info is None  # not in a worker here
    True
    """
    return _worker_info


class KeyErrorMessage(str):
    """A message that prints as itself inside a KeyError (KeyError repr()s its argument)."""

    def __repr__(self) -> str:
        return self


class ExceptionWrapper:
    """An exception caught in a worker, with its traceback as text, to re-raise in the
    main process (tracebacks themselves cannot be pickled)."""

    def __init__(self, exc_info=None, where: str = "in background") -> None:
        if exc_info is None:
            exc_info = sys.exc_info()
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        """Raise the wrapped exception type with the worker's traceback in its message."""
        msg = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = KeyErrorMessage(msg)
        elif getattr(self.exc_type, "message", None):
            raise self.exc_type(message=msg)
        try:
            exception = self.exc_type(msg)
        except Exception:  # an exception type whose constructor wants other arguments
            raise RuntimeError(msg) from None
        raise exception


class _IterableDatasetStopIteration:
    """Sent by a worker whose copy of an IterableDataset is exhausted."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


class _ResumeIteration:
    """Sent to persistent workers at the start of a new epoch; echoed back once seen."""


# ---- fetchers -----------------------------------------------------------------------------

class _MapDatasetFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self._fast = _tensor_dataset_fast_path(dataset, auto_collation, collate_fn)

    def fetch(self, index):
        if self.auto_collation:
            if self._fast:
                return self._fast(index)
            getitems = getattr(self.dataset, "__getitems__", None)
            if callable(getitems):
                data = getitems(index)
            else:
                data = [self.dataset[idx] for idx in index]
        else:
            data = self.dataset[index]
        return self.collate_fn(data)


class _IterableDatasetFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset_iter = iter(dataset)
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if self.auto_collation:
            data = []
            for _ in index:
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
            if not data or (self.drop_last and len(data) < len(index)):
                raise StopIteration
        else:
            data = next(self.dataset_iter)
        return self.collate_fn(data)


def _tensor_dataset_fast_path(dataset, auto_collation, collate_fn):
    """For a TensorDataset with default_collate, index all tensors once per batch: the
    result equals collating the samples one by one, without a Python loop per sample."""
    from tessera.utils.data._collate import default_collate
    from tessera.utils.data.dataset import TensorDataset

    if not auto_collation or type(dataset) is not TensorDataset or \
            collate_fn is not default_collate:
        return None

    def fetch(index):
        idx = tensor(list(index), dtype=D.int64)
        return [t[idx] for t in dataset.tensors]
    return fetch


def create_fetcher(iterable: bool, dataset, auto_collation, collate_fn, drop_last):
    cls = _IterableDatasetFetcher if iterable else _MapDatasetFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


# ---- the worker process -------------------------------------------------------------------

def _seed_worker(seed: int) -> None:
    random.seed(seed)
    manual_seed(seed)
    # NumPy's legacy seed takes 32 bits; fold the 64-bit seed so workers still differ
    np.random.seed([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF])


@dataclass
class _WorkerArgs:
    iterable: bool
    dataset: Any
    auto_collation: bool
    collate_fn: Any
    drop_last: bool
    base_seed: int
    init_fn: Any
    num_workers: int
    persistent_workers: bool


def _worker_loop(args: _WorkerArgs, worker_id: int, index_queue, data_queue,
                 done_event) -> None:
    """The body of worker ``worker_id``: serve tasks until told to stop or orphaned."""
    global _worker_info
    parent = os.getppid()
    try:
        seed = args.base_seed + worker_id
        _seed_worker(seed)
        _worker_info = WorkerInfo(id=worker_id, num_workers=args.num_workers, seed=seed,
                                  dataset=args.dataset)
        init_error = None
        fetcher = None
        try:
            if args.init_fn is not None:
                args.init_fn(worker_id)
            fetcher = create_fetcher(args.iterable, args.dataset, args.auto_collation,
                                     args.collate_fn, args.drop_last)
        except Exception:
            init_error = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        _serve(args, worker_id, index_queue, data_queue, done_event, fetcher, init_error,
               parent)
    except KeyboardInterrupt:
        pass  # the main process handles Ctrl-C and shuts the workers down
    if done_event.is_set():
        # results nobody will read must not keep this process alive at exit
        data_queue.cancel_join_thread()
        data_queue.close()


def _serve(args, worker_id, index_queue, data_queue, done_event, fetcher, init_error,
           parent) -> None:
    iteration_end = False
    while True:
        try:
            r = index_queue.get(timeout=WORKER_STATUS_INTERVAL)
        except queue.Empty:
            if os.getppid() != parent:  # the main process died without shutting us down
                return
            continue
        if isinstance(r, _ResumeIteration):
            data_queue.put((r, _dumps(None)))
            iteration_end = False
            if args.iterable and init_error is None:
                try:
                    fetcher = create_fetcher(True, args.dataset, args.auto_collation,
                                             args.collate_fn, args.drop_last)
                except Exception:
                    init_error = ExceptionWrapper(
                        where=f"in DataLoader worker process {worker_id}")
            continue
        if r is None:
            return
        if done_event.is_set() or iteration_end:
            continue  # drain tasks of an epoch that is over
        idx, index = r
        data: Any
        if init_error is not None:
            data, init_error = init_error, None
        else:
            try:
                data = fetcher.fetch(index)
            except Exception as e:
                if isinstance(e, StopIteration) and args.iterable:
                    data = _IterableDatasetStopIteration(worker_id)
                    iteration_end = True
                else:
                    data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        _send(data_queue, idx, data, worker_id)
        del data, idx, index, r


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _send(data_queue, idx, data, worker_id: int) -> None:
    # Pickled here rather than in the queue's feeder thread, so that a batch that cannot be
    # pickled becomes an error the main process sees instead of a batch silently lost.
    try:
        payload = _dumps(data)
    except Exception:
        if isinstance(data, ExceptionWrapper):  # an exception class pickle cannot name
            data.exc_type = RuntimeError  # the message still has the original traceback
            payload = _dumps(data)
        else:
            payload = _dumps(ExceptionWrapper(
                where=f"in DataLoader worker process {worker_id} (pickling the batch)"))
    data_queue.put((idx, payload))
