"""Export a finished run to ONNX (optionally int8), checked against the torch model.

In:  a finished run directory of an encoder task (``text-classification``, ``token-classification``,
     ``question-answering``): a full model, or a LoRA/IA3 run that holds ``merged/``.
Out: an export directory that ``bertpipe predict`` and ``bertpipe evaluate`` accept like a run
     directory:

     - ``model.onnx``: the model with dynamic ``batch`` and ``sequence`` axes on every input and
       output (fp32, or int8 with ``quantize="int8"``);
     - the tokenizer, ``config.json`` (label names, QA defaults) and ``config.yaml`` (the run's
       resolved config, so the task reads its options as it did at training time);
     - ``export.json``: what was exported, the exporter and opset, and the parity check against
       the torch model on the first ``parity_samples`` examples of the run's eval split (all their
       windows), each batched three ways (:data:`PARITY_BATCHINGS`: as ``predict``/``evaluate`` batch
       them, one at a time, and padded among the longest): the max |Δ output| over all three and per
       batching, and the share of features whose predicted labels are identical in every batching.
       The max |Δ| is measured on these inputs; it is not a bound for other inputs.

A model that picks its attention by input length in Python (BigBird: block-sparse above a threshold,
full below) is exported only when the run's ``data.max_seq_length`` keeps every input on one side. A
model whose written graph lacks the dynamic axes is refused (Funnel: torch.export fixes its sequence
axis, and torch.onnx.export then returns a graph of the sample's shape without an error), as is one
the exporter fails on (Longformer, XLNet).

Exporter: ``torch.onnx.export(dynamo=True)`` (torch.export + onnxscript). The legacy TorchScript
tracer also runs on transformers 5 but warns that it freezes Python booleans computed from tensors
inside the attention-mask code, and it is deprecated since torch 2.9; the dynamo graph also has
fewer nodes (no Constant/Identity chains). The dynamo exporter writes opset 18 and above (asking for 17 converts down
into a graph onnxruntime rejects), so lower opsets are refused.

int8: ``onnxruntime.quantization.quantize_dynamic`` (weights int8 ahead of time, activations
quantised per batch at run time). Per-channel weight scales are tried as well as per-tensor ones;
the variant whose outputs lie closer to fp32 on the parity inputs is kept and both errors are
recorded. Activation-by-activation products (attention scores QKᵀ and the attention-weighted
values), LayerNorm, softmax and GELU stay fp32; ``export.json`` counts them.

Running an export directory: :mod:`pipelines.onnx_model`.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from pipelines.adapters import MERGED_DIR, is_adapter_dir, is_peft_model
from pipelines.atomic_writes import replacing_folder, write_json
from pipelines.batching import SortedBatchSampler, feature_lengths
from pipelines.checkpoint import SOURCES_FILE
from pipelines.config import RunConfig
from pipelines.errors import describe
from pipelines.onnx_model import EXPORT_FILE, ONNX_FILE, import_onnxruntime, inference_session, is_export_dir
from pipelines.outputs import METRICS_FILE, save_config
from pipelines.task import Task

logger = logging.getLogger(__name__)

MIN_OPSET = 18
DEFAULT_OPSET = 18
# Float arithmetic that int8 dynamic quantisation leaves in fp32 (counted for export.json).
_FLOAT_COMPUTE_OPS = ("MatMul", "Gemm", "Gather", "Attention", "LayerNormalization", "Softmax", "Erf", "Gelu", "Tanh", "Add", "Mul", "Div", "Sub")
# What int8 quantises: the weight MatMuls and the embedding tables. quantize_dynamic's default list also
# turns every op named Attention into com.microsoft's QAttention, whose attributes are not those of ONNX's
# own Attention (opset 23+, which the exporter writes for attention from opset 23 on): onnxruntime then
# refused the int8 graph ("Unrecognized attribute: is_causal for operator QAttention"), and QKᵀ's
# activations, which stay fp32 at every other opset, would have been quantised.
INT8_OP_TYPES = ("MatMul", "Gather")
# The names of the dynamic axes 0 and 1 of every input, which the written graph keeps as its dim_params.
DYNAMIC_AXES = ("batch", "sequence")


class ExportError(ValueError):
    """A run that cannot be exported (unfinished, unsupported task, adapter without a merged model)."""


# ----- exporting ----------------------------------------------------------------------------------
def model_folder(run_dir: str | Path) -> Path:
    """The folder holding the run's full model: the run itself, or ``merged/`` for an adapter run."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        raise ExportError(f"{run_dir} is not a finished run (no {METRICS_FILE}); finish or resume its training first")
    if not is_adapter_dir(run_dir):
        return run_dir
    merged = run_dir / MERGED_DIR
    if (merged / "config.json").is_file() and any(merged.glob("model*.safetensors")):
        return merged
    raise ExportError(
        f"{run_dir} holds only a peft adapter; fold it into a full model first with `bertpipe merge {run_dir}` "
        f"(writes {merged}), then export again"
    )


