"""Op-info entries: nn.functional pad, interpolate (+ upsample aliases), pixel_shuffle,
pixel_unshuffle, channel_shuffle, unfold, fold, affine_grid.

Interpolate samples cover every mode with sizes and scale factors (up and down, uneven
ratios, recompute_scale_factor, align_corners); pad covers the four modes with positive,
negative (cropping) and mixed sizes on 1 to 3 padded dims, unbatched inputs and errors.
"""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

PAD_OPS = ("constant_pad", "pad", "pad_backward")
INTERP_OPS = ("interpolate", "interpolate_backward")


def _f(name):
    return lambda L, *a, **k: getattr(L.nn.functional, name)(*a, **k)


# ---- pad ---------------------------------------------------------------------------------

def _pad_cases():
    return [
        ((2, 3, 5), (1, 2)),
        ((2, 3, 5), (2, -1)),
        ((2, 3, 5), (-2, 3)),
        ((2, 3, 5), (4, 4)),
        ((1, 2, 4), (1, 1)),                       # gradcheck size
        ((2, 3, 4, 5), (1, 2, 3, 1)),
        ((2, 3, 4, 5), (-1, 2, 2, -1)),
        ((1, 2, 3, 4, 5), (1, 1, 2, 0, 0, 2)),
        ((3, 5), (2, 1)),                          # unbatched
        ((3, 4, 5), (1, 2, 1, 1)),                 # unbatched 2-d
        ((0, 3, 5), (1, 2)),                       # zero batch
        ((2, 3, 5), (5, 0)),                       # too big for reflect
        ((2, 3, 5), (6, 0)),                       # wraps twice (circular)
        ((2, 3, 5), (-5, 0)),
        ((2, 3, 5), (-6, 1)),
        ((5,), (1, 1)),                            # 1-d input
        ((2, 3, 4, 5), (1, 1)),                    # pad size not supported by 4-d
        ((2, 3, 5), (1,)),                         # odd length
        ((2, 3, 5), (1, 1, 1, 1, 1, 1, 1, 1)),     # too many
        ((1, 0, 5), (1, 1)),                       # empty channel dim
    ]


def pad_samples(mode):
    def gen(rng, dtype):
        for shape, p in _pad_cases():
            kw = {} if mode == "constant" else dict(mode=mode)
            yield Sample((make(rng, shape, dtype), p), kw)
        if mode == "constant":
            yield Sample((make(rng, (2, 3), dtype), (1, 2)), dict(value=2.5))
            yield Sample((make(rng, (2, 3), dtype), [1, 1, -1, 2]), dict(value=-1.0))
            yield Sample((make(rng, (), dtype), ()), {})
            yield Sample((make(rng, (2, 3, 4), dtype), (1, 1, 1, 1, 1, 1)), {})
            yield Sample((make(rng, (2, 3), dtype), (-2, -2)), {})
        else:
            yield Sample((make(rng, (2, 3, 5), dtype), (1, 1)), dict(mode=mode, value=1.0))
    return gen


def _int_pad(rng, dtype):
    x = make(rng, (2, 3, 5), np.int64, -9, 9)
    for mode in ("constant", "reflect", "replicate", "circular"):
        yield Sample((x, (2, 1)), dict(mode=mode))
    yield Sample((x, (2, 1)), dict(value=3.7))


for _mode in ("constant", "reflect", "replicate", "circular"):
    register(OpInfo(f"nn.functional.pad_{_mode}", _f("pad"), pad_samples(_mode),
                    covers=PAD_OPS))
register(OpInfo("nn.functional.pad_int", _f("pad"), _int_pad, dtypes=(np.int64,),
                covers=PAD_OPS, differentiable=False))


# ---- interpolate -------------------------------------------------------------------------

_MODE_ND = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_SP = {1: (7,), 2: (5, 6), 3: (3, 4, 5)}
_SMALL = {1: (5,), 2: (3, 4), 3: (2, 2, 3)}


