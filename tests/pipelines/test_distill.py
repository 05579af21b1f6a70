"""Knowledge distillation (pipelines/distill.py): layer choice, the soft-target loss, the config
section, and teacher -> student runs for classification, NER and QA through the one training loop
(QA through the ``bertpipe distill`` entry point, then ``bertpipe predict`` and ``pipeline()`` on the student).

The runs are tiny BERTs trained in-process in fp32 (pinned: KL values are compared). "Lowers the KL"
is measured against the student's own start: the teacher cut down to the chosen layers.
"""

from __future__ import annotations

import re

import json
from pathlib import Path

import pytest
import torch

from pipelines.config import ConfigError
from pipelines.config_loading import load_config
from pipelines.distill import (
    DistillError, distill_config, hidden_layer_map, mean_teacher_kl, shrink_to_layers, soft_target_kl, teacher_layer_choice,
)
from tasks import get_task
from tests.conftest import build_tiny_bert, classification_config, sentiment_rows
from tests.test_cli_ner import ner_sentences, toy_ner_config, toy_ner_model
from tests.test_cli_qa import NAMES, QUESTION, qa_config, synthetic_squad, write_data

PINNED = ["train.mixed_precision='no'", "train.torch_num_threads=1", "train.eval_steps=null"]


def options_for(name: str):
    return get_task(name).Options


def train_config(config):
    from pipelines.train import train

    train(config, get_task(config.task)(config))
    return Path(config.output_dir)


def test_distill_teacher_layer_choice_is_every_other_layer_by_default():
    assert teacher_layer_choice(12) == [0, 2, 4, 6, 8, 10]  # DistilBERT
    assert teacher_layer_choice(12, num_layers=3) == [0, 4, 8]
    assert teacher_layer_choice(2) == [0]
    assert teacher_layer_choice(12, layers=[1, 11]) == [1, 11]
    with pytest.raises(DistillError, match="exceeds"):
        teacher_layer_choice(2, num_layers=3)
    with pytest.raises(DistillError, match="layers 0..5"):
        teacher_layer_choice(6, layers=[0, 6])
    assert hidden_layer_map(3, 12) == [(0, 0), (1, 4), (2, 8), (3, 12)]


def test_distill_soft_target_kl_matches_the_formula():
    student, teacher = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[0.0, 2.0, 0.0]])
    temperature = 2.0
    p = torch.softmax(teacher / temperature, -1)
    q = torch.softmax(student / temperature, -1)
    expected = float((p * (p / q).log()).sum()) * temperature**2
    assert float(soft_target_kl(student, teacher, temperature)) == pytest.approx(expected, rel=1e-6)
    assert float(soft_target_kl(teacher, teacher, temperature)) == pytest.approx(0.0, abs=1e-7)
    rows = torch.tensor([False])
    assert float(soft_target_kl(student, teacher, temperature, rows)) == 0.0


def test_distill_shrink_keeps_the_chosen_teacher_layers(tmp_path):
    from transformers import AutoModelForSequenceClassification

    teacher = AutoModelForSequenceClassification.from_pretrained(build_tiny_bert(tmp_path / "tiny"), num_labels=2)
    student = shrink_to_layers(teacher, [1])
    assert student.config.num_hidden_layers == 1 and teacher.config.num_hidden_layers == 2
    torch.testing.assert_close(student.bert.encoder.layer[0].attention.self.query.weight, teacher.bert.encoder.layer[1].attention.self.query.weight)
    torch.testing.assert_close(student.classifier.weight, teacher.classifier.weight)
    torch.testing.assert_close(student.bert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight)


@pytest.fixture(scope="module")
def classification_teacher(tmp_path_factory, tiny_bert, sentiment_files):
    root = tmp_path_factory.mktemp("distill-cls")
    path = classification_config(root, tiny_bert, sentiment_files, run_name="teacher")
    train_config(load_config(path, [*PINNED, "train.max_steps=96"], options_for))
    return root, path, root / "teacher"


def test_distill_config_section_is_validated(classification_teacher, tmp_path):
    root, path, teacher = classification_teacher
    config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "distill.alpha=0.7"], options_for)
    assert config.distill.alpha == 0.7 and config.distill.init == "teacher" and config.model.name_or_path == str(teacher)
    assert config.to_yaml_dict()["distill"]["teacher"] == str(teacher)
    assert "distill" not in load_config(path, [], options_for).to_yaml_dict()
    with pytest.raises(ConfigError, match="distill.alphaa.*did you mean 'distill.alpha'"):
        distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "distill.alphaa=0.7"], options_for)
    with pytest.raises(ConfigError, match="distill.alpha"):
        distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "distill.alpha=1.5"], options_for)
    with pytest.raises(ConfigError, match="need distill.init=teacher"):
        distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "distill.init=model", "distill.num_layers=1"], options_for)
    with pytest.raises(ConfigError, match="another output_dir"):
        distill_config(str(teacher), str(path), [f"output_dir={teacher}"], options_for)
    with pytest.raises(ConfigError, match="model.name_or_path must be"):
        load_config(path, [f"output_dir={tmp_path / 's'}", f"distill.teacher={teacher}"], options_for)


