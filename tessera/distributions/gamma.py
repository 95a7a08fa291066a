"""``Gamma(concentration, rate)``, with reparameterised samples (the implicit gradient of
``tessera._standard_gamma``); ``Exponential(rate)``.

>>> import tessera
>>> from tessera.distributions import Gamma
>>> Gamma(tessera.tensor(2.0), tessera.tensor(1.0)).log_prob(tessera.tensor(1.0))
tensor(-1.)
"""
from __future__ import annotations

import numbers

from tessera.distributions import _ops as T, constraints
from tessera.distributions.exp_family import ExponentialFamily
from tessera.distributions.utils import _xlogy, broadcast_all

__all__ = ["Gamma", "Exponential"]


def _tiny_clamped(x):
    """Samples that rounded to 0 raised to the dtype's smallest normal number, so their
    log stays finite."""
    return x.clamp(min=T.finfo(x.dtype).tiny)


class Gamma(ExponentialFamily):
    """The gamma distribution with shape ``concentration`` and inverse scale ``rate``."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, concentration, rate, validate_args=None):
        self.concentration, self.rate = broadcast_all(concentration, rate)
        numbers_only = isinstance(concentration, numbers.Number) and isinstance(
            rate, numbers.Number)
        super().__init__(() if numbers_only else self.concentration.size(),
                         validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Gamma, _instance)
        batch_shape = T.Size(batch_shape)
        new.concentration = self.concentration.expand(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def mode(self):
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self):
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        x = T._standard_gamma(self.concentration.expand(shape)) / self.rate.expand(shape)
        return _tiny_clamped(x.detach()) + (x - x.detach())  # the value clamped, not the grad

    def log_prob(self, value):
        value = value if isinstance(value, T.Tensor) else T.tensor(value,
                                                                   dtype=self.rate.dtype)
        if self._validate_args:
            self._validate_sample(value)
        return (_xlogy(self.concentration, self.rate)
                + _xlogy(self.concentration - 1, value)
                - self.rate * value - T.lgamma(self.concentration))

    def entropy(self):
        a = self.concentration
        return a - T.log(self.rate) + T.lgamma(a) + (1.0 - a) * T.digamma(a)

    @property
    def _natural_params(self):
        return (self.concentration - 1, -self.rate)

    def _log_normalizer(self, x, y):
        return T.lgamma(x + 1) + (x + 1) * T.log(-y.reciprocal())


class Exponential(ExponentialFamily):
    """The exponential distribution with rate ``rate``."""

    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, rate, validate_args=None):
        (self.rate,) = broadcast_all(rate)
        batch = () if isinstance(rate, numbers.Number) else self.rate.size()
        super().__init__(batch, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Exponential, _instance)
        batch_shape = T.Size(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        return self._expanded(new, batch_shape)

    @property
    def mean(self):
        return self.rate.reciprocal()

    @property
    def mode(self):
        return T.zeros_like(self.rate)

    @property
    def stddev(self):
        return self.rate.reciprocal()

    @property
    def variance(self):
        return self.rate.pow(-2)

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        with T.no_grad():
            e = T.empty(shape, dtype=self.rate.dtype).exponential_()
        return e / self.rate

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - T.exp(-self.rate * value)

    def icdf(self, value):
        return -T.log1p(-value) / self.rate

    def entropy(self):
        return 1.0 - T.log(self.rate)

    @property
    def _natural_params(self):
        return (-self.rate,)

    def _log_normalizer(self, x):
        return -T.log(-x)
