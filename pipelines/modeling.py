"""Tokenizer and model loading shared by every task.

In:  a model id or folder (resolved through the mirror), an Auto class for the task's head, and
     optionally the task's label maps or a from-scratch architecture.
Out: a fast tokenizer and a ``PreTrainedModel`` with label maps stored in its config, so that
     ``pipeline()`` on the saved run reports label names. How a checkpoint's head meets the task's labels
     (rows permuted to our order, or a new head with a warning saying why) is :mod:`pipelines.heads`; any
     other shape mismatch stays an error. An adapter run loads through :mod:`pipelines.adapters` (kept a
     ``PeftModel`` when evaluated; merged, its head carried over as a full checkpoint's, when a new run
     starts from it); an ONNX export directory loads as an :class:`~pipelines.onnx_model.OnnxModel`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

import models  # noqa: F401  registers bertpipe's own BERT/Transformer with the Auto classes
from pipelines.adapters import is_adapter_dir, load_adapter_model, merged_adapter_run
from pipelines.config import ConfigError, ModelConfig
from pipelines.errors import ModelError, failures_named
from pipelines.heads import head_kind, head_kinds, label_list, match_head_to_labels, plan_head, reinitialize_head, scores_labels
from pipelines.hub import resolve_model
from pipelines.onnx_model import OnnxModel, is_export_dir

logger = logging.getLogger(__name__)

# Every model is trained and evaluated from fp32 weights, whatever dtype its checkpoint was saved in: transformers 5
# loads a bf16 checkpoint as bf16 by default (dtype="auto"), and a run of train.mixed_precision=no then trained pure
# bf16 weights and updates and saved them so, while autocast (bf16 or fp16) is meant to keep fp32 master weights.
WEIGHTS_DTYPE = torch.float32


def _named_source(name_or_path: str, key: str) -> str:
    """How a message names a model source: a finished run by its folder, else by the key that set it."""
    if (Path(name_or_path) / "config.yaml").is_file() and (Path(name_or_path) / "metrics.json").is_file():
        return f"run directory {name_or_path}"
    return f"{key}={name_or_path}"


_REVISIONS_WARNED: set[tuple[str, str]] = set()


def warn_revision_of_a_local_copy(source: str, location: str, revision: str | None) -> None:
    """Say once that ``model.revision`` cannot choose among a local copy's versions: a folder (a mirror copy of a Hub
    id, or a path) holds one, and from_pretrained ignores the revision there without a word, while config.yaml, the
    adapter and the card go on recording the revision asked for."""
    if revision in (None, "main") or not Path(location).is_dir() or (source, revision) in _REVISIONS_WARNED:
        return
    _REVISIONS_WARNED.add((source, revision))
    mirrored = Path(location).resolve() != Path(source).expanduser().resolve()
    logger.warning("model.revision=%s: %s %s, which holds one version, whatever was copied there: revision %s is not "
                   "checked, though the run records it", revision, source,
                   f"resolves to its mirror copy {location}" if mirrored else "is a local folder", revision)


def load_tokenizer(name_or_path: str, revision: str | None = None, *, require_fast: bool = True) -> PreTrainedTokenizerBase:
    """The tokenizer at ``name_or_path`` (Hub id, mirror id or folder). ``require_fast``: tasks that read offsets
    and ``word_ids()`` need a fast one; translation takes Marian's sentencepiece-only tokenizer too."""
    location = resolve_model(name_or_path)
    warn_revision_of_a_local_copy(name_or_path, location, revision)
    where = _named_source(name_or_path, "model.tokenizer_name_or_path (or model.name_or_path)")
    with failures_named(ModelError, f"{where}: cannot load a tokenizer from {location}"):
        tokenizer = AutoTokenizer.from_pretrained(location, revision=revision)
    if require_fast and not tokenizer.is_fast:
        raise ModelError(f"tokenizer of {name_or_path!r} is not a fast tokenizer; bertpipe needs offsets and word_ids()")
    # A folder without its tokenizer files (weights copied alone, a model-only Hub repo) still loads: transformers
    # builds the family's tokenizer from config.json with an empty vocabulary, and every word reads as unknown.
    if not set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens) - set(tokenizer.get_added_vocab()):
        raise ModelError(
            f"{where}: {location} holds no tokenizer vocabulary, only the special tokens {tokenizer.all_special_tokens}: its "
            "tokenizer files (tokenizer.json, vocab.txt, ...) are missing, and every word would read as "
            f"{tokenizer.unk_token or 'unknown'}. Copy them into the folder, or set model.tokenizer_name_or_path"
        )
    return tokenizer


