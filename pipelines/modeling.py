"""Tokenizer and model loading shared by every task.

In:  a model id or folder (resolved through the mirror), an Auto class for the task's head, and
     optionally the task's label maps or a from-scratch architecture.
Out: a fast tokenizer and a ``PreTrainedModel`` with label maps stored in its config, so that
     ``pipeline()`` on the saved run reports label names. A checkpoint whose head was trained for the
     same labels in another order has its output rows permuted to ours; one trained for a different
     label set gets a new head (``ignore_mismatched_sizes`` when the count differs) and a warning
     saying so; any other shape mismatch stays an error.

PEFT: :func:`apply_peft` wraps a task model in a ``PeftModel`` (LoRA or IA3) whose peft task type
is the task's ``peft_task_type`` and whose adapter targets and fully trained modules default
per architecture. An adapter run directory (``adapter_config.json`` + ``adapter_model.safetensors``
+ the task model's ``config.json`` with its label maps) loads back through :func:`load_model`:
base weights from the base id recorded in the adapter config (resolved through the mirror), then
the adapter through peft; :func:`enable_adapter_runs_in_pipeline` lets ``pipeline()`` load it the
same way. Training from an adapter run starts from its merged weights, whose head is carried over as
a full checkpoint's is (rows matched to the labels, or a new head of the task's kind and size).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

import models  # noqa: F401  registers bertpipe's own BERT/Transformer with the Auto classes
from pipelines.config import ConfigError, ModelConfig, PeftConfig
from pipelines.errors import ModelError, failures_named
from pipelines.hub import resolve_model
from pipelines.onnx_model import OnnxModel, is_export_dir

logger = logging.getLogger(__name__)


def _named_source(name_or_path: str, key: str) -> str:
    """How a message names a model source: a finished run by its folder, else by the key that set it."""
    if (Path(name_or_path) / "config.yaml").is_file() and (Path(name_or_path) / "metrics.json").is_file():
        return f"run directory {name_or_path}"
    return f"{key}={name_or_path}"


def load_tokenizer(name_or_path: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    location = resolve_model(name_or_path)
    where = _named_source(name_or_path, "model.tokenizer_name_or_path (or model.name_or_path)")
    with failures_named(ModelError, f"{where}: cannot load a tokenizer from {location}"):
        tokenizer = AutoTokenizer.from_pretrained(location, revision=revision)
    if not tokenizer.is_fast:
        raise ModelError(f"tokenizer of {name_or_path!r} is not a fast tokenizer; bertpipe needs offsets and word_ids()")
    return tokenizer


def encode_words_as_in_running_text(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Make pre-split words (``is_split_into_words``) tokenise as the same words do in running text.

    Byte-level BPE (RoBERTa, BART, ModernBERT, GPT-2 style) marks a word that follows a space with
    ``Ġ``; words handed over one by one have no space before them, so ``["Alice", "visited"]`` became
    ``A lice v is ited`` (pieces pretraining never saw) while raw text given to ``pipeline()`` became
    ``ĠAlice Ġvisited``. The fix is made on the backend, where every class honours it, including the
    generic ``PreTrainedTokenizerFast`` that ignores an ``add_prefix_space`` argument: the byte-level
    pre-tokenizer adds the prefix space (every word, the first of a text too, gets its ``Ġ``), the
    offset-trimming processors know of it, and a post-processor that does not trim offsets (ModernBERT's
    template) gets byte-level offset trimming so that no offset covers the space before a word.
    ``add_prefix_space`` is also recorded in the tokenizer's init arguments, because model-specific
    classes (``RobertaTokenizer``) rebuild their pre-tokenizer from it when the run directory is loaded.
    WordPiece and Metaspace (Unigram) tokenizers already split words alike either way: unchanged.
    Returns ``tokenizer`` (changed in place).
    """
    from tokenizers import pre_tokenizers, processors

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    pre = backend.pre_tokenizer
    parts = [pre[index] for index in range(len(_sequence_items(pre)))] if isinstance(pre, pre_tokenizers.Sequence) else [pre]
    byte_level = [part for part in parts if isinstance(part, pre_tokenizers.ByteLevel)]
    if not byte_level or all(part.add_prefix_space for part in byte_level):
        return tokenizer
    for part in byte_level:
        part.add_prefix_space = True
    post = backend.post_processor
    if isinstance(post, (processors.RobertaProcessing, processors.ByteLevel)):
        post.add_prefix_space = True
    elif post is not None and not _trims_offsets(post):
        backend.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True, add_prefix_space=True), post])
    tokenizer.add_prefix_space = True
    tokenizer.init_kwargs["add_prefix_space"] = True
    return tokenizer


