"""The project's own Transformer and BERT, written from the equations.

``import models`` registers the model types with transformers' Auto classes, after which

    AutoConfig.for_model("bertpipe_bert", hidden_size=..., num_labels=...)
    AutoModelForSequenceClassification.from_config(config)     # or from_pretrained(run_dir)

work as for any built-in architecture. Registered types:

    bertpipe_bert         AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, AutoModelForQuestionAnswering
    bertpipe_transformer  AutoModel, AutoModelForSeq2SeqLM

Reading order: configuration -> embeddings -> attention -> layers -> bert -> transformer; then
convert (transformers BERT checkpoints <-> ours) and visualize (attention heatmaps).
Registration is idempotent (``exist_ok=True``); the heavier convert/visualize modules are not imported here.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .bert import (
    BertpipeForMaskedLM,
    BertpipeForQuestionAnswering,
    BertpipeForSequenceClassification,
    BertpipeForTokenClassification,
    BertpipeModel,
    BertpipePreTrainedModel,
)
from .configuration import BertpipeBertConfig, BertpipeTransformerConfig
from .transformer import BertpipeTransformerForConditionalGeneration, BertpipeTransformerModel

BERT_MODEL_TYPE = BertpipeBertConfig.model_type
TRANSFORMER_MODEL_TYPE = BertpipeTransformerConfig.model_type


def register() -> None:
    """Register both model types with the Auto classes; safe to call any number of times."""
    AutoConfig.register(BERT_MODEL_TYPE, BertpipeBertConfig, exist_ok=True)
    AutoConfig.register(TRANSFORMER_MODEL_TYPE, BertpipeTransformerConfig, exist_ok=True)
    for auto_class, model_class in (
        (AutoModel, BertpipeModel),
        (AutoModelForMaskedLM, BertpipeForMaskedLM),
        (AutoModelForSequenceClassification, BertpipeForSequenceClassification),
        (AutoModelForTokenClassification, BertpipeForTokenClassification),
        (AutoModelForQuestionAnswering, BertpipeForQuestionAnswering),
    ):
        auto_class.register(BertpipeBertConfig, model_class, exist_ok=True)
    AutoModel.register(BertpipeTransformerConfig, BertpipeTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(
        BertpipeTransformerConfig, BertpipeTransformerForConditionalGeneration, exist_ok=True
    )


register()

__all__ = [
    "BERT_MODEL_TYPE",
    "TRANSFORMER_MODEL_TYPE",
    "BertpipeBertConfig",
    "BertpipeForMaskedLM",
    "BertpipeForQuestionAnswering",
    "BertpipeForSequenceClassification",
    "BertpipeForTokenClassification",
    "BertpipeModel",
    "BertpipePreTrainedModel",
    "BertpipeTransformerConfig",
    "BertpipeTransformerForConditionalGeneration",
    "BertpipeTransformerModel",
    "register",
]
