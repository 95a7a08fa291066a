"""``tessera.amp``: automatic mixed precision (PyTorch's ``torch.amp``): ``autocast``
regions and the ``GradScaler``.

>>> import tessera
>>> with tessera.amp.autocast("cpu"):
...     (tessera.ones(2, 2) @ tessera.ones(2, 2)).dtype
tessera.bfloat16
"""
from tessera.amp.autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from tessera.amp.grad_scaler import GradScaler

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available", "GradScaler"]
