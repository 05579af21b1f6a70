"""Conversion between transformers BERT checkpoints and bertpipe_bert checkpoints.

In: a checkpoint folder (``config.json`` + ``model.safetensors``, or a sharded safetensors index; tokenizer
files optional). Out: a folder of the other kind that ``AutoModel*.from_pretrained`` loads (after
``import models`` for ours), with the tokenizer files copied along.

    convert_bert(src, dst)                 transformers "bert" -> "bertpipe_bert"
    convert_bert(src, dst, reverse=True)   "bertpipe_bert" -> transformers "bert"

Only the tensors' names change; values are copied bit for bit, so converted models give the same outputs.
The head is kept when both sides have it (masked LM, sequence/token classification, QA); the NSP head of
BertForPreTraining has no counterpart here and is dropped, as is a pooler that the target head does not
read. Decoder BERTs (``is_decoder``) and relative positions are refused. The reverse direction needs the
BERT architecture proper: learned positions, unscaled token embeddings, dot-product attention, post-LayerNorm.
"""

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

# (transformers BERT name, ours); "{i}" stands for a layer index. Names are without the "bert." prefix of
# head checkpoints for the encoder rows, and in full for the head rows.
_ENCODER_NAMES = [
    ("embeddings.word_embeddings.", "embeddings.token_embeddings."),
    ("embeddings.token_type_embeddings.", "embeddings.segment_embeddings."),
    ("embeddings.position_embeddings.", "embeddings.position_embeddings."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("encoder.layer.{i}.attention.self.query.", "encoder.layers.{i}.self_attention.query."),
    ("encoder.layer.{i}.attention.self.key.", "encoder.layers.{i}.self_attention.key."),
    ("encoder.layer.{i}.attention.self.value.", "encoder.layers.{i}.self_attention.value."),
    ("encoder.layer.{i}.attention.output.dense.", "encoder.layers.{i}.self_attention.output."),
    ("encoder.layer.{i}.attention.output.LayerNorm.", "encoder.layers.{i}.attention_norm.norm."),
    ("encoder.layer.{i}.intermediate.dense.", "encoder.layers.{i}.ffn.w_1."),
    ("encoder.layer.{i}.output.dense.", "encoder.layers.{i}.ffn.w_2."),
    ("encoder.layer.{i}.output.LayerNorm.", "encoder.layers.{i}.ffn_norm.norm."),
    ("pooler.dense.", "pooler.dense."),
]
_HEAD_NAMES = [
    ("cls.predictions.transform.dense.", "mlm_head.transform."),
    ("cls.predictions.transform.LayerNorm.", "mlm_head.norm."),
    ("cls.predictions.bias", "mlm_head.decoder.bias"),
    ("classifier.", "classifier."),
    ("qa_outputs.", "qa_outputs."),
]
# Tensors that are not weights of either model (buffers, the NSP head).
_SKIP_HF = re.compile(r"(position_ids|embeddings\.token_type_ids|cls\.seq_relationship\.)")
# The vocabulary projection. Tied (the default), its weight is the token embedding matrix and its bias is
# cls.predictions.bias, so only those are stored here. With tie_word_embeddings=false transformers unties both:
# decoder.weight and decoder.bias are what BertForMaskedLM computes with, and cls.predictions.bias goes unused.
_TIED_DECODER_HF = re.compile(r"^cls\.predictions\.decoder\.(weight|bias)$")
_UNTIED_DECODER_NAMES = [("cls.predictions.decoder.", "mlm_head.decoder.")]

_ARCHITECTURES = {
    "BertModel": "BertpipeModel",
    "BertForMaskedLM": "BertpipeForMaskedLM",
    "BertForPreTraining": "BertpipeForMaskedLM",
    "BertForSequenceClassification": "BertpipeForSequenceClassification",
    "BertForTokenClassification": "BertpipeForTokenClassification",
    "BertForQuestionAnswering": "BertpipeForQuestionAnswering",
}
_REVERSE_ARCHITECTURES = {ours: theirs for theirs, ours in _ARCHITECTURES.items() if theirs != "BertForPreTraining"}

_BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "id2label",
    "label2id",
    "problem_type",
    "tie_word_embeddings",
    # How the run's pipeline() answers (NER's word aggregation and windows, QA's stride and no-answer rule): without
    # them pipeline() on a converted run tagged pieces and answered unanswerable questions, unlike predict.
    "task_specific_params",
)
_POOLER = re.compile(r"^(bert\.)?pooler\.")
_WEIGHT_FILES = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$")
# The source's weights for other frameworks and runtimes (Hub BERT repos carry them): beside the converted
# model they would be another model's weights, and stale once it is fine-tuned.
_OTHER_FORMAT_WEIGHTS = re.compile(r"^(tf_model\.h5|flax_model\.msgpack|rust_model\.ot|model\.ckpt\..*|onnx|openvino|coreml)$")


