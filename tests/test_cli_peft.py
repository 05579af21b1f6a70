"""End to end through the CLI: LoRA classification train -> evaluate -> predict -> merge -> publish.

One LoRA run (with ``model.peft.merge: true``) is shared by the module. ``publish`` pushes to a
local stand-in for the Hub's HTTP API (tests/pipelines/fake_hub.py, reached through HF_ENDPOINT);
the token is a unique string that must never reach a written file.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import cli_env, resaved_checkpoint, run_cli, write_config
from tests.pipelines.fake_hub import FakeHub

TOKEN = "hf_bertpipe_test_token_5f0c2a9e"


def lora_config(tmp_path: Path, tiny_bert: Path, files: dict[str, Path]) -> Path:
    return write_config(tmp_path / "lora.yaml", f"""# test config
task: classification
output_dir: {tmp_path / 'run'}
seed: 7
model:
  name_or_path: {tiny_bert}
  peft: {{method: lora, r: 8, alpha: 16, dropout: 0.0, merge: true}}
data:
  files: {{train: {files['train']}, validation: {files['validation']}}}
  text_column: sentence
  label_column: label
  max_seq_length: 32
train: {{max_steps: 36, batch_size: 16, learning_rate: 1.0e-2, lr_scheduler: constant, logging_steps: 6, torch_num_threads: 1,
        mixed_precision: "no"}}  # fp32 on every CPU: predict and pipeline() are compared to 1e-4
hub: {{repo_id: someone/tiny-lora, language: en, license: apache-2.0, tags: [sentiment]}}
""")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_bert, sentiment_files) -> Path:
    tmp_path = tmp_path_factory.mktemp("lora")
    run_cli("train", str(lora_config(tmp_path, tiny_bert, sentiment_files)), env=cli_env(HF_TOKEN=TOKEN))
    return tmp_path / "run"


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cli_training_from_an_adapter_run_takes_the_new_label_names(lora_run, tmp_path):
    def rows(labels):
        return [{"sentence": f"{word} film", "label": labels[index % len(labels)]} for index, word in enumerate(["good", "bad", "fine"] * 8)]

    def config(name, labels):
        files = {split: tmp_path / f"{name}-{split}.jsonl" for split in ("train", "validation")}
        for path in files.values():
            path.write_text("".join(json.dumps(row) + "\n" for row in rows(labels)))
        return write_config(tmp_path / f"{name}.yaml", f"""task: classification
