"""``spawn`` and ``start_processes``: run ``fn(i, *args)`` in ``nprocs`` processes and join
them, raising in the parent the first child's exception with its traceback (PyTorch's
``torch.multiprocessing.spawn``)."""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import traceback
import warnings

__all__ = ["ProcessContext", "ProcessException", "ProcessExitedException",
           "ProcessRaisedException", "SpawnContext", "spawn", "start_processes"]


class ProcessException(Exception):
    __slots__ = ["error_index", "error_pid"]

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A child process raised an exception; its traceback is in the message."""


class ProcessExitedException(ProcessException):
    """A child process died by a signal or exited with a non-zero code."""

    __slots__ = ["exit_code"]

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int,
                 signal_name: str | None = None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return (type(self), (self.msg, self.error_index, self.error_pid, self.exit_code,
                             self.signal_name))


def _wrap(fn, i: int, args: tuple, error_file: str) -> None:
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # the parent interrupted us while tearing down
    except Exception:
        # a file rather than a queue: a one-shot message that cannot deadlock the join
        with open(error_file, "wb") as fh:
            pickle.dump(traceback.format_exc(), fh)
        sys.exit(1)


class ProcessContext:
    """The started processes; ``join()`` waits for them and raises the first failure."""

    def __init__(self, processes: list, error_files: list) -> None:
        self.error_files = error_files
        self.processes = processes
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """True once every process has exited cleanly, False if some still run after
        ``timeout``; on a failure, terminates the others and raises."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            return not self.sentinels
        self._stop_all(grace_period)
        raise self._failure(error_index)

    def _stop_all(self, grace_period: float | None) -> None:
        if grace_period is not None:
            for p in self.processes:
                p.join(grace_period)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(30 if grace_period is None else grace_period)
            if p.is_alive():
                p.kill()
                p.join()

    def _failure(self, index: int) -> ProcessException:
        process = self.processes[index]
        if not os.access(self.error_files[index], os.R_OK):
            code = process.exitcode
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"<Unknown signal {-code}>"
                return ProcessExitedException(f"process {index:d} terminated with signal "
                                              f"{name}", index, process.pid, code, name)
            return ProcessExitedException(f"process {index:d} terminated with exit code "
                                          f"{code:d}", index, process.pid, code)
        with open(self.error_files[index], "rb") as fh:
            trace = pickle.load(fh)
        msg = f"\n\n-- Process {index:d} terminated with the following error:\n{trace}"
        return ProcessRaisedException(msg, index, process.pid)


class SpawnContext(ProcessContext):
    def __init__(self, processes: list, error_files: list) -> None:
        warnings.warn("SpawnContext is renamed to ProcessContext since 1.4 release.",
                      stacklevel=2)
        super().__init__(processes, error_files)


def start_processes(fn, args: tuple = (), nprocs: int = 1, join: bool = True,
                    daemon: bool = False, start_method: str = "spawn"):
    """``spawn`` with any start method (``"fork"``, ``"spawn"``, ``"forkserver"``)."""
    mp = multiprocessing.get_context(start_method)
    processes, error_files = [], []
    for i in range(nprocs):
        # the error file exists only once a child has written a traceback to it
        fd, name = tempfile.mkstemp(prefix="tessera-errorfile-", suffix=".pickle")
        os.close(fd)
        os.unlink(name)
        process = mp.Process(  # type: ignore[attr-defined]
            target=_wrap, args=(fn, i, args, name), daemon=daemon)
        process.start()
        processes.append(process)
        error_files.append(name)
    context = ProcessContext(processes, error_files)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(fn, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: str = "spawn"):
    """Runs ``fn(i, *args)`` for ``i`` in ``range(nprocs)``, each in a new process; with
    ``join`` waits for all of them, else returns a ``ProcessContext``. ``fn`` must be a
    module-level function (it is pickled).

    >>> import tessera.multiprocessing as mp
    >>> mp.spawn(print, args=("from a child",), nprocs=1)  # doctest: +SKIP
    """
    if start_method != "spawn":
        warnings.warn(f"This method only supports start_method=spawn (got: {start_method}).\n"
                      "To use a different start_method use:\n\t\t"
                      " tessera.multiprocessing.start_processes(...)", FutureWarning,
                      stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, "spawn")