_LEGACY_NORM = re.compile(r"LayerNorm\.(gamma|beta)$")


def _translate(name: str, table, reverse: bool = False) -> str | None:
    """Rename by the first row whose source template is a prefix of ``name``; None if no row matches."""
    for theirs, ours in table:
        source, target = (ours, theirs) if reverse else (theirs, ours)
        pattern = re.escape(source).replace(re.escape("{i}"), r"(?P<i>\d+)")
        match = re.match(pattern, name)
        if match:
            return target.replace("{i}", match.groupdict().get("i") or "") + name[match.end() :]
    return None


def _load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    single = folder / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        state = {}
        for shard in sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())):
            state.update(load_file(folder / shard))
        return state
    binary = folder / "pytorch_model.bin"
    if binary.exists():
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no model.safetensors, safetensors index or pytorch_model.bin in {folder}")


def _copy_side_files(src: Path, dst: Path, leave_out: tuple[Path, ...] = ()) -> None:
    """Tokenizer and other non-weight files (README, sentence-transformers files) go along unchanged; not ``dst``
    itself, nor ``leave_out``, where they lie inside ``src`` (copied, a DST inside SRC held a copy of itself)."""
    inside = {Path(path).resolve() for path in (dst, *leave_out)}
    for path in src.iterdir():
        if path.name in ("config.json", "generation_config.json") or _WEIGHT_FILES.match(path.name) or _OTHER_FORMAT_WEIGHTS.match(path.name):
            continue
        if path.resolve() in inside:
            continue
        target = dst / path.name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            shutil.copy2(path, target)


def _split_prefix(name: str) -> tuple[str, str]:
    return ("bert.", name[len("bert.") :]) if name.startswith("bert.") else ("", name)


def _bert_to_ours(state, config_dict):
    from .configuration import BertpipeBertConfig

    # Refused before any tensor is read: a relative-position checkpoint also carries distance_embedding
    # tensors, and an error about those would hide the setting that is really unsupported.
    position_embedding_type = config_dict.get("position_embedding_type", "absolute")
    if position_embedding_type != "absolute":
        raise ValueError(
            f"position_embedding_type={position_embedding_type!r} has no bertpipe counterpart; "
            "only 'absolute' (learned) position embeddings convert"
        )
    # A decoder BERT attends causally (and, with add_cross_attention, to an encoder); ours is a
    # bidirectional encoder, so converting would silently change every output.
    for key in ("is_decoder", "add_cross_attention"):
        if config_dict.get(key):
            raise ValueError(f"{key}=true has no bertpipe counterpart; only bidirectional encoders convert")
    # The names of the original TensorFlow conversion, which bert-base-uncased's own files keep and transformers
    # renames on load: they were refused ("missing 'bert.embeddings.norm.bias'").
    state = {_LEGACY_NORM.sub(lambda match: "LayerNorm." + {"gamma": "weight", "beta": "bias"}[match.group(1)], name): tensor
             for name, tensor in state.items()}
    tied = config_dict.get("tie_word_embeddings", True)
    if tied and "cls.predictions.bias" not in state and "cls.predictions.decoder.bias" in state:
        # Some exports keep the output bias only under its tied alias.
        state = {**state, "cls.predictions.bias": state["cls.predictions.decoder.bias"]}
    converted = {}
    for name, tensor in state.items():
        if _SKIP_HF.search(name) or (_TIED_DECODER_HF.match(name) if tied else name == "cls.predictions.bias"):
            continue
        prefix, rest = _split_prefix(name)
        new = _translate(rest, _ENCODER_NAMES)
        if new is None:
            new = _translate(name, _HEAD_NAMES if tied else _UNTIED_DECODER_NAMES + _HEAD_NAMES)
            prefix = ""
        if new is None:
            raise KeyError(f"no bertpipe counterpart for tensor {name!r}")
        converted[prefix + new] = tensor
    kwargs = {key: config_dict[key] for key in _BERT_FIELDS if key in config_dict}
    config = BertpipeBertConfig(
        position_embedding="learned", attention_score="dot", norm="layer", norm_placement="post", **kwargs
    )
    architecture = (config_dict.get("architectures") or ["BertModel"])[0]
    if architecture not in _ARCHITECTURES:
        raise ValueError(f"cannot convert architecture {architecture!r}; known: {sorted(_ARCHITECTURES)}")
    return converted, config, _ARCHITECTURES[architecture]


