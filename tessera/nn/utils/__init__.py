"""``nn.utils``: gradient clipping, parameter/vector conversion and RNN sequence helpers.

>>> import tessera
>>> from tessera.nn.utils import parameters_to_vector
>>> parameters_to_vector([tessera.ones(2), tessera.zeros(1)])
tensor([1., 1., 0.])
"""
from tessera.nn.utils import (
    clip_grad as _clip_grad,
    convert_parameters as _convert_parameters,
    rnn as _rnn,
)
from tessera.nn.utils.clip_grad import *  # noqa: F403
from tessera.nn.utils.convert_parameters import *  # noqa: F403
from tessera.nn.utils.rnn import *  # noqa: F403

__all__: list[str] = _clip_grad.__all__ + _convert_parameters.__all__ + _rnn.__all__
