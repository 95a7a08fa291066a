"""Summaries as TensorBoard's protocol buffers: scalars, histograms, images, text and the
hparams plugin's records, built from tessera tensors, NumPy arrays or Python numbers.

>>> s = scalar("loss", 0.5)
>>> s.value[0].tag, s.value[0].simple_value
('loss', 0.5)
"""
from __future__ import annotations

import io

import numpy as np
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

from tessera import _dtype as D
from tessera._tensor import Tensor

__all__ = ["make_np", "scalar", "histogram", "histogram_raw", "make_histogram", "image",
           "text", "hparams", "convert_to_HWC", "make_grid"]


def make_np(x) -> np.ndarray:
    """``x`` (a Tensor, an array or a Python number) as a NumPy array."""
    if isinstance(x, np.ndarray):
        return x
    if np.isscalar(x):
        return np.array([x])
    if isinstance(x, Tensor):
        t = x.detach()
        if t.dtype in (D.bfloat16, D.float16):
            t = t.float()
        if t.device.type == "meta":
            return np.random.randn(1)
        return t.cpu().numpy()
    raise NotImplementedError(f"Got {type(x)}, but numpy array or tessera tensor are "
                              "expected.")


def scalar(name: str, value, new_style: bool = False,
           double_precision: bool = False) -> Summary:
    """One scalar: a ``simple_value``, or a tensor of the ``scalars`` plugin with
    ``new_style``."""
    arr = make_np(value).squeeze()
    if arr.ndim != 0:
        raise AssertionError(f"Tensor should contain one element (0 dimensions). Was given "
                             f"size: {arr.size} and {arr.ndim} dimensions.")
    v = float(arr)
    if not new_style:
        return Summary(value=[Summary.Value(tag=name, simple_value=v)])
    proto = TensorProto(double_val=[v], dtype="DT_DOUBLE") if double_precision else \
        TensorProto(float_val=[v], dtype="DT_FLOAT")
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    return Summary(value=[Summary.Value(tag=name, tensor=proto, metadata=meta)])


def histogram_raw(name: str, min, max, num, sum, sum_squares, bucket_limits,
                  bucket_counts) -> Summary:
    """A histogram from its statistics and buckets (upper limit and count of each)."""
    hist = HistogramProto(min=min, max=max, num=num, sum=sum, sum_squares=sum_squares,
                          bucket_limit=bucket_limits, bucket=bucket_counts)
    return Summary(value=[Summary.Value(tag=name, histo=hist)])


def histogram(name: str, values, bins, max_bins: int | None = None) -> Summary:
    """The histogram of ``values`` with ``bins`` (edges, or a NumPy bin rule)."""
    hist = make_histogram(make_np(values).astype(float), bins, max_bins)
    return Summary(value=[Summary.Value(tag=name, histo=hist)])


def make_histogram(values: np.ndarray, bins, max_bins: int | None = None) -> HistogramProto:
    """NumPy's histogram as TensorBoard keeps one: right bucket limits only, trimmed to
    the buckets between the first and the last non-empty one, plus an empty bucket on
    the left so the leftmost edge survives; at most ``max_bins`` buckets (merged)."""
    if values.size == 0:
        raise ValueError("The input has no element.")
    values = values.reshape(-1)
    counts, limits = np.histogram(values, bins=bins)
    if max_bins is not None and len(counts) > max_bins:
        group = len(counts) // max_bins
        if len(counts) % group:
            counts = np.pad(counts, (0, group - len(counts) % group))
        counts = counts.reshape(-1, group).sum(axis=-1)
        limits = np.concatenate([limits[:-1:group], limits[-1:]])
    nonzero = np.flatnonzero(counts)
    first, last = (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, 1)
    counts = counts[first - 1:last] if first > 0 else np.concatenate([[0], counts[:last]])
    limits = limits[first:last + 1]
    return HistogramProto(min=values.min(), max=values.max(), num=len(values),
                          sum=values.sum(), sum_squares=values.dot(values),
                          bucket_limit=limits.tolist(), bucket=counts.tolist())


