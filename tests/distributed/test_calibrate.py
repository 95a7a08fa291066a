"""The machine profile (``tessera.distributed.calibrate``): measured, saved atomically as
JSON, reused, and a default when none was measured."""
import json
import os
import subprocess
import sys

import pytest

from tessera.distributed import calibrate as K
from tests.distributed._mpi import ROOT, run_mpi


def test_measure_on_the_simulated_world():
    p = K.measure(world=3, quick=True)
    assert sorted(p.comm) == sorted(K.COLLECTIVES)
    for kind in K.COLLECTIVES:
        assert sorted(p.comm[kind]) == [2, 3]
        for alpha, beta in p.comm[kind].values():
            assert alpha >= 0 and beta > 0
    assert all(v > 0 for v in p.gemm.values()) and p.bandwidth > 0
    # the memory rate by the bytes an op moves, from copies of growing arrays
    moved = [b for b, _ in p.bandwidth_curve]
    assert moved == sorted(moved) and all(r > 0 for _, r in p.bandwidth_curve)
    assert p.bandwidth == p.bandwidth_curve[-1][1]
    # the GEMM's rate by the product's FLOPs (the classes are points of it), and the fused
    # optimizer update's by the bytes it moves
    flops = [f for f, _ in p.gemm_curve]
    assert flops == sorted(flops) and len(flops) >= 3 and all(r > 0 for _, r in p.gemm_curve)
    assert p.gemm["small"] == p.gemm_curve[0][1]
    # by a product's smallest dimension (quick: all but the widest)
    assert [d for d, _ in p.thin_curve] == list(K._THIN_DIMS[:-1])
    assert all(r > 0 for _, r in p.thin_curve)
    moved = [b for b, _ in p.update_curve]
    assert moved == sorted(moved) and moved[0] == K._ADAM_WORDS * 4 * K._UPDATE_SIZES[0]
    assert p.update_seconds(moved[-1]) == pytest.approx(moved[-1] / p.update_curve[-1][1])
    # the boxing steps on the whole world, and the skew a collective waits out
    assert sorted(p.boxing) == sorted(K.TRANSITIONS)
    assert all(sorted(t) == [3] and t[3][1] > 0 for t in p.boxing.values())
    assert sorted(p.sync) == [3] and p.sync[3] >= 0
    # and a large collective's, by the same gaps
    assert [g for g, _ in p.sync_large[3]] == [g for g, _ in p.sync_curve[3]]
    assert all(s >= 0 for _, s in p.sync_large[3])
    assert p.boxing_seconds("S", "B", 3, 1 << 20) > p.boxing_seconds("S", "B", 3, 1 << 10)
    assert p.boxing_seconds("S", "B", 1, 1 << 20) == 0.0
    # a collective costs more with more bytes, nothing on one rank
    assert p.comm_seconds("all_reduce", 2, 1 << 20) > p.comm_seconds("all_reduce", 2, 1 << 10)
    assert p.comm_seconds("all_gather", 1, 1 << 20) == 0.0


def test_step_cost_is_the_slope_less_the_fits_price(monkeypatch):
    # the per-collective cost of a step is the slope of the steps' time over their
    # collectives less the price the profile's fit gives that all-reduce (what the model
    # adds beside it), not less a back-to-back all-reduce timed beside the steps: on a
    # loaded host that time is mostly waits for the other rank and can exceed the slope
    timed = []

    def rounds(fns, repeat, sync=None, agree=None, seconds=0.0):
        timed.append(len(fns))
        # steps of 0, 4 and 16 collectives at 10 ms each; anything else (a bare
        # collective) 15 ms
        steps = [0.06 + 0.01 * k for k in K._STEP_COLLECTIVES]
        return steps[:len(fns)] + [0.015] * (len(fns) - len(steps))
    monkeypatch.setattr(K, "_interleaved", rounds)
    # (the communicator is only called by the timed functions, which are not run here)
    got = K._collective_rank(None, 2, True, lambda k: k, own=0.002)
    assert timed == [len(K._STEP_COLLECTIVES)]
    assert got == pytest.approx(0.008)


