"""``nn.Module``: the base class of every layer, with PyTorch's registration, state_dict,
hooks, train/eval and device/dtype moves.

>>> import tessera.nn as nn
>>> m = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
>>> [n for n, _ in m.named_parameters()]
['0.weight', '0.bias']
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tessera import _dtype as D
from tessera._tensor import Tensor
from tessera.autograd.grad_mode import no_grad
from tessera.nn.parameter import Buffer, Parameter

_M = TypeVar("_M", bound="Module")  # the fluent methods return the module's own type


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters the hook."""

    _ids = itertools.count()

    def __init__(self, hooks_dict: dict):
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = next(RemovableHandle._ids)

    def remove(self) -> None:
        d = self.hooks_dict_ref()
        if d is not None and self.id in d:
            del d[self.id]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _addindent(s: str, n: int) -> str:
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(" " * n + line for line in lines[1:])


_CALL_WRAPPERS: list = []  # wrappers of every module call (nn.Graph's scopes)

# Moves on every change to a module tree that a compiled nn.Graph depends on: a submodule,
# parameter or buffer assigned, registered or deleted, a ``training`` flag set (``train()``,
# ``eval()``). nn.Graph walks its modules again only when it moved, not on every call.
TREE_EPOCH = [0]


def tree_changed() -> None:
    """Tell compiled nn.Graphs to re-check their modules (for code that edits a module's
    ``_modules``, ``_parameters`` or ``_buffers`` directly).

    >>> before = TREE_EPOCH[0]; tree_changed(); TREE_EPOCH[0] > before
    True
    """
    TREE_EPOCH[0] += 1


_TREE_ATTRS = frozenset(("training", "_modules", "_parameters", "_buffers"))


