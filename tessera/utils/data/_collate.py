"""``default_collate`` (a list of samples -> one batch) and ``default_convert`` (NumPy ->
tensors without batching), with PyTorch's rules.

Tensors are stacked along a new dimension 0; NumPy arrays and NumPy scalars become tensors
and are stacked; Python floats become a float64 tensor, ints an int64 tensor (bools a bool
tensor); strings and bytes stay a list; mappings, namedtuples and sequences are collated
element by element (tuples become lists, as in PyTorch).

>>> import tessera
>>> batch = default_collate([{"x": tessera.ones(2), "y": 1}, {"x": tessera.zeros(2), "y": 0}])
>>> batch["x"].shape, batch["y"]
(tessera.Size([2, 2]), tensor([1, 0]))
"""
from __future__ import annotations

import collections.abc
import copy
import re
from collections.abc import Callable

import numpy as np

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.ops.creation import as_tensor, from_numpy, tensor
from tessera.ops.shape import stack

__all__ = ["collate", "default_collate", "default_convert", "default_collate_fn_map"]

_STR_OBJ_DTYPE = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
    "found {}")


def _stack_tensors(batch, *, collate_fn_map=None) -> Tensor:
    first = batch[0]
    same = all(isinstance(t, Tensor) and t.shape == first.shape and t.dtype is first.dtype
               and t.device.type == "cpu" and not t.requires_grad for t in batch)
    if same:  # the common case, stacked in one NumPy call rather than one op per sample
        return from_numpy(np.stack([t.numpy() for t in batch]))
    return stack(list(batch), 0)


def _collate_numpy_array(batch, *, collate_fn_map=None):
    elem = batch[0]
    if _STR_OBJ_DTYPE.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    if all(isinstance(b, np.ndarray) and b.shape == elem.shape and b.dtype == elem.dtype
           for b in batch):
        return from_numpy(np.stack(batch))
    return collate([as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def _collate_numpy_scalar(batch, *, collate_fn_map=None):
    return from_numpy(np.array(batch))


def _collate_float(batch, *, collate_fn_map=None):
    return tensor(list(batch), dtype=D.float64)


def _collate_int(batch, *, collate_fn_map=None):
    return tensor(list(batch))


def _collate_str(batch, *, collate_fn_map=None):
    return batch


default_collate_fn_map: dict[type | tuple[type, ...], Callable] = {
    Tensor: _stack_tensors,
    np.ndarray: _collate_numpy_array,
    (np.bool_, np.number, np.object_): _collate_numpy_scalar,
    float: _collate_float,
    int: _collate_int,
    str: _collate_str,
    bytes: _collate_str,
}


def _collate_mapping(batch, collate_fn_map):
    elem = batch[0]
    items = {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map)
             for key in elem}
    try:
        if isinstance(elem, collections.abc.MutableMapping):
            clone = copy.copy(elem)  # keeps the mapping's type and extra attributes
            clone.update(items)
            return clone
        return type(elem)(items)
    except TypeError:  # a mapping type that cannot be built from a dict
        return items


def _collate_sequence(batch, collate_fn_map):
    elem = batch[0]
    it = iter(batch)
    elem_size = len(next(it))
    if not all(len(e) == elem_size for e in it):
        raise RuntimeError("each element in list of batch should be of equal size")
    transposed = list(zip(*batch))
    if isinstance(elem, tuple):  # PyTorch returns a list here, for backward compatibility
        return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for i, samples in enumerate(transposed):
                clone[i] = collate(samples, collate_fn_map=collate_fn_map)
            return clone
        return type(elem)([collate(samples, collate_fn_map=collate_fn_map)
                           for samples in transposed])
    except TypeError:
        return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]


def collate(batch, *, collate_fn_map: dict | None = None):
    """Collate ``batch`` (a list of samples) using ``collate_fn_map``: a dict from a type
    (or tuple of types) to ``fn(batch, *, collate_fn_map)`` for samples of that type;
    containers are handled here and recurse."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        return _collate_mapping(batch, collate_fn_map)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map)
                           for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        return _collate_sequence(batch, collate_fn_map)
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def default_collate(batch):
    """Merge a list of samples into a batch (PyTorch's ``default_collate``).

    >>> default_collate([(1, 2.0), (3, 4.0)])
    [tensor([1, 3]), tensor([2., 4.], dtype=tessera.float64)]
    """
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data):
    """Turn NumPy arrays and scalars inside ``data`` into tensors, keeping the structure
    (used when automatic batching is off, ``batch_size=None``)."""
    elem_type = type(data)
    if isinstance(data, Tensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "bytes_"):
        if isinstance(data, np.ndarray) and _STR_OBJ_DTYPE.search(data.dtype.str) is not None:
            return data
        if isinstance(data, np.generic):  # keep the scalar's own dtype (np.float64 -> float64)
            return from_numpy(np.asarray(data))
        return as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        items = {key: default_convert(data[key]) for key in data}
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(items)
                return clone
            return elem_type(items)
        except TypeError:
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                seq = copy.copy(data)
                for i, d in enumerate(data):
                    seq[i] = default_convert(d)
                return seq
            return elem_type([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
