"""PyTorch's module path ``torch.nn.modules.channelshuffle``: ``ChannelShuffle``
(defined in ``tessera.nn.modules.vision``). The classes' ``__module__`` names this path,
so a pickled model refers to them where PyTorch's pickles do.

>>> from tessera.nn.modules.channelshuffle import ChannelShuffle
>>> ChannelShuffle.__module__
'tessera.nn.modules.channelshuffle'
"""
from tessera.nn.modules.vision import (
    ChannelShuffle,
)

__all__ = ["ChannelShuffle"]

for _cls in (ChannelShuffle,):
    _cls.__module__ = __name__
