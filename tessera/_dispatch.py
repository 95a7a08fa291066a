"""dispatch(op, *inputs, **attrs): the one path from user code to a kernel.

Inputs are Tensors, Python scalars or None (an absent optional tensor); attrs are plain
Python values. Dispatch validates through the op's ``infer`` rule, runs the device's kernel
(or nothing, on ``meta``), wraps the arrays as Tensors and records an autograd node when
grad mode is on and an input requires grad. Tracing and global tensors will enter here too,
through ``push_mode``.

>>> import tessera
>>> from tessera.ops.registry import REGISTRY
>>> dispatch(REGISTRY["add"], tessera.ones(2), 1.0)
tensor([2., 2.])
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from tessera import _dtype as D, _fastpath, _tensor
from tessera._tensor import _CPU, Size, Tensor
from tessera.autograd import graph as _graph
from tessera.autograd.grad_mode import STATE
from tessera.autograd.graph import Node
from tessera.device.registry import _BACKENDS, device
from tessera.kernels import elementwise as _eager
from tessera.kernels.elementwise import EAGER_MIN as _EAGER_MIN
from tessera.ops.registry import Meta, MissingRule, OpDef

_DEBUG = int(os.environ.get("TESSERA_DEBUG", "0") or 0)
_MODES: list = []   # dispatch modes (tracer, global tensors) installed by later layers
CPU = device("cpu")


def push_mode(mode) -> None:
    """Route every dispatch through ``mode.dispatch(op, args, attrs)`` until popped (the
    tracer of ``nn.Graph``; a recording profile, ``tessera.autograd.profiler``)."""
    _MODES.append(mode)


def pop_mode():
    return _MODES.pop()


def composite_args(name: str, args: tuple) -> tuple:
    """``args`` of the composite ``name`` (``linear``, ``addmm``...) as the active modes
    would pass them to one op of that name: PyTorch's autocast casts a composite's inputs
    together, where casting its parts one by one would leave a float32 bias add. A mode
    takes part by defining ``composite_args(name, args)``; callers check ``_MODES`` first,
    so the call costs nothing outside a mode.
    """
    for mode in reversed(_MODES):
        hook = getattr(mode, "composite_args", None)
        if hook is not None:
            args = hook(name, args)
    return args


def _device_error(op: OpDef, a: device, b: device) -> RuntimeError:
    return RuntimeError(f"{op.name}: expected all tensors to be on the same device, but found "
                        f"at least two devices, {a} and {b}!")


_SCALAR_CATEGORY = {bool: 0, int: 1, float: 2, complex: 3}
_new_meta = tuple.__new__  # Meta(shape, dtype) without NamedTuple's Python-level __new__
# NumPy reports inf/nan results as RuntimeWarnings; PyTorch is silent. A filter scoped to
# tessera's modules silences them at no cost per call (``np.errstate`` costs ~1 us a call).
warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero|underflow) "
                        r"encountered", RuntimeWarning, r"tessera(\.|$)")


def dispatch(op: OpDef, *args, **attrs):
    """Run ``op`` on ``args``: the only path from user code to a kernel.

    Under a dispatch mode (tracing) the mode takes the call. Otherwise: read the inputs
    (``_scan``), infer the outputs, and run the first way that applies: a large elementwise
    op as its C rule (``_eager_c``), the common CPU case inline (``_plain_cpu``), a global
    input through SBP dispatch, or the device's kernel; ``_finish`` wraps the results and
    records autograd.

    >>> import tessera
    >>> from tessera.ops.registry import REGISTRY
    >>> dispatch(REGISTRY["add"], tessera.ones(2), tessera.ones(2), alpha=1)
    tensor([2., 2.])
    """
    if _MODES:
        return _MODES[-1].dispatch(op, args, attrs)
    dev, grad, metas, first_dt, mixed, scalars = _scan(op, args)
    if dev is None:
        dev = attrs.get("device") or CPU
        if not isinstance(dev, device):
            dev = device(dev)
    out = _infer(op, metas, attrs, scalars)
    multi = type(out) is tuple
    if op.to_c is not None and dev is _CPU and not multi and \
            (mixed or "numpy_fast" not in op.traits):
        res = _eager_c(op, args, attrs, out)
        if res is not None:
            return _finish(op, args, attrs, metas, out, (res,), dev, grad)
    if not (mixed or scalars or multi) and first_dt in _PLAIN_DTYPES and dev is _CPU:
        res = _plain_cpu(op, args, attrs, out)
        if res is not None:
            if op.dynamic_shape:
                out = Meta(res.shape, out.dtype)
            return _finish(op, args, attrs, metas, out, (res,), dev, grad)
    outs = out if multi else (out,)
    backend = _BACKENDS[dev.type]
    if dev.type == "global":  # a global input: SBP signature, boxing, then local dispatch
        # (tessera/distributed/sbp_dispatch.py; only the global backend has ``run``)
        datas = backend.run(op, args, metas, attrs, outs)  # type: ignore[attr-defined]
        return _finish(op, args, attrs, metas, out, datas, dev, grad)
    if backend.has_storage:
        datas = _run_kernel(op, backend, dev, args, metas, attrs, outs, multi)
    elif op.dynamic_shape:
        raise NotImplementedError(f"{op.name}: the output shape depends on the data, so it "
                                  f"cannot run on the {dev.type} device")
    else:
        datas = (None,) * len(outs)
    if op.dynamic_shape:
        outs = tuple(Meta(d.shape, m.dtype) for m, d in zip(outs, datas))
        out = outs if multi else outs[0]
    return _finish(op, args, attrs, metas, out, datas, dev, grad)


def _scan(op: OpDef, args: tuple):
    """The inputs' common device (None: no tensor), whether one requires grad, their metas
    (Python values as they are), the first tensor's dtype, whether the tensors' dtypes
    differ, and whether a Python number is among them."""
    dev = first_dt = None
    grad = mixed = scalars = False
    metas = []
    for a in args:
        if isinstance(a, Tensor):
            d = a._device
            if dev is None:
                dev = d
            elif d is not dev and d != dev:
                dev = _join_devices(op, args, dev, a)
            dt = a._dtype
            if first_dt is None:
                first_dt = dt
            elif dt is not first_dt:
                mixed = True
            metas.append(_new_meta(Meta, (a._shape, dt)))
            if a._requires_grad:
                grad = True
        else:
            metas.append(a)
            if a is not None:
                scalars = True
    return dev, grad, metas, first_dt, mixed, scalars


def _eager_c(op: OpDef, args: tuple, attrs: dict, out: Meta):
    """A large elementwise op run as its C rule (``tessera.kernels.elementwise``), or None
    when it does not apply (small, or a rule that does not render)."""
    a0 = args[0]
    if isinstance(a0, Tensor) and a0._data.size >= _EAGER_MIN and _eager.enabled():
        return _eager.run(op, [a._data if isinstance(a, Tensor) else a for a in args],
                          attrs, out)
    return None


def _plain_cpu(op: OpDef, args: tuple, attrs: dict, out: Meta):
    """The common case, inline: one CPU output from inputs of one float dtype, no casts;
    None when the op has no CPU kernel."""
    kernel = op.kernels.get("cpu")
    if kernel is None:
        return None
    try:
        res = getattr(kernel, "plain", kernel)(
            *[a._data if isinstance(a, Tensor) else a for a in args], **attrs)
    except _USER_ERRORS as e:
        raise _name_op(e, op) from None
    if type(res) is not np.ndarray:
        res = np.asarray(res)
    if res.dtype != out.dtype.np:
        res = res.astype(out.dtype.np)
    return res


def _finish(op, args, attrs, metas, out, datas, dev, grad):
    """Wrap the kernel's arrays (or a tracer's symbols) as Tensors; views and autograd."""
    record = grad and STATE.enabled and op.grad is not None
    if type(out) is not tuple:
        t = Tensor._make(datas[0], out.dtype, dev, out.shape)
        if record and out.dtype.category >= 2 and 0 not in op.nondiff_outputs:
            t._requires_grad = True
        if op.aliasing == "view":
            _mark_view(t, args, op, attrs)
        if record:
            _record(op, args, attrs, metas, (out,), (t,))
        return t
    results = []
    nondiff = op.nondiff_outputs
    for i, (m, d) in enumerate(zip(out, datas)):
        t = Tensor._make(d, m.dtype, dev, m.shape)
        if record and i not in nondiff and m.dtype.category >= 2:
            t._requires_grad = True
        results.append(t)
    if op.aliasing == "view":
        _mark_view(results[0], args, op, attrs)
    if record:
        _record(op, args, attrs, metas, out, results)
    return tuple(results)


# ---- infer, memoised ----------------------------------------------------------------------
# ``infer`` is a pure function of the input metas, the scalars, the attrs and the default
# dtype, so its result is kept per key: a training step repeats the same shapes every
# iteration. Attrs of other types (arrays, generators, tensors) are never part of a key.
_INFER_CACHE: dict = {}
_INFER_CACHE_SIZE = 8192
_KEY_TYPES = frozenset((int, float, bool, str, type(None), D.dtype, device))


def _int_tuple(v) -> bool:
    """Tuples of ints, None and such tuples (shapes, dims, pads) are keys; other elements
    are not, because 2 == 2.0 == True would make different arguments one key."""
    for x in v:
        t = type(x)
        if t is not int and x is not None and not (t is tuple and _int_tuple(x)):
            return False
    return True


def _infer(op: OpDef, metas: list, attrs: dict, scalars: bool):
    key = None
    if attrs:
        typed = False  # a number among the attrs: alpha=1, 1.0 and True are equal keys
        for v in attrs.values():
            t = type(v)
            if t is int or t is float or t is bool:
                typed = True
            elif t is tuple or t is Size:
                if not _int_tuple(v):
                    break
            elif t not in _KEY_TYPES:
                break
        else:
            key = (op, D._default, *metas, *attrs.items())
            if typed:
                key += tuple(map(type, attrs.values()))
    else:
        key = (op, D._default, *metas)
    if key is not None and scalars:  # 1, 1.0 and True are equal keys but infer differently
        key += tuple(map(type, metas))
    try:
        return _INFER_CACHE[key]
    except (KeyError, TypeError):  # TypeError: a metas entry is unhashable (a list)
        pass
    try:
        out = op.infer(*metas, **attrs)
    except _USER_ERRORS as e:
        raise _name_op(e, op) from None
    if key is not None:
        if len(_INFER_CACHE) >= _INFER_CACHE_SIZE:
            _INFER_CACHE.clear()
        try:
            _INFER_CACHE[key] = out
        except TypeError:
            pass
    return out


_USER_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)


def _name_op(e: Exception, op: OpDef) -> Exception:
    """The same error, its message starting with the op's name when it does not name it."""
    msg = str(e)
    if type(e) not in _USER_ERRORS or op.name in msg:
        return e
    return type(e)(f"{op.name}: {msg}")