class Module:
    """Base class for all neural network modules; subclasses define ``forward``."""

    training: bool
    _version: int = 1
    call_super_init: bool = False

    def __init__(self, *args, **kwargs) -> None:
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = {}
        d["_forward_hooks_always_called"] = {}
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_pre_hooks_with_kwargs"] = {}
        d["_backward_hooks"] = OrderedDict()
        d["_backward_pre_hooks"] = OrderedDict()
        d["_state_dict_hooks"] = OrderedDict()
        d["_state_dict_pre_hooks"] = OrderedDict()
        d["_load_state_dict_pre_hooks"] = OrderedDict()
        d["_load_state_dict_post_hooks"] = OrderedDict()

    forward: Callable[..., Any]

    def _forward_unimplemented(self, *input: Any) -> None:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  '"forward" function')

    forward = _forward_unimplemented

    # ---- registration -------------------------------------------------------------------
    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not a parameter (e.g. BatchNorm's running_mean)."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        _check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        if isinstance(tensor, Buffer):
            persistent = tensor.persistent
            tensor = tensor.detach()
        self._buffers[name] = tensor
        TREE_EPOCH[0] += 1
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        _check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter "
                            f"'{name}' (torch.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                             "parameters must be created explicitly.")
        self._parameters[name] = param
        TREE_EPOCH[0] += 1

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        _check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module
        TREE_EPOCH[0] += 1

    register_module = add_module

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in _TREE_ATTRS:
            TREE_EPOCH[0] += 1  # (a parameter, submodule or buffer: in the branches below)
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            _remove_from(self, name, ("_buffers", "_modules"))
            d.pop(name, None)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if d.get("_modules") is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            _remove_from(self, name, ("_parameters", "_buffers"))
            d.pop(name, None)
            self._modules[name] = value
            TREE_EPOCH[0] += 1
        elif d.get("_modules") is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module "
                                f"'{name}' (torch.nn.Module or None expected)")
            self._modules[name] = value
            TREE_EPOCH[0] += 1
        elif isinstance(value, Buffer) or (d.get("_buffers") is not None and
                                           name in d["_buffers"]):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(torch.Tensor or None expected)")
            if isinstance(value, Buffer):
                d.pop(name, None)
                self.register_buffer(name, value, value.persistent)
            else:
                self._buffers[name] = value
                TREE_EPOCH[0] += 1
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in ("_parameters", "_buffers", "_modules"):
            s = self.__dict__.get(store)
            if s is not None and name in s:
                del s[name]
                self._non_persistent_buffers_set.discard(name)
                TREE_EPOCH[0] += 1
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(super().__dir__()) + list(self._parameters) + list(self._modules) + \
            list(self._buffers)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # ---- traversal ----------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, sub, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, m in self._modules.items():
            if m is not None and m not in seen:
                seen.add(m)
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, get, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for k, v in get(m):
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(v))
                yield mprefix + ("." if mprefix else "") + k, v

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse,
                                       remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse,
                                       remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> Module:
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(f"{mod._get_name()} has no attribute `{item}`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{mod._get_name()} has no parameter `{name}`")
        return mod._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._buffers:
            raise AttributeError(f"{mod._get_name()} has no buffer `{name}`")
        return mod._buffers[name]

    # ---- modes --------------------------------------------------------------------------
    def train(self: _M, mode: bool = True) -> _M:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self: _M) -> _M:
        return self.train(False)

    def requires_grad_(self: _M, requires_grad: bool = True) -> _M:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def apply(self: _M, fn: Callable[[Module], None]) -> _M:
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- device and dtype ---------------------------------------------------------------
    def _apply(self: _M, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> _M:
        if recurse:
            for m in self.children():
                m._apply(fn)
        with no_grad():
            for key, p in self._parameters.items():
                if p is None:
                    continue
                new = fn(p)
                if new is not p:
                    p.data = new  # keep the Parameter object: optimizers hold references
                if p.grad is not None:
                    g = fn(p.grad)
                    if g is not p.grad:
                        p.grad = g
            for key, b in self._buffers.items():
                if b is not None:
                    self._buffers[key] = fn(b)
        TREE_EPOCH[0] += 1
        return self

    def to(self: _M, *args, **kwargs) -> _M:
        """``to(device)``, ``to(dtype)`` (floating parameters only), ``to(tensor)``."""
        from tessera import _dtype as D
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        for a in args:
            if isinstance(a, Tensor):
                device, dtype = a.device, a.dtype
            elif isinstance(a, D.dtype):
                dtype = a
            elif a is not None:
                device = a
        if dtype is not None:
            dtype = D.as_dtype(dtype)
            if not (dtype.is_floating_point or dtype.is_complex):
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, "
                                f"but got desired dtype={dtype}")

        def convert(t: Tensor) -> Tensor:
            out = t
            if dtype is not None and (t.is_floating_point() or t.is_complex()):
                out = out.to(dtype)
            if device is not None:
                out = out.to(device)
            return out
        return self._apply(convert)

    def cpu(self: _M) -> _M:
        return self.to("cpu")

    def to_global(self, placement=None, sbp=None) -> Module:
        """Parameters and buffers become global tensors in place (OneFlow's): a local one
        is the whole value (the placement's first rank's copy), boxed to ``sbp``, which may
        be a callable ``sbp(tensor)``; see ``tessera.distributed._module``.

        >>> import tessera
        >>> m = tessera.nn.Linear(2, 3)
        >>> m.to_global(tessera.placement("cpu", ranks=[0]), tessera.sbp.broadcast).weight.sbp
        (tessera.sbp.broadcast,)
        """
        from tessera.distributed._module import module_to_global
        return module_to_global(self, placement, sbp)

    def type(self: _M, dst_type) -> _M:
        return self._apply(lambda t: t.type(dst_type))

    def float(self: _M) -> _M:
        return self._apply(lambda t: t.to(D.float32) if t.is_floating_point() else t)

    def double(self: _M) -> _M:
        return self._apply(lambda t: t.to(D.float64) if t.is_floating_point() else t)

    def half(self: _M) -> _M:
        return self._apply(lambda t: t.to(D.float16) if t.is_floating_point() else t)

    def bfloat16(self: _M) -> _M:
        return self._apply(lambda t: t.to(D.bfloat16) if t.is_floating_point() else t)

    def share_memory(self: _M) -> _M:
        """Moves every parameter and buffer into shared memory (``Tensor.share_memory_``),
        so processes given this module update one set of weights (Hogwild).

        >>> import tessera
        >>> tessera.nn.Linear(2, 2).share_memory().weight.is_shared()
        True
        """
        return self._apply(lambda t: t.share_memory_())

    def cuda(self: _M, device=None) -> _M:
        return self._apply(lambda t: t.cuda(device))

    def xpu(self: _M, device=None) -> _M:
        return self._apply(lambda t: t.xpu(device))

    def ipu(self: _M, device=None) -> _M:
        return self._apply(lambda t: t.ipu(device))

    # ---- calling and hooks --------------------------------------------------------------
    def _call_impl(self, *args, **kwargs):
        if _CALL_WRAPPERS:  # nn.Graph tracing names nodes after module paths
            return _CALL_WRAPPERS[-1](self, self._call_inner, args, kwargs)
        return self._call_inner(*args, **kwargs)

    def _call_inner(self, *args, **kwargs):
        d = self.__dict__
        if not (d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_hooks"] or
                d["_backward_pre_hooks"]):
            return self.forward(*args, **kwargs)
        from tessera.nn.modules._hooks import call_with_hooks
        return call_with_hooks(self, args, kwargs)

    __call__ = _call_impl

    def register_forward_pre_hook(self, hook, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """``hook(module, args) -> None | new args`` runs before ``forward``."""
        h = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[h.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """``hook(module, args, output) -> None | new output`` runs after ``forward``."""
        h = RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[h.id] = True
        if always_call:
            self._forward_hooks_always_called[h.id] = True
        if prepend:
            self._forward_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_input, grad_output) -> None | new grad_input``."""
        h = RemovableHandle(self._backward_hooks)
        self._backward_hooks[h.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """``hook(module, grad_output) -> None | new grad_output``."""
        h = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[h.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_backward_hook(self, hook) -> RemovableHandle:
        return self.register_full_backward_hook(hook)

    # ---- state dict ---------------------------------------------------------------------
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """Parameters and persistent buffers by dotted name (detached, sharing storage)."""
        if args:  # PyTorch's deprecated positional form (destination, prefix, keep_vars)
            destination = args[0]
            prefix = args[1] if len(args) > 1 else prefix
            keep_vars = args[2] if len(args) > 2 else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = {"version": self._version}
        meta = getattr(destination, "_metadata", None)
        if meta is not None:
            meta[prefix[:-1]] = local_metadata
        for pre in self._state_dict_pre_hooks.values():
            pre(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".",
                             keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            res = hook(self, destination, prefix, local_metadata)
            if getattr(hook, "_from_public_api", False):
                if res is not None:
                    raise RuntimeError("state_dict post-hook must return None")
            elif res is not None:  # the private hook's old protocol: a new dict
                destination = res
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        # PyTorch's signature: ``assign`` travels in the metadata, so overrides written for
        # PyTorch (seven arguments) work unchanged
        assign = local_metadata.get("assign_to_params_buffers", False)
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items())
                 if v is not None}
        for name, param in local.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                from tessera.ops.creation import as_tensor
                try:
                    value = as_tensor(value)
                except Exception:
                    error_msgs.append(f'While copying the parameter named "{key}", expected '
                                      f"torch.Tensor or Tensor-like object from checkpoint but "
                                      f"received {type(value)}")
                    continue
            if tuple(value.shape) != tuple(param.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{value.shape} from checkpoint, the shape in current model "
                                  f"is {param.shape}.")
                continue
            with no_grad():
                if assign:
                    if name in self._parameters:
                        setattr(self, name, Parameter(value, param.requires_grad))
                    else:
                        self._buffers[name] = value
                        TREE_EPOCH[0] += 1
                else:
                    param.copy_(value)
        if strict:
            for key in state_dict:
                if key.startswith(prefix):
                    rest = key[len(prefix):]
                    head = rest.split(".", 1)[0]
                    if head not in self._modules and rest not in local:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Copy parameters and buffers from ``state_dict``; PyTorch's errors on mismatch."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing: list[str] = []
        unexpected: list[str] = []
        errors: list[str] = []
        metadata = getattr(state_dict, "_metadata", None)

        def load(module: Module, prefix: str = "") -> None:
            local_meta = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_meta["assign_to_params_buffers"] = True
            module._load_from_state_dict(state_dict, prefix, local_meta, True, missing,
                                         unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, prefix + name + ".")
            # post hooks may edit the key lists in place (before strict decides)
            keys = _IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                if hook(module, keys) is not None:
                    raise RuntimeError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not "
                        "expected to return new values, if incompatible_keys need to be "
                        "modified, it should be done inplace.")
        load(self)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: " +
                              ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " +
                              ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {self._get_name()}:\n\t" +
                               "\n\t".join(errors))
        return _IncompatibleKeys(missing, unexpected)

    def register_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, prefix, keep_vars) -> None`` runs before ``state_dict`` collects.

        >>> m = tessera.nn.Linear(2, 2)
        >>> h = m.register_state_dict_pre_hook(lambda mod, prefix, keep: None); h.remove()
        """
        h = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[h.id] = hook
        return h

    def register_state_dict_post_hook(self, hook) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata) -> None`` may edit the
        collected ``state_dict`` in place (returning anything else is an error).

        >>> m = tessera.nn.Linear(2, 2)
        >>> _ = m.register_state_dict_post_hook(lambda mod, sd, p, meta: sd.__delitem__("bias"))
        >>> list(m.state_dict())
        ['weight']
        """
        hook._from_public_api = True
        return self._register_state_dict_hook(hook)

    def register_load_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
        unexpected_keys, error_msgs) -> None`` runs before this module loads its entries.

        >>> m = tessera.nn.Linear(2, 2)
        >>> h = m.register_load_state_dict_pre_hook(lambda mod, sd, *rest: None); h.remove()
        """
        return self._register_load_state_dict_pre_hook(hook, with_module=True)

    def register_load_state_dict_post_hook(self, hook) -> RemovableHandle:
        """``hook(module, incompatible_keys) -> None`` runs after this module and its children
        loaded; it may remove entries from ``incompatible_keys.missing_keys`` /
        ``unexpected_keys`` in place before ``strict`` turns them into an error.

        >>> m = tessera.nn.Linear(2, 2)
        >>> h = m.register_load_state_dict_post_hook(lambda mod, keys: None); h.remove()
        """
        h = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[h.id] = hook
        return h

    def _register_state_dict_hook(self, hook) -> RemovableHandle:
        h = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[h.id] = hook
        return h

    def _register_load_state_dict_pre_hook(self, hook, with_module: bool = False):
        h = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[h.id] = \
            (lambda *a: hook(self, *a)) if with_module else hook
        return h

    # ---- printing -----------------------------------------------------------------------
    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        for key, module in self._modules.items():
            mod_str = _addindent(repr(module), 2)
            lines.append("(" + key + "): " + mod_str)
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _check_name(name: str, kind: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain "."')
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')


def _remove_from(module: Module, name: str, stores) -> None:
    for s in stores:
        d = module.__dict__.get(s)
        if d is not None and name in d:
            del d[name]
