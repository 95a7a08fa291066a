"""``SummaryWriter``: TensorBoard event files written with TensorBoard's own protocol
buffers and record writer, with PyTorch's API.

>>> import tempfile, tessera
>>> from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
>>> d = tempfile.mkdtemp()
>>> with SummaryWriter(d) as w:
...     for step in range(3):
...         w.add_scalar("loss", 1.0 / (step + 1), step)
>>> acc = EventAccumulator(d)
>>> _ = acc.Reload()
>>> [(s.step, round(s.value, 3)) for s in acc.Scalars("loss")]
[(0, 1.0), (1, 0.5), (2, 0.333)]
"""
from __future__ import annotations

import math
import os
import socket
import time
from datetime import datetime

import numpy as np
from tensorboard.compat.proto.event_pb2 import Event, SessionLog, TaggedRunMetadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tessera.utils.tensorboard import summary as S

__all__ = ["FileWriter", "SummaryWriter"]


class FileWriter:
    """One event file in ``log_dir``, written in the background by TensorBoard's
    ``EventFileWriter`` (flushed every ``flush_secs`` or ``max_queue`` events)."""

    def __init__(self, log_dir, max_queue: int = 10, flush_secs: int = 120,
                 filename_suffix: str = ""):
        self.event_writer = EventFileWriter(str(log_dir), max_queue, flush_secs,
                                            filename_suffix)

    def get_logdir(self) -> str:
        return self.event_writer.get_logdir()

    def add_event(self, event: Event, step=None, walltime: float | None = None) -> None:
        event.wall_time = time.time() if walltime is None else walltime
        if step is not None:
            event.step = int(step)
        self.event_writer.add_event(event)

    def add_summary(self, summary, global_step=None, walltime: float | None = None) -> None:
        self.add_event(Event(summary=summary), global_step, walltime)

    def add_graph(self, graph_profile, walltime: float | None = None) -> None:
        """A ``(GraphDef, RunMetadata)`` pair: the graph, and the run metadata PyTorch's
        writer puts beside it (tag ``step1``)."""
        graph, stats = graph_profile
        self.add_event(Event(graph_def=graph.SerializeToString()), None, walltime)
        meta = TaggedRunMetadata(tag="step1", run_metadata=stats.SerializeToString())
        self.add_event(Event(tagged_run_metadata=meta), None, walltime)

    def flush(self) -> None:
        self.event_writer.flush()

    def close(self) -> None:
        self.event_writer.close()

    def reopen(self) -> None:
        self.event_writer.reopen()


def _default_bins() -> list[float]:
    """TensorBoard's default histogram edges: +-1e-12 growing by 10% up to 1e20, and 0."""
    pos = []
    v = 1e-12
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    return [-x for x in reversed(pos)] + [0] + pos