def _join_devices(op, args, dev, a):
    """Two devices met: like PyTorch, a 0-d CPU tensor may join tensors on another device."""
    d = a._device
    for x in (dev, d):  # a device whose tensors cannot meet others (sparse) says why
        join_error = getattr(_BACKENDS[x.type], "join_error", None)
        if join_error is not None:
            raise join_error(op)
    if dev.type == "global" or d.type == "global":  # global and local inputs: the global
        return dev if dev.type == "global" else d   # branch accepts 0-d locals, names others
    if a._shape == () and d.type == "cpu":
        return dev
    first = next(t for t in args if isinstance(t, Tensor))
    if dev.type == "cpu" and first._shape == ():
        return d
    raise _device_error(op, dev, d)


def _needs_cast(first_dt, metas) -> bool:
    """Whether promotion changes any tensor input's dtype (scalars of a higher category
    do, scalars of the same or a lower category don't)."""
    for m in metas:
        if type(m) is Meta:
            if m.dtype is not first_dt:
                return True
        elif m is not None and _SCALAR_CATEGORY.get(type(m), 3) > first_dt.category:
            return True
    return False


# Dtypes whose NumPy arithmetic already is PyTorch's: a kernel's ``plain`` function (the
# bare NumPy computation, without the operand casts of ``_kernel``) runs on them directly.
_PLAIN_DTYPES = frozenset((D.float32, D.float64))