def _ours_to_bert(state, config_dict):
    from transformers import BertConfig

    for key, required in (
        ("position_embedding", "learned"),
        ("attention_score", "dot"),
        ("norm", "layer"),
        ("norm_placement", "post"),
        # transformers BERT adds token embeddings unscaled; a √hidden_size factor would be dropped silently.
        ("scale_embedding", False),
    ):
        if config_dict.get(key, required) != required:
            raise ValueError(f"transformers BERT needs {key}={required!r}; this checkpoint has {config_dict[key]!r}")
    tied = config_dict.get("tie_word_embeddings", True)
    converted = {}
    for name, tensor in state.items():
        if tied and name == "mlm_head.decoder.weight":  # the token embeddings; transformers re-ties it
            continue
        prefix, rest = _split_prefix(name)
        new = _translate(rest, _ENCODER_NAMES, reverse=True)
        if new is None:
            new = _translate(name, _HEAD_NAMES if tied else _UNTIED_DECODER_NAMES + _HEAD_NAMES, reverse=True)
            prefix = ""
        if new is None:
            raise KeyError(f"no transformers BERT counterpart for tensor {name!r}")
        converted[prefix + new] = tensor
        if new == "cls.predictions.decoder.bias":
            # Untied, BertForMaskedLM still has the (unused) cls.predictions.bias; give it the same values.
            converted["cls.predictions.bias"] = tensor
    kwargs = {key: config_dict[key] for key in _BERT_FIELDS if key in config_dict}
    config = BertConfig(**kwargs)
    architecture = (config_dict.get("architectures") or ["BertpipeModel"])[0]
    if architecture not in _REVERSE_ARCHITECTURES:
        raise ValueError(f"cannot convert architecture {architecture!r}; known: {sorted(_REVERSE_ARCHITECTURES)}")
    return converted, config, _REVERSE_ARCHITECTURES[architecture]


def convert_bert(src: str, dst: str, reverse: bool = False, *, leave_out: tuple[str, ...] = ()) -> None:
    """Write ``dst`` as the bertpipe_bert version of the transformers BERT checkpoint ``src`` (or back).

    The model is rebuilt and its weights loaded strictly before saving, so a missing or unexpected tensor
    fails here instead of silently re-initialising a layer at load time. ``leave_out``: folders inside
    ``src`` that are not its side files (the destination ``dst`` stages for).
    """
    import transformers

    from . import bert as bertpipe_bert

    src_path, dst_path = Path(src), Path(dst)
    config_dict = json.loads((src_path / "config.json").read_text(encoding="utf-8"))
    state = _load_state_dict(src_path)
    if reverse:
        if config_dict.get("model_type") != "bertpipe_bert":
            raise ValueError(f"{src} is not a bertpipe_bert checkpoint (model_type={config_dict.get('model_type')!r})")
        converted, config, class_name = _ours_to_bert(state, config_dict)
        model_class = getattr(transformers, class_name)
    else:
        if config_dict.get("model_type") != "bert":
            raise ValueError(
                f"{src} is not a transformers BERT checkpoint (model_type={config_dict.get('model_type')!r})"
            )
        converted, config, class_name = _bert_to_ours(state, config_dict)
        model_class = getattr(bertpipe_bert, class_name)

    # A BertModel checkpoint without a pooler converts to a model without one.
    has_pooler = any(".pooler." in name or name.startswith("pooler.") for name in converted)
    init_kwargs = {"add_pooling_layer": has_pooler} if class_name in ("BertModel", "BertpipeModel") else {}
    model = model_class(config, **init_kwargs)
    if model.base_model.pooler is None:
        # BertForPreTraining and BERT's original MLM checkpoints (bert-base-uncased) carry the NSP pooler,
        # which a masked-LM, token or QA head never reads; transformers drops it at load time too.
        converted = {name: tensor for name, tensor in converted.items() if not _POOLER.match(name)}
    missing, unexpected = model.load_state_dict(converted, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    missing = [name for name in missing if name not in tied and not name.endswith(("position_ids", "token_type_ids"))]
    if missing or unexpected:
        raise RuntimeError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()

    dst_path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst_path)
    _copy_side_files(src_path, dst_path, tuple(Path(path) for path in leave_out))
