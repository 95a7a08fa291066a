"""Numerical gradient checks: compare autograd's vector-Jacobian products with central
finite differences (use float64 inputs).

>>> import tessera
>>> x = tessera.randn(3, dtype=tessera.float64, requires_grad=True)
>>> tessera.autograd.gradcheck(lambda t: (t * t).sin(), (x,))
True
"""
from __future__ import annotations

import numpy as np

from tessera.autograd import grad
from tessera.autograd.grad_mode import enable_grad, no_grad
from tessera.ops.creation import tensor


class GradcheckError(RuntimeError):
    pass


def _outputs(fn, inputs):
    from tessera._tensor import Tensor
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating_point]


def _snapshot(outs) -> list:
    """float64 copies: an output may be a view of the input that is perturbed next."""
    return [o.detach()._to_numpy().astype(np.float64) for o in outs]


def gradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, seed: int = 0, **_ignored) -> bool:
    """Check ``fn``'s gradients for every input that requires grad.

    With a fixed random cotangent ``v`` per output, compares ``v^T J`` from autograd with
    ``v^T (f(x + eps e_i) - f(x - eps e_i)) / 2 eps`` for every input element ``i``.
    """
    from tessera._tensor import Tensor
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    rng = np.random.default_rng(seed)
    outs = _outputs(fn, inputs)
    if not outs:
        return True
    cots = [tensor(rng.standard_normal(o.shape), dtype=o.dtype) for o in outs]
    needs = [o.requires_grad for o in outs]
    if not any(needs):
        analytic: tuple | list = [None] * len(diff)
    else:
        used = [(o, c) for o, c, n in zip(outs, cots, needs) if n]
        analytic = grad([o for o, _ in used], diff,
                                         grad_outputs=[c for _, c in used], allow_unused=True)
    cots_np = [c._to_numpy().astype(np.float64) for c in cots]
    with no_grad():
        for t, ag in zip(diff, analytic):
            data = t.detach()._to_numpy()
            num = np.zeros(data.shape, np.float64)
            flat = data.reshape(-1) if data.flags.c_contiguous else None
            if flat is None:
                raise GradcheckError("gradcheck needs contiguous inputs")
            for i in range(flat.size):
                orig = flat[i]
                flat[i] = orig + eps
                t._version[0] += 1
                plus = _snapshot(_outputs(fn, inputs))
                flat[i] = orig - eps
                minus = _snapshot(_outputs(fn, inputs))
                flat[i] = orig
                num.reshape(-1)[i] = sum(float(((p - m) * c).sum()) for p, m, c in
                                         zip(plus, minus, cots_np)) / (2 * eps)
            a = np.zeros(data.shape) if ag is None else ag.detach()._to_numpy().astype(np.float64)
            if not np.allclose(a, num, atol=atol, rtol=rtol, equal_nan=True):
                if raise_exception:
                    raise GradcheckError(
                        f"Jacobian mismatch for an input of shape {list(t.shape)}:\n"
                        f"numerical:{num}\nanalytical:{a}")
                return False
    return True


def gradgradcheck(fn, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  raise_exception: bool = True, seed: int = 1, **_ignored) -> bool:
    """gradcheck of the gradient itself: checks double backward."""
    from tessera._tensor import Tensor
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    rng = np.random.default_rng(seed)
    outs = _outputs(fn, inputs)
    cots = [tensor(rng.standard_normal(o.shape), dtype=o.dtype) for o in outs]

    def first_grad(*xs):
        with enable_grad():  # the numerical part of gradcheck runs under no_grad
            return _first_grad(xs)

    def _first_grad(xs):
        os_ = _outputs(fn, xs)
        used = [(o, c) for o, c in zip(os_, cots) if o.requires_grad]
        xs_diff = [x for x in xs if isinstance(x, Tensor) and x.requires_grad]
        gs = grad([o for o, _ in used], xs_diff,
                                   grad_outputs=[c for _, c in used], create_graph=True,
                                   allow_unused=True)
        return tuple(g for g in gs if g is not None)
    return gradcheck(first_grad, inputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, seed=seed + 1)
