"""``torch.nn.intrinsic``: the path PyTorch keeps for ``torch.ao.nn.intrinsic``."""
from tessera.ao.nn.intrinsic import *  # noqa: F403
