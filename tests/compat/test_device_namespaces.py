"""torch.cuda, torch.amp, torch.accelerator and torch.backends as PyTorch's CPU build
answers them: each call runs on torch 2.13 and on tessera, and the results, exception
types, messages and warnings must agree."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tessera


def _outcome(fn):
    """(result or exception type and message, warning categories and messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            r = fn()
            res = ("ok", r.replace("torch", "tessera") if isinstance(r, str) else r
                   if isinstance(r, (bool, int, float, type(None), list, tuple))
                   else type(r).__name__)
        except Exception as e:  # noqa: BLE001  (the exception is the outcome compared)
            res = ("raises", type(e).__name__, str(e).replace("torch", "tessera"))
    return res, [(w.category.__name__, str(w.message).replace("torch.", "tessera.")
                  .partition(" (Triggered internally")[0]) for w in caught]


def same(expr: str, *, message: bool = True):
    ref = _outcome(lambda: eval(expr, {"lib": torch}))
    got = _outcome(lambda: eval(expr, {"lib": tessera}))
    if not message and ref[0][0] == "raises":
        ref, got = (ref[0][:2], ref[1]), (got[0][:2], got[1])
    assert got == ref, expr


CUDA = ["lib.cuda.is_available()", "lib.cuda.device_count()", "lib.cuda.manual_seed(1)",
        "lib.cuda.manual_seed_all(1)", "lib.cuda.seed()", "lib.cuda.seed_all()",
        "lib.cuda.synchronize()", "lib.cuda.current_device()", "lib.cuda.get_device_name()",
        "lib.cuda.get_device_name(0)", "lib.cuda.empty_cache()",
        "lib.cuda.memory_allocated()", "lib.cuda.max_memory_allocated()",
        "lib.cuda.memory_reserved()", "lib.cuda.max_memory_reserved()",
        "lib.cuda.is_bf16_supported()", "lib.cuda.is_initialized()",
        "lib.cuda.get_device_properties(0)", "lib.cuda.get_device_capability()",
        "lib.cuda.initial_seed()", "lib.cuda.get_rng_state()", "lib.cuda.get_rng_state_all()",
        "lib.cuda.current_stream()", "lib.cuda.Stream()", "lib.cuda.Event()",
        "lib.cuda.get_arch_list()", "lib.cuda.mem_get_info()", "lib.cuda.set_device(-1)",
        "lib.version.cuda", "lib.backends.cuda.is_built()"]


@pytest.mark.parametrize("expr", CUDA)
def test_cuda(expr):
    same(expr)


@pytest.mark.parametrize("expr", ["lib.cuda.set_device(0)", "lib.cuda.reset_peak_memory_stats()"])
def test_cuda_calls_that_fail_in_pytorch_cpu(expr):
    same(expr, message=False)  # PyTorch's message names its C extension


TENSORS = ["lib.ones(2).cuda()", "lib.ones(2).cuda(0)", "lib.ones(2).to('cuda')",
           "lib.ones(2).to('cuda:0', non_blocking=True)",
           "lib.tensor([1.0], device='cuda')", "lib.zeros(2, device='cuda')",
           "lib.randn(2, device='cuda')", "lib.arange(3, device='cuda')",
           "lib.ones(2).to('xpu')", "lib.ones(2).xpu()", "lib.ones(2).to('mps')",
           "lib.ones(2).to('xla')", "lib.device('cuda')", "lib.device('cuda', 1)",
           "lib.device('mps')", "lib.device('foo')", "lib.ones(2).pin_memory()",
           "lib.nn.Linear(2, 2).cuda()"]


@pytest.mark.parametrize("expr", TENSORS)
def test_cuda_tensors(expr):
    # messages differ where PyTorch's names its C++ library, or lists tessera's extra
    # ``global`` device type
    same(expr, message="foo" not in expr)


def test_cast_to_legacy_cuda_type():
    """A deliberate difference: PyTorch's CPU build raises a RuntimeError about loading its
    CUDA library; tessera raises the error every other CUDA request gives."""
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        tessera.ones(2).type("torch.cuda.FloatTensor")


def test_cpu_fallback_idiom():
    device = tessera.device("cuda" if tessera.cuda.is_available() else "cpu")
    assert tessera.ones(2).to(device).device == tessera.device("cpu")
    assert tessera.nn.Linear(2, 2).to(device).weight.device.type == "cpu"
    assert str(tessera.device("cuda:0")) == str(torch.device("cuda:0"))


AMP = ["lib.cuda.amp.GradScaler()", "lib.cuda.amp.GradScaler(enabled=False)",
       "lib.cuda.amp.GradScaler().is_enabled()", "lib.cuda.amp.autocast()",
       "lib.amp.autocast('cuda')", "lib.amp.GradScaler('cpu').is_enabled()",
       "lib.amp.GradScaler().is_enabled()", "lib.amp.GradScaler('cuda').get_scale()",
       "lib.autocast('cpu', dtype=lib.bfloat16)", "lib.autocast('cpu', dtype=lib.float32)",
       "lib.amp.is_autocast_available('cpu')",
       "lib.is_autocast_enabled('cpu')", "str(lib.get_autocast_dtype('cpu'))",
       "str(lib.get_autocast_dtype('cuda'))", "lib.amp.GradScaler('cpu').state_dict()"]


@pytest.mark.parametrize("expr", AMP)
def test_amp(expr):
    same(expr)


def test_autocast_bad_device_type():
    same("lib.autocast(device_type='foo')", message=False)


def test_autocast_cpu_casts_matmuls():
    a, b = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)[:, :, :3]
    results = {}
    for lib in (torch, tessera):
        x, w = lib.tensor(a), lib.tensor(b.T.copy())
        with lib.autocast("cpu", dtype=lib.bfloat16):
            y = x @ w
            inner = lib.is_autocast_enabled("cpu")
            with lib.autocast("cpu", enabled=False):
                z = x @ w
        results[lib.__name__] = (str(y.dtype), inner, str(z.dtype), y.float().tolist(),
                                 lib.is_autocast_enabled("cpu"))
    ref, got = results["torch"], results["tessera"]
    assert got[:3] == tuple(s.replace("torch", "tessera") if isinstance(s, str) else s
                            for s in ref[:3])
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-2, atol=1e-2)
    assert got[4] is ref[4] is False