def config_with(path: Path, folder: Path, **sections) -> Path:
    """A copy of the config at ``path`` in ``folder`` with top-level ``sections`` replaced."""
    import yaml

    tree = {**yaml.safe_load(path.read_text()), **sections}
    folder.mkdir(parents=True, exist_ok=True)
    written = folder / path.name
    written.write_text(yaml.safe_dump(tree))
    return written


@pytest.mark.parametrize("spelling", ["dotted override", "section override", "section override with other keys", "config file"])
def test_distill_init_model_trains_the_configs_student_however_init_is_written(classification_teacher, tmp_path, spelling):
    """``distill={init: model}`` is ``distill.init=model`` (the README's section mapping), and so is the config
    file's ``distill: {init: model}``: the student is the config's model.name_or_path with its own tokenizer,
    never the teacher run, which config.yaml would not have shown under ``init: model``."""
    root, path, teacher = classification_teacher
    student = load_config(path, [], options_for).model.name_or_path
    overrides = {"dotted override": ["distill.init=model"], "section override": ["distill={init: model}"],
                 "section override with other keys": ["distill={init: model, alpha: 0.7}"], "config file": []}[spelling]
    if spelling == "config file":
        path = config_with(path, tmp_path / "file", distill={"init": "model"})
    config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", *overrides], options_for)
    assert config.distill.init == "model" and config.distill.teacher == str(teacher)
    assert config.model.name_or_path == student != str(teacher) and config.model.tokenizer_name_or_path is None
    assert config.distill.alpha == (0.7 if "other keys" in spelling else 0.5)


def test_distill_init_teacher_given_as_a_section_mapping_replaces_the_files_init_model(classification_teacher, tmp_path):
    """The command line's ``distill={init: teacher}`` wins over the file's ``init: model`` as a dotted key does: the
    student is cut from the teacher, and the file's other distill keys stay."""
    root, path, teacher = classification_teacher
    path = config_with(path, tmp_path / "file", distill={"init": "model", "alpha": 0.7})
    for override in ("distill.init=teacher", "distill={init: teacher}"):
        config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", override], options_for)
        assert config.distill.init == "teacher" and config.model.name_or_path == str(teacher), override
        assert config.distill.alpha == 0.7


def test_distill_init_teacher_refuses_a_student_named_on_the_command_line_instead_of_dropping_it(classification_teacher, tmp_path):
    """The config file's model gives way to the teacher (the task config's usual checkpoint), but one the user typed
    would have been replaced by the teacher without a word."""
    root, path, teacher = classification_teacher
    checkpoint = load_config(path, [], options_for).model.name_or_path
    for override in (f"model.name_or_path={checkpoint}", f"model={{name_or_path: {checkpoint}}}"):
        with pytest.raises(ConfigError, match=rf"model.name_or_path={re.escape(checkpoint)} \(the command line\): with distill.init=teacher "
                                              r"the student is the teacher's own layers; .*add distill.init=model"):
            distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", override], options_for)
    config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "model.name_or_path=null"], options_for)
    assert config.model.name_or_path == str(teacher)


def test_distill_init_model_from_scratch_reads_the_teachers_tokenizer_unless_a_model_section_names_a_student(classification_teacher, tmp_path):
    """A from-scratch student (no model.name_or_path) reads its inputs with the teacher's tokenizer. A student
    checkpoint or tokenizer named on the command line, as a dotted key or in a ``model={...}`` mapping, keeps its own."""
    root, path, teacher = classification_teacher
    checkpoint = load_config(path, [], options_for).model.name_or_path
    path = config_with(path, tmp_path / "file", model={"architecture": {"num_hidden_layers": 1}})

    def student(*overrides):
        config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", *overrides], options_for)
        assert config.distill.init == "model", overrides
        return config.model.name_or_path, config.model.tokenizer_name_or_path

    for init in ("distill.init=model", "distill={init: model}"):
        assert student(init) == (None, str(teacher))
        assert student(init, f"model.name_or_path={checkpoint}") == (checkpoint, None)
        assert student(init, f"model={{name_or_path: {checkpoint}}}") == (checkpoint, None)
        assert student(init, f"model={{tokenizer_name_or_path: {checkpoint}}}") == (None, checkpoint)
    # The mapping set model.name_or_path and kept the file's architecture, as the README's section override does.
    config = distill_config(str(teacher), str(path), [f"output_dir={tmp_path / 's'}", "distill={init: model}"], options_for)
    assert config.model.architecture == {"num_hidden_layers": 1}


