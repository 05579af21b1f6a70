"""End to end through the CLI on a tiny BERT: train -> evaluate -> predict -> pipeline("token-classification").

The synthetic task: names from a fixed list are PER (first name B-PER, surname I-PER), cities are LOC,
everything else O. Train sentences come as a CoNLL column file, validation as jsonl; some sentences
are longer than max_seq_length, so they are windowed and every word must still be evaluated.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.conftest import FILLER_WORDS, build_tiny_bert, run_cli, write_config, write_jsonl

FIRST_NAMES = ["alice", "bruno", "chen", "dmitri", "elena", "farah"]
SURNAMES = ["smith", "okafor", "garcia", "novak"]
CITIES = ["paris", "berlin", "lagos", "lima", "oslo"]
VERBS = ["met", "visited", "left", "called", "saw"]


def ner_sentence(rng: random.Random, filler: int) -> tuple[list[str], list[str]]:
    words, tags = [], []
    for _ in range(filler):
        roll = rng.random()
        if roll < 0.12:
            words.append(rng.choice(FIRST_NAMES)); tags.append("B-PER")
            if rng.random() < 0.6:
                words.append(rng.choice(SURNAMES)); tags.append("I-PER")
        elif roll < 0.22:
            words.append(rng.choice(CITIES)); tags.append("B-LOC")
        else:
            words.append(rng.choice(FILLER_WORDS + VERBS)); tags.append("O")
    return words, tags


def ner_sentences(count: int, seed: int, long_every: int = 10) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    return [ner_sentence(rng, rng.randint(35, 45) if i % long_every == 0 else rng.randint(3, 12)) for i in range(count)]


def write_conll(path: Path, sentences) -> Path:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in sentences:
        lines.extend(f"{word} X X {tag}" for word, tag in zip(words, tags))
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def toy_ner_model(folder: Path) -> Path:
    """A tiny BERT whose WordPiece vocabulary holds every toy name and city as one token."""
    return build_tiny_bert(folder / "tiny", vocab_words=[" ".join(FIRST_NAMES + SURNAMES + CITIES + VERBS)] * 20)


def toy_ner_config(folder: Path, model: Path) -> Path:
    """The toy NER job (240 CoNLL-file train sentences, 41 jsonl validation sentences) on ``model``."""
    train = write_conll(folder / "train.txt", ner_sentences(240, seed=1))
    validation = write_jsonl(folder / "validation.jsonl", [{"tokens": w, "ner_tags": t} for w, t in ner_sentences(41, seed=2)])
    return write_config(folder / "ner.yaml", f"""# test config
task: ner
output_dir: {folder / 'run'}
seed: 3
model: {{name_or_path: {model}}}
data: {{files: {{train: {train}, validation: {validation}}}, max_seq_length: 24}}
train: {{num_epochs: 4, batch_size: 16, learning_rate: 3.0e-3, warmup_fraction: 0.05, logging_steps: 10, torch_num_threads: 1}}
""")


@pytest.fixture(scope="module")
def ner_setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ner-cli")
    model = build_tiny_bert(folder / "tiny", vocab_words=[" ".join(FIRST_NAMES + SURNAMES + CITIES + VERBS)] * 20)
    validation = ner_sentences(41, seed=2, long_every=5)
    files = {
        "train": write_conll(folder / "train.txt", ner_sentences(240, seed=1)),
        "validation": write_jsonl(folder / "validation.jsonl", [{"tokens": w, "ner_tags": t} for w, t in validation]),
    }
    config = write_config(folder / "ner.yaml", f"""# test config
task: ner
output_dir: {folder / 'run'}
seed: 3
model:
  name_or_path: {model}
data:
  files:
    train: {files['train']}
    validation: {files['validation']}
  max_seq_length: 24
train:
  num_epochs: 4
  batch_size: 16
  learning_rate: 3.0e-3
  warmup_fraction: 0.05
  logging_steps: 10
  eval_steps: 30
  torch_num_threads: 1  # the test machine is shared: one thread avoids oversubscription stalls
ner:
  stride: 8