def kernel_plan(op: OpDef, metas, kernel):
    """The function to call and the dtype to cast tensor inputs to (None: no cast) for
    inputs with these metas: promoting ops cast to ``result_type`` when the inputs
    differ; inputs of one float32/float64 dtype call the kernel's bare NumPy form."""
    dts = [m.dtype for m in metas if type(m) is Meta]
    first = dts[0] if dts else None
    mixed = any(d is not first for d in dts)
    scalars = any(type(m) is not Meta and m is not None for m in metas)
    ct = None
    if op.promote and (mixed or scalars) and first is not None and _needs_cast(first, metas):
        ct = D.result_type(*[(m.dtype, len(m.shape)) if type(m) is Meta else m
                             for m in metas if m is not None]).np
    elif not mixed and first in _PLAIN_DTYPES and all(
            m is None or type(m) in (Meta, float, int) for m in metas):
        kernel = getattr(kernel, "plain", kernel)
    return kernel, ct


def _run_kernel(op, backend, dev, args, metas, attrs, outs, multi):
    kernel = op.kernels.get(dev.type) or backend.kernel(op)
    if kernel is None:
        raise MissingRule(op.name, f"kernel:{dev.type}", f"no kernel for device '{dev.type}'")
    kernel, ct = kernel_plan(op, metas, kernel)
    if ct is not None:
        arrays = [a._data.astype(ct, copy=False) if isinstance(a, Tensor) else a for a in args]
    else:
        arrays = [a._data if isinstance(a, Tensor) else a for a in args]
    try:
        res = kernel(*arrays, **attrs)
    except _USER_ERRORS as e:  # data-dependent checks (index ranges, ...) live in kernels
        raise _name_op(e, op) from None
    if not multi:
        m = outs[0]
        if type(res) is not np.ndarray and dev.type == "cpu":
            res = np.asarray(res)
        if res.dtype != m.dtype.np:
            res = res.astype(m.dtype.np)
        if _DEBUG and res.shape != m.shape and not op.dynamic_shape:
            raise AssertionError(f"{op.name}: kernel gave shape {res.shape}, infer said {m.shape}")
        return (res,)
    datas = []
    for m, r in zip(outs, res):
        if type(r) is not np.ndarray and dev.type == "cpu":
            r = np.asarray(r)
        if r.dtype != m.dtype.np:
            r = r.astype(m.dtype.np)
        if _DEBUG and r.shape != m.shape and not op.dynamic_shape:
            raise AssertionError(f"{op.name}: kernel gave shape {r.shape}, infer said {m.shape}")
        datas.append(r)
    return datas


