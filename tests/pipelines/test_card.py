"""Model card: Hub metric ids, the model-index round trip through huggingface_hub's parser, and
the usage snippet per task and per model kind (full model vs adapter)."""

from __future__ import annotations

import math

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from pipelines.card import build_model_card, hub_metric, usage_snippet
from pipelines.config_loading import load_config
from tasks import get_task


def run_config(tmp_path, *overrides):
    path = tmp_path / "c.yaml"
    path.write_text("task: ner\noutput_dir: runs/x\ndata: {path: eriktks/conll2003}\nmodel: {name_or_path: bert-base-cased}\n")
    return load_config(path, list(overrides))


def test_card_hub_metric_ids():
    assert hub_metric("accuracy") == ("accuracy", None)
    assert hub_metric("f1_macro") == ("f1", "macro")
    assert hub_metric("precision_weighted") == ("precision", "weighted")
    assert hub_metric("pearson") == ("pearsonr", None)
    assert hub_metric("exact") == ("exact_match", None)
    assert hub_metric("bleu") == ("bleu", None) and hub_metric("perplexity") == ("perplexity", None)


def test_card_model_index_round_trips_the_final_metrics(tmp_path):
    config = run_config(tmp_path, "hub.language=[en, de]", "hub.license=mit")
    metrics = {"eval_f1": 0.91, "eval_precision": 0.9, "eval_accuracy": 0.98, "eval_loss": 0.12, "eval_samples": 3453,
               "eval_runtime": 12.5, "eval_overall_f1_micro": 0.5, "eval_bad": math.nan, "train_loss": 0.3}
    card = build_model_card(config, get_task("ner"), metrics, model_name="me/ner")
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    parsed = {r.metric_name: r.metric_value for r in loaded.data.eval_results}
    assert parsed == {"f1": 0.91, "precision": 0.9, "accuracy": 0.98, "loss": 0.12, "overall_f1_micro": 0.5}
    name, results = model_index_to_eval_results(loaded.data.to_dict()["model-index"])
    assert name == "me/ner" and {r.dataset_type for r in results} == {"eriktks/conll2003"}
    assert {r.task_type for r in results} == {"token-classification"}
    assert loaded.data.base_model == "bert-base-cased" and loaded.data.datasets == ["eriktks/conll2003"]
    assert loaded.data.language == ["en", "de"] and loaded.data.license == "mit" and loaded.data.library_name == "transformers"
    assert 'AutoModelForTokenClassification.from_pretrained("me/ner")' in loaded.text
    assert 'pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="first")' in loaded.text


def test_card_adapter_card_names_the_base_and_loads_with_peft(tmp_path):
    config = run_config(tmp_path, "model.peft={method: lora}")
    card = build_model_card(config, get_task("qa"), {"eval_exact_match": 70.0, "eval_f1": 80.0}, model_name="me/qa")
    assert card.data.library_name == "peft" and card.data.base_model == "bert-base-cased"
    assert "lora" in card.data.tags and "peft" in card.data.tags
    assert 'AutoModelForQuestionAnswering.from_pretrained("bert-base-cased", config=config)' in card.text
    assert 'PeftModel.from_pretrained(base, "me/qa")' in card.text
    assert "peft.r: 8" in card.text


def test_card_lists_the_model_settings_that_changed_what_was_trained(tmp_path):
    metrics = {"eval_f1": 0.9}
    plain = build_model_card(run_config(tmp_path), get_task("ner"), metrics, model_name="me/ner").text
    assert "model.dropout" not in plain and "model.freeze_input_embeddings" not in plain
    changed = build_model_card(run_config(tmp_path, "model.dropout=0.2", "model.freeze_input_embeddings=true"), get_task("ner"),
                               metrics, model_name="me/ner").text
    assert "- model.dropout: 0.2\n" in changed and "- model.freeze_input_embeddings: True\n" in changed


def test_card_of_a_distilled_run_names_the_teacher_and_the_distillation_settings(tmp_path):
    # The student's card read "trained from <teacher run>", its distill settings (teacher, alpha, temperature, layers) left out.
    teacher = tmp_path / "teacher"
    config = run_config(tmp_path, f"distill={{teacher: {teacher}, alpha: 0.9, temperature: 4.0, num_layers: 1}}",
                        f"model.name_or_path={teacher}")
    text = build_model_card(config, get_task("ner"), {"eval_f1": 0.9}, model_name="me/student").text
    assert f"from the teacher `{teacher}` by knowledge distillation, into a student of the teacher's own layers, on" in text
    for line in (f"- distill.teacher: {teacher}\n", "- distill.alpha: 0.9\n", "- distill.temperature: 4.0\n",
                 "- distill.init: teacher\n", "- distill.num_layers: 1\n"):
        assert line in text, line
    scratch = run_config(tmp_path, f"distill={{teacher: {teacher}, init: model}}", "model.name_or_path=prajjwal1/bert-tiny")
    assert "into a student of `prajjwal1/bert-tiny`, on" in build_model_card(scratch, get_task("ner"), {}, model_name="me/s").text
    assert "distill" not in build_model_card(run_config(tmp_path), get_task("ner"), {}, model_name="me/ner").text


