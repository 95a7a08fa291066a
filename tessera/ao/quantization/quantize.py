"""Eager-mode quantization: ``fuse_modules``, ``prepare``, ``prepare_qat``, ``convert`` and
``quantize_dynamic`` (PyTorch's ``torch.ao.quantization``).

``prepare`` gives each module with a ``qconfig`` an observer of its output
(``activation_post_process``, run by a forward hook); ``prepare_qat`` also swaps layers for
their quantization-aware forms, whose weights are fake-quantized; ``convert`` swaps every
observed module for its quantized form, with the scales and zero points the observers
chose. Inputs become quantized at a ``QuantStub`` and float again at a ``DeQuantStub``.

>>> import tessera
>>> from tessera import nn
>>> from tessera.ao.quantization import get_default_qconfig
>>> m = nn.Sequential(QuantStub(), nn.Linear(4, 3), DeQuantStub()).eval()
>>> m.qconfig = get_default_qconfig("x86")
>>> p = prepare(m); _ = p(tessera.randn(8, 4))
>>> q = convert(p); type(q[1]).__name__, q(tessera.randn(2, 4)).shape
('Linear', tessera.Size([2, 3]))
"""
from __future__ import annotations

import copy
from typing import Any

from tessera import _dtype as D, nn
from tessera.ao.nn import intrinsic as nni, qat as nnqat, quantized as nnq
from tessera.ao.nn.intrinsic import qat as nniqat
from tessera.ao.nn.quantized import dynamic as nnqd
from tessera.ao.quantization.qconfig import QConfigMapping
from tessera.autograd import no_grad
from tessera.ops.creation import zeros_like

__all__ = ["QuantStub", "DeQuantStub", "fuse_modules", "fuse_modules_qat", "prepare",
           "prepare_qat", "convert", "quantize_dynamic", "propagate_qconfig_"]


class QuantStub(nn.Module):
    """Where float values become quantized (an observer before ``convert``)."""

    def __init__(self, qconfig=None):
        super().__init__()
        if qconfig is not None:
            self.qconfig = qconfig

    def forward(self, x):
        return x


class DeQuantStub(nn.Module):
    """Where quantized values become float again."""

    def __init__(self, qconfig=None):
        super().__init__()
        if qconfig is not None:
            self.qconfig = qconfig

    def forward(self, x):
        return x


# ---- fusion -----------------------------------------------------------------------------

def _fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A convolution computing ``bn(conv(x))`` with the batch norm's running statistics."""
    fused = copy.deepcopy(conv)
    with no_grad():
        inv = bn.weight / (bn.running_var + bn.eps).sqrt()
        fused.weight = nn.Parameter(conv.weight * inv.reshape(-1, 1, 1, 1))
        b = conv.bias if conv.bias is not None else zeros_like(bn.running_mean)
        fused.bias = nn.Parameter((b - bn.running_mean) * inv + bn.bias)
    return fused


def _fuse(mods: list, qat: bool) -> nn.Module:
    kinds = tuple(type(m) for m in mods)
    if kinds[:2] == (nn.Conv2d, nn.BatchNorm2d):
        if mods[0].training != mods[1].training:
            raise AssertionError("Conv and BN both must be in the same mode (train or eval).")
        if qat or mods[0].training:  # the batch norm trains on: folded at convert
            return (nni.ConvBnReLU2d if kinds[2:] == (nn.ReLU,) else nni.ConvBn2d)(*mods)
        conv = _fold_bn(mods[0], mods[1])
        return nni.ConvReLU2d(conv, mods[2]) if kinds[2:] == (nn.ReLU,) else conv
    if kinds == (nn.Conv2d, nn.ReLU):
        return nni.ConvReLU2d(*mods)
    if kinds == (nn.Linear, nn.ReLU):
        return nni.LinearReLU(*mods)
    if kinds == (nn.Linear, nn.BatchNorm1d) or len(kinds) < 2:
        pass
    raise RuntimeError(f"fuse_modules: cannot fuse {[k.__name__ for k in kinds]}")


def _get(model: nn.Module, name: str) -> nn.Module:
    for part in name.split("."):
        model = getattr(model, part)
    return model


