"""Task heads loaded by ``pipelines.modeling.load_model`` from a checkpoint that already has one (a finished
run, a fine-tuned Hub model, an adapter run): each label keeps its own output row, whatever order the new
run lists the labels in, and a head trained for other labels is not reused under new names.

Checkpoints are tiny random models of each encoder family (and bertpipe's own BERT), saved here with a head;
no tokenizer is needed.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from pipelines.adapters import apply_peft, merge_adapter, save_adapter_run
from pipelines.config import ModelConfig, PeftConfig
from pipelines.modeling import load_model
from tests.families.builders import ENCODER_FAMILIES, _model_config

VOCAB = 60
FAMILIES = [*ENCODER_FAMILIES, "bertpipe"]
HEADS = {
    "sequence": (AutoModelForSequenceClassification, ["negative", "neutral", "positive"], ["positive", "negative", "neutral"]),
    "token": (AutoModelForTokenClassification, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]),
}


class _Vocabulary:
    """What the family builders read from a tokenizer to size a model."""

    pad_token_id, cls_token_id, sep_token_id = 1, 2, 3

    def __len__(self) -> int:
        return VOCAB


def label_maps(names: list[str]) -> dict:
    return {"num_labels": len(names), "id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def save_checkpoint(directory, family: str, auto_class, names: list[str] | None):
    if family == "bertpipe":
        from models import BertpipeBertConfig

        config = BertpipeBertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                    max_position_embeddings=32, pad_token_id=_Vocabulary.pad_token_id)
    else:
        config = _model_config(family, _Vocabulary())
    if names is not None:
        config.update(label_maps(names))
    torch.manual_seed(0)
    model = auto_class.from_config(config)
    with torch.no_grad():  # a trained head's bias is not zero: it must move with its row
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(std=0.5)
    model.save_pretrained(directory)
    return model.eval()


def logits_of(model) -> torch.Tensor:
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits


def loading_warnings(caplog) -> list[str]:
    """What loading said at WARNING level (the loader's and the head planning's own)."""
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and record.name in ("pipelines.modeling", "pipelines.heads")]

@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("family", FAMILIES)
def test_modeling_head_from_a_checkpoint_with_the_labels_in_another_order_scores_each_label_with_its_own_row(family, head, tmp_path):
    auto_class, checkpoint_labels, run_labels = HEADS[head]
    checkpoint = save_checkpoint(tmp_path / "checkpoint", family, auto_class, checkpoint_labels)
    loaded = load_model(auto_class, ModelConfig(name_or_path=str(tmp_path / "checkpoint")), label_maps=label_maps(run_labels))
    assert loaded.config.id2label == dict(enumerate(run_labels))
    by_run_order = [checkpoint_labels.index(name) for name in run_labels]
    torch.testing.assert_close(logits_of(loaded), logits_of(checkpoint)[..., by_run_order], rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["bert", "roberta"])  # a one-layer head, and a dense layer before the output layer
def test_modeling_head_from_a_checkpoint_with_other_label_names_is_new_and_says_so(family, tmp_path, caplog):
    checkpoint = save_checkpoint(tmp_path / "checkpoint", family, AutoModelForSequenceClassification, ["negative", "positive"])
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        loaded = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "checkpoint")),
                            label_maps=label_maps(["no", "yes"]))
    output = "classifier" if family == "bert" else "classifier.out_proj"
    new, old = loaded.get_submodule(output), checkpoint.get_submodule(output)
    assert not torch.equal(new.weight, old.weight) and not new.bias.any()
    assert 0 < float(new.weight.detach().std()) < 0.1  # the family's initialiser, not the checkpoint's rows
    assert {f"{output}.weight", f"{output}.bias"} <= set(loaded.bertpipe_initialized_keys)
    if family == "roberta":  # as transformers does for a head of another size: only the output layer is new
        torch.testing.assert_close(loaded.classifier.dense.weight, checkpoint.classifier.dense.weight)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "['negative', 'positive']" in warnings[0] and "['no', 'yes']" in warnings[0], warnings


def test_modeling_from_scratch_keys_beside_a_checkpoint_are_unused_and_said_so(tmp_path, caplog):
    # A from-scratch config reused with a checkpoint trains the checkpoint's architecture; config.yaml still records these.
    save_checkpoint(tmp_path / "checkpoint", "bert", AutoModelForSequenceClassification, ["no", "yes"])
    model = ModelConfig(name_or_path=str(tmp_path / "checkpoint"), model_type="roberta", architecture={"num_hidden_layers": 1})
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        loaded = load_model(AutoModelForSequenceClassification, model, label_maps=label_maps(["no", "yes"]))
    assert loaded.config.model_type == "bert" and loaded.config.num_hidden_layers == 2
    assert [record.getMessage() for record in caplog.records] == [
        f"model.architecture and model.model_type unused: model.name_or_path={tmp_path / 'checkpoint'} brings its own architecture"]


def test_modeling_head_whose_labels_are_placeholders_keeps_its_rows(tmp_path):
    """LABEL_0, LABEL_1 (a Hub model fine-tuned without label names) say nothing about the rows: kept in order."""
    checkpoint = save_checkpoint(tmp_path / "checkpoint", "bert", AutoModelForSequenceClassification, None)
    assert checkpoint.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    loaded = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "checkpoint")),
                        label_maps=label_maps(["negative", "positive"]))
    torch.testing.assert_close(logits_of(loaded), logits_of(checkpoint), rtol=0, atol=0)


def test_modeling_head_from_an_adapter_run_with_the_labels_in_another_order_scores_each_label_with_its_own_row(tmp_path):
    checkpoint_labels, run_labels = HEADS["sequence"][1:]
    save_checkpoint(tmp_path / "base", "bert", AutoModelForMaskedLM, None)
    peft = PeftConfig(r=4, alpha=8, dropout=0.0)
    model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "base"), peft=peft),
                       label_maps=label_maps(checkpoint_labels))
    adapted = apply_peft(model, peft, "SEQ_CLS", base_model_name_or_path=str(tmp_path / "base"))
    torch.manual_seed(2)
    with torch.no_grad():  # a trained adapter and head (LoRA B starts at zero)
        for parameter in adapted.parameters():
            if parameter.requires_grad:
                parameter.normal_(std=0.2)
    expected = logits_of(adapted)
    save_adapter_run(adapted, tmp_path / "adapter-run")
    loaded = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "adapter-run")),
                        label_maps=label_maps(run_labels))
    assert loaded.config.id2label == dict(enumerate(run_labels))
    by_run_order = [checkpoint_labels.index(name) for name in run_labels]
    torch.testing.assert_close(logits_of(loaded), expected[..., by_run_order], rtol=1e-5, atol=1e-5)


# Every family: each names its head classes in its own way (DebertaV2For..., ModernBertFor..., BertpipeFor...). In
# BERT, ALBERT, DistilBERT, DeBERTa, ModernBERT and bertpipe's own, heads of both kinds share module names and shapes.
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", sorted(HEADS))
def test_modeling_head_of_another_kind_with_the_same_labels_is_new_and_says_so(family, head, tmp_path, caplog):
    """A sentence classifier's rows loaded silently into a token classifier with as many labels (and vice versa)."""
    auto_class, labels, _ = HEADS[head]
    other_class = HEADS["token" if head == "sequence" else "sequence"][0]
    checkpoint = save_checkpoint(tmp_path / "checkpoint", family, other_class, labels)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        loaded = load_model(auto_class, ModelConfig(name_or_path=str(tmp_path / "checkpoint")), label_maps=label_maps(labels))
    old = dict(checkpoint.named_parameters())
    base = loaded.base_model_prefix + "."
    head_parameters = {name: parameter for name, parameter in loaded.named_parameters() if not name.startswith(base)}
    kept = [name for name, parameter in head_parameters.items()
            if name in old and old[name].shape == parameter.shape and torch.equal(old[name], parameter) and parameter.std() > 0]
    assert head_parameters and not kept
    assert set(head_parameters) <= set(loaded.bertpipe_initialized_keys)
    assert all(torch.equal(parameter, old[name]) for name, parameter in loaded.named_parameters() if name.startswith(base) and name in old)
    warnings = loading_warnings(caplog)
    assert len(warnings) == 1 and other_class.__name__.removeprefix("AutoModel") in warnings[0], warnings


