from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipelines.config import ConfigError, TaskOptions, load_config, parse_override


class DemoOptions(TaskOptions):
    doc_stride: int = 128
    label_all_tokens: bool = False


def options_for(name: str) -> type[TaskOptions]:
    if name != "demo":
        raise KeyError(f"unknown task {name!r}; registered tasks: demo")
    return DemoOptions


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


BASE = """task: demo
output_dir: runs/x
data:
  path: some/dataset
train:
  learning_rate: 1.0e-4
demo:
  doc_stride: 64
"""


def test_config_yaml_plus_overrides_are_typed(tmp_path):
    config = load_config(write(tmp_path, BASE), ["train.max_steps=10", "data.files.train=a.jsonl", "demo.label_all_tokens=true"], options_for)
    assert config.train.max_steps == 10 and isinstance(config.train.max_steps, int)
    assert config.train.learning_rate == pytest.approx(1e-4)
    assert config.data.files == {"train": "a.jsonl"}
    assert config.task_options.doc_stride == 64 and config.task_options.label_all_tokens is True


def test_config_unknown_key_names_key_file_and_closest(tmp_path):
    path = write(tmp_path, BASE.replace("learning_rate", "learnig_rate"))
    with pytest.raises(ConfigError) as error:
        load_config(path, [], options_for)
    message = str(error.value)
    assert "train.learnig_rate" in message and str(path) in message and "'train.learning_rate'" in message


def test_config_unknown_task_option_names_task_section(tmp_path):
    with pytest.raises(ConfigError, match=r"demo\.doc_strde.*did you mean 'demo\.doc_stride'"):
        load_config(write(tmp_path, BASE), ["demo.doc_strde=3"], options_for)



def test_config_error_names_the_command_line_for_a_key_an_override_created(tmp_path):
    path = write(tmp_path, BASE)
    for overrides, expected in (
        (["trian.max_steps=3"], "unknown key 'trian' in the command line; did you mean 'train'?"),
        (["train.max_steps.value=3"], "bad value for 'train.max_steps' in the command line"),
        (["task=dmeo"], "the command line: task: unknown task 'dmeo'"),
    ):
        with pytest.raises(ConfigError) as error:
            load_config(path, overrides, options_for)
        assert expected in str(error.value) and str(path) not in str(error.value), overrides
    # A key the file holds and an override changed is both's.
    with pytest.raises(ConfigError, match=f"bad value for 'train.learning_rate' in {path} and the command line"):
        load_config(path, ["train.learning_rate.peak=3"], options_for)


def test_config_wrong_type_names_key_and_expected_type(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.batch_size.*the command line.*integer"):
        load_config(write(tmp_path, BASE), ["train.batch_size=many"], options_for)


def test_config_bad_choice_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.mixed_precision"):
        load_config(write(tmp_path, BASE), ["train.mixed_precision=fp8"], options_for)


def test_config_mixed_precision_no_is_accepted_bare_from_yaml_and_the_command_line(tmp_path):
    # YAML reads a bare ``no`` as false; ``train.mixed_precision=no`` is what users type.
    assert load_config(write(tmp_path, BASE), ["train.mixed_precision=no"], options_for).train.mixed_precision == "no"
    in_file = write(tmp_path, BASE.replace("train:\n", "train:\n  mixed_precision: no\n", 1))
    assert load_config(in_file, [], options_for).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match=r"train\.mixed_precision"):
        load_config(write(tmp_path, BASE), ["train.mixed_precision=yes"], options_for)


def test_config_unknown_task_lists_registered(tmp_path):
    with pytest.raises(ConfigError, match="registered tasks: demo"):
        load_config(write(tmp_path, BASE.replace("task: demo", "task: dmeo")), [], options_for)


def test_config_malformed_yaml_and_override(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "task: [demo\n"), [], options_for)
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("train.max_steps")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml", [], options_for)


def test_config_needs_a_data_source(tmp_path):
    with pytest.raises(ConfigError, match="data.path"):
        load_config(write(tmp_path, BASE.replace("  path: some/dataset\n", "  name: x\n")), [], options_for)


