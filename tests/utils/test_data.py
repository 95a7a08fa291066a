"""tessera.utils.data in one process: datasets, samplers, collation and the DataLoader,
compared with torch.utils.data where both are deterministic."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import tessera
import tessera.utils.data as data
from tessera.utils.data import (
    BatchSampler,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    random_split,
)

Point = collections.namedtuple("Point", ["x", "y"])


def plain(obj):
    """A comparable form of a batch from either library: tensors become (dtype, array)."""
    if isinstance(obj, (torch.Tensor, tessera.Tensor)):
        name = str(obj.dtype).rpartition(".")[2]
        return ("tensor", name, np.asarray(obj.detach().cpu().numpy()).tolist())
    if isinstance(obj, dict):
        return (type(obj).__name__, {k: plain(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (type(obj).__name__, [plain(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [plain(v) for v in obj])
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.tolist())
    return obj


class NumpyDataset:
    """A map-style dataset both libraries can read: NumPy, numbers, strings, containers."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        x = np.arange(3, dtype=np.float32) + i
        return {"x": x, "y": i, "w": float(i) / 2, "name": f"s{i}",
                "pair": (np.int32(i), [i, i + 1]), "p": Point(i, np.float64(i))}


class Squares(Dataset):
    def __len__(self):
        return 7

    def __getitem__(self, i):
        if not 0 <= i < 7:
            raise IndexError(i)
        return i * i


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


# ---- datasets -------------------------------------------------------------------------

def test_tensor_dataset():
    x, y = tessera.arange(12.0).view(6, 2), tessera.arange(6)
    ds = TensorDataset(x, y)
    assert len(ds) == 6
    a, b = ds[4]
    assert a.tolist() == [8.0, 9.0] and b.item() == 4
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(x, tessera.arange(5))


def test_concat_and_chain_datasets():
    cat = ConcatDataset([Squares(), Squares()])
    assert len(cat) == 14 and cat[8] == 1 and cat[-1] == 36 and cat.cumulative_sizes == [7, 14]
    assert len(Squares() + Squares()) == 14
    with pytest.raises(ValueError):
        cat[-15]
    with pytest.raises(AssertionError):
        ConcatDataset([])
    with pytest.raises(AssertionError):
        ConcatDataset([Stream(3)])
    chain = Stream(2) + Stream(3)
    assert isinstance(chain, ChainDataset)
    assert list(chain) == [0, 1, 0, 1, 2] and len(chain) == 5


def test_subset_and_stack_dataset():
    sub = Subset(Squares(), [6, 0, 3])
    assert len(sub) == 3 and [sub[i] for i in range(3)] == [36, 0, 9]
    assert sub.__getitems__([2, 0]) == [9, 36]
    st = StackDataset(Squares(), Squares())
    assert st[2] == (4, 4) and len(st) == 7
    assert StackDataset(a=Squares(), b=Squares())[3] == {"a": 9, "b": 9}
    with pytest.raises(ValueError):
        StackDataset(Squares(), Stream(3))


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.7], [0.33, 0.33, 0.34], [0.5, 0.5, 0.0]])
def test_random_split_lengths_match_torch(lengths):
    with pytest.warns(UserWarning) if 0.0 in lengths else _nothing():
        expected = [len(s) for s in tud.random_split(range(10), lengths)]
    g = tessera.Generator().manual_seed(0)
    with pytest.warns(UserWarning) if 0.0 in lengths else _nothing():
        splits = random_split(range(10), lengths, generator=g)
    assert [len(s) for s in splits] == expected
    assert sorted(i for s in splits for i in s.indices) == list(range(10))


def test_random_split_generator_and_errors():
    def split(seed):
        g = tessera.Generator().manual_seed(seed)
        return [s.indices for s in random_split(range(20), [5, 15], generator=g)]
    assert split(1) == split(1)
    assert split(1) != split(2)
    tessera.manual_seed(3)
    first = [s.indices for s in random_split(range(20), [5, 15])]
    tessera.manual_seed(3)
    assert [s.indices for s in random_split(range(20), [5, 15])] == first
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])
    with pytest.raises(ValueError):
        tud.random_split(range(10), [3, 3])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---- samplers -------------------------------------------------------------------------