def _kl_batches(tokenizer, texts, **kwargs):
    return [tokenizer(texts[i : i + 16], padding=True, truncation=True, max_length=32, return_tensors="pt", **kwargs) for i in range(0, len(texts), 16)]


def random_student(folder: Path, teacher_dir: Path, auto_class=None) -> Path:
    """A 1-layer student with random weights (head included) and the teacher's tokenizer and labels."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(teacher_dir)
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    (auto_class or AutoModelForSequenceClassification).from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(teacher_dir).save_pretrained(folder)
    return folder


def test_distill_teacher_with_the_labels_in_another_order_gives_each_label_its_own_soft_target(classification_teacher, tmp_path):
    """The student lists the teacher's labels in another order (classification.label_names, or a Hub ClassLabel
    order against a local file's): each soft target is the teacher's score of that same label. Other labels are
    refused, saying how to fix it."""
    from transformers import AutoModelForSequenceClassification

    from pipelines.distill import build_distillation_model

    root, path, teacher_dir = classification_teacher

    def distillation(label_names: str):
        config = distill_config(str(teacher_dir), str(path), [*PINNED, f"output_dir={tmp_path / 'student'}", "distill.alpha=1.0",
                                                             f"classification.label_names={label_names}"], options_for)
        task = get_task(config.task)(config)
        raw = task.load()
        task.build_tokenizer(raw)
        return config, task, raw, build_distillation_model(task.build_model(raw), config, task)

    config, task, raw, model = distillation("[positive,negative]")
    assert model.student.config.id2label == {0: "positive", 1: "negative"}
    features = task.preprocess(raw["train"].select(range(8)), train=True)
    batch = task.collator(train=True)([features[index] for index in range(8)])
    outputs = model.train()(**batch)
    teacher = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()
    assert teacher.config.id2label == {0: "negative", 1: "positive"}
    with torch.no_grad():
        soft_targets = teacher(**{key: value for key, value in batch.items() if key != "labels"}).logits[:, [1, 0]]
    expected = soft_target_kl(outputs.logits.detach(), soft_targets, config.distill.temperature)
    assert float(outputs.loss.detach()) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)

    with pytest.raises(DistillError, match=r"predicts labels \['negative', 'positive'\].*set classification.label_names to the teacher's"):
        distillation("[negative,neutral,positive]")


def test_distill_student_tokenizer_that_reads_text_otherwise_is_refused_though_its_vocabulary_is_the_teachers(classification_teacher, tmp_path):
    """Only the vocabularies were compared: a cased copy of the teacher's uncased tokenizer passed, and the teacher was
    fed [UNK] for three of the four words of "The FILM was Superb" during the whole distillation."""
    import json

    from pipelines.distill import build_distillation_model

    root, path, teacher_dir = classification_teacher
    student_dir = random_student(tmp_path / "cased", teacher_dir)
    tokenizer_file = student_dir / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text())
    assert tokenizer["normalizer"]["lowercase"] is True
    tokenizer["normalizer"]["lowercase"] = False
    tokenizer_file.write_text(json.dumps(tokenizer))
    settings = json.loads((student_dir / "tokenizer_config.json").read_text())
    (student_dir / "tokenizer_config.json").write_text(json.dumps({**settings, "do_lower_case": False}))

    def distillation(student_tokenizer):
        config = distill_config(str(teacher_dir), str(path), [*PINNED, f"output_dir={tmp_path / 'student'}", "distill.init=model",
                                                             f"model.name_or_path={student_dir}",
                                                             f"model.tokenizer_name_or_path={student_tokenizer}"], options_for)
        task = get_task(config.task)(config)
        raw = task.load()
        task.build_tokenizer(raw)
        return build_distillation_model(task.build_model(raw), config, task)

    with pytest.raises(DistillError, match=r"reads text otherwise than the teacher's .*'The FILM was Superb.*model.tokenizer_name_or_path="):
        distillation(student_dir)
    assert distillation(teacher_dir).student.config.num_hidden_layers == 1  # the teacher's own tokenizer: accepted


def test_distill_temperature_for_a_regression_teacher_is_refused(tmp_path, tiny_bert):
    # Matched by MSE, a regression head ignored the temperature: T=1 and T=10 gave the same student, bit for bit.
    from pipelines.distill import build_distillation_model
    from tests.conftest import write_jsonl

    rows = [{"sentence": row["sentence"], "label": 4.5 if row["label"] == "positive" else 0.5} for row in sentiment_rows(64, seed=4)]
    files = {split: write_jsonl(tmp_path / f"{split}.jsonl", rows) for split in ("train", "validation")}
    path = classification_config(tmp_path, tiny_bert, files, run_name="teacher")
    teacher = train_config(load_config(path, [*PINNED, "train.max_steps=2"], options_for))

    def distillation(*overrides):
        config = distill_config(str(teacher), str(path), [*PINNED, f"output_dir={tmp_path / 'student'}", *overrides], options_for)
        task = get_task(config.task)(config)
        raw = task.load()
        task.build_tokenizer(raw)
        return build_distillation_model(task.build_model(raw), config, task)

    with pytest.raises(DistillError, match="distill.temperature=3.0: a regression head .* drop distill.temperature"):
        distillation("distill.temperature=3")
    assert distillation().student.config.problem_type == "regression"


def _distillation(teacher, path, tmp_path, *overrides):
    from pipelines.distill import build_distillation_model

    config = distill_config(str(teacher), str(path), [*PINNED, f"output_dir={tmp_path / 'student'}", *overrides], options_for)
    task = get_task(config.task)(config)
    raw = task.load()
    task.build_tokenizer(raw)
    return build_distillation_model(task.build_model(raw), config, task)


def test_distill_teacher_of_another_problem_type_is_refused(classification_teacher, tmp_path):
    """A single-label teacher's softmax logits were read through sigmoids for a multi-label student (and a multi-label
    teacher's sigmoids as one softmax), with exit status 0: only the label names were compared."""
    from tests.conftest import write_jsonl

    root, path, teacher = classification_teacher
    rows = [{"sentence": row["sentence"], "label": [row["label"]]} for row in sentiment_rows(32, seed=4)]
    files = {split: write_jsonl(tmp_path / f"{split}.jsonl", rows) for split in ("train", "validation")}
    with pytest.raises(DistillError, match=r"is a single_label_classification model, the student multi_label_classification"):
        _distillation(teacher, path, tmp_path, f"data.files={{train: {files['train']}, validation: {files['validation']}}}")


