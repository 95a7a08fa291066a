"""``MultivariateNormal(loc, covariance_matrix | precision_matrix | scale_tril)``.

Everything is computed from the lower Cholesky factor ``L`` of the covariance, kept
unbroadcast so that a batch of locations sharing one covariance solves with one ``L``.

>>> import tessera
>>> from tessera.distributions import MultivariateNormal
>>> d = MultivariateNormal(tessera.zeros(2), covariance_matrix=tessera.eye(2))
>>> d.log_prob(tessera.zeros(2))
tensor(-1.8379)
"""
from __future__ import annotations

import math

from tessera.distributions import _ops as T, constraints
from tessera.distributions.distribution import Distribution
from tessera.distributions.utils import _standard_normal, lazy_property

__all__ = ["MultivariateNormal"]


def _batch_mv(bmat, bvec):
    """Matrix-vector products over broadcast batch dims."""
    return T.matmul(bmat, bvec.unsqueeze(-1)).squeeze(-1)


def _batch_mahalanobis(L, x):
    """``x^T (L L^T)^-1 x`` for vectors ``x`` (..., n) and factors ``L`` (..., n, n) whose
    batch broadcasts against the trailing batch dims of ``x``. The leading dims that only
    ``x`` has (the sample dims) become the columns of one triangular solve per factor."""
    n = x.shape[-1]
    lead = x.dim() - 1 - (L.dim() - 2)
    if lead <= 0:
        y = T.solve_triangular(L, x.unsqueeze(-1), upper=False).squeeze(-1)
        return y.pow(2).sum(-1)
    sample = tuple(x.shape[:lead])
    batch = tuple(T.broadcast_shapes(tuple(L.shape[:-2]), tuple(x.shape[lead:-1])))
    cols = x.expand(sample + batch + (n,)).reshape((-1,) + batch + (n,))
    cols = cols.movedim(0, -1)                                # batch + (n, S)
    y = T.solve_triangular(L, cols, upper=False)
    return y.pow(2).sum(-2).movedim(-1, 0).reshape(sample + batch)


def _precision_to_scale_tril(P):
    """The lower Cholesky factor of ``P^-1``: with ``J`` the flip of both axes,
    ``chol(J P J)`` flipped back is an upper factor ``U`` with ``P = U U^T``, and
    ``L = U^-T`` is lower with ``L L^T = P^-1``."""
    flipped = T.cholesky(T.flip(P, (-2, -1)))
    inv_l = T.flip(flipped, (-2, -1)).mT   # lower: L^-1
    eye = T.eye(P.shape[-1], dtype=P.dtype)
    return T.solve_triangular(inv_l, eye, upper=False)


class MultivariateNormal(Distribution):
    """A Gaussian over vectors (the last dim of ``loc``), with batch dims broadcast between
    ``loc`` and the matrix."""

    arg_constraints = {"loc": constraints.real_vector,
                       "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite,
                       "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None,
                 validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [(n, m) for n, m in (("covariance_matrix", covariance_matrix),
                                     ("precision_matrix", precision_matrix),
                                     ("scale_tril", scale_tril)) if m is not None]
        if len(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or "
                             "scale_tril may be specified.")
        name, matrix = given[0]
        if matrix.dim() < 2:
            what = "scale_tril matrix" if name == "scale_tril" else name
            raise ValueError(f"{what} must be at least two-dimensional, with optional "
                             "leading batch dimensions")
        batch = T.Size(T.broadcast_shapes(tuple(matrix.shape[:-2]), tuple(loc.shape[:-1])))
        setattr(self, name, matrix.expand(tuple(batch) + (-1, -1)))
        self.loc = loc.expand(tuple(batch) + (-1,))
        super().__init__(batch, self.loc.shape[-1:], validate_args=validate_args)
        if name == "scale_tril":
            self._unbroadcasted_scale_tril = matrix
        elif name == "covariance_matrix":
            self._unbroadcasted_scale_tril = T.linalg_cholesky(matrix)
        else:
            self._unbroadcasted_scale_tril = _precision_to_scale_tril(matrix)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = T.Size(batch_shape)
        n = tuple(self.event_shape)
        new.loc = self.loc.expand(tuple(batch_shape) + n)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, getattr(self, name).expand(tuple(batch_shape) + n + n))
        return self._expanded(new, batch_shape)

    def _full(self, m):
        n = tuple(self._event_shape)
        return m.expand(tuple(self._batch_shape) + n + n)

    @lazy_property
    def scale_tril(self):
        return self._full(self._unbroadcasted_scale_tril)

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return self._full(T.matmul(L, L.mT))

    @lazy_property
    def precision_matrix(self):
        L = self._unbroadcasted_scale_tril
        eye = T.eye(L.shape[-1], dtype=L.dtype)
        inv = T.solve_triangular(L, eye, upper=False)   # L^-1
        return self._full(T.matmul(inv.mT, inv))

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        v = self._unbroadcasted_scale_tril.pow(2).sum(-1)
        return v.expand(tuple(self._batch_shape) + tuple(self._event_shape))

    def rsample(self, sample_shape=()):
        eps = _standard_normal(self._extended_shape(sample_shape), self.loc.dtype)
        return self.loc + _batch_mv(self._unbroadcasted_scale_tril, eps)

    def _half_log_det(self):
        return self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        m = _batch_mahalanobis(self._unbroadcasted_scale_tril, value - self.loc)
        k = self._event_shape[0]
        return -0.5 * (k * math.log(2 * math.pi) + m) - self._half_log_det()

    def entropy(self):
        k = self._event_shape[0]
        h = 0.5 * k * (1.0 + math.log(2 * math.pi)) + self._half_log_det()
        return h if len(self._batch_shape) == 0 else h.expand(tuple(self._batch_shape))
