"""The fused attention op: ``scaled_dot_product_attention`` as one kernel that never holds
the L x S scores (``tessera.kernels.attention``), and its backward.

``nn.functional.scaled_dot_product_attention`` is a composite of matmul, softmax,
masked_fill and dropout; it dispatches this op instead when the fused kernel computes
the same function: float32 operands on the CPU, a mask that needs no gradient, and C
kernels available. The op's outputs are the attention and each row's log-sum-exp (all the
backward keeps besides the inputs and output). Dropout draws the same mask as the
composite's ``dropout`` op given the same seed (both consume one ``fresh_seed()``), and the
backward regenerates it from the seed.

>>> import tessera
>>> from tessera.ops.attention import fused_attention
>>> q = tessera.ones(1, 3, 4)
>>> fused_attention(q, q, q, None, scale=0.5, is_causal=True).shape
tessera.Size([1, 3, 4])
"""
from __future__ import annotations

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch
from tessera._tensor import Tensor
from tessera.ops import _sbp, cost
from tessera.ops.broadcast import broadcast_shapes
from tessera.ops.registry import Meta, defop
from tessera.sbp import SbpRule, Signature, broadcast as B, split as S

__all__: list[str] = []


def _batch(q: Meta, k: Meta, v: Meta, enable_gqa: bool) -> tuple[int, ...]:
    def heads(x: Meta) -> tuple[int, ...]:
        if enable_gqa and len(x.shape) >= 3 and len(q.shape) >= 3:
            return x.shape[:-3] + (q.shape[-3] if x.shape[-3] else 0,)
        return x.shape[:-2]
    return tuple(broadcast_shapes(q.shape[:-2], heads(k), heads(v)))


def _infer(q, k, v, mask, scale, is_causal, dropout_p, enable_gqa, seed=0):
    if not (q.dtype == k.dtype == v.dtype == D.float32):
        raise RuntimeError(f"scaled_dot_product_attention (fused): expected float32 query, "
                           f"key and value, got {q.dtype}, {k.dtype} and {v.dtype}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: query {list(q.shape)}, key "
                           f"{list(k.shape)} and value {list(v.shape)} do not fit: query and "
                           "key need the same embedding size, key and value the same length")
    batch = _batch(q, k, v, enable_gqa)
    return (Meta(batch + (q.shape[-2], v.shape[-1]), q.dtype),
            Meta(batch + (q.shape[-2],), D.float32))


def _kernel(q, k, v, mask, scale, is_causal, dropout_p, enable_gqa, seed=0):
    from tessera.kernels import attention
    return attention.forward(q, k, v, mask, scale=scale, causal=is_causal, p=dropout_p,
                             seed=seed, gqa=enable_gqa)


def _grad(ctx, g, *_):
    q, k, v, mask = ctx.inputs
    out, lse = ctx.outputs
    dq, dk, dv = dispatch(_BACKWARD, q, k, v, mask, out, lse, g, **ctx.attrs)
    return dq, dk, dv, None


def _cost(ins, outs, **attrs) -> cost.Cost:
    """Two products of L x S x E (scores) and L x S x Ev (weights by values), and per score
    the scaling, mask, exponential and row sum (4)."""
    q, _, v = ins[0], ins[1], ins[2]
    rows = cost.numel(outs[1])
    s = ins[1].shape[-2]
    flops = 2 * rows * s * (q.shape[-1] + v.shape[-1]) + 4 * rows * s
    return cost.Cost(flops, *cost.io(ins, outs), min(q.shape[-2], s, q.shape[-1]))


def _jax_forward(jnp, lax, q, k, v, mask, at):
    """The composite in ``jax.numpy`` (XLA fuses it): (output, log-sum-exp)."""
    if at["dropout_p"] > 0:
        raise NotImplementedError("scaled_dot_product_attention: dropout on the XLA backend")
    if at["enable_gqa"]:
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    hi = lax.Precision.HIGHEST
    s = jnp.matmul(q * at["scale"], jnp.swapaxes(k, -1, -2), precision=hi)
    dead = None
    if at["is_causal"]:
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    elif mask is not None:
        m = jnp.where(mask, 0.0, -jnp.inf).astype(s.dtype) if mask.dtype == bool else mask
        dead = jnp.all(m == -jnp.inf, axis=-1, keepdims=True)
        s = s + jnp.where(dead, 0.0, m)
    top = jnp.max(s, axis=-1, keepdims=True)
    lse = top + jnp.log(jnp.sum(jnp.exp(s - top), axis=-1, keepdims=True))
    w = jnp.exp(s - lse)
    if dead is not None:
        w = jnp.where(dead, 0.0, w)
        lse = jnp.where(dead, -jnp.inf, lse)
    return jnp.matmul(w, v, precision=hi), lse[..., 0]