def test_distill_one_label_multi_label_head_learns_sigmoid_targets_at_the_temperature():
    """A multi-label head of one label took the regression branch: MSE on raw logits, the temperature ignored."""
    from types import SimpleNamespace

    from pipelines.distill import distillation_loss

    student, teacher = torch.tensor([[0.3], [-1.2]]), torch.tensor([[2.0], [-0.5]])
    config = SimpleNamespace(problem_type="multi_label_classification")
    for temperature in (1.0, 4.0):
        targets = torch.sigmoid(teacher / temperature)
        expected = torch.nn.functional.binary_cross_entropy_with_logits(student / temperature, targets) * temperature**2
        loss = distillation_loss(SimpleNamespace(logits=student), SimpleNamespace(logits=teacher), {}, config, temperature)
        assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    regression = distillation_loss(SimpleNamespace(logits=student), SimpleNamespace(logits=teacher), {}, SimpleNamespace(problem_type="regression"), 4.0)
    assert float(regression) == pytest.approx(float(((student - teacher) ** 2).mean()), rel=1e-6)


def test_distill_token_loss_reads_the_labelled_pieces_only():
    """Per token, the soft targets are compared at the pieces that carry a label (continuation pieces and special tokens
    are -100), not at every attended token."""
    from types import SimpleNamespace

    from pipelines.distill import distillation_loss

    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 6, 5, generator=generator), torch.randn(2, 6, 5, generator=generator)
    labels = torch.tensor([[-100, 1, -100, 2, 0, -100], [-100, 3, 4, -100, -100, -100]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    batch = {"labels": labels, "attention_mask": attention}
    loss = distillation_loss(SimpleNamespace(logits=student), SimpleNamespace(logits=teacher), batch, SimpleNamespace(problem_type=None), 2.0)
    assert float(loss) == pytest.approx(float(soft_target_kl(student, teacher, 2.0, labels != -100)), rel=1e-6)
    assert float(loss) != pytest.approx(float(soft_target_kl(student, teacher, 2.0, attention.bool())), rel=1e-3)


def test_distill_ner_student_labelling_every_piece_from_a_first_piece_teacher_is_refused(tmp_path):
    """Soft targets are read at the labelled pieces: a teacher trained on first pieces only gave two thirds of them
    from continuation pieces it never trained on, with exit status 0."""
    from pipelines.errors import DataError

    (tmp_path / "ner").mkdir()
    path = toy_ner_config(tmp_path / "ner", toy_ner_model(tmp_path / "ner"))
    teacher = train_config(load_config(path, [*PINNED, "train.max_steps=2", "ner.label_all_tokens=false",
                                              f"output_dir={tmp_path / 'teacher'}"], options_for))
    with pytest.raises(DataError, match=r"ner.label_all_tokens=true, but the teacher .* trained on each word's first piece only"):
        _distillation(teacher, path, tmp_path)
    assert _distillation(teacher, path, tmp_path, "ner.label_all_tokens=false").teacher is not None


def test_distill_num_layers_and_layers_must_agree(classification_teacher, tmp_path):
    # The layers won: a 2-layer student asked for came out with 1, and config.yaml kept num_layers: 2.
    root, path, teacher = classification_teacher
    overrides = [f"output_dir={tmp_path / 's'}", "distill.layers=[1]"]
    with pytest.raises(ConfigError, match=r"distill.num_layers=2 and distill.layers=\[1\] \(1 layers\) disagree"):
        distill_config(str(teacher), str(path), [*overrides, "distill.num_layers=2"], options_for)
    assert distill_config(str(teacher), str(path), [*overrides, "distill.num_layers=1"], options_for).distill.layers == [1]


def test_distill_data_longer_than_the_teachers_positions_exits_before_training(classification_teacher, tmp_path):
    """A student of its own (init: model) with more positions than the teacher passes the student's length check;
    the teacher reads the same batches, so the run stops before step 1 naming data.max_seq_length and the teacher."""
    import shutil

    from transformers import AutoModelForSequenceClassification

    from pipelines.errors import ModelError

    root, path, teacher_dir = classification_teacher
    short_teacher = tmp_path / "short-teacher"
    shutil.copytree(teacher_dir, short_teacher)
    model = AutoModelForSequenceClassification.from_pretrained(teacher_dir)
    state = model.state_dict()
    state["bert.embeddings.position_embeddings.weight"] = state["bert.embeddings.position_embeddings.weight"][:8]
    model.config.max_position_embeddings = 8
    shortened = AutoModelForSequenceClassification.from_config(model.config)
    shortened.load_state_dict(state, strict=False)
    shortened.save_pretrained(short_teacher)
    start_dir = random_student(tmp_path / "start", teacher_dir)
    student_dir = tmp_path / "student"
    config = distill_config(str(short_teacher), str(path),
                            [*PINNED, f"output_dir={student_dir}", f"model.name_or_path={start_dir}", "distill.init=model"], options_for)
    with pytest.raises(ModelError, match=rf"read by the teacher: input_ids of up to \d+ tokens, but the model has 8 positions .*{short_teacher.name}.*set data.max_seq_length to at most 8"):
        train_config(config)
    # The output_dir rules checked that the folder can be created; the refused command leaves none behind,
    # but an empty folder that was there before stays.
    assert not student_dir.exists()
    student_dir.mkdir()
    with pytest.raises(ModelError, match="read by the teacher"):
        train_config(config)
    assert student_dir.is_dir() and not any(student_dir.iterdir())


def test_distill_student_of_the_teachers_layers_keeps_the_frozen_input_embeddings_as_copied(classification_teacher, tmp_path):
    """distill.init=teacher builds the student anew from the teacher's layers: the freeze applies to that student."""
    from safetensors.torch import load_file

    root, path, teacher_dir = classification_teacher
    student_dir = tmp_path / "student"
    config = distill_config(str(teacher_dir), str(path), [*PINNED, f"output_dir={student_dir}", "train.max_steps=4",
                                                          "model.freeze_input_embeddings=true"], options_for)
    train_config(config)
    teacher, student = load_file(teacher_dir / "model.safetensors"), load_file(student_dir / "model.safetensors")
    words, positions = "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"
    assert torch.equal(student[words], teacher[words])
    assert not torch.equal(student[positions], teacher[positions])
    metrics = json.loads((student_dir / "metrics.json").read_text())
    assert metrics["trainable_params"] == metrics["total_params"] - teacher[words].numel()


def test_distill_classification_lowers_kl_and_the_student_is_a_normal_run(classification_teacher, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    root, path, teacher_dir = classification_teacher
    start_dir = random_student(tmp_path / "start", teacher_dir)
    student_dir = tmp_path / "student"
    config = distill_config(
        str(teacher_dir), str(path),
        [*PINNED, f"output_dir={student_dir}", f"model.name_or_path={start_dir}", "distill.init=model", "train.max_steps=72",
         "distill.alpha=0.9", "distill.temperature=2.0"], options_for,
    )
    train_config(config)
    metrics = json.loads((student_dir / "metrics.json").read_text())

    teacher = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()
    start = AutoModelForSequenceClassification.from_pretrained(start_dir).eval()
    student = AutoModelForSequenceClassification.from_pretrained(student_dir).eval()
    assert student.config.num_hidden_layers == 1 and student.config.id2label == teacher.config.id2label
    assert metrics["total_params"] == sum(p.numel() for p in student.parameters())  # the teacher is not counted
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    batches = _kl_batches(tokenizer, [row["sentence"] for row in sentiment_rows(37, seed=2)])
    before = mean_teacher_kl(start, teacher, batches, teacher.config)
    after = mean_teacher_kl(student, teacher, batches, teacher.config)
    assert after < 0.5 * before, (before, after)

    served = pipeline("text-classification", model=str(student_dir))
    assert served("the film was superb")[0]["label"] in {"negative", "positive"}
    assert "distill" in (student_dir / "config.yaml").read_text()


def test_distill_ner_from_teacher_layers_stays_closer_to_the_teacher_than_fine_tuning(tmp_path):
    """init=teacher (layer 1 of 2) with hidden-state transfer, against the same student trained on the labels alone."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    (tmp_path / "ner").mkdir()
    path = toy_ner_config(tmp_path / "ner", toy_ner_model(tmp_path / "ner"))
    teacher_dir = train_config(load_config(path, [*PINNED, "train.max_steps=60", f"output_dir={tmp_path / 'teacher'}"], options_for))
    students = {}
    for name, alpha, hidden in (("distilled", 0.9, 1.0), ("fine_tuned", 0.0, 0.0)):
        config = distill_config(
            str(teacher_dir), str(path),
            [*PINNED, f"output_dir={tmp_path / name}", "train.max_steps=30", f"distill.alpha={alpha}",
             f"distill.hidden_weight={hidden}", "distill.layers=[1]"], options_for,
        )
        students[name] = AutoModelForTokenClassification.from_pretrained(train_config(config)).eval()

    teacher = AutoModelForTokenClassification.from_pretrained(teacher_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    words = [sentence for sentence, _ in ner_sentences(32, seed=2, long_every=1000)]
    batches = _kl_batches(tokenizer, words, is_split_into_words=True)
    kl = {name: mean_teacher_kl(student, teacher, batches, teacher.config) for name, student in students.items()}
    start = mean_teacher_kl(shrink_to_layers(teacher, [1]), teacher, batches, teacher.config)
    assert students["distilled"].config.num_hidden_layers == 1
    # Taken from the teacher's own layer, the student starts within ~1e-3 of it (with every word piece
    # labelled, the top layer adds little); 30 updates then move it a little either way, so "below the
    # start" is not the claim. The claim: distillation keeps it an order of magnitude closer to the
    # teacher than training the same start on the labels alone.
    assert kl["distilled"] < 0.1 * kl["fine_tuned"] and kl["distilled"] < 0.05, (start, kl)


@torch.no_grad()
def span_kls(student, teacher, batches) -> dict[str, float]:
    """KL(teacher || student) of the start and of the end distribution (T = 1), each over real positions."""
    totals = {"start_logits": 0.0, "end_logits": 0.0}
    for batch in batches:
        padding = ~batch["attention_mask"].bool()
        student_outputs, teacher_outputs = student(**batch), teacher(**batch)
        for name in totals:
            pair = (getattr(outputs, name).masked_fill(padding, -1e4) for outputs in (student_outputs, teacher_outputs))
            totals[name] += float(soft_target_kl(*pair, 1.0)) / len(batches)
    return totals


def test_distill_qa_lowers_start_and_end_kl_and_the_student_predicts_and_serves(tmp_path):
    """``bertpipe distill`` on a QA teacher: a random 1-layer student moves towards the teacher's start
    and end distributions, and its run answers through ``bertpipe predict`` and ``pipeline()`` alike."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

    from tasks import load_tasks
    from tasks.cli import main

    (tmp_path / "qa").mkdir()
    path = qa_config(tmp_path / "qa", build_tiny_bert(tmp_path / "qa" / "tiny", vocab_words=NAMES * 5),
                     write_data(tmp_path / "qa", unanswerable=0.0), v2=False)
    teacher_dir = train_config(load_config(path, [*PINNED, "train.max_steps=48", f"output_dir={tmp_path / 'teacher'}"], options_for))
    start_dir = random_student(tmp_path / "start", teacher_dir, AutoModelForQuestionAnswering)
    student_dir = tmp_path / "student"
    assert main(["distill", str(teacher_dir), str(path), *PINNED, f"output_dir={student_dir}", f"model.name_or_path={start_dir}",
                 "distill.init=model", "train.max_steps=48", "distill.alpha=0.9"]) == 0

    teacher = AutoModelForQuestionAnswering.from_pretrained(teacher_dir).eval()
    start = AutoModelForQuestionAnswering.from_pretrained(start_dir).eval()
    student = AutoModelForQuestionAnswering.from_pretrained(student_dir).eval()
    assert student.config.num_hidden_layers == 1
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    paragraphs = [p for article in synthetic_squad(32, seed=4)["data"] for p in article["paragraphs"]]
    batches = [tokenizer([QUESTION] * len(chunk), [p["context"] for p in chunk], truncation="only_second", max_length=40,
                         padding=True, return_tensors="pt") for chunk in (paragraphs[:16], paragraphs[16:])]
    before, after = span_kls(start, teacher, batches), span_kls(student, teacher, batches)
    for name in before:
        assert after[name] < 0.1 * before[name], (name, before, after)

    inputs = tmp_path / "inputs.jsonl"
    contexts = ["the plot was dull and bob was fine", "grace said the film was a story with very and plot"]
    inputs.write_text("".join(json.dumps({"id": str(i), "question": QUESTION, "context": c}) + "\n" for i, c in enumerate(contexts)))
    assert main(["predict", str(student_dir), "--input", str(inputs), "--output", str(tmp_path / "answers.jsonl")]) == 0
    assert main(["predict", str(teacher_dir), "--input", str(inputs), "--output", str(tmp_path / "teacher.jsonl")]) == 0
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [a["answer"] for a in answers] == [json.loads(line)["answer"] for line in (tmp_path / "teacher.jsonl").read_text().splitlines()]
    load_tasks()  # registers the question-answering pipeline
    served = pipeline("question-answering", model=str(student_dir))
    for context, answer in zip(contexts, answers):
        assert context[answer["start"] : answer["end"]] == answer["answer"]
        reply = served(question=QUESTION, context=context)
        assert (reply["answer"], reply["start"], reply["end"]) == (answer["answer"], answer["start"], answer["end"])


def test_distill_teacher_reads_its_segment_ids_when_the_students_tokenizer_makes_none(tmp_path):
    """A BERT teacher and a DistilBERT student share a vocabulary, but DistilBERT's tokenizer makes no
    token_type_ids: on text pairs the soft targets must still be the teacher's own predictions, which
    read the second text as segment 1."""
    import random

    from transformers import AutoTokenizer, BertForSequenceClassification, DistilBertTokenizer

    from pipelines.distill import build_distillation_model
    from tests.conftest import write_config, write_jsonl
    from tests.families.builders import build_family

    teacher_base, student_base = build_family("bert", tmp_path / "bert"), build_family("distilbert", tmp_path / "distilbert")
    # The same WordPiece vocabulary (the families' trainer orders '##' pieces differently per run).
    DistilBertTokenizer(tokenizer_object=AutoTokenizer.from_pretrained(teacher_base).backend_tokenizer, model_max_length=128).save_pretrained(student_base)
    rng = random.Random(0)
    rows = [{**row, "pair": " ".join(rng.choice(["the", "plot", "good", "bad", "film"]) for _ in range(4))} for row in sentiment_rows(24, seed=1)]
    files = {split: write_jsonl(tmp_path / f"{split}.jsonl", rows[start:start + 12]) for split, start in (("train", 0), ("validation", 12))}
    path = write_config(tmp_path / "pairs.yaml", f"""task: classification
output_dir: {tmp_path / 'teacher'}
model: {{name_or_path: {teacher_base}}}
data: {{files: {{train: {files['train']}, validation: {files['validation']}}}, text_column: sentence, text_pair_column: pair, label_column: label}}
train: {{batch_size: 4, max_steps: 2}}
""")
    teacher_dir = train_config(load_config(path, PINNED, options_for))
    config = distill_config(str(teacher_dir), str(path), [*PINNED, f"output_dir={tmp_path / 'student'}", "distill.init=model",
                                                         f"model.name_or_path={student_base}", "distill.alpha=1.0"], options_for)
    task = get_task(config.task)(config)
    raw = task.load()
    task.build_tokenizer(raw)
    model = build_distillation_model(task.build_model(raw), config, task).train()
    features = task.preprocess(raw["train"].select(range(4)), train=True)
    batch = task.collator(train=True)([features[index] for index in range(4)])
    assert "token_type_ids" not in batch
    outputs = model(**batch)

    teacher = BertForSequenceClassification.from_pretrained(teacher_dir).eval()
    own = AutoTokenizer.from_pretrained(teacher_dir)(raw["train"]["sentence"][:4], raw["train"]["pair"][:4], padding=True, return_tensors="pt")
    assert torch.equal(own["input_ids"], batch["input_ids"]) and bool(own["token_type_ids"].any())
    with torch.no_grad():
        soft_targets = teacher(**own).logits
    expected = soft_target_kl(outputs.logits.detach(), soft_targets, config.distill.temperature)
    assert float(outputs.loss.detach()) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)


def test_distill_into_its_own_teacher_is_refused_naming_both_keys_without_the_config(classification_teacher, tmp_path):
    root, path, teacher = classification_teacher
    with pytest.raises(ConfigError) as raised:
        distill_config(str(teacher), str(path), [f"output_dir={teacher}"], options_for)
    message = str(raised.value)
    assert "distill.teacher is output_dir: the student must be written to another output_dir" in message, message
    # the whole resolved config followed as "(got {...})", every key of it, after a "bad value for '(top level)'"
    assert "(got" not in message and "(top level)" not in message and "learning_rate" not in message, message


def test_distill_loss_weighs_the_soft_targets_by_alpha_and_the_task_loss_by_one_minus_alpha():
    from transformers import BertConfig, BertForSequenceClassification

    from pipelines.distill import DistillationModel

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    student, teacher = BertForSequenceClassification(config), BertForSequenceClassification(config)
    batch = {"input_ids": torch.randint(5, 50, (3, 7)), "attention_mask": torch.ones(3, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 1])}
    alone, taught = student(**batch), teacher(**batch)
    expected = 0.25 * soft_target_kl(alone.logits, taught.logits, 2.0) + 0.75 * alone.loss
    loss = DistillationModel(student, teacher, alpha=0.25, temperature=2.0).train()(**batch).loss
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.parametrize("alpha, hidden_weight, teacher_runs", [(0.0, 0.0, False), (0.0, 0.5, True), (0.5, 0.0, True)])
def test_distill_alpha_zero_without_hidden_states_trains_on_the_task_loss_without_the_teacher(alpha, hidden_weight, teacher_runs):
    """alpha=0 (a sweep's baseline) multiplied the teacher's KL by 0: its forward was thrown away, and a teacher giving
    NaN made the loss NaN. Now the loss is the student's task loss, bit for bit, and the teacher never runs."""
    from transformers import BertConfig, BertForSequenceClassification

    from pipelines.distill import DistillationModel

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    student, teacher = BertForSequenceClassification(config), BertForSequenceClassification(config)
    calls = []

    def spoil(module, args, output):
        calls.append(1)
        output.logits.fill_(float("nan"))

    teacher.register_forward_hook(spoil)
    model = DistillationModel(student, teacher, alpha=alpha, temperature=2.0, hidden_weight=hidden_weight,
                              layer_map=[(0, 0), (1, 1)]).train()
    batch = {"input_ids": torch.randint(5, 50, (3, 7)), "attention_mask": torch.ones(3, 7, dtype=torch.long),
             "labels": torch.tensor([0, 1, 1])}
    loss = model(**batch).loss
    assert bool(calls) == teacher_runs
    if not teacher_runs:
        assert torch.equal(loss, student(**batch).loss)
    with pytest.raises(DistillError, match="no task loss"):
        model(**{key: value for key, value in batch.items() if key != "labels"})


def test_distill_encoder_decoder_teacher_is_refused_naming_it(tmp_path, tiny_bert):
    """A translation teacher (bert2bert) got past the task check and ended in an AttributeError traceback: the
    teacher's depth was read as one encoder's."""
    from tests.conftest import write_jsonl
    from tests.tasks.translation_data import copy_rows
    from tests.test_cli_translation import translation_config

    files = {"train": write_jsonl(tmp_path / "train.jsonl", copy_rows(16, seed=1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", copy_rows(4, seed=2))}
    path = translation_config(tmp_path, tiny_bert, files)
    teacher = train_config(load_config(path, [*PINNED, "train.max_steps=1", f"output_dir={tmp_path / 'teacher'}"], options_for))
    for init in ("teacher", "model"):
        with pytest.raises(DistillError, match=r"is an encoder-decoder \(encoder-decoder\): distillation takes encoder models"):
            _distillation(teacher, path, tmp_path, f"distill.init={init}")