def test_save_is_atomic_and_load_reuses_it(tmp_path, monkeypatch):
    p = K.Profile(gemm={"small": 1e9, "medium": 2e9, "large": 3e9}, bandwidth=4e9,
                  comm={"all_reduce": {2: (1e-5, 1e9), 4: (3e-5, 8e8)}}, source="test",
                  boxing={"P->B": {2: (2e-5, 1e9)}}, sync={2: 1e-3},
                  sync_large={2: [(1e-3, 1e-3), (4e-3, 3e-3)]}, collective={2: 5e-4})
    path = str(tmp_path / "sub" / "profile.json")
    assert K.save(p, path) == path
    assert os.listdir(tmp_path / "sub") == ["profile.json"]  # no temporary file left
    assert json.load(open(path))["bandwidth"] == 4e9
    q = K.load(path)
    assert q == p and K.load(path) is q  # read once, then reused
    monkeypatch.setenv("TESSERA_PROFILE", path)
    assert K.profile_path() == path and K.load() == p
    # counts of ranks not measured: the nearest measured count's beta, alpha per ring step
    assert K.load().alpha_beta("all_reduce", 8) == pytest.approx((3e-5 * 7 / 3, 8e8))
    assert K.load().alpha_beta("all_gather", 4) == (K.DEFAULT.default_alpha * 3,
                                                    K.DEFAULT.default_beta)
    # measured boxing steps and sync: the nearest measured count; none measured: None, 0
    assert K.load().boxing_seconds("P", "B", 4, 1e9) == pytest.approx(2e-5 + 1)
    assert K.load().boxing_seconds("S", "B", 2, 1e9) is None
    assert K.load().sync_seconds(8) == 1e-3 and K.DEFAULT.sync_seconds(2) == 0.0
    # a large collective's on its own curve (its second point without a gap)
    assert K.load().sync_seconds(2, 4e-3, nbytes=1 << 20) == 3e-3
    assert K.load().sync_seconds(2, nbytes=1 << 20) == 3e-3
    assert K.load().sync_seconds(2, 4e-3, nbytes=1 << 10) == 1e-3
    # the per-collective cost of a step: the nearest measured count, the least sync charged
    assert K.load().collective_seconds(4) == 5e-4 and K.DEFAULT.collective_seconds(2) == 0.0
    assert K.Profile(sync={2: 1e-4}, collective={2: 5e-4}).sync_seconds(2, 1.0) == 5e-4
    # a profile saved before the per-collective cost was measured loads without one
    old = {k: v for k, v in p.to_json().items() if k != "collective"}
    assert K.Profile.from_json(old).collective == {}


def test_curves_price_between_and_beyond_their_points():
    p = K.Profile(gemm={"small": 1e9, "medium": 1e9, "large": 1e9},
                  gemm_curve=[(1e6, 1e10), (1e8, 1e11)],
                  bandwidth_curve=[(1e6, 4e10), (1e8, 1e10)], update_curve=[(1e6, 8e10)])
    # log-log between the points, the end's rate beyond them; the classes unused
    assert p.gemm_seconds(1e7) == pytest.approx(1e7 / (1e10 * 10 ** 0.5))
    assert p.gemm_seconds(1e9) == pytest.approx(1e9 / 1e11)
    assert p.gemm_seconds(1e5) == pytest.approx(1e5 / 1e10)
    # a batch of products at one product's rate
    assert p.gemm_seconds(1e8, products=100) == pytest.approx(1e8 / 1e10)
    assert p.update_seconds(1e7) == pytest.approx(1e7 / 8e10)
    # no update measured: the copies' rate; nothing measured: the classes and bandwidth
    assert K.Profile(bandwidth_curve=[(1e6, 4e10)]).update_seconds(1e6) == pytest.approx(2.5e-5)
    assert K.Profile(gemm={"small": 1e9, "medium": 2e9, "large": 4e9}).gemm_seconds(1e7) == \
        pytest.approx(5e-3)
    # the curves survive the JSON round trip; a profile saved without them loads without
    q = K.Profile.from_json(json.loads(json.dumps(p.to_json())))
    assert q == p
    old = {k: v for k, v in p.to_json().items()
           if k not in ("gemm_curve", "thin_curve", "update_curve")}
    assert K.Profile.from_json(old).gemm_curve == [] and \
        K.Profile.from_json(old).gemm_seconds(1e7) == pytest.approx(1e-2)


def test_default_profile_when_none_was_measured(tmp_path):
    assert K.load(str(tmp_path / "missing.json")) is K.DEFAULT
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert K.load(str(bad)) is K.DEFAULT


