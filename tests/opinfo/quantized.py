"""Op-info entries: fake quantization (values and straight-through gradients), quantize and
dequantize, and the INT8 ops of quantized inference against ``torch.ops.quantized``.

Quantized results are compared on their integers; PyTorch's x86 kernels (fbgemm) add the
bias in float where tessera quantizes it to int32 (as ONNX's QDQ form does), so the
products may differ by one step of the output's scale.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

F32 = (np.float32,)


def _fq_samples(rng, dt):
    for s in [(), (5,), (3, 4), (2, 3, 4), (0, 3)]:
        yield Sample((make(rng, s, dt, -3.0, 3.0),))
    yield Sample((make(rng, (4,), dt),), dict(bad=True))


def _fq_pt(L, x, bad=False):
    if bad:
        return L.fake_quantize_per_tensor_affine(x, 0.1, 3, 10, 0)
    return L.fake_quantize_per_tensor_affine(x, 0.05, 7, -20, 100)


def _pc_samples(rng, dt):
    for shape, axis in [((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1), ((2, 3, 4), -1)]:
        ch = shape[axis]
        yield Sample((make(rng, shape, dt, -3.0, 3.0),
                      make(rng, (ch,), np.float32, 0.02, 0.2),
                      rng.integers(-5, 5, ch).astype(np.int32)), dict(axis=axis),
                     grad_args=(0,))
    yield Sample((make(rng, (3, 4), dt), make(rng, (2,), np.float32, 0.1, 0.2),
                  np.zeros(2, np.int32)), dict(axis=0), grad_args=(0,))


def _fq_pc(L, x, s, z, axis):
    return L.fake_quantize_per_channel_affine(x, s, z, axis, -30, 30)


def _lsq_samples(rng, dt):
    for s in [(5,), (3, 4), (2, 3, 4)]:
        yield Sample((make(rng, s, dt, -3.0, 3.0), np.array([0.07], dt),
                      np.array([2.4], dt)))


def _lsq(L, x, s, z):
    return L._fake_quantize_learnable_per_tensor_affine(x, s, z, -20, 40, 0.5)


def _lsq_bw(L, g, x, s, z):
    if _torch_ops(L) is not None:  # torch keeps it among the aten ops only
        L = L.ops.aten
    return L._fake_quantize_learnable_per_tensor_affine_backward(g, x, s, z, -20, 40, 0.5)


def _lsq_bw_samples(rng, dt):
    for s in [(5,), (3, 4)]:
        yield Sample((make(rng, s, dt), make(rng, s, dt, -3.0, 3.0), np.array([0.07], dt),
                      np.array([2.6], dt)))


def _unary(shapes=((), (5,), (3, 4), (2, 3, 4)), low=-3.0, high=3.0):
    def gen(rng, dt):
        for s in shapes:
            yield Sample((make(rng, s, dt, low, high),))
    return gen


def _qpt(L, x):
    return L.quantize_per_tensor(x, 0.03, 60, L.quint8).int_repr()


def _qpt_s8(L, x):
    return L.quantize_per_tensor(x, 0.03, -3, L.qint8).int_repr()


def _deq(L, x):
    return L.quantize_per_tensor(x, 0.03, 60, L.quint8).dequantize()


def _qpc_samples(rng, dt):
    yield Sample((make(rng, (3, 4), dt, -3.0, 3.0), make(rng, (4,), dt, 0.01, 0.05),
                  rng.integers(-5, 5, 4).astype(np.int64)))


def _qpc(L, x, s, z):
    return L.quantize_per_channel(x, s.double(), z, 1, L.qint8).int_repr()


def _deq_pc(L, x, s, z):
    return L.quantize_per_channel(x, s.double(), z, 1, L.qint8).dequantize()


def _qx(L, x, scale=0.03, zp=60):
    return L.quantize_per_tensor(x, scale, zp, L.quint8)


def _qw(L, w, axis=0):
    ch = w.shape[axis]
    s = (w.abs().amax(dim=tuple(d for d in range(w.dim()) if d != axis)) / 127).clamp(min=1e-4)
    return L.quantize_per_channel(w, s.double(), L.zeros(ch, dtype=L.int64, device=w.device),
                                 axis, L.qint8)


def _torch_ops(L):
    import torch
    return None if L is not torch else torch.ops.quantized


def _linear(L, x, w, b, relu=False):
    qx, qw = _qx(L, x), _qw(L, w)
    tq = _torch_ops(L)
    if tq is None:
        return L.ops.quantized.linear(qx, qw, b, 0.05, 70, relu=relu).int_repr()
    packed = tq.linear_prepack(qw, b)
    f = tq.linear_relu if relu else tq.linear
    return f(qx, packed, 0.05, 70).int_repr()


def _linear_samples(rng, dt):
    for (m, k, n) in [(4, 3, 2), (5, 33, 20), (1, 64, 17)]:
        yield Sample((make(rng, (m, k), dt), make(rng, (n, k), dt, -1, 1),
                      make(rng, (n,), dt, -0.5, 0.5)))
    yield Sample((make(rng, (2, 3, 8), dt), make(rng, (4, 8), dt, -1, 1), None),
                 dict(relu=True))


def _linear_dyn(L, x, w, b):
    qw = _qw(L, w)
    tq = _torch_ops(L)
    if tq is None:
        return L.ops.quantized.linear_dynamic(x, qw, b, reduce_range=True)
    return tq.linear_dynamic(x, tq.linear_prepack(qw, b), True)


def _conv(L, x, w, b, stride=1, padding=0, groups=1, relu=False):
    qx, qw = _qx(L, x), _qw(L, w)
    tq = _torch_ops(L)
    st, pad, dil = (stride, stride), (padding, padding), (1, 1)
    if tq is None:
        return L.ops.quantized.conv2d(qx, qw, b, st, pad, dil, groups, 0.05, 70,
                                      relu=relu).int_repr()
    packed = tq.conv2d_prepack(qw, b, st, pad, dil, groups)
    f = tq.conv2d_relu if relu else tq.conv2d
    return f(qx, packed, 0.05, 70).int_repr()


def _conv_samples(rng, dt):
    yield Sample((make(rng, (1, 3, 6, 6), dt), make(rng, (4, 3, 3, 3), dt, -1, 1),
                  make(rng, (4,), dt, -0.3, 0.3)))
    yield Sample((make(rng, (2, 4, 7, 5), dt), make(rng, (6, 2, 3, 3), dt, -1, 1), None),
                 dict(stride=2, padding=1, groups=2, relu=True))
    # depthwise (the C kernel of its own) and 1x1 (the GEMM straight on the NHWC copy)
    yield Sample((make(rng, (1, 4, 7, 6), dt), make(rng, (4, 1, 3, 3), dt, -1, 1),
                  make(rng, (4,), dt, -0.3, 0.3)), dict(stride=2, padding=1, groups=4))
    yield Sample((make(rng, (2, 4, 7, 5), dt), make(rng, (8, 1, 3, 3), dt, -1, 1), None),
                 dict(padding=1, groups=4, relu=True))
    yield Sample((make(rng, (1, 8, 5, 5), dt), make(rng, (6, 8, 1, 1), dt, -1, 1), None))


def _add(L, a, b, relu=False):
    qa, qb = _qx(L, a), _qx(L, b, 0.02, 100)
    tq = _torch_ops(L)
    if tq is None:
        return L.ops.quantized.add(qa, qb, 0.05, 80, relu=relu).int_repr()
    return (tq.add_relu if relu else tq.add)(qa, qb, 0.05, 80).int_repr()


def _binary_samples(rng, dt):
    yield Sample((make(rng, (3, 4), dt), make(rng, (3, 4), dt)))
    yield Sample((make(rng, (2, 3, 4), dt), make(rng, (2, 3, 4), dt)), dict(relu=True))


def _relu(L, x):
    q = _qx(L, x)
    return (L.ops.quantized.relu(q) if _torch_ops(L) is None else L.relu(q)).int_repr()


def _pool(L, x):
    q = _qx(L, x)
    if _torch_ops(L) is None:
        return L.ops.quantized.max_pool2d(q, 2, 2, 1).int_repr()
    return L.nn.functional.max_pool2d(q, 2, 2, 1).int_repr()


def _avg(L, x):
    q = _qx(L, x)
    if _torch_ops(L) is None:
        return L.ops.quantized.adaptive_avg_pool2d(q, 1).int_repr()
    return L.nn.functional.adaptive_avg_pool2d(q, 1).int_repr()


def _cat(L, a, b):
    qa, qb = _qx(L, a), _qx(L, b, 0.02, 100)
    tq = _torch_ops(L)
    if tq is None:
        return L.ops.quantized.cat([qa, qb], 1, 0.05, 80).int_repr()
    return tq.cat([qa, qb], 1, 0.05, 80).int_repr()


_Q = dict(dtypes=F32, differentiable=False, atol=1, rtol=0)

register(
    OpInfo("fake_quantize_per_tensor_affine", _fq_pt, _fq_samples, gradcheck=False),
    OpInfo("fake_quantize_per_channel_affine", _fq_pc, _pc_samples, gradcheck=False),
    OpInfo("_fake_quantize_learnable_per_tensor_affine", _lsq, _lsq_samples, dtypes=F32,
           gradcheck=False, grad_atol=1e-3, grad_rtol=1e-4),
    OpInfo("_fake_quantize_learnable_per_tensor_affine_backward", _lsq_bw, _lsq_bw_samples,
           dtypes=F32, differentiable=False, atol=1e-5, rtol=1e-5),
    OpInfo("quantize_per_tensor", _qpt, _unary(), dtypes=F32, differentiable=False),
    OpInfo("quantize_per_tensor_qint8", _qpt_s8, _unary(), dtypes=F32, differentiable=False,
           covers=("quantize_per_tensor",)),
    OpInfo("dequantize", _deq, _unary(), dtypes=F32, differentiable=False,
           covers=("quantize_per_tensor", "dequantize")),
    OpInfo("quantize_per_channel", _qpc, _qpc_samples, dtypes=F32, differentiable=False),
    OpInfo("dequantize_per_channel", _deq_pc, _qpc_samples, dtypes=F32, differentiable=False,
           covers=("quantize_per_channel", "dequantize_per_channel")),
    OpInfo("quantized_linear", _linear, _linear_samples, noncontiguous=False, **_Q),
    OpInfo("quantized_linear_dynamic", _linear_dyn, _linear_samples, dtypes=F32,
           differentiable=False, noncontiguous=False, atol=0.03, rtol=0.02),
    OpInfo("quantized_conv2d", _conv, _conv_samples, noncontiguous=False, **_Q),
    OpInfo("quantized_add", _add, _binary_samples, **_Q),
    OpInfo("quantized_relu", _relu, _unary(), **_Q),
    OpInfo("quantized_max_pool2d", _pool, _unary(((1, 2, 5, 5), (2, 3, 4, 6))), **_Q),
    OpInfo("quantized_adaptive_avg_pool2d", _avg, _unary(((1, 2, 5, 5), (2, 3, 4, 6))), **_Q),
    OpInfo("quantized_cat", _cat, _binary_samples, **_Q),
)
