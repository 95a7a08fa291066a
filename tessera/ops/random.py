"""Random numbers: ``Generator``, the default generator, random factories and the in-place
distribution methods (``x.uniform_()``, ``x.normal_()``, ...).

Every random op is an ``OpDef`` that takes its ``Generator`` as an attribute; the CPU kernel
draws from the generator's NumPy ``PCG64`` stream, so a seeded program reproduces exactly
(the numbers differ from PyTorch's Mersenne Twister). On the ``meta`` device only ``infer``
runs and no number is drawn. A cost counts one operation per number drawn plus the
distribution's arithmetic on it.

>>> import tessera
>>> g = tessera.Generator().manual_seed(0)
>>> bool((tessera.rand(3, generator=g) == tessera.rand(3, generator=g.manual_seed(0))).all())
True
"""
from __future__ import annotations

import os
import struct

import numpy as np

from tessera import _dtype as D
from tessera._dispatch import dispatch, dispatch_inplace
from tessera._tensor import Tensor
from tessera.device.registry import device as Device
from tessera.ops import cost
from tessera.ops._util import bool_arg, broadcast_shapes, call, ensure_tensor, size_args
from tessera.ops.creation import _global
from tessera.ops.registry import Meta, defop

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed",
           "get_rng_state", "set_rng_state", "rand", "randn", "randint", "randperm",
           "rand_like", "randn_like", "randint_like", "normal", "bernoulli", "multinomial",
           "poisson", "_standard_gamma", "_standard_gamma_grad", "uniform_", "normal_",
           "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_"]

_U64 = 1 << 64
_STATE_FMT = "<QQQQQQQ"   # initial seed, PCG64 state (2 words), inc (2 words), buffer (2)
_STATE_SIZE = struct.calcsize(_STATE_FMT)


class Generator:
    """A source of random numbers with PyTorch's interface (``torch.Generator``).

    >>> import tessera
    >>> g = tessera.Generator().manual_seed(42)
    >>> g.initial_seed()
    42
    """

    def __init__(self, device="cpu"):
        dev = device if isinstance(device, Device) else Device(device)
        if dev.type == "meta":
            raise RuntimeError("META device type not an accelerator.")
        self.device = dev
        self.seed()

    def manual_seed(self, seed) -> Generator:
        """Reset the stream to ``seed`` (an int in [-2**63, 2**64)); returns ``self``."""
        if isinstance(seed, Tensor):
            seed = seed.item()
        if isinstance(seed, float) or not hasattr(seed, "__index__"):
            raise RuntimeError(f"manual_seed expected a long, but got {type(seed).__name__}")
        seed = int(seed)
        if not -(1 << 63) <= seed < _U64:
            raise ValueError("Overflow when unpacking long long")
        self._seed = seed % _U64  # PyTorch keeps negative seeds as their uint64 bits
        self._np = np.random.Generator(np.random.PCG64(self._seed))
        return self

    def seed(self) -> int:
        """Seed from the OS's entropy and return the seed chosen."""
        s = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        """The seed the stream started from."""
        return self._seed

    def get_state(self) -> Tensor:
        """The full state as a uint8 tensor, for ``set_state``."""
        st = self._np.bit_generator.state
        words = (self._seed, st["state"]["state"] >> 64, st["state"]["state"] & (_U64 - 1),
                 st["state"]["inc"] >> 64, st["state"]["inc"] & (_U64 - 1), st["has_uint32"],
                 st["uinteger"])
        raw = np.frombuffer(struct.pack(_STATE_FMT, *words), np.uint8).copy()
        return Tensor._from_numpy(raw)

    def set_state(self, new_state: Tensor) -> Generator:
        """Restore a state from ``get_state``; returns ``self``."""
        if not isinstance(new_state, Tensor) or new_state.dtype is not D.uint8:
            raise TypeError("RNG state must be a torch.ByteTensor")
        if new_state.numel() != _STATE_SIZE:
            raise RuntimeError(f"Expected a CPUGeneratorImplState of size {_STATE_SIZE} but "
                               f"found the input RNG state size to be {new_state.numel()}")
        seed, s_hi, s_lo, i_hi, i_lo, has, uint = struct.unpack(
            _STATE_FMT, new_state.detach()._to_numpy().tobytes())
        self.manual_seed(seed)
        self._np.bit_generator.state = {
            "bit_generator": "PCG64", "state": {"state": s_hi << 64 | s_lo,
                                                "inc": i_hi << 64 | i_lo},
            "has_uint32": has, "uinteger": uint}
        return self

    def __repr__(self) -> str:
        return f"<tessera.Generator object at {id(self):#x}>"