def _jax(jnp, lax, a, at):
    q, k, v, mask = a
    return _jax_forward(jnp, lax, q, k, v, mask, at)


def _jax_backward(jnp, lax, a, at):
    import jax  # the backward is the forward's vjp, which XLA fuses
    q, k, v, mask, _, _, g = a
    _, pull = jax.vjp(lambda q, k, v: _jax_forward(jnp, lax, q, k, v, mask, at)[0], q, k, v)
    return pull(g)


def _relax_scores(R, q, k, v, mask, at):
    """The composite in Relax: (probabilities, log-sum-exp with a kept last dim, dead rows
    (a mask that allows nothing) or None, k and v with their heads repeated for
    grouped-query attention)."""
    if at["dropout_p"] > 0:
        raise NotImplementedError("scaled_dot_product_attention: dropout on the TVM backend")
    nd = len(R.shape(q))
    if at["enable_gqa"]:
        rep = R.shape(q)[-3] // R.shape(k)[-3]
        k, v = R.repeat(k, rep, nd - 3), R.repeat(v, rep, nd - 3)
    k, v = R.emit(k), R.emit(v)
    f32 = R.dtype(q)
    s = R.matmul(R.multiply(q, R.const(at["scale"], f32)), R.permute_dims(
        k, list(range(len(R.shape(k)) - 2)) + [len(R.shape(k)) - 1, len(R.shape(k)) - 2]))
    s = R.emit(s)
    ninf = R.const(-np.inf, f32)
    dead = None
    if at["is_causal"]:
        ls = R.shape(s)[-2:]
        s = R.emit(R.where(R.const(np.tril(np.ones(ls, bool)), "bool"), s, ninf))
    elif mask is not None:
        m = R.where(mask, R.const(0.0, f32), ninf) if R.dtype(mask) == "bool" else mask
        m = R.emit(m)
        last = len(R.shape(m)) - 1
        live = R.max(R.astype(R.not_equal(m, ninf), "int8"), [last], True)
        dead = R.emit(R.equal(live, R.const(0, "int8")))
        s = R.emit(R.add(s, R.where(dead, R.const(0.0, f32), m)))
    last = len(R.shape(s)) - 1
    top = R.emit(R.max(s, [last], True))
    lse = R.emit(R.add(top, R.log(R.sum(R.exp(R.subtract(s, top)), [last], True))))
    w = R.exp(R.subtract(s, lse))
    if dead is not None:
        w = R.where(dead, R.const(0.0, f32), w)
        lse = R.where(dead, ninf, lse)
    return R.emit(w), R.emit(lse), dead, k, v


def _relax(R, a, at):
    q, k, v, mask = a
    w, lse, _, k, v = _relax_scores(R, q, k, v, mask, at)
    return R.matmul(w, v), R.squeeze(lse, [len(R.shape(lse)) - 1])


