"""``Poisson(rate)``: counts of events with mean ``rate``.

>>> import tessera
>>> from tessera.distributions import Poisson
>>> Poisson(tessera.tensor(2.0)).log_prob(tessera.tensor(0.0))
tensor(-2.)
"""
from __future__ import annotations

import numbers

from tessera.distributions import _ops as T, constraints
from tessera.distributions.exp_family import ExponentialFamily
from tessera.distributions.utils import _xlogy, broadcast_all

__all__ = ["Poisson"]


class Poisson(ExponentialFamily):
    """``P(k) = rate^k exp(-rate) / k!`` on the nonnegative integers."""

    arg_constraints = {"rate": constraints.nonnegative}
    support = constraints.nonnegative_integer

    def __init__(self, rate, validate_args=None):
        (self.rate,) = broadcast_all(rate)
        batch = () if isinstance(rate, numbers.Number) else self.rate.size()
        super().__init__(batch, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Poisson, _instance)
        batch_shape = T.Size(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @property
    def mean(self):
        return self.rate

    @property
    def mode(self):
        return self.rate.floor()

    @property
    def variance(self):
        return self.rate

    def sample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        with T.no_grad():
            return T.poisson(self.rate.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        rate, value = broadcast_all(self.rate, value)
        return _xlogy(value, rate) - rate - T.lgamma(value + 1)

    @property
    def _natural_params(self):
        return (T.log(self.rate),)

    def _log_normalizer(self, x):
        return T.exp(x)
