"""Global tensors: to_global/to_local, logical shapes and OneFlow's uneven split rule,
numpy() gathering, printing, factories, errors."""
import numpy as np
import pytest

import tessera
from tessera.distributed import comm as C
from tessera.distributed.placement import placement
from tessera.ops.registry import MissingRule
from tests.distributed._helpers import B, P, S, global_from, run

FULL = np.arange(20, dtype=np.float32).reshape(5, 4)


@pytest.mark.parametrize("n, sizes", [(2, [3, 2]), (3, [2, 2, 1])])
def test_local_to_global_uneven_split(n, sizes):
    def fn():
        r = C.current().rank
        start = sum(sizes[:r])
        local = tessera.tensor(FULL[start:start + sizes[r]])
        x = local.to_global(placement("cpu", list(range(n))), tessera.sbp.split(0))
        return x.shape, x.to_local().shape, x.numpy(), x.is_global, x.device
    for r, (shape, lshape, full, is_global, dev) in enumerate(run(n, fn)):
        assert shape == (5, 4) and lshape == (sizes[r], 4) and is_global and dev.type == "global"
        np.testing.assert_array_equal(full, FULL)


def test_local_tiles_that_break_the_rule_are_named():
    def fn():
        r = C.current().rank
        local = tessera.tensor(FULL[:2] if r == 0 else FULL[2:])  # 2 + 3 rows: rank 0 short
        local.to_global(placement("cpu", [0, 1]), tessera.sbp.split(0))
    with pytest.raises(ValueError, match=r"gives rank 0 a tile of \[3, 4\], but it has \[2, 4\]"):
        run(2, fn)


def test_broadcast_and_partial_sum_from_local():
    def fn():
        r = C.current().rank
        p = placement("cpu", [0, 1])
        b = tessera.tensor(FULL).to_global(p, B)
        s = tessera.tensor(FULL * (r + 1)).to_global(p, P)
        return b.numpy(), s.numpy(), s.to_local().numpy()
    for r, (b, s, loc) in enumerate(run(2, fn)):
        np.testing.assert_array_equal(b, FULL)
        np.testing.assert_array_equal(s, FULL * 3)
        np.testing.assert_array_equal(loc, FULL * (r + 1))


def test_repr_and_properties():
    def fn():
        x = tessera.tensor([1.0, 2.0, 3.0]).to_global(placement("cpu", [0, 1]), B)
        x = x.to_global(sbp=S(0))
        return repr(x), x.sbp, x.placement
    text, sbp, p = run(2, fn)[0]
    assert text == ('tensor([1., 2., 3.], placement=tessera.placement(type="cpu", '
                    'ranks=[0, 1]),\n       sbp=(tessera.sbp.split(dim=0),))')
    assert sbp == (S(0),) and p == placement("cpu", [0, 1])
    local = tessera.ones(2)
    assert local.is_local and not local.is_global
    with pytest.raises(RuntimeError, match="Only global tensors have 'placement'"):
        local.placement
    with pytest.raises(RuntimeError, match="Only global tensors have 'sbp'"):
        local.sbp


