"""Invalid ONNX models are rejected before anything runs (``tessera.onnx.validate``), with an
``OnnxValidationError`` naming the node, its op type and the attribute or input at fault;
onnxruntime, the oracle, rejects every one of them too. The C convolution and pooling
kernels' entry points reject a geometry they cannot index by."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
import tessera.onnx
from tessera.onnx.errors import OnnxImportError, OnnxValidationError
from tests.onnx.helpers import ort_session

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

X = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes, outputs=("y",), inits=(), opset=17, inputs=(("x", [1, 2, 6, 6]),)):
    g = helper.make_graph(list(nodes), "g", [_vi(n, s) for n, s in inputs],
                          [_vi(o, None) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _w(shape=(4, 2, 3, 3), name="w"):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _conv(**attrs):
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1", **attrs)],
                  inits=[_w()])


def _pool(op, **attrs):
    return _model([helper.make_node(op, ["x"], ["y"], name="pool1", **attrs)])


def _ort_rejects(proto) -> str:
    """onnxruntime's error for ``proto`` (at session creation or when run)."""
    try:
        s = ort_session(proto)
        s.run(None, {i.name: X for i in s.get_inputs()})
    except Exception as e:  # noqa: BLE001  (any failure is a rejection)
        return str(e)
    raise AssertionError("onnxruntime runs the model: it is not an invalid one")


# (model, a regex of what tessera's message says: the node, its op and what is at fault)
INVALID = {
    # read positionally by the direct convolution kernel: a segfault before
    "conv_dilations_3": (lambda: _conv(dilations=[1, 1, 1]),
                         r"node 'conv1' \(Conv\): attribute 'dilations' has 3 values"),
    "conv_kernel_shape_3": (lambda: _conv(kernel_shape=[3, 3, 3]),
                            r"'conv1' \(Conv\): attribute 'kernel_shape' has 3 values"),
    "conv_kernel_shape_string": (lambda: _conv(kernel_shape="3x3"),
                                 r"'conv1' \(Conv\): attribute 'kernel_shape' has type STRING"),
    "conv_kernel_shape_vs_weight": (
        lambda: _conv(kernel_shape=[2, 2]),
        r"'conv1' \(Conv\): attribute 'kernel_shape' \[2, 2\] does not match the weight"),
    "conv_pads_6": (lambda: _conv(pads=[1] * 6), r"'conv1' \(Conv\): attribute 'pads' has 6"),
    "maxpool_pads_6": (lambda: _pool("MaxPool", kernel_shape=[2, 2], pads=[0] * 6),
                       r"'pool1' \(MaxPool\): attribute 'pads' has 6"),
    "avgpool_pads_6": (lambda: _pool("AveragePool", kernel_shape=[2, 2], pads=[0] * 6),
                       r"'pool1' \(AveragePool\): attribute 'pads' has 6"),
    "auto_pad_bogus": (lambda: _conv(auto_pad="BOGUS"),
                       r"'conv1' \(Conv\): attribute 'auto_pad' is 'BOGUS'"),
    "conv_strides_3": (lambda: _conv(strides=[1, 1, 1]),
                       r"'conv1' \(Conv\): attribute 'strides' has 3 values"),
    "conv_negative_pads": (lambda: _conv(pads=[-1, 0, 0, 0]),
                           r"'conv1' \(Conv\): attribute 'pads' .* negative"),
    "conv_zero_stride": (lambda: _conv(strides=[0, 1]),
                         r"'conv1' \(Conv\): attribute 'strides' \[0, 1\] must be positive"),
    "conv_zero_dilation": (lambda: _conv(dilations=[1, 0]),
                           r"'conv1' \(Conv\): attribute 'dilations' .* positive"),
    "conv_group_not_dividing": (lambda: _conv(group=3),
                                r"'conv1' \(Conv\): attribute 'group' 3 does not divide"),
    "maxpool_zero_kernel": (lambda: _pool("MaxPool", kernel_shape=[0, 2]),
                            r"'pool1' \(MaxPool\): attribute 'kernel_shape' .* positive"),
    "maxpool_pad_not_below_kernel": (
        lambda: _pool("MaxPool", kernel_shape=[2, 2], pads=[2, 0, 0, 0]),
        r"'pool1' \(MaxPool\): .* must be smaller than the kernel"),
    "defined_twice": (
        lambda: _model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                        helper.make_node("Neg", ["x"], ["y"], name="b")]),
        r"node 'b' \(Neg\) defines 'y', which node 'a' \(Relu\) already defines"),
    "missing_input": (lambda: _model([helper.make_node("Relu", ["nowhere"], ["y"])]),
                      r"node #0 \(Relu\) reads 'nowhere', which is not a graph input"),
    "cycle": (lambda: _model([helper.make_node("Relu", ["b"], ["a"], name="r1"),
                              helper.make_node("Relu", ["a"], ["b"], name="r2"),
                              helper.make_node("Neg", ["x"], ["y"])]),
              r"the graph has a cycle: node 'r2' \(Relu\) -> node 'r1' \(Relu\) -> node 'r2'"),
    "output_nothing_produces": (
        lambda: _model([helper.make_node("Relu", ["x"], ["y"])], outputs=("y", "ghost")),
        r"graph output 'ghost' is not produced by any node"),
    "add_one_input": (lambda: _model([helper.make_node("Add", ["x"], ["y"], name="add")]),
                      r"node 'add' \(Add\) has 1 input; Add-14 takes 2"),
    "unknown_attribute": (lambda: _model([helper.make_node("Relu", ["x"], ["y"], alpha=1.0)]),
                          r"node #0 \(Relu\): Relu-14 has no attribute 'alpha'"),
}


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


