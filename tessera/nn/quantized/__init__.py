"""``torch.nn.quantized``: the path PyTorch keeps for ``torch.ao.nn.quantized``."""
from tessera.ao.nn.quantized import *  # noqa: F403
from tessera.ao.nn.quantized import dynamic  # noqa: F401