""")
    run_cli("train", str(config))
    return {"run": folder / "run", "config": config, "files": files, "validation": validation}


def test_cli_ner_train_writes_metrics_per_entity_type_over_every_word(ner_setup):
    run = ner_setup["run"]
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ["eval_precision", "eval_recall", "eval_f1", "eval_accuracy", "eval_PER_f1", "eval_LOC_f1",
                "eval_PER_precision", "eval_LOC_recall", "train_samples_per_second"]:
        assert key in metrics, key
    assert metrics["eval_samples"] == 41
    # Words, not pieces, and none lost to the windows of the long sentences (max_seq_length 24).
    assert metrics["eval_words"] == sum(len(words) for words, _ in ner_setup["validation"])
    assert metrics["eval_f1"] >= 0.9, metrics
    config = json.loads((run / "config.json").read_text())
    assert set(config["id2label"].values()) == {"O", "B-PER", "I-PER", "B-LOC", "I-LOC"}  # I-LOC: later pieces of a city
    written = (run / "eval_predictions.conll").read_text().split("\n\n")
    assert len([block for block in written if block.strip()]) == 41


def test_cli_ner_evaluate_matches_training_metrics(ner_setup):
    run = ner_setup["run"]
    run_cli("evaluate", str(run))
    evaluated = json.loads((run / "eval_validation.json").read_text())
    trained = json.loads((run / "metrics.json").read_text())
    for key in ["eval_f1", "eval_accuracy", "eval_PER_f1", "eval_words"]:
        assert evaluated[key] == pytest.approx(trained[key]), key


def test_cli_ner_predict_raw_text_and_pre_tokenized(ner_setup, tmp_path):
    run = ner_setup["run"]
    text_input = tmp_path / "input.txt"
    text_input.write_text("alice smith visited paris .\n\nthe film was about chen novak and oslo\n")
    text_output = tmp_path / "text.jsonl"
    run_cli("predict", str(run), "--input", str(text_input), "--output", str(text_output))
    rows = [json.loads(line) for line in text_output.read_text().splitlines()]
    assert [row["text"] for row in rows] == text_input.read_text().splitlines()
    for row in rows:
        assert all(row["text"][e["start"]:e["end"]] == e["word"] for e in row["entities"])
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in rows[0]["entities"]] == [
        ("PER", "alice smith", 0, 11), ("LOC", "paris", 20, 25)]
    assert rows[1]["entities"] == []
    assert [(e["entity_group"], e["word"]) for e in rows[2]["entities"]] == [("PER", "chen novak"), ("LOC", "oslo")]

    tokens_input = write_jsonl(tmp_path / "tokens.jsonl", [{"tokens": ["elena", "garcia", "saw", "lima"], "doc": {"id": 7, "page": 2}}])
    tokens_output = tmp_path / "tokens-out.jsonl"
    run_cli("predict", str(run), "--input", str(tokens_input), "--output", str(tokens_output))
    [row] = [json.loads(line) for line in tokens_output.read_text().splitlines()]
    assert row["tags"] == ["B-PER", "I-PER", "O", "B-LOC"]
    assert row["doc"] == {"id": 7, "page": 2}  # the input's other columns, copied as they were
    assert [(e["entity_group"], e["word"], e["start"], e["end"], e["start_word"], e["end_word"]) for e in row["entities"]] == [
        ("PER", "elena garcia", 0, 12, 0, 2), ("LOC", "lima", 17, 21, 3, 4)]


def test_cli_ner_pipeline_returns_entity_groups_with_offsets(ner_setup):
    from transformers import pipeline

    tagger = pipeline("token-classification", model=str(ner_setup["run"]), aggregation_strategy="simple")
    text = "alice smith visited paris"
    groups = tagger(text)
    assert [(g["entity_group"], g["start"], g["end"]) for g in groups] == [("PER", 0, 11), ("LOC", 20, 25)]
    assert [text[g["start"]:g["end"]] for g in groups] == ["alice smith", "paris"]


def test_cli_ner_documented_pipeline_call_is_predicts_word_rule(ner_setup, tmp_path):
    """The run stores ``aggregation_strategy: words``: ``pipeline("token-classification", model=RUN_DIR)``
    returns predict's entity rows; a transformers strategy, given at construction or per call, keeps
    transformers' aggregation, and the call-time choice wins."""
    from transformers import AutoConfig, pipeline

    import tasks

    tasks.load_tasks()  # as documented: registers bertpipe's pipeline("token-classification")
    run = ner_setup["run"]
    assert AutoConfig.from_pretrained(run).task_specific_params["token-classification"] == {
        "aggregation_strategy": "words", "max_seq_length": 24, "stride": 8, "strict_scheme": None}
    texts = ["alice smith visited paris.", "Chen Novak's film, about oslo!"]
    source, target = write_jsonl(tmp_path / "in.jsonl", [{"text": text} for text in texts]), tmp_path / "out.jsonl"
    run_cli("predict", str(run), "--input", str(source), "--output", str(target))
    predicted = [json.loads(line)["entities"] for line in target.read_text().splitlines()]
    assert [(e["entity_group"], e["word"]) for e in predicted[0]] == [("PER", "alice smith"), ("LOC", "paris")]

    def keys(entities):
        return [(e["entity_group"], e["word"], e["start"], e["end"], round(float(e["score"]), 5)) for e in entities]

    documented = pipeline("token-classification", model=str(run))
    assert [keys(found) for found in documented(texts)] == [keys(rows) for rows in predicted]
    assert "index" in documented(texts[0], aggregation_strategy="none")[0]  # transformers' per-piece output
    simple = pipeline("token-classification", model=str(run), aggregation_strategy="simple")
    assert keys(simple(texts[1], aggregation_strategy="words")) == keys(predicted[1])
    assert simple(texts[0])[0]["word"] == "alice smith"  # transformers': decoded pieces
    # A stride past the window is capped at half a window, as predict caps ner.stride=100; transformers' own check
    # (below the model's length) refused it on the word path, which takes its stride itself.
    long_text = "alice smith " * 6 + "visited paris and " * 5 + "farah novak"
    (tmp_path / "long.txt").write_text(long_text + "\n")
    run_cli("predict", str(run), "--input", str(tmp_path / "long.txt"), "--output", str(tmp_path / "long.jsonl"), "ner.stride=100")
    [capped] = [json.loads(line)["entities"] for line in (tmp_path / "long.jsonl").read_text().splitlines()]
    assert keys(documented(long_text, stride=100)) == keys(capped) and capped


