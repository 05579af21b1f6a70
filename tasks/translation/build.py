"""Which model a translation run trains, and building it: a seq2seq checkpoint or a BERT2BERT warm start.

In:  the run config (``model.*`` and ``translation.*``) on a task object, and for a finished run its directory.
Out: the decision (once, before tokenising) whether the run warm-starts an ``EncoderDecoderModel``, the source
     prefix (T5's when unset), the tokenizer (mBART language codes set), and the model with decoder start /
     pad / end tokens, the target language code forced first where labels open with it (NLLB, M2M100, mBART-50) and the
     beam-search settings on its config and ``generation_config``.

``TranslationModelBuilding`` is a mixin of :class:`tasks.translation.task.TranslationTask`: it reads and sets
the attributes that class's ``__init__`` creates (``config``, ``options``, ``tokenizer``, ``model``,
``warm_start``, ``checkpoint_decoder_start``, ``source_prefix``, ``lowercase``, ``output_pad_values``).
"""

from __future__ import annotations

import logging
import warnings

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, EncoderDecoderModel, PreTrainedModel

from pipelines.config import ConfigError
from pipelines.errors import ModelError
from pipelines.hub import resolve_model
from pipelines.modeling import WEIGHTS_DTYPE, apply_dropout, keep_fixed_what_the_family_keeps_fixed, load_model, load_tokenizer, usable_positions
from pipelines.outputs import is_run_dir
from tasks.translation.generation import tokenizer_lowercases
from tasks.translation.model import (
    check_decoder_config,
    drop_encoder_pooler,
    is_seq2seq_config,
    t5_prefix,
    tie_encoder_decoder_weights,
)
from tasks.translation.options import GENERATED_KEY

# EncoderDecoderModel warns on every loss computation about checkpoints trained before transformers 4.12;
# bertpipe always lets the model compute the loss, so the warning says nothing about this run.
warnings.filterwarnings("ignore", message="Version v4.12.0 introduces a better way", category=FutureWarning)

logger = logging.getLogger(__name__)