def make_grid(batch: np.ndarray, ncols: int = 8) -> np.ndarray:
    """A batch of images (N, C, H, W; C 1 or 3) tiled into one (3, H', W') image."""
    if batch.shape[1] == 1:
        batch = np.concatenate([batch] * 3, 1)
    if batch.ndim != 4 or batch.shape[1] != 3:
        raise ValueError(f"add_images: expected images with 1 or 3 channels, got shape "
                         f"{tuple(batch.shape)} in NCHW order")
    n, _, h, w = batch.shape
    ncols = min(n, ncols)
    nrows = -(-n // ncols)
    canvas = np.zeros((3, h * nrows, w * ncols), dtype=batch.dtype)
    for i in range(n):
        y, x = divmod(i, ncols)
        canvas[:, y * h:(y + 1) * h, x * w:(x + 1) * w] = batch[i]
    return canvas


def convert_to_HWC(arr: np.ndarray, dataformats: str) -> np.ndarray:  # noqa: N802
    """An image laid out as ``dataformats`` (NCHW, CHW, HWC, HW, ...) as (H, W, C) with 3
    or 4 channels; a batch becomes one grid."""
    fmt = dataformats.upper()
    if len(set(fmt)) != len(fmt):
        raise ValueError(f"add_image: the same dimension appears twice in dataformats "
                         f"{dataformats!r}")
    if arr.ndim != len(fmt):
        raise ValueError(f"add_image: an image of shape {tuple(arr.shape)} does not match "
                         f"dataformats {dataformats!r}")
    if len(fmt) == 4:
        return make_grid(arr.transpose([fmt.find(c) for c in "NCHW"])).transpose(1, 2, 0)
    if len(fmt) == 3:
        hwc = arr.transpose([fmt.find(c) for c in "HWC"])
        if hwc.shape[2] not in (1, 3, 4):
            # (PyTorch's writer fails here inside Pillow, with a TypeError)
            raise TypeError(f"add_image: an image needs 1, 3 or 4 channels; shape "
                            f"{tuple(arr.shape)} read as {dataformats} has {hwc.shape[2]}")
        return np.concatenate([hwc] * 3, 2) if hwc.shape[2] == 1 else hwc
    if len(fmt) == 2:
        return np.stack([arr.transpose([fmt.find(c) for c in "HW"])] * 3, 2)
    raise ValueError(f"add_image: unsupported dataformats {dataformats!r}")


def image(tag: str, img, rescale: float = 1, dataformats: str = "NCHW") -> Summary:
    """An image summary (PNG). Floats are read as [0, 1], uint8 as [0, 255]."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("add_image needs the Pillow package to encode PNG images "
                          "(pip install pillow)") from None
    arr = convert_to_HWC(make_np(img), dataformats)
    scale = 1 if arr.dtype == np.uint8 else 255
    arr = (arr.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)
    h, w, c = arr.shape
    picture = Image.fromarray(arr)
    if rescale != 1:
        picture = picture.resize((int(w * rescale), int(h * rescale)),
                                 Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    encoded = Summary.Image(height=h, width=w, colorspace=c,
                            encoded_image_string=buf.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=encoded)])


def text(tag: str, text: str) -> Summary:
    """A text summary (the ``text`` plugin; Markdown in TensorBoard)."""
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
    proto = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf_8")],
                        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag + "/text_summary", metadata=meta,
                                        tensor=proto)])


def _plugin_summary(tag: str, **content) -> Summary:
    from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    data = HParamsPluginData(version=PLUGIN_DATA_VERSION, **content)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


def hparams(hparam_dict: dict, metric_dict: dict,
            hparam_domain_discrete: dict | None = None) -> tuple[Summary, Summary, Summary]:
    """The hparams plugin's three records, as PyTorch writes them: the experiment (which
    hyperparameters and metrics exist), the session start (this run's values) and the
    session end."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionEndInfo, SessionStartInfo
    if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
        raise TypeError("hparam_dict and metric_dict should be dictionary.")
    domains = hparam_domain_discrete or {}
    if not isinstance(domains, dict):
        raise TypeError("parameter: hparam_domain_discrete should be a dictionary, nothing "
                        "logged.")
    for k, v in domains.items():
        if k not in hparam_dict or not isinstance(v, list) or \
                not all(isinstance(d, type(hparam_dict[k])) for d in v):
            raise TypeError(f"parameter: hparam_domain_discrete[{k}] should be a list of same "
                            f"type as hparam_dict[{k}].")
    infos, start = [], SessionStartInfo()
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if isinstance(v, Tensor):
            v = float(make_np(v).reshape(-1)[0])
        # like PyTorch, bools are numbers here (bool is an int)
        if isinstance(v, (int, float)):
            start.hparams[k].number_value = v
            kind, field = "DATA_TYPE_FLOAT64", "number_value"
        elif isinstance(v, str):
            start.hparams[k].string_value = v
            kind, field = "DATA_TYPE_STRING", "string_value"
        else:
            raise ValueError("value should be one of int, float, str, bool, or torch.Tensor")
        domain = None
        if k in domains:
            domain = struct_pb2.ListValue(values=[struct_pb2.Value(**{field: d})
                                                  for d in domains[k]])
        infos.append(api_pb2.HParamInfo(name=k, type=api_pb2.DataType.Value(kind),
                                        domain_discrete=domain))
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict])
    end = SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
    return (_plugin_summary(metadata.EXPERIMENT_TAG, experiment=experiment),
            _plugin_summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
            _plugin_summary(metadata.SESSION_END_INFO_TAG, session_end_info=end))