class _PositionalOutputs(torch.nn.Module):
    """Positional inputs in, a tuple of the named outputs out: the shape torch.onnx.export wants."""

    def __init__(self, model: torch.nn.Module, input_names: list[str], output_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(**dict(zip(self.input_names, inputs)))
        return tuple(outputs[name] for name in self.output_names)


def _sample_batches(config: RunConfig, task: Task, count: int) -> tuple[dict[str, list[list[int]]], list[dict[str, torch.Tensor]], list[list[int]], int]:
    """The first ``count`` examples of the eval split (QA: all their windows) as padded model batches, in
    each of :data:`PARITY_BATCHINGS`; returns the batchings (feature indices per batch), every batch of
    all of them in that order, the feature indices of each batch's rows, and how many examples that is."""
    examples = task.load(include_train=False)[config.data.eval_split]
    examples = examples.select(range(min(count, len(examples))))
    features = task.preprocess(examples, train=False)
    batchings = parity_batchings(feature_lengths(features), config.train.eval_batch_size_or_default)
    collate = task.collator(train=False)
    rows = [indices for batching in batchings.values() for indices in batching]
    return batchings, [collate([features[i] for i in indices]) for indices in rows], rows, len(examples)


PARITY_BATCHINGS = {
    "as_evaluated": "batches of train.eval_batch_size, longest first, as bertpipe predict and evaluate batch them",
    "one_at_a_time": "each feature alone: no padding",
    "mixed_lengths": "batches of train.eval_batch_size pairing the longest remaining feature with the shortest: the most padding",
}
"""How the parity inputs are batched. int8 quantises activations per batch (one scale over the batch's
padded tensor), so an int8 output depends on what else is in its batch; the claimed max |Δ| is the
largest over all three."""


def parity_batchings(lengths: np.ndarray, batch_size: int) -> dict[str, list[list[int]]]:
    """Feature indices per batch for each of :data:`PARITY_BATCHINGS`."""
    longest_first = [int(i) for i in np.argsort(-np.asarray(lengths), kind="stable")]
    count = len(longest_first)
    mixed = [longest_first[(i // 2) if i % 2 == 0 else count - 1 - i // 2] for i in range(count)]
    return {
        "as_evaluated": list(SortedBatchSampler(lengths, batch_size)),
        "one_at_a_time": [[i] for i in range(count)],
        "mixed_lengths": [mixed[i : i + batch_size] for i in range(0, count, batch_size)],
    }


def _onnx_inputs(model: torch.nn.Module, tokenizer, batch: dict[str, torch.Tensor]) -> list[str]:
    """The tokenizer's model inputs that the model's forward accepts and the batch holds, in forward order."""
    import inspect

    accepted = list(inspect.signature(model.forward).parameters)
    names = [name for name in accepted if name in tokenizer.model_input_names and name in batch]
    if "input_ids" not in names:
        raise ExportError(f"{type(model).__name__}.forward takes no input_ids from the tokenizer; cannot export it")
    return names


def export_onnx(model: torch.nn.Module, sample: dict[str, torch.Tensor], input_names: list[str], output_names: tuple[str, ...], path: Path, *, opset: int) -> None:
    from torch.export import Dim

    batch, sequence = (Dim(name) for name in DYNAMIC_AXES)
    wrapped = _PositionalOutputs(model.eval(), input_names, output_names)
    args = tuple(sample[name] for name in input_names)
    # The graph is built at the exporter's own opset and converted to the one asked for; a failed
    # conversion is logged as a warning with the converter's traceback, and said below instead. The
    # exporter's registry also warns, on every export, that torchvision's ops are skipped.
    with _quiet_loggers("onnxscript.version_converter", "torch.onnx._internal.exporter._registration"), warnings.catch_warnings():
        # torch.export's notes on shared axis names and deprecated pytree helpers are not about this model.
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                wrapped, args, dynamo=True, opset_version=opset, input_names=input_names, output_names=list(output_names),
                # One entry for the ``*inputs`` parameter, holding one spec per input.
                dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in input_names),), verbose=False,
            )
        except Exception as error:
            # torch.export cannot trace the model (Longformer: shapes that depend on the data), or its graph
            # cannot be decomposed into ONNX ops (XLNet: ``1.0 - attention_mask``); the exporter's own message
            # is about aten overloads, not about the model, so it comes second.
            raise ExportError(
                f"the {model.config.model_type} model of this run cannot be exported to ONNX: torch.onnx.export fails on its "
                f"graph with dynamic batch and sequence axes (docs/edge.md lists the families it refuses). The exporter "
                f"said: {describe(error)}"
            ) from error
    program.save(str(path), external_data=False)
    import onnx

    written_model = onnx.load(str(path), load_external_data=False)
    _check_dynamic_axes(written_model.graph, model.config.model_type)
    written = _default_domain_opset(written_model)
    if written != opset:
        raise ExportError(
            f"--opset {opset}: the exporter could not convert the graph to opset {opset} (it stayed at {written}); "
            f"choose an older opset (default {DEFAULT_OPSET})"
        )


@contextlib.contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Only errors from these loggers while the block runs."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _check_dynamic_axes(graph, model_type: str) -> None:
    """Refuse a graph whose inputs do not all have the ``batch`` and ``sequence`` axes asked for.

    When the model fixes an axis that was asked to be dynamic, torch.export raises, but torch.onnx.export
    then exports again with the fix torch.export suggests (``sequence = 9``) and returns, without an error,
    a graph of that one shape: Funnel's export claimed dynamic axes in export.json and failed on every other
    length. A suggested fix can also narrow an axis to a derived one (``2*_sequence - 1``), so only the two
    names asked for count as dynamic."""
    fixed = {}
    for node in graph.input:
        dims = [dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else "?") for dim in node.type.tensor_type.shape.dim]
        if tuple(dims[:2]) != DYNAMIC_AXES:
            fixed[node.name] = dims
    if fixed:
        shapes = ", ".join(f"{name} [{', '.join(str(dim) for dim in dims)}]" for name, dims in fixed.items())
        raise ExportError(
            f"the {model_type} model of this run cannot be exported to ONNX: the exported graph has fixed shapes ({shapes}), "
            "not dynamic batch and sequence axes, since torch.export specialised them to the traced sample's, and it would "
            "serve inputs of that shape only (docs/edge.md lists the families this happens to)"
        )