def test_sequential_and_batch_sampler_match_torch():
    assert list(SequentialSampler(range(5))) == list(tud.SequentialSampler(range(5)))
    for bs in (1, 2, 3, 7):
        for drop in (False, True):
            ours = BatchSampler(SequentialSampler(range(7)), bs, drop)
            ref = tud.BatchSampler(tud.SequentialSampler(range(7)), bs, drop)
            assert list(ours) == list(ref) and len(ours) == len(ref)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            BatchSampler(range(3), bad, False)
    with pytest.raises(ValueError):
        BatchSampler(range(3), 2, drop_last=1)


def test_random_sampler():
    g = tessera.Generator().manual_seed(0)
    perm = list(RandomSampler(range(10), generator=g))
    assert sorted(perm) == list(range(10))
    assert list(RandomSampler(range(10), generator=tessera.Generator().manual_seed(0))) == perm
    over = list(RandomSampler(range(4), num_samples=10, generator=g))
    assert len(over) == 10 and sorted(over[:4]) == [0, 1, 2, 3] and sorted(over[4:8]) == [0, 1,
                                                                                          2, 3]
    rep = RandomSampler(range(3), replacement=True, num_samples=100, generator=g)
    drawn = list(rep)
    assert len(rep) == 100 and len(drawn) == 100 and set(drawn) <= {0, 1, 2}
    with pytest.raises(ValueError, match="num_samples"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement"):
        RandomSampler(range(3), replacement=1)
    tessera.manual_seed(11)
    a = list(RandomSampler(range(50)))
    tessera.manual_seed(11)
    assert list(RandomSampler(range(50))) == a


def test_subset_random_and_weighted_samplers():
    g = tessera.Generator().manual_seed(5)
    idx = [10, 20, 30, 40]
    assert sorted(SubsetRandomSampler(idx, generator=g)) == idx
    w = WeightedRandomSampler([0.0, 0.0, 1.0, 0.0], 20, generator=g)
    assert list(w) == [2] * 20 and len(w) == 20
    no_rep = list(WeightedRandomSampler([1.0, 2.0, 3.0], 3, replacement=False, generator=g))
    assert sorted(no_rep) == [0, 1, 2]
    counts = np.bincount(list(WeightedRandomSampler([1.0, 3.0], 4000, generator=g)),
                         minlength=2)
    assert 0.7 < counts[1] / 4000 < 0.8
    with pytest.raises(ValueError, match="num_samples"):
        WeightedRandomSampler([1.0], 0)
    with pytest.raises(ValueError, match="replacement"):
        WeightedRandomSampler([1.0], 1, replacement=0)
    with pytest.raises(ValueError, match="1d"):
        WeightedRandomSampler([[1.0, 2.0]], 1)


# ---- collation ------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [
    [1, 2, 3],
    [1.5, 2.5],
    [True, False],
    ["a", "b"],
    [b"a", b"b"],
    [np.float32(1), np.float32(2)],
    [np.int16(1), np.int16(2)],
    [np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)],
    [np.arange(3), np.arange(3) + 1],
    [(1, 2.0), (3, 4.0)],
    [[1, "x"], [2, "y"]],
    [{"a": 1, "b": [np.ones(2), 0.5]}, {"a": 2, "b": [np.zeros(2), 1.5]}],
    [collections.OrderedDict(a=1), collections.OrderedDict(a=2)],
    [Point(1, 2.0), Point(3, 4.0)],
    [Point(np.ones(2), (1, 2)), Point(np.zeros(2), (3, 4))],
], ids=lambda b: type(b[0]).__name__)
def test_default_collate_matches_torch(batch):
    assert plain(default_collate(batch)) == plain(tud.default_collate(batch))


def test_default_collate_tensors():
    ts = [tessera.ones(2, 3) * i for i in range(4)]
    out = default_collate(ts)
    assert out.shape == (4, 2, 3) and out[3].tolist() == [[3.0] * 3] * 2
    mixed = default_collate([tessera.ones(2, dtype=tessera.int64), tessera.ones(2)])
    ref = torch.stack([torch.ones(2, dtype=torch.int64), torch.ones(2)])
    assert str(mixed.dtype).rpartition(".")[2] == str(ref.dtype).rpartition(".")[2]
    x = tessera.ones(2, requires_grad=True)
    stacked = default_collate([x, x * 2])
    stacked.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]  # collation keeps autograd, as torch.stack does