def _interp_cases(mode, nd):
    sp, sm = _SP[nd], _SMALL[nd]
    up = tuple(2 * s + 1 for s in sp)
    down = tuple(max(1, s // 2) for s in sp)
    mixed = tuple((s + 3) if i % 2 else max(1, s - 2) for i, s in enumerate(sp))
    return [
        ((2, 3) + sp, dict(size=up)),
        ((2, 3) + sp, dict(size=down)),
        ((2, 3) + sp, dict(size=mixed)),
        ((2, 3) + sp, dict(size=sp)),
        ((2, 3) + sp, dict(size=tuple(2 * s for s in sp))),
        ((1, 2) + sm, dict(size=tuple(s + 2 for s in sm))),             # gradcheck size
        ((2, 3) + sp, dict(size=7)),
        ((2, 3) + sp, dict(scale_factor=2)),
        ((2, 3) + sp, dict(scale_factor=1.7)),
        ((2, 3) + sp, dict(scale_factor=0.6)),
        ((2, 3) + sp, dict(scale_factor=tuple([1.5, 0.75, 2.2][:nd]))),
        ((2, 3) + sp, dict(scale_factor=1.7, recompute_scale_factor=True)),
        ((2, 3) + sp, dict(scale_factor=0.45, recompute_scale_factor=False)),
        ((0, 3) + sp, dict(size=up)),
        # errors
        ((2, 3) + sp, dict(size=up, scale_factor=2)),
        ((2, 3) + sp, {}),
        ((2, 3) + sp, dict(size=(3,) * (nd + 1))),
        ((2, 3) + sp, dict(scale_factor=0.1)),
        ((2, 3) + sp, dict(size=up, recompute_scale_factor=True)),
        ((2, 0) + sp, dict(size=up)),
    ]


def interp_samples(mode, nd):
    def gen(rng, dtype):
        aligns = (False, True) if mode in _MODE_ND else (None,)
        for shape, kw in _interp_cases(mode, nd):
            for ac in aligns:
                extra = dict(mode=mode) if ac is None else dict(mode=mode, align_corners=ac)
                # PyTorch's backward rejects empty outputs (area mode allows them forward)
                empty = 0 in shape[1:] or kw.get("scale_factor") == 0.1
                yield Sample((make(rng, shape, dtype),), dict(kw, **extra),
                             grad_args=() if empty else None)
        if mode in ("nearest", "area"):
            yield Sample((make(rng, (2, 3) + _SP[nd], dtype),), dict(size=3, mode=mode,
                                                                     align_corners=False))
        if mode in _MODE_ND and nd != 3:   # a mode that needs another rank
            yield Sample((make(rng, (2, 3) + _SP[3], dtype),), dict(size=3, mode=mode))
    return gen


for _mode in ("nearest", "nearest-exact", "area"):
    for _nd in (1, 2, 3):
        register(OpInfo(f"nn.functional.interpolate_{_mode}_{_nd}d", _f("interpolate"),
                        interp_samples(_mode, _nd), covers=INTERP_OPS))
for _mode, _nd in _MODE_ND.items():
    register(OpInfo(f"nn.functional.interpolate_{_mode}", _f("interpolate"),
                    interp_samples(_mode, _nd), covers=INTERP_OPS))


def _upsample_samples(rng, dtype):
    x = make(rng, (2, 3, 4, 5), dtype)
    yield Sample((x,), dict(size=(7, 9)))
    yield Sample((x,), dict(scale_factor=2))
    yield Sample((x,), dict(scale_factor=1.5, mode="bilinear", align_corners=True))


def _upsample_near(rng, dtype):
    x = make(rng, (2, 3, 4, 5), dtype)
    yield Sample((x,), dict(size=(7, 9)))
    yield Sample((x,), dict(scale_factor=2))


register(
    OpInfo("nn.functional.upsample", _f("upsample"), _upsample_samples, covers=INTERP_OPS),
    OpInfo("nn.functional.upsample_nearest", _f("upsample_nearest"), _upsample_near,
           covers=INTERP_OPS),
    OpInfo("nn.functional.upsample_bilinear", _f("upsample_bilinear"), _upsample_near,
           covers=INTERP_OPS),
)


# ---- shuffles ------------------------------------------------------------------------------

def _shuffle_samples(rng, dtype):
    for shape, r in [((2, 8, 3, 2), 2), ((1, 9, 2, 2), 3), ((8, 2, 3), 2), ((2, 2, 4, 3, 1), 1),
                     ((8, 1, 1), 2), ((2, 5, 3, 3), 2), ((4, 3), 2), ((2, 4, 3, 3), 0)]:
        yield Sample((make(rng, shape, dtype), r))
    # PyTorch's backward fails on an empty batch (its grad has the wrong shape)
    yield Sample((make(rng, (0, 4, 2, 2), dtype), 2), grad_args=())


def _unshuffle_samples(rng, dtype):
    for shape, r in [((2, 2, 4, 6), 2), ((1, 1, 6, 3), 3), ((2, 4, 2), 2), ((2, 1, 1, 4, 4), 1),
                     ((2, 2, 5, 4), 2), ((2, 2, 4, 5), 2), ((4, 4), 2),
                     ((2, 2, 4, 4), 0)]:
        yield Sample((make(rng, shape, dtype), r))


def _channel_shuffle_samples(rng, dtype):
    for shape, g in [((2, 6, 3), 3), ((1, 4, 2, 2), 2), ((2, 6, 1, 1, 2), 6), ((2, 6, 3), 4),
                     ((2, 6), 2)]:
        yield Sample((make(rng, shape, dtype), g))


VIEW_OPS = ("view", "permute")
register(
    OpInfo("nn.functional.pixel_shuffle", _f("pixel_shuffle"), _shuffle_samples,
           covers=VIEW_OPS),
    OpInfo("nn.functional.pixel_unshuffle", _f("pixel_unshuffle"), _unshuffle_samples,
           covers=VIEW_OPS),
    OpInfo("nn.functional.channel_shuffle", _f("channel_shuffle"), _channel_shuffle_samples,
           covers=VIEW_OPS),
)


# ---- unfold / fold ------------------------------------------------------------------------

def _unfold_samples(rng, dtype):
    cases = [((2, 3, 5, 6), (2,), {}), ((1, 2, 4, 4), ((2, 3),), dict(padding=1, stride=2)),
             ((2, 3, 6, 7), (3,), dict(dilation=2, padding=(1, 2), stride=(1, 2))),
             ((3, 5, 5), (2,), {}), ((0, 3, 5, 5), (2,), {}), ((1, 1, 2, 3), (2, 3), {}),
             ((2, 3, 5, 6), (7,), {}), ((5, 6), (2,), {}), ((2, 3, 5, 6), (0,), {}),
             ((2, 3, 5, 6), (2,), dict(stride=0)), ((2, 3, 5, 6), (2,), dict(padding=-1))]
    for shape, args, kw in cases:
        yield Sample((make(rng, shape, dtype),) + args, kw)


def _fold_samples(rng, dtype):
    cases = [((2, 12, 20), ((5, 6), 2), {}), ((1, 8, 6), ((4, 5), (2, 2)), dict(stride=2,
                                                                                padding=1)),
             ((2, 27, 12), ((6, 7), 3), dict(dilation=2, padding=(1, 2), stride=(1, 2))),
             ((12, 20), ((5, 6), 2), {}), ((0, 12, 20), ((5, 6), 2), {}),
             ((1, 9, 4), ((3, 3), 2), dict(stride=1)),
             ((2, 13, 20), ((5, 6), 2), {}), ((2, 12, 21), ((5, 6), 2), {}),
             ((12,), ((5, 6), 2), {}), ((2, 12, 20), ((5, 6), 2), dict(stride=0))]
    for shape, args, kw in cases:
        yield Sample((make(rng, shape, dtype),) + args, kw)


register(
    OpInfo("nn.functional.unfold", _f("unfold"), _unfold_samples, covers=("im2col", "col2im")),
    OpInfo("nn.functional.fold", _f("fold"), _fold_samples, covers=("im2col", "col2im")),
)


# ---- affine_grid ---------------------------------------------------------------------------

def _affine_samples(rng, dtype):
    for theta, size, kw in [((2, 2, 3), (2, 3, 4, 5), {}),
                            ((1, 2, 3), (1, 1, 3, 3), dict(align_corners=True)),
                            ((2, 3, 4), (2, 1, 2, 3, 4), {}),
                            ((2, 3, 4), (2, 1, 2, 3, 4), dict(align_corners=True)),
                            ((1, 2, 3), (1, 1, 1, 4), {}),
                            ((2, 2, 3), (2, 3, 4), {}), ((2, 3, 4), (2, 3, 4, 5), {}),
                            ((2, 2, 3), (2, 3, 0, 5), {})]:
        yield Sample((make(rng, theta, dtype), size), kw)


register(OpInfo("nn.functional.affine_grid", _f("affine_grid"), _affine_samples,
                covers=("matmul",)))


def _grid_samples(rng, dtype):
    for nd, modes in ((2, ("bilinear", "nearest", "bicubic")), (3, ("bilinear", "nearest"))):
        x_shape = (2, 3, 4, 5) if nd == 2 else (2, 2, 3, 4, 3)
        g_shape = (2, 3, 4, 2) if nd == 2 else (2, 2, 2, 3, 3)
        for mode in modes:
            for pad in ("zeros", "border", "reflection"):
                for ac in (False, True):
                    yield Sample((make(rng, x_shape, dtype), make(rng, g_shape, dtype, -1.3, 1.3)),
                                 dict(mode=mode, padding_mode=pad, align_corners=ac))
    # small enough for the float64 gradcheck
    yield Sample((make(rng, (1, 2, 3, 3), dtype), make(rng, (1, 2, 3, 2), dtype, -1.2, 1.2)),
                 dict(mode="bilinear", padding_mode="reflection", align_corners=False))
    yield Sample((make(rng, (1, 1, 3, 4), dtype), make(rng, (1, 2, 2, 2), dtype, -1.2, 1.2)),
                 dict(mode="bicubic", padding_mode="border", align_corners=True))
    # errors
    x = make(rng, (2, 3, 4, 5), dtype)
    yield Sample((x, make(rng, (2, 3, 4, 2), dtype)), dict(mode="area", align_corners=False))
    yield Sample((x, make(rng, (2, 3, 4, 2), dtype)), dict(padding_mode="wrap",
                                                           align_corners=False))
    yield Sample((x, make(rng, (1, 3, 4, 2), dtype)), dict(align_corners=False))
    yield Sample((x, make(rng, (2, 3, 4, 3), dtype)), dict(align_corners=False))
    yield Sample((x, make(rng, (2, 3, 4, 2, 2), dtype)), dict(align_corners=False))
    yield Sample((make(rng, (2, 2, 3, 4, 3), dtype), make(rng, (2, 2, 2, 3, 3), dtype)),
                 dict(mode="bicubic", align_corners=False))
    yield Sample((make(rng, (2, 3, 0, 5), dtype), make(rng, (2, 3, 4, 2), dtype)),
                 dict(align_corners=False))


register(OpInfo("nn.functional.grid_sample", _f("grid_sample"), _grid_samples,
                covers=("gather",)))