def _mark_view(out, args, op, attrs) -> None:
    src = args[0]
    out._version = src._version
    out._base = src._base if src._base is not None else src
    out._view_chain = src._view_chain + ((op, args[1:], attrs),)
    out._view_version = src._version[0]


def _record(op, args, attrs, metas, outs, results) -> None:
    edges: list[tuple[Any, int] | None] = []
    needs = []
    for a in args:
        if isinstance(a, Tensor) and a._requires_grad:
            if a._base is not None and a._view_version != a._version[0]:
                _refresh_view(a)
            fn = a.grad_fn
            edges.append((fn, a._output_nr) if fn is not None else (a._grad_accumulator(), 0))
            needs.append(True)
        else:
            edges.append(None)
            needs.append(False)
    node = Node(op, attrs, tuple(edges), metas, outs, tuple(needs))
    save = op.save
    if save:
        node.save(args if "inputs" in save else None,
                  results if "outputs" in save else None)
    for i, t in enumerate(results):
        if t._requires_grad:
            t.grad_fn = node
            t._output_nr = i


def dispatch_inplace(op: OpDef, target: Tensor, *args, **attrs) -> Tensor:
    """Run ``op`` and write its result into ``target`` (``add_``, ``x[i] = v``, ...).

    ``args`` are the op's inputs (``target`` usually among them). Autograd sees the result as
    a new version of ``target``: its history is rebased onto the op's node, and, when
    ``target`` is a view, its base's history onto a ``view_assign`` node.
    """
    if _MODES:
        return _MODES[-1].dispatch_inplace(op, target, args, attrs)
    record = inplace_begin(op, target, args)
    dev = target._device.type
    fast = op.inplace_kernels.get(dev) if dev == "cpu" else _BACKENDS[dev].inplace_kernel(op)
    if not record and fast is not None:
        metas = [Meta(a._shape, a._dtype) if isinstance(a, Tensor) else a for a in args]
        m = op.infer(*metas, **attrs)
        _check_inplace(op, target, m)
        if target._data is not None:
            fast(target._data, *[a._data if isinstance(a, Tensor) else a for a in args], **attrs)
        target._version[0] += 1
        return target
    if saves_old_self(op, target, args, record):
        args = (_snapshot(target),) + tuple(args[1:])
    return inplace_end(op, target, dispatch(op, *args, **attrs), record, _copy_into)


