"""Probability distributions with PyTorch's interface (``torch.distributions``), written
with tessera ops, so gradients flow through ``rsample`` and ``log_prob`` by autograd.

``Distribution`` holds the shapes and validation; each distribution defines its
``log_prob``, moments and samplers; ``transforms`` and ``TransformedDistribution`` push
distributions through bijections; ``kl_divergence`` dispatches on the pair of types.

>>> import tessera
>>> from tessera.distributions import Categorical
>>> logits = tessera.zeros(4, requires_grad=True)
>>> d = Categorical(logits=logits)
>>> a = d.sample()
>>> (-d.log_prob(a)).backward(); logits.grad.shape
tessera.Size([4])
"""
from tessera.distributions import constraints, transforms
from tessera.distributions.bernoulli import Bernoulli
from tessera.distributions.categorical import Categorical, OneHotCategorical
from tessera.distributions.dirichlet import Beta, Dirichlet
from tessera.distributions.distribution import Distribution
from tessera.distributions.exp_family import ExponentialFamily
from tessera.distributions.gamma import Exponential, Gamma
from tessera.distributions.independent import Independent
from tessera.distributions.kl import kl_divergence, register_kl
from tessera.distributions.laplace import Laplace
from tessera.distributions.multivariate_normal import MultivariateNormal
from tessera.distributions.normal import Normal
from tessera.distributions.poisson import Poisson
from tessera.distributions.transformed_distribution import LogNormal, TransformedDistribution
from tessera.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    SigmoidTransform,
    TanhTransform,
    Transform,
    identity_transform,
)
from tessera.distributions.uniform import Uniform

__all__ = ["AffineTransform", "Bernoulli", "Beta", "Categorical", "ComposeTransform",
           "Dirichlet", "Distribution", "ExpTransform", "Exponential", "ExponentialFamily",
           "Gamma", "Independent", "Laplace", "LogNormal", "MultivariateNormal", "Normal",
           "OneHotCategorical", "Poisson", "SigmoidTransform", "TanhTransform", "Transform",
           "TransformedDistribution", "Uniform", "constraints", "identity_transform",
           "kl_divergence", "register_kl", "transforms"]