# PyTorch 2.13 seeds its default generator from the OS at startup, so do we
default_generator = Generator()


def manual_seed(seed) -> Generator:
    """Seed the default generator; returns it."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed the default generator non-deterministically; returns the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def fresh_seed() -> int:
    """A fresh seed from the default generator's stream (a dropout mask's, eager or in a
    compiled graph's step).

    >>> 0 <= fresh_seed() < 2 ** 63
    True
    """
    return int(default_generator._np.integers(0, 2 ** 63 - 1))


def get_rng_state() -> Tensor:
    """The default generator's state as a uint8 tensor."""
    return default_generator.get_state()


def set_rng_state(new_state: Tensor) -> None:
    default_generator.set_state(new_state)


def _gen(generator) -> Generator:
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise TypeError(f"expected a tessera.Generator, got {type(generator).__name__}")
    return generator


# ---- samplers: NumPy arrays of one distribution in one dtype --------------------------

_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def _uniform01(g: np.random.Generator, shape, dt: D.dtype) -> np.ndarray:
    """[0, 1) in ``dt``: half types from integers so that rounding never reaches 1."""
    if dt is D.float32 or dt is D.float64:
        assert dt.np is not None
        return g.random(shape, dtype=dt.np)
    if dt.is_complex:
        part = dt.to_real()
        return _uniform01(g, shape, part) + 1j * _uniform01(g, shape, part)
    bits = _MANTISSA[dt.name]
    return (g.integers(0, 1 << bits, shape) * (1.0 / (1 << bits))).astype(dt.np)


def _std_normal(g: np.random.Generator, shape, dt: D.dtype) -> np.ndarray:
    if dt is D.float32 or dt is D.float64:
        assert dt.np is not None
        return g.standard_normal(shape, dtype=dt.np)
    if dt.is_complex:  # each part N(0, 1/2), so E|z|^2 = 1 like PyTorch
        part = dt.to_real()
        z = _std_normal(g, shape, part) + 1j * _std_normal(g, shape, part)
        return (z * np.sqrt(0.5)).astype(dt.np)
    return g.standard_normal(shape, dtype=np.float32).astype(dt.np)


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _floating_only(dt: D.dtype, kernel: str) -> None:
    if dt.category < 2:
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_SNAME[dt.name]}\'')


_SNAME = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
          "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
          "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
_CNAME = {"int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
          "uint8": "unsigned char", "bool": "bool"}


def _zero_grads(ctx, g):
    """In-place and parametrised samplers: PyTorch gives zero gradients, not none."""
    from tessera.ops.creation import zeros
    return tuple(zeros(m.shape, dtype=m.dtype, device=g.device) if need else None
                 for m, need in zip(ctx.input_metas, ctx.needs_input_grad))


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    return t.requires_grad_(True) if requires_grad else t


def _dev(device):
    return device if isinstance(device, Device) or device is None else Device(device)


# ---- factories -----------------------------------------------------------------------

def _rand_infer(shape, dtype, generator, device=None):
    _floating_only(dtype, "check_uniform_bounds")
    return Meta(shape, dtype)


def _randn_infer(shape, dtype, generator, device=None):
    if 0 not in shape:  # like PyTorch, whose dtype check is in the kernel it skips when empty
        _floating_only(dtype, "normal_kernel_cpu")
    return Meta(shape, dtype)


_RAND = defop("rand", _rand_infer,
              lambda shape, dtype, generator, device=None:
              _uniform01(generator._np, shape, dtype), grad=None, cost=cost.output_only(1))
_RANDN = defop("randn", _randn_infer,
               lambda shape, dtype, generator, device=None:
               _std_normal(generator._np, shape, dtype), grad=None, cost=cost.output_only(1))


def _factory(op, name, size, generator, out, dtype, device, requires_grad, **attrs):
    if not size:
        raise TypeError(f"{name}() received an invalid combination of arguments - got no "
                        f"size, but expected (tuple of ints size, *, Generator generator, ...)")
    shape = size_args(name, size)
    requires_grad = bool_arg(name, "requires_grad", requires_grad, none=True)
    dt = D.dtype_arg(name, dtype) if dtype is not None else (
        out.dtype if out is not None else D.get_default_dtype())
    if out is not None and device is None:
        device = out.device
    res = call(op, shape=shape, dtype=dt, generator=_gen(generator), device=_dev(device),
               out=out, **attrs)
    return _finish(res, requires_grad)