def encode_words_as_in_running_text(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Make pre-split words (``is_split_into_words``) tokenise as the same words do in running text.

    Every word is encoded as it is mid-sentence, after a space. Byte-level BPE (RoBERTa, BART, ModernBERT,
    GPT-2 style) marks a word that follows a space with ``Ġ``; words handed over one by one have no space
    before them, so ``["Alice", "visited"]`` became ``A lice v is ited`` (pieces pretraining never saw)
    while raw text given to ``pipeline()`` became ``ĠAlice Ġvisited``. Two fixes, made on the backend
    where every class honours them, tried in turn on a probe sentence (words alone against the same
    words after a first one):
      * the byte-level pre-tokenizer adds the prefix space (RoBERTa, BART, ModernBERT): every word, the
        first of a text too, gets its ``Ġ``; the offset-trimming processors know of it, and a
        post-processor that does not trim offsets (ModernBERT's template) gets byte-level offset trimming
        so that no offset covers the space before a word. ``add_prefix_space`` is also recorded in the
        init arguments, because model-specific classes (``RobertaTokenizer``) rebuild their pre-tokenizer
        from it when the run directory is loaded;
      * where a pre-tokenizer splits before the byte-level step (Llama 3's regex ``Split``, so a prefix
        space per split gave ``ĠMarguerite Ġ's``) or the normalizer turns spaces into ``▁`` (Gemma's
        ``Replace``), a ``Prepend(" ")`` normalizer gives each word the space it has mid-sentence; the
        added space is aligned with the word's first character, so no offset leaves the word. A class
        that rebuilds its normalizer on load (``GemmaTokenizer``) loses it, which is why the NER
        ``pipeline()`` applies this function to the tokenizer it loads, as predict does.
    WordPiece and Metaspace (Unigram) tokenizers already split words alike either way: unchanged, as is a
    tokenizer already fixed (a run directory's). Returns ``tokenizer`` (changed in place); a ModelError
    when words handed over one by one still get other pieces than mid-sentence (BPE merges across spaces).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    words = _WORDS_PROBE.split()
    # Before any change, as pretraining saw them; the backend's own pieces pick the fix, the class's are checked last.
    mid_sentence = _pieces_after_a_first_word(tokenizer, _WORDS_PROBE)
    backend_mid_sentence = _pieces_after_a_first_word(backend, _WORDS_PROBE)
    if _word_pieces(backend, words) != backend_mid_sentence:
        if _word_pieces(_with_byte_level_prefix_space(_copy(backend)), words) == backend_mid_sentence:
            _give_words_their_prefix_space(tokenizer, backend)
        elif _word_pieces(_with_space_prepended(_copy(backend)), words) == backend_mid_sentence:
            _with_space_prepended(backend)
    split_words = _pieces(tokenizer, words)
    if split_words != mid_sentence:
        raise ModelError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'the model'} cuts words handed over one by one "
            f"into other pieces than running text ({split_words[:8]} against {mid_sentence[:8]} for {_WORDS_PROBE[:30]!r}), "
            "pieces its pretraining never saw, however each word is given its space (its BPE merges pieces across spaces): "
            "it cannot read the pre-split words this task reads"
        )
    return tokenizer


# Words a tokenizer may cut differently alone than in running text: an apostrophe, digits, punctuation, rare names.
_WORDS_PROBE = "Marguerite's film in 1996 was good, said Anastasia Kowalski."
_FIRST_WORD = "x "


def _pieces(tokenizer: PreTrainedTokenizerBase, words: list[str]) -> list[str]:
    ids = tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
    return tokenizer.convert_ids_to_tokens(ids)


def _word_pieces(backend, words: list[str]) -> list[str]:
    return backend.encode(words, is_pretokenized=True, add_special_tokens=False).tokens


def _pieces_after_a_first_word(tokenizer, text: str) -> list[str]:
    """The pieces of ``text`` placed after a first word and a space, so that its own first word is mid-sentence too
    (``tokenizer``: a transformers tokenizer or its backend)."""
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        encoding = tokenizer(_FIRST_WORD + text, add_special_tokens=False, return_offsets_mapping=True)
        pieces, offsets = tokenizer.convert_ids_to_tokens(encoding["input_ids"]), encoding["offset_mapping"]
    else:
        encoding = tokenizer.encode(_FIRST_WORD + text, add_special_tokens=False)
        pieces, offsets = encoding.tokens, encoding.offsets
    return [piece for piece, (_, end) in zip(pieces, offsets) if end > len(_FIRST_WORD) - 1]


def _copy(backend):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(backend.to_str())


def _with_byte_level_prefix_space(backend):
    for part in _byte_level_parts(backend):
        part.add_prefix_space = True
    return backend


def _with_space_prepended(backend):
    from tokenizers import normalizers

    current = backend.normalizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(" "), current]) if current is not None else normalizers.Prepend(" ")
    return backend


