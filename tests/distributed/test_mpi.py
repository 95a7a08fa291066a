"""Real multi-process runs: ``mpiexec -n 2`` in a subprocess, compared with one process."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.distributed._mpi import ROOT, outputs, run_mpi


def test_mpi_collectives_match_the_fake_world(tmp_path):
    run_mpi(tmp_path, """
        from tessera.distributed import comm as C
        from tests.distributed._mpi import emit
        from tests.distributed.test_comm import _collectives
        assert C.current().name == "mpi", C.current().name
        emit(_collectives())
    """)
    from tessera.distributed.comm.fake import FakeWorld
    from tests.distributed.test_comm import _collectives

    def norm(v):
        if hasattr(v, "tolist"):
            return v.tolist()
        if isinstance(v, list) and v and hasattr(v[0], "tolist"):
            return [a.tolist() for a in v]
        return v
    fake = FakeWorld(2).run(_collectives)
    for got, want in zip(outputs(tmp_path), fake):
        assert {k: norm(v) for k, v in got.items()} == {k: norm(v) for k, v in want.items()}


def test_mpi_dead_peer_times_out(tmp_path):
    t0 = time.monotonic()
    proc = run_mpi(tmp_path, """
        import time
        from tessera.distributed import comm as C
        c = C.current()
        if c.rank == 1:
            time.sleep(60)   # never reaches the barrier
        c.barrier()
    """, env={"TESSERA_COMM_TIMEOUT": "2"}, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "CommTimeout" in proc.stderr and "TESSERA_COMM_TIMEOUT" in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 40


def test_mpi_rank_that_raises_aborts_the_job(tmp_path):
    t0 = time.monotonic()
    proc = run_mpi(tmp_path, """
        from tessera.distributed import comm as C
        c = C.current()
        if c.rank == 1:
            raise ValueError("rank 1 found bad data")
        c.barrier()
        c.barrier()
    """, check=False)
    assert proc.returncode != 0 and "rank 1 found bad data" in proc.stderr, \
        proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 40


GLOBAL_TRAINING = """
    import numpy as np
    import tessera
    import tessera.distributed as dist
    from tests.distributed._mpi import emit

    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((7, 5)), rng.standard_normal((7, 2))
    W1, W2 = rng.standard_normal((5, 8)) * 0.3, rng.standard_normal((8, 2)) * 0.3

    def train(glob):
        p = tessera.placement("cpu", list(range(dist.get_world_size())))
        def g(a, sbp):
            t = tessera.tensor(a)
            return t.to_global(p, tessera.sbp.broadcast).to_global(sbp=sbp) if glob else t
        S0, B = tessera.sbp.split(0), tessera.sbp.broadcast
        x, y = g(X, S0), g(Y, S0)                          # data parallel: batch split
        w1, w2 = g(W1, B).requires_grad_(), g(W2, tessera.sbp.split(1)).requires_grad_()
        losses = []
        for _ in range(3):
            loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
            loss.backward()
            with tessera.no_grad():
                for w in (w1, w2):
                    w -= 0.1 * w.grad
                    w.grad = None
            losses.append(loss.item())
        return losses, w1.detach().numpy(), w2.detach().numpy(), w2.sbp if glob else None

    x = tessera.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    emit({"rank": dist.get_rank(), "size": dist.get_world_size(), "init": dist.is_initialized(),
          "sum": x.tolist(), "global": train(True), "local": train(False)})
"""


def test_launcher_runs_global_training_like_one_process(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(GLOBAL_TRAINING))
    env = dict(os.environ, PYTHONPATH=ROOT, TESSERA_TEST_OUT=str(tmp_path),
               TESSERA_COMM_TIMEOUT="60")
    proc = subprocess.run([sys.executable, "-m", "tessera.distributed.launch",
                           "--nproc-per-node", "2", "--threads-per-proc", "1", str(script)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for r, out in enumerate(outputs(tmp_path)):
        assert (out["rank"], out["size"], out["init"]) == (r, 2, True)
        assert out["sum"] == [3.0] * 3
        (gl, g1, g2, sbp), (ll, l1, l2, _) = out["global"], out["local"]
        np.testing.assert_allclose(gl, ll, rtol=1e-12)
        np.testing.assert_allclose(g1, l1, rtol=1e-12)
        np.testing.assert_allclose(g2, l2, rtol=1e-12)
        assert sbp[0].short() == "S(1)"


def test_mpi_ddp_matches_single_process(tmp_path):
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_ddp import _ddp_body
        emit(_ddp_body(bucket_cap_mb=1e-4))
    """)
    from tests.distributed.test_ddp import _single_strided
    want_losses, want_params = _single_strided()
    for losses, params, nbuckets in outputs(tmp_path):
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        for p, q in zip(params, want_params):
            np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
        assert nbuckets == 4


