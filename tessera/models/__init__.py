"""Standard architectures written with ``tessera.nn``, with the parameter names of
torchvision and Hugging Face so that their ``.safetensors`` weights load without renaming.

Imported on first use (``tessera.models.resnet18``), like ``torchvision.models``:

>>> import tessera.models
>>> m = tessera.models.lenet5(num_classes=10)
"""
from __future__ import annotations

import importlib

# public name -> module under tessera.models that defines it
_WHERE = {
    "LeNet5": "lenet", "lenet5": "lenet",
    "ResNet": "resnet", "BasicBlock": "resnet", "Bottleneck": "resnet",
    "resnet18": "resnet", "resnet34": "resnet", "resnet50": "resnet",
    "MobileNetV2": "mobilenet", "mobilenet_v2": "mobilenet",
    "VGG": "vgg", "vgg11": "vgg", "vgg11_bn": "vgg",
    "InvertedResidual": "mobilenet", "Conv2dNormActivation": "mobilenet",
    "VisionTransformer": "vit", "vit_tiny": "vit",
    "BertConfig": "bert", "BertModel": "bert", "BertOutput": "bert",
    "SentenceEmbedder": "bert", "mean_pool": "bert",
    "WordPieceTokenizer": "tokenizer", "load_tokenizer": "tokenizer",
    "GPTConfig": "gpt2", "GPT": "gpt2", "gpt": "gpt2", "KVCache": "gpt2",
    "DCGANGenerator": "gan", "DCGANDiscriminator": "gan", "dcgan": "gan",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'tessera.models' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"tessera.models.{mod}"), name)
    # importing a submodule sets the package attribute of its name (``dcgan``, ``gpt``):
    # the public function of that name must win, so it is stored last
    globals()[name] = value
    return value


def __dir__():
    return __all__
