"""Op-info entries: nn.functional convolutions (conv1d/2d/3d, conv_transpose1d/2d/3d).

Samples sweep stride, padding (ints, tuples, 'same' with odd and even kernels, 'valid'),
dilation, groups (incl. depthwise), bias, unbatched and zero-batch inputs, and PyTorch's
errors. Small samples (<= 60 elements) also run the float64 finite-difference gradcheck.
float32 tolerances allow for a different summation order than PyTorch's (mkldnn) kernels.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

CONV_OPS = ("conv", "conv_input_grad", "conv_weight_grad")


def _conv_cases(nd):
    """(x shape, w shape, bias?, kwargs) for an nd-d convolution."""
    s = {1: (7,), 2: (5, 6), 3: (4, 3, 5)}[nd]
    small = {1: (5,), 2: (4, 4), 3: (3, 3, 3)}[nd]
    k3 = (3,) * nd
    k2 = (2,) * nd
    ks = {1: (2,), 2: (2, 3), 3: (2, 1, 3)}[nd]
    cases = [
        ((2, 3) + s, (4, 3) + k3, True, {}),
        ((1, 2) + small, (2, 2) + k2, True, {}),                          # gradcheck size
        ((1, 2) + small, (2, 1) + k2, False, dict(groups=2)),
        ((2, 4) + s, (4, 1) + k3, True, dict(groups=4, padding=1)),        # depthwise
        ((2, 4) + s, (6, 2) + ks, True, dict(groups=2, stride=2, padding=1, dilation=1)),
        ((2, 3) + s, (2, 3) + k2, False, dict(stride=(2,) * nd, dilation=(2,) * nd)),
        ((2, 3) + s, (2, 3) + ks, True, dict(padding="same")),
        ((2, 3) + s, (2, 3) + k2, False, dict(padding="same", dilation=2)),
        ((1, 2) + small, (2, 2) + k2, True, dict(padding="same")),         # even kernel
        ((2, 3) + s, (2, 3) + k3, True, dict(padding="valid")),
        ((3,) + s, (2, 3) + k3, True, dict(padding=1)),                    # unbatched
        ((0, 3) + s, (2, 3) + k3, True, {}),                               # zero batch
        ((2, 3) + s, (2, 3) + (1,) * nd, True, dict(stride=2)),            # 1x1
        ((1, 2) + small, (3, 2) + k2, True, dict(padding=tuple(range(1, nd + 1)),
                                                 stride=tuple(range(1, nd + 1)))),
        # errors
        ((2, 4) + s, (6, 4) + k3, False, dict(groups=3)),
        ((2, 4) + s, (6, 3) + k3, False, {}),
        ((2, 3) + s, (2, 3) + k3, False, dict(padding="same", stride=2)),
        ((2, 3) + s, (2, 3) + k3, False, dict(padding="foo")),
        ((2, 3) + s, (2, 3) + k3, False, dict(padding=-1)),
        ((2, 3) + s, (2, 3) + k3, False, dict(stride=0)),
        ((2, 3) + s, (2, 3) + k3, False, dict(dilation=0)),
        ((2, 3) + s, (2, 3) + k3, False, dict(groups=0)),
        ((2, 3) + (1,) * nd, (2, 3) + k3, False, {}),                      # kernel too big
        ((3,), (2, 3) + k3, False, {}),                                    # too few dims
        ((2, 3) + s, (2, 3) + k3, False, dict(stride=(1,) * (nd + 1))),
    ]
    return cases


def conv_samples(nd):
    def gen(rng, dtype):
        for xs, ws, bias, kw in _conv_cases(nd):
            args = [make(rng, xs, dtype), make(rng, ws, dtype)]
            if bias:
                args.append(make(rng, ws[:1], dtype))
            yield Sample(tuple(args), kw)
        # a bias of the wrong size
        yield Sample((make(rng, (2, 3) + (5,) * nd, dtype), make(rng, (2, 3) + (3,) * nd, dtype),
                      make(rng, (3,), dtype)))
    return gen


def _convt_cases(nd):
    s = {1: (5,), 2: (4, 3), 3: (3, 2, 3)}[nd]
    small = {1: (4,), 2: (3, 3), 3: (2, 2, 2)}[nd]
    k3 = (3,) * nd
    k2 = (2,) * nd
    return [
        ((2, 3) + s, (3, 2) + k3, True, {}),
        ((1, 2) + small, (2, 2) + k2, True, {}),
        ((1, 2) + small, (2, 1) + k2, True, dict(stride=2, output_padding=1)),
        ((2, 4) + s, (4, 2) + k3, True, dict(stride=2, padding=1, output_padding=1, groups=2)),
        ((2, 4) + s, (4, 1) + k2, False, dict(groups=4, dilation=2)),      # depthwise
        ((2, 3) + s, (3, 2) + k3, True, dict(stride=1, padding=1, output_padding=1,
                                             dilation=2)),                 # op >= stride
        ((2, 3) + s, (3, 2) + k2, True, dict(stride=3, padding=0, output_padding=2)),
        ((2, 3) + s, (3, 2) + k3, True, dict(stride=(2,) * nd, padding=(1,) * nd,
                                             output_padding=(1,) * nd, dilation=(1,) * nd)),
        ((3,) + s, (3, 2) + k3, True, dict(stride=2)),                     # unbatched
        ((0, 3) + s, (3, 2) + k3, True, {}),                               # zero batch
        # errors
        ((2, 3) + s, (3, 2) + k3, False, dict(output_padding=1)),          # op >= stride, dil
        ((2, 4) + s, (4, 3) + k3, False, dict(groups=3)),
        ((2, 4) + s, (3, 3) + k3, False, {}),
        ((1, 3) + (1,) * nd, (3, 2) + (1,) * nd, False, dict(padding=1)),  # output too small
        ((2, 3) + s, (3, 2) + k3, False, dict(padding="same")),
        ((3,), (3, 2) + k3, False, {}),
    ]


def convt_samples(nd):
    def gen(rng, dtype):
        for xs, ws, bias, kw in _convt_cases(nd):
            args = [make(rng, xs, dtype), make(rng, ws, dtype)]
            if bias:
                args.append(make(rng, (ws[1] * kw.get("groups", 1),), dtype))
            yield Sample(tuple(args), kw)
    return gen


def _conv_fn(name):
    return lambda L, *a, **k: getattr(L.nn.functional, name)(*a, **k)


for _nd in (1, 2, 3):
    register(OpInfo(f"nn.functional.conv{_nd}d", _conv_fn(f"conv{_nd}d"), conv_samples(_nd),
                    covers=CONV_OPS, atol=1e-4, rtol=1e-5, grad_atol=1e-3))
    register(OpInfo(f"nn.functional.conv_transpose{_nd}d", _conv_fn(f"conv_transpose{_nd}d"),
                    convt_samples(_nd), covers=CONV_OPS, atol=1e-4, rtol=1e-5,
                    grad_atol=1e-3))


def _int_conv(rng, dtype):
    yield Sample((make(rng, (2, 3, 5, 5), np.int64, -3, 3), make(rng, (4, 3, 2, 2), np.int64,
                                                                    -3, 3)), dict(padding=1))
    yield Sample((make(rng, (2, 3, 5, 5), np.int64, -3, 3), make(rng, (4, 3, 2, 2), np.int64,
                                                                    -3, 3),
                  make(rng, (4,), np.int64, -3, 3)), dict(stride=2))


# integer convolution: exact (PyTorch computes it too)
register(OpInfo("nn.functional.conv2d_int", _conv_fn("conv2d"), _int_conv,
                dtypes=(np.int64,), covers=("conv",), differentiable=False))


def _conv_pointwise(L, x, w, b, r, stride=1, padding=0, activation=None, bounds=(0.0, 0.0),
                    residual_first=False):
    """act(conv2d(x, w, b) [+ r]) [+ r]: tessera's fused op, PyTorch's ops one by one."""
    if L.__name__ == "tessera":
        from tessera.ops.conv import conv_pointwise
        return conv_pointwise(x, w, b, r, stride=(stride, stride),
                              pads=((padding, padding),) * 2, dilation=(1, 1), groups=1,
                              activation=activation, bounds=bounds,
                              residual_first=residual_first)
    y = L.nn.functional.conv2d(x, w, b, stride=stride, padding=padding)
    if r is not None and residual_first:
        y = y + r
    if activation == "relu":
        y = L.relu(y)
    elif activation == "clamp":
        y = L.nn.functional.hardtanh(y, *bounds)
    return y + r if r is not None and not residual_first else y


def _pointwise_samples(rng, dtype):
    # (x, w, stride, padding): a 1x1 on x itself, im2col with a stride, a 3x3 stride-1 the
    # Winograd rule may take, and small ones the direct or NumPy paths run
    for xs, ws, st, pd in [((1, 24, 14, 14), (40, 24, 1, 1), 1, 0),
                           ((2, 8, 15, 13), (32, 8, 3, 3), 2, 1),
                           ((1, 64, 14, 14), (64, 64, 3, 3), 1, 1),
                           ((2, 3, 6, 5), (4, 3, 3, 3), 1, 1)]:
        x, w = make(rng, xs, dtype), make(rng, ws, dtype)
        b = make(rng, ws[:1], dtype)
        n, _, h, wd = xs
        out = (n, ws[0], (h + 2 * pd - ws[2]) // st + 1, (wd + 2 * pd - ws[3]) // st + 1)
        r = make(rng, out, dtype)
        for kw in (dict(activation="relu"), dict(activation="clamp", bounds=(0.0, 6.0)),
                   dict(activation="relu", residual_first=True),
                   dict(activation="clamp", bounds=(-1.0, 0.5))):
            res = r if "residual_first" in kw or kw.get("bounds") == (-1.0, 0.5) else None
            yield Sample((x, w, b, res), dict(kw, stride=st, padding=pd))
        yield Sample((x, w, None, r), dict(stride=st, padding=pd))


# float32 Winograd rounds differently from PyTorch's direct sums (|y| up to ~50 here)
register(OpInfo("conv_pointwise", _conv_pointwise, _pointwise_samples, differentiable=False,
                gradcheck=False, atol=2e-3, rtol=1e-5))