@pytest.mark.parametrize("family", FAMILIES)
def test_modeling_token_classifier_from_a_question_answering_checkpoint_is_new_and_says_so(family, tmp_path, caplog):
    """A QA head scores two things per token, as a token classifier of two labels does (ModernBERT: the same module
    names and shapes). XLNet's QA class is XLNetForQuestionAnsweringSimple, which a suffix test did not see as QA."""
    checkpoint = save_checkpoint(tmp_path / "checkpoint", family, AutoModelForQuestionAnswering, None)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        loaded = load_model(AutoModelForTokenClassification, ModelConfig(name_or_path=str(tmp_path / "checkpoint")),
                            label_maps=label_maps(["O", "B-PER"]))
    old, base = dict(checkpoint.named_parameters()), loaded.base_model_prefix + "."
    head_parameters = {name for name, _ in loaded.named_parameters() if not name.startswith(base)}
    assert head_parameters and head_parameters <= set(loaded.bertpipe_initialized_keys)
    assert not [name for name, parameter in loaded.named_parameters()
                if name in head_parameters and name in old and old[name].shape == parameter.shape and torch.equal(old[name], parameter)
                and parameter.std() > 0]  # a norm's ones are the same either way
    warnings = loading_warnings(caplog)
    assert len(warnings) == 1 and "a ForQuestionAnswering head" in warnings[0], warnings


