"""tessera.multiprocessing: tensors shared between processes through shared memory, as
PyTorch's torch.multiprocessing shares them (the oracle for the API and the messages is
torch 2.13; the values are checked against the arithmetic the processes did)."""
from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import pytest
import torch

import tessera
import tessera.multiprocessing as mp
from tests.compat import _mp_workers as W

METHODS = ["fork", "spawn"]


def test_namespace_matches_torch():
    missing = [n for n in torch.multiprocessing.__all__ if not hasattr(mp, n)]
    assert not missing
    assert mp.get_sharing_strategy() == torch.multiprocessing.get_sharing_strategy()
    assert mp.get_all_sharing_strategies() == torch.multiprocessing.get_all_sharing_strategies()
    with pytest.raises(AssertionError):
        mp.set_sharing_strategy("nope")


def test_share_memory_in_place():
    x = tessera.arange(6.).view(2, 3)
    ref = torch.arange(6.).view(2, 3)
    assert x.is_shared() == ref.is_shared() is False
    assert x.share_memory_() is x and ref.share_memory_() is ref
    assert x.is_shared() and ref.is_shared()
    assert x.tolist() == ref.tolist()
    view = x[1]
    view.add_(1)  # a view made after the move writes the shared storage
    assert x.tolist() == [[0, 1, 2], [4, 5, 6]]


@pytest.mark.parametrize("method", METHODS)
def test_process_args_share_storage(method):
    ctx = mp.get_context(method)
    t = tessera.zeros(4).share_memory_()
    procs = [ctx.Process(target=W.add_to, args=(t, v)) for v in (1.0, 2.0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert t.tolist() == [3.0] * 4


@pytest.mark.parametrize("method", METHODS)
def test_queue_moves_tensor_to_shared_memory(method):
    ctx = mp.get_context(method)
    t = tessera.zeros(3)  # not shared yet: sending it moves it, as in PyTorch
    q = ctx.Queue()
    procs = [ctx.Process(target=W.add_from_queue, args=(q, v)) for v in (1.0, 5.0)]
    for p in procs:
        p.start()
    q.put(t)
    q.put(t)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert t.is_shared()
    assert t.tolist() == [6.0] * 3


@pytest.mark.parametrize("method", METHODS)
def test_module_share_memory(method):
    ctx = mp.get_context(method)
    model = tessera.nn.Linear(3, 2).share_memory()
    assert all(p.is_shared() for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    procs = [ctx.Process(target=W.add_to_params, args=(model, v)) for v in (0.5, 0.25)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    for b, p in zip(before, model.parameters()):
        assert tessera.allclose(p, b + 0.75)
        assert isinstance(p, tessera.nn.Parameter)


def test_spawn_runs_every_rank():
    t = tessera.zeros(3).share_memory_()
    mp.spawn(W.spawn_add, args=(t,), nprocs=3)
    assert t.tolist() == [1.0, 2.0, 3.0]


def test_spawn_reports_child_exception():
    with pytest.raises(mp.ProcessRaisedException, match="boom in 0"):
        mp.spawn(W.raise_in_child, nprocs=1)


def test_non_leaf_requiring_grad_is_refused():
    """PyTorch's message, for a tensor that would lose its autograd history on the way."""
    msgs = []
    for lib in (torch, tessera):
        x = lib.ones(2, requires_grad=True) * 2
        with pytest.raises(RuntimeError) as e:
            ForkingPickler.dumps(x)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("method", METHODS)
def test_hogwild_updates_the_parent_model(method):
    """PyTorch's examples/mnist_hogwild: processes train one shared model with SGD."""
    tessera.manual_seed(0)
    model = tessera.nn.Linear(4, 1)
    model.share_memory()
    x = tessera.randn(64, 4)
    y = x.sum(1, keepdim=True)
    loss0 = tessera.nn.functional.mse_loss(model(x), y).item()
    before = model.weight.detach().clone()
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=W.hogwild_train, args=(i, model, 20)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert not tessera.equal(model.weight, before)
    assert tessera.nn.functional.mse_loss(model(x), y).item() < loss0
