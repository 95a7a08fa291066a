"""The gradients of a global module's broadcast parameters summed by one all-reduce of a
flat buffer (parallel/grad_buckets.py): the same parameters as one process over several
steps, on simulated ranks and under MPI (shared-memory buffer), also when a backward leaves
a parameter out, when gradients accumulate over two backwards, and for ZeRO."""
import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.distributed._module import GRAD_HOOK
from tessera.distributed.placement import placement
from tessera.parallel.grad_buckets import BucketHooks
from tests.distributed._helpers import B, P, S, run
from tests.distributed._mpi import outputs, run_mpi

rng = np.random.default_rng(0)
X = rng.standard_normal((10, 6))
Y = rng.integers(0, 3, (10,))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x, skip_b: bool = False):
        h = self.a(x).relu()
        if not skip_b:
            h = self.b(h).relu()
        return self.head(h)


def train(glob: bool, optim: str = "sgd", steps: int = 4, skip: tuple = (),
          accumulate: int = 1, dtype=tessera.float64):
    """Losses and parameters after ``steps`` steps; ``skip``: steps whose forward leaves
    ``b`` out; ``accumulate``: backwards (on the same batch) per step."""
    tessera.manual_seed(0)
    model = _Net().to(dtype)
    x, y = tessera.tensor(X).to(dtype), tessera.tensor(Y)
    if glob:
        p = placement("cpu", list(range(tessera.distributed.get_world_size())))
        model.to_global(p, B)
        x, y = x.to_global(p, B).to_global(sbp=S(0)), y.to_global(p, B).to_global(sbp=S(0))
    opt = tessera.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optim == "sgd" \
        else tessera.optim.AdamW(model.parameters(), lr=0.05)
    losses, info = [], []
    for k in range(steps):
        opt.zero_grad()
        for _ in range(accumulate):
            loss = nn.functional.cross_entropy(model(x, skip_b=k in skip), y)
            loss.backward()
        if glob:
            w = model.a.weight.grad
            info.append((w.sbp, w._data.local.flags.c_contiguous,
                         _bucketed(model.a.weight)))
        opt.step()
        losses.append(loss.item())
    return losses, [q.detach().numpy().copy() for q in model.parameters()], info


def _bucketed(p) -> bool:
    """``p.grad``'s tile is its segment of the bucket's buffer."""
    hooks = p.__dict__.get(GRAD_HOOK)
    if not isinstance(hooks, BucketHooks) or hooks.bucket.buffer is None:
        return False
    return np.shares_memory(p.grad._data.local, hooks.bucket.buffer)


def _check(results, want, rtol=1e-10, partial=()):
    """The bucketed steps of rank 0; ``partial``: steps whose gradients stay partial."""
    want_losses, want_params, _ = want
    for losses, params, info in results:
        np.testing.assert_allclose(losses, want_losses, rtol=rtol)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=rtol * 10, atol=rtol / 100)
        for k, (sbp, c_order, _) in enumerate(info):  # row-major, like the weight
            assert sbp == ((P,) if k in partial else (B,)) and c_order, (k, sbp)
    return [i[2] for i in results[0][2]]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_bucketed_gradients_match_one_process(n, optim):
    bucketed = _check(run(n, train, True, optim), train(False, optim))
    # the first backward boxes each gradient and sets the bucket up; the others use it
    assert bucketed == [False, True, True, True]


def test_a_backward_without_some_parameter_leaves_the_others_correct():
    """Step 1 leaves ``b`` out: no all-reduce of the bucket then (the others' gradients stay
    partial, boxed where the optimizer reads them), and it serves again afterwards (where
    ``b``'s new accumulators run first)."""
    bucketed = _check(run(2, train, True, "sgd", 5, (1,)), train(False, "sgd", 5, (1,)),
                      partial=(1,))
    assert bucketed == [False, True, True, True, True]


def test_gradients_accumulated_over_two_backwards():
    _check(run(2, train, True, "sgd", 3, (), 2), train(False, "sgd", 3, (), 2))


def test_zero_takes_its_parameters_out_of_the_bucket():
    from tests.distributed.test_zero import check, train as zero_train
    check(run(2, zero_train, 2), 2)


SCRIPT = """
    import numpy as np
    import tessera
    from tests.distributed._mpi import emit
    from tests.distributed.test_grad_bucket import train
    emit(train(True, "adamw", 4, dtype=tessera.float32))
"""


def test_bucketed_gradients_under_mpi_match_one_process(tmp_path):
    run_mpi(tmp_path, SCRIPT, n=2)
    results = outputs(tmp_path, 2)
    want = train(False, "adamw", 4, dtype=tessera.float32)
    assert _check(results, want, rtol=1e-5) == [False, True, True, True]
