"""``torch.ao.nn``: quantized (``quantized``), fused (``intrinsic``) and quantization-aware
(``qat``) modules."""
