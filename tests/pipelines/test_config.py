from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipelines.config import ConfigError, TaskOptions
from pipelines.config_loading import apply_overrides, load_config, parse_override, read_yaml
from tests.conftest import REPO_ROOT


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


def test_config_best_model_settings_need_the_evaluations_they_choose_from(tmp_path):
    with pytest.raises(ConfigError, match=r"need train\.metric_for_best_model"):
        load_config(write(tmp_path, BASE), ["train.load_best_model_at_end=true", "train.eval_steps=5"], options_for)
    for setting in ("train.load_best_model_at_end=true", "train.early_stopping_patience=2"):
        with pytest.raises(ConfigError, match=r"'train' in .*run\.yaml and the command line: .*needs train\.eval_steps"):
            load_config(write(tmp_path, BASE), [setting, "train.metric_for_best_model=eval_accuracy"], options_for)
    chosen = load_config(write(tmp_path, BASE), ["train.load_best_model_at_end=true", "train.metric_for_best_model=eval_accuracy",
                                                 "train.eval_steps=5"], options_for)
    assert chosen.train.load_best_model_at_end and chosen.train.eval_steps == 5
    # A metric alone is allowed without evaluations on the way: it names the benchmark's metric column.
    assert load_config(write(tmp_path, BASE), ["train.metric_for_best_model=eval_accuracy"], options_for).train.eval_steps is None


def test_config_seed_is_refused_outside_the_range_every_library_seeds_from(tmp_path):
    # numpy takes 0 to 2**32 - 1; past either end the run ended in numpy's traceback inside set_seed.
    for seed in ("-1", str(2**32)):
        with pytest.raises(ConfigError, match=r"'seed' .*the command line"):
            load_config(write(tmp_path, BASE), [f"seed={seed}"], options_for)
    assert load_config(write(tmp_path, BASE), [f"seed={2**32 - 1}"], options_for).seed == 2**32 - 1


def test_config_overrides_report_the_settings_they_set_however_spelt():
    tree = {"task": "demo", "data": {"files": {"train": "a.jsonl", "validation": "b.jsonl"}}}
    set_keys = apply_overrides(tree, ["train={batch_size: 4, max_steps: 9}", "model={peft: {r: 2}}", "data.files={train: c.jsonl}",
                                      "demo.doc_stride=64"])
    # Sections key by key, also where the file has none of them; a mapping-valued setting whole.
    assert set_keys == {("train", "batch_size"), ("train", "max_steps"), ("model", "peft", "r"), ("data", "files"), ("demo", "doc_stride")}
    assert tree["train"] == {"batch_size": 4, "max_steps": 9} and tree["model"] == {"peft": {"r": 2}}
    assert tree["data"]["files"] == {"train": "c.jsonl"}


def test_config_a_value_that_fits_no_member_of_a_union_is_one_line_at_its_own_key(tmp_path):
    # pydantic reports each member of `str | list[str]` at a location of its own: "data.files.validation.str".
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, BASE), ["data.files.validation=null"], options_for)
    (line,) = str(refused.value).splitlines()[1:]
    assert line.strip() == ("bad value for 'data.files.validation' in the command line: Input should be a valid string, "
                            "or input should be a valid list (got None)")


def test_config_split_without_a_file_is_refused_naming_it(tmp_path):
    # An empty list reached the json reader as "StopIteration".
    for files in ("{train: []}", "{train: a.jsonl, validation: ''}"):
        with pytest.raises(ConfigError, match=r"data.files.*the command line.*split\(s\) \['(train|validation)'\] name no file"):
            load_config(write(tmp_path, BASE), [f"data.files={files}"], options_for)


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
    ranked = TrainConfig(metric_for_best_model="eval_loss", greater_is_better=True)
    assert ranked.metric_greater_is_better("eval_loss", task_directions) is True
    assert ranked.metric_greater_is_better("loss", task_directions) is True
    # greater_is_better ranks metric_for_best_model: another metric keeps its own direction (the benchmark's
    # --metric pearson beside eval_mse minimised Pearson, and a run below its target "reached" it).
    mse = TrainConfig(metric_for_best_model="eval_mse", greater_is_better=False)
    assert mse.metric_greater_is_better("pearson", {"mse": False}) is True and mse.metric_greater_is_better("eval_mse", {}) is False


