"""``pipeline("translation")`` for bertpipe's runs (transformers 5 removed its own).

In:  a run directory (or any seq2seq model) given to ``transformers.pipeline("translation", model=...)``.
Out: ``[{"translation_text": ...}]`` per source, generated with the run's saved ``generation_config`` and
     ``config.prefix``, sources truncated to the run's ``config.max_source_length`` (its ``data.max_seq_length``).
     Importing this module registers the pipeline (the package's ``__init__`` does so).
"""

from __future__ import annotations

from transformers import AutoModelForSeq2SeqLM, Pipeline

from tasks.translation.generation import cleans_up_spaces


class TranslationPipeline(Pipeline):
    """``pipeline("translation", model=RUN_DIR)``: source text -> ``[{"translation_text": ...}]``.

    Generation uses the run's saved ``generation_config`` (beam size, length bound and penalty), and the
    source prefix saved as ``config.prefix``; keyword arguments to the call override generation settings.
    """

    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, truncation=None, max_source_length=None, clean_up_tokenization_spaces=None, **generate_kwargs):
        preprocess = {}
        if truncation is not None:
            preprocess["truncation"] = truncation
        if max_source_length is not None:
            preprocess["max_source_length"] = max_source_length
        postprocess = {}
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, (list, tuple)):
            return [item[0] if isinstance(item, list) and len(item) == 1 else item for item in result]
        return result

    def preprocess(self, text: str, truncation: bool = True, max_source_length: int | None = None):
        if max_source_length is None:
            max_source_length = getattr(self.model.config, "max_source_length", None)
        return self.tokenizer(
            (self.prefix or "") + text, return_tensors="pt", truncation=truncation,
            max_length=max_source_length, return_token_type_ids=False,
        )

    def _forward(self, model_inputs, **generate_kwargs):
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        output_ids = self.model.generate(
            input_ids=model_inputs["input_ids"], attention_mask=model_inputs["attention_mask"], **generate_kwargs
        )
        return {"output_ids": output_ids}

    def postprocess(self, model_outputs, clean_up_tokenization_spaces: bool | None = None):
        if clean_up_tokenization_spaces is None:  # as bertpipe predict decodes
            clean_up_tokenization_spaces = cleans_up_spaces(self.tokenizer)
        texts = self.tokenizer.batch_decode(
            model_outputs["output_ids"], skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
        )
        return [{"translation_text": text.strip()} for text in texts]


def register_translation_pipeline() -> None:
    """Make ``pipeline("translation")`` resolve to :class:`TranslationPipeline`.

    transformers 5 lists ``translation`` in ``REMOVED_TASKS``, which ``pipeline()`` checks before the
    registry (``_resolve_deprecated_task``), so a registered task of that name would still be refused:
    the entry is dropped once our implementation is registered.
    """
    from transformers import pipelines as hf_pipelines

    hf_pipelines.PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    hf_pipelines.REMOVED_TASKS.pop("translation", None)


register_translation_pipeline()