def test_modeling_question_answering_from_a_classifier_of_three_labels_has_a_start_and_an_end_output(tmp_path):
    """QA names no labels: the MNLI head's three became three qa_outputs, and the start/end split failed mid-training."""
    from transformers import AutoModelForQuestionAnswering

    save_checkpoint(tmp_path / "checkpoint", "bert", AutoModelForSequenceClassification, ["entailment", "neutral", "contradiction"])
    loaded = load_model(AutoModelForQuestionAnswering, ModelConfig(name_or_path=str(tmp_path / "checkpoint")))
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    outputs = loaded.eval()(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    assert loaded.qa_outputs.out_features == 2 and outputs.start_logits.shape == outputs.end_logits.shape == (2, 9)


def test_modeling_head_of_another_kind_from_an_adapter_run_is_new(tmp_path):
    labels = HEADS["token"][1]
    save_checkpoint(tmp_path / "base", "bert", AutoModelForMaskedLM, None)
    peft = PeftConfig(r=4, alpha=8, dropout=0.0)
    model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "base"), peft=peft),
                       label_maps=label_maps(labels))
    adapted = apply_peft(model, peft, "SEQ_CLS", base_model_name_or_path=str(tmp_path / "base"))
    with torch.no_grad():  # a trained head
        adapted.base_model.model.classifier.modules_to_save["default"].weight.normal_(std=0.5)
    trained = adapted.base_model.model.classifier.modules_to_save["default"].weight.detach().clone()
    save_adapter_run(adapted, tmp_path / "adapter-run")
    loaded = load_model(AutoModelForTokenClassification, ModelConfig(name_or_path=str(tmp_path / "adapter-run")),
                        label_maps=label_maps(labels))
    assert not torch.equal(loaded.classifier.weight, trained) and float(loaded.classifier.weight.std()) < 0.1
    assert {"classifier.weight", "classifier.bias"} <= set(loaded.bertpipe_initialized_keys)


ADAPTER_LABELS = ["entailment", "neutral", "contradiction"]
NEW_HEADS = {  # the task's head class and labels (None: QA names none), against an MNLI-like sentence-classifier adapter run
    "qa": (AutoModelForQuestionAnswering, None),  # another kind, another number of outputs
    "token": (AutoModelForTokenClassification, ["O", "B-PER", "I-PER"]),  # another kind, as many labels
    "sequence": (AutoModelForSequenceClassification, ["no", "yes"]),  # the same kind, fewer labels
}


@pytest.fixture(scope="module")
def adapter_runs(tmp_path_factory):
    """Per family: a LoRA sentence-classifier run over ADAPTER_LABELS (with trained-looking adapter and head
    weights) and the run's model with the adapter merged in; built once per family."""
    built = {}

    def build(family: str):
        if family not in built:
            directory = tmp_path_factory.mktemp(f"adapter-{family}")
            save_checkpoint(directory / "base", family, AutoModel, None)  # an encoder without a head (XLNet has no MLM one)
            peft = PeftConfig(r=4, alpha=8, dropout=0.0)
            model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(directory / "base"), peft=peft),
                               label_maps=label_maps(ADAPTER_LABELS))
            adapted = apply_peft(model, peft, "SEQ_CLS", base_model_name_or_path=str(directory / "base"))
            torch.manual_seed(2)
            with torch.no_grad():  # LoRA B starts at zero: without this the adapter would change nothing
                for parameter in adapted.parameters():
                    if parameter.requires_grad:
                        parameter.normal_(std=0.2)
            save_adapter_run(adapted, directory / "run")
            built[family] = directory / "run", merge_adapter(adapted).eval()
        return built[family]

    return build