def test_config_key_given_twice_on_one_line_or_in_an_override_is_an_error(tmp_path):
    # A flow mapping repeats a key on one line; PyYAML alone keeps the last value without a word.
    path = write(tmp_path, BASE.replace("  path: some/dataset\n", "  files: {train: a.jsonl, train: b.jsonl}\n"))
    with pytest.raises(ConfigError, match=rf"{path}: not valid YAML: duplicate key 'train' \(first given on line 4\)"):
        load_config(path, [], options_for)
    with pytest.raises(ConfigError, match=r"data.files=\{train: a.jsonl, train: b.jsonl\}.*duplicate key 'train'"):
        load_config(write(tmp_path, BASE), ["data.files={train: a.jsonl, train: b.jsonl}"], options_for)


def test_config_merge_key_takes_a_mappings_keys_and_the_keys_given_beside_it_win(tmp_path):
    # `<<: *anchor` (YAML's merge key) was refused as "not valid YAML" (no constructor for the merge tag).
    merged = write(tmp_path, BASE.replace("  learning_rate: 1.0e-4\n", "  <<: {batch_size: 8, learning_rate: 3.0e-4}\n  learning_rate: 1.0e-4\n"))
    config = load_config(merged, [], options_for)
    assert (config.train.batch_size, config.train.learning_rate) == (8, 1.0e-4)
    anchored = tmp_path / "anchored.yaml"
    anchored.write_text("base: &base {a: 1, b: 2}\nchild:\n  <<: *base\n  b: 3\n")
    assert read_yaml(anchored) == {"base": {"a": 1, "b": 2}, "child": {"a": 1, "b": 3}}
    duplicated = write(tmp_path, BASE.replace("  learning_rate: 1.0e-4\n", "  <<: {batch_size: 8}\n  learning_rate: 1.0e-4\n  learning_rate: 2.0e-4\n"))
    with pytest.raises(ConfigError, match=r"duplicate key 'learning_rate' \(first given on line 7\)"):
        load_config(duplicated, [], options_for)


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


def test_config_relative_paths_are_saved_absolute_so_a_run_reads_the_same_files_from_any_directory(tmp_path, monkeypatch):
    # Relative to the current directory, as the configs under configs/ are written; the run's config.yaml
    # (to_yaml_dict) kept them relative, so `bertpipe evaluate RUN` from another directory read another
    # data/validation.jsonl there without a word, and predict's guard let --output replace the real one.
    project, elsewhere, home = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "home"
    for folder in (project, elsewhere):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "validation.jsonl").write_text('{"text": "a", "label": "x"}\n')
    (project / "my_model").mkdir()
    (home / "tokenizers" / "tok").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    path = write(tmp_path, BASE.replace("runs/x", "~/runs/x").replace("  path: some/dataset\n", (
        "  path: some/dataset\n  files: {validation: data/validation.jsonl, train: [data/../data/validation.jsonl, data/missing.jsonl]}\n"
    )).replace("data:", "model: {name_or_path: ./my_model, tokenizer_name_or_path: ~/tokenizers/tok}\ndata:", 1))
    config = load_config(path, ["train.resume_from_checkpoint=latest"], options_for)
    assert config.output_dir == str(home / "runs" / "x")  # ~ is the home folder, as for model and data paths
    assert config.data.files == {"validation": str(project / "data" / "validation.jsonl"),
                                 "train": [str(project / "data" / "validation.jsonl"), "data/missing.jsonl"]}
    assert (config.model.name_or_path, config.model.tokenizer_name_or_path) == (str(project / "my_model"), str(home / "tokenizers" / "tok"))
    # A Hub id stays one, a missing file is named as written, and `latest` is no folder.
    assert config.data.path == "some/dataset" and config.train.resume_from_checkpoint == "latest"
    monkeypatch.chdir(elsewhere)
    saved = load_config(None, [], options_for, base=config.to_yaml_dict())
    assert saved.data.files["validation"] == str(project / "data" / "validation.jsonl") and saved == config