def test_cli_ner_pipeline_leaves_other_token_classifiers_to_transformers(ner_setup):
    """A token-classification model that is not a bertpipe NER run (no stored aggregation) gets
    transformers' pipeline output, unchanged, from the registered class, unless it asks for "words"."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline
    from transformers.pipelines.token_classification import TokenClassificationPipeline

    import tasks.ner  # noqa: F401  (registers bertpipe's pipeline("token-classification"))

    model = AutoModelForTokenClassification.from_pretrained(ner_setup["run"])
    model.config.task_specific_params = None
    tokenizer = AutoTokenizer.from_pretrained(ner_setup["run"])
    text = "elena garcia saw  lima , chen"
    for options in ({}, {"aggregation_strategy": "simple"}, {"aggregation_strategy": "first"}):
        ours = pipeline("token-classification", model=model, tokenizer=tokenizer, **options)
        stock = pipeline("token-classification", model=model, tokenizer=tokenizer, pipeline_class=TokenClassificationPipeline, **options)
        assert type(ours).__name__ == "WordTokenClassificationPipeline"
        assert repr(ours(text)) == repr(stock(text)), options
    # Asked for by name, the word rule serves such a model too (a run trained before the strategy was stored).
    asked = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="words")(text)
    assert asked == pipeline("token-classification", model=str(ner_setup["run"]))(text)
    assert asked and all(text[e["start"] : e["end"]] == e["word"] for e in asked)


def test_cli_ner_predict_on_a_txt_of_conll_columns_tags_its_tokens_as_training_read_them(ner_setup, tmp_path):
    """Training read ``train.txt`` as CoNLL columns; predict read it as raw text, each token line ("alice X X
    B-PER") a sentence of its own with "entities" among the tag columns, exit status 0."""
    run, source = ner_setup["run"], ner_setup["files"]["train"]
    renamed = tmp_path / "train.conll"
    renamed.write_text(source.read_text())
    rows = {}
    for path in (source, renamed):
        target = tmp_path / f"{path.suffix[1:]}-out.jsonl"
        run_cli("predict", str(run), "--input", str(path), "--output", str(target))
        rows[path.suffix] = [json.loads(line) for line in target.read_text().splitlines()]
    assert rows[".txt"] == rows[".conll"]
    assert [row["tokens"] for row in rows[".txt"]] == [words for words, _ in ner_sentences(240, seed=1)]


def _bilou(tags: list[str]) -> list[str]:
    """IOB2 tags as BILOU: a chunk's last word L-, a one-word chunk U-."""
    out = []
    for index, tag in enumerate(tags):
        continues = index + 1 < len(tags) and tags[index + 1].startswith("I-")
        prefix = {"B": "B" if continues else "U", "I": "I" if continues else "L"}.get(tag[0], "O")
        out.append(tag if tag == "O" else f"{prefix}-{tag[2:]}")
    return out


def _pos(words: list[str]) -> list[str]:
    return ["NNP" if w in FIRST_NAMES + SURNAMES else "NN" if w in CITIES else "VBD" if w in VERBS else "DT" for w in words]


@pytest.mark.parametrize("tag_set", ["bilou", "pos"])
def test_cli_ner_tag_sets_beyond_iob2_predict_their_own_chunks_or_words(tmp_path, tag_set):
    """BILOU: seqeval's lenient reading knew no U-/L-, so two U-PER words were one entity, in metrics,
    predict and pipeline(). POS: tags that name no chunks were chunked all the same ("NNP NNP" an entity "NP",
    "VBD" one "BD"), and raw text got no tags. Now U- words are entities of their own, and a POS run
    reports each word's tag; predict and pipeline() agree."""
    from transformers import pipeline

    import tasks

    sentences = ner_sentences(160, seed=1, long_every=1000)
    retag = (lambda words, tags: _bilou(tags)) if tag_set == "bilou" else (lambda words, tags: _pos(words))
    rows = [{"tokens": words, "ner_tags": retag(words, tags)} for words, tags in sentences]
    train, validation = write_jsonl(tmp_path / "train.jsonl", rows[:130]), write_jsonl(tmp_path / "validation.jsonl", rows[130:])
    config = write_config(tmp_path / "c.yaml", f"""# test config
task: ner
output_dir: {tmp_path / 'run'}
seed: 3
model: {{name_or_path: {toy_ner_model(tmp_path)}}}
data: {{files: {{train: {train}, validation: {validation}}}, max_seq_length: 24}}
train: {{num_epochs: 4, batch_size: 16, learning_rate: 3.0e-3, warmup_fraction: 0.05, torch_num_threads: 1}}
""")
    run_cli("train", str(config))
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert ("eval_f1" in metrics) == (tag_set == "bilou") and metrics["eval_accuracy"] >= 0.8, metrics

    tokens = [words for words, _ in sentences[130:]]
    texts = [" ".join(words) for words in tokens[:8]]
    predicted = []
    for name, inputs in (("tokens", [{"tokens": words} for words in tokens]), ("text", [{"text": text} for text in texts])):
        source, target = write_jsonl(tmp_path / f"{name}.jsonl", inputs), tmp_path / f"{name}-out.jsonl"
        run_cli("predict", str(run), "--input", str(source), "--output", str(target))
        predicted += [json.loads(line) for line in target.read_text().splitlines()]
    tasks.load_tasks()
    served = pipeline("token-classification", model=str(run))(texts)
    rounded = lambda found: [{**e, "score": round(e["score"], 4)} for e in found]  # noqa: E731
    if tag_set == "bilou":
        singles = 0
        for row in predicted[: len(tokens)]:
            spans = {(e["start_word"], e["end_word"]) for e in row["entities"]}
            units = {(i, i + 1) for i, tag in enumerate(row["tags"]) if tag.startswith("U-")}
            assert units <= spans, row
            singles += len(units)
        assert singles > 10  # the model tags single-word chunks U-, so the property above was put to the test
        assert [rounded(found) for found in served] == [rounded(row["entities"]) for row in predicted[len(tokens):]]
    else:
        for words, row in zip(tokens, predicted):
            assert "entities" not in row and [w["entity"] for w in row["words"]] == row["tags"]
            assert [w["word"] for w in row["words"]] == words and set(row["tags"]) <= {"NNP", "NN", "VBD", "DT"}
        for text, row, found in zip(texts, predicted[len(tokens):], served):
            assert "entities" not in row and [w["word"] for w in row["words"]] == text.split(" ")
            assert rounded(found) == rounded(row["words"])


def test_cli_ner_tag_outside_the_label_set_names_file_and_line(ner_setup, tmp_path):
    bad = write_jsonl(tmp_path / "validation.jsonl", [
        {"tokens": ["alice", "left"], "ner_tags": ["B-PER", "O"]},
        {"tokens": ["acme", "hired", "bruno"], "ner_tags": ["B-ORG", "O", "B-PER"]},
    ])
    result = run_cli("train", str(ner_setup["config"]), f"output_dir={tmp_path / 'run'}", f"data.files.validation={bad}", check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{bad}:2" in result.stderr and "'B-ORG'" in result.stderr and "Traceback" not in result.stderr


def test_cli_ner_best_model_metric_of_a_type_the_eval_split_lacks_is_refused_before_training(ner_setup, tmp_path):
    """eval_LOC_f1 on an eval split without a LOC: scored (zeros) where the model predicted a LOC, missing where it did
    not, so the run either picked its best model by noise or stopped at an evaluation with training lost."""
    no_loc = write_jsonl(tmp_path / "validation.jsonl", [{"tokens": ["alice", "left"], "ner_tags": ["B-PER", "O"]}])
    result = run_cli("train", str(ner_setup["config"]), f"output_dir={tmp_path / 'run'}", f"data.files.validation={no_loc}",
                     "train.metric_for_best_model=eval_LOC_f1", "train.max_steps=4", "train.eval_steps=2", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert ("train.metric_for_best_model='eval_LOC_f1' is not reported on this run's eval split: the eval split holds no "
            "LOC entity. Choose one it reports at every evaluation (eval_precision, eval_recall, eval_f1, eval_accuracy, "
            "eval_words, eval_PER_precision, eval_PER_recall, eval_PER_f1)") in result.stderr
    assert not (tmp_path / "run").exists()


def test_cli_ner_lora_adapter_run_trains_and_reloads(ner_setup, tmp_path):
    from tests.conftest import check_lora_run

    from transformers import pipeline

    import tasks

    text = "alice lives in paris"
    check_lora_run(ner_setup["config"], tmp_path / "lora", "eval_accuracy", pipeline_input=text)
    source, target = write_jsonl(tmp_path / "in.jsonl", [{"text": text}]), tmp_path / "out.jsonl"
    run_cli("predict", str(tmp_path / "lora"), "--input", str(source), "--output", str(target))
    tasks.load_tasks()
    served = pipeline("token-classification", model=str(tmp_path / "lora"))(text)
    spans = lambda entities: [(e["entity_group"], e["start"], e["end"]) for e in entities]  # noqa: E731
    assert spans(served) == spans(json.loads(target.read_text())["entities"])


def test_cli_ner_packed_training_counts_every_example_and_learns(tmp_path):
    """``train.pack_sequences``: random batches packed into shared rows train as well as padded ones, and
    the run's sample and token counts are those of the examples, not of the rows."""
    from pipelines.config_loading import load_config
    from tasks import get_task

    config = toy_ner_config(tmp_path, toy_ner_model(tmp_path))
    run_cli("train", str(config), "train.pack_sequences=true")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["eval_f1"] >= 0.9, metrics

    loaded = load_config(config, [], lambda name: get_task(name).Options)
    task = get_task(loaded.task)(loaded)
    raw = task.load()
    task.build_tokenizer(raw)
    features = task.preprocess(raw[loaded.data.train_split], train=True)
    assert metrics["train_samples"] == loaded.train.num_epochs * len(features)
    assert metrics["train_tokens"] == loaded.train.num_epochs * sum(len(ids) for ids in features["input_ids"])
    assert "pack_sequences: true" in (tmp_path / "run" / "config.yaml").read_text()


def test_cli_ner_accumulated_batches_train_what_one_batch_of_them_trains(tmp_path):
    """Four accumulated batches of 4 sentences make the update one batch of those 16 makes, the epoch's
    last, shorter window included: each token counts once, whatever batch it came in.
    A mean of per-batch means weighs a batch of few labelled tokens like one of many (max weight
    difference 3e-2 after one epoch before the fix)."""
    from safetensors.torch import load_file

    config = toy_ner_config(tmp_path, toy_ner_model(tmp_path))
    exact = ["model.dropout=0", "train.group_by_length=false", "train.num_epochs=1", "train.mixed_precision=no",
             "data.max_train_samples=236", "train.eval_steps=null", "train.logging_steps=100"]
    weights, counts = {}, {}
    for name, batch_size, accumulation in (("one_batch", 16, 1), ("accumulated", 4, 4)):
        run_cli("train", str(config), f"output_dir={tmp_path / name}", f"train.batch_size={batch_size}",
                f"train.gradient_accumulation_steps={accumulation}", *exact)
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        counts[name] = (metrics["global_step"], metrics["train_samples"])
        weights[name] = load_file(tmp_path / name / "model.safetensors")
    steps, samples = counts["one_batch"]
    assert counts["accumulated"] == counts["one_batch"] and samples % 16 != 0 and steps == -(-samples // 16)
    for key, tensor in weights["one_batch"].items():
        torch.testing.assert_close(weights["accumulated"][key], tensor, atol=1e-4, rtol=0, msg=key)
