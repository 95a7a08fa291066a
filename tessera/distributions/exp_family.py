"""``ExponentialFamily``: densities ``exp(<t(x), theta> - F(theta) + k(x))``.

Its entropy (and the KL divergence between two members of one family) follows from the
log normaliser ``F`` by autograd, for the members that do not write their own.

>>> import tessera
>>> from tessera.distributions import Gamma
>>> d = Gamma(tessera.tensor([2.0]), tessera.tensor([1.0]))
>>> bool(((ExponentialFamily.entropy(d) - d.entropy()).abs() < 1e-5).all())
True
"""
from __future__ import annotations

from tessera.distributions import _ops as T
from tessera.distributions.distribution import Distribution

__all__ = ["ExponentialFamily"]


class ExponentialFamily(Distribution):
    """A distribution of an exponential family, given by ``_natural_params``,
    ``_log_normalizer`` and ``_mean_carrier_measure``."""

    @property
    def _natural_params(self) -> tuple:
        raise NotImplementedError

    def _log_normalizer(self, *natural_params):
        raise NotImplementedError

    @property
    def _mean_carrier_measure(self) -> float:
        raise NotImplementedError

    def entropy(self):
        """``F(theta) - <theta, grad F(theta)> - E[k(x)]`` (a Bregman divergence of ``F``)."""
        params = [p.detach().requires_grad_() for p in self._natural_params]
        with T.enable_grad():
            normalizer = self._log_normalizer(*params)
            grads = T.grad(normalizer.sum(), params, create_graph=True)
        result = normalizer - self._mean_carrier_measure
        for p, g in zip(params, grads):
            result = result - (p * g).reshape(tuple(self._batch_shape) + (-1,)).sum(-1)
        return result