def test_config_integers_are_decimal_without_yaml_1_1_octal_or_base_60(tmp_path):
    # YAML 1.1 reads a leading zero as octal and colons as base 60: `eval_steps: 0500` trained with 320
    # and `seed: 010` with 8, without a word. Read as YAML 1.2 (and every user) reads them.
    in_file = write(tmp_path, BASE.replace("train:\n", "seed: 010\ntrain:\n  eval_steps: 0500\n  max_steps: 1_000\n", 1))
    config = load_config(in_file, ["data.max_seq_length=0256", "train.logging_steps=0x10", "train.save_steps=0o10"], options_for)
    assert (config.seed, config.train.eval_steps, config.train.max_steps) == (10, 500, 1000)
    assert (config.data.max_seq_length, config.train.logging_steps, config.train.save_steps) == (256, 16, 8)
    with pytest.raises(ConfigError, match=r"bad value for 'train.eval_steps' in the command line.*'1:30'"):
        load_config(in_file, ["train.eval_steps=1:30"], options_for)


def test_config_floats_are_read_as_yaml_1_2_reads_them(tmp_path):
    # YAML 1.1 needs a dot before an exponent and reads colons as base 60: `train.max_steps=1e3` was refused as a
    # string, `learning_rate: 1:30.0` trained at 90.0, and an exponent nested in model.architecture stayed a string.
    in_file = write(tmp_path, BASE.replace("  learning_rate: 1.0e-4\n", "  learning_rate: 1e-4\n  max_steps: 1e3\n"))
    config = load_config(in_file, ["model.architecture={rope_scaling: {factor: 1e-1}}", "train.weight_decay=.5"], options_for)
    assert (config.train.learning_rate, config.train.max_steps, config.train.weight_decay) == (1e-4, 1000, 0.5)
    assert config.model.architecture == {"rope_scaling": {"factor": 0.1}}
    with pytest.raises(ConfigError, match=r"bad value for 'train.learning_rate' in the command line.*'1:30.0'"):
        load_config(in_file, ["train.learning_rate=1:30.0"], options_for)


def test_config_strings_that_read_as_numbers_are_written_quoted_and_old_run_configs_read_as_written(tmp_path):
    # A run's config.yaml held `revision: 4501e23` (a commit) bare, a string to the YAML 1.1 writer and a float to
    # the YAML 1.2 reader: evaluate and predict refused the run's own config.
    from pipelines.config_loading import dump_yaml

    tree = {"model": {"revision": "4501e23"}, "hub": {"tags": ["0o17", ".5", "1e5", "no", "plain"]}, "train": {"learning_rate": 1e-05}}
    written = dump_yaml(tree, sort_keys=False)
    assert "'4501e23'" in written and "'1e5'" in written and "1.0e-05" in written
    (tmp_path / "run.yaml").write_text(written)
    assert read_yaml(tmp_path / "run.yaml") == tree == read_yaml(tmp_path / "run.yaml", written_here=True)
    (tmp_path / "old.yaml").write_text("model:\n  revision: 4501e23\ntrain:\n  learning_rate: 1.0e-05\n")  # as PyYAML wrote it
    assert read_yaml(tmp_path / "old.yaml", written_here=True) == {"model": {"revision": "4501e23"}, "train": {"learning_rate": 1e-05}}