# found by tests/adversarial/test_onnx_fuzz.py; the first two aborted the process inside
# ONNX's shape inference (onnxruntime's copy of it too: no oracle run for them)
FUZZ_FOUND = {
    "split_num_outputs_mismatch": (
        lambda: _model([helper.make_node("Split", ["x"], ["a", "b", "y"], num_outputs=2)],
                       opset=18),
        r"node #0 \(Split\): attribute 'num_outputs' is 2, but the node has 3 outputs"),
    "layer_norm_axis_huge": (
        lambda: _model([helper.make_node("LayerNormalization", ["x", "s"], ["y"],
                                         axis=2 ** 31)],
                       inits=[numpy_helper.from_array(np.ones(6, np.float32), "s")]),
        r"node #0 \(LayerNormalization\): attribute 'axis' is 2147483648"),
}
INVALID |= {
    "scatter_elements_axis_out_of_range": (
        lambda: _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=-7)],
                       inits=[_i64("i", np.zeros((1, 2, 6, 6))),
                              numpy_helper.from_array(X, "u")]),
        r"\(ScatterElements\): attribute 'axis' is -7; a rank-4 tensor takes an axis from "
        r"-4 to 3"),
    "scatter_elements_bad_reduction": (
        lambda: _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"],
                                         reduction="")],
                       inits=[_i64("i", np.zeros((1, 2, 6, 6))),
                              numpy_helper.from_array(X, "u")]),
        r"attribute 'reduction' is ''"),
    "scatter_elements_updates_shape": (
        lambda: _model([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"])],
                       inits=[_i64("i", np.zeros((1, 1, 1, 1))),
                              numpy_helper.from_array(X, "u")]),
        r"indices \[1, 1, 1, 1\] and updates \[1, 2, 6, 6\] must have one shape"),
    "concat_empty_input": (lambda: _model([helper.make_node("Concat", ["x", ""], ["y"],
                                                            axis=0)]),
                           r"\(Concat\): input 1 \('inputs'\) is empty"),
    "concat_mixed_types": (
        lambda: _model([helper.make_node("Concat", ["x", "i"], ["y"], axis=0)],
                       inits=[_i64("i", np.zeros((1, 2, 6, 6)))]),
        r"\(Concat\): inputs 'x' \(tessera.float32\) and 'i' \(tessera.int64\) must have "
        r"one type \(T\)"),
    "keepdims_not_a_flag": (
        lambda: _model([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=5)]),
        r"\(ReduceMax\): attribute 'keepdims' is 5; it is a flag"),
    "split13_uneven": (
        lambda: _model([helper.make_node("Split", ["x"], ["a", "b", "c", "d", "y"], axis=2)],
                       outputs=("a", "b", "c", "d", "y"), opset=13),
        r"6 elements along axis 2 do not split evenly into 5 outputs"),
}