def inplace_begin(op: OpDef, target, args) -> bool:
    """The checks before ``target`` is written in place (PyTorch's errors for leaves and
    multi-output views); returns whether autograd records the write."""
    if not isinstance(target, Tensor):
        raise TypeError(f"{op.name}_: expected a Tensor to write into, got {type(target).__name__}")
    grad_on = STATE.enabled
    base = target._base
    if grad_on and target._requires_grad:
        if target.grad_fn is None and base is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
        if base is not None and base._requires_grad and base.grad_fn is None:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in "
                               "an in-place operation.")
    if grad_on and base is not None and target._view_version != target._version[0]:
        _refresh_view(target)  # the base was written after this view was taken
    record = grad_on and (target._requires_grad or any(
        isinstance(a, Tensor) and a._requires_grad for a in args))
    if record and target._multi_view is not None:
        raise _multi_view_error(target)
    return record


def saves_old_self(op: OpDef, target: Tensor, args, record: bool) -> bool:
    """Backward needs the old value of self, which the write overwrites. Like PyTorch, only
    self is kept so: ``y.mul_(y)`` saves the live ``y`` as ``other``, and backward then
    reports the in-place modification."""
    return record and bool(op.save) and "inputs" in op.save and bool(args) and \
        args[0] is target


def inplace_end(op: OpDef, target: Tensor, out: Tensor, record: bool, write) -> Tensor:
    """``target`` becomes ``out`` (cast to its dtype) through ``write(target, out)``: a new
    version, and the history rebased when autograd recorded the op."""
    _check_inplace(op, target, Meta(out._shape, out._dtype))
    if out._dtype is not target._dtype:
        out = out.to(target._dtype)
    write(target, out)
    target._version[0] += 1
    if record and out._requires_grad:
        if target._base is None:
            target.grad_fn, target._output_nr = out.grad_fn, out._output_nr
            target._requires_grad = True
        else:
            _rebase_view(target, out)
    return target


def _copy_into(target: Tensor, out: Tensor) -> None:
    if target._data is not None:
        _BACKENDS[target._device.type].copy_into(target._data, out._data)


def _multi_view_error(t: Tensor) -> RuntimeError:
    assert t._multi_view is not None  # only called for such a view
    i, node = t._multi_view
    return RuntimeError(f"Output {i} of {node} is a view and is being modified inplace. This "
                        "view is the output of a function that returns multiple views. Such "
                        "functions do not allow the output views to be modified inplace. You "
                        "should replace the inplace operation by an out-of-place one.")