output_dir: {tmp_path / name}
model: {{name_or_path: {lora_run}}}
data: {{files: {{train: {files['train']}, validation: {files['validation']}}}, text_column: sentence, label_column: label, max_seq_length: 16}}
train: {{max_steps: 2, batch_size: 8, mixed_precision: "no", eval_steps: null, save_steps: null}}
""")

    # Two labels again, other names: the run reports its own names, not the adapter run's.
    run_cli("train", str(config("renamed", ["yes", "no"])))
    assert json.loads((tmp_path / "renamed" / "config.json").read_text())["id2label"] == {"0": "no", "1": "yes"}


def test_cli_lora_run_holds_the_adapter_not_the_base_model(lora_run, tiny_bert):
    names = {p.name for p in lora_run.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json", "tokenizer.json", "metrics.json", "README.md"} <= names
    assert "model.safetensors" not in names
    adapter_config = json.loads((lora_run / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(tiny_bert.resolve())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["task_type"] == "SEQ_CLS" and adapter_config["r"] == 8
    assert json.loads((lora_run / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}


def test_cli_lora_trains_only_adapter_and_head(lora_run, tiny_bert):
    metrics = json.loads((lora_run / "metrics.json").read_text())
    adapter = load_file(lora_run / "adapter_model.safetensors")
    # Counted after wrapping: the adapter file holds exactly the trainable tensors.
    assert metrics["trainable_params"] == sum(t.numel() for t in adapter.values())
    assert 0 < metrics["trainable_params"] < 0.2 * metrics["total_params"]
    assert all("lora_" in key or "classifier" in key or "pooler" in key for key in adapter), sorted(adapter)
    assert any(t.abs().sum() > 0 for key, t in adapter.items() if "lora_B" in key)  # B starts at zero: it trained

    from transformers import AutoModelForSequenceClassification

    from pipelines.config import ModelConfig
    from pipelines.modeling import load_model

    base = load_file(tiny_bert / "model.safetensors")
    reloaded = load_model(AutoModelForSequenceClassification, ModelConfig(), model_path=str(lora_run)).get_base_model().state_dict()
    compared = 0
    for key, before in base.items():  # the frozen base, as loaded under the adapter, is the original
        name = "bert." + key.removeprefix("bert.")
        if "pooler" in name:
            continue
        after = reloaded.get(name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias"), reloaded.get(name))
        assert after is not None, name
        assert torch.equal(after, before), name
        compared += 1
    assert compared == len([k for k in base if "pooler" not in k])


def test_cli_lora_evaluate_reloads_through_peft(lora_run):
    result = run_cli("evaluate", str(lora_run))
    evaluated = json.loads((lora_run / "eval_validation.json").read_text())
    trained = json.loads((lora_run / "metrics.json").read_text())
    assert evaluated["eval_accuracy"] == pytest.approx(trained["eval_accuracy"])
    assert "eval_accuracy" in result.stdout


def test_cli_lora_predict_matches_pipeline_on_the_adapter_run_and_on_the_merged_model(lora_run, tmp_path):
    texts = ["the film was superb", "awful and dull plot", "the scenes were warm and bright", "grim sad story"]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(texts) + "\n")
    output = tmp_path / "predictions.jsonl"
    run_cli("predict", str(lora_run), "--input", str(inputs), "--output", str(output))
    rows = [json.loads(line) for line in output.read_text().splitlines()]

    from peft import PeftModel
    from transformers import pipeline

    from tasks import load_tasks

    load_tasks()  # lets pipeline() load adapter run directories

    on_adapter = pipeline("text-classification", model=str(lora_run), top_k=None)
    assert isinstance(on_adapter.model, PeftModel)
    on_merged = pipeline("text-classification", model=str(lora_run / "merged"), top_k=None)
    # The dtype asked of pipeline() reaches an adapter run as it reaches a full model.
    import torch

    in_bf16 = pipeline("text-classification", model=str(lora_run), top_k=None, dtype=torch.bfloat16)
    assert {p.dtype for p in in_bf16.model.parameters()} == {torch.bfloat16}
    for row, adapter_scores, merged_scores in zip(rows, on_adapter(texts), on_merged(texts)):
        for scores in (adapter_scores, merged_scores):
            by_label = {item["label"]: item["score"] for item in scores}
            assert set(by_label) == {"negative", "positive"}
            for label, score in row["scores"].items():
                assert by_label[label] == pytest.approx(score, abs=1e-4)


def test_cli_merge_writes_a_full_model_with_the_adapter_outputs(lora_run, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipelines.config import ModelConfig
    from pipelines.modeling import load_model

    run_cli("merge", str(lora_run), "--out", str(tmp_path / "merged"))
    assert (tmp_path / "merged" / "model.safetensors").is_file() and (tmp_path / "merged" / "tokenizer.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    batch = tokenizer(["the plot was lovely", "cold dark film"], padding=True, return_tensors="pt")
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged").eval()
    adapter = load_model(AutoModelForSequenceClassification, ModelConfig(), model_path=str(lora_run)).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(**batch).logits, adapter(**batch).logits, rtol=1e-4, atol=1e-5)


def test_merge_killed_mid_write_leaves_the_earlier_merged_model_whole(lora_run, tmp_path, monkeypatch):
    """``merge`` over an existing merged/ wrote in place: a kill mid-write left a merged model that did not load."""
    import shutil

    import transformers.modeling_utils
    from transformers import AutoModelForSequenceClassification

    from pipelines.config_loading import load_config
    from pipelines.evaluation import merge_run
    from pipelines.outputs import load_saved_config
    from tasks import get_task

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    before = _tree_digest(run / "merged")
    config = load_config(None, [], base=load_saved_config(run) | {"classification": {}})

    def killed(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 64)  # what a kill or a full disk leaves of the file
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        merge_run(config, get_task("classification")(config), str(run))
    monkeypatch.undo()
    assert _tree_digest(run / "merged") == before
    AutoModelForSequenceClassification.from_pretrained(run / "merged")
    assert merge_run(config, get_task("classification")(config), str(run)) == run / "merged"
    AutoModelForSequenceClassification.from_pretrained(run / "merged")
    assert sorted(path.name for path in run.iterdir() if path.name.startswith(".")) == []


def test_cli_publish_dry_run_writes_the_upload_folder_and_a_card_that_round_trips(lora_run, tmp_path):
    from huggingface_hub import ModelCard

    before = _tree_digest(lora_run)
    out = tmp_path / "upload"
    result = run_cli("publish", str(lora_run), "--repo-id", "someone/tiny-lora", "--dry-run", "--out", str(out),
                     env=cli_env(HF_TOKEN=TOKEN))
    files = sorted(p.name for p in out.iterdir())
    expected_files = {"README.md", "adapter_config.json", "adapter_model.safetensors", "config.json", "config.yaml",
                      "metrics.json", "tokenizer.json", "tokenizer_config.json", "training_curves.png"}
    if (lora_run / "eval_validation.json").exists():  # left by `bertpipe evaluate` when that test ran first
        expected_files.add("eval_validation.json")
    assert set(files) == expected_files  # no merged/, log.jsonl, checkpoints
    assert all(name in result.stdout for name in files)
    assert _tree_digest(lora_run) == before
    # The adapter's base is a folder of this machine: loaded from the Hub, nobody else has it (the run stays publishable).
    assert f"is an adapter on the local base model {json.loads((lora_run / 'adapter_config.json').read_text())['base_model_name_or_path']}" \
        in result.stderr and "--merged" in result.stderr

    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and card.data.pipeline_tag == "text-classification"
    assert card.data.language == "en" and card.data.license == "apache-2.0" and "sentiment" in card.data.tags
    assert "PeftModel.from_pretrained" in card.text and 'pipeline("text-classification"' in card.text
    metrics = json.loads((lora_run / "metrics.json").read_text())
    expected = {k.removeprefix("eval_"): v for k, v in metrics.items() if k.startswith("eval_") and k not in ("eval_samples", "eval_runtime")}
    assert {r.metric_name: r.metric_value for r in card.data.eval_results} == pytest.approx(expected)
    types = {r.metric_name: (r.metric_type, r.metric_config) for r in card.data.eval_results}
    assert types["accuracy"] == ("accuracy", None) and types["f1_macro"] == ("f1", "macro")

    # The token was in the environment of train and publish: no written file may hold it.
    for folder in (lora_run, out):
        for path in folder.rglob("*"):
            if path.is_file():
                assert TOKEN.encode() not in path.read_bytes(), path


def test_cli_publish_pushes_the_folder_to_the_hub_api(lora_run):
    before = _tree_digest(lora_run)
    with FakeHub() as hub:
        env = cli_env(HF_TOKEN=TOKEN, HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
        result = run_cli("publish", str(lora_run), "--repo-id", "someone/tiny-lora", "--public", "--revision", "exp-1",
                         "--commit-message", "LoRA r=8", env=env)
    assert hub.repos["someone/tiny-lora"]["visibility"] == "public"
    assert "exp-1" in hub.repos["someone/tiny-lora"]["branches"]
    (commit,) = hub.commits
    assert commit["repo_id"] == "someone/tiny-lora" and commit["revision"] == "exp-1" and commit["summary"] == "LoRA r=8"
    assert commit["files"]["adapter_model.safetensors"] == (lora_run / "adapter_model.safetensors").read_bytes()
    assert not any(name.startswith(("checkpoints", "merged", "best_model")) or name == "log.jsonl" for name in commit["files"])
    assert b"someone/tiny-lora" in commit["files"]["README.md"]
    assert all(r["headers"].get("authorization", r["headers"].get("Authorization")) == f"Bearer {TOKEN}"
               for r in hub.requests if r["method"] == "POST")
    assert "uploaded to" in result.stdout
    assert _tree_digest(lora_run) == before


def test_cli_publish_without_network_fails_fast_with_one_clear_error(lora_run):
    before = _tree_digest(lora_run)
    started = time.perf_counter()
    env = cli_env(HF_TOKEN=TOKEN, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="0")  # nothing listens on port 9
    result = run_cli("publish", str(lora_run), "--repo-id", "someone/tiny-lora", env=env, check=False)
    assert result.returncode == 2
    assert "cannot be reached" in result.stderr and "Traceback" not in result.stderr
    assert time.perf_counter() - started < 60  # no retry loop (interpreter start-up dominates)
    assert _tree_digest(lora_run) == before


def test_publish_without_token_is_a_publish_error(lora_run, monkeypatch, tmp_path):
    from pipelines.outputs import load_saved_config
    from pipelines.config_loading import load_config
    from pipelines.publish import PublishError, publish_run
    from tasks import get_task

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login either
    config = load_config(None, [], base=load_saved_config(lora_run) | {"classification": {}})
    with pytest.raises(PublishError, match="HF_TOKEN"):
        publish_run(lora_run, config, get_task("classification")(config), repo_id="someone/tiny-lora")
    with pytest.raises(PublishError, match="OWNER/NAME"):
        publish_run(lora_run, config, get_task("classification")(config), repo_id="no-owner", dry_run=True, out=tmp_path / "x")


def test_publish_dry_run_out_that_is_a_file_names_out_and_keeps_the_file(lora_run, tmp_path):
    from pipelines.config_loading import load_config
    from pipelines.outputs import load_saved_config
    from pipelines.publish import PublishError, publish_run
    from tasks import get_task

    config = load_config(None, [], base=load_saved_config(lora_run) | {"classification": {}})
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(PublishError, match=rf"--out {notes} is a file, not a folder"):
        publish_run(lora_run, config, get_task("classification")(config), repo_id="someone/tiny-lora", dry_run=True, out=notes)
    assert notes.read_text() == "mine"


def test_cli_training_from_an_adapter_run_with_another_label_count_gets_a_new_head_and_says_so(lora_run, tmp_path):
    """As from a full checkpoint: a classifier of three labels on the two-label adapter run (it was refused)."""
    rows = [{"sentence": f"{word} film", "label": "abc"[index % 3]} for index, word in enumerate(["good", "bad", "fine"] * 8)]
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = write_config(tmp_path / "three.yaml", f"""task: classification
output_dir: {tmp_path / 'three'}
model: {{name_or_path: {lora_run}}}
data: {{files: {{train: {data}, validation: {data}}}, text_column: sentence, label_column: label, max_seq_length: 16}}
train: {{max_steps: 2, batch_size: 8, mixed_precision: "no", eval_steps: null, save_steps: null}}
""")
    result = run_cli("train", str(config))
    assert "has a head trained for labels ['negative', 'positive']; a new head is initialised for labels ['a', 'b', 'c']" in result.stderr
    assert json.loads((tmp_path / "three" / "config.json").read_text())["id2label"] == {"0": "a", "1": "b", "2": "c"}


def _masked_lm_checkpoint(tiny_bert: Path, folder: Path) -> Path:
    """tiny_bert saved as a masked LM: no pooler, which a sequence classifier then initialises at random."""
    from transformers import BertForMaskedLM

    return resaved_checkpoint(BertForMaskedLM.from_pretrained(tiny_bert), tiny_bert, folder)


def test_cli_lora_with_modules_to_save_named_still_saves_what_the_checkpoint_lacked(tmp_path, tiny_bert, sentiment_files):
    # modules_to_save=[classifier] replaced the default list, and with it the pooler the masked-LM checkpoint lacks:
    # random on every load, frozen, unsaved, so evaluate (0.23 against 0.31), predict and pipeline() each scored otherwise.
    base = _masked_lm_checkpoint(tiny_bert, tmp_path / "mlm-base")
    config = lora_config(tmp_path, base, sentiment_files)
    run_cli("train", str(config), "train.max_steps=6", "model.peft.modules_to_save=[classifier]")
    saved = load_file(tmp_path / "run" / "adapter_model.safetensors")
    assert any(".pooler.dense." in key for key in saved), sorted(saved)
    run_cli("evaluate", str(tmp_path / "run"))
    trained, evaluated = (json.loads((tmp_path / "run" / name).read_text()) for name in ("metrics.json", "eval_validation.json"))
    scores = [key for key in trained if key.startswith("eval_") and isinstance(trained[key], float) and "runtime" not in key
              and "per_second" not in key]
    assert scores and all(evaluated[key] == pytest.approx(trained[key], abs=1e-6) for key in scores), (trained, evaluated)


@pytest.mark.parametrize("key, value", [("target_modules", "[qurey, value]"), ("modules_to_save", "[classifier, poolr]")])
def test_cli_peft_module_name_matching_no_module_is_refused_though_others_match(key, value, tmp_path, tiny_bert, sentiment_files):
    # peft refuses a list only when none of it matches: [qurey, value] adapted value alone, exit 0.
    result = run_cli("train", str(lora_config(tmp_path, tiny_bert, sentiment_files)), f"model.peft.{key}={value}", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    typo = value.strip("[]").split(", ")[0 if key == "target_modules" else 1]
    assert f"model.peft.{key}: ['{typo}'] name no module of BertForSequenceClassification" in result.stderr
    assert not (tmp_path / "run").exists()


def test_cli_a_new_adapter_on_an_adapter_run_is_refused_pointing_at_the_merged_model(lora_run, tmp_path, sentiment_files):
    # The new adapter recorded the adapter run as its base: it trained, saved, and could never be loaded again.
    config = lora_config(tmp_path, lora_run, sentiment_files)
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"model.name_or_path={lora_run} is an adapter run" in result.stderr and f"model.name_or_path={lora_run / 'merged'}" in result.stderr
    run_cli("train", str(config), f"model.name_or_path={lora_run / 'merged'}", "train.max_steps=2")  # as the message says
    run_cli("evaluate", str(tmp_path / "run"))


def test_cli_an_adapter_whose_local_base_changed_since_training_is_refused(tmp_path, tiny_bert, sentiment_files):
    # A base run trained again in place (overwrite=true): the adapter served other predictions, exit 0.
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_bert, base)
    run_cli("train", str(lora_config(tmp_path, base, sentiment_files)), "train.max_steps=2")
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\n")
    run_cli("predict", str(tmp_path / "run"), "--input", str(texts), "--output", str(tmp_path / "before.jsonl"))
    # A file written into the base folder since (predictions, notes) changes nothing the adapter is applied to.
    (base / "predictions.jsonl").write_text('{"label": "positive"}\n')
    (base / "README.md").write_text("notes\n")
    run_cli("predict", str(tmp_path / "run"), "--input", str(texts), "--output", str(tmp_path / "again.jsonl"))
    from transformers import BertModel

    changed = BertModel.from_pretrained(base)
    torch.nn.init.normal_(changed.encoder.layer[0].attention.self.query.weight)
    changed.save_pretrained(base)
    result = run_cli("predict", str(tmp_path / "run"), "--input", str(texts), "--output", str(tmp_path / "after.jsonl"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not (tmp_path / "after.jsonl").exists()
    assert f"adapts the base model in {base}, whose weights or config changed since the adapter was trained" in result.stderr


def test_cli_merge_out_inside_another_run_is_refused_and_an_unfinished_run_is_named_so(lora_run, tmp_path):
    # merge --out OTHER_RUN/merged (not there yet) passed as a new folder: the other run's export and publish --merged
    # then served this run's weights under its own metrics.
    import shutil

    other = tmp_path / "other"
    shutil.copytree(lora_run, other, ignore=shutil.ignore_patterns("merged", "checkpoints"))
    for out in (other / "merged", other / "checkpoints" / "x", lora_run / "elsewhere"):
        result = run_cli("merge", str(lora_run), "--out", str(out), check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr and "is inside the run" in result.stderr, result.stderr
        assert not out.exists()
    unfinished = tmp_path / "unfinished"
    shutil.copytree(lora_run, unfinished, ignore=shutil.ignore_patterns("merged", "metrics.json"))
    result = run_cli("merge", str(unfinished), check=False)
    assert result.returncode == 2 and "holds no finished run (no metrics.json)" in result.stderr and "already a full model" not in result.stderr