# layers PyTorch's CPU autocast runs as one op, built from several in tessera: the bias add
# must not promote the product back to float32
AUTOCAST_COMPOSITES = {
    "linear": "F.linear(a, w, b)", "linear_3d": "F.linear(a3, w, b)",
    "Linear": "lib.nn.Linear(3, 4)(a)", "addmm": "lib.addmm(b, a, w.t())",
    "baddbmm": "lib.baddbmm(lib.randn(2, 2, 4), a3, lib.randn(2, 3, 4))",
    "addbmm": "lib.addbmm(lib.randn(2, 4), a3, lib.randn(2, 3, 4))",
    "addmv": "lib.addmv(b, w, lib.randn(3))",
    "bilinear": "F.bilinear(a, a, lib.randn(5, 3, 3), lib.randn(5))",
    "mha": "lib.nn.MultiheadAttention(4, 2)(q, q, q)[0]",
    "conv1d": "lib.nn.Conv1d(2, 3, 2)(lib.randn(1, 2, 5))",
    "conv_transpose1d": "lib.nn.ConvTranspose1d(2, 3, 2)(lib.randn(1, 2, 5))",
    "lstm": "lib.nn.LSTM(3, 4)(a3)[0]", "gru": "lib.nn.GRU(3, 4)(a3)[0]",
    "rnn": "lib.nn.RNN(3, 4)(a3)[0]",
    "encoder_layer": "lib.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0)(q)",
}


@pytest.mark.parametrize("name", sorted(AUTOCAST_COMPOSITES))
def test_autocast_cpu_composite_dtypes(name):
    dtypes = []
    for lib in (torch, tessera):
        lib.manual_seed(0)
        env = {"lib": lib, "F": lib.nn.functional, "a": lib.randn(2, 3), "w": lib.randn(4, 3),
               "b": lib.randn(4), "a3": lib.randn(2, 2, 3), "q": lib.randn(3, 1, 4)}
        with lib.autocast("cpu", dtype=lib.bfloat16):
            y = eval(AUTOCAST_COMPOSITES[name], env)
        dtypes.append(str(y.dtype).split(".")[1])
    assert dtypes[1] == dtypes[0]


def test_autocast_linear_backward_float32_grads():
    grads = []
    for lib in (torch, tessera):
        lib.manual_seed(0)
        lin = lib.nn.Linear(3, 2)
        x = lib.ones(4, 3)
        with lib.autocast("cpu", dtype=lib.bfloat16):
            y = lin(x)
        y.float().sum().backward()
        grads.append((str(lin.weight.grad.dtype).split(".")[1], lin.bias.grad.tolist()))
    assert grads[1] == grads[0]


