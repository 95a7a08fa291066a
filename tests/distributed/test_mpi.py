"""Real multi-process runs: ``mpiexec -n 2`` in a subprocess, compared with one process."""
import time

from tests.distributed._mpi import outputs, run_mpi


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
    assert proc.returncode != 0
    assert "CommTimeout" in proc.stderr and "TESSERA_COMM_TIMEOUT" in proc.stderr
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
    assert proc.returncode != 0 and "rank 1 found bad data" in proc.stderr
    assert time.monotonic() - t0 < 40