def rand(*size, generator=None, out=None, dtype=None, layout=None, device=None,
         requires_grad=False, pin_memory=False, placement=None, sbp=None, **kwargs) -> Tensor:
    """Uniform samples in [0, 1): ``rand(2, 3)`` or ``rand((2, 3), generator=g)``."""
    if placement is not None or sbp is not None:
        return _global(lambda g: rand(*size, generator=g, dtype=dtype, **kwargs), placement,
                       sbp, requires_grad, "rand", True, generator)
    size = _size_kwarg("rand", size, kwargs)
    return _factory(_RAND, "rand", size, generator, out, dtype, device, requires_grad)


def randn(*size, generator=None, out=None, dtype=None, layout=None, device=None,
          requires_grad=False, pin_memory=False, placement=None, sbp=None, **kwargs) -> Tensor:
    """Standard normal samples: ``randn(2, 3)``."""
    if placement is not None or sbp is not None:
        return _global(lambda g: randn(*size, generator=g, dtype=dtype, **kwargs), placement,
                       sbp, requires_grad, "randn", True, generator)
    size = _size_kwarg("randn", size, kwargs)
    return _factory(_RANDN, "randn", size, generator, out, dtype, device, requires_grad)


def _size_kwarg(name: str, size: tuple, kwargs: dict) -> tuple:
    """``rand(size=(2, 3))``: PyTorch also takes the size as a keyword."""
    if not kwargs:
        return size
    if set(kwargs) != {"size"} or size:
        raise TypeError(f"{name}() got an unexpected keyword argument "
                        f"'{next(k for k in kwargs if k != 'size' or size)}'")
    return (tuple(kwargs["size"]),)


def _like(input, name):
    ensure_tensor(name, input)
    return tuple(input.shape)


def rand_like(input, *, generator=None, dtype=None, layout=None, device=None,
              requires_grad=False, memory_format=None) -> Tensor:
    """``rand`` with the shape (and by default dtype and device) of ``input``."""
    shape = _like(input, "rand_like")
    return rand(shape, generator=generator, dtype=dtype or input.dtype,
                device=device or input.device, requires_grad=requires_grad)


def randn_like(input, *, generator=None, dtype=None, layout=None, device=None,
               requires_grad=False, memory_format=None) -> Tensor:
    shape = _like(input, "randn_like")
    return randn(shape, generator=generator, dtype=dtype or input.dtype,
                 device=device or input.device, requires_grad=requires_grad)


def _int_bounds(dt: D.dtype) -> tuple[int, int] | None:
    """The inclusive range of an integer (or bool) dtype; None for floating types."""
    if dt is D.bool_:
        return 0, 1
    if dt.category == 1:
        info = np.iinfo(dt.np)
        return int(info.min), int(info.max)
    return None


def _check_range(low: int, high: int, dt: D.dtype) -> None:
    """``[low, high)`` must be non-empty and representable (PyTorch's random_ checks)."""
    b = _int_bounds(dt)
    if b is not None and not b[0] <= low <= b[1]:
        raise RuntimeError(f"from is out of bounds for {_CNAME[dt.name]}")
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} "
                           f">= to={high}")
    if b is not None:
        if not b[0] <= high - 1 <= b[1]:
            raise RuntimeError(f"to - 1 is out of bounds for {_CNAME[dt.name]}")


def _randint_infer(low, high, shape, dtype, generator, device=None):
    if dtype.is_complex:
        raise NotImplementedError(f'"random_from_to" not implemented for '
                                  f"'{_SNAME[dtype.name]}'")
    _check_range(low, high, dtype)
    return Meta(shape, dtype)


def _randint_kernel(low, high, shape, dtype, generator, device=None):
    return generator._np.integers(low, high, shape, dtype=np.int64).astype(dtype.np)


_RANDINT = defop("randint", _randint_infer, _randint_kernel, grad=None,
                 cost=cost.output_only(1))


def _int_arg(name: str, v) -> int:
    if isinstance(v, Tensor):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"randint(): argument '{name}' must be int, not {type(v).__name__}")
    return int(v)


