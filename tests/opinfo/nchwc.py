"""Op-info entries: the blocked-layout inference ops (``tessera.ops.nchwc``), each against
PyTorch's plain op: to_nchwc, then the blocked convolution (packed weights, padded bias,
its epilogue) or pooling, then from_nchwc. float32 only (the layout's one dtype), no
gradients (inference ops)."""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register


def _conv(L, x, w, b, wp, bp, r, stride=1, padding=0, groups=1, block=8, activation=None,
          bounds=(0.0, 0.0), residual_first=False, plain=False):
    """act(conv2d(x, w, b) [+ r]) [+ r]; tessera's through the blocked layout (wp, bp:
    w and b packed for it by the sample)."""
    if L.__name__ == "tessera":
        from tessera.ops import nchwc
        xb = x if plain else nchwc.to_nchwc(x, block)
        rb = None if r is None else nchwc.to_nchwc(r, block)
        y = nchwc.conv2d_nchwc(xb, wp, bp, rb, stride=(stride,) * 2,
                               pads=((padding, padding),) * 2, dilation=(1, 1), groups=groups,
                               block=block, weight_shape=tuple(w.shape), plain_input=plain,
                               activation=activation, bounds=bounds,
                               residual_first=residual_first)
        return nchwc.from_nchwc(y, w.shape[0])
    y = L.nn.functional.conv2d(x, w, b, stride=stride, padding=padding, groups=groups)
    if r is not None and residual_first:
        y = y + r
    if activation == "relu":
        y = L.relu(y)
    elif activation == "clamp":
        y = L.nn.functional.hardtanh(y, *bounds)
    return y + r if r is not None and not residual_first else y


def _conv_samples(rng, dtype):
    from tessera.ops.nchwc import pack_conv_weight, pad_bias
    # (x, w, stride, padding, groups, plain): channels not a multiple of the block, a
    # plain first layer, a 1x1, depthwise with a stride, a 7x7 stem
    cases = [((2, 10, 7, 6), (12, 10, 3, 3), 1, 1, 1, False),
             ((1, 3, 9, 9), (20, 3, 3, 3), 2, 1, 1, True),
             ((1, 24, 5, 5), (16, 24, 1, 1), 1, 0, 1, False),
             ((2, 17, 8, 9), (17, 1, 3, 3), 2, 1, 17, False),
             ((1, 3, 16, 16), (8, 3, 7, 7), 2, 3, 1, False)]
    for block in (8, 16):
        for xs, ws, st, pd, groups, plain in cases:
            x, w = make(rng, xs, dtype), make(rng, ws, dtype, -0.5, 0.5)
            b = make(rng, ws[:1], dtype)
            wp = pack_conv_weight(w, groups=groups, block=block, plain_input=plain)
            bp = pad_bias(b, block)
            n, _, h, wd = xs
            out = (n, ws[0], (h + 2 * pd - ws[2]) // st + 1, (wd + 2 * pd - ws[3]) // st + 1)
            r = make(rng, out, dtype)
            kw = dict(stride=st, padding=pd, groups=groups, block=block, plain=plain)
            yield Sample((x, w, b, wp, bp, None), dict(kw, activation="relu"))
            yield Sample((x, w, b, wp, bp, r), dict(kw, activation="clamp", bounds=(0.0, 6.0),
                                                    residual_first=True))
            yield Sample((x, w, None, wp, None, r), dict(kw, activation="clamp",
                                                         bounds=(-1.0, 0.5)))


register(OpInfo("nchwc_conv2d", _conv, _conv_samples, dtypes=(np.float32,),
                covers=("to_nchwc", "conv2d_nchwc", "from_nchwc"), differentiable=False,
                gradcheck=False, atol=1e-4, rtol=1e-5))


def _pool(L, x, kind, kernel, stride, padding, count_include_pad=True, block=8,
          ceil_mode=False):
    if L.__name__ == "tessera":
        from tessera.ops import nchwc
        y = nchwc.pool2d_nchwc(nchwc.to_nchwc(x, block), kind, kernel, stride, padding,
                               ceil_mode=ceil_mode, count_include_pad=count_include_pad)
        return nchwc.from_nchwc(y, x.shape[1])
    if kind == "max":
        return L.nn.functional.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode)
    return L.nn.functional.avg_pool2d(x, kernel, stride, padding, ceil_mode=ceil_mode,
                                      count_include_pad=count_include_pad)


def _pool_samples(rng, dtype):
    for block in (8, 16):
        x = make(rng, (2, 11, 9, 7), dtype)
        yield Sample((x, "max", (3, 3), (2, 2), (1, 1)), dict(block=block))
        yield Sample((x, "max", (2, 2), (2, 2), (0, 0)), dict(block=block, ceil_mode=True))
        yield Sample((x, "avg", (2, 2), (2, 2), (1, 1)), dict(block=block, ceil_mode=True,
                                                                count_include_pad=False))
        yield Sample((x, "avg", (3, 2), (2, 1), (1, 0)), dict(count_include_pad=False,
                                                                block=block))
        yield Sample((x, "avg", (3, 3), (2, 2), (1, 1)), dict(block=block))
        yield Sample((x, "avg", (9, 7), (9, 7), (0, 0)), dict(block=block))    # global


register(OpInfo("nchwc_pool2d", _pool, _pool_samples, dtypes=(np.float32,),
                covers=("pool2d_nchwc",), differentiable=False, gradcheck=False))