@pytest.mark.parametrize("head", sorted(NEW_HEADS))
@pytest.mark.parametrize("family", FAMILIES)
def test_modeling_adapter_run_of_another_head_kind_or_label_count_gives_a_new_head_on_its_adapted_encoder_and_says_so(
    family, head, adapter_runs, caplog
):
    """As for a full checkpoint. QA kept the MNLI run's three outputs (its start/end split failed mid-training with
    a traceback), another label count was refused, and a RoBERTa/ELECTRA/XLM-R sentence head failed to load into a
    token classifier."""
    auto_class, labels = NEW_HEADS[head]
    run, trained = adapter_runs(family)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        loaded = load_model(auto_class, ModelConfig(name_or_path=str(run)), label_maps=label_maps(labels) if labels else None)
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    if labels is None:  # a question/context pair, as QA feeds it: Longformer's QA head finds the question by its separators
        input_ids[:, [3, 4, 8]] = _Vocabulary.sep_token_id
    with torch.no_grad():
        outputs = loaded.eval()(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    if labels is None:
        assert outputs.start_logits.shape == outputs.end_logits.shape == (2, 9)
    else:
        assert loaded.config.id2label == dict(enumerate(labels)) and outputs.logits.shape[-1] == len(labels)
    # The encoder is the run's, with its adapter folded in.
    base, old = loaded.base_model_prefix + ".", trained.state_dict()
    encoder = {name: tensor for name, tensor in loaded.state_dict().items() if name.startswith(base)}
    assert encoder and all(torch.equal(tensor, old[name]) for name, tensor in encoder.items())
    head_parameters = {name: parameter for name, parameter in loaded.named_parameters() if not name.startswith(base)}
    new = set(loaded.bertpipe_initialized_keys)
    if head == "sequence":  # as transformers does for a full checkpoint: the output layer is new, layers before it are kept
        resized = {name for name, parameter in head_parameters.items() if old[name].shape != parameter.shape}
        assert resized and resized <= new
        assert all(torch.equal(parameter, old[name]) for name, parameter in head_parameters.items() if name not in new)
    else:
        assert head_parameters and set(head_parameters) <= new
        assert not [name for name, parameter in head_parameters.items()
                    if name in old and old[name].shape == parameter.shape and torch.equal(old[name], parameter) and parameter.std() > 0]
    warnings = loading_warnings(caplog)
    expected = [str(ADAPTER_LABELS), str(labels)] if head == "sequence" else ["a ForSequenceClassification head"]
    assert len(warnings) == 1 and all(text in warnings[0] for text in expected), warnings


def test_modeling_a_revision_a_local_copy_cannot_choose_is_named_once(tmp_path, tiny_bert, monkeypatch, caplog):
    """model.revision on an id that resolves to its mirror copy (or on a folder) was ignored without a word, while
    config.yaml, the adapter and the card recorded it as the revision trained on."""
    import shutil

    from transformers import AutoModelForSequenceClassification

    from pipelines import modeling
    from pipelines.modeling import load_tokenizer

    shutil.copytree(tiny_bert, tmp_path / "mirror" / "models" / "owner" / "tiny")
    monkeypatch.setenv("BERTPIPE_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setattr(modeling, "_REVISIONS_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="pipelines.modeling"):
        load_tokenizer("owner/tiny", "v2.0")
        load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path="owner/tiny", revision="v2.0"))
        for quiet in (None, "main"):
            load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path="owner/tiny", revision=quiet))
    warned = [record.getMessage() for record in caplog.records if "model.revision=" in record.getMessage()]
    assert warned == [f"model.revision=v2.0: owner/tiny resolves to its mirror copy {tmp_path / 'mirror' / 'models' / 'owner' / 'tiny'}, "
                      "which holds one version, whatever was copied there: revision v2.0 is not checked, though the run records it"]


@pytest.mark.parametrize("model_type", ["bert", "electra", "distilbert", "roberta", "xlm-roberta", "camembert", "data2vec-text",
                                        "longformer", "mpnet", "roberta-prelayernorm", "ibert", "xmod", "luke", "lilt", "markuplm"])
