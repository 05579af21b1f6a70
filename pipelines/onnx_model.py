"""An export directory run on onnxruntime, behind the call interface of the torch model it came from.

In:  an export directory that :mod:`pipelines.export` wrote (``model.onnx``, ``export.json``, the
     tokenizer and ``config.json``), and batches of model inputs (torch tensors or arrays).
Out: :class:`OnnxModel`, called like the torch model (``model(**batch).logits``), so the task's own
     ``predict_step``, ``postprocess`` and ``format_predictions`` serve an export unchanged: QA span
     decoding and NER word grouping are the same code as for torch. :func:`pipelines.modeling.load_model`
     returns one when it is given an export directory; no torch model is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipelines.errors import ModelError, failures_named

EXPORT_FILE = "export.json"
ONNX_FILE = "model.onnx"


def is_export_dir(path: str | Path) -> bool:
    return (Path(path) / EXPORT_FILE).is_file() and (Path(path) / ONNX_FILE).is_file()


def export_precision(path: str | Path) -> str:
    """The precision an export computes in (``fp32``, ``int8``), as ``export.json`` records it."""
    file = Path(path) / EXPORT_FILE
    with failures_named(ModelError, f"export directory {path}: cannot read {file}"):
        summary = json.loads(file.read_text(encoding="utf-8"))
    precision = summary.get("precision") if isinstance(summary, dict) else None
    if not isinstance(precision, str) or not precision:
        # evaluate writes it into eval_*.json as the precision the metrics were measured in.
        raise ModelError(f"export directory {path}: {file} records no precision (its 'precision' key); export the run again")
    return precision


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ModelError("ONNX export and inference need onnxruntime: pip install 'bertpipe[edge]'") from None
    return onnxruntime


def inference_session(path: str | Path, *, num_threads: int | None = None):
    """An onnxruntime CPU session set up for text: inputs whose shape changes with every batch."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    if num_threads:
        options.intra_op_num_threads = num_threads
    # onnxruntime plans a memory pattern for each input shape it meets and keeps it, in an arena that
    # never shrinks; text batches (batch size x longest sequence) rarely repeat a shape. On the CoNLL-2003
    # validation split in batches of 32 the patterns took peak RSS from 421 to 593 MB, for no speed
    # (whole-process wall time 0.99x without them; docs/edge.md).
    options.enable_mem_pattern = False
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxOutputs(dict):
    """Session outputs by name, readable as attributes like a transformers ``ModelOutput``."""

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class OnnxModel:
    """An onnxruntime session behind the call interface of the torch model it was exported from.

    ``model(**batch)`` feeds the inputs the graph declares (tensors or arrays) and returns its outputs
    as torch tensors; ``config`` is the exported model's config (label maps), which the tasks read.
    """

    def __init__(self, folder: str | Path, *, num_threads: int | None = None) -> None:
        from transformers import AutoConfig

        self.folder = Path(folder)
        where = f"export directory {self.folder}"
        # Named as a run directory's unreadable weights are (pipelines.modeling.load_model): a truncated or
        # damaged file is the user's to replace, not a fault of bertpipe's.
        with failures_named(ModelError, f"{where}: cannot load the model from {self.folder / ONNX_FILE}"):
            self.session = inference_session(self.folder / ONNX_FILE, num_threads=num_threads)
        self.input_names = [node.name for node in self.session.get_inputs()]
        self.output_names = [node.name for node in self.session.get_outputs()]
        self.input_shapes = {node.name: list(node.shape) for node in self.session.get_inputs()}
        config_file = self.folder / "config.json"
        if not config_file.is_file():
            raise ModelError(f"{where} has no {config_file.name} (the model's config, with its label names); export the run again")
        with failures_named(ModelError, f"{where}: cannot read the model's config from {config_file}"):
            self.config = AutoConfig.from_pretrained(self.folder)
        self.training = False

    def eval(self) -> "OnnxModel":
        return self

    def __call__(self, **batch: Any) -> OnnxOutputs:
        missing = [name for name in self.input_names if name not in batch]
        if missing:
            raise ModelError(f"{self.folder / ONNX_FILE} needs inputs {missing}; the batch holds {sorted(batch)}")
        feed = {name: _as_int64(batch[name]) for name in self.input_names}
        with failures_named(ModelError, self._refusal(feed)):
            outputs = self.session.run(self.output_names, feed)
        return OnnxOutputs({name: torch.from_numpy(np.asarray(value)) for name, value in zip(self.output_names, outputs)})

    def _refusal(self, feed: dict[str, np.ndarray]) -> str:
        """What a failed run says: the folder, the shapes fed, and the graph's own shapes when they are fixed."""
        fed = ", ".join(f"{name} {list(value.shape)}" for name, value in feed.items())
        message = f"export directory {self.folder}: onnxruntime cannot run {ONNX_FILE} on inputs of shape {fed}"
        fixed = {name: shape for name, shape in self.input_shapes.items() if any(isinstance(dim, int) for dim in shape[:2])}
        if fixed:
            # An export written before bertpipe export checked its axes (Funnel's graph came out fixed to
            # the traced sample's shape) serves that one shape only.
            shapes = ", ".join(f"{name} {shape}" for name, shape in fixed.items())
            message += (f" ({ONNX_FILE} was written with fixed input shapes, {shapes}, and serves no other: export the run "
                        "again, and bertpipe export says whether it can have dynamic batch and sequence axes)")
        return message


def _as_int64(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64)
