"""bertpipe's own BERT through the CLI: convert a transformers BERT, draw attention, fine-tune it."""

from __future__ import annotations

import json
import math

import torch

from tasks.cli import main
from tests.conftest import classification_config, run_cli


def test_cli_convert_bert_then_attention_then_train(tmp_path, tiny_bert, sentiment_files, capsys):
    from transformers import AutoModel, AutoTokenizer

    converted = tmp_path / "ours"
    assert main(["convert-bert", str(tiny_bert), str(converted)]) == 0
    ours = AutoModel.from_pretrained(converted).eval()
    theirs = AutoModel.from_pretrained(tiny_bert).eval()
    assert ours.config.model_type == "bertpipe_bert"
    batch = AutoTokenizer.from_pretrained(tiny_bert)(["the film was good", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        difference = (ours(**batch).last_hidden_state - theirs(**batch).last_hidden_state).abs().max().item()
    assert difference <= 1e-5

    heatmaps = tmp_path / "heatmaps"
    assert main(["attention", str(converted), "the film was good", "--out", str(heatmaps)]) == 0
    assert len(list(heatmaps.glob("*.png"))) == ours.config.num_hidden_layers
    drawn = {path: path.read_bytes() for path in heatmaps.iterdir()}
    capsys.readouterr()
    # Bad input is one message, exit 2, and leaves earlier heatmaps as they were: a folder without a model,
    # a sentence past the model's positions (an IndexError deep in the embeddings), an --out that holds files.
    (tmp_path / "empty").mkdir()
    for arguments, named in [([str(tmp_path / "empty"), "good", "--out", str(tmp_path / "new")], str(tmp_path / "empty")),
                             ([str(converted), "good " * 600, "--out", str(tmp_path / "new")], "max_position_embeddings"),
                             ([str(converted), "bad", "--out", str(heatmaps)], "--out")]:
        assert main(["attention", *arguments]) == 2
        error = capsys.readouterr().err
        assert named in error and "Traceback" not in error, error
    assert {path: path.read_bytes() for path in heatmaps.iterdir()} == drawn

    # A run folder of its own: training into the converted model's folder is refused (it is not a run).
    config = classification_config(tmp_path, converted, sentiment_files, run_name="ours-run")
    run_cli("train", str(config))
    metrics = json.loads((tmp_path / "ours-run" / "metrics.json").read_text())
    assert metrics["eval_accuracy"] >= 0.8
    assert json.loads((tmp_path / "ours-run" / "config.json").read_text())["model_type"] == "bertpipe_bert"


# ----- every other task with bertpipe's own models (issue 8) ------------------------------------
# Same data and settings as each task's own CLI test on a transformers BERT, with the model swapped
# for bertpipe's: the same quality bar must hold.


def convert_to_ours(source, destination):
    assert main(["convert-bert", str(source), str(destination)]) == 0
    return destination


def saved_model_type(run_dir) -> str:
    return json.loads((run_dir / "config.json").read_text())["model_type"]


def test_cli_ner_with_our_bert(tmp_path):
    from transformers import pipeline

    from tests.test_cli_ner import toy_ner_config, toy_ner_model

    config = toy_ner_config(tmp_path, convert_to_ours(toy_ner_model(tmp_path), tmp_path / "ours"))
    run_cli("train", str(config))
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert saved_model_type(run) == "bertpipe_bert"
    assert metrics["eval_f1"] >= 0.9, metrics
    entities = pipeline("token-classification", model=str(run), aggregation_strategy="simple")("alice smith met bruno in paris")
    assert [(e["entity_group"], e["word"]) for e in entities] == [("PER", "alice smith"), ("PER", "bruno"), ("LOC", "paris")]


def test_cli_qa_with_our_bert(tmp_path):
    from tests.test_cli_qa import NAMES, qa_config, write_data
    from tests.conftest import build_tiny_bert

    ours = convert_to_ours(build_tiny_bert(tmp_path / "tiny", vocab_words=NAMES * 5), tmp_path / "ours")
    run_cli("train", str(qa_config(tmp_path, ours, write_data(tmp_path, unanswerable=0.0), v2=False)))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved_model_type(tmp_path / "run") == "bertpipe_bert"
    assert metrics["eval_exact_match"] >= 80, metrics


def test_cli_from_scratch_model_type_without_the_tasks_head_is_refused_naming_it(tmp_path):
    """bertpipe_bert has no pretraining head (next-sentence prediction): transformers' "Unrecognized configuration
    class" came as a traceback with exit status 1, after the data was read."""
    from tests.test_cli_mlm import corpus_file, pretrain_config

    config = pretrain_config(tmp_path, corpus_file(tmp_path))
    result = run_cli("train", str(config), "model.model_type=bertpipe_bert", "mlm.next_sentence_prediction=true", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "model.model_type=bertpipe_bert has no model of the kind this task builds (AutoModelForPreTraining" in result.stderr
    assert not (tmp_path / "run").exists()


def test_cli_mlm_from_scratch_with_our_bert(tmp_path):
    from tests.test_cli_mlm import corpus_file, pretrain_config

    config = pretrain_config(tmp_path, corpus_file(tmp_path))
    run_cli("train", str(config), "model.model_type=bertpipe_bert", "train.num_epochs=3", "train.eval_on_start=true")
    run = tmp_path / "run"
    assert saved_model_type(run) == "bertpipe_bert"
    start = json.loads((run / "log.jsonl").read_text().splitlines()[0])
    trained = json.loads((run / "metrics.json").read_text())["eval_perplexity"]
    assert start["step"] == 0 and start["eval_perplexity"] > 50  # near uniform over the ~160-token vocabulary
    # The card's code runs in a fresh interpreter: transformers knows bertpipe_bert only once `import models` ran.
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT
    from tests.families.matrix import card_code

    code = card_code(run)
    assert code.startswith("import models")
    ran = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "score" in ran.stdout, ran.stderr[-2000:]
    assert trained < 0.5 * start["eval_perplexity"], (start, trained)


def test_cli_translation_with_our_transformer(tmp_path, tiny_bert):
    from transformers import AutoTokenizer

    from models import BertpipeTransformerConfig, BertpipeTransformerForConditionalGeneration
    from tests.conftest import write_jsonl
    from tests.tasks.translation_data import copy_rows
    from tests.test_cli_translation import translation_config

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = BertpipeTransformerConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_decoder_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=tokenizer.cls_token_id,
    )
    torch.manual_seed(0)
    checkpoint = tmp_path / "ours"
    BertpipeTransformerForConditionalGeneration(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    files = {
        "train": write_jsonl(tmp_path / "train.jsonl", copy_rows(240, seed=1)),
        "validation": write_jsonl(tmp_path / "validation.jsonl", copy_rows(21, seed=2)),
    }
    run_cli("train", str(translation_config(tmp_path, checkpoint, files)))
    run = tmp_path / "run"
    assert saved_model_type(run) == "bertpipe_transformer"
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"eval_bleu", "eval_chrf", "eval_gen_len"} <= set(metrics)
    losses = [record["loss"] for record in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "loss" in record]
    # A from-scratch 1-layer model learns the target side's statistics within this budget (far below
    # the uniform guess's ln |V|); learning to copy through cross-attention is tested on the model
    # itself (tests/models/test_models_transformer.py).
    assert losses[-1] < 0.5 * math.log(len(tokenizer)), losses

    from tasks import load_tasks

    load_tasks()  # registers the "translation" pipeline
    from transformers import pipeline

    generated = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()][:4]
    translator = pipeline("translation", model=str(run), device="cpu")
    assert type(translator.model).__name__ == "BertpipeTransformerForConditionalGeneration"
    served = translator([row["source"] for row in generated])
    assert [item["translation_text"] for item in served] == [row["hypothesis"] for row in generated]


def test_cli_convert_bert_leaves_no_half_destination_and_no_copy_of_it_inside_the_source(tmp_path, tiny_bert, capsys):
    """Written in place: a conversion failing at the side files left the destination half-filled (the rerun refused it
    as not empty), and a destination inside the source got a copy of itself from the side-file copy."""
    import shutil

    source = shutil.copytree(tiny_bert, tmp_path / "source")
    (source / "README.md").symlink_to(tmp_path / "nowhere.md")  # a side file that cannot be copied
    assert main(["convert-bert", str(source), str(tmp_path / "converted")]) == 2
    assert "convert-bert" in capsys.readouterr().err
    assert not (tmp_path / "converted").exists() and not list(tmp_path.glob(".converted*"))

    (source / "README.md").unlink()
    assert main(["convert-bert", str(source), str(source / "ours")]) == 0
    assert (source / "ours" / "model.safetensors").is_file() and (source / "ours" / "tokenizer_config.json").is_file()
    assert not (source / "ours" / "ours").exists() and not list(source.glob(".ours*"))


def test_cli_convert_bert_of_a_run_takes_its_model_and_tokenizer_not_the_runs_own_files(tmp_path, tiny_bert, sentiment_files):
    """The run's config, metrics, log, card and checkpoints were copied as side files: the converted folder passed for a
    finished run (train refused it as one), its card described the run's model, and it carried every checkpoint."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipelines.outputs import is_run_dir

    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=4, save_steps=2, eval_steps=None,
                                   mixed_precision="no")
    run_cli("train", str(config))
    run = tmp_path / "run"
    assert (run / "checkpoints").is_dir() and (run / "README.md").is_file()
    # Folders bertpipe writes the run's model into, inside the run under names of the user's: carried along, they put
    # the original weights (and a run's config and metrics) into the converted folder.
    assert main(["publish", str(run), "--repo-id", "me/tiny", "--dry-run", "--out", str(run / "upload")]) == 0
    assert (run / "upload" / "model.safetensors").is_file()
    (run / "exported").mkdir()
    (run / "exported" / "model.onnx").write_bytes(b"onnx")  # the markers of an export folder (pipelines/onnx_model.py)
    (run / "exported" / "export.json").write_text("{}")
    converted, back = tmp_path / "ours", tmp_path / "back"
    assert main(["convert-bert", str(run), str(converted)]) == 0
    assert main(["convert-bert", "--reverse", str(converted), str(back)]) == 0
    for folder in (converted, back):
        assert sorted(path.name for path in folder.iterdir()) == [
            "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"], folder
        assert not is_run_dir(folder)

    batch = AutoTokenizer.from_pretrained(run)(["the film was good", "bad"], padding=True, return_tensors="pt")
    logits = {}
    for folder in (run, converted, back):
        model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        with torch.no_grad():
            logits[folder.name] = model(**batch).logits
    assert type(AutoModelForSequenceClassification.from_pretrained(converted)).__name__.startswith("Bertpipe")
    torch.testing.assert_close(logits["ours"], logits["run"], atol=1e-5, rtol=0)
    torch.testing.assert_close(logits["back"], logits["run"], atol=1e-5, rtol=0)


def test_cli_convert_bert_of_a_qa_run_leaves_the_tasks_own_reports_behind(tmp_path):
    """The task's own run files (QA's n-best answers and predictions) were carried into the converted folder."""
    from tests.conftest import build_tiny_bert
    from tests.test_cli_qa import NAMES, qa_config, write_data

    run_cli("train", str(qa_config(tmp_path, build_tiny_bert(tmp_path / "tiny", vocab_words=NAMES * 5), write_data(tmp_path, unanswerable=0.0),
                                   v2=False)), "train.max_steps=2")
    run = tmp_path / "run"
    assert (run / "nbest_predictions.json").is_file() and (run / "predictions.json").is_file()
    assert main(["convert-bert", str(run), str(tmp_path / "ours")]) == 0
    assert sorted(path.name for path in (tmp_path / "ours").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_cli_a_model_built_here_is_refused_when_its_vocabulary_or_padding_is_not_the_tokenizers(tmp_path, tiny_bert, sentiment_files):
    """From scratch for classification (MLM sized itself already): a vocab_size below the tokenizer's ended the first batch
    in an IndexError traceback (exit 1); a pad id other than the tokenizer's left that token's row at zero, untrained."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=2, eval_steps=None, mixed_precision="no")
    scratch = ["model.name_or_path=null", f"model.tokenizer_name_or_path={tiny_bert}"]
    shape = "hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32"
    for architecture, message in (
        (f"{{vocab_size: 20, {shape}}}", f"model.architecture.vocab_size: the tokenizer gives {len(tokenizer)} token ids, the "
                                         f"model's embedding has 20 rows; give it vocab_size: {len(tokenizer)}"),
        (f"{{vocab_size: {len(tokenizer)}, pad_token_id: 3, {shape}}}",
         f"model.architecture.pad_token_id: a model built here pads with id 3, the tokenizer with id {tokenizer.pad_token_id}"),
    ):
        result = run_cli("train", str(config), *scratch, f"model.architecture={architecture}", check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert message in result.stderr, result.stderr[-2000:]
        assert not (tmp_path / "run").exists()
    run_cli("train", str(config), *scratch, f"model.architecture={{vocab_size: {len(tokenizer)}, {shape}}}")


def test_cli_a_family_that_cannot_run_the_inputs_exits_2_naming_it(tmp_path, tiny_bert, sentiment_files):
    """Nystromformer runs inputs of exactly segment_means_seq_len pieces: its first forward pass (the padding probe)
    ended in a RuntimeError traceback, exit status 1."""
    from transformers import AutoTokenizer, NystromformerConfig, NystromformerForSequenceClassification

    checkpoint = tmp_path / "nystromformer"
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    NystromformerForSequenceClassification(NystromformerConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, segment_means_seq_len=8, num_landmarks=4,
    )).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    config = classification_config(tmp_path, checkpoint, sentiment_files, max_steps=2, mixed_precision="no")
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "the nystromformer model cannot run these inputs: RuntimeError" in result.stderr
    assert not any((tmp_path / "run").glob("*"))