def randint(*args, size=None, low=None, high=None, generator=None, out=None, dtype=None,
            layout=None, device=None, requires_grad=False, pin_memory=False, placement=None,
            sbp=None) -> Tensor:
    """Integers uniform in [low, high): ``randint(10, (3,))``, ``randint(2, 5, (3,))``."""
    if placement is not None or sbp is not None:
        return _global(lambda g: randint(*args, size=size, low=low, high=high, generator=g,
                                         dtype=dtype), placement, sbp, requires_grad,
                       "randint", True, generator)
    rest = list(args)
    if size is None:
        if not rest:
            raise TypeError("randint(): missing required argument 'size'")
        size = rest.pop()
        if not isinstance(size, (tuple, list)):
            raise TypeError(f"randint(): argument 'size' (position {len(rest) + 1}) must be "
                            f"tuple of ints, not {type(size).__name__}")
    if len(rest) == 2:
        low, high = rest
    elif len(rest) == 1:
        if high is None:
            high = rest[0]
        else:
            low = rest[0]
    elif rest:
        raise TypeError(f"randint() takes at most 3 positional arguments ({len(rest) + 1} "
                        f"given)")
    if high is None:
        raise TypeError("randint(): missing required argument 'high'")
    low = 0 if low is None else _int_arg("low", low)
    high = _int_arg("high", high)
    return _factory(_RANDINT, "randint", (tuple(size),), generator, out, dtype or D.int64,
                    device, requires_grad, low=low, high=high)


def randint_like(input, low=0, high=None, *, generator=None, dtype=None, layout=None,
                 device=None, requires_grad=False, memory_format=None) -> Tensor:
    """``randint`` with the shape (and by default dtype and device) of ``input``."""
    shape = _like(input, "randint_like")
    if high is None:
        low, high = 0, low
    return randint(low, high, shape, generator=generator, dtype=dtype or input.dtype,
                   device=device or input.device, requires_grad=requires_grad)


def _randperm_infer(n, dtype, generator, device=None):
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    if dtype is D.bool_ or dtype.is_complex:
        raise NotImplementedError(f'"randperm" not implemented for \'{_SNAME[dtype.name]}\'')
    b = _int_bounds(dtype)
    if b is not None and n - 1 > b[1]:
        raise RuntimeError(f"value cannot be converted to type {dtype.name}_t without "
                           f"overflow")
    limit = {"float16": 2049, "bfloat16": 257, "float32": 2 ** 24 + 1}.get(dtype.name)
    if limit is not None and n > limit:
        raise RuntimeError(f"n cannot be greater than {limit} for {_SNAME[dtype.name]} type.")
    return Meta((n,), dtype)


_RANDPERM = defop("randperm", _randperm_infer,
                  lambda n, dtype, generator, device=None:
                  generator._np.permutation(n).astype(dtype.np), grad=None,
                  cost=cost.output_only(1))  # a swap per element (Fisher-Yates)


def randperm(n, *, generator=None, out=None, dtype=None, layout=None, device=None,
             requires_grad=False, pin_memory=False) -> Tensor:
    """A random permutation of ``0 .. n-1``."""
    n = _int_arg("n", n)
    dt = D.dtype_arg("randperm", dtype) if dtype is not None else D.int64
    res = call(_RANDPERM, n=n, dtype=dt, generator=_gen(generator),
               device=_dev(device or (out.device if out is not None else None)), out=out)
    return _finish(res, requires_grad)


# ---- samplers with tensor parameters -------------------------------------------------

def _normal_infer(mean, std, generator, shape=None, dtype=None, device=None):
    tm, ts = type(mean) is Meta, type(std) is Meta
    if tm and ts:
        out = Meta(broadcast_shapes("normal", mean.shape, std.shape), mean.dtype)
    elif tm or ts:
        m = mean if tm else std
        out = Meta(m.shape, m.dtype)
    else:
        out = Meta(shape, dtype)
    if 0 not in out.shape:
        _floating_only(out.dtype, "normal_kernel_cpu")
    if not ts and std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {_fmt(std)}")
    return out


def _normal_kernel(mean, std, generator, shape=None, dtype=None, device=None):
    if isinstance(std, np.ndarray) and (std < 0).any():
        raise RuntimeError("normal expects all elements of std >= 0.0")
    dt = dtype or D.from_numpy_dtype((mean if isinstance(mean, np.ndarray) else std).dtype)
    if shape is None:
        shape = np.broadcast_shapes(np.shape(mean), np.shape(std))
    z = _std_normal(generator._np, shape, dt)
    return (z * std + mean).astype(dt.np, copy=False)


_NORMAL = defop("normal", _normal_infer, _normal_kernel, grad=_zero_grads, save=(),
                cost=cost.elementwise(3))  # a draw, scaled by std, shifted by mean


