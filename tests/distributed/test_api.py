"""The process API (PyTorch's torch.distributed names) on local tensors, and the launcher's
command line."""
import os
import sys

import numpy as np
import pytest

import tessera
import tessera.distributed as dist
from tessera.distributed import launch
from tests.distributed._helpers import run


def _api():
    r, n = dist.get_rank(), dist.get_world_size()
    out = {"init": dist.is_initialized(), "local_rank": dist.get_local_rank()}
    x = tessera.tensor([1.0, 2.0]) * (r + 1)
    dist.all_reduce(x)
    out["sum"] = x.tolist()
    y = tessera.tensor([float(r)])
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    out["max"] = y.tolist()
    w = tessera.tensor([2.0 * r])
    dist.all_reduce(w, async_op=True).wait()
    out["async"] = w.tolist()
    parts = [tessera.zeros(2) for _ in range(n)]
    dist.all_gather(parts, tessera.full((2,), float(r)))
    out["gather"] = [p.tolist() for p in parts]
    b = tessera.tensor([r, r])
    dist.broadcast(b, src=n - 1)
    out["bcast"] = b.tolist()
    o = tessera.zeros(1)
    dist.reduce_scatter(o, [tessera.tensor([10.0 * k + r]) for k in range(n)])
    out["rs"] = o.tolist()
    cat = tessera.zeros(n, 2)
    dist.all_gather_into_tensor(cat, tessera.full((1, 2), float(r)))
    out["cat"] = cat.tolist()
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    out["objs"] = objs
    lst = [r, "x"]
    dist.broadcast_object_list(lst, src=0)
    out["blist"] = lst
    if n > 1:
        if r == 0:
            dist.send(tessera.arange(3.0), dst=1)
        elif r == 1:
            t = tessera.zeros(3)
            dist.recv(t, src=0)
            out["recv"] = t.tolist()
        g = dist.new_group([0, 1])
        if r in (0, 1):
            z = tessera.ones(1)
            dist.all_reduce(z, group=g)
            out["group"] = (z.tolist(), dist.get_rank(g), dist.get_world_size(g))
    dist.barrier()
    return out


def test_process_api_on_two_fake_ranks():
    res = run(2, _api)
    for r, out in enumerate(res):
        assert out["init"] and out["local_rank"] == r
        assert out["sum"] == [3.0, 6.0] and out["max"] == [1.0] and out["async"] == [2.0]
        assert out["gather"] == [[0.0, 0.0], [1.0, 1.0]] and out["bcast"] == [1, 1]
        assert out["rs"] == [10.0 * r + 0 + 10.0 * r + 1]
        assert out["cat"] == [[0.0, 0.0], [1.0, 1.0]]
        assert out["objs"] == [{"rank": 0}, {"rank": 1}] and out["blist"] == [0, "x"]
        assert out["group"] == ([2.0], r, 2)
    assert res[1]["recv"] == [0.0, 1.0, 2.0]


def test_process_api_in_one_process():
    out = _api()
    assert not out["init"] and out["sum"] == [1.0, 2.0] and out["objs"] == [{"rank": 0}]
    assert dist.get_rank() == 0 and dist.get_world_size() == 1 and dist.get_backend() == "self"


def test_api_rejects_global_tensors():
    x = tessera.ones(2).to_global(tessera.placement("cpu", [0]), tessera.sbp.broadcast)
    with pytest.raises(TypeError, match="all_reduce: takes local tensors"):
        dist.all_reduce(x)
    with pytest.raises(ValueError, match="unknown reduce op"):
        dist.all_reduce(tessera.ones(2), op="median")


def test_launcher_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd, env = launch.build_command(["--nproc-per-node", "2", "--mpiexec", "/x/mpiexec",
                                     "train.py", "--lr", "0.1"])
    # each rank under the launcher's supervisor (names a rank that a signal kills)
    assert cmd == ["/x/mpiexec", "-n", "2", sys.executable, "-I", os.path.abspath(launch.__file__),
                   "--supervise-rank", sys.executable, "-m", "mpi4py", "train.py", "--lr", "0.1"]
    assert env["TESSERA_LAUNCHED"] == "1" and int(env["OMP_NUM_THREADS"]) >= 1
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    cmd, _ = launch.build_command(["--nnodes", "2", "--nproc-per-node", "4", "--hostfile",
                                   str(hosts), "--mpiexec", "/x/mpiexec", "-m", "pkg.train"])
    assert cmd[:7] == ["/x/mpiexec", "-n", "8", "-f", str(hosts), "-ppn", "4"]
    assert cmd[-3:] == ["mpi4py", "-m", "pkg.train"]
    cmd, env = launch.build_command(["--threads-per-proc", "3", "s.py"])
    assert env["OMP_NUM_THREADS"] == "3" and cmd[1:3] == ["-n", "1"]


def test_global_tensor_numpy_matches_single_process_in_one_process():
    a = np.arange(6.0).reshape(2, 3)
    x = tessera.tensor(a).to_global(tessera.placement.all("cpu"), tessera.sbp.split(0))
    assert (x @ x.T).numpy().tolist() == (a @ a.T).tolist()