def test_config_resolved_yaml_round_trips(tmp_path):
    config = load_config(write(tmp_path, BASE), ["seed=3"], options_for)
    again = load_config(None, [], options_for, base=config.to_yaml_dict())
    assert again == config
    assert config.to_yaml_dict()["demo"] == {"doc_stride": 64, "label_all_tokens": False}


def test_config_is_frozen(tmp_path):
    config = load_config(write(tmp_path, BASE), [], options_for)
    with pytest.raises(ValidationError):
        config.train.learning_rate = 1.0


def test_config_eval_batch_size_defaults_to_twice_the_train_batch():
    from pipelines.config import TrainConfig

    assert TrainConfig(batch_size=8).eval_batch_size_or_default == 16
    assert TrainConfig(batch_size=8, eval_batch_size=5).eval_batch_size_or_default == 5


def test_config_metric_direction_is_the_setting_else_the_tasks_else_higher():
    from pipelines.config import TrainConfig

    task_directions = {"loss": False}
    assert TrainConfig().metric_greater_is_better("eval_loss", task_directions) is False
    assert TrainConfig().metric_greater_is_better("loss", task_directions) is False
    assert TrainConfig().metric_greater_is_better("eval_accuracy", task_directions) is True
    assert TrainConfig().metric_greater_is_better(None, task_directions) is True
    assert TrainConfig(greater_is_better=True).metric_greater_is_better("eval_loss", task_directions) is True


def test_config_key_given_twice_on_one_line_or_in_an_override_is_an_error(tmp_path):
    # A flow mapping repeats a key on one line; PyYAML alone keeps the last value without a word.
    path = write(tmp_path, BASE.replace("  path: some/dataset\n", "  files: {train: a.jsonl, train: b.jsonl}\n"))
    with pytest.raises(ConfigError, match=rf"{path}: not valid YAML: duplicate key 'train' \(first given on line 4\)"):
        load_config(path, [], options_for)
    with pytest.raises(ConfigError, match=r"data.files=\{train: a.jsonl, train: b.jsonl\}.*duplicate key 'train'"):
        load_config(write(tmp_path, BASE), ["data.files={train: a.jsonl, train: b.jsonl}"], options_for)


def test_config_architecture_reads_exponent_numbers_as_floats(tmp_path):
    # YAML 1.1 reads 1e-12 (no dot) as a string, which the family's config class refuses.
    in_file = write(tmp_path, BASE.replace("data:", "model:\n  architecture: {layer_norm_eps: 1e-12, hidden_size: 64}\ndata:", 1))
    assert load_config(in_file, [], options_for).model.architecture == {"layer_norm_eps": 1e-12, "hidden_size": 64}
    config = load_config(write(tmp_path, BASE), ["model.architecture={layer_norm_eps: 1E-5, rope_theta: 1.0e4, hidden_act: gelu}"], options_for)
    assert config.model.architecture == {"layer_norm_eps": 1e-5, "rope_theta": 1e4, "hidden_act": "gelu"}
    assert isinstance(config.model.architecture["layer_norm_eps"], float)


def test_config_yes_no_on_off_are_text_for_a_text_setting_and_booleans_for_a_boolean(tmp_path):
    # YAML 1.1 reads them as booleans: the language code ``no`` (Norwegian) was refused as "got False".
    in_file = write(tmp_path, BASE.replace("  path: some/dataset\n", "  path: some/dataset\n  name: no\n"))
    assert load_config(in_file, [], options_for).data.name == "no"
    config = load_config(write(tmp_path, BASE), ["hub.language=[en, no]", "data.eval_split=off", "demo.label_all_tokens=yes", "overwrite=on"], options_for)
    assert config.hub.language == ["en", "no"] and config.data.eval_split == "off"
    assert config.task_options.label_all_tokens is True and config.overwrite is True
    assert load_config(write(tmp_path, BASE), ["overwrite=no", "seed=7"], options_for).overwrite is False