def normal(mean, std=1.0, size=None, *, generator=None, out=None, dtype=None, layout=None,
           device=None, requires_grad=False) -> Tensor:
    """Normal samples: ``normal(mean_tensor, std)``, ``normal(0.0, std_tensor)`` or
    ``normal(0.0, 1.0, (2, 3))``; tensor arguments broadcast."""
    gen = _gen(generator)
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        res = call(_NORMAL, mean, std, generator=gen, out=out)
    else:
        if size is None:
            raise TypeError("normal() received an invalid combination of arguments - got "
                            "(float, float), but expected (Tensor mean, Tensor std) or "
                            "(float mean, float std, tuple of ints size)")
        shape = size_args("normal", (size,) if isinstance(size, int) else (tuple(size),))
        dt = D.as_dtype(dtype) if dtype is not None else D.get_default_dtype()
        res = call(_NORMAL, float(mean), float(std), generator=gen, shape=shape, dtype=dt,
                   device=_dev(device or (out.device if out is not None else None)), out=out)
    return _finish(res, requires_grad)


def _bernoulli_infer(x, p, generator):
    if p is None:
        _floating_only(x.dtype, "bernoulli_tensor_cpu_p_")
    elif type(p) is Meta:
        _check_expand(p.shape, x.shape, p.dtype)
    elif not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_fmt(p)}")
    return Meta(x.shape, x.dtype)


def _check_expand(shape, target, dt) -> None:
    if len(shape) > len(target):
        raise RuntimeError(f"expand(torch.{_SNAME[dt.name]}Tensor{{{list(shape)}}}, "
                           f"size={list(target)}): the number of sizes provided "
                           f"({len(target)}) must be greater or equal to the number of "
                           f"dimensions in the tensor ({len(shape)})")
    lead = len(target) - len(shape)
    for i, s in enumerate(shape):
        if s != 1 and s != target[lead + i]:
            raise RuntimeError(f"The expanded size of the tensor ({target[lead + i]}) must "
                               f"match the existing size ({s}) at non-singleton dimension "
                               f"{lead + i}.  Target sizes: {list(target)}.  Tensor sizes: "
                               f"{list(shape)}")


def _bernoulli_kernel(x, p, generator):
    p = x if p is None else p
    if isinstance(p, np.ndarray) and not ((p >= 0) & (p <= 1)).all():
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    return (generator._np.random(x.shape) < p).astype(x.dtype)


def _bernoulli_cost(ins, outs, **attrs) -> cost.Cost:
    """A draw and a comparison per element; the probabilities read are ``p``, or the input
    itself when ``p`` is None (otherwise the input gives only the shape)."""
    x, p = ins[0], ins[1]
    read = cost.nbytes(x) if p is None else cost.nbytes(p) if type(p) is Meta else 0
    return cost.Cost(2 * cost.numel(outs[0]), read, cost.nbytes(outs[0]))


_BERNOULLI = defop("bernoulli", _bernoulli_infer, _bernoulli_kernel, grad=_zero_grads,
                   save=(), cost=_bernoulli_cost)


def bernoulli(input: Tensor, p=None, *, generator=None, out=None) -> Tensor:
    """0/1 samples with probabilities ``input`` (or a fixed ``p``), in ``input``'s dtype."""
    ensure_tensor("bernoulli", input)
    return call(_BERNOULLI, input, p, generator=_gen(generator), out=out)


def _multinomial_infer(p, num_samples, replacement, generator):
    if p.dtype.category != 2:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{_SNAME[p.dtype.name]}")
    if len(p.shape) not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > p.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    return Meta(p.shape[:-1] + (num_samples,), D.int64)