# outside ONNX's spec, though onnxruntime runs these two (reading keepdims=5 as 1 in one
# place and as != 0 in another gave different shapes in the fuzz's Softmax graphs)
STRICTER = {"keepdims_not_a_flag", "scatter_elements_bad_reduction"}


@pytest.mark.parametrize("case", sorted(FUZZ_FOUND))
def test_models_that_aborted_onnx_shape_inference_are_rejected_first(case):
    make, message = FUZZ_FOUND[case]
    with pytest.raises(OnnxValidationError, match=message):
        tessera.onnx.load(make())


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_model_is_rejected_naming_the_node(case):
    make, message = INVALID[case]
    proto = make()
    if case not in STRICTER:
        _ort_rejects(proto)
    def module(p):   # eager: the checks of the import rules run in forward
        return tessera.onnx.to_module(p)(tessera.tensor(X))
    for load in (tessera.onnx.load, module):
        with pytest.raises(OnnxValidationError, match=message):
            load(proto)
        with pytest.raises(OnnxValidationError, match=message):   # also from bytes
            load(proto.SerializeToString())
    assert issubclass(OnnxValidationError, OnnxImportError)
    assert issubclass(OnnxValidationError, ValueError)


def test_unsorted_graph_is_rejected_as_onnx_requires():
    proto = _model([helper.make_node("Neg", ["h"], ["y"], name="second"),
                    helper.make_node("Relu", ["x"], ["h"], name="first")])
    with pytest.raises(OnnxValidationError, match="'first' .* defines after it: ONNX "
                                                  "requires nodes in topological order"):
        tessera.onnx.load(proto)


def test_geometry_against_the_input_at_run_time():
    """A rank only the input tensor tells (the weight is a graph input, not an
    initializer): the import rule checks the attributes against it."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", dilations=[1, 1, 1])
    proto = _model([node], inputs=(("x", [1, 2, 6, 6]), ("w", [4, 2, 3, 3])))
    with pytest.raises(OnnxValidationError, match="attribute 'dilations' has 3 values"):
        tessera.onnx.to_module(proto)(tessera.tensor(X), tessera.ones(4, 2, 3, 3))


def test_external_data_of_an_in_memory_model_is_refused():
    w = _w()
    onnx.external_data_helper.set_external_data(w, location="weights.bin")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    proto = _model([helper.make_node("Conv", ["x", "w"], ["y"])], inits=[w])
    with pytest.raises(OnnxValidationError, match="tensor 'w' keeps its data in an external "
                                                  "file"):
        tessera.onnx.load(proto)


def test_valid_models_still_load_and_match_onnxruntime():
    """Untyped graph outputs (onnxruntime infers them, so does the check) and a node with
    all of Conv's attributes."""
    proto = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 1],
                          dilations=[1, 2], pads=[1, 0, 1, 2], group=2)],
        inits=[_w((4, 1, 3, 3))])
    want = ort_session(proto).run(None, {"x": X})[0]
    got = tessera.onnx.load(proto).run(tessera.tensor(X))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- the C kernels' entry points ---------------------------------------------------------

def _kernels_or_skip():
    from tessera.kernels import window
    if not window.available(np.float32):
        pytest.skip("no C kernels (code generation off or no compiler)")