def _relax_backward(R, a, at):
    """The forward's probabilities again, then dV = P^T g, dP = g V^T, dS = P (dP - D)
    with D the rows of g * out summed, dQ = scale dS K, dK = scale dS^T Q (the heads a
    key serves summed back for grouped-query attention)."""
    q, k0, v0, mask, out, _lse, g = a
    p, _, _, k, v = _relax_scores(R, q, k0, v0, mask, at)
    nd = len(R.shape(q))

    def t(x):
        n = len(R.shape(x))
        return R.permute_dims(x, list(range(n - 2)) + [n - 1, n - 2])
    f32 = R.dtype(q)
    dv = R.matmul(t(p), g)
    dp = R.matmul(g, t(v))
    dd = R.sum(R.multiply(g, out), [nd - 1], True)
    ds = R.emit(R.multiply(p, R.subtract(dp, dd)))
    sc = R.const(at["scale"], f32)
    dq = R.multiply(R.matmul(ds, k), sc)
    dk = R.multiply(R.matmul(t(ds), q), sc)
    if at["enable_gqa"]:
        hk, hq = R.shape(k0)[-3], R.shape(q)[-3]

        def fold(x):
            shape = R.shape(x)
            return R.sum(R.reshape(x, list(shape[:-3]) + [hk, hq // hk] + list(shape[-2:])),
                         [nd - 2])
        dk, dv = fold(R.emit(dk)), fold(R.emit(dv))
    return dq, dk, dv


def _batch_sbp(tails: tuple[int, ...], nout: int):
    """Attention is independent across its batch dims (all but q's last two): each may be
    split, in every tensor that has it at full size (one that broadcasts there is
    broadcast), or everything broadcast. The head dim of grouped-query attention is not
    split (a key head serves several query heads). ``tails``: how many trailing non-batch
    dims each input has (2 for (..., L, E), 1 for a log-sum-exp's (..., L))."""
    def rule(*metas, **attrs):
        tpos = _sbp.tensors(metas)
        lead = {i: len(metas[i].shape) - tails[i] for i in tpos}
        batch = tuple(_sbp.bshape([metas[i].shape[:max(lead[i], 0)] for i in tpos]))
        sigs = []
        for d in range(len(batch)):
            if attrs.get("enable_gqa") and d == len(batch) - 1:
                continue
            ins: list = []
            for i, m in enumerate(metas):
                k = d - (len(batch) - lead[i]) if i in tpos else -1
                ins.append(None if i not in tpos else
                           S(k) if k >= 0 and m.shape[k] == batch[d] else B)
            sigs.append(Signature(tuple(ins), (S(d),) * nout))
        sigs.append(Signature(tuple(B if i in tpos else None for i in range(len(metas))),
                              (B,) * nout))
        return sigs
    return SbpRule(rule)


_FUSED = defop("scaled_dot_product_attention", _infer, _kernel, grad=_grad,
               save=("inputs", "outputs"), nondiff_outputs=(1,), cost=_cost, to_jax=_jax,
               to_relax=_relax, sbp=_batch_sbp((2, 2, 2, 2), 2))


def _backward_infer(q, k, v, mask, out, lse, g, scale, is_causal, dropout_p, enable_gqa,
                    seed=0):
    return Meta(q.shape, q.dtype), Meta(k.shape, k.dtype), Meta(v.shape, v.dtype)


def _backward_kernel(q, k, v, mask, out, lse, g, scale, is_causal, dropout_p, enable_gqa,
                     seed=0):
    from tessera.kernels import attention
    return attention.backward(q, k, v, mask, out, lse, g, scale=scale, causal=is_causal,
                              p=dropout_p, seed=seed, gqa=enable_gqa)


def _backward_cost(ins, outs, **attrs) -> cost.Cost:
    """The forward's scores again, then four products (dV, dP, dK, dQ) of the same size
    and per score the exponential and the softmax's product rule (6)."""
    rows, s = cost.numel(ins[5]), ins[1].shape[-2]
    e, ev = ins[0].shape[-1], ins[2].shape[-1]
    return cost.Cost(2 * rows * s * (3 * e + 2 * ev) + 6 * rows * s, *cost.io(ins, outs),
                     min(ins[0].shape[-2], s, e))


# no grad rule: a second derivative through fused attention raises MissingRule naming this
# op (the composite, for float64 or a mask that needs a gradient, has one)
_BACKWARD = defop("scaled_dot_product_attention_backward", _backward_infer, _backward_kernel,
                  save=(), cost=_backward_cost, to_jax=_jax_backward,
                  to_relax=_relax_backward,
                  sbp=_batch_sbp((2, 2, 2, 2, 2, 1, 2), 3))


def fused_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *,
                    scale: float, is_causal: bool = False, dropout_p: float = 0.0,
                    seed: int = 0, enable_gqa: bool = False) -> Tensor:
    """The attention output of the fused op (its log-sum-exp stays with autograd)."""
    attrs = dict(scale=float(scale), is_causal=bool(is_causal), dropout_p=float(dropout_p),
                 enable_gqa=bool(enable_gqa))
    if dropout_p > 0:
        # only then: a node with a seed is random (a fresh seed each step of a graph, and no
        # XLA lowering), which attention without dropout is not
        attrs["seed"] = int(seed)
    return dispatch(_FUSED, query, key, value, attn_mask, **attrs)[0]