def _multinomial_kernel(p, num_samples, replacement, generator):
    g = generator._np
    rows = p.reshape(-1, p.shape[-1]).astype(np.float64)
    n, k = rows.shape
    if n == 0:
        return np.zeros(p.shape[:-1] + (num_samples,), np.int64)
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (rows.sum(-1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if replacement:
        idx = _sample_cdf(g, rows, num_samples)
    else:  # Gumbel-top-k: the k largest p/E (E ~ Exp(1)) are a sample without replacement
        keys = rows / g.standard_exponential((n, k))
        idx = np.argsort(-keys, axis=-1, kind="stable")[:, :num_samples]
    return idx.reshape(p.shape[:-1] + (num_samples,))


def _sample_cdf(g: np.random.Generator, rows: np.ndarray, num: int) -> np.ndarray:
    """Inverse-CDF sampling of every row in one ``searchsorted``: row i's CDF is shifted
    into [i, i+1] so that all rows form one sorted array."""
    n, k = rows.shape
    cdf = np.cumsum(rows, -1)
    cdf /= cdf[:, -1:]
    off = np.arange(n, dtype=np.float64)[:, None]
    u = g.random((n, num)) + off
    idx = np.searchsorted((cdf + off).ravel(), u.ravel(), side="right").reshape(n, num)
    idx -= np.arange(n)[:, None] * k
    over = idx >= k  # u + i rounded up to i + 1: that is the last possible category
    if over.any():
        last = k - 1 - np.argmax(rows[:, ::-1] > 0, axis=-1)
        idx = np.where(over, last[:, None], idx)
    return idx


def _multinomial_cost(ins, outs, num_samples, replacement, **attrs) -> cost.Cost:
    """The rows' running sums, then per sample a draw and a binary search among k categories
    (with replacement), or a draw and a division per category then a sort (without)."""
    p = ins[0]
    k = max(int(p.shape[-1]), 0)
    if replacement:
        flops = cost.numel(p) + cost.numel(outs[0]) * (1 + k.bit_length())
    else:
        flops = cost.numel(p) * (2 + max(k - 1, 0).bit_length())
    return cost.Cost(flops, *cost.io(ins, outs))


_MULTINOMIAL = defop("multinomial", _multinomial_infer, _multinomial_kernel, grad=None,
                     cost=_multinomial_cost)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None,
                out=None) -> Tensor:
    """Category indices drawn from the (unnormalised) probabilities in each row."""
    ensure_tensor("multinomial", input)
    return call(_MULTINOMIAL, input, num_samples=int(num_samples),
                replacement=bool(replacement), generator=_gen(generator), out=out)


def _poisson_infer(x, generator):
    _floating_only(x.dtype, "poisson_cpu")
    return Meta(x.shape, x.dtype)


def _poisson_kernel(x, generator):
    if (x < 0).any():
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    return np.asarray(generator._np.poisson(x.astype(np.float64))).astype(x.dtype)


_POISSON = defop("poisson", _poisson_infer, _poisson_kernel, grad=_zero_grads, save=(),
                 cost=cost.elementwise(1))


def poisson(input: Tensor, generator=None) -> Tensor:
    """Poisson samples with rates ``input``."""
    ensure_tensor("poisson", input)
    return dispatch(_POISSON, input, generator=_gen(generator))


def _gamma_infer(alpha, generator):
    if alpha.dtype not in (D.float32, D.float64):
        raise NotImplementedError(f'"gamma_cpu" not implemented for \'{_SNAME[alpha.dtype.name]}\'')
    return Meta(alpha.shape, alpha.dtype)


def _gamma_kernel(alpha, generator):
    a = alpha.astype(np.float64)
    ok = a > 0  # False for NaN too
    x = generator._np.standard_gamma(np.where(ok, a, 1.0))
    # as PyTorch: the smallest normal number instead of 0 (an underflow, or an invalid
    # shape), so that log(x) stays finite
    tiny = np.finfo(alpha.dtype).tiny
    return np.maximum(np.where(ok, x, 0.0), tiny).astype(alpha.dtype)


def _gamma_grad(ctx, g):
    return (g * _standard_gamma_grad(ctx.inputs[0], ctx.outputs[0]),)


_STANDARD_GAMMA = defop("_standard_gamma", _gamma_infer, _gamma_kernel, grad=_gamma_grad,
                        save=("inputs", "outputs"), cost=cost.elementwise(20))


def _standard_gamma(input: Tensor, generator=None) -> Tensor:
    """Gamma(``input``, 1) samples, differentiable in ``input`` by the implicit
    reparameterisation: ``dx/dalpha = -(dF/dalpha) / (dF/dx)`` for the CDF ``F``.

    >>> import tessera
    >>> a = tessera.tensor([2.0, 5.0], requires_grad=True)
    >>> x = tessera._standard_gamma(a); x.sum().backward()
    >>> bool((x > 0).all()), bool((a.grad > 0).all())
    (True, True)
    """
    ensure_tensor("_standard_gamma", input)
    return dispatch(_STANDARD_GAMMA, input, generator=_gen(generator))


def _gamma_grad_infer(alpha, x):
    return Meta(broadcast_shapes("_standard_gamma_grad", alpha.shape, x.shape),
                _gamma_infer(alpha, None).dtype)


def _gamma_grad_kernel(alpha, x):
    """d x / d alpha at fixed CDF value. F'(alpha) by Richardson-extrapolated central
    differences of the regularised incomplete gamma function, taken on the tail that keeps
    its relative precision (P below the median, -Q above), over the density in log space;
    relative error about 1e-12 (PyTorch's rational approximations: about 1e-4)."""
    sp = _scipy_special()
    a, v = np.broadcast_arrays(alpha.astype(np.float64), x.astype(np.float64))
    with np.errstate(all="ignore"):
        lower = sp.gammainc(a, v) < 0.5

        def cdf(b):
            return np.where(lower, sp.gammainc(b, v), -sp.gammaincc(b, v))

        h = 1e-3 * np.minimum(a, np.sqrt(a))  # small beside alpha's scale of variation
        wide = (cdf(a + h) - cdf(a - h)) / (2 * h)
        narrow = (cdf(a + h / 2) - cdf(a - h / 2)) / h
        log_density = (a - 1) * np.log(v) - v - sp.gammaln(a)
        out = -(4 * narrow - wide) / 3 * np.exp(-log_density)
    out = np.where(v == 0, 0.0, np.where(a > 0, out, np.nan))
    return out.astype(alpha.dtype)


def _scipy_special():
    import scipy.special  # lazily: only the gamma gradient needs it
    return scipy.special


_STANDARD_GAMMA_GRAD = defop("_standard_gamma_grad", _gamma_grad_infer, _gamma_grad_kernel,
                             grad=None, cost=cost.elementwise(200))


def _standard_gamma_grad(self: Tensor, output: Tensor) -> Tensor:
    """The derivative of a Gamma(``self``, 1) sample ``output`` in its concentration.

    >>> import tessera
    >>> tessera._standard_gamma_grad(tessera.tensor([1.0]), tessera.tensor([0.5]))
    tensor([0.8070])
    """
    ensure_tensor("_standard_gamma_grad", self)
    ensure_tensor("_standard_gamma_grad", output)
    return dispatch(_STANDARD_GAMMA_GRAD, self, output)


# ---- in-place distributions (x.uniform_(), x.normal_(), ...) -------------------------

def _fill_op(name: str, check, sample, flops: int):
    """An op writing samples of one distribution into its input's shape and dtype.

    ``check(dtype, **params)`` validates; ``sample(np_gen, shape, dtype, **params)`` draws,
    with ``flops`` operations per element. The input's values are never read.
    """
    def infer(x, generator, **params):
        check(x.dtype, **params)
        return Meta(x.shape, x.dtype)

    def kernel(x, generator, **params):
        return sample(generator._np, x.shape, D.from_numpy_dtype(x.dtype), **params)

    def inplace(t, x, generator, **params):
        np.copyto(t, kernel(x, generator, **params), casting="unsafe")

    return defop(name, infer, kernel, grad=_zero_grads, save=(),
                 inplace_kernels={"cpu": inplace}, cost=cost.output_only(flops))


def _check_uniform(dt, low, high):
    _floating_only(dt, "check_uniform_bounds")
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                           f"from={_fmt(low)} > to={_fmt(high)}")