@pytest.mark.parametrize("bad", [
    dict(dilation=(1, 1, 1)), dict(pads=(0, 0, 0)), dict(stride=(1,)), dict(stride=(0, 1)),
    dict(dilation=(0, 1)), dict(pads=(-1, 0))])
def test_conv_kernels_check_their_geometry(bad):
    """Each argument of the wrong arity or sign used to be read as is (a 3-entry dilation
    shifted the direct kernel's geometry array: a segfault)."""
    _kernels_or_skip()
    from tessera.kernels import conv, direct_conv, winograd
    x = np.ones((1, 2, 6, 6), np.float32)
    w = np.ones((4, 2, 3, 3), np.float32)
    y = np.empty((1, 4, 4, 4), np.float32)
    geo = dict(stride=(1, 1), pads=(0, 0), dilation=(1, 1)) | bad
    if "stride" not in bad:   # the direct kernels are stride 1
        with pytest.raises(ValueError, match="conv2d_direct"):
            direct_conv.conv2d_direct(x, w, None, geo["pads"], geo["dilation"], y)
        with pytest.raises(ValueError, match="conv2d_input_grad_direct"):
            direct_conv.conv2d_input_grad_direct(y, w, geo["pads"], geo["dilation"], x.copy())
        with pytest.raises(ValueError, match="conv2d_weight_grad_direct"):
            direct_conv.conv2d_weight_grad_direct(x, y, w.shape, geo["pads"], geo["dilation"])
    if conv.threaded(np.float32):
        with pytest.raises(ValueError, match="conv2d"):
            conv.conv2d_threaded(x, w, None, geo["stride"], geo["pads"], geo["dilation"], y)
        with pytest.raises(ValueError, match="conv2d_input_grad"):
            conv.conv2d_input_grad_threaded(y, w, geo["stride"], geo["pads"], geo["dilation"],
                                            x.copy())
        with pytest.raises(ValueError, match="conv2d_weight_grad"):
            conv.conv2d_weight_grad_threaded(x, y, w.shape, geo["stride"], geo["pads"],
                                             geo["dilation"])
    if "pads" in bad:
        with pytest.raises(ValueError, match="conv2d_winograd"):
            winograd.conv2d_winograd(x, w, None, geo["pads"], y)


