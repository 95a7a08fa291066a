"""Neural-network building blocks: ``Module``, ``Parameter``, layers, losses, ``init`` and
``functional`` — PyTorch's ``torch.nn`` names and behaviour.
"""
from tessera.nn.modules.module import Module, RemovableHandle
from tessera.nn.parameter import Buffer, Parameter

__all__ = ["Module", "Parameter", "Buffer", "RemovableHandle"]
