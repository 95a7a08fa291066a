"""Ops on global tensors, OneFlow's ``@globaltest`` way: each op runs with every combination
of its inputs' SBPs (split on each dim, broadcast, partial_sum) on 2 ranks (3 for uneven
splits), and its forward value and input gradients must equal the single-process run."""
import itertools

import numpy as np
import pytest

import tessera
import tessera.nn.functional as F
from tessera.distributed.placement import placement
from tessera.ops.registry import REGISTRY
from tests.distributed._helpers import B, S, global_from, run, sbps_1d

rng = np.random.default_rng(0)


def _arr(shape, positive=False):
    a = rng.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


CASES = {
    "add": (lambda a, b: a + b, [(5, 4), (5, 4)]),
    "add_broadcast": (lambda a, b: a + b, [(5, 4), (4,)]),
    "add_scalar": (lambda a: a + 1.5, [(5, 4)]),
    "sub_alpha": (lambda a, b: tessera.sub(a, b, alpha=2), [(5, 4), (5, 1)]),
    "mul": (lambda a, b: a * b, [(5, 4), (1, 4)]),
    "mul_scalar": (lambda a: a * 3.0, [(5, 4)]),
    "div": (lambda a, b: a / b, [(5, 4), ("+", 5, 4)]),
    "neg_exp": (lambda a: (-a).exp(), [(5, 4)]),
    "relu_tanh_sigmoid": (lambda a: a.relu() + a.tanh() * a.sigmoid(), [(5, 4)]),
    "gelu": (lambda a: F.gelu(a), [(5, 4)]),
    "pow_maximum": (lambda a, b: tessera.maximum(a ** 2, b), [(5, 4), (5, 4)]),
    "where": (lambda a, b: tessera.where(a > 0, a, b), [(5, 4), (5, 4)]),
    "sum_all": (lambda a: a.sum(), [(5, 4)]),
    "sum_dim": (lambda a: a.sum(0), [(5, 4)]),
    "sum_keepdim": (lambda a: a.sum(-1, keepdim=True), [(5, 4)]),
    "mean_all": (lambda a: a.mean(), [(5, 4)]),
    "mean_dim": (lambda a: a.mean(1), [(5, 4)]),
    "amax": (lambda a: a.amax(1), [(5, 4)]),
    "logsumexp_var": (lambda a: a.logsumexp(0) + a.var(1).sum(), [(5, 4)]),
    "matmul": (lambda a, b: a @ b, [(5, 3), (3, 4)]),
    "matmul_batched": (lambda a, b: a @ b, [(2, 5, 3), (3, 4)]),
    "bmm": (lambda a, b: a @ b, [(2, 5, 3), (2, 3, 4)]),
    "mv": (lambda a, b: a @ b, [(5, 3), (3,)]),
    "vm": (lambda a, b: a @ b, [(3,), (3, 4)]),
    "dot": (lambda a, b: a @ b, [(3,), (3,)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(5, 3), (4, 3), (4,)]),
    "softmax": (lambda a: a.softmax(-1), [(5, 4)]),
    "log_softmax": (lambda a: F.log_softmax(a, 0), [(5, 4)]),
    "view": (lambda a: a.view(5, 2, 2), [(5, 4)]),
    "view_split_heads": (lambda a: a.view(2, 5, 2, 3), [(2, 5, 6)]),
    "reshape_merge_heads": (lambda a: a.transpose(1, 2).reshape(2, 5, 6), [(2, 2, 5, 3)]),
    "reshape_flat": (lambda a: a.reshape(-1), [(5, 4)]),
    "transpose": (lambda a: a.t(), [(5, 4)]),
    "permute3": (lambda a: a.permute(2, 0, 1), [(2, 5, 3)]),
    "unsqueeze_squeeze": (lambda a: a.unsqueeze(1).squeeze(1), [(5, 4)]),
    "expand": (lambda a: a.unsqueeze(0).expand(3, 5, 4), [(5, 4)]),
    "cat": (lambda a, b: tessera.cat([a, b], 1), [(5, 4), (5, 2)]),
    "slice": (lambda a: a[:, 1:3], [(5, 4)]),
    "chunk": (lambda a: tessera.cat([c * (i + 1) for i, c in enumerate(a.chunk(2, 1))], 0),
              [(5, 4)]),
    "unbind": (lambda a: a.unbind(0)[1] * 2 + a.unbind(0)[0], [(3, 4)]),
    "mse": (lambda a, b: ((a - b) ** 2).mean(), [(5, 4), (5, 4)]),
    "cast": (lambda a: a.float(), [(5, 4)], 1e-6),  # P tiles round one by one
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (4,), w, b), [(5, 4), (4,), (4,)]),
    "layer_norm_3d": (lambda a: F.layer_norm(a, (3,)), [(2, 5, 3)]),
    "embedding": (lambda i, w: F.embedding(i, w), [("i", 5, 3), (6, 4)]),
    "cross_entropy_sum": (lambda a, t: F.cross_entropy(a, t, reduction="sum"),
                          [(5, 6), ("i", 5)]),
    "cross_entropy_mean": (lambda a, t: F.cross_entropy(a, t), [(5, 6), ("i", 5)]),
    "cross_entropy_mean_3d": (lambda a, t: F.cross_entropy(a, t, ignore_index=2),
                              [(3, 6, 2), ("i", 3, 2)]),
    "nll_loss_weighted_mean": (lambda a, t: F.nll_loss(a, t, _const(a, [1, 2, .5, 1, 3, .2])),
                               [(5, 6), ("i", 5)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(3, 3, 4, 4), (4, 3, 3, 3), (4,)]),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, stride=2, groups=2),
                      [(3, 4, 5, 5), (2, 2, 3, 3)]),
    "conv1d": (lambda x, w: F.conv1d(x, w), [(3, 2, 5), (3, 2, 2)]),
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(x, _const(x, [0.1, 0.2, -0.3]),
                                                     _const(x, [1.0, 2.0, 0.5]), w, b),
                        [(4, 3, 2, 2), (3,), (3,)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                         [(5, 3, 2, 2), (3,), (3,)]),
    "batch_norm_train_1d": (lambda x: F.batch_norm(x, None, None, training=True), [(5, 3)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(3, 4, 2, 2), (4,), (4,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), [(5, 4), (4,)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(3, 2, 4, 4)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2, padding=1), [(3, 2, 4, 4)]),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 2), [(3, 2, 4, 4)]),
}