def test_conv_kernels_check_their_arrays():
    _kernels_or_skip()
    from tessera.kernels import direct_conv, window
    x = np.ones((1, 2, 6, 6), np.float32)
    with pytest.raises(ValueError, match="conv2d_direct: input .* weight"):
        direct_conv.conv2d_direct(x, np.ones((4, 3, 3, 3), np.float32), None, (0, 0), (1, 1),
                                  np.empty((1, 4, 4, 4), np.float32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        direct_conv.conv2d_direct(x, np.ones((4, 2, 3, 3)), None, (0, 0), (1, 1),
                                  np.empty((1, 4, 4, 4), np.float32))
    with pytest.raises(ValueError, match="im2col: columns"):
        window.im2col(x[0], np.empty((5, 16), np.float32), (3, 3), (1, 1), (0, 0), (1, 1),
                      (4, 4))


@pytest.mark.parametrize("bad", [
    dict(ksize=(2, 2, 2)), dict(stride=(0, 1)), dict(pads=(0, 0, 0)), dict(dilation=(1, -1)),
    dict(out_sp=(3,))])
def test_pool_kernels_check_their_geometry(bad):
    _kernels_or_skip()
    from tessera.kernels import window
    x = np.ones((1, 2, 6, 6), np.float32)
    geo = dict(ksize=(2, 2), stride=(2, 2), pads=(0, 0), dilation=(1, 1), out_sp=(3, 3)) | bad
    for f in (window.max_pool2d, window.max_pool2d_values):
        with pytest.raises(ValueError, match="max_pool2d"):
            f(x, **geo)
    if "ksize" in bad:   # depthwise filters give the kernel size
        return
    with pytest.raises(ValueError, match="depthwise_conv2d"):
        window.depthwise_conv2d(x, np.ones((2, 1, 2, 2), np.float32), None, geo["stride"],
                                geo["pads"], geo["dilation"], geo["out_sp"])


# ---- LayerNormalization's scale and bias -------------------------------------------------

LN_X = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
# (scale shape, bias shape or None, axis): onnxruntime runs those that broadcast to X
# (across its leading dims too) and rejects a rank above X's or a dim neither X's nor 1
LN_CASES = [((4,), (4,), -1), ((1,), None, -1), ((), None, -1), ((3, 4), None, -1),
            ((1, 4), (3, 4), -2), ((2, 3, 4), None, -1), ((2, 1, 1), (3, 1), -1),
            ((4,), (2, 3, 4), 0), ((3,), None, -1), ((4, 1), None, -1),
            ((4,), (3,), -1), ((5, 1, 1, 1), None, -1), ((1, 1, 1, 4), None, -2),
            ((4,), (1, 1, 1, 4), -1), ((0,), None, -1)]


def _layer_norm_model(sshape, bshape, axis, as_inputs: bool, nout: int, xdims=None):
    rng = np.random.default_rng(4)
    values = {n: rng.standard_normal(s).astype(np.float32)
              for n, s in (("s", sshape), ("b", bshape)) if s is not None}
    inputs = [("x", list(xdims or LN_X.shape))] + \
        ([(n, list(v.shape)) for n, v in values.items()] if as_inputs else [])
    inits = [] if as_inputs else [numpy_helper.from_array(v, n) for n, v in values.items()]
    outs = ("y", "mean", "rstd")[:nout]
    node = helper.make_node("LayerNormalization", ["x", *values], list(outs), name="ln",
                            axis=axis)
    return _model([node], outputs=outs, inits=inits, inputs=inputs), \
        ({"x": LN_X} | values if as_inputs else {"x": LN_X})


@pytest.mark.parametrize("nout", [1, 3])
@pytest.mark.parametrize("as_inputs", [False, True], ids=["initializers", "inputs"])
@pytest.mark.parametrize("case", LN_CASES, ids=str)
def test_layer_norm_scale_and_bias_shapes_as_onnxruntime(case, as_inputs, nout):
    """Shapes known before running (initializers, declared inputs) are refused by the
    validation; the import rule refuses the same on the actual tensors (a symbolic X)."""
    sshape, bshape, axis = case
    proto, feeds = _layer_norm_model(sshape, bshape, axis, as_inputs, nout)
    try:
        want = ort_session(proto).run(None, feeds)
    except Exception:  # noqa: BLE001  (onnxruntime rejects it)
        want = None
    symbolic, _ = _layer_norm_model(sshape, bshape, axis, as_inputs, nout,
                                    xdims=["N", "C", "L"])
    args = [tessera.tensor(v) for v in feeds.values()]
    runs = (lambda: tessera.onnx.load(proto).run(*args),
            lambda: tessera.onnx.to_module(symbolic)(*args))  # (eager: no shapes ahead)
    for run in runs:
        if want is None:
            with pytest.raises(OnnxValidationError, match=r"node 'ln' \(LayerNormalization\)"
                                                          r": (input '(Scale|B)' of shape|X)"):
                run()
            continue
        got = run()
        got = [got] if isinstance(got, tessera.Tensor) else list(got)
        assert len(got) == nout
        for g, w in zip(got, want):
            assert tuple(g.shape) == w.shape
            np.testing.assert_allclose(g.detach().numpy(), w, rtol=1e-4, atol=1e-5)


def test_layer_norm_scale_that_does_not_broadcast_is_refused_before_running():
    proto, _ = _layer_norm_model((3,), None, -1, False, 1)
    with pytest.raises(OnnxValidationError, match=r"node 'ln' \(LayerNormalization\): input "
                                                  r"'Scale' of shape \[3\] does not broadcast "
                                                  r"to X's shape \[2, 3, 4\]"):
        tessera.onnx.validate.validate(proto, 17)
