"""TensorBoard logging at PyTorch's ``torch.utils.tensorboard`` path: ``SummaryWriter``
writes event files with the ``tensorboard`` package's protocol buffers and record writer
(an optional dependency: ``pip install tessera[tensorboard]``).

>>> from tessera.utils.tensorboard import SummaryWriter
>>> SummaryWriter.add_scalar.__name__
'add_scalar'
"""
from __future__ import annotations


def _check_tensorboard() -> None:
    message = "TensorBoard logging requires TensorBoard version 1.15 or above"
    try:
        import tensorboard
    except ImportError:
        raise ImportError(message) from None
    parts = []
    for p in str(getattr(tensorboard, "__version__", "0")).split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < (1, 15):
        raise ImportError(message)


_check_tensorboard()

from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402

from tessera.utils.tensorboard.writer import FileWriter, SummaryWriter  # noqa: E402

__all__ = ["FileWriter", "RecordWriter", "SummaryWriter"]