def _const(like, values):
    """A constant that is global (broadcast) where ``like`` is."""
    t = tessera.tensor(values, dtype=tessera.float64)
    return t.to_global(like.placement, B) if like.is_global else t


def _inputs(shapes):
    out = []
    for s in shapes:
        if s[0] == "i":  # integer indices/targets in [0, 6)
            out.append(rng.integers(0, 6, s[1:]))
            continue
        positive = s[0] == "+"
        out.append(_arr(s[1:] if positive else s, positive))
    return out


def _single(fn, arrays):
    xs = [tessera.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    y = fn(*xs)
    w = np.linspace(-1, 1, y.numel()).reshape(y.shape)
    (y * tessera.tensor(w)).sum().backward()
    return y.detach().numpy(), w, [x.grad.numpy() if x.requires_grad else None for x in xs]


def _sweep(fn, arrays, n, combos=None, rtol=1e-10, atol=1e-12):
    want, w, grads = _single(fn, arrays)

    def body():
        p = placement("cpu", list(range(n)))
        seen = []
        choices = combos or itertools.product(*[sbps_1d(a.ndim, a.dtype.kind == "f")
                                                for a in arrays])
        for sbps in choices:
            xs = [global_from(a, p, (s,), requires_grad=a.dtype.kind == "f")
                  for a, s in zip(arrays, sbps)]
            y = fn(*xs)
            assert y.is_global and y.shape == want.shape, (sbps, y.shape)
            np.testing.assert_allclose(y.detach().numpy(), want, rtol=rtol, atol=atol,
                                       err_msg=f"forward with {[s.short() for s in sbps]}")
            (y * tessera.tensor(w).to_global(p, B)).sum().backward()
            for x, g in zip(xs, grads):
                if g is None:
                    continue
                np.testing.assert_allclose(x.grad.numpy(), g, rtol=rtol, atol=atol,
                                           err_msg=f"grad with {[s.short() for s in sbps]}")
            seen.append((tuple(s.short() for s in sbps), y.sbp[0].short()))
        return seen
    return run(n, body)


@pytest.mark.parametrize("name", list(CASES))
def test_op_on_every_sbp_combination(name):
    fn, shapes, *tol = CASES[name]
    # (an explicit tolerance is float32 rounding: absolute near zero too)
    seen = _sweep(fn, _inputs(shapes), 2, rtol=tol[0] if tol else 1e-10,
                  atol=tol[0] if tol else 1e-12)
    assert seen[0] == seen[1]


@pytest.mark.parametrize("name", ["add_broadcast", "matmul", "sum_dim", "mean_all", "view",
                                  "softmax", "linear", "conv2d", "batch_norm_train",
                                  "cross_entropy_mean", "max_pool2d"])
def test_uneven_splits_on_three_ranks(name):
    fn, shapes = CASES[name][:2]
    arrays = _inputs(shapes)
    combos = [tuple(S(0) if a.ndim else B for a in arrays),
              tuple(S(a.ndim - 1) for a in arrays)]
    _sweep(fn, arrays, 3, combos)


def test_signature_choice_avoids_communication():
    """The five matmul signatures are chosen where the inputs already fit them."""
    a, b = _arr((6, 4)), _arr((4, 2))

    def body():
        p = placement("cpu", [0, 1])
        out = []
        for sa, sb in [(S(0), B), (B, S(1)), (S(1), S(0)), ("P", B), (B, "P")]:
            sa = tessera.sbp.partial_sum if sa == "P" else sa
            sb = tessera.sbp.partial_sum if sb == "P" else sb
            y = global_from(a, p, (sa,)) @ global_from(b, p, (sb,))
            out.append(y.sbp[0].short())
        return out
    assert run(2, body)[0] == ["S(0)", "S(1)", "P", "P", "P"]


def test_sum_of_split_dim_is_partial_and_mean_divides_by_the_logical_count():
    a = _arr((5, 4))

    def body():
        x = global_from(a, placement("cpu", [0, 1]), (S(0),))
        s, m = x.sum(0), x.mean()
        return s.sbp[0].short(), m.sbp[0].short(), m.to_local().item()
    (s0, m0, l0), (_, _, l1) = run(2, body)
    assert (s0, m0) == ("P", "P")
    np.testing.assert_allclose([l0, l1], [a[:3].sum() / 20, a[3:].sum() / 20])


def test_opcov_counts_sbp_rules():
    from tessera.ops.registry import coverage_table
    ops = [op for op in REGISTRY.values() if op.sbp is not None]
    assert len(ops) >= 100 and all(op.has_rule("sbp") for op in ops)
    total = coverage_table().splitlines()[-2].split()
    assert int(total[5]) == len(ops)  # the 'sbp' column of python -m tessera opcov