def _byte_level_parts(backend) -> list:
    from tokenizers import pre_tokenizers

    pre = backend.pre_tokenizer
    parts = [pre[index] for index in range(len(_sequence_items(pre)))] if isinstance(pre, pre_tokenizers.Sequence) else [pre]
    return [part for part in parts if isinstance(part, pre_tokenizers.ByteLevel)]


def _give_words_their_prefix_space(tokenizer: PreTrainedTokenizerBase, backend) -> None:
    """Byte-level pre-tokenizers add the space before every word (see :func:`encode_words_as_in_running_text`)."""
    from tokenizers import processors

    _with_byte_level_prefix_space(backend)
    post = backend.post_processor
    if isinstance(post, (processors.RobertaProcessing, processors.ByteLevel)):
        post.add_prefix_space = True
    elif post is not None and not _trims_offsets(post):
        backend.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True, add_prefix_space=True), post])
    tokenizer.add_prefix_space = True
    tokenizer.init_kwargs["add_prefix_space"] = True


def _sequence_items(sequence) -> list:
    return json.loads(sequence.__getstate__())["pretokenizers"]


def _trims_offsets(post_processor) -> bool:
    state = json.loads(post_processor.__getstate__())
    if state.get("type") == "Sequence":
        return any(item.get("trim_offsets") for item in state.get("processors", []))
    return bool(state.get("trim_offsets"))