def test_default_collate_errors_match_torch():
    for batch in ([object(), object()], [[1, 2], [1]], [np.array(["a"]), np.array(["b"])]):
        with pytest.raises(Exception) as ref:
            tud.default_collate(batch)
        with pytest.raises(ref.type):
            default_collate(batch)
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        default_collate([object()])


@pytest.mark.parametrize("value", [
    np.arange(3), np.float64(2.0), 3, "s", (np.ones(2), 1), [np.ones(1), "a"],
    {"k": np.zeros(2), "n": 1}, Point(np.ones(1), 2), np.array(["x"]),
], ids=lambda v: type(v).__name__)
def test_default_convert_matches_torch(value):
    assert plain(default_convert(value)) == plain(tud.default_convert(value))


# ---- the DataLoader, single process -----------------------------------------------------

@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (3, False), (3, True),
                                                  (10, False), (12, True), (None, False)])
def test_dataloader_batches_match_torch(batch_size, drop_last):
    ds = NumpyDataset(10)
    ours = [plain(b) for b in DataLoader(ds, batch_size=batch_size, drop_last=drop_last)]
    ref = [plain(b) for b in tud.DataLoader(ds, batch_size=batch_size, drop_last=drop_last)]
    assert ours == ref
    assert len(DataLoader(ds, batch_size=batch_size, drop_last=drop_last)) == \
        len(tud.DataLoader(ds, batch_size=batch_size, drop_last=drop_last))


def test_dataloader_samplers_and_collate_fn_match_torch():
    ds = NumpyDataset(9)
    order = [8, 1, 5, 0, 2, 7, 3, 6, 4]

    def collate(samples):
        return [s["y"] for s in samples]
    for kwargs in ({"sampler": order, "batch_size": 4},
                   {"sampler": order, "batch_size": 4, "drop_last": True},
                   {"batch_sampler": [[0, 1], [5], [8, 2, 3]]},
                   {"batch_size": 2, "collate_fn": collate},
                   {"batch_size": None, "collate_fn": lambda s: s["name"]}):
        ours = [plain(b) for b in DataLoader(ds, **kwargs)]
        ref = [plain(b) for b in tud.DataLoader(ds, **kwargs)]
        assert ours == ref, kwargs


def test_dataloader_tensor_dataset_fast_path_matches_samples():
    x = tessera.arange(40.0).view(10, 4)
    y = tessera.arange(10)
    ds = TensorDataset(x, y)
    tds = tud.TensorDataset(torch.arange(40.0).view(10, 4), torch.arange(10))
    for kwargs in ({"batch_size": 3}, {"batch_size": 4, "drop_last": True},
                   {"sampler": [9, 0, 4, 2], "batch_size": 2}):
        ours = [plain(b) for b in DataLoader(ds, **kwargs)]
        ref = [plain(b) for b in tud.DataLoader(tds, **kwargs)]
        assert ours == ref
    slow = [plain(b) for b in DataLoader(ds, batch_size=3, collate_fn=lambda b:
                                         default_collate(b))]
    assert slow == [plain(b) for b in DataLoader(ds, batch_size=3)]


def test_dataloader_shuffle_is_a_permutation_and_seeded():
    ds = TensorDataset(tessera.arange(50))

    def epoch(loader):
        return [int(v) for (b,) in loader for v in b.tolist()]
    seen = epoch(DataLoader(ds, batch_size=7, shuffle=True))
    assert sorted(seen) == list(range(50)) and seen != list(range(50))
    a = epoch(DataLoader(ds, batch_size=7, shuffle=True,
                         generator=tessera.Generator().manual_seed(42)))
    b = epoch(DataLoader(ds, batch_size=7, shuffle=True,
                         generator=tessera.Generator().manual_seed(42)))
    c = epoch(DataLoader(ds, batch_size=7, shuffle=True,
                         generator=tessera.Generator().manual_seed(43)))
    assert a == b and a != c
    g = tessera.Generator().manual_seed(7)
    loader = DataLoader(ds, batch_size=7, shuffle=True, generator=g)
    e1, e2 = epoch(loader), epoch(loader)
    assert e1 != e2  # each epoch draws a new order from the same generator
    g.manual_seed(7)
    assert epoch(loader) == e1
    tessera.manual_seed(0)
    d1 = epoch(DataLoader(ds, batch_size=7, shuffle=True))
    tessera.manual_seed(0)
    assert epoch(DataLoader(ds, batch_size=7, shuffle=True)) == d1