def _check_inplace(op: OpDef, target: Tensor, m) -> None:
    if tuple(m.shape) != target._shape:
        raise RuntimeError(f"{op.name}_: output with shape {list(target._shape)} doesn't match "
                           f"the broadcast shape {list(m.shape)}")
    if m.dtype.category > target._dtype.category:
        raise RuntimeError(f"{op.name}_: result type {_tname(m.dtype)} can't be cast to the "
                           f"desired output type {_tname(target._dtype)}")


def _tname(d) -> str:
    return {"float32": "Float", "float64": "Double", "int64": "Long", "int32": "Int",
            "bool": "Bool", "float16": "Half", "bfloat16": "BFloat16", "int16": "Short",
            "int8": "Char", "uint8": "Byte"}.get(d.name, d.name)


def _snapshot(t: Tensor) -> Tensor:
    """A copy of ``t``'s current value that keeps ``t``'s place in the autograd graph."""
    s = Tensor._make(None if t._data is None else t._data.copy(), t._dtype, t._device, t._shape)
    s.grad_fn, s._output_nr, s._requires_grad = t.grad_fn, t._output_nr, t._requires_grad
    if t.grad_fn is None and t._requires_grad:
        s._grad_acc = t._grad_acc
    return s


def _rebase_view(view: Tensor, new_value: Tensor) -> None:
    """``view`` was written in place: its base now comes from a ``view_assign`` node."""
    from tessera.ops.registry import REGISTRY
    base = view._base
    assert base is not None  # only called for views
    chain = view._view_chain
    new_base = dispatch(REGISTRY["view_assign"], _alias(base), new_value, chain=chain)
    base.grad_fn, base._output_nr = new_base.grad_fn, new_base._output_nr
    base._requires_grad = True
    # the view's own history: the same view taken of the new base
    v = new_base
    for op, rest, attrs in chain:
        v = dispatch(op, v, *rest, **attrs)
    view.grad_fn, view._output_nr, view._requires_grad = v.grad_fn, v._output_nr, True
    view._view_version = view._version[0]


def _refresh_view(view: Tensor) -> None:
    """The base of ``view`` was written after the view was taken: take the view's history
    again from the base's current history (PyTorch regenerates a view's grad_fn so too)."""
    base = view._base
    assert base is not None  # only called for views
    view._view_version = view._version[0]
    if not base._requires_grad:
        return
    v = _alias(base)
    for op, rest, attrs in view._view_chain:
        v = dispatch(op, v, *rest, **attrs)
    view.grad_fn, view._output_nr, view._requires_grad = v.grad_fn, v._output_nr, True


def _alias(t: Tensor) -> Tensor:
    """A new Tensor object for ``t``'s storage and autograd identity (no copy)."""
    a = Tensor._make(t._data, t._dtype, t._device, t._shape)
    a.grad_fn, a._output_nr, a._requires_grad = t.grad_fn, t._output_nr, t._requires_grad
    if t.grad_fn is None and t._requires_grad:
        a._grad_acc = t._grad_acc
    return a


# ---- the C fast path --------------------------------------------------------------------
# ``dispatch`` becomes the C function of tessera/_fastpath.c, which runs the common case
# above (one float dtype on the CPU, one output, memoised infer) and calls ``_py_dispatch``
# for everything else.
_py_dispatch = dispatch
dispatch = _fastpath.accelerate(_py_dispatch)
if dispatch is not _py_dispatch:
    assert _fastpath.MODULE is not None  # accelerate() returned the C function
    _fastpath.MODULE.configure(
        fallback=_py_dispatch, tensor=Tensor, meta=Meta, ndarray=np.ndarray, modes=_MODES,
        cpu=_CPU, float32=D.float32, float64=D.float64, dtype_module=D, state=STATE,
        infer=_infer, asarray=np.asarray, user_errors=_USER_ERRORS, eager_min=_EAGER_MIN,
        node=Node, node_seq=_graph._seq, refresh_view=_refresh_view)
_tensor._dispatch = dispatch  # Tensor's operators call it (Tensor sits below dispatch)
