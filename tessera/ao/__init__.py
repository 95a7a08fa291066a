"""``torch.ao``: quantization (``tessera.ao.quantization``) and the quantized, fused and
quantization-aware modules (``tessera.ao.nn``).

>>> from tessera.ao import quantization as tq
>>> tq.get_default_qat_qconfig("x86").weight.p.keywords["dtype"]
tessera.qint8
"""
