"""``tessera.version``: PyTorch's ``torch.version`` fields (no CUDA or ROCm in this build).

>>> import tessera
>>> tessera.version.cuda is None
True
"""
__version__ = "0.1.0"
cuda: str | None = None
hip: str | None = None
xpu: str | None = None
git_version = "unknown"
debug = False
