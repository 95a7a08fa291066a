"""The Tensor: metadata (shape, dtype, device), a device array, and its autograd identity.

Every method that computes is one ``dispatch`` call (through the functions in
``tessera.ops``); this file holds the metadata, autograd and conversion surface.

>>> import tessera
>>> x = tessera.arange(6).view(2, 3)
>>> x.t().is_contiguous(), x.stride()
(False, (3, 1))
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tessera import _dtype as D
from tessera._tensor_methods import _OPS, TensorMethods
from tessera.autograd import graph as _autograd_graph
from tessera.autograd.grad_mode import STATE
from tessera.autograd.graph import AccumulateGrad, Node
from tessera.device.registry import _BACKENDS, Unavailable, device
from tessera.ops.registry import Meta


class _Named:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"tessera.{self.name}"

    def __reduce__(self):
        return self.name


class layout(_Named):
    """A tensor's memory layout: ``tessera.strided`` (dense), or ``tessera.sparse_coo``
    (``tessera.sparse_coo_tensor``); the other names exist for code that compares them."""

    __slots__ = ()


class memory_format(_Named):
    """``tessera.contiguous_format``, ``channels_last``...: accepted where PyTorch takes a
    ``memory_format``; tessera keeps row-major strides."""

    __slots__ = ()


strided, sparse_coo, sparse_csr, sparse_csc, sparse_bsr, sparse_bsc, _mkldnn, jagged = (
    layout(n) for n in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                        "sparse_bsc", "_mkldnn", "jagged"))
contiguous_format, channels_last, channels_last_3d, preserve_format = (
    memory_format(n) for n in ("contiguous_format", "channels_last", "channels_last_3d",
                               "preserve_format"))


class Size(tuple):
    """``tensor.shape``: a tuple of ints that prints like PyTorch's ``torch.Size``.

    Slices, sums and repeats stay ``Size``, as in PyTorch (``x.shape[:-1] + (4,)``).
    """

    def __repr__(self) -> str:
        return f"tessera.Size({list(self)})"

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return Size(out) if isinstance(key, slice) else out

    def __add__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(self, other))

    def __radd__(self, other):
        if not isinstance(other, tuple):
            return NotImplemented
        return Size(tuple.__add__(other, self))

    def __mul__(self, n):
        return Size(tuple.__mul__(self, n))

    __rmul__ = __mul__

    def __reduce__(self):
        return (Size, (tuple(self),))

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n


# operator name -> (OpDef, attrs): ``tensor + tensor`` and ``tensor * number`` go straight to
# dispatch (filled by the op modules; what ``add(a, b)`` would dispatch, minus two calls)
FAST_OPERATORS: dict = {}


def _array_operand(name: str):
    """The operator ``name`` of ``TensorMethods``, also taking a NumPy array operand.

    PyTorch computes ``tensor + ndarray`` through NumPy, so the result has NumPy's common
    dtype of the two; here both operands are cast to it and the tessera op runs (keeping
    autograd). In-place operators keep ``self``'s dtype.
    """
    base = getattr(TensorMethods, name)
    inplace = name.startswith("__i")

    def method(self, other):
        t = type(other)
        if t is Tensor or t is float or t is int:  # the common cases, first
            fast = FAST_OPERATORS.get(name)
            if fast is not None:
                return _dispatch(fast[0], self, other, **fast[1])
            return base(self, other)
        if isinstance(other, np.generic):  # a NumPy scalar acts as the Python number
            other = other.item()
        elif isinstance(other, np.ndarray):
            other = Tensor._from_numpy(np.ascontiguousarray(other)).to(self._device)
            if not inplace:
                try:
                    common = D.from_numpy_dtype(np.result_type(self._dtype.np, other._dtype.np))
                except TypeError:  # e.g. bfloat16, which NumPy cannot promote
                    common = D.promote_types(self._dtype, other._dtype)
                self, other = self.to(common), other.to(common)
        return base(self, other)
    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    return method


class Tensor(TensorMethods):
    """A multi-dimensional array with autograd, like ``torch.Tensor``.

    >>> import tessera
    >>> t = tessera.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    >>> (t * t).sum().backward(); t.grad
    tensor([[2., 4.],
            [6., 8.]])
    """

    # Every tensor sets these in ``_make``; the fields below them are class-level defaults
    # that few tensors override (in their ``__dict__``), so making a tensor stays cheap.
    __slots__ = ("_data", "_shape", "_dtype", "_device", "_requires_grad", "grad_fn",
                 "_output_nr", "_version", "__dict__", "__weakref__")
    _data: Any              # the device array (None on 'meta')
    _shape: tuple[int, ...]
    _dtype: D.dtype
    _device: device
    _requires_grad: bool
    grad_fn: Node | None
    _output_nr: int
    _version: list[int]  # a counter shared by views and detached copies
    _grad: Tensor | None = None
    _base: Tensor | None = None    # the tensor whose storage a view shares
    _view_chain: tuple = ()        # the view ops that made this view from _base
    _view_version = 0              # _version when the view's history was last taken
    _grad_acc: weakref.ref[AccumulateGrad] | None = None
    _hooks: list[Callable] | None = None
    _retains_grad = False
    _inference = False
    # (index, node name) of a split/unbind output made under autograd
    _multi_view: tuple[int, str] | None = None

    # ---- construction ---------------------------------------------------------------
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        # ``tessera.Tensor([1, 2])`` / ``Tensor(2, 3)`` as in PyTorch: float data or shape
        if not args:
            args = (0,)
        if len(args) == 1 and isinstance(args[0], (list, tuple, np.ndarray, Tensor)) and \
                not isinstance(args[0], Size):
            src = _OPS["tensor"](args[0], dtype=D.get_default_dtype())
        else:
            src = _OPS["empty"](*args, **kwargs)
        self._adopt(src)

    def _adopt(self, src: Tensor) -> None:
        for k in Tensor.__slots__[:-2]:
            object.__setattr__(self, k, getattr(src, k))
        self.__dict__.update(src.__dict__)

    @staticmethod
    def _make(data, dtype: D.dtype, dev: device, shape: tuple) -> Tensor:
        t = object.__new__(Tensor)
        if dev.type == "cpu":
            dev = _CPU  # one CPU object (tensors on 'cpu:0' report 'cpu', as in PyTorch)
        t._data = data
        t._shape = shape
        t._dtype = dtype
        t._device = dev
        t._requires_grad = False
        t.grad_fn = None
        t._output_nr = 0
        t._version = [0]
        if STATE.inference:
            t._inference = True
        return t

    @staticmethod
    def _from_numpy(arr: np.ndarray, dev: device | None = None) -> Tensor:
        dev = dev or _CPU
        dt = D.from_numpy_dtype(arr.dtype)
        data = _BACKENDS[dev.type].from_numpy(arr, dev.index)
        return Tensor._make(data, dt, dev, tuple(arr.shape))

    # ---- metadata ---------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._shape)

    def size(self, dim: int | None = None, *, axis=None):
        dim = dim if axis is None else axis
        if dim is None:
            return Size(self._shape)
        return self._shape[_wrap_dim(dim, len(self._shape), "size")]

    @property
    def dtype(self) -> D.dtype:
        return self._dtype

    @property
    def device(self) -> device:
        return self._device

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    ndimension = dim

    def numel(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    nelement = numel

    def element_size(self) -> int:
        return self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    @property
    def is_meta(self) -> bool:
        return self._device.type == "meta"

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self._device.type == "cpu"

    # PyTorch's other device and layout flags: tessera tensors are dense and strided, and
    # live on the CPU, the meta device, a plug-in device or as global tensors
    is_xpu = property(lambda self: self._device.type == "xpu")
    is_ipu = property(lambda self: self._device.type == "ipu")
    is_mps = property(lambda self: self._device.type == "mps")
    is_mtia = property(lambda self: self._device.type == "mtia")
    is_maia = property(lambda self: self._device.type == "maia")
    is_xla = property(lambda self: self._device.type == "xla")
    is_vulkan = property(lambda self: self._device.type == "vulkan")
    is_sparse = is_sparse_csr = is_quantized = is_mkldnn = is_nested = property(
        lambda self: False)

    @property
    def layout(self) -> layout:
        return strided

    def is_neg(self) -> bool:
        return False

    def dequantize(self) -> Tensor:
        """The float values: a tensor that is not quantized is its own (a ``QTensor``
        overrides this).

        >>> import tessera
        >>> t = tessera.ones(2); t.dequantize() is t, t.is_quantized
        (True, False)
        """
        return self

    def is_conj(self) -> bool:
        return False

    def is_distributed(self) -> bool:
        return False

    def is_pinned(self, device=None) -> bool:
        return False

    def is_signed(self) -> bool:
        return self._dtype.is_signed

    def is_same_size(self, other: Tensor) -> bool:
        return self._shape == other._shape

    def is_set_to(self, tensor: Tensor) -> bool:
        """Whether both tensors view the same storage with the same offset, shape and
        strides."""
        return (self.untyped_storage() is tensor.untyped_storage() and
                self._shape == tensor._shape and self.stride() == tensor.stride() and
                self.data_ptr() == tensor.data_ptr())

    def is_nonzero(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError("Boolean value of Tensor with "
                               f"{'no values' if self.numel() == 0 else 'more than one value'}"
                               " is ambiguous")
        return bool(self.item())

    def is_coalesced(self) -> bool:
        raise RuntimeError("is_coalesced expected sparse coordinate tensor layout but got "
                           "Strided")

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    def is_complex(self) -> bool:
        return self._dtype.is_complex

    def is_inference(self) -> bool:
        return self._inference

    def get_device(self) -> int:
        return -1 if self._device.type == "cpu" else (self._device.index or 0)

    def meta(self) -> Meta:
        return Meta(self._shape, self._dtype)

    def stride(self, dim: int | None = None, *, axis=None):
        dim = dim if axis is None else axis
        if self._data is None or self.numel() == 0:  # NumPy gives empty arrays 0 strides
            st = _contiguous_strides(self._shape)
        else:
            st = _BACKENDS[self._device.type].strides(self._data)
        if dim is None:
            return st
        return st[_wrap_dim(dim, len(self._shape), "stride")]

    def is_contiguous(self, memory_format=None) -> bool:
        if self._data is None or self.numel() == 0:
            return True
        st = self.stride()
        expected = 1
        for size, s in zip(reversed(self._shape), reversed(st)):
            if size != 1 and s != expected:
                return False
            expected *= size
        return True

    def storage_offset(self) -> int:
        if self._base is None or self._data is None:
            return 0
        base = self._base._data
        off = self._data.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return off // self._dtype.itemsize

    def data_ptr(self) -> int:
        return 0 if self._data is None else self._data.__array_interface__["data"][0]

    def untyped_storage(self):
        return self._base._data if self._base is not None else self._data

    # ---- global tensors (tessera.distributed) ------------------------------------------
    # A global tensor has the logical shape, a 'global' device (that knows the placement, so
    # factories given ``device=x.device`` make global tensors too) and a GlobalData (this
    # rank's tile, placement, sbp) as its data; dispatch hands its ops to tessera.distributed.
    @property
    def is_global(self) -> bool:
        return self._device.type == "global"

    @property
    def is_local(self) -> bool:
        return self._device.type != "global"

    @property
    def placement(self):
        """The ``tessera.placement`` of a global tensor."""
        if self._device.type != "global":
            raise RuntimeError("Only global tensors have 'placement'. Please use '.device' "
                               "for local tensors.")
        return self._data.placement

    @property
    def sbp(self) -> tuple:
        """The SBP of a global tensor: one ``tessera.sbp`` value per mesh axis."""
        if self._device.type != "global":
            raise RuntimeError("Only global tensors have 'sbp'. Please use '.to_global()' to "
                               "make a global tensor.")
        return self._data.sbp

    def to_global(self, placement=None, sbp=None, **kwargs) -> Tensor:
        """This tensor as a global tensor: a local tensor is this rank's tile of the whole;
        a global tensor is converted (boxing) to the new placement and/or SBP.

        >>> import tessera
        >>> p = tessera.placement("cpu", ranks=[0])
        >>> tessera.ones(2).to_global(p, tessera.sbp.broadcast).sbp
        (tessera.sbp.broadcast,)
        """
        return _OPS["to_global"](self, placement, sbp, **kwargs)

    def to_local(self) -> Tensor:
        """This rank's tile of a global tensor (shares memory); a local tensor as it is."""
        return _OPS["to_local"](self)

    # ---- autograd surface -------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        if flag is not True and flag is not False:
            raise RuntimeError("requires_grad must be a bool")
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad is not True and requires_grad is not False:  # not a truthy "no"
            raise TypeError("requires_grad_(): argument 'requires_grad' (position 1) must be "
                            f"bool, not {D.type_name(requires_grad)}")
        if self.grad_fn is not None:
            if not requires_grad:
                raise RuntimeError("you can only change requires_grad flags of leaf variables. "
                                   "If you want to use a computed variable in a subgraph that "
                                   "doesn't require differentiation use "
                                   "var_no_grad = var.detach().")
            return self
        if requires_grad and not (self._dtype.is_floating_point or self._dtype.is_complex):
            raise RuntimeError("only Tensors of floating point and complex dtype can require "
                               f"gradients (got {self._dtype})")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient accumulated by ``backward`` (leaves, and non-leaves that
        ``retain_grad()``)."""
        g = self._grad
        if g is None and self.grad_fn is not None and not self._retains_grad:
            warnings.warn(_NON_LEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        return g

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError("assigned grad expected to be a Tensor or None but got grad of "
                                f"type {type(value).__name__}")
            if value._shape != self._shape:
                raise RuntimeError(f"attempting to assign a gradient of size "
                                   f"'{list(value._shape)}' to a tensor of size "
                                   f"'{list(self._shape)}'. Please ensure that the gradient "
                                   "and the tensor are the same size")
            if value._dtype is not self._dtype:
                raise RuntimeError(f"attempting to assign a gradient with dtype "
                                   f"'{value._dtype}' to a tensor with dtype '{self._dtype}'. "
                                   "The gradient must match the tensor's dtype")
            if value._device != self._device:
                raise RuntimeError(f"attempting to assign a gradient with device type "
                                   f"'{value._device.type}' to a tensor with device type "
                                   f"'{self._device.type}'. Please ensure that the gradient "
                                   "and the tensor are on the same device")
        self._grad = value

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    @property
    def output_nr(self) -> int:
        return self._output_nr

    @property
    def _version_value(self) -> int:
        return self._version[0]

    def _grad_accumulator(self):
        acc = self._grad_acc() if self._grad_acc is not None else None
        if acc is None:
            acc = AccumulateGrad(self)
            self._grad_acc = weakref.ref(acc)
        return acc

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``."""
        _OPS["backward"](self, gradient, retain_graph, create_graph, inputs=inputs)

    def register_hook(self, hook):
        """``hook(grad) -> grad or None`` runs when this tensor's gradient is computed."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = []
            from tessera.autograd.graph import _Handle
            self._hooks.append(hook)
            return _Handle(self._hooks, hook)
        return self.grad_fn.add_pre_hook(self._output_nr, hook)

    def register_post_accumulate_grad_hook(self, hook):
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf "
                               "tensors")
        hooks = self.__dict__.setdefault("_post_accumulate_hooks", [])
        hooks.append(hook)
        from tessera.autograd.graph import _Handle
        return _Handle(hooks, hook)

    def retain_grad(self) -> None:
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is not None and not self._retains_grad:
            self.grad_fn.retain(self._output_nr, self)
        self._retains_grad = self.grad_fn is not None or self._retains_grad

    def detach(self) -> Tensor:
        """A tensor sharing storage with ``self``, cut from the autograd graph."""
        t = Tensor._make(self._data, self._dtype, self._device, self._shape)
        t._version = self._version  # shares the version counter, not the history
        return t

    def detach_(self) -> Tensor:
        if self._base is not None and self._base._requires_grad:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, other: Tensor) -> None:
        if not isinstance(other, Tensor):
            raise TypeError(f"data must be a Tensor, got {type(other).__name__}")
        self._data, self._shape, self._dtype = other._data, other._shape, other._dtype
        self._device = other._device
        self._version = [0]
        DATA_SWAPS[0] += 1
        self._base = None
        self._view_chain = ()

    # ---- conversion -------------------------------------------------------------------
    def numpy(self, *, force: bool = False) -> np.ndarray:
        """The data as a NumPy array, sharing memory on the CPU."""
        if self._device.type not in _HOST_READABLE and not force:
            raise TypeError(f"can't convert {self._device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        if self._requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        return self._to_numpy()

    def _to_numpy(self) -> np.ndarray:
        if self._data is None:
            raise NotImplementedError(f"Cannot copy out of {self._device.type} tensor; no data!")
        return _BACKENDS[self._device.type].to_numpy(self._data)

    def __array__(self, dtype=None, copy=None):
        if self._device.type not in _HOST_READABLE:
            raise TypeError(f"can't convert {self._device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        a = self._to_numpy()
        return a.astype(dtype) if dtype is not None else a

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to "
                               "Scalar")
        if self._data is None:
            raise RuntimeError(f"Tensor.item() cannot be called on {self._device.type} tensors")
        return self._to_numpy().reshape(()).item()

    def tolist(self):
        a = self._to_numpy()
        return a.tolist() if self._dtype is not D.bfloat16 else a.astype(np.float32).tolist()

    def __bool__(self) -> bool:
        n = self.numel()
        if n != 1:
            what = "no values" if n == 0 else "more than one value"
            raise RuntimeError(f"Boolean value of Tensor with {what} is ambiguous")
        return bool(self.item())

    def _scalar(self):
        if self.numel() != 1:  # PyTorch: ValueError here, RuntimeError from item()
            raise ValueError("only one element tensors can be converted to Python scalars "
                             f"(got a tensor of shape {list(self._shape)})")
        return self.item()

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __complex__(self) -> complex:
        return complex(self._scalar())

    def __index__(self) -> int:
        if self._dtype.category != 1 or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an "
                            "index")
        return int(self.item())

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        if "unbind" in _OPS:
            return iter(_OPS["unbind"](self, 0))
        return (self[i] for i in range(self._shape[0]))

    def __hash__(self) -> int:
        return id(self)

    # ---- NumPy interop ------------------------------------------------------------------
    # NumPy scalars and arrays on the left of an operator defer to the Tensor's reflected
    # operator (``np.float32(2) * t`` is a Tensor with autograd, as in PyTorch), and NumPy
    # functions applied to a Tensor give a Tensor back (``np.exp(t)``).
    __array_priority__ = 1000

    def __array_wrap__(self, array, context=None, return_scalar=False):
        return Tensor._from_numpy(np.asarray(array))

    __add__ = _array_operand("__add__")
    __radd__ = _array_operand("__radd__")
    __sub__ = _array_operand("__sub__")
    __rsub__ = _array_operand("__rsub__")
    __mul__ = _array_operand("__mul__")
    __rmul__ = _array_operand("__rmul__")
    __truediv__ = _array_operand("__truediv__")
    __rtruediv__ = _array_operand("__rtruediv__")
    __floordiv__ = _array_operand("__floordiv__")
    __rfloordiv__ = _array_operand("__rfloordiv__")
    __mod__ = _array_operand("__mod__")
    __rmod__ = _array_operand("__rmod__")
    __pow__ = _array_operand("__pow__")
    __rpow__ = _array_operand("__rpow__")
    __matmul__ = _array_operand("__matmul__")
    __rmatmul__ = _array_operand("__rmatmul__")
    __and__ = _array_operand("__and__")
    __rand__ = _array_operand("__rand__")
    __or__ = _array_operand("__or__")
    __ror__ = _array_operand("__ror__")
    __xor__ = _array_operand("__xor__")
    __rxor__ = _array_operand("__rxor__")
    __eq__ = _array_operand("__eq__")
    __ne__ = _array_operand("__ne__")
    __lt__ = _array_operand("__lt__")
    __le__ = _array_operand("__le__")
    __gt__ = _array_operand("__gt__")
    __ge__ = _array_operand("__ge__")
    __iadd__ = _array_operand("__iadd__")
    __isub__ = _array_operand("__isub__")
    __imul__ = _array_operand("__imul__")
    __itruediv__ = _array_operand("__itruediv__")

    def __repr__(self) -> str:
        from tessera._tensor_str import tensor_repr
        return tensor_repr(self)

    def __format__(self, spec: str) -> str:
        if self._shape == () and self._data is not None:
            return self.item().__format__(spec)
        return repr(self)

    def __reduce_ex__(self, proto):
        return (_OPS["_rebuild_tensor"], (self.detach()._to_numpy().copy()
                                  if self._data is not None else None,
                                  self._dtype.name, str(self._device), self._shape,
                                  self._requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) "
                               "support the deepcopy protocol at the moment.")
        new = self.clone().detach().requires_grad_(self._requires_grad)
        if type(self) is not Tensor:
            new = type(self).__new__(type(self), new, self._requires_grad)
            if not hasattr(new, "_data"):
                new._adopt(self.clone().detach().requires_grad_(self._requires_grad))
        if self.grad is not None:
            new.grad = self.grad.clone()
        new.__dict__.update({k: v for k, v in self.__dict__.items()})
        memo[id(self)] = new
        return new

    # ---- device and dtype moves ----------------------------------------------------------
    def to(self, *args, **kwargs) -> Tensor:
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(other)``; ``copy=``."""
        dev, dt = kwargs.pop("device", None), kwargs.pop("dtype", None)
        copy = kwargs.pop("copy", False)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {list(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dev, dt = a._device, a._dtype
            elif isinstance(a, D.dtype) or a in (float, int, bool):
                dt = D.as_dtype(a)
            elif a is not None:
                dev = a
        out = self
        if dt is not None:
            dt = D.as_dtype(dt)
            if dt is not self._dtype:
                out = _OPS["cast"](out, dt)
        if dev is not None:
            dev = device(dev)
            if dev != self._device:
                out = _OPS["to_device"](out, dev)
        if copy and out is self:
            out = self.clone()
        return out

    def cpu(self, memory_format=None) -> Tensor:
        return self.to("cpu")

    def cuda(self, device=None, non_blocking: bool = False, memory_format=None) -> Tensor:
        """``self`` on a CUDA device: raises PyTorch's CPU-build error unless a ``cuda``
        backend is registered (``tessera.register_device``)."""
        return self.to(_accelerator_device("cuda", device))

    def xpu(self, device=None, non_blocking: bool = False, memory_format=None) -> Tensor:
        return self.to(_accelerator_device("xpu", device))

    def ipu(self, device=None, non_blocking: bool = False, memory_format=None) -> Tensor:
        return self.to(_accelerator_device("ipu", device))

    def pin_memory(self, device=None) -> Tensor:
        raise RuntimeError("Cannot access accelerator device when none is available.")

    def type(self, dtype=None, non_blocking: bool = False):
        """``'tessera.FloatTensor'`` with no argument, else ``self`` cast to ``dtype`` (a
        dtype or a type name such as ``'torch.LongTensor'``)."""
        if dtype is None:
            prefix = "tessera." if self._device.type == "cpu" else f"tessera.{self._device.type}."
            return prefix + _TYPE_NAMES.get(self._dtype.name, self._dtype.name)
        dev = None
        if isinstance(dtype, str):
            head, _, name = dtype.rpartition(".")
            dev = "cuda" if head.endswith(".cuda") else "cpu"
            for dt_name, type_name in _TYPE_NAMES.items():
                if name == type_name and head.partition(".")[0] in ("torch", "tessera"):
                    dtype = D.as_dtype(dt_name)
                    break
            else:
                raise ValueError(f"invalid type: '{dtype}'")
        elif hasattr(dtype, "device_type"):  # a legacy type: tessera.LongTensor
            dtype, dev = dtype.dtype, dtype.device_type
        out = self.to(D.as_dtype(dtype))
        return out if dev is None else out.to(dev)

    def type_as(self, other: Tensor) -> Tensor:
        return self.to(other._dtype)

    def float(self) -> Tensor:
        return self.to(D.float32)

    def double(self) -> Tensor:
        return self.to(D.float64)

    def half(self) -> Tensor:
        return self.to(D.float16)

    def bfloat16(self) -> Tensor:
        return self.to(D.bfloat16)

    def int(self) -> Tensor:
        return self.to(D.int32)

    def long(self) -> Tensor:
        return self.to(D.int64)

    def short(self) -> Tensor:
        return self.to(D.int16)

    def char(self) -> Tensor:
        return self.to(D.int8)

    def byte(self) -> Tensor:
        return self.to(D.uint8)

    def bool(self) -> Tensor:
        return self.to(D.bool_)

    # ---- factories relative to self ------------------------------------------------------
    def new_tensor(self, data, dtype=None, device=None, requires_grad=False) -> Tensor:
        return _OPS["tensor"](data, dtype=dtype or self._dtype, device=device or self._device,
                              requires_grad=requires_grad)

    def new_zeros(self, *sizes, size=None, dtype=None, device=None,
                  requires_grad=False) -> Tensor:
        sizes = sizes if size is None else (size,)
        return _OPS["zeros"](*sizes, dtype=dtype or self._dtype, device=device or self._device,
                             requires_grad=requires_grad)

    def new_ones(self, *sizes, size=None, dtype=None, device=None,
                 requires_grad=False) -> Tensor:
        sizes = sizes if size is None else (size,)
        return _OPS["ones"](*sizes, dtype=dtype or self._dtype, device=device or self._device,
                            requires_grad=requires_grad)

    def new_empty(self, *sizes, size=None, dtype=None, device=None,
                  requires_grad=False) -> Tensor:
        sizes = sizes if size is None else (size,)
        return _OPS["empty"](*sizes, dtype=dtype or self._dtype, device=device or self._device,
                             requires_grad=requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
        return _OPS["full"](size, fill_value, dtype=dtype or self._dtype,
                            device=device or self._device, requires_grad=requires_grad)

    # ---- transposes as properties ------------------------------------------------------
    @property
    def T(self) -> Tensor:
        """All dims reversed (NumPy's ``.T``)."""
        return _OPS["numpy_T"](self)

    @property
    def mT(self) -> Tensor:
        """The last two dims swapped (a batch of matrices transposed)."""
        return _OPS["mT"](self)

    @property
    def H(self) -> Tensor:
        """The conjugate transpose of a matrix."""
        if self.dim() not in (0, 2):
            raise RuntimeError("tensor.H is only supported on matrices (2-D tensors). Got "
                               f"{self.dim()}-D tensor.")
        return self if self.dim() == 0 else self.mH

    @property
    def mH(self) -> Tensor:
        """The last two dims swapped and conjugated."""
        out = _OPS["mT"](self)
        return _OPS["conj"](out) if self._dtype.is_complex and "conj" in _OPS else out

    # ---- indexing ---------------------------------------------------------------------
    def __getitem__(self, key) -> Tensor:
        return _OPS["getitem"](self, key)

    def __setitem__(self, key, value) -> None:
        _OPS["setitem"](self, key, value)


_NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead.")

_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
               "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
               "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor",
               "bool": "BoolTensor"}


def _accelerator_device(kind: str, index) -> device:
    if index is None:
        return device(kind)
    if isinstance(index, (int, np.integer)) and isinstance(_BACKENDS[kind], Unavailable):
        raise RuntimeError("Cannot access accelerator device when none is available.")
    return device(kind, int(index)) if isinstance(index, (int, np.integer)) else device(index)


def _contiguous_strides(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def _wrap_dim(dim: int, ndim: int, op: str = "") -> int:
    n = max(ndim, 1)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if dim < -n or dim >= n:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of "
                         f"[{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


_CPU = device("cpu")

# Moves whenever ``t.data = ...`` gives a tensor a new version counter (at 0 again): a
# cache that watches counters (nn.Graph's folded variables) re-checks which counter each
# tensor holds only after it moved.
DATA_SWAPS = [0]
# numpy() reads these devices' data on the host (a global tensor's numpy() gathers the whole)
_HOST_READABLE = ("cpu", "global")

# ``dispatch``, installed by ``tessera._dispatch`` when it loads (it sits above Tensor)
_dispatch: Callable[..., Any] = None  # type: ignore[assignment]  # bound before any op runs
_autograd_graph.set_tensor_type(Tensor)