def classification_token_comes_last(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer puts its classification token last (XLNet's ``A <sep> <cls>``), where the model's summary
    reads it: such models pad on the left and read a pair context first. Every other layout is read at the first
    position (``[CLS]``, ``<s>``, or a first text piece where the tokenizer adds none) or at the last token that is
    not padding. A CLS token that is also the end-of-text token (``<bos> A <eos>`` with ``cls_token = eos_token``)
    closes every text and is no summary token."""
    cls_id = tokenizer.cls_token_id
    ids = tokenizer("a")["input_ids"]
    if cls_id is None or not ids or cls_id in (tokenizer.sep_token_id, tokenizer.eos_token_id):
        return False
    return ids[-1] == cls_id and ids[0] != cls_id


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


def return_no_layer_caches(config: PretrainedConfig) -> None:
    """Turn off XLNet's ``use_mems_eval`` (on in every XLNet checkpoint): an evaluation forward then returned one cached
    state per layer beside the logits, which ``pipeline()`` split as if it held one per row of the batch (an
    IndexError in any batch larger than the layer count). No task of bertpipe reads them; the run saves the setting."""
    if getattr(config, "use_mems_eval", False):
        config.use_mems_eval = False


def keep_fixed_what_the_family_keeps_fixed(model: PreTrainedModel) -> PreTrainedModel:
    """Freeze again the parameters the model's class freezes when it builds one: transformers 5's ``from_pretrained``
    returns them trainable. Marian's and Pegasus's sinusoidal position tables were trained; Marian's, which
    ``save_pretrained`` leaves out, were then computed afresh at every load, so a run's final metrics scored other
    tables than ``evaluate``, ``predict`` and ``pipeline()`` load. Built on the meta device: no memory, no weights."""
    with torch.device("meta"):
        built = type(model)(model.config)
    fixed = {name for name, parameter in built.named_parameters() if not parameter.requires_grad}
    for name, parameter in model.named_parameters():
        if name in fixed:
            parameter.requires_grad_(False)
    return model


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
        return_no_layer_caches(config)
        if type(config) not in auto_class._model_mapping:
            # transformers' own message ("Unrecognized configuration class ...") came as a traceback, exit 1.
            raise ConfigError(
                f"model.model_type={model.model_type} has no model of the kind this task builds ({auto_class.__name__}, "
                f"with these options): choose a model type that has one (bert has every encoder head)"
            )
        return auto_class.from_config(config)

    unused = [key for key, value in (("model.architecture", model.architecture), ("model.model_type", model.model_type != "bert")) if value]
    if model_path is None and unused:
        # A from-scratch config reused with a checkpoint (continued pretraining, a student checkpoint) is a way of working;
        # config.yaml still records these keys, so say that the checkpoint's own architecture is the one trained.
        logger.warning("%s unused: model.name_or_path=%s brings its own architecture", " and ".join(unused), source)
    location = model_path or resolve_model(source)
    if model_path is None:
        warn_revision_of_a_local_copy(source, location, model.revision)
    if model_path is not None and (Path(model_path) / "export.json").is_file():
        # An ONNX export directory (bertpipe export): an onnxruntime session with the model's call
        # interface and config, so the task's predict/postprocess code serves it unchanged.
        if not is_export_dir(model_path):
            raise ModelError(f"{model_path} holds export.json but no model.onnx; export the run again")
        # On as many threads as torch runs here, which train.torch_num_threads sets (the run's, or an override):
        # the session took onnxruntime's own default, one per core, whatever the config said.
        return OnnxModel(model_path, num_threads=torch.get_num_threads())
    where = f"run directory {model_path}" if model_path is not None else f"model.name_or_path={source}"
    with failures_named(ModelError, f"{where}: cannot load the model from {location}"):
        return _load_pretrained(auto_class, model, location, source, model_path=model_path, label_maps=label_maps, extra=extra)


def _load_pretrained(auto_class, model: ModelConfig, location: str, source: str, *, model_path, label_maps, extra) -> PreTrainedModel:
    if is_adapter_dir(location):
        if model_path is not None:
            return load_adapter_model(auto_class, location)  # evaluating an adapter run keeps the PeftModel
        merged = merged_adapter_run(auto_class, location)
        if not head_kinds(merged.config):  # MLM, translation: no task head to carry over
            # peft froze the base weights; they stay frozen through the merge, and a full fine-tune (or a
            # new adapter, which freezes what it needs) starts from a model whose weights all train.
            return keep_fixed_what_the_family_keeps_fixed(merged.requires_grad_(True))
        # Training from an adapter run starts from its merged weights, whose head is carried over as a
        # full checkpoint's is: rows matched to our labels, or a new head of our kind and size.
        config, weights = merged.config, {"pretrained_model_name_or_path": None, "state_dict": merged.state_dict()}
    else:
        config = AutoConfig.from_pretrained(location, revision=model.revision)
        weights = {"pretrained_model_name_or_path": location, "revision": model.revision}
    checkpoint_labels = label_list(config.id2label)
    kinds = head_kinds(config)
    label_maps, other_head, mismatched_head = plan_head(kinds, checkpoint_labels, auto_class, label_maps)
    for key, value in {**label_maps, **extra}.items():
        setattr(config, key, value)
    apply_dropout(config, model.dropout)
    return_no_layer_caches(config)
    if other_head is not None:
        logger.warning(
            "%s has a %s head, whose weights score something else; a new %s head is initialised",
            source, other_head, head_kind(auto_class.__name__),
        )
    elif mismatched_head:
        logger.warning(
            "%s has a head trained for labels %s; a new head is initialised for labels %s",
            source, checkpoint_labels, list(label_maps["id2label"].values()),
        )
    # An Auto class loads only from a location; the model class it maps the config to also loads a state dict.
    model_class = auto_class._model_mapping[type(config)] if weights["pretrained_model_name_or_path"] is None else auto_class
    loaded, loading_info = model_class.from_pretrained(
        config=config, ignore_mismatched_sizes=mismatched_head or other_head is not None, output_loading_info=True,
        dtype=WEIGHTS_DTYPE, **weights,
    )
    keep_fixed_what_the_family_keeps_fixed(loaded)
    initialized = []
    if other_head is not None:
        initialized = reinitialize_head(loaded)
    elif "id2label" in label_maps and scores_labels(kinds) and not mismatched_head:
        initialized = match_head_to_labels(loaded, checkpoint_labels, source)
    # Weights the checkpoint lacked (a new head, or e.g. a pooler an MLM checkpoint never had) are
    # random: peft must train and save them, or an adapter would not reload to the same model.
    initialized += [*loading_info.get("missing_keys", ()), *loading_info.get("mismatched_keys", ())]
    loaded.bertpipe_initialized_keys = sorted({key[0] if isinstance(key, tuple) else key for key in initialized})
    return loaded


# Models whose position ids start after the padding index (fairseq's convention): two of their
# max_position_embeddings are never usable by tokens.
# (The text encoders whose embeddings build positions with transformers' create_position_ids_from_input_ids; MPNet
# and the others left out of this list indexed past the table in an IndexError traceback at such a length.)
_POSITION_OFFSET_TYPES = {
    "roberta", "xlm-roberta", "camembert", "longformer", "xlm-roberta-xl", "data2vec-text", "mpnet", "roberta-prelayernorm",
    "ibert", "xmod", "luke", "lilt", "markuplm",
}


def usable_positions(config: PretrainedConfig | None) -> int | None:
    positions = getattr(config, "max_position_embeddings", None)
    if config is None or not isinstance(positions, int) or positions <= 0:
        return None  # no learned table (T5's relative positions): no limit
    offset = (getattr(config, "pad_token_id", None) or 0) + 1 if config.model_type in _POSITION_OFFSET_TYPES else 0
    return positions - offset


def check_vocabulary(model, tokenizer, model_config: ModelConfig) -> None:
    """The model's embedding has a row for every id the tokenizer gives, and a model built here pads as the tokenizer
    does: a short table ended the first batch in an IndexError traceback, and a from-scratch model padding with
    another id (BERT's 0, a RoBERTa tokenizer's <s>) kept that token's embedding at zero, untrained, without a word."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    from_scratch = model_config.name_or_path is None
    if rows is not None and tokenizer is not None and len(tokenizer) > rows:
        key = "model.architecture.vocab_size" if from_scratch else "model.tokenizer_name_or_path"
        raise ConfigError(f"{key}: the tokenizer gives {len(tokenizer)} token ids, the model's embedding has {rows} rows; "
                          f"{'give it vocab_size: ' + str(len(tokenizer)) if from_scratch else 'use the tokenizer the model was trained with'}")
    pad = getattr(model.config, "pad_token_id", None)
    wanted = getattr(tokenizer, "pad_token_id", None)
    if from_scratch and pad is not None and wanted is not None and pad != wanted:
        raise ConfigError(f"model.architecture.pad_token_id: a model built here pads with id {pad}, the tokenizer with id "
                          f"{wanted}; give it pad_token_id: {wanted}")


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


def freeze_input_embeddings(model: torch.nn.Module) -> int:
    """Stops the gradient of ``model``'s input word-embedding matrices (an encoder-decoder's encoder's and
    decoder's) and so of every weight tied to them (``model.freeze_input_embeddings``); returns how many
    parameters that keeps as loaded."""
    parts = [model]
    for getter in ("get_encoder", "get_decoder"):
        try:
            parts.append(getattr(model, getter)())
        except (AttributeError, NotImplementedError, TypeError):
            continue  # an encoder-only family has neither
    matrices = {}
    for part in parts:
        try:
            embeddings = part.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            continue
        weight = getattr(embeddings, "weight", None)
        if isinstance(weight, torch.nn.Parameter):
            matrices[id(weight)] = weight
    if not matrices:
        raise ConfigError(f"model.freeze_input_embeddings: the {type(model).__name__} model names no input embeddings "
                          "(get_input_embeddings) to freeze")
    for weight in matrices.values():
        weight.requires_grad_(False)
    return sum(weight.numel() for weight in matrices.values())


def parameter_shapes_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's name and shape: two processes that built different models (another label set,
    another checkpoint) differ in it."""
    return hashlib.sha256(repr([(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()]).encode()).hexdigest()


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
