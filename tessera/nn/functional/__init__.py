"""``tessera.nn.functional``: PyTorch's functional API (activations, conv, pooling, norms,
losses, ...). Each family module here is thin: argument handling and composites over
tessera ops; the ops themselves (with their grad rules) live in ``tessera.ops``. Each
lists its functions in ``__all__``; they are re-exported here.

>>> import tessera
>>> import tessera.nn.functional as F
>>> F.relu(tessera.tensor([-1.0, 2.0]))
tensor([0., 2.])
"""
from tessera.nn.functional import (
    activation as _activation,
    attention as _attention,
    conv as _conv,
    distance as _distance,
    dropout as _dropout,
    linear as _linear,
    loss as _loss,
    norm as _norm,
    pooling as _pooling,
    sparse as _sparse,
    vision as _vision,
)
from tessera.nn.functional.activation import *  # noqa: F403
from tessera.nn.functional.attention import *  # noqa: F403
from tessera.nn.functional.conv import *  # noqa: F403
from tessera.nn.functional.distance import *  # noqa: F403
from tessera.nn.functional.dropout import *  # noqa: F403
from tessera.nn.functional.linear import *  # noqa: F403
from tessera.nn.functional.loss import *  # noqa: F403
from tessera.nn.functional.norm import *  # noqa: F403
from tessera.nn.functional.pooling import *  # noqa: F403
from tessera.nn.functional.sparse import *  # noqa: F403
from tessera.nn.functional.vision import *  # noqa: F403

__all__: list[str] = []
__all__ += _activation.__all__
__all__ += _linear.__all__
__all__ += _conv.__all__
__all__ += _pooling.__all__
__all__ += _vision.__all__
__all__ += _norm.__all__
__all__ += _dropout.__all__
__all__ += _sparse.__all__
__all__ += _loss.__all__
__all__ += _distance.__all__
__all__ += _attention.__all__