def _default_domain_opset(model) -> int | None:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def quantize_int8(source: Path, destination: Path, *, per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantiser logs, on the root logger, advice to run its pre-processing first (shape inference and
    # graph fusions for static quantisation); the export measures the int8 graph against torch instead.
    with _quiet_loggers(""):
        quantize_dynamic(str(source), str(destination), weight_type=QuantType.QInt8, per_channel=per_channel, op_types_to_quantize=list(INT8_OP_TYPES))


def kept_fp32_ops(path: Path) -> dict[str, int]:
    """Float compute ops left in a quantised graph, by op type (their weights, if any, are fp32)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    # An embedding table stored int8 reaches its Gather through a DequantizeLinear (or directly).
    int8_tensors = {tensor.name for tensor in graph.initializer if tensor.data_type == onnx.TensorProto.INT8}
    int8_tensors |= {output for node in graph.node if node.op_type == "DequantizeLinear" for output in node.output}
    counts: collections.Counter = collections.Counter()
    for node in graph.node:
        if node.op_type not in _FLOAT_COMPUTE_OPS:
            continue
        if node.op_type == "Gather" and node.input and node.input[0] in int8_tensors:
            continue
        counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def quantized_ops(path: Path) -> dict[str, int]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    counts = collections.Counter(node.op_type for node in graph.node if node.op_type in ("MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear"))
    return dict(sorted(counts.items()))


def compare_outputs(
    reference: list[dict[str, np.ndarray]], candidate: list[dict[str, np.ndarray]], masks: list[np.ndarray], output_names: tuple[str, ...],
    *, multi_label_threshold: float | None = None, feature_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Max |Δ| over real (non-padding) positions and the share of examples whose predicted labels all agree.

    ``feature_ids``: per batch, the feature each row is, when the same features come in several
    batchings; a feature then agrees only if it agrees in every batch it is in, and counts once.

    Sequence outputs (token logits, start/end logits) are compared where ``attention_mask`` is 1;
    an example agrees when every such position has the same argmax (QA: the same start and end).
    With ``multi_label_threshold`` the (batch, labels) logits are a multi-label head's: an example
    agrees when every label is on or off on both sides of the threshold, as the task predicts them.
    A NaN or infinite output is a difference, never agreement: ``max_abs_diff`` becomes NaN/inf.
    """
    # np.max propagates NaN; Python's max(0.0, nan) returns 0.0 and argmax counts NaN as the largest
    # value, so NaN outputs used to read as a perfect export.
    diffs, agreement_of = [0.0], {}
    if feature_ids is None:
        feature_ids, start = [], 0
        for mask in masks:
            feature_ids.append(range(start, start + mask.shape[0]))
            start += mask.shape[0]
    for ref_batch, cand_batch, mask, ids in zip(reference, candidate, masks, feature_ids):
        agrees = np.ones(mask.shape[0], dtype=bool)
        for name in output_names:
            ref, cand = ref_batch[name], cand_batch[name]
            finite = np.isfinite(ref) & np.isfinite(cand)
            if ref.ndim == 3:  # (batch, sequence, labels)
                real = mask.astype(bool)
                diffs.append(np.abs(ref - cand)[real].max(initial=0.0))
                agrees &= (((ref.argmax(-1) == cand.argmax(-1)) & finite.all(-1)) | ~real).all(axis=1)
            elif name in ("start_logits", "end_logits"):  # (batch, sequence): classes are positions
                real = mask.astype(bool)
                diffs.append(np.abs(ref - cand)[real].max(initial=0.0))
                low = np.finfo(np.float32).min
                agrees &= np.where(real, ref, low).argmax(-1) == np.where(real, cand, low).argmax(-1)
                agrees &= (finite | ~real).all(axis=1)
            elif multi_label_threshold is not None:  # (batch, labels), each label a yes/no of its own
                diffs.append(np.abs(ref - cand).max(initial=0.0))
                # The argmax would count an export that switches a second label on or off as agreeing.
                on = [1.0 / (1.0 + np.exp(-values.astype(np.float64))) >= multi_label_threshold for values in (ref, cand)]
                agrees &= (on[0] == on[1]).all(-1)
            else:  # (batch, labels)
                diffs.append(np.abs(ref - cand).max(initial=0.0))
                agrees &= ref.argmax(-1) == cand.argmax(-1) if ref.shape[-1] > 1 else np.ones(len(ref), dtype=bool)
                agrees &= finite.all(-1)
        for feature, agreed in zip(ids, agrees.tolist()):
            agreement_of[feature] = agreement_of.get(feature, True) and agreed
    max_abs = float(np.max(diffs))
    agree, total = sum(agreement_of.values()), len(agreement_of)
    return {"max_abs_diff": max_abs, "features_agreeing": agree, "features_compared": total, "agreement": agree / max(total, 1)}


def _run_all(model, batches: list[dict[str, torch.Tensor]], input_names: list[str], output_names: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    results = []
    with torch.no_grad():
        for batch in batches:
            outputs = model(**{name: batch[name] for name in input_names})
            results.append({name: outputs[name].float().cpu().numpy() for name in output_names})
    return results


def export_run(
    config: RunConfig, task: Task, run_dir: str | Path, out_dir: str | Path, *, quantize: str | None = None,
    opset: int = DEFAULT_OPSET, parity_samples: int = 64, overwrite: bool = False,
) -> dict[str, Any]:
    """Export ``run_dir`` to ``out_dir`` (see the module docstring); returns what ``export.json`` holds."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    output_names = task.onnx_outputs
    if not output_names:
        raise ExportError(
            f"task {config.task!r} ({task.pipeline_tag}) cannot be exported to ONNX; exportable: encoder tasks "
            "whose heads return logits (classification, ner, qa)"
        )
    if quantize not in (None, "int8"):
        raise ExportError(f"--quantize {quantize!r} is not supported; choose int8")
    if opset < MIN_OPSET:
        raise ExportError(f"--opset {opset}: the dynamo ONNX exporter writes opset {MIN_OPSET} or newer")
    if parity_samples < 1:
        raise ExportError(f"--parity-samples {parity_samples}: the parity check needs at least 1 eval example")
    _check_out_dir(run_dir, out_dir, overwrite=overwrite)
    source = model_folder(run_dir)
    _check_one_graph_serves_every_length(source, config)
    ort = import_onnxruntime()
    _import_exporter_packages()
    _check_opset_known(opset)

    tokenizer = task.build_tokenizer(None, model_path=str(source))
    model = task.build_model(None, model_path=str(source))
    if is_peft_model(model):  # an adapter run's merged/ folder is a full model; this would be a bug upstream
        raise ExportError(f"{source} loaded as a peft adapter; export needs a full model")
    model = model.float().eval()
    batchings, batches, rows, example_count = _sample_batches(config, task, parity_samples)
    if not batches:
        raise ExportError(f"the eval split {config.data.eval_split!r} of {run_dir} gives no examples to check the export on")
    input_names = _onnx_inputs(model, tokenizer, batches[0])
    multi_label = getattr(model.config, "problem_type", None) == "multi_label_classification"
    threshold = getattr(config.task_options, "multi_label_threshold", 0.5) if multi_label else None
    masks = [batch["attention_mask"].numpy() if "attention_mask" in batch else np.ones(tuple(batch["input_ids"].shape), dtype=np.int64) for batch in batches]
    # Two examples of different lengths, so that neither axis is specialised to a traced size of 1.
    first = batches[0]
    sample = {name: first[name][:2] for name in input_names}

    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir.parent if out_dir.parent.exists() else None))
    try:
        fp32_path = staging / "model.fp32.onnx"
        export_onnx(model, sample, input_names, output_names, fp32_path, opset=opset)
        fp32_session = _session_or_error(fp32_path, "the exported graph", opset, ort)
        reference = _run_all(model, batches, input_names, output_names)
        summary: dict[str, Any] = {
            "task": config.task, "pipeline_tag": task.pipeline_tag, "source": str(source.resolve()),
            "model_type": model.config.model_type, "num_hidden_layers": getattr(model.config, "num_hidden_layers", None),
            "format": "onnx", "exporter": f"torch.onnx.export(dynamo=True), torch {torch.__version__}",
            "opset": _opset_of(fp32_path), "inputs": input_names, "outputs": list(output_names),
            "dynamic_axes": {str(axis): name for axis, name in enumerate(DYNAMIC_AXES)}, "precision": "fp32",
        }
        fp32_parity = _parity(fp32_session, batches, masks, input_names, output_names, reference, threshold, rows, batchings,
                              what=f"the exported graph of the {model.config.model_type} model")
        summary["parity"] = {
            "against": "torch fp32", "eval_split": config.data.eval_split, "examples": example_count,
            "features": len(batchings["one_at_a_time"]), "batch_size": config.train.eval_batch_size_or_default,
            "batchings": PARITY_BATCHINGS, "fp32": fp32_parity,
        }
        if fp32_parity["agreement"] < 1.0 or not np.isfinite(fp32_parity["max_abs_diff"]):
            # Same weights, same precision: a disagreement is an exporter or runtime fault, or logits so
            # close to a tie that float rounding flips them. Either way the user must hear it now.
            logger.warning(
                "the fp32 export predicts other labels than torch for %d of %d features (max |Δ| %.3g); see parity in %s",
                fp32_parity["features_compared"] - fp32_parity["features_agreeing"], fp32_parity["features_compared"],
                fp32_parity["max_abs_diff"], Path(out_dir) / "export.json",
            )
        final = fp32_path
        if quantize == "int8":
            variants = {}
            for per_channel in (True, False):
                path = staging / f"model.int8.{'channel' if per_channel else 'tensor'}.onnx"
                quantize_int8(fp32_path, path, per_channel=per_channel)
                session = _session_or_error(path, "the int8 graph", opset, ort, quantized=True)
                variants[per_channel] = (path, _parity(session, batches, masks, input_names, output_names, reference, threshold, rows, batchings,
                                                       what=f"the int8 graph of the {model.config.model_type} model"))
            # NaN compares False with everything: a variant with NaN outputs must lose, not win by default.
            diff_of = {key: np.nan_to_num(variant[1]["max_abs_diff"], nan=np.inf) for key, variant in variants.items()}
            per_channel = bool(diff_of[True] <= diff_of[False])
            final, int8_parity = variants[per_channel]
            summary.update(precision="int8", quantization={
                "method": "onnxruntime.quantization.quantize_dynamic", "weight_type": "QInt8",
                "per_channel": per_channel,
                "max_abs_diff_per_channel": variants[True][1]["max_abs_diff"],
                "max_abs_diff_per_tensor": variants[False][1]["max_abs_diff"],
                "quantized_ops": quantized_ops(final), "kept_fp32_ops": kept_fp32_ops(final),
                "note": "MatMul weights (and embedding tables) int8, activations quantised per batch; the remaining "
                        "MatMuls (opset 23+: the Attention ops) multiply two activations (attention scores and "
                        "attention-weighted values)",
            })
            summary["parity"]["int8"] = int8_parity
        # An earlier export (--overwrite) is swapped out only once the new one is whole: deleted first, a kill
        # between deleting it and moving the new one in kept neither.
        with replacing_folder(out_dir, label="--out") as staged:
            shutil.move(str(final), staged / ONNX_FILE)
            summary["size_bytes"] = (staged / ONNX_FILE).stat().st_size
            tokenizer.save_pretrained(staged)
            model.config.save_pretrained(staged)
            save_config(config, staged)
            if (run_dir / SOURCES_FILE).is_file():
                # The digests of the data the run read: evaluate checks a split held out of the train file against
                # them, and without them scored an export on rows the model had trained on.
                shutil.copy2(run_dir / SOURCES_FILE, staged / SOURCES_FILE)
            write_json(staged / EXPORT_FILE, summary)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def _check_one_graph_serves_every_length(source: Path, config: RunConfig) -> None:
    """Refuse a model whose attention depends on the input's length in Python: BigBird runs block-sparse
    attention on inputs longer than (5 + 2 * num_random_blocks) * block_size tokens and full attention on
    shorter ones, choosing per call. A traced graph holds the branch of its sample and gave every other input
    the other attention without an error (scores ~1e-4 off on a tiny model, while the parity check, on the
    eval split's examples, all of one kind, claimed 1e-7). Inputs never longer than the threshold (the run's
    ``data.max_seq_length``) all take full attention, which the graph then holds exactly."""
    model_config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    if model_config.get("attention_type") != "block_sparse":
        return
    full_attention_up_to = (5 + 2 * model_config["num_random_blocks"]) * model_config["block_size"]
    if config.data.max_seq_length > full_attention_up_to:
        raise ExportError(
            f"{source} is a {model_config.get('model_type', 'BigBird')} model with block-sparse attention, which it runs only on "
            f"inputs longer than {full_attention_up_to} tokens (full attention below): one ONNX graph cannot hold both, and "
            f"this run takes inputs up to data.max_seq_length={config.data.max_seq_length}. Export a run trained with "
            f"data.max_seq_length <= {full_attention_up_to}, or serve this one with bertpipe predict"
        )


def _check_out_dir(run_dir: Path, out_dir: Path, *, overwrite: bool) -> None:
    """Refuse an ``out_dir`` whose contents the export would lose.

    A non-empty ``out_dir`` is emptied under ``overwrite`` before the export moves in, so, as
    ``overwrite=true`` of ``train`` replaces only a bertpipe run, ``overwrite`` replaces only an earlier
    export: never the run being exported or a folder holding it, nor a folder of anyone else's files.
    """
    out, source, cwd = out_dir.expanduser().resolve(), run_dir.expanduser().resolve(), Path.cwd().resolve()
    if out == source or out in source.parents:
        raise ExportError(f"--out {out_dir} {'is' if out == source else 'holds'} the run {run_dir} being exported; choose another --out")
    if out.exists() and not out.is_dir():
        # Found here, not when the finished export fails to replace it.
        raise ExportError(f"--out {out_dir} is a file; the export is a folder. Choose a new or empty folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ExportError(f"{out_dir} exists and is not empty; choose another --out or pass --overwrite")
    if out == cwd or out in cwd.parents:
        raise ExportError(f"--overwrite would delete --out {out_dir}, which holds the current directory; choose another --out")
    if not is_export_dir(out):
        raise ExportError(
            f"--overwrite would delete --out {out_dir}, which is not an earlier bertpipe export (no {EXPORT_FILE} and "
            f"{ONNX_FILE}); --overwrite replaces only an export. Choose a new or empty --out"
        )


def _import_exporter_packages() -> None:
    """torch.onnx.export(dynamo=True) builds the graph with onnxscript and onnx; onnxruntime alone is not enough."""
    for package in ("onnx", "onnxscript"):
        try:
            importlib.import_module(package)
        except ImportError:
            raise ExportError(f"ONNX export needs {package} as well as onnxruntime: pip install 'bertpipe[edge]'") from None


def _check_opset_known(opset: int) -> None:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ExportError(f"--opset {opset}: the installed onnx {onnx.__version__} knows opsets up to {newest} (default {DEFAULT_OPSET})")


def _session_or_error(path: Path, what: str, opset: int, ort, *, quantized: bool = False):
    try:
        return inference_session(path)
    except Exception as error:  # onnxruntime's errors (InvalidGraph, Fail, ...) derive from Exception only
        # The exporter writes any opset onnx knows, with ops (e.g. Attention) that this onnxruntime
        # may not run at that opset, or that the quantiser may rewrite into ops it cannot run.
        detail = (str(error).splitlines() or [type(error).__name__])[0]
        # onnxruntime names the refused op at the end of a long line (which also names a staging file).
        detail = detail if len(detail) <= 160 else "..." + detail[-160:]
        raise ExportError(
            f"{'--quantize int8 ' if quantized else ''}--opset {opset}: onnxruntime {ort.__version__} cannot load {what} "
            f"({detail}); choose an older opset (default {DEFAULT_OPSET}){' or export without --quantize' if quantized else ''}"
        ) from error


def _parity(session, batches, masks, input_names, output_names, reference, multi_label_threshold, rows, batchings, *, what: str) -> dict[str, Any]:
    """The session against ``reference`` over every batch of every batching (``rows``: each batch's feature
    indices), with the max |Δ| of each batching as well."""
    candidate = []
    for batch in batches:
        feed = {name: batch[name].numpy().astype(np.int64) for name in input_names}
        try:
            values = session.run(list(output_names), feed)
        except Exception as error:  # onnxruntime's errors (InvalidArgument, Fail, ...) derive from Exception only
            # A graph that loads but refuses an input (a fixed axis the check after export did not see) or
            # fails inside an op: the export would fail the same way in predict and evaluate.
            shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in feed.items())
            raise ExportError(f"onnxruntime cannot run {what} on the parity inputs ({shapes}): {describe(error)}") from error
        candidate.append(dict(zip(output_names, values)))
    result = compare_outputs(reference, candidate, masks, output_names, multi_label_threshold=multi_label_threshold, feature_ids=rows)
    by_batching, start = {}, 0
    for name, batching in batchings.items():
        part = slice(start, start + len(batching))
        by_batching[name] = compare_outputs(
            reference[part], candidate[part], masks[part], output_names, multi_label_threshold=multi_label_threshold,
        )["max_abs_diff"]
        start += len(batching)
    return {**result, "max_abs_diff_by_batching": by_batching}


def _opset_of(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