def test_command_line(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "tessera.distributed.calibrate", "--quick",
                           "--world", "2", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "all_reduce" in proc.stdout and out.exists()
    assert 2 in K.load(str(out)).comm["all_reduce"]


def test_command_line_under_mpiexec(tmp_path):
    out = tmp_path / "mpi.json"
    run_mpi(tmp_path, f"""
        from tessera.distributed.calibrate import main
        main(["--quick", "--out", {str(out)!r}])
    """, n=2, timeout=120)
    p = K.load(str(out))
    assert "MPI" in p.source and sorted(p.comm["all_to_all"]) == [2]
    # the per-collective cost of a step, measured on the launched ranks
    assert sorted(p.collective) == [2] and p.collective[2] >= 0


def test_a_thin_product_runs_at_its_smallest_dimensions_rate():
    p = K.Profile(gemm_curve=[(1e6, 1e10), (1e9, 8e10)], thin_curve=[(8, 1e10), (64, 4e10)])
    f = 2 * 32 * 1024 * 1024
    square = p.gemm_seconds(f)
    # below the curve's rate of its FLOPs: the thin curve's, log-log between its points
    assert p.gemm_seconds(f, dim=32) == pytest.approx(f / (1e10 * 4 ** (2 / 3)))
    assert p.gemm_seconds(f, dim=4) == pytest.approx(f / 1e10)
    # never faster than the FLOPs' rate; past the thin curve, as square
    assert p.gemm_seconds(2e6, dim=64) == p.gemm_seconds(2e6) > 2e6 / 4e10
    assert p.gemm_seconds(f, dim=128) == square == p.gemm_seconds(f, dim=None)


def test_the_cost_model_prices_a_product_by_its_smallest_dimension():
    import tessera
    from tessera.ops.registry import REGISTRY, Meta
    mm = REGISTRY["matmul"]

    def meta(*shape):
        return Meta(shape, tessera.float32)
    assert mm.cost([meta(32, 512), meta(512, 2048)], [meta(32, 2048)]).product_dim == 32
    assert mm.cost([meta(2048, 16), meta(16, 512)], [meta(2048, 512)]).product_dim == 16
    assert mm.cost([meta(8, 4, 64, 32), meta(8, 4, 32, 64)],
                   [meta(8, 4, 64, 64)]).product_dim == 32


def test_gemm_class_of_a_batch_is_one_products():
    # 8 products of 64 x 64 x 32 (attention's per head) take the rate of one such product
    # (2 * 64 * 64 * 32 FLOPs: the small class), not of one product of their sum
    p = K.Profile(gemm={"small": 1e9, "medium": 4e9, "large": 8e9})
    flops = 8 * 2 * 64 * 64 * 32
    assert p.gemm_seconds(flops, products=8) == pytest.approx(flops / 1e9)
    assert p.gemm_seconds(flops) == pytest.approx(flops / 4e9)


def test_memory_rate_by_the_bytes_moved():
    # interpolated in log bytes between measured points, constant beyond them; no curve:
    # the single bandwidth
    p = K.Profile(bandwidth=1e9, bandwidth_curve=[(1e6, 1e11), (1e8, 1e10)])
    assert p.memory_seconds(1e5) == pytest.approx(1e5 / 1e11)
    assert p.memory_seconds(1e9) == pytest.approx(1e9 / 1e10)
    assert p.memory_seconds(1e7) == pytest.approx(1e7 / 10 ** 10.5)
    assert K.Profile(bandwidth=1e9).memory_seconds(1e6) == pytest.approx(1e-3)
    back = K.Profile.from_json(json.loads(json.dumps(p.to_json())))
    assert back.memory_seconds(1e7) == pytest.approx(p.memory_seconds(1e7))


def test_boxing_of_another_dim_takes_its_own_figure():
    from tessera.sbp import broadcast, partial_sum, split
    p = K.Profile(boxing={"S->B": {2: (0.0, 4e9)}, "S(1)->B": {2: (0.0, 1e9)},
                          "P->S": {2: (0.0, 1e9)}, "P->S(0)": {2: (0.0, 4e9)}})
    mb = 1e6
    assert p.boxing_seconds(split(0), broadcast, 2, mb) == pytest.approx(mb / 4e9)
    assert p.boxing_seconds(split(1), broadcast, 2, mb) == pytest.approx(mb / 1e9)
    assert p.boxing_seconds(split(3), broadcast, 2, mb) == pytest.approx(mb / 1e9)
    assert p.boxing_seconds(partial_sum, split(0), 2, mb) == pytest.approx(mb / 4e9)
    assert p.boxing_seconds(partial_sum, split(1), 2, mb) == pytest.approx(mb / 1e9)
    # a profile measured before the dims were: the kind's figure for every dim
    old = K.Profile(boxing={"S->B": {2: (0.0, 4e9)}})
    assert old.boxing_seconds(split(1), broadcast, 2, mb) == pytest.approx(mb / 4e9)