def _set(model: nn.Module, name: str, mod: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(_get(model, parent) if parent else model, leaf, mod)


def fuse_modules(model: nn.Module, modules_to_fuse, inplace: bool = False,
                 _qat: bool = False) -> nn.Module:
    """Fuse each list of module names (conv+bn, conv+bn+relu, conv+relu, linear+relu) into
    the first; the others become ``Identity``. In eval mode a batch norm folds into its
    convolution; in train mode conv+bn(+relu) become ``ConvBn2d`` (``ConvBnReLU2d``),
    which ``prepare_qat`` trains with the batch norm and ``convert`` folds."""
    if not inplace:
        model = copy.deepcopy(model)
    groups = modules_to_fuse
    if groups and isinstance(groups[0], str):
        groups = [groups]
    for names in groups:
        fused = _fuse([_get(model, n) for n in names], _qat)
        _set(model, names[0], fused)
        for n in names[1:]:
            _set(model, n, nn.Identity())
    return model


def fuse_modules_qat(model: nn.Module, modules_to_fuse, inplace: bool = False) -> nn.Module:
    """``fuse_modules`` for quantization-aware training: conv+bn(+relu) become
    ``ConvBn2d`` (``ConvBnReLU2d``) whatever the mode.

    >>> from tessera import nn
    >>> m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU())
    >>> type(fuse_modules_qat(m, [["0", "1", "2"]])[0]).__name__
    'ConvBnReLU2d'
    """
    return fuse_modules(model, modules_to_fuse, inplace, _qat=True)


# ---- prepare and convert ------------------------------------------------------------------

_OBSERVED = (nn.Linear, nn.Conv2d, nni.ConvReLU2d, nni.LinearReLU, QuantStub,
             nnq.FloatFunctional)
_QAT: dict[type, Any] = {nn.Linear: nnqat.Linear, nn.Conv2d: nnqat.Conv2d,
                         nni.ConvBn2d: nniqat.ConvBn2d, nni.ConvBnReLU2d: nniqat.ConvBnReLU2d}


def propagate_qconfig_(model: nn.Module, qconfig_dict=None) -> None:
    """Give every submodule its parent's ``qconfig`` unless it has its own."""
    mapping = qconfig_dict if isinstance(qconfig_dict, QConfigMapping) else None

    def walk(mod, name, inherited):
        qc = mod.__dict__.get("qconfig", inherited)
        if mapping is not None:
            qc = mapping.lookup(name, mod) or qc
        mod.qconfig = qc
        for child_name, child in mod.named_children():
            walk(child, f"{name}.{child_name}" if name else child_name, qc)
    walk(model, "", getattr(model, "qconfig", None))


def _observe(mod: nn.Module) -> None:
    mod.activation_post_process = mod.qconfig.activation()
    mod._quant_hook = mod.register_forward_hook(
        lambda m, args, out: m.activation_post_process(out))


def prepare(model: nn.Module, inplace: bool = False, qconfig_mapping=None) -> nn.Module:
    """Observers after every module that has a qconfig (post-training calibration)."""
    if not inplace:
        model = copy.deepcopy(model)
    propagate_qconfig_(model, qconfig_mapping)
    for _, mod in list(model.named_modules()):
        if isinstance(mod, _OBSERVED) and getattr(mod, "qconfig", None) is not None:
            if isinstance(mod, nnq.FloatFunctional):
                mod.activation_post_process = mod.qconfig.activation()
            else:
                _observe(mod)
    return model


def prepare_qat(model: nn.Module, mapping=None, inplace: bool = False) -> nn.Module:
    """Quantization-aware forms of the layers (fake-quantized weights) and fake quantizers
    on their outputs."""
    if not inplace:
        model = copy.deepcopy(model)
    propagate_qconfig_(model)
    done: list[str] = []
    for name, mod in list(model.named_modules()):
        qat = _QAT.get(type(mod))
        if any(name.startswith(d + ".") for d in done):
            continue  # inside a module already swapped (a fused ConvBn2d's conv)
        if qat is not None and getattr(mod, "qconfig", None) is not None:
            _set(model, name, qat.from_float(mod))
            done.append(name)
    return prepare(model, inplace=True)


def _quantized_form(mod: nn.Module):
    t = type(mod)
    if t is QuantStub:
        return nnq.Quantize.from_float(mod)
    if t is DeQuantStub:
        return nnq.DeQuantize()
    if t in (nn.Linear, nnqat.Linear, nni.LinearReLU):
        return nnq.Linear.from_float(mod)
    if t in (nn.Conv2d, nnqat.Conv2d, nni.ConvReLU2d):
        return nnq.Conv2d.from_float(mod)
    if t in (nniqat.ConvBn2d, nniqat.ConvBnReLU2d):
        return nnq.Conv2d.from_float(_folded(mod))
    if t is nnq.FloatFunctional:
        return nnq.QFunctional.from_float(mod)
    if t is nn.ReLU:
        return nnq.ReLU()
    if t is nn.MaxPool2d:
        return nnq.MaxPool2d(mod.kernel_size, mod.stride, mod.padding)
    if t is nn.AdaptiveAvgPool2d:
        return nnq.AdaptiveAvgPool2d(mod.output_size)
    if t is nn.Flatten:
        return nnq.Flatten(mod.start_dim, mod.end_dim)
    return None


def _folded(mod):
    """A trained ConvBn2d as the float convolution ``convert`` quantizes: the batch norm
    folded in, with the module's weight fake quantizer and output observer."""
    conv = mod.folded()
    conv.weight_fake_quant = mod.weight_fake_quant
    out = nni.ConvReLU2d(conv, nn.ReLU()) if mod._RELU else conv
    out.qconfig, out.activation_post_process = mod.qconfig, mod.activation_post_process
    return out


def convert(module: nn.Module, mapping=None, inplace: bool = False) -> nn.Module:
    """Every observed module swapped for its quantized form (weights quantized with the
    qconfig's weight observer, outputs with the scale and zero point observed)."""
    if not inplace:
        module = copy.deepcopy(module)
    done: list[str] = []
    for name, mod in list(module.named_modules()):
        if not name or getattr(mod, "qconfig", None) is None or \
                any(name.startswith(d + ".") for d in done):
            continue
        if isinstance(mod, _OBSERVED) and not hasattr(mod, "activation_post_process"):
            continue
        q = _quantized_form(mod)
        if q is not None:
            _set(module, name, q)
            done.append(name)
    return module


def quantize_dynamic(model: nn.Module, qconfig_spec=None, dtype=D.qint8,
                     mapping=None, inplace: bool = False) -> nn.Module:
    """``nn.Linear`` layers (those of ``qconfig_spec``'s types or names) with INT8 weights
    and activations quantized at run time from their own range."""
    if dtype is not D.qint8:
        raise NotImplementedError(f"quantize_dynamic: dtype {dtype} is not supported (qint8)")
    if not inplace:
        model = copy.deepcopy(model)
    spec = qconfig_spec or {nn.Linear}
    for name, mod in list(model.named_modules()):
        if name and type(mod) is nn.Linear and (nn.Linear in spec or name in spec):
            _set(model, name, nnqd.Linear.from_float(mod))
    return model
