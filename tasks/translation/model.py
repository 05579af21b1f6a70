"""Checkpoint helpers for the two model routes: seq2seq checkpoints and BERT2BERT warm starts.

In:  transformers configs and models (an ``EncoderDecoderModel`` for the BERT2BERT helpers), language codes.
Out: T5's pretraining prefix for a language pair, whether a config is seq2seq, whether a checkpoint can be a
     decoder (``ModelError`` if not), encoder weights shared with the decoder (saved untied), the unused
     encoder pooler removed, and dropout set on a config.
"""

from __future__ import annotations

import logging

import torch
from transformers import EncoderDecoderModel, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING

from pipelines.errors import ModelError

logger = logging.getLogger(__name__)

# T5 was pretrained with these task prefixes; fine-tuning without one throws that knowledge away.
_T5_LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


def t5_prefix(source_lang: str, target_lang: str) -> str:
    """T5's pretraining prefix for a language pair it knows, else "" with a warning (set source_prefix)."""
    names = [_T5_LANGUAGE_NAMES.get(code) for code in (source_lang, target_lang)]
    if all(names):
        return f"translate {names[0]} to {names[1]}: "
    logger.warning("T5 without translation.source_prefix and no pretraining prefix for %s->%s: sources get none", source_lang, target_lang)
    return ""


def is_seq2seq_config(config: PretrainedConfig) -> bool:
    return bool(getattr(config, "is_encoder_decoder", False)) or type(config) in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING


def check_decoder_config(config: PretrainedConfig, name: str) -> None:
    """A decoder needs a causal-LM class in transformers that accepts cross-attention inputs."""
    import inspect

    causal = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else None
    if causal is None or "encoder_hidden_states" not in inspect.signature(causal.forward).parameters:
        raise ModelError(
            f"{name!r} ({config.model_type}) cannot serve as a decoder: transformers has no causal-LM "
            f"{config.model_type} with cross-attention. Choose a BERT/RoBERTa/ELECTRA-style checkpoint for "
            "translation.decoder_name_or_path"
        )


def tie_encoder_decoder_weights(model: EncoderDecoderModel) -> int:
    """Share each encoder parameter with the decoder parameter of the same name and shape (Rothe et al.'s
    shared BERT2BERT). The decoder's cross-attention and LM head have no encoder twin and stay its own.

    The decoder's Parameter objects are replaced by the encoder's (modules stay separate, so the decoder
    keeps its causal self-attention). A state-dict hook clones the shared tensors on save, so the saved
    checkpoint loads correctly in any ``from_pretrained`` (bertpipe re-ties on load). Returns the count.
    """
    decoder_base = getattr(model.decoder, model.decoder.base_model_prefix, model.decoder)
    decoder_params = dict(decoder_base.named_parameters())
    shared = 0
    for name, parameter in model.encoder.named_parameters():
        target = decoder_params.get(name)
        if target is None or target.shape != parameter.shape:
            continue
        module_name, _, leaf = name.rpartition(".")
        setattr(decoder_base.get_submodule(module_name) if module_name else decoder_base, leaf, parameter)
        shared += 1
    if shared == 0:
        raise ModelError("translation.tie_encoder_decoder: the encoder and decoder have no parameters in common")
    if not getattr(model, "_bertpipe_untie_hook", False):
        model.register_state_dict_post_hook(_clone_shared_tensors)
        model._bertpipe_untie_hook = True
    return shared


# A run saves no encoder pooler (drop_encoder_pooler), while EncoderDecoderModel builds one on load: every predict,
# evaluate and pipeline() of a BERT2BERT run reported encoder.pooler.dense as MISSING, "newly initialized", for a
# module no encoder-decoder forward reads.
EncoderDecoderModel._keys_to_ignore_on_load_missing = {*(EncoderDecoderModel._keys_to_ignore_on_load_missing or ()), r"^encoder\.pooler\."}


def drop_encoder_pooler(model: EncoderDecoderModel) -> bool:
    """Remove the encoder's pooler ([CLS] -> dense -> tanh): an encoder-decoder never uses it, and under
    DistributedDataParallel a parameter that gets no gradient is an error. Returns whether one was removed."""
    if getattr(model.encoder, "pooler", None) is None:
        return False
    model.encoder.pooler = None
    return True


def _clone_shared_tensors(module, state_dict, prefix, local_metadata) -> None:
    seen: set[int] = set()
    for key, tensor in list(state_dict.items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        pointer = tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else id(tensor)
        if pointer in seen:
            state_dict[key] = tensor.clone()
        else:
            seen.add(pointer)

