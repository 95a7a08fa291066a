"""The ``sbp`` rule of each op: the SBP signatures it can run with on a 1-D mesh.

Like ``tessera.codegen.c_rules`` fills ``to_c``, this module fills ``OpDef.sbp`` by op name,
one rule family per kind of op (OneFlow's per-op ``GetSbpSignatures``):

* pointwise ops with broadcasting: split any output dim (inputs that broadcast on it are
  broadcast), all broadcast, and partial_sum where the op is linear (``add``: P+P, ``mul``:
  P*B, ``div``: P/B, a backward op in its gradient);

Ops without a rule raise ``MissingRule(op, "sbp")`` on global tensors.

>>> from tessera.ops.registry import REGISTRY, Meta
>>> import tessera
>>> sigs = REGISTRY["matmul"].sbp(Meta((4, 3), tessera.float32), Meta((3, 2), tessera.float32))
>>> [str(s) for s in sigs[:3]]
['(S(0), B) -> (S(0))', '(B, S(1)) -> (S(1))', '(S(1), S(0)) -> (P)']
"""
from __future__ import annotations

from tessera.distributed.sbp_nn import NN_RULES, nll_mean_signature
from tessera.ops._sbp import (
    pointwise,
    reduction,
)
from tessera.ops.registry import REGISTRY
from tessera.sbp import SbpRule, Signature, broadcast as B, partial_sum as P, split as S

__all__ = ["RULES", "pointwise", "reduction"]


# ---- nn ops ------------------------------------------------------------------------------

def _layer_norm(x, weight, bias, normalized_shape, eps):
    """Split a leading (non-normalized) dim; weight and bias broadcast."""
    lead = len(x.shape) - len(normalized_shape)
    wb = tuple(None if m is None else B for m in (weight, bias))
    return [Signature((S(d),) + wb, (S(d),)) for d in range(lead)] + \
        [Signature((B,) + wb, (B,))]


def _layer_norm_backward(g, x, weight, normalized_shape, eps):
    """(dx, dweight, dbias): a split leading dim leaves weight and bias grads partial."""
    lead = len(x.shape) - len(normalized_shape)
    w = None if weight is None else B
    return [Signature((S(d), S(d), w), (S(d), P, P)) for d in range(lead)] + \
        [Signature((B, B, w), (B, B, B)), Signature((P, B, w), (P, P, P))]


def _embedding(weight, indices, **attrs):
    """Indices split on any dim, or the embedding dim split (weight S(1)); linear in the
    weight."""
    n = len(indices.shape)
    return [Signature((B, S(d)), (S(d),)) for d in range(n)] + \
        [Signature((S(1), B), (S(n),)), Signature((B, B), (B,)), Signature((P, B), (P,))]


def _embedding_backward(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    n = len(indices.shape)
    sigs = [Signature((S(n), B), (S(1),)), Signature((B, B), (B,)), Signature((P, B), (P,))]
    if not scale_grad_by_freq:  # (the counts would need the whole batch)
        sigs += [Signature((S(d), S(d)), (P,)) for d in range(n)]
    return sigs


def _nll_loss(x, t, w, reduction="mean", ignore_index=-100):
    """``none``: the batch stays split; ``sum``: a split batch sums to partial_sum; ``mean``:
    each tile's sum over the global count of targets (one all-reduced number), partial."""
    wsig = None if w is None else B
    sigs = [Signature((B, B, wsig), (B,))]
    if len(x.shape) >= 2 and reduction in ("none", "sum"):
        sigs.insert(0, Signature((S(0), S(0), wsig), (S(0) if reduction == "none" else P,)))
    elif len(x.shape) >= 2:
        sigs.insert(0, nll_mean_signature(w, backward=False))
    return sigs


def _nll_loss_backward(g, t, w, shape, reduction="mean", ignore_index=-100):
    wsig = None if w is None else B
    sigs = [Signature((B, B, wsig), (B,)), Signature((P, B, wsig), (P,))]
    if len(shape) >= 2 and reduction in ("none", "sum"):
        sigs.insert(0, Signature((S(0) if reduction == "none" else B, S(0), wsig), (S(0),)))
    elif len(shape) >= 2:
        sigs.insert(0, nll_mean_signature(w, backward=True))
    return sigs


# ---- the table -----------------------------------------------------------------------------

_UNARY = """abs acos acosh asin asinh atan atanh ceil cos cosh erf erfc erfinv exp exp2 expm1
floor frac isfinite isinf isnan isneginf isposinf log log10 log1p log2 logit reciprocal relu
round rsqrt sigmoid sign signbit silu sin sinh sqrt square tan tanh trunc gelu mish elu
leaky_relu hardtanh hardsigmoid hardswish hardshrink softshrink softplus threshold nan_to_num
log_sigmoid logical_not bitwise_not""".split()
_BINARY = """pow maximum minimum fmax fmin atan2 hypot remainder fmod eq ne lt le gt ge
logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor bitwise_left_shift
bitwise_right_shift isclose clamp lerp addcmul addcdiv masked_fill fill""".split()

RULES: dict[str, SbpRule] = {}
RULES.update({n: pointwise() for n in _UNARY + _BINARY})
RULES.update({n: pointwise(each=(0,)) for n in ("neg", "positive", "clone", "cast")})
RULES.update({
    "add": pointwise(joint=(0, 1)), "sub": pointwise(joint=(0, 1)),
    "mul": pointwise(each=(0, 1)), "div": pointwise(each=(0,)),
    "where": pointwise(joint=(1, 2)), "copy": pointwise(each=(1,)),
    "gelu_backward": pointwise(each=(0,)), "silu_backward": pointwise(each=(0,)),
    "softmax": pointwise(skip=("dim",)), "log_softmax": pointwise(skip=("dim",)),
    "softmax_backward": pointwise(each=(0,), skip=("dim",)),
    "log_softmax_backward": pointwise(each=(0,), skip=("dim",)),
    "layer_norm": SbpRule(_layer_norm), "layer_norm_backward": SbpRule(_layer_norm_backward),
    "embedding": SbpRule(_embedding), "embedding_backward": SbpRule(_embedding_backward),
    "nll_loss": SbpRule(_nll_loss),
    "nll_loss_backward": SbpRule(_nll_loss_backward, shape_attrs=("shape",)),
    # (each rank would need whole rows' norms and the rows of every index)
    "embedding_renorm": SbpRule(lambda w, indices, **attrs: [Signature((B, B), (B,))]),
})


def _cast_rule(x, dtype):
    sigs = RULES_CAST(x, dtype=dtype)
    if not (x.dtype.is_floating_point and dtype.is_floating_point):
        sigs = [s for s in sigs if P not in s.ins]  # rounding to ints is not linear
    return sigs


RULES.update(NN_RULES)
RULES_CAST = RULES["cast"]
RULES["cast"] = SbpRule(_cast_rule)

for _name, _rule in RULES.items():
    REGISTRY[_name].sbp = _rule
