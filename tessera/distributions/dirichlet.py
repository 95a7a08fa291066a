"""``Dirichlet(concentration)`` on the simplex, and ``Beta`` (its two-category case).

Reparameterised draws normalise independent Gamma draws, so gradients flow through
``tessera._standard_gamma``'s implicit gradient (PyTorch differentiates its own Dirichlet
sampler with an approximation; both are unbiased, draw by draw they differ).

>>> import tessera
>>> from tessera.distributions import Beta
>>> Beta(tessera.tensor(2.0), tessera.tensor(2.0)).log_prob(tessera.tensor(0.5))
tensor(0.4055)
"""
from __future__ import annotations

import numbers

from tessera.distributions import _ops as T, constraints
from tessera.distributions.exp_family import ExponentialFamily
from tessera.distributions.utils import _xlogy, broadcast_all

__all__ = ["Dirichlet", "Beta"]


class Dirichlet(ExponentialFamily):
    """The Dirichlet distribution over the last dim of ``concentration``."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration, validate_args=None):
        if concentration.dim() < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:],
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = T.Size(batch_shape)
        new.concentration = self.concentration.expand(tuple(batch_shape)
                                                      + tuple(self.event_shape))
        return self._expanded(new, batch_shape)

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        g = T._standard_gamma(self.concentration.expand(shape))
        x = g / g.sum(-1, keepdim=True)
        tiny = T.finfo(x.dtype).tiny
        return x.detach().clamp(min=tiny) + (x - x.detach())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        a = self.concentration
        return (_xlogy(a - 1.0, value).sum(-1) + T.lgamma(a.sum(-1))
                - T.lgamma(a).sum(-1))

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, keepdim=True)

    @property
    def mode(self):
        a = (self.concentration - 1).clamp(min=0.0)
        mode = a / a.sum(-1, keepdim=True)
        below = (self.concentration < 1).all(-1)
        hot = T.one_hot(self.concentration.argmax(-1), a.shape[-1]).to(mode.dtype)
        return T.where(below.unsqueeze(-1), hot, mode)

    @property
    def variance(self):
        a0 = self.concentration.sum(-1, keepdim=True)
        return self.concentration * (a0 - self.concentration) / (a0.pow(2) * (a0 + 1))

    def entropy(self):
        a = self.concentration
        k = a.size(-1)
        a0 = a.sum(-1)
        return (T.lgamma(a).sum(-1) - T.lgamma(a0) - (k - a0) * T.digamma(a0)
                - ((a - 1.0) * T.digamma(a)).sum(-1))

    @property
    def _natural_params(self):
        return (self.concentration,)

    def _log_normalizer(self, x):
        return x.lgamma().sum(-1) - T.lgamma(x.sum(-1))


class Beta(ExponentialFamily):
    """The beta distribution on [0, 1] with ``concentration1`` (alpha) and
    ``concentration0`` (beta)."""

    arg_constraints = {"concentration1": constraints.positive,
                       "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        if isinstance(concentration1, numbers.Number) and isinstance(concentration0,
                                                                     numbers.Number):
            both = T.tensor([concentration1, concentration0], dtype=T.get_default_dtype())
        else:
            c1, c0 = broadcast_all(concentration1, concentration0)
            both = T.stack([c1, c0], -1)
        self._dirichlet = Dirichlet(both, validate_args=validate_args)
        super().__init__(self._dirichlet._batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Beta, _instance)
        batch_shape = T.Size(batch_shape)
        new._dirichlet = self._dirichlet.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @property
    def concentration1(self):
        return self._dirichlet.concentration[..., 0]

    @property
    def concentration0(self):
        return self._dirichlet.concentration[..., 1]

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self):
        return self._dirichlet.mode[..., 0]

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        return self._dirichlet.rsample(sample_shape).select(-1, 0)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._dirichlet.log_prob(T.stack([value, 1.0 - value], -1))

    def entropy(self):
        return self._dirichlet.entropy()

    @property
    def _natural_params(self):
        return (self.concentration1, self.concentration0)

    def _log_normalizer(self, x, y):
        return T.lgamma(x) + T.lgamma(y) - T.lgamma(x + y)
