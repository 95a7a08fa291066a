"""Real multi-process runs: ``mpiexec -n 2`` in a subprocess, compared with one process."""
import time

from tests.distributed._mpi import rank_lines, run_mpi


def test_mpi_collectives_match_the_fake_world(tmp_path):
    proc = run_mpi(tmp_path, """
        import numpy as np
        from tessera.distributed import comm as C
        from tests.distributed.test_comm import _collectives
        c = C.current()
        assert c.name == "mpi", c.name
        out = _collectives()
        print("OUT", c.rank, repr({k: (v.tolist() if hasattr(v, "tolist") else
                                       [a.tolist() for a in v] if isinstance(v, list) and
                                       hasattr(v[0], "tolist") else v)
                                   for k, v in out.items()}))
    """)
    from tessera.distributed.comm.fake import FakeWorld
    from tests.distributed.test_comm import _collectives

    def norm(v):
        if hasattr(v, "tolist"):
            return v.tolist()
        if isinstance(v, list) and hasattr(v[0], "tolist"):
            return [a.tolist() for a in v]
        return v
    fake = FakeWorld(2).run(_collectives)
    got = rank_lines(proc.stdout, "OUT")
    for r in range(2):
        assert got[r] == repr({k: norm(v) for k, v in fake[r].items()})


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