def test_grad_scaler_on_cpu_matches_torch():
    """Scaling, unscaling, an overflowing step that is skipped, and the scale's updates."""
    traces = {}
    for lib in (torch, tessera):
        w = lib.nn.Parameter(lib.tensor([1.0, -2.0]))
        opt = lib.optim.SGD([w], lr=0.1)
        scaler = lib.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
        trace = []
        for step in range(5):
            opt.zero_grad()
            loss = (w * w).sum() * (float("inf") if step == 2 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            trace.append((w.detach().tolist(), scaler.get_scale()))
        traces[lib.__name__] = (trace, scaler.state_dict())
    assert traces["tessera"] == traces["torch"]


ACCEL = ["lib.accelerator.is_available()", "lib.accelerator.current_accelerator()",
         "lib.accelerator.device_count()", "lib.accelerator.current_device_index()",
         "lib.accelerator.synchronize()", "lib.accelerator.memory_allocated()",
         "lib.accelerator.empty_cache()", "lib.accelerator.set_device_index(0)"]


@pytest.mark.parametrize("expr", ACCEL)
def test_accelerator(expr):
    same(expr)


BACKENDS = ["lib.backends.cudnn.is_available()", "lib.backends.cudnn.enabled",
            "lib.backends.cudnn.benchmark", "lib.backends.cudnn.deterministic",
            "lib.backends.cudnn.allow_tf32", "lib.backends.cudnn.version()",
            "lib.backends.mps.is_available()", "lib.backends.mps.is_built()",
            "lib.backends.mkldnn.is_available()", "lib.backends.mkldnn.enabled",
            "lib.backends.openmp.is_available()", "lib.backends.opt_einsum.enabled",
            "lib.backends.opt_einsum.strategy", "lib.backends.cuda.matmul.allow_tf32",
            "lib.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
            "lib.backends.cuda.matmul.foo", "lib.backends.cpu.get_cpu_capability()",
            "lib.get_float32_matmul_precision()", "lib.are_deterministic_algorithms_enabled()",
            "lib.set_float32_matmul_precision('nope')"]


@pytest.mark.parametrize("expr", BACKENDS)
def test_backends_read(expr):
    same(expr)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_backends_settable():
    import tessera.backends.cudnn as cudnn
    for lib in (torch, tessera):
        b = lib.backends
        saved = (b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32)
        b.cudnn.benchmark, b.cudnn.deterministic = True, True
        b.cuda.matmul.allow_tf32 = True
        assert (b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32) == \
            (True, True, True)
        with b.mkldnn.flags(enabled=False):
            assert b.mkldnn.enabled is False
        assert b.mkldnn.enabled is True
        lib.use_deterministic_algorithms(True)
        assert lib.are_deterministic_algorithms_enabled()
        lib.use_deterministic_algorithms(False)
        b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32 = saved
    assert cudnn is tessera.backends.cudnn


FLAGS = [n for n in dir(torch.Tensor) if n.startswith("is_")]


@pytest.mark.parametrize("name", FLAGS)
def test_tensor_is_flags(name):
    """Every ``is_*`` of PyTorch's Tensor, on a float and an int tensor."""
    for make in ("lib.ones(2)", "lib.tensor([3])", "lib.zeros(())"):
        expr = f"{make}.{name}"
        ref = getattr(eval(make, {"lib": torch}), name)
        if callable(ref):
            args = "(" + (f"{make}" if name in ("is_same_size", "is_set_to") else "") + ")"
            expr += args
        same(expr)


LEGACY = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
          "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_constructors(name):
    for args in ("(2, 3).shape", "([1, 0, 2]).tolist()", "().shape", "([[1, 2], [3, 4]])"
                 ".dtype", "(lib.Size([2])).shape", "((1, 0))", "(2.5)", "(2, device='meta')"):
        same(f"lib.{name}{args}".replace("((1, 0))", "((1, 0)).tolist()")
             .replace("lib.Size([2])", "lib.Size([2])"))
    same(f"isinstance(lib.ones(2), lib.{name})")
    same(f"isinstance(lib.ones(2).to(lib.{name}.dtype), lib.{name})")
    same(f"lib.ones(2).type(lib.{name}).dtype.is_floating_point")
    same(f"lib.ones(2).type('torch.{name}').type()")
    same(f"issubclass(lib.{name}, lib.Tensor)")
    same(f"str(lib.{name}.dtype)")


def test_legacy_type_errors():
    same("lib.FloatTensor(lib.ones(2, dtype=lib.long))", message=False)
    same("lib.ones(2).type('torch.Foo')")
    same("lib.FloatTensor(lib.ones(2)).tolist()")
    same("lib.ones(2).type()")
    same("lib.ones(2, requires_grad=True).type(lib.DoubleTensor).requires_grad")


def test_layouts():
    for expr in ("str(lib.ones(2).layout)", "str(lib.strided)", "str(lib.channels_last)",
                 "isinstance(lib.channels_last, lib.memory_format)",
                 "isinstance(lib.strided, lib.layout)",
                 "isinstance(lib.channels_last, lib.layout)"):
        same(expr)