@pytest.mark.parametrize("task_name, expected", [
    ("translation", "(model.config.prefix or \"\") + text"),
    ("mlm", 'pipeline("fill-mask", model="m/x")'),
    ("qa", 'settings = model.config.task_specific_params["question-answering"]'),
    ("classification", 'pipeline("text-classification", model="m/x")'),
])
def test_card_usage_snippet_fits_the_task(task_name, expected):
    task = get_task(task_name)
    snippet = usage_snippet(task, "m/x", base_model="b", adapter=False)
    assert expected in snippet
    compile(snippet, "snippet", "exec")  # it is valid Python
    adapter_snippet = usage_snippet(task, "m/x", base_model="b", adapter=True)
    compile(adapter_snippet, "snippet", "exec")
    assert f"{task.auto_model_class.__name__}.from_pretrained(\"b\", config=config)" in adapter_snippet


def test_card_code_loads_the_branch_pushed_to_and_the_adapters_base_revision():
    """publish --revision BRANCH pushed there while the card's code loaded main (another model, or none); an adapter
    trained on a base revision was put on the base's main branch (other weights, and no error)."""
    task = get_task("classification")
    full = usage_snippet(task, "me/x", base_model="b", adapter=False, revision="exp-1")
    assert 'pipeline("text-classification", model="me/x", revision="exp-1")' in full
    adapter = usage_snippet(task, "me/x", base_model="org/base", adapter=True, revision="exp-1", base_revision="v1.0")
    for line in ('AutoConfig.from_pretrained("me/x", revision="exp-1")',
                 'AutoModelForSequenceClassification.from_pretrained("org/base", config=config, revision="v1.0")',
                 'PeftModel.from_pretrained(base, "me/x", revision="exp-1")', 'AutoTokenizer.from_pretrained("me/x", revision="exp-1")'):
        assert line in adapter, line
    compile(full, "snippet", "exec") and compile(adapter, "snippet", "exec")
    plain = usage_snippet(task, "me/x", base_model="b", adapter=True)
    assert "revision" not in plain and "revision" not in usage_snippet(task, "me/x", base_model="b", adapter=False)


def test_card_of_a_multi_label_model_shows_every_labels_score(tmp_path):
    """The card's call took top_k=None from the task's state, which only training set: publish built a fresh task,
    and its card's call showed one label of a multi-label model. It now comes from the saved config."""
    path = tmp_path / "c.yaml"
    path.write_text("task: classification\noutput_dir: runs/x\ndata: {path: some/data}\nmodel: {name_or_path: org/base, revision: v2}\n")
    config = load_config(path, [], lambda name: get_task(name).Options)
    task = get_task("classification")(config)
    multi = build_model_card(config, task, {}, model_name="me/x", saved_config={"problem_type": "multi_label_classification"}).text
    single = build_model_card(config, task, {}, model_name="me/x", saved_config={"problem_type": "single_label_classification"}).text
    assert "max_length=128, top_k=None))" in multi and "top_k" not in single
    assert "- model.revision: v2" in single  # the base revision trained on, among the settings


def test_card_of_local_files_read_instead_of_a_hub_dataset_names_no_hub_dataset(tmp_path):
    # sst2.yaml's data.path with its files overridden trained on the files, but the card put that accuracy on SST-2.
    train = tmp_path / "train.jsonl"
    train.write_text('{"tokens": ["a"], "tags": ["O"]}\n')
    config = run_config(tmp_path, "data.name=default", f"data.files={{train: {train}, validation: {train}}}")
    card = build_model_card(config, get_task("ner"), {"eval_f1": 0.5}, model_name="me/ner")
    assert card.data.datasets is None and "eriktks/conll2003" not in str(card)
    assert {(result.dataset_type, result.dataset_name, result.dataset_config) for result in card.data.eval_results} == {
        ("custom", "local files", None)}


def test_card_names_no_base_model_for_a_local_folder_removed_since_training(tmp_path):
    # config.yaml records a local base by its absolute path: with the folder cleaned up (or published from another
    # machine), the card declared /tmp/... as the Hub id of its base model.
    config = run_config(tmp_path, f"model.name_or_path={tmp_path / 'gone'}", f"data.path={tmp_path / 'gone-data'}")
    card = build_model_card(config, get_task("ner"), {"eval_f1": 0.5}, model_name="me/ner")
    assert card.data.base_model is None and card.data.datasets is None


def test_card_results_are_scores_not_the_counts_thresholds_and_flags_beside_them(tmp_path):
    # NER's words evaluated (1350.0), SQuAD v2's totals and best thresholds, translation's gen_len and a lowercasing
    # flag stored as 1.0 were published in the model-index as if they were results.
    config = run_config(tmp_path)
    metrics = {"eval_f1": 0.5, "eval_words": 1350.0, "eval_total": 40.0, "eval_HasAns_total": 28.0, "eval_NoAns_total": 12.0,
               "eval_best_f1": 0.6, "eval_best_f1_thresh": -1.5, "eval_best_exact_thresh": -2.0, "eval_gen_len": 11.2,
               "eval_bleu": 21.0, "eval_bleu_lowercased": 1.0, "eval_masked_tokens": 900.0, "eval_samples": 10,
               "eval_runtime": 1.0, "eval_samples_per_second": 10.0, "eval_HasAns_f1": 0.7}
    card = build_model_card(config, get_task("ner"), metrics, model_name="me/ner")
    assert {result.metric_name for result in card.data.eval_results} == {"f1", "best_f1", "bleu", "HasAns_f1"}