class SummaryWriter:
    """Writes scalars, histograms, images, text, hyperparameters, graphs and embeddings
    to event files in ``log_dir`` for TensorBoard (default ``runs/<date>_<host><comment>``).
    With ``purge_step``, TensorBoard hides the events of an earlier run from that step
    on (a restart after a crash)."""

    def __init__(self, log_dir=None, comment: str = "", purge_step: int | None = None,
                 max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = ""):
        if not log_dir:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", stamp + "_" + socket.gethostname() + comment)
        self.log_dir = str(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self.file_writer: FileWriter | None = None
        self.all_writers: dict[str, FileWriter] | None = None
        self._get_file_writer()
        self.default_bins = _default_bins()

    def _get_file_writer(self) -> FileWriter:
        """The writer of the main event file (made again after ``close``)."""
        if self.file_writer is None or self.all_writers is None:
            fw = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self.file_writer = fw
            self.all_writers = {fw.get_logdir(): fw}
            if self.purge_step is not None:
                fw.add_event(Event(step=self.purge_step, file_version="brain.Event:2"))
                fw.add_event(Event(step=self.purge_step,
                                   session_log=SessionLog(status=SessionLog.START)))
                self.purge_step = None
        return self.file_writer

    def get_logdir(self) -> str:
        return self.log_dir

    # ---- scalars -----------------------------------------------------------------
    def add_scalar(self, tag: str, scalar_value, global_step=None, walltime=None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        """One value of the series ``tag`` at ``global_step``."""
        self._get_file_writer().add_summary(
            S.scalar(tag, scalar_value, new_style, double_precision), global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict, global_step=None,
                    walltime=None) -> None:
        """Several series in one chart: each goes to its own run directory,
        ``<log_dir>/<main_tag>_<tag>``, under the tag ``main_tag``."""
        walltime = time.time() if walltime is None else walltime
        logdir = self._get_file_writer().get_logdir()
        assert self.all_writers is not None
        for tag, value in tag_scalar_dict.items():
            path = logdir + "/" + main_tag.replace("/", "_") + "_" + tag
            fw = self.all_writers.get(path)
            if fw is None:
                fw = self.all_writers[path] = FileWriter(path, self.max_queue,
                                                         self.flush_secs, self.filename_suffix)
            fw.add_summary(S.scalar(main_tag, value), global_step, walltime)

    # ---- histograms --------------------------------------------------------------
    def add_histogram(self, tag: str, values, global_step=None, bins="tensorflow",
                      walltime=None, max_bins: int | None = None) -> None:
        """The histogram of ``values``; ``bins`` is ``"tensorflow"`` (TensorBoard's
        exponential edges), a NumPy rule (``"auto"``, ``"fd"``...) or edges."""
        if isinstance(bins, str) and bins == "tensorflow":
            bins = self.default_bins
        self._get_file_writer().add_summary(S.histogram(tag, values, bins, max_bins),
                                            global_step, walltime)

    def add_histogram_raw(self, tag: str, min, max, num, sum, sum_squares, bucket_limits,
                          bucket_counts, global_step=None, walltime=None) -> None:
        """A histogram given by its statistics and buckets."""
        if len(bucket_limits) != len(bucket_counts):
            raise ValueError("len(bucket_limits) != len(bucket_counts), see the document.")
        self._get_file_writer().add_summary(
            S.histogram_raw(tag, min, max, num, sum, sum_squares, list(bucket_limits),
                            list(bucket_counts)), global_step, walltime)

    # ---- images and text ---------------------------------------------------------
    def add_image(self, tag: str, img_tensor, global_step=None, walltime=None,
                  dataformats: str = "CHW") -> None:
        """One image (PNG, needs Pillow); floats in [0, 1] or uint8 in [0, 255]."""
        self._get_file_writer().add_summary(S.image(tag, img_tensor, dataformats=dataformats),
                                            global_step, walltime)

    def add_images(self, tag: str, img_tensor, global_step=None, walltime=None,
                   dataformats: str = "NCHW") -> None:
        """A batch of images, tiled into one grid image."""
        self._get_file_writer().add_summary(S.image(tag, img_tensor, dataformats=dataformats),
                                            global_step, walltime)

    def add_text(self, tag: str, text_string: str, global_step=None, walltime=None) -> None:
        self._get_file_writer().add_summary(S.text(tag, text_string), global_step, walltime)

    # ---- hyperparameters ---------------------------------------------------------
    def add_hparams(self, hparam_dict: dict, metric_dict: dict,
                    hparam_domain_discrete: dict | None = None, run_name: str | None = None,
                    global_step=None) -> None:
        """One run of the hparams dashboard: its hyperparameters and metric values,
        written (as PyTorch does) to the sub-run ``<log_dir>/<run_name>``."""
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        exp, start, end = S.hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        run = os.path.join(self._get_file_writer().get_logdir(), run_name or str(time.time()))
        with SummaryWriter(log_dir=run) as w:
            fw = w._get_file_writer()
            for s in (exp, start, end):
                fw.add_summary(s, global_step)
            for k, v in metric_dict.items():
                w.add_scalar(k, v, global_step)

    # ---- graphs ------------------------------------------------------------------
    def add_graph(self, model, input_to_model=None, verbose: bool = False,
                  use_strict_trace: bool = True) -> None:
        """The graph of ``model`` for TensorBoard's graph tab: an ``nn.Module`` traced on
        ``input_to_model`` (a tensor or a tuple of them), or an ``nn.Graph`` (its compiled
        IR). Nodes are named by module path."""
        from tessera.utils.tensorboard._graph import graph
        gd, stats = graph(model, input_to_model)
        if verbose:
            print(gd)
        self._get_file_writer().add_graph((gd, stats))

    # ---- embeddings --------------------------------------------------------------
    def add_embedding(self, mat, metadata=None, label_img=None, global_step=None,
                      tag: str = "default", metadata_header=None) -> None:
        """Points for the projector: ``mat`` (N, D), optional labels (one per row, or rows
        of columns named by ``metadata_header``) and images (N, C, H, W)."""
        from tensorboard.plugins.projector.projector_config_pb2 import (
            EmbeddingInfo,
            ProjectorConfig,
        )
        arr = S.make_np(mat)
        if arr.ndim != 2:
            raise ValueError(f"add_embedding: mat should be 2-d (points x features), got "
                             f"shape {tuple(arr.shape)}")
        step = 0 if global_step is None else global_step
        enc = tag.replace("%", "%25").replace("/", "%2f").replace("\\", "%5c")
        subdir = f"{str(step).zfill(5)}/{enc}"
        logdir = self._get_file_writer().get_logdir()
        path = os.path.join(logdir, subdir)
        os.makedirs(path, exist_ok=True)
        info = EmbeddingInfo(tensor_name=f"{tag}:{str(step).zfill(5)}",
                             tensor_path=subdir + "/tensors.tsv")
        if metadata is not None:
            if len(metadata) != arr.shape[0]:
                raise ValueError(f"add_embedding: {len(metadata)} labels for {arr.shape[0]} "
                                 "points")
            rows = [str(m) for m in metadata] if not metadata_header else \
                ["\t".join(map(str, r)) for r in [metadata_header, *metadata]]
            with open(os.path.join(path, "metadata.tsv"), "w") as f:
                f.write("\n".join(rows) + "\n")
            info.metadata_path = subdir + "/metadata.tsv"
        if label_img is not None:
            imgs = S.make_np(label_img)
            if imgs.shape[0] != arr.shape[0]:
                raise ValueError(f"add_embedding: {imgs.shape[0]} images for {arr.shape[0]} "
                                 "points")
            _write_sprite(imgs, os.path.join(path, "sprite.png"))
            info.sprite.image_path = subdir + "/sprite.png"
            info.sprite.single_image_dim.extend([imgs.shape[3], imgs.shape[2]])
        with open(os.path.join(path, "tensors.tsv"), "w") as f:
            for row in arr:
                f.write("\t".join(str(x.item()) for x in row) + "\n")
        from google.protobuf import text_format
        if not hasattr(self, "_projector_config"):
            self._projector_config = ProjectorConfig()
        self._projector_config.embeddings.extend([info])
        with open(os.path.join(logdir, "projector_config.pbtxt"), "w") as f:
            f.write(text_format.MessageToString(self._projector_config))

    # ---- files -------------------------------------------------------------------
    def flush(self) -> None:
        """Write everything pending to disk."""
        for w in (self.all_writers or {}).values():
            w.flush()

    def close(self) -> None:
        """Flush and close every event file; a later ``add_*`` opens a new one."""
        for w in (self.all_writers or {}).values():
            w.flush()
            w.close()
        self.file_writer = self.all_writers = None

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_sprite(imgs: np.ndarray, path: str) -> None:
    """The images tiled into a square PNG, as the projector reads a sprite."""
    from PIL import Image
    grid = S.make_grid(imgs, ncols=math.ceil(imgs.shape[0] ** 0.5)).transpose(1, 2, 0)
    side = grid.shape[1]
    square = np.zeros((side, side, 3))
    square[:grid.shape[0]] = grid
    Image.fromarray(np.uint8((square * 255).clip(0, 255))).save(path, format="PNG")