def language_codes(tokenizer) -> list[str]:
    """The language codes ``src_lang``/``tgt_lang`` may name: a tokenizer's ``lang_code_to_id`` table (mBART, M2M100,
    whose codes name a language: ``de`` for the token ``__de__``), else its special tokens beyond the usual ones
    (NLLB's ``deu_Latn``); none for a tokenizer without language tokens (BERT, T5, Marian)."""
    table = getattr(tokenizer, "lang_code_to_id", None)
    if table:
        return list(table)
    usual = {getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")}
    return [token for token in tokenizer.all_special_tokens if token not in usual]


class TranslationModelBuilding:
    """The model-building half of ``TranslationTask`` (``_plan``, ``build_tokenizer``, ``build_model``)."""

    # ----- which model: a seq2seq checkpoint or BERT2BERT ---------------------------------
    def _sources(self) -> tuple[str, str]:
        """(encoder, decoder) checkpoints for a warm start."""
        encoder = self.options.encoder_name_or_path or self.config.model.name_or_path
        if encoder is None:
            raise ConfigError("translation needs a checkpoint: set model.name_or_path or translation.encoder_name_or_path")
        return encoder, self.options.decoder_name_or_path or encoder

    def _plan(self, model_path: str | None) -> None:
        """Decide (once, before tokenising) whether this run warm-starts an EncoderDecoderModel."""
        if self.warm_start is not None:
            return
        if model_path is not None:
            saved = AutoConfig.from_pretrained(model_path)
            self.warm_start = saved.model_type == "encoder-decoder"
            self.checkpoint_decoder_start = getattr(saved, "decoder_start_token_id", None)
            # The prefix the run was trained with travels in its config (also read by pipeline()); an
            # explicit source_prefix (even "") overrides it.
            given = self.options.source_prefix
            self.source_prefix = given if given is not None else getattr(saved, "prefix", None) or ""
        elif self.options.encoder_name_or_path or self.options.decoder_name_or_path:
            self.warm_start = True
        elif self.config.model.name_or_path is None:
            raise ConfigError("translation needs a checkpoint: set model.name_or_path (a seq2seq model or an encoder to warm-start)")
        else:
            config = AutoConfig.from_pretrained(resolve_model(self.config.model.name_or_path), revision=self.config.model.revision)
            self.warm_start = not is_seq2seq_config(config)
            self.checkpoint_decoder_start = getattr(config, "decoder_start_token_id", None)
            # Only when unset: an explicit source_prefix "" means no prefix.
            if self.options.source_prefix is None and is_run_dir(self.config.model.name_or_path):
                # Continuing a bertpipe run: it learned its sources with its own prefix (config.prefix, as for
                # evaluate and predict), not the family's default (T5's) nor none (BART's). A base checkpoint's own
                # prefix (BART-CNN's " ") is not taken: this run's prefix is the one it trains with.
                self.source_prefix = getattr(config, "prefix", None) or ""
            elif config.model_type == "t5" and self.options.source_prefix is None:
                self.source_prefix = t5_prefix(self.options.source_lang, self.options.target_lang)
        if self.warm_start and model_path is None and self.config.model.peft is not None:
            # The warm start's cross-attention and LM head are new random weights, so no checkpoint
            # exists that an adapter could name as its base and be reloaded onto.
            raise ConfigError(
                "model.peft on a BERT2BERT warm start is not supported: the encoder-decoder it builds exists in no "
                "checkpoint for the adapter to name as its base. Fine-tune it fully once (or for a few steps) and use "
                "that run directory as model.name_or_path for LoRA."
            )
        if not self.warm_start and self.options.tie_encoder_decoder and model_path is None:
            raise ConfigError("translation.tie_encoder_decoder applies to BERT2BERT warm starts, not to a seq2seq checkpoint")

    # ----- tokenizer and model ------------------------------------------------------------
    def build_tokenizer(self, raw, model_path: str | None = None):
        self._plan(model_path)
        model = self.config.model
        source = model_path or model.tokenizer_name_or_path or (self._sources()[0] if self.warm_start else model.name_or_path)
        # No fast-tokenizer requirement here: translation needs no offsets, and Marian's is sentencepiece only.
        tokenizer = load_tokenizer(source, None if model_path else model.revision, require_fast=False)
        self._set_language_codes(tokenizer, source)
        if tokenizer.pad_token_id is None:
            raise ModelError(f"tokenizer of {source!r} has no pad token; translation batches need one")
        if self.warm_start and (tokenizer.cls_token_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id) is None:
            raise ModelError(f"tokenizer of {source!r} has neither [CLS] nor a BOS token to start the decoder with")
        specials = len(tokenizer(text_target="")["input_ids"])
        if self.options.max_target_length <= specials:
            # The tokenizer does not truncate below the special tokens it adds: every target stayed whole, while
            # the warning of cut targets counted them as cut (at the limit itself, targets held specials alone).
            raise ConfigError(
                f"translation.max_target_length={self.options.max_target_length} leaves no room for a target word: the "
                f"tokenizer of {source!r} adds {specials} special token(s) to every target; set it above {specials}"
            )
        self.tokenizer = tokenizer
        self.output_pad_values[GENERATED_KEY] = tokenizer.pad_token_id
        self.lowercase = self.options.lowercase_metrics if self.options.lowercase_metrics is not None else tokenizer_lowercases(tokenizer)
        return tokenizer

    def _set_language_codes(self, tokenizer, source: str) -> None:
        """mBART-style ``src_lang``/``tgt_lang`` on the tokenizer, each checked against the tokenizer's language codes: a
        mistyped one (``en_xx`` for ``en_XX``) became its unknown token in every source, label and decoder start, and
        one that is an ordinary piece of its vocabulary (``de`` for ``de_DE``) was taught and generated as a word."""
        codes = language_codes(tokenizer)
        for key in ("src_lang", "tgt_lang"):
            code = getattr(self.options, key)
            if not code:
                continue
            if code not in codes:
                known = f"it has {len(codes)}, e.g. {', '.join(codes[:4])}" if codes else "it has none"
                raise ConfigError(
                    f"translation.{key}={code!r} is not a language code of the tokenizer of {source!r} ({known}; codes are "
                    "case-sensitive)"
                )
            setattr(tokenizer, key, code)

    def _special_ids(self) -> dict[str, int]:
        """BERT2BERT: [CLS] starts the decoder, [SEP] ends it (BOS/EOS for tokenizers without them)."""
        tok = self.tokenizer
        start = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        end = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        return {"decoder_start_token_id": start, "eos_token_id": end, "pad_token_id": tok.pad_token_id}

    def build_model(self, raw, model_path: str | None = None):
        self._plan(model_path)
        if model_path is not None:
            # Through load_model so that a LoRA run (adapter + base id) loads as well as a full model.
            model = load_model(AutoModelForSeq2SeqLM, self.config.model, model_path=model_path)
            if getattr(model.config, "tie_encoder_decoder", False):
                tie_encoder_decoder_weights(model)
        elif self.warm_start:
            model = self._warm_start()
        else:
            model = self._load_seq2seq()
        if isinstance(model, EncoderDecoderModel):
            drop_encoder_pooler(model)
        self._configure_generation(model)
        self.model = model
        return model

    def _load_seq2seq(self) -> PreTrainedModel:
        model_cfg = self.config.model
        location = resolve_model(model_cfg.name_or_path)
        config = AutoConfig.from_pretrained(location, revision=model_cfg.revision)
        apply_dropout(config, model_cfg.dropout)
        model = keep_fixed_what_the_family_keeps_fixed(
            AutoModelForSeq2SeqLM.from_pretrained(location, config=config, revision=model_cfg.revision, dtype=WEIGHTS_DTYPE)
        )
        if model.config.decoder_start_token_id is None and self.options.tgt_lang:
            model.config.decoder_start_token_id = self._language_code_id(self.options.tgt_lang)
        return model

    def _warm_start(self) -> EncoderDecoderModel:
        encoder, decoder = self._sources()
        revision = self.config.model.revision
        encoder_config = AutoConfig.from_pretrained(resolve_model(encoder), revision=revision)
        decoder_config = AutoConfig.from_pretrained(resolve_model(decoder), revision=revision)
        for name, config in (("encoder", encoder_config), ("decoder", decoder_config)):
            if is_seq2seq_config(config):
                raise ModelError(f"{name} checkpoint {encoder if name == 'encoder' else decoder!r} is already a seq2seq model; "
                                 "set model.name_or_path to it instead of translation.encoder/decoder_name_or_path")
        check_decoder_config(decoder_config, decoder)
        if decoder_config.vocab_size < len(self.tokenizer):
            raise ModelError(
                f"decoder {decoder!r} has a vocabulary of {decoder_config.vocab_size} but the tokenizer has "
                f"{len(self.tokenizer)} tokens; BERT2BERT here uses one tokenizer for both sides"
            )
        decoder_config.is_decoder = True
        decoder_config.add_cross_attention = True
        apply_dropout(encoder_config, self.config.model.dropout)
        apply_dropout(decoder_config, self.config.model.dropout)
        try:
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(
                resolve_model(encoder), resolve_model(decoder),
                encoder_config=encoder_config, decoder_config=decoder_config,
                encoder_revision=revision, decoder_revision=revision, encoder_dtype=WEIGHTS_DTYPE, decoder_dtype=WEIGHTS_DTYPE,
            )
        except ValueError as error:  # e.g. a decoder class without cross-attention
            raise ModelError(f"cannot build an encoder-decoder from {encoder!r} and {decoder!r}: {error}") from None
        keep_fixed_what_the_family_keeps_fixed(model)
        for key, value in self._special_ids().items():
            setattr(model.config, key, value)
        model.config.vocab_size = model.config.decoder.vocab_size
        if self.options.tie_encoder_decoder:
            model.config.tie_encoder_decoder = True
            tie_encoder_decoder_weights(model)
        model.train()  # from_encoder_decoder_pretrained returns it in eval mode
        return model

    def _configure_generation(self, model: PreTrainedModel) -> None:
        """Beam-search settings and special tokens on ``generation_config`` (saved next to the weights)."""
        self._align_decoder_start(model)
        gen = model.generation_config
        for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(model.config, key, None)
            if value is not None and getattr(gen, key, None) is None:
                setattr(gen, key, value)
        if self.options.forced_bos_token:
            token_id = self.tokenizer.convert_tokens_to_ids(self.options.forced_bos_token)
            if token_id is None or token_id == self.tokenizer.unk_token_id:
                raise ConfigError(f"translation.forced_bos_token={self.options.forced_bos_token!r} is not in the tokenizer's vocabulary")
            gen.forced_bos_token_id = token_id
        elif (code := self._target_code_opening_labels(gen.decoder_start_token_id)) is not None:
            gen.forced_bos_token_id = code
        self._check_generation_length(model)
        gen.num_beams = self.options.num_beams
        gen.max_new_tokens = self.options.max_new_tokens
        gen.max_length = None  # a checkpoint's max_length (or the 20-token default) must not cap max_new_tokens
        gen.length_penalty = self.options.length_penalty
        gen.no_repeat_ngram_size = self.options.no_repeat_ngram_size or None
        gen.early_stopping = self.options.early_stopping if self.options.num_beams > 1 else False
        gen.do_sample = False
        # What pipeline("translation"), evaluate and predict prepend: the prefix this run trains with, and
        # no other (a base checkpoint's own, e.g. BART-CNN's " ", would otherwise be saved with the run).
        model.config.prefix = self.source_prefix or None
        # pipeline("translation") truncates sources where training and predict do, not at the tokenizer's
        # model_max_length (often far longer than data.max_seq_length).
        model.config.max_source_length = self.config.data.max_seq_length

    def _align_decoder_start(self, model: PreTrainedModel) -> None:
        """Generation starts the decoder with the token training starts it with.

        Training's decoder inputs are ``prepare_decoder_input_ids_from_labels`` of the labels (the collator's call):
        most families shift in ``decoder_start_token_id``, but mBART's ``shift_tokens_right`` wraps each target's last
        token round to the front (the ``tgt_lang`` code of mBART-cc25's targets, ``</s>`` of mBART-50's), whatever
        ``decoder_start_token_id`` the checkpoint names. A checkpoint fine-tuned into another language (mbart-large-en-ro
        names ``ro_RO``) trained into ``en_XX`` generated every hypothesis from ``ro_RO``, a start it never trained on.
        """
        prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
        labels = self.tokenizer(text_target="a")["input_ids"]
        if prepare is None or not labels:
            return
        start = int(prepare(labels=torch.tensor([labels]))[0, 0])
        named = model.config.decoder_start_token_id
        if named is not None and start != named:
            logger.warning(
                "the model names %r as its decoder start, but the %s model's targets (translation.tgt_lang=%s), shifted right "
                "as training feeds them, start the decoder with %r: generation starts with %r too",
                self.tokenizer.convert_ids_to_tokens(named), model.config.model_type, self.options.tgt_lang,
                self.tokenizer.convert_ids_to_tokens(start), self.tokenizer.convert_ids_to_tokens(start),
            )
        model.config.decoder_start_token_id = start
        model.generation_config.decoder_start_token_id = start

    def _target_code_opening_labels(self, decoder_start: int | None) -> int | None:
        """The ``tgt_lang`` code when the tokenizer opens every target with it but the decoder starts with
        another token (NLLB, M2M100, mBART-50: ``</s>``). Training teaches the code as the first word; generation left
        free picks a language itself (a multilingual checkpoint may translate into another), so the code is
        forced there, as these tokenizers' own translation inputs do."""
        if self.warm_start or not self.options.tgt_lang:
            return None
        labels = self.tokenizer(text_target="")["input_ids"]
        code = self._language_code_id(self.options.tgt_lang)
        return code if labels and labels[0] == code and code != decoder_start else None

    def _language_code_id(self, code: str) -> int | None:
        """The id of a ``src_lang``/``tgt_lang`` code. M2M100 names its codes by language (``en`` for the token
        ``__en__``), so the code itself as a token is another piece or the unknown token; tokenizers with a
        ``lang_code_to_id`` table (M2M100, mBART) say which token a code stands for."""
        table = getattr(self.tokenizer, "lang_code_to_id", None) or {}
        return table[code] if code in table else self.tokenizer.convert_tokens_to_ids(code)

    def _check_generation_length(self, model: PreTrainedModel) -> None:
        """A hypothesis that never ends feeds the decoder ``max_new_tokens`` positions (its start token and
        all but the last generated one); past a learned position table generate() fails with a shape error,
        and only when some translation runs that long: mid-evaluation, after the training it was to score."""
        config = model.config
        decoder = config.decoder if config.model_type == "encoder-decoder" else config
        usable = usable_positions(decoder)
        if usable is not None and self.options.max_new_tokens > usable:
            raise ConfigError(
                f"translation.max_new_tokens={self.options.max_new_tokens} exceeds the {usable} positions of the decoder "
                f"(max_position_embeddings in the config of {getattr(config, '_name_or_path', '') or 'the model'}): a translation "
                f"that long would fail mid-generation; set translation.max_new_tokens to at most {usable}"
            )