def test_modeling_usable_positions_leave_out_the_positions_before_the_padding_index_as_the_embeddings_do(model_type):
    # MPNet, RoBERTa-PreLayerNorm, I-BERT and X-MOD number positions from padding_idx + 1 as RoBERTa does, but were
    # counted from 0: data.max_seq_length at the table's size passed the check and indexed past it in a traceback.
    from transformers import AutoConfig, AutoModel

    from pipelines.modeling import usable_positions
    from pipelines.packing import position_offset

    sizes = dict(vocab_size=60, max_position_embeddings=40, pad_token_id=1)
    if model_type == "distilbert":
        sizes.update(dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    else:
        sizes.update(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    if model_type == "longformer":
        sizes["attention_window"] = 4
    config = AutoConfig.for_model(model_type, **sizes)
    assert usable_positions(config) == 40 - position_offset(AutoModel.from_config(config))


def _llama3_style_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.train_from_iterator(["Marguerite's film in 1996 was good, said Anastasia Kowalski."] * 5,
                                trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")


def _gemma_style_tokenizer():
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="▁", behavior="merged_with_next")
    backend.train_from_iterator(["▁Marguerite's film in 1996 was good, said Anastasia Kowalski."] * 5,
                                trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<unk>"]))
    model = json.loads(backend.to_str())["model"]
    return GemmaTokenizer(vocab=model["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]])


@pytest.mark.parametrize("build", [_llama3_style_tokenizer, _gemma_style_tokenizer], ids=["llama3", "gemma"])
def test_modeling_words_get_the_space_they_have_mid_sentence_where_a_split_or_normalizer_kept_it_from_them(build, tmp_path):
    # Llama 3's Split before byte-level BPE got a prefix space per split ("ĠMarguerite Ġ 's"), and Gemma's normalizer
    # turns spaces into "▁" that words handed over alone never have ("m an"): NER trained on pieces pretraining never saw.
    from transformers import AutoTokenizer

    from pipelines.modeling import encode_words_as_in_running_text

    tokenizer = build()
    words = "the man said Anastasia Kowalski's film in 1996 was good.".split()
    mid_sentence = tokenizer("x " + " ".join(words), add_special_tokens=False, return_offsets_mapping=True)
    expected = [piece for piece, (_, end) in zip(tokenizer.convert_ids_to_tokens(mid_sentence["input_ids"]), mid_sentence["offset_mapping"])
                if end > 1]
    assert tokenizer.convert_ids_to_tokens(tokenizer(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]) != expected
    encode_words_as_in_running_text(tokenizer)
    encoded = tokenizer(words, is_split_into_words=True, add_special_tokens=False, return_offsets_mapping=True)
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == expected
    for word_index, (start, end) in zip(encoded.word_ids(), encoded["offset_mapping"]):  # no offset leaves its word
        assert 0 <= start < end <= len(words[word_index])
    tokenizer.save_pretrained(tmp_path)
    reloaded = encode_words_as_in_running_text(AutoTokenizer.from_pretrained(tmp_path))  # no second space
    assert reloaded.convert_ids_to_tokens(reloaded(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]) == expected


def test_modeling_a_tokenizer_whose_pieces_cross_spaces_is_refused_for_pre_split_words():
    # BPE over the whole line ("▁" for spaces, no pre-tokenizer) learns pieces across words ("▁was▁good"): no space given
    # to each word alone brings them back, so words handed over one by one would get pieces pretraining never saw.
    from tokenizers import Tokenizer, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipelines.errors import ModelError
    from pipelines.modeling import encode_words_as_in_running_text

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.train_from_iterator(["▁Marguerite's film in 1996 was good, said Anastasia Kowalski."] * 5,
                                trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "<unk>"]))
    with pytest.raises(ModelError, match=r"cuts words handed over one by one into other pieces than running text"):
        encode_words_as_in_running_text(PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>"))


def test_modeling_a_cls_token_that_closes_every_text_is_not_a_summary_token_read_last():
    # <bos> A <eos> with cls_token = eos_token read as XLNet's <cls> last: classification and QA padded on the left, and a
    # head reading position 0 (a BERT-style pooler, ModernBERT's cls pooling) read [PAD].
    from pipelines.modeling import classification_token_comes_last
    from tests.families.builders import build_tokenizer

    tokenizer = build_tokenizer("modernbert-llama3")
    assert not classification_token_comes_last(tokenizer)
    tokenizer.cls_token = tokenizer.eos_token
    assert tokenizer("a")["input_ids"][-1] == tokenizer.cls_token_id and not classification_token_comes_last(tokenizer)
    assert classification_token_comes_last(build_tokenizer("xlnet"))
    assert not any(classification_token_comes_last(build_tokenizer(family)) for family in ("bert", "roberta", "albert", "modernbert-gemma"))
