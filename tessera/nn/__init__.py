"""Neural-network building blocks: ``Module``, ``Parameter``, layers, losses, ``init`` and
``functional`` — PyTorch's ``torch.nn`` names and behaviour.

Each layer family is a module of ``tessera.nn.modules`` that lists its classes in
``__all__``; they are re-exported here.

>>> from tessera import nn
>>> nn.Sequential(nn.Linear(2, 3), nn.ReLU())[0].weight.shape
tessera.Size([3, 2])
"""
from tessera.nn import functional as functional, init as init, utils as utils
from tessera.nn.graph import Graph, GraphConfig
from tessera.nn.modules import (
    activation as _activation,
    attention as _attention,
    batchnorm as _batchnorm,
    container as _container,
    conv as _conv,
    distance as _distance,
    dropout as _dropout,
    flatten as _flatten,
    linear as _linear,
    loss as _loss,
    normalization as _normalization,
    padding as _padding,
    pooling as _pooling,
    rnn as _rnn,
    sparse as _sparse,
    transformer as _transformer,
    vision as _vision,
)
from tessera.nn.modules.activation import *  # noqa: F403
from tessera.nn.modules.attention import *  # noqa: F403
from tessera.nn.modules.batchnorm import *  # noqa: F403
from tessera.nn.modules.container import *  # noqa: F403
from tessera.nn.modules.conv import *  # noqa: F403
from tessera.nn.modules.distance import *  # noqa: F403
from tessera.nn.modules.dropout import *  # noqa: F403
from tessera.nn.modules.flatten import *  # noqa: F403
from tessera.nn.modules.linear import *  # noqa: F403
from tessera.nn.modules.loss import *  # noqa: F403
from tessera.nn.modules.module import Module, RemovableHandle
from tessera.nn.modules.normalization import *  # noqa: F403
from tessera.nn.modules.padding import *  # noqa: F403
from tessera.nn.modules.pooling import *  # noqa: F403
from tessera.nn.modules.rnn import *  # noqa: F403
from tessera.nn.modules.sparse import *  # noqa: F403
from tessera.nn.modules.transformer import *  # noqa: F403
from tessera.nn.modules.vision import *  # noqa: F403
from tessera.nn.parameter import Buffer, Parameter

__all__ = ["Module", "Parameter", "Buffer", "RemovableHandle", "Graph", "GraphConfig"]
__all__ += _container.__all__
__all__ += _linear.__all__
__all__ += _activation.__all__
__all__ += _conv.__all__
__all__ += _pooling.__all__
__all__ += _padding.__all__
__all__ += _vision.__all__
__all__ += _normalization.__all__
__all__ += _batchnorm.__all__
__all__ += _dropout.__all__
__all__ += _sparse.__all__
__all__ += _flatten.__all__
__all__ += _loss.__all__
__all__ += _distance.__all__
__all__ += _attention.__all__
__all__ += _transformer.__all__
__all__ += _rnn.__all__