def _check_normal(dt, mean, std):
    _floating_only(dt, "normal_kernel_cpu")
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {_fmt(std)}")


def _continuous(dt, what):
    if dt.category < 2:
        raise RuntimeError(f"{what} distribution is a continuous probability distribution. "
                           f"dtype must be a floating point but you specified "
                           f"{_SNAME[dt.name] if what == 'Exponential' else _CNAME[dt.name]}")


def _check_exponential(dt, lambd):
    _continuous(dt, "Exponential")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={_fmt(lambd)}")


def _check_geometric(dt, p):
    if dt is D.bool_ or dt.is_complex:
        raise NotImplementedError(f'"geometric_cpu" not implemented for \'{_SNAME[dt.name]}\'')
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={_fmt(p)}")


def _check_log_normal(dt, mean, std):
    _floating_only(dt, "log_normal_cpu")
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={_fmt(std)}")


def _check_cauchy(dt, median, sigma):
    _continuous(dt, "Cauchy")
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={_fmt(sigma)}")


def _check_random(dt, low, high):
    if dt.is_complex:
        raise NotImplementedError(f'"random_kernel_cpu" not implemented for '
                                  f"'{_SNAME[dt.name]}'")
    _check_range(low, high + 1, dt)


def _as(dt):
    return dt.np


_UNIFORM = _fill_op("uniform_", _check_uniform, lambda g, s, dt, low, high: (
    low + (high - low) * _uniform01(g, s, dt)).astype(_as(dt)), 3)
_NORMAL_ = _fill_op("normal_", _check_normal, lambda g, s, dt, mean, std: (
    mean + std * _std_normal(g, s, dt)).astype(_as(dt)), 3)
_EXPONENTIAL = _fill_op("exponential_", _check_exponential, lambda g, s, dt, lambd: (
    g.standard_exponential(s) / lambd).astype(_as(dt)), 2)
_GEOMETRIC = _fill_op("geometric_", _check_geometric, lambda g, s, dt, p: (
    g.geometric(p, s)).astype(_as(dt)), 1)
# exp of a normal draw, scaled and shifted
_LOG_NORMAL = _fill_op("log_normal_", _check_log_normal, lambda g, s, dt, mean, std: (
    g.lognormal(mean, std, s)).astype(_as(dt)), 4)