def test_mpi_ddp_gradient_layouts(tmp_path):
    """Transposed gradients reduced in memory order (in place, MPI_IN_PLACE), and ranks
    whose gradients come in different layouts, equal the average of the local gradients."""
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_ddp import _layouts_body
        emit([_layouts_body(False), _layouts_body(True)])
    """)
    from tests.distributed.test_ddp import check_layouts
    outs = outputs(tmp_path)
    check_layouts([o[0] for o in outs], False)
    check_layouts([o[1] for o in outs], True)


def test_mpi_tensor_parallel_transformer_and_data_parallel_cnn(tmp_path):
    """10 tensor-parallel steps of the Transformer layer, and the CNN (synchronised batch
    norm, dropout, cross-entropy mean) data-parallel, each equal to one process."""
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_nn_global import _train_cnn
        from tests.distributed.test_tensor_parallel import tensor_parallel_transformer
        emit((tensor_parallel_transformer(), _train_cnn(True)))
    """)
    from tests.distributed.test_nn_global import _train_cnn
    from tests.distributed.test_tensor_parallel import check_transformer
    outs = outputs(tmp_path)
    check_transformer([o[0] for o in outs])
    want_losses, want_state = _train_cnn(False)
    for _, (losses, state) in outs:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
        for k, v in want_state.items():
            np.testing.assert_allclose(state[k], v, rtol=1e-9, atol=1e-12, err_msg=k)


def test_mpi_four_ranks_oversubscribed(tmp_path):
    """-n 4, oversubscribed on hosts with fewer cores: ZeRO stage 2, the tensor-parallel
    Transformer (one head per rank) and the data-parallel CNN (uneven batch 2/2/1/1) equal
    one process."""
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_nn_global import _train_cnn
        from tests.distributed.test_tensor_parallel import tensor_parallel_transformer
        from tests.distributed.test_zero import train
        emit((train(2), tensor_parallel_transformer(), _train_cnn(True)))
    """, n=4, timeout=180)
    from tests.distributed.test_nn_global import _train_cnn
    from tests.distributed.test_tensor_parallel import check_transformer
    from tests.distributed.test_zero import check
    outs = outputs(tmp_path, 4)
    check([o[0] for o in outs], 4)
    check_transformer([o[1] for o in outs])
    want_losses, want_state = _train_cnn(False)
    for _, _, (losses, state) in outs:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
        for k, v in want_state.items():
            np.testing.assert_allclose(state[k], v, rtol=1e-9, atol=1e-12, err_msg=k)


def test_mpi_four_ranks_one_raises(tmp_path):
    t0 = time.monotonic()
    proc = run_mpi(tmp_path, """
        from tessera.distributed import comm as C
        c = C.current()
        if c.rank == 2:
            raise ValueError("rank 2 of 4 found bad data")
        c.barrier()
    """, n=4, check=False)
    assert proc.returncode != 0 and "rank 2 of 4 found bad data" in proc.stderr, \
        proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 60


def test_mpi_2x2_mesh(tmp_path):
    """A 2x2 mesh (placement ranks [[0, 1], [2, 3]]) under real MPI: matmul and linear
    with 2-D SBPs (whole inputs and 16 sampled combinations of SBP pairs, forward and input
    gradients), and the MLP data-parallel on mesh axis 0 and Megatron tensor-parallel on
    axis 1, trained eagerly and in nn.Graph (and with dropout in nn.Graph), each equal to
    one process."""
    run_mpi(tmp_path, """
        from tests.distributed._mpi import emit
        from tests.distributed.test_ops_sbp_2d import _train_2d, _train_dropout_2d, mesh_case
        emit((mesh_case("matmul"), mesh_case("linear"), _train_2d("eager"),
              _train_2d("graph"), _train_dropout_2d("graph")))
    """, n=4, timeout=120)
    from tests.distributed.test_ops_sbp_2d import B, S, _train_2d, _train_dropout_2d
    outs = [o[:4] for o in outputs(tmp_path, 4)]
    # dropout over the whole 2x2 placement (the seed broadcast from rank 0, whose
    # generator alone is seeded as one process's) in a data x tensor parallel graph
    want_drop, want_drop_w, _ = _train_dropout_2d("local")
    for o in outputs(tmp_path, 4):
        losses, w, local = o[4]
        np.testing.assert_allclose(losses, want_drop, rtol=1e-10)
        np.testing.assert_allclose(w, want_drop_w, rtol=1e-10, atol=1e-12)
    for k in (0, 1):  # every rank chose the same signatures, from 17 input layouts
        assert len(outs[0][k]) == 17 and all(o[k] == outs[0][k] for o in outs)
    assert {len(label) for label, _ in outs[0][0]} == {2}
    want_losses, want_w, _ = _train_2d("local")
    for _, _, *trained in outs:
        for losses, w, sbps in trained:
            np.testing.assert_allclose(losses, want_losses, rtol=1e-10)
            np.testing.assert_allclose(w, want_w, rtol=1e-10, atol=1e-12)
            assert sbps == (B, S(0))


def test_mpi_wait_yields_the_core_at_each_poll(monkeypatch):
    # a rank polling a collective its peer has not joined yet gives the core away at each
    # poll (with more runnable processes than cores the peer may be queued behind it)
    pytest.importorskip("mpi4py")
    from tessera.distributed.comm import mpi as M

    class Request:
        polls = 0

        def Test(self):
            Request.polls += 1
            return Request.polls > 5

    yields = []
    monkeypatch.setattr(M.os, "sched_yield", lambda: yields.append(1))
    comm = M.MPICommunicator.__new__(M.MPICommunicator)
    comm._peer_left = lambda *a: False
    comm._wait(Request(), "a test's collective")
    # every poll that found it not done but the first (made before the waiting starts)
    assert Request.polls == 6 and len(yields) == 4
