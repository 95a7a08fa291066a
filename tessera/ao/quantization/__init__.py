"""``torch.ao.quantization``: observers, fake quantization, qconfigs, and the eager-mode
flow (``fuse_modules``, ``prepare``/``prepare_qat``, ``convert``, ``quantize_dynamic``).

>>> from tessera.ao import quantization as tq
>>> type(tq.get_default_qconfig("fbgemm").activation()).__name__
'HistogramObserver'
"""
from tessera.ao.quantization.fake_quantize import *  # noqa: F403
from tessera.ao.quantization.observer import *  # noqa: F403
from tessera.ao.quantization.qconfig import *  # noqa: F403
from tessera.ao.quantization.quantize import *  # noqa: F403