_CAUCHY = _fill_op("cauchy_", _check_cauchy, lambda g, s, dt, median, sigma: (
    median + sigma * g.standard_cauchy(s)).astype(_as(dt)), 3)
# high is inclusive here: the default range of random_() reaches the dtype's maximum
_RANDOM = _fill_op("random_", _check_random, lambda g, s, dt, low, high: (
    g.integers(low, high, s, dtype=np.int64, endpoint=True)).astype(_as(dt)), 1)


def _fill(op, input, **params):
    ensure_tensor(op.name, input)
    return dispatch_inplace(op, input, input, generator=_gen(params.pop("generator")),
                            **params)


def uniform_(input, *args, generator=None, **kwargs) -> Tensor:
    """Fill ``input`` with uniform samples in ``[from, to)`` (defaults 0 and 1)."""
    low, high = _from_to(args, kwargs, 0.0, 1.0)
    return _fill(_UNIFORM, input, low=float(low), high=float(high), generator=generator)


def _from_to(args, kwargs, d_from, d_to):
    """``from``/``to`` given positionally or as keywords (``from`` is a Python keyword)."""
    vals = dict(zip(("from", "to"), args))
    vals.update(kwargs)
    unknown = set(vals) - {"from", "to"}
    if unknown:
        raise TypeError(f"got an unexpected keyword argument '{unknown.pop()}'")
    return vals.get("from", d_from), vals.get("to", d_to)


def normal_(input, mean=0.0, std=1.0, *, generator=None) -> Tensor:
    """Fill ``input`` with normal samples."""
    return _fill(_NORMAL_, input, mean=float(mean), std=float(std), generator=generator)


def exponential_(input, lambd=1.0, *, generator=None) -> Tensor:
    """Fill ``input`` with exponential samples of rate ``lambd``."""
    return _fill(_EXPONENTIAL, input, lambd=float(lambd), generator=generator)


def geometric_(input, p, *, generator=None) -> Tensor:
    """Fill ``input`` with the number of Bernoulli(p) trials up to the first success."""
    return _fill(_GEOMETRIC, input, p=float(p), generator=generator)


def log_normal_(input, mean=1.0, std=2.0, *, generator=None) -> Tensor:
    """Fill ``input`` with ``exp`` of normal(mean, std) samples."""
    return _fill(_LOG_NORMAL, input, mean=float(mean), std=float(std), generator=generator)


def cauchy_(input, median=0.0, sigma=1.0, *, generator=None) -> Tensor:
    """Fill ``input`` with Cauchy samples."""
    return _fill(_CAUCHY, input, median=float(median), sigma=float(sigma),
                 generator=generator)


def random_(input, *args, generator=None, **kwargs) -> Tensor:
    """Fill with integers uniform in ``[from, to)``: ``random_(to)``, ``random_(from, to)``;
    without ``to`` the range ends at the dtype's largest integer (2**mantissa for floats)."""
    ensure_tensor("random_", input)
    if len(args) == 1 and "to" not in kwargs:
        args = (0, args[0])
    low, high = _from_to(args, kwargs, 0, None)
    low = _int_arg("from", low)
    if high is None:
        b = _int_bounds(input.dtype)
        high = b[1] if b is not None else 1 << _MANTISSA.get(input.dtype.name, 24)
    else:
        high = _int_arg("to", high) - 1
    return _fill(_RANDOM, input, low=low, high=high, generator=generator)


def bernoulli_(input, p=0.5, *, generator=None) -> Tensor:
    """Fill ``input`` with 0/1 samples, 1 with probability ``p`` (a float or a tensor that
    broadcasts to ``input``)."""
    ensure_tensor("bernoulli_", input)
    if not isinstance(p, Tensor):
        p = float(p)
    return dispatch_inplace(_BERNOULLI_, input, input, p, generator=_gen(generator))


def _bernoulli_fill_infer(x, p, generator):
    if x.dtype.is_complex:
        raise NotImplementedError(f'"bernoulli_scalar_cpu_" not implemented for '
                                  f"'{_SNAME[x.dtype.name]}'")
    return _bernoulli_infer(x, p, generator)


def _bernoulli_fill_inplace(t, x, p, generator):
    np.copyto(t, _bernoulli_kernel(x, p, generator), casting="unsafe")


_BERNOULLI_ = defop("bernoulli_", _bernoulli_fill_infer, _bernoulli_kernel,
                    grad=_zero_grads, save=(), inplace_kernels={"cpu": _bernoulli_fill_inplace},
                    cost=_bernoulli_cost)