def test_config_a_setting_given_twice_on_the_command_line_is_refused():
    # The last one won silently, as a key given twice in a YAML file would (refused there too).
    from pipelines.config_loading import refuse_repeated_overrides

    for overrides, key in ((["train.max_steps=3", "train.max_steps=5"], "train.max_steps"),
                           (["train.learning_rate=1e-3", "train={learning_rate: 0.5}"], "train.learning_rate"),
                           (["data.files={train: a.csv}", "data.files={train: b.csv}"], "data.files")):
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)} is set twice on the command line \({re.escape(repr(overrides[0]))}, then"):
            refuse_repeated_overrides(overrides)
    # A section given whole and then a key of it set different settings: allowed, as documented.
    refuse_repeated_overrides(["model.peft=null", "model.peft.r=8", "train.max_steps=3", "data.files.train=a.csv"])


def test_config_a_list_of_numbers_refuses_booleans_and_files_refuse_an_empty_path(tmp_path):
    with pytest.raises(ConfigError, match=r"bad value for 'distill.layers' in the command line: .*true is a boolean; this setting takes a list of numbers"):
        load_config(write(tmp_path, BASE), ["distill={teacher: t, init: teacher}", "distill.layers=[true, false]"], options_for)
    with pytest.raises(ConfigError, match=r"'data.files'.*split\(s\) \['train'\] list an empty path"):
        load_config(write(tmp_path, BASE), ["data.files.train=[a.jsonl, '']"], options_for)


@pytest.mark.parametrize("task, section", [("classification", "classification"), ("ner", "ner")])
def test_config_label_names_given_twice_or_empty_are_refused(tmp_path, task, section):
    # [negative, positive, negative] trained a head of three classes, one dead under a shared name, and predict's
    # scores then summed to 0.70; an empty list was read as unset while config.yaml kept it.
    from tasks import get_task

    path = REPO_ROOT / ("configs/classification/sst2.yaml" if task == "classification" else "configs/ner/conll2003.yaml")
    for value, message in (("[negative, positive, negative]", r"\['negative'\] listed more than once"), ("[]", "the label set is empty")):
        with pytest.raises(ConfigError, match=rf"'{section}.label_names' in the command line: .*{message}"):
            load_config(path, [f"output_dir={tmp_path}", f"{section}.label_names={value}"], lambda name: get_task(name).Options)


def test_config_override_of_a_list_element_is_an_error_naming_the_whole_list_form(tmp_path):
    # `data.files.validation[0]=b.jsonl` made a split named "validation[0]" that no command reads:
    # evaluate went on scoring the old validation file.
    for override in ("data.files.validation[0]=b.jsonl", "hub.tags[1]=x"):
        with pytest.raises(ConfigError, match=rf"override '{re.escape(override)}'.*give the whole list"):
            load_config(write(tmp_path, BASE), [override], options_for)


def test_config_override_value_with_a_yaml_comment_is_an_error_and_a_literal_hash_is_kept(tmp_path):
    # YAML reads " #" as a comment: `output_dir=/tmp/out #2` trained into /tmp/out without a word.
    for override, shown in (("output_dir=/tmp/out #2", "'/tmp/out'"), ("train.max_steps=8 # fewer", "8"), ("hub.tags=[a, b] #c", r"\['a', 'b'\]")):
        with pytest.raises(ConfigError, match=rf"override '{re.escape(override)}': YAML reads a '#'.*would be {shown}; .*quote"):
            load_config(write(tmp_path, BASE), [override], options_for)
    # A '#' that YAML reads as text is the value's own.
    config = load_config(write(tmp_path, BASE), ["output_dir=/tmp/out#2", "hub.tags=['#a', 'b #c']"], options_for)
    assert config.output_dir == "/tmp/out#2" and list(config.hub.tags) == ["#a", "b #c"]
    assert load_config(write(tmp_path, BASE), ["output_dir='/tmp/out #2'"], options_for).output_dir == "/tmp/out #2"


def test_config_a_finished_runs_config_takes_what_evaluation_reads_and_refuses_what_training_fixed():
    from pipelines.config_loading import load_finished_run_config
    from tasks import get_task

    def options(name):
        return get_task(name).Options

    saved = load_config(REPO_ROOT / "configs/classification/sst2.yaml", [], options).to_yaml_dict()
    config = load_finished_run_config(saved, [
        "data.eval_split=test", "data.max_seq_length=64", "train.eval_batch_size=4", "train.torch_num_threads=1",
        "classification.multi_label_threshold=0.3", "seed=3", f"train.learning_rate={saved['train']['learning_rate']}",
    ], options)
    assert (config.data.eval_split, config.train.eval_batch_size, config.task_options.multi_label_threshold) == ("test", 4, 0.3)
    for override, shown in (("classification.problem_type=regression", "classification.problem_type='regression'.*'auto'"),
                            ("classification.label_names=[b, a]", r"classification.label_names=\['b', 'a'\].*None"),
                            ("model.name_or_path=elsewhere", "model.name_or_path='elsewhere'"),
                            ("model.peft={r: 2}", "model.peft.r=2"), ("train={learning_rate: 0.5}", "train.learning_rate=0.5"),
                            ("output_dir=/tmp/elsewhere", "output_dir="), ("hub.tags=[a]", "hub.tags=")):
        with pytest.raises(ConfigError, match=rf"{shown}.*evaluate and predict use the run as trained"):
            load_finished_run_config(saved, [override], options)
    with pytest.raises(ConfigError, match=r"train.mixed_precision='bf16'.*--precision"):
        load_finished_run_config(saved, ["train.mixed_precision=bf16"], options)
    ner = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [], options).to_yaml_dict()
    assert load_finished_run_config(ner, ["ner.stride=8", "ner.strict=true"], options).task_options.stride == 8
    for override in ("ner.label_names=[O, B-PER, I-PER]", "ner.label_all_tokens=false"):
        with pytest.raises(ConfigError, match=re.escape(override.split("=")[0])):
            load_finished_run_config(ner, [override], options)
    translation = load_config(REPO_ROOT / "configs/translation/multi30k_de_en.yaml", [], options).to_yaml_dict()
    assert load_finished_run_config(translation, ["translation.num_beams=1"], options).task_options.num_beams == 1
    with pytest.raises(ConfigError, match="translation.encoder_name_or_path='x'"):
        load_finished_run_config(translation, ["translation.encoder_name_or_path=x"], options)
    # Only training reads data.max_train_samples; another task is refused as such, not as an unknown section.
    with pytest.raises(ConfigError, match=r"data.max_train_samples=5 given to a finished run trained with 8000"):
        load_finished_run_config(saved, ["data.max_train_samples=5"], options)
    with pytest.raises(ConfigError, match=r"^task='ner' given to a finished run trained with 'classification' \(runs/x/config.yaml\)"):
        load_finished_run_config(saved, ["task=ner"], options, source="runs/x/config.yaml")
    edited = {**saved, "train": {**saved["train"], "batch_size": "many"}}
    with pytest.raises(ConfigError, match=r"'train.batch_size' in runs/x/config.yaml"):
        load_finished_run_config(edited, [], options, source="runs/x/config.yaml")
    assert saved == load_config(REPO_ROOT / "configs/classification/sst2.yaml", [], options).to_yaml_dict()  # left as it was