def test_factories():
    def fn():
        p = placement("cpu", [0, 1])
        out = {}
        out["zeros"] = tessera.zeros(5, 3, placement=p, sbp=S(0))
        out["ones"] = tessera.ones((3, 5), placement=p, sbp=S(1))
        out["full"] = tessera.full((3,), 7.0, placement=p, sbp=B)
        out["arange"] = tessera.arange(5, placement=p, sbp=S(0))
        out["tensor"] = tessera.tensor([[1, 2], [3, 4]], placement=p, sbp=S(1))
        out["randn"] = tessera.randn(4, 3, placement=p, sbp=B)
        out["randn_s"] = tessera.randn(4, 3, placement=p, sbp=S(0), requires_grad=True)
        part = tessera.tensor([1.0, 2.0]).to_global(p, P)
        out["zeros_like_p"] = tessera.zeros_like(part)
        out["ones_like_s"] = tessera.ones_like(out["zeros"])
        return {k: (v.sbp, v.shape, v.dtype, v.detach().numpy(), v.detach().to_local().numpy(),
                    v.requires_grad) for k, v in out.items()}
    r0, r1 = run(2, fn)
    assert r0["zeros"][0] == (S(0),) and r0["zeros"][1] == (5, 3)
    assert r0["zeros"][4].shape == (3, 3) and r1["zeros"][4].shape == (2, 3)
    np.testing.assert_array_equal(r1["ones"][3], np.ones((3, 5)))
    np.testing.assert_array_equal(r1["arange"][4], [3, 4])
    assert r1["tensor"][2] == tessera.int64 and r1["tensor"][4].tolist() == [[2], [4]]
    np.testing.assert_array_equal(r0["randn"][4], r1["randn"][4])  # broadcast: one value
    np.testing.assert_array_equal(r0["randn_s"][3], r1["randn_s"][3])
    assert r0["randn_s"][5]
    assert r0["zeros_like_p"][0] == (B,) and r0["ones_like_s"][0] == (S(0),)
    assert r1["ones_like_s"][4].shape == (2, 3)


def test_placement_on_some_ranks():
    def fn():
        p = placement("cpu", [1])
        x = tessera.tensor(FULL).to_global(p, B)
        y = (x * 2).sum(0)
        return x.to_local().shape, y.numpy(), y.shape
    (s0, y0, shape0), (s1, y1, _) = run(2, fn)
    assert s0 == (0,) and s1 == (5, 4) and shape0 == (4,)
    np.testing.assert_array_equal(y0, (FULL * 2).sum(0))
    np.testing.assert_array_equal(y1, y0)


def test_errors_name_op_and_sbp():
    def rank_outside():
        tessera.ones(2).to_global(placement("cpu", [0, 2]), B)
    with pytest.raises(ValueError, match=r"names rank\(s\) \[2\], but the world has 2"):
        run(2, rank_outside)

    def local_mix():
        x = tessera.ones(2, 3).to_global(placement("cpu", [0, 1]), S(0))
        x + tessera.ones(4, 3)
    with pytest.raises(RuntimeError, match=r"add: input 1 is a local tensor of shape \[4, 3\]"):
        run(2, local_mix)

    def two_placements():
        x = tessera.ones(2).to_global(placement("cpu", [0, 1]), B)
        y = tessera.ones(2).to_global(placement("cpu", [1]), B)
        x * y
    with pytest.raises(RuntimeError, match="mul: expected all global inputs on one placement"):
        run(2, two_placements)

    def no_rule():
        x = tessera.ones(4, 3).to_global(placement("cpu", [0, 1]), S(0))
        tessera.multinomial(x, 1)
    with pytest.raises(MissingRule, match=r"op 'multinomial' has no 'sbp' rule.*\(S\(0\)\)"):
        run(2, no_rule)

    def bad_sbp():
        tessera.ones(4).to_global(placement("cpu", [0, 1]), S(1))
    with pytest.raises(ValueError, match=r"S\(1\) is out of range"):
        run(2, bad_sbp)

    with pytest.raises(ValueError, match="needs both placement= and sbp="):
        tessera.ones(2).to_global(placement("cpu", [0]))


def test_zero_d_local_counts_as_broadcast():
    def fn():
        x = global_from(FULL, placement("cpu", [0, 1]), (S(0),))
        return (x * tessera.tensor(2.0)).numpy()
    np.testing.assert_array_equal(run(2, fn)[0], FULL * 2)


def test_in_place_update_boxes_into_the_target():
    def fn():
        p = placement("cpu", [0, 1])
        w = global_from(FULL, p, (B,))
        g = global_from(np.ones_like(FULL), p, (P,))
        w.sub_(g, alpha=0.5)  # the P gradient is all-reduced into the B weight
        return w.sbp, w.to_local().numpy()
    for sbp, local in run(2, fn):
        assert sbp == (B,)
        np.testing.assert_array_equal(local, FULL - 0.5)