def _sequence_items(sequence) -> list:
    return json.loads(sequence.__getstate__())["pretokenizers"]


def _trims_offsets(post_processor) -> bool:
    state = json.loads(post_processor.__getstate__())
    if state.get("type") == "Sequence":
        return any(item.get("trim_offsets") for item in state.get("processors", []))
    return bool(state.get("trim_offsets"))


def tokenizer_source(model: ModelConfig, model_path: str | None = None) -> str:
    """The run folder when evaluating a finished run, else the configured tokenizer or model."""
    source = model_path or model.tokenizer_name_or_path or model.name_or_path
    if source is None:
        raise ModelError("set model.name_or_path (or model.tokenizer_name_or_path) to choose a tokenizer")
    return source


def apply_dropout(config: PretrainedConfig, dropout: float | None) -> None:
    """Set ``model.dropout`` on every dropout setting a config has (BERT's, BART/Marian's names)."""
    if dropout is None:
        return
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout"):
        if hasattr(config, key):
            setattr(config, key, dropout)


def load_model(
    auto_class: Any,
    model: ModelConfig,
    *,
    model_path: str | None = None,
    label_maps: dict[str, Any] | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """Load ``model_path`` (a finished run) or ``model.name_or_path``; build from scratch when neither.

    ``label_maps`` holds ``id2label``/``label2id`` (and ``num_labels``, ``problem_type``) for heads
    that classify; they override what the checkpoint carries.
    """
    label_maps = dict(label_maps or {})
    extra = dict(config_overrides or {})
    source = model_path or model.name_or_path
    if source is None:
        # The family's config class checks these values (layer_norm_eps: "abc", a mistyped name).
        with failures_named(ConfigError, f"model.architecture (model.model_type={model.model_type})"):
            config = AutoConfig.for_model(model.model_type, **model.architecture, **label_maps, **extra)
        apply_dropout(config, model.dropout)
        return auto_class.from_config(config)

    location = model_path or resolve_model(source)
    if model_path is not None and (Path(model_path) / "export.json").is_file():
        # An ONNX export directory (bertpipe export): an onnxruntime session with the model's call
        # interface and config, so the task's predict/postprocess code serves it unchanged.
        if not is_export_dir(model_path):
            raise ModelError(f"{model_path} holds export.json but no model.onnx; export the run again")
        return OnnxModel(model_path)
    where = f"run directory {model_path}" if model_path is not None else f"model.name_or_path={source}"
    with failures_named(ModelError, f"{where}: cannot load the model from {location}"):
        return _load_pretrained(auto_class, model, location, source, model_path=model_path, label_maps=label_maps, extra=extra)


def _load_pretrained(auto_class, model: ModelConfig, location: str, source: str, *, model_path, label_maps, extra) -> PreTrainedModel:
    if is_adapter_dir(location):
        if model_path is not None:
            return load_adapter_model(auto_class, location)  # evaluating an adapter run keeps the PeftModel
        merged = _merged_adapter_run(auto_class, location)
        if not _head_kinds(merged.config):  # MLM, translation: no task head to carry over
            # peft froze the base weights; they stay frozen through the merge, and a full fine-tune (or a
            # new adapter, which freezes what it needs) starts from a model whose weights all train.
            return merged.requires_grad_(True)
        # Training from an adapter run starts from its merged weights, whose head is carried over as a
        # full checkpoint's is: rows matched to our labels, or a new head of our kind and size.
        config, weights = merged.config, {"pretrained_model_name_or_path": None, "state_dict": merged.state_dict()}
    else:
        config = AutoConfig.from_pretrained(location, revision=model.revision)
        weights = {"pretrained_model_name_or_path": location, "revision": model.revision}
    checkpoint_labels = _label_list(config.id2label)
    kinds = _head_kinds(config)
    label_maps, other_head, mismatched_head = _plan_head(kinds, checkpoint_labels, auto_class, label_maps)
    for key, value in {**label_maps, **extra}.items():
        setattr(config, key, value)
    apply_dropout(config, model.dropout)
    if other_head is not None:
        logger.warning(
            "%s has a %s head, whose weights score something else; a new %s head is initialised",
            source, other_head, _head_kind(auto_class.__name__),
        )
    elif mismatched_head:
        logger.warning(
            "%s has a head trained for labels %s; a new head is initialised for labels %s",
            source, checkpoint_labels, list(label_maps["id2label"].values()),
        )
    # An Auto class loads only from a location; the model class it maps the config to also loads a state dict.
    model_class = auto_class._model_mapping[type(config)] if weights["pretrained_model_name_or_path"] is None else auto_class
    loaded, loading_info = model_class.from_pretrained(
        config=config, ignore_mismatched_sizes=mismatched_head or other_head is not None, output_loading_info=True, **weights
    )
    initialized = []
    if other_head is not None:
        initialized = _new_head(loaded)
    elif "id2label" in label_maps and _scores_labels(kinds) and not mismatched_head:
        initialized = _match_head_to_labels(loaded, checkpoint_labels, source)
    # Weights the checkpoint lacked (a new head, or e.g. a pooler an MLM checkpoint never had) are
    # random: peft must train and save them, or an adapter would not reload to the same model.
    initialized += [*loading_info.get("missing_keys", ()), *loading_info.get("mismatched_keys", ())]
    loaded.bertpipe_initialized_keys = sorted({key[0] if isinstance(key, tuple) else key for key in initialized})
    return loaded


def _merged_adapter_run(auto_class, location: str) -> PreTrainedModel:
    """An adapter run's model with the adapter folded in, its head of the kind the run trained.

    The adapter's peft task type names that head (the run's config.json may still name the base's
    architecture). It is loaded as its own kind, as evaluating the run does: loaded into a head of
    another kind, peft fails on head weights it cannot place (RoBERTa's classifier.dense/out_proj
    against a token classifier's single layer). An adapter without a head kind (MLM, translation)
    is loaded as ``auto_class``.
    """
    import transformers

    kind = _ADAPTER_HEADS.get(json.loads((Path(location) / ADAPTER_CONFIG_FILE).read_text()).get("task_type"))
    merged = merge_adapter(load_adapter_model(getattr(transformers, f"AutoModel{kind}") if kind else auto_class, location))
    if kind is not None:
        merged.config.architectures = [type(merged).__name__]
    return merged


def _plan_head(kinds: list[str], checkpoint_labels: list[str], auto_class,
               label_maps: dict[str, Any]) -> tuple[dict[str, Any], str | None, bool]:
    """How a checkpoint's head (of ``kinds``, scoring ``checkpoint_labels``) carries over to the task's.

    Returns the label maps to set, the checkpoint's head kind when ``auto_class`` builds a head of
    another kind (None otherwise), and whether a head of the same kind scores another number of labels.
    """
    other_head = _other_head_kind(kinds, auto_class)
    if other_head is not None and "id2label" not in label_maps:
        # The old head's labels say nothing about a head of another kind: a task that names none (QA) gets
        # a fresh config's two outputs, not e.g. an MNLI head's three, which its start/end split cannot take.
        fresh = PretrainedConfig()
        label_maps = {**label_maps, "id2label": fresh.id2label, "label2id": fresh.label2id}
    mismatched = other_head is None and _head_labels_differ(kinds, checkpoint_labels, label_maps)
    return label_maps, other_head, mismatched


# Models whose position ids start after the padding index (fairseq's convention): two of their
# max_position_embeddings are never usable by tokens.
_POSITION_OFFSET_TYPES = {"roberta", "xlm-roberta", "camembert", "longformer", "xlm-roberta-xl", "data2vec-text"}


def usable_positions(config: PretrainedConfig | None) -> int | None:
    positions = getattr(config, "max_position_embeddings", None)
    if config is None or not isinstance(positions, int) or positions <= 0:
        return None  # no learned table (T5's relative positions): no limit
    offset = (getattr(config, "pad_token_id", None) or 0) + 1 if config.model_type in _POSITION_OFFSET_TYPES else 0
    return positions - offset


def check_sequence_lengths(config: PretrainedConfig, features, *, where: str) -> None:
    """Refuse features longer than the model's learned positions, before any forward pass.

    Such a batch would index past the position-embedding table, mid-training, the first time a long
    enough example is drawn. What is checked is the preprocessed length (the token ids after
    truncation to ``data.max_seq_length``), so a generous setting over short texts still runs.
    ``input_ids`` go through the encoder; a seq2seq model's ``labels`` through its decoder.
    """
    import pyarrow.compute as pc

    encoder = config.encoder if config.model_type == "encoder-decoder" else config
    decoder = config.decoder if config.model_type == "encoder-decoder" else config
    limits = {"input_ids": (usable_positions(encoder), "data.max_seq_length")}
    if getattr(config, "is_encoder_decoder", False):
        limits["labels"] = (usable_positions(decoder), "the task's target length (e.g. translation.max_target_length)")
    for column, (usable, setting) in limits.items():
        if usable is None or column not in features.column_names:
            continue
        lengths = pc.list_value_length(features.with_format("arrow")[column])
        longest = pc.max(lengths).as_py()
        if longest is not None and longest > usable:
            raise ModelError(
                f"{where}: {column} of up to {longest} tokens, but the model has {usable} positions "
                f"(max_position_embeddings in {getattr(config, '_name_or_path', '') or 'its'} config); "
                f"set {setting} to at most {usable}"
            )


_TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")
_LABEL_HEADS = ("ForSequenceClassification", "ForTokenClassification")
"""Task heads with one output row per label (whose label maps say what each row scores)."""


_ADAPTER_HEADS = {"SEQ_CLS": "ForSequenceClassification", "TOKEN_CLS": "ForTokenClassification", "QUESTION_ANS": "ForQuestionAnswering"}
"""The head kind of an adapter run, by the peft task type its adapter_config.json records."""


def _head_kind(class_name: str) -> str | None:
    """``ForTokenClassification`` of ``BertForTokenClassification`` or ``AutoModelForTokenClassification``.

    Families put the kind into their class names (``DebertaV2For...``, ``ModernBertFor...``, bertpipe's
    ``BertpipeFor...``), though not always last: XLNet's QA class is ``XLNetForQuestionAnsweringSimple``.
    Pretraining classes (``ElectraForPreTraining``, ``BertForMaskedLM``) have no task head: None.
    """
    return next((kind for kind in _TASK_HEADS if kind in class_name), None)


def _head_kinds(config: PretrainedConfig) -> list[str]:
    """The task head kinds a full checkpoint holds, by the classes its config's ``architectures`` names."""
    return [kind for name in getattr(config, "architectures", None) or [] if (kind := _head_kind(name)) is not None]


def _scores_labels(kinds: list[str]) -> bool:
    return any(kind in _LABEL_HEADS for kind in kinds)


def _other_head_kind(kinds: list[str], auto_class: Any) -> str | None:
    """The checkpoint's task head kind (of ``kinds``) when ``auto_class`` builds a head of another kind, else None.

    Heads of different kinds often share module names and shapes (BERT, ALBERT, DistilBERT, DeBERTa:
    ``classifier``; ModernBERT: ``head`` + ``classifier``, QA's too): a sentence classifier's weights
    loaded silently into a token classifier with as many labels, scoring tokens with rows trained on
    pooled sentences.
    """
    wanted = _head_kind(getattr(auto_class, "__name__", ""))
    return kinds[0] if wanted is not None and kinds and wanted not in kinds else None


def _new_head(model: PreTrainedModel) -> list[str]:
    """Re-initialise every module outside the base model (weights it shares with the base excepted);
    returns their parameter names."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    shared = {id(parameter) for parameter in base.parameters()} if isinstance(base, torch.nn.Module) and base is not model else set()
    keys: list[str] = []
    for name, child in model.named_children():
        parameters = list(child.named_parameters())
        if child is base or not parameters or any(id(parameter) in shared for _, parameter in parameters):
            continue
        for module in child.modules():
            # transformers' initialisers skip parameters marked as loaded from the checkpoint.
            for parameter in module.parameters(recurse=False):
                parameter._is_hf_initialized = False
            model._init_weights(module)
        keys += [f"{name}.{key}" for key, _ in parameters]
    return keys


def _head_labels_differ(kinds: list[str], checkpoint_labels: list[str], label_maps: dict[str, Any]) -> bool:
    """True when the checkpoint (heads of ``kinds``) has a head scoring labels whose count differs from ours
    (its weights cannot load)."""
    wanted = label_maps.get("id2label")
    return wanted is not None and _scores_labels(kinds) and len(checkpoint_labels) != len(wanted)


def _label_list(id2label: dict[int, str]) -> list[str]:
    return [id2label[index] for index in range(len(id2label))]


def _unnamed(labels: list[str]) -> bool:
    """transformers' placeholder names: the checkpoint does not say what its rows mean."""
    return all(name == f"LABEL_{index}" for index, name in enumerate(labels))


def _output_layer(model: torch.nn.Module) -> tuple[str, torch.nn.Linear] | None:
    """The head's last linear layer with one output per label: its rows score the labels.

    BERT/ALBERT/DistilBERT ``classifier``, RoBERTa/XLM-R/ELECTRA ``classifier.out_proj`` (after a
    dense layer), ModernBERT/DeBERTa ``classifier``; layers inside the base model are not the head's.
    """
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    inside = {id(module) for module in base.modules()} if isinstance(base, torch.nn.Module) and base is not model else set()
    found = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and id(module) not in inside and module.out_features == model.config.num_labels:
            found = (name, module)
    return found


def reorder_head_labels(model: torch.nn.Module, from_labels: list[str], to_labels: list[str]) -> bool:
    """Permute the rows of ``model``'s output layer, which score ``from_labels`` in that order, so that
    they score ``to_labels`` (the same names in another order): each label keeps its own weights and
    the model predicts exactly what it did. False when the model has no such layer."""
    found = _output_layer(model)
    if found is None or sorted(from_labels) != sorted(to_labels) or len(set(to_labels)) != len(to_labels):
        return False
    layer = found[1]
    order = torch.tensor([from_labels.index(name) for name in to_labels], device=layer.weight.device)
    with torch.no_grad():
        layer.weight.copy_(layer.weight[order])
        if layer.bias is not None:
            layer.bias.copy_(layer.bias[order])
    return True


def _match_head_to_labels(model: PreTrainedModel, checkpoint_labels: list[str], source: str) -> list[str]:
    """Make a loaded head whose rows follow ``checkpoint_labels`` score ``model.config.id2label`` instead.

    Loading by shape alone kept a checkpoint's rows under new names when only the count matched: a run
    started from another run whose labels came in another order (a Hub ClassLabel order against a local
    file's) predicted one label's row under another's name, with no error. The same names in another
    order are permuted; other names get a new head (as a head of another size would). Placeholder names
    (``LABEL_0``, ...) say nothing about the rows, which are kept in order. Returns the re-initialised keys.
    """
    wanted = _label_list(model.config.id2label)
    if wanted == checkpoint_labels or _unnamed(checkpoint_labels):
        return []
    if reorder_head_labels(model, checkpoint_labels, wanted):
        logger.info("%s: head rows reordered from labels %s to %s", source, checkpoint_labels, wanted)
        return []
    found = _output_layer(model)
    if found is None:
        raise ModelError(
            f"{source} has a head trained for labels {checkpoint_labels}, and bertpipe cannot find its output layer to "
            f"give it labels {wanted}; start from its base model"
        )
    name, layer = found
    logger.warning("%s has a head trained for labels %s; a new head is initialised for labels %s", source, checkpoint_labels, wanted)
    # transformers' initialisers skip parameters marked as loaded from the checkpoint.
    for parameter in layer.parameters():
        parameter._is_hf_initialized = False
    model._init_weights(layer)
    return [f"{name}.{key}" for key, _ in layer.named_parameters()]


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


# ----- FSDP ---------------------------------------------------------------------------------
# ----- PEFT ---------------------------------------------------------------------------------
ADAPTER_CONFIG_FILE = "adapter_config.json"
MERGED_DIR = "merged"

# What peft adapts in a model type its own tables do not list: every linear layer of the model but the
# output layer (peft resolves the name against the model itself).
ALL_LINEAR = "all-linear"


def peft_task_type(name: str | None):
    """The peft ``TaskType`` a task names (its ``peft_task_type``); None stays None (a plain ``PeftModel``)."""
    from peft import TaskType

    if name is None:
        return None
    if name not in TaskType.__members__:
        raise ModelError(f"no peft task type {name!r}; peft knows: {', '.join(TaskType.__members__)}")
    return TaskType[name]


def _component_types(config: PretrainedConfig) -> list[str]:
    """model_type of the model, or of both halves of an ``EncoderDecoderModel``."""
    if config.model_type == "encoder-decoder":
        return [config.encoder.model_type, config.decoder.model_type]
    return [config.model_type]


def default_target_modules(config: PretrainedConfig, method: str = "lora") -> list[str] | str:
    """Module-name suffixes that get adapters, from peft's own per-model-type table.

    peft lists the attention projections of the model types it knows (BERT/RoBERTa/ELECTRA/XLM-R:
    ``query``/``value``; DeBERTa-v2: ``query_proj``/``value_proj``; T5: ``q``/``v``; BART: ``q_proj``/
    ``v_proj``). Suffix matching reaches every copy: for an encoder-decoder, the self-attention on
    both sides and the decoder's cross-attention. A model type peft does not list (DistilBERT,
    ALBERT, ModernBERT, Marian, mBART, ... or a BERT2BERT half) gets ``"all-linear"``: peft's own
    choice of the model's linear layers, every one but the output layer, so any architecture takes
    an adapter without a hand-kept table of module names.
    """
    from peft.utils.constants import (
        TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING,
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING,
    )

    table = {"lora": TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, "ia3": TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING}[method]
    targets: list[str] = []
    for model_type in _component_types(config):
        found = table.get(model_type)
        if found is None:
            return ALL_LINEAR
        targets += [name for name in found if name not in targets]
    return targets


def default_feedforward_modules(config: PretrainedConfig) -> list[str]:
    """IA3 scales the input (not the output) of these: the feed-forward output projections peft lists."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING

    if default_target_modules(config, "ia3") == ALL_LINEAR:
        return []
    found: list[str] = []
    for model_type in _component_types(config):
        found += TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING.get(model_type, [])
    return list(dict.fromkeys(found))


def default_modules_to_save(model: torch.nn.Module) -> list[str]:
    """The task head: every module outside the base model whose weights the base does not share.

    BERT: ``classifier`` (sequence/token classification), ``qa_outputs`` (QA),
    ``cls.predictions.transform`` (MLM: the vocabulary projection is tied to the input embeddings,
    so it stays frozen and tied rather than being copied and untied). A BERT2BERT
    ``EncoderDecoderModel`` returns ``crossattention``: when warm-started from two encoders its
    cross-attention is newly initialised, so it is trained in full. Pretrained seq2seq models
    (T5, BART, Marian) have no new head: nothing. Modules whose weights the checkpoint lacked
    (recorded by :func:`load_model`, e.g. ``bert.pooler.dense`` under an MLM checkpoint) are added, and
    so are norms that keep running statistics (BatchNorm).
    """
    if model.config.model_type == "encoder-decoder":
        has_cross_attention = any(name.endswith(".crossattention") for name, _ in model.named_modules())
        return ["crossattention"] if has_cross_attention else []
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or base is model:
        return []
    shared = {id(parameter) for parameter in base.parameters()}
    heads: list[str] = []

    def visit(name: str, module: torch.nn.Module) -> None:
        parameters = list(module.parameters())
        if not parameters:
            return
        if not any(id(parameter) in shared for parameter in parameters):
            heads.append(name)
            return
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}", child)

    for name, child in model.named_children():
        if child is not base:
            visit(name, child)
    # Base weights the checkpoint did not provide (see load_model) are random: train and save them too.
    base_modules = {id(module) for module in base.modules()}
    for key in getattr(model, "bertpipe_initialized_keys", ()):
        module_name = key.rsplit(".", 1)[0]
        if any(module_name == head or module_name.startswith(head + ".") for head in heads):
            continue
        # A module holding a weight tied to the base (the vocabulary projection of an MLM head, missing
        # from a checkpoint saved without one, e.g. a sentence-transformers encoder) cannot be copied
        # whole: a copy unties it, and as a parent of a head already listed ("cls.predictions" over
        # "cls.predictions.transform") peft saves an adapter it cannot load back. What such a module
        # lacks is its output bias, which transformers zero-initialises on every load: it stays frozen.
        module = model.get_submodule(module_name)
        if id(module) not in base_modules and any(id(parameter) in shared for parameter in module.parameters()):
            continue
        heads.append(module_name)
    # Norms with running statistics (bertpipe's own BERT with norm: batch) change in training although the
    # base is frozen, and an adapter holds only what it names: reloaded onto the base's old statistics,
    # the run would predict otherwise than it evaluated.
    for name, module in base.named_modules():
        if isinstance(getattr(module, "running_mean", None), torch.Tensor):
            heads.append(f"{model.base_model_prefix}.{name}")
    return heads


def base_model_id(model: ModelConfig) -> str | None:
    """What an adapter records as its base: the Hub id (not a mirror path), or an absolute local folder."""
    if model.name_or_path is None:
        return None
    local = Path(model.name_or_path).expanduser()
    return str(local.resolve()) if local.exists() else model.name_or_path


def build_peft_config(model: PreTrainedModel, peft: PeftConfig, task_type: str | None, *, base_model_name_or_path: str | None):
    """The peft ``LoraConfig``/``IA3Config`` for ``model`` under ``peft`` settings and the task's peft task type."""
    from peft import IA3Config, LoraConfig

    target_modules = peft.target_modules if peft.target_modules is not None else default_target_modules(model.config, peft.method)
    modules_to_save = peft.modules_to_save if peft.modules_to_save is not None else default_modules_to_save(model)
    common = {
        "task_type": peft_task_type(task_type),
        "target_modules": target_modules,
        # peft's task-type wrappers add their own head names on top (SEQ_CLS/TOKEN_CLS: classifier,
        # score; QUESTION_ANS: qa_outputs); names a model lacks are ignored.
        "modules_to_save": list(modules_to_save),
        "base_model_name_or_path": base_model_name_or_path,
    }
    if peft.method == "ia3":
        feedforward = [name for name in default_feedforward_modules(model.config) if peft.target_modules is None]
        return IA3Config(feedforward_modules=feedforward, **common)
    return LoraConfig(r=peft.r, lora_alpha=peft.alpha, lora_dropout=peft.dropout, **common)


def apply_peft(model: PreTrainedModel, peft: PeftConfig | None, task_type: str | None, *, base_model_name_or_path: str | None = None,
               base_model_revision: str | None = None):
    """Wrap ``model`` for parameter-efficient training; returns it unchanged when ``peft`` is None.

    ``task_type`` is the task's ``peft_task_type`` (``SEQ_CLS``, ...; None for a plain ``PeftModel``).
    Only the adapters and ``modules_to_save`` keep ``requires_grad``; the base weights are frozen.
    The adapter records its base by id and revision (``model.revision``), which reloading it reads back.
    """
    if peft is None:
        return model
    if base_model_name_or_path is None:
        raise ModelError("model.peft adapts a pretrained model: set model.name_or_path (a Hub id or folder)")
    from peft import get_peft_model

    config = build_peft_config(model, peft, task_type, base_model_name_or_path=base_model_name_or_path)
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as error:  # e.g. "Target modules {...} not found in the base model"
        raise ModelError(f"model.peft: {error}") from error
    # get_peft_model records the folder the weights came from (a mirror path); the run records the base id.
    wrapped.peft_config["default"].base_model_name_or_path = base_model_name_or_path
    # Without it the adapter trained on a tagged base would be reloaded on the base's newest weights.
    wrapped.peft_config["default"].revision = base_model_revision
    return wrapped


def is_peft_model(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG_FILE).is_file()


def adapter_base_model(run_dir: str | Path) -> str:
    """The base model id an adapter run directory records."""
    recorded = json.loads((Path(run_dir) / ADAPTER_CONFIG_FILE).read_text()).get("base_model_name_or_path")
    if not recorded:
        raise ModelError(f"{run_dir}/{ADAPTER_CONFIG_FILE} names no base_model_name_or_path; cannot rebuild the base model")
    return recorded


def adapter_base_revision(run_dir: str | Path) -> str | None:
    """The base model revision an adapter run directory records (peft's ``revision``; None: the default branch)."""
    return json.loads((Path(run_dir) / ADAPTER_CONFIG_FILE).read_text()).get("revision")


def load_adapter_model(auto_class: Any, run_dir: str | Path, *, is_trainable: bool = False):
    """Base weights (resolved through the mirror) at the revision the adapter records, under the run's
    own config, then the adapter.

    The run's ``config.json`` carries the head's label maps; the base checkpoint's config does not.
    The base revision is the adapter's record, not a revision asked for the adapter itself
    (``model.revision`` names a revision of ``model.name_or_path``, the adapter's repository).
    """
    from peft import PeftModel

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ModelError(f"{run_dir} holds an adapter but no config.json (the task model's config with its label maps)")
    config = AutoConfig.from_pretrained(run_dir)
    recorded = adapter_base_model(run_dir)
    if Path(recorded).is_absolute() and not Path(recorded).exists():
        # A local base is recorded by its absolute path (base_model_id); a Hub id never is one. Left to
        # resolve_model, a moved folder would be looked up as a Hub id in the mirror and on the Hub.
        raise ModelError(
            f"{run_dir / ADAPTER_CONFIG_FILE} records its base model as the local folder {recorded} "
            "(base_model_name_or_path), which no longer exists: put the base model back there, or set "
            "base_model_name_or_path in that file to the folder it is in now"
        )
    base_location = resolve_model(recorded)
    revision = adapter_base_revision(run_dir)
    base_config = AutoConfig.from_pretrained(base_location, revision=revision)
    wanted = {"id2label": config.id2label} if hasattr(config, "id2label") else {}
    base = auto_class.from_pretrained(
        base_location, config=config, revision=revision,
        ignore_mismatched_sizes=_head_labels_differ(_head_kinds(base_config), _label_list(base_config.id2label), wanted),
    )
    return PeftModel.from_pretrained(base, run_dir, is_trainable=is_trainable)


def is_adapter_only_dir(path: Any) -> bool:
    """A local adapter run directory: adapter + task config, but no full weights of its own.

    transformers' ``from_pretrained`` reads a folder holding both ``config.json`` and
    ``adapter_config.json`` as a full model with an embedded adapter and looks for its weights there.
    """
    if not isinstance(path, (str, Path)) or not Path(path).is_dir():
        return False
    folder = Path(path)
    has_full_weights = any(folder.glob("model*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return is_adapter_dir(folder) and (folder / "config.json").is_file() and not has_full_weights


def _adapter_run_loader(auto_classes: tuple[type, ...]) -> type:
    """A model class for ``PIPELINE_REGISTRY`` that loads adapter run directories through peft.

    ``pipeline()`` tries its model classes in order and moves on when one raises ``OSError``/``ValueError``,
    so anything that is not an adapter-only run directory is left to the task's own Auto classes.
    """

    class AdapterRunLoader:
        bertpipe_adapter_loader = True

        @classmethod
        def from_pretrained(cls, path: Any, *args: Any, revision: str | None = None, **kwargs: Any):
            if not is_adapter_only_dir(path):
                raise OSError(f"{path} is not an adapter-only run directory")
            failures = []
            # pipeline(..., dtype=torch.bfloat16) passes it here; a dtype it does not name stays fp32.
            dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
            for auto_class in auto_classes:
                try:
                    model = load_adapter_model(auto_class, path).eval()
                except ValueError as error:  # the Auto class does not map this config type
                    failures.append(f"{auto_class.__name__}: {error}")
                    continue
                return model.to(dtype) if isinstance(dtype, torch.dtype) else model
            raise ValueError(f"no model class of this pipeline task loads the adapter run {path}: {'; '.join(failures)}")

    return AdapterRunLoader


def enable_adapter_runs_in_pipeline(pipeline_task: str) -> None:
    """Let ``pipeline(pipeline_task, model=RUN_DIR)`` load an adapter-only run directory (idempotent).

    Without this, transformers 5 looks for full weights in the run directory (it holds ``config.json``
    with the task's label maps, which the base model's config lacks) and fails.
    """
    from transformers.pipelines import PIPELINE_REGISTRY

    entry = PIPELINE_REGISTRY.supported_tasks[pipeline_task]
    model_classes = tuple(entry.get("pt", ()))
    if any(getattr(model_class, "bertpipe_adapter_loader", False) for model_class in model_classes):
        return
    entry["pt"] = (_adapter_run_loader(model_classes),) + model_classes


def save_adapter_run(model, run_dir: str | Path, *, is_main_process: bool = True) -> None:
    """Adapter weights + adapter config + the task model's config (label maps, generation config)."""
    if not is_main_process:
        return
    run_dir = Path(run_dir)
    model.save_pretrained(run_dir)
    base = model.get_base_model()
    base.config.save_pretrained(run_dir)
    if getattr(base, "generation_config", None) is not None and base.can_generate():
        base.generation_config.save_pretrained(run_dir)
    # peft writes its own README.md stub; the run's model card replaces it afterwards.


def merge_adapter(model) -> PreTrainedModel:
    """``model.merge_and_unload()``: the plain transformers model with the adapter folded in and the
    trained copies of ``modules_to_save`` in place of the originals (in place: ``model`` is used up)."""
    from peft.utils.other import ModulesToSaveWrapper

    # peft's generic unload (IA3's, unlike LoRA's) copies `.weight` from the old module onto the
    # new one, which fails for a head kept whole that is not one layer (RoBERTa/ELECTRA/XLM-R's
    # classifier.dense + out_proj, DeBERTa's pooler, ModernBERT's head). Put the trained copies in
    # place first; what is left to unload are the adapter layers themselves.
    base = model.get_base_model()
    wrapped = [(name, module) for name, module in base.named_modules() if isinstance(module, ModulesToSaveWrapper)]
    for name, module in wrapped:
        parent_name, _, child_name = name.rpartition(".")
        trained = module.unload_and_optionally_merge_module(merge=True, safe_merge=False, adapter_names=None)
        setattr(base.get_submodule(parent_name) if parent_name else base, child_name, trained)
    return model.merge_and_unload()


def save_merged_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Fold the adapter into the base weights and save a plain transformers model (+ tokenizer).

    Merges in place: ``model`` must not be trained further afterwards.
    """
    out_dir = Path(out_dir)
    merged = merge_adapter(model)
    merged.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