def test_config_infinite_or_nan_numbers_are_refused_naming_the_key(tmp_path):
    # `train.num_epochs=inf` passed `gt=0` and ended training in a raw OverflowError (math.ceil of inf);
    # an infinite learning rate trained to NaN weights without a word.
    for override in ("train.num_epochs=inf", "train.learning_rate=.inf", "model.peft.alpha=.inf"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=rf"bad value for '{re.escape(key)}' in the command line"):
            load_config(write(tmp_path, BASE), [override], options_for)


def test_config_a_boolean_is_not_a_number(tmp_path):
    # pydantic reads true as 1: train.batch_size=true trained with batches of one, learning_rate=true at 1.0.
    for override in ("train.batch_size=true", "train.learning_rate=true", "seed=false", "train.max_steps=true"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=rf"bad value for '{re.escape(key)}' in the command line: .*is a boolean; this setting takes a number"):
            load_config(write(tmp_path, BASE), [override], options_for)
    assert load_config(write(tmp_path, BASE), ["train.compile=true", "train.eval_on_start=yes"], options_for).train.compile is True


def test_config_a_number_with_a_misplaced_underscore_is_refused_not_read_without_it(tmp_path):
    # YAML reads 1_000 as 1000 itself; `1_0.5` (a typo) stayed a string that pydantic read as 10.5.
    for override in ("train.learning_rate=1_0.5", "train.batch_size='3_2'", "train.warmup_fraction=0_.1"):
        key = override.split("=")[0]
        with pytest.raises(ConfigError, match=rf"bad value for '{re.escape(key)}' in the command line: .*is not a number"):
            load_config(write(tmp_path, BASE), [override], options_for)
    config = load_config(write(tmp_path, BASE), ["train.max_steps=1_000", "output_dir=runs/a_b"], options_for)
    assert config.train.max_steps == 1000


class FloatOptions(TaskOptions):
    threshold: float = 0.0


def test_config_task_options_refuse_infinite_numbers_too():
    with pytest.raises(ValidationError, match="finite"):
        FloatOptions(threshold=float("-inf"))