def test_dataloader_iterable_dataset_matches_torch():
    for kwargs in ({"batch_size": 3}, {"batch_size": 3, "drop_last": True},
                   {"batch_size": None}):
        ours = [plain(b) for b in DataLoader(Stream(8), **kwargs)]
        ref_ds = type("S", (tud.IterableDataset,), {"__iter__": lambda s: iter(range(8))})()
        ref = [plain(b) for b in tud.DataLoader(ref_ds, **kwargs)]
        assert ours == ref
    assert len(DataLoader(Stream(8), batch_size=3)) == 3
    assert len(DataLoader(Stream(8), batch_size=3, drop_last=True)) == 2


@pytest.mark.parametrize("kwargs", [
    {"shuffle": True, "sampler": [0, 1]},
    {"batch_sampler": [[0]], "batch_size": 2},
    {"batch_sampler": [[0]], "shuffle": True},
    {"batch_sampler": [[0]], "drop_last": True},
    {"batch_size": None, "drop_last": True},
    {"num_workers": -1},
    {"timeout": -1},
    {"prefetch_factor": 2},
    {"persistent_workers": True},
    {"multiprocessing_context": "spawn"},
    {"num_workers": 1, "multiprocessing_context": "no-such-method"},
    {"batch_size": 0},
])
def test_dataloader_argument_errors_match_torch(kwargs):
    with pytest.raises(Exception) as ref:
        tud.DataLoader(NumpyDataset(4), **kwargs)
    with pytest.raises(ref.type):
        DataLoader(NumpyDataset(4), **kwargs)


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"sampler": [0]},
                                    {"batch_sampler": [[0]]}])
def test_dataloader_iterable_argument_errors(kwargs):
    ref_ds = type("S", (tud.IterableDataset,), {"__iter__": lambda s: iter(range(3))})()
    with pytest.raises(ValueError):
        tud.DataLoader(ref_ds, **kwargs)
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(Stream(3), **kwargs)


def test_dataloader_attributes_frozen_and_exports():
    loader = DataLoader(NumpyDataset(4), batch_size=2)
    for attr in ("batch_size", "sampler", "dataset", "drop_last"):
        with pytest.raises(ValueError, match="should not be set"):
            setattr(loader, attr, None)
    loader.num_workers = 0  # not frozen in PyTorch either
    assert isinstance(loader.sampler, SequentialSampler)
    assert isinstance(DataLoader(NumpyDataset(4), shuffle=True).sampler, RandomSampler)
    for name in tud.__all__:
        if name in ("DistributedSampler", "DFIterDataPipe", "DataChunk", "IterDataPipe",
                    "MapDataPipe", "functional_datapipe", "guaranteed_datapipes_determinism",
                    "non_deterministic", "runtime_validation", "runtime_validation_disabled",
                    "argument_validation", "get_worker_info", "_DatasetKind"):
            continue
        assert hasattr(data, name), name
    assert data.get_worker_info() is None


def test_dataloader_speed_on_tensor_dataset():
    # the demo's case: a whole epoch of MNIST-sized batches must be cheap per batch
    ds = TensorDataset(tessera.zeros(6400, 1, 28, 28), tessera.zeros(6400, dtype=tessera.int64))
    import time
    start = time.perf_counter()
    n = sum(1 for _ in DataLoader(ds, batch_size=64, shuffle=True))
    per_batch = (time.perf_counter() - start) / n
    assert n == 100 and per_batch < 0.01, per_batch


def test_len_of_sampler_based_loader():
    assert len(DataLoader(NumpyDataset(10), batch_size=4)) == math.ceil(10 / 4)
    assert len(DataLoader(NumpyDataset(10), batch_size=4, drop_last=True)) == 2
    assert len(DataLoader(NumpyDataset(10), batch_size=None)) == 10