def test_config_a_mapping_given_for_a_section_sets_its_keys_and_keeps_the_others(tmp_path):
    """``train={max_steps: 5}`` replaced the file's whole train section: its learning rate and batch size went
    back to the defaults without a word. A section takes the keys given (as Hydra merges a dict override); a
    mapping-valued setting (``data.files``) is replaced, so that a split can be left out."""
    path = write(tmp_path, """task: demo
output_dir: runs/x
data:
  files: {train: a.jsonl, validation: b.jsonl}
train:
  learning_rate: 1.0e-4
  batch_size: 16
model:
  name_or_path: some/model
  peft: {r: 4, alpha: 8}
demo:
  doc_stride: 64
""")
    config = load_config(path, ["train={max_steps: 5, batch_size: 8}", "model={peft: {r: 16}}", "demo={}",
                                f"data.files={{train: {tmp_path / 'c.jsonl'}}}"], options_for)
    assert (config.train.learning_rate, config.train.batch_size, config.train.max_steps) == (1.0e-4, 8, 5)
    assert config.model.name_or_path == "some/model" and (config.model.peft.r, config.model.peft.alpha) == (16, 8)
    assert config.task_options.doc_stride == 64
    assert config.data.files == {"train": str(tmp_path / "c.jsonl")}
    # A mapping where the file has none (a section the file leaves out) is the section.
    assert load_config(write(tmp_path, BASE), ["hub={private: false}"], options_for).hub.private is False
    # A bad value the file holds is still the file's, not the command line's.
    bad = write(tmp_path, BASE.replace("learning_rate: 1.0e-4", "learning_rate: -1"))
    with pytest.raises(ConfigError, match=rf"'train.learning_rate' in {re.escape(str(bad))}"):
        load_config(bad, ["train={max_steps: 5}"], options_for)


def test_config_encoding_that_is_a_codec_but_not_a_text_encoding_is_refused_naming_the_key(tmp_path):
    # codecs.lookup knows base64, hex and zlib (bytes to bytes) and rot13 (str to str): reading a file with one
    # ended in open()'s LookupError traceback, exit 1, after the config had passed.
    for codec in ("base64", "hex", "zlib", "rot13"):
        with pytest.raises(ConfigError, match=rf"bad value for 'data.encoding' in the command line: '{codec}' is a codec but not a text encoding"):
            load_config(write(tmp_path, BASE), [f"data.encoding={codec}"], options_for)
    assert load_config(write(tmp_path, BASE), ["data.encoding=latin-1"], options_for).data.encoding == "latin-1"


def test_config_rule_across_a_sections_keys_is_said_without_a_dump_of_the_section(tmp_path):
    # The message names the keys; "(got {...every key of the section...})" after it named nothing more.
    with pytest.raises(ConfigError) as raised:
        load_config(write(tmp_path, BASE), ["train.early_stopping_patience=2", "train.metric_for_best_model=eval_accuracy"], options_for)
    message = str(raised.value)
    assert "'train' in " in message and "needs train.eval_steps" in message, message
    assert "(got" not in message and "Value error" not in message and "learning_rate" not in message, message


@pytest.mark.parametrize(("value", "message"), [
    ('""', r"is empty: name the run's folder"), ("'  '", r"is empty"), ("/", r"'/' is the file system's root"),
])
def test_output_dir_that_names_no_folder_is_refused(tmp_path, value, message):
    """An empty output_dir trained into the current folder (and then said the saved run could not be saved), and
    "/" ended in a traceback ("PosixPath('/') has an empty name") after training."""
    with pytest.raises(ConfigError, match=rf"bad value for 'output_dir' in the command line: {message}"):
        load_config(write(tmp_path, BASE), [f"output_dir={value}"], options_for)


def test_a_section_the_command_line_creates_empty_is_named_as_the_command_lines(tmp_path):
    """`distill={}` said the teacher was "missing ... in run.yaml", a file that never mentioned distillation."""
    with pytest.raises(ConfigError, match=r"missing required key 'distill.teacher' in the command line"):
        load_config(write(tmp_path, BASE), ["distill={}"], options_for)
    with pytest.raises(ConfigError, match=rf"missing required key 'distill.teacher' in {re.escape(str(tmp_path / 'run.yaml'))}"):
        load_config(write(tmp_path, BASE + "distill: {}\n"), ["distill={}"], options_for)
