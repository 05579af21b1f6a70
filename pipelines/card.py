"""Model card (``README.md`` in the run directory), built with huggingface_hub's ``ModelCard``.

In:  the resolved config, the task (its ``pipeline_tag``, ``auto_model_class`` and card usage
     attributes), the final metrics (``metrics.json``) and the name the model goes by (the run
     folder, or the Hub repo id when publishing).
Out: ``README.md`` whose YAML metadata the Hub parses -- base model, datasets, language, license,
     tags, pipeline tag, library (``peft`` for an adapter) and a ``model-index`` of the final
     ``eval_*`` metrics under the Hub's metric ids (``accuracy``, ``f1``, ``exact_match``,
     ``bleu``, ``perplexity``...; ``f1_macro`` becomes type ``f1`` with config ``macro``) -- and a
     body with the metrics table, the training hyperparameters, framework versions and a usage
     snippet for the task (through peft for an adapter).

``ModelCard.load(path).data.eval_results`` reads the metrics back (tested).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from pipelines.atomic_writes import write_text_atomically
from pipelines.config import RunConfig

if TYPE_CHECKING:
    from pipelines.task import Task

# Bookkeeping that the evaluation loop reports next to the metrics.
# Counts, lengths, thresholds, flags and timings a task reports beside its scores (NER's words evaluated, SQuAD v2's
# question totals and best thresholds, translation's gen_len and bleu_lowercased): the card's results are scores.
_NOT_A_SCORE = ("samples", "runtime", "per_second", "words", "masked_tokens", "total", "gen_len", "_thresh", "lowercased")
# bertpipe metric name -> Hub metric id, where they differ.
_HUB_METRIC_IDS = {"pearson": "pearsonr", "exact": "exact_match", "em": "exact_match", "sacrebleu": "bleu", "ppl": "perplexity"}
_AVERAGES = ("macro", "micro", "weighted", "samples")

# The card's usage without a pipeline, for a task that names no code of its own.
_GENERIC_MODEL_USAGE = """inputs = tokenizer("Hello world", return_tensors="pt")
outputs = model(**inputs)"""


def hub_metric(name: str) -> tuple[str, str | None]:
    """bertpipe metric name (no ``eval_`` prefix) -> (Hub metric id, metric config)."""
    for average in _AVERAGES:
        if name.endswith(f"_{average}"):
            base, _ = hub_metric(name.removesuffix(f"_{average}"))
            return base, average
    return _HUB_METRIC_IDS.get(name, name), None


def is_local_path(name: str | None) -> bool:
    """A folder of this machine, or one that was: a run's config.yaml records local paths absolute, and a card built
    after the base folder was cleaned up (or on another machine) named ``/tmp/base`` as a Hub id."""
    if name is None:
        return False
    path = Path(name).expanduser()
    return path.is_absolute() or name.startswith(("./", "../")) or path.exists()


def hub_dataset(config: RunConfig) -> str | None:
    """The Hub dataset the run read, or None for local data: ``data.files`` are read instead of ``data.path`` (a
    config that sets both, sst2.yaml with its files overridden, trained on the files)."""
    if config.data.files or not config.data.path or is_local_path(config.data.path):
        return None
    return config.data.path


def eval_results(config: RunConfig, task_tag: str, metrics: dict[str, Any]) -> list[EvalResult]:
    """One ``EvalResult`` per finite ``eval_*`` metric; ``metric_name`` keeps bertpipe's name."""
    hub_dataset_id = hub_dataset(config)
    results = []
    for key, value in metrics.items():
        if not key.startswith("eval_") or key.endswith(_NOT_A_SCORE) or isinstance(value, bool):
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        name = key.removeprefix("eval_")
        metric_type, metric_config = hub_metric(name)
        results.append(EvalResult(
            task_type=task_tag,
            dataset_type=hub_dataset_id or "custom",
            dataset_name=hub_dataset_id or "local files",
            dataset_config=config.data.name if hub_dataset_id else None,
            dataset_split=config.data.eval_split,
            metric_type=metric_type,
            metric_name=name,
            metric_config=metric_config,
            metric_value=float(value),
        ))
    return results


def _versions(adapter: bool) -> str:
    import accelerate
    import datasets
    import torch
    import transformers

    modules = [("transformers", transformers), ("torch", torch), ("datasets", datasets), ("accelerate", accelerate)]
    if adapter:
        import peft

        modules.insert(0, ("peft", peft))
    return "\n".join(f"- {name} {module.__version__}" for name, module in modules)


def _is_own_model_type(model_type: str) -> bool:
    """bertpipe's own model types (models/), which transformers knows once ``import models`` has registered them."""
    from models import BERT_MODEL_TYPE, TRANSFORMER_MODEL_TYPE  # here: the package imports torch, a card needs none

    return model_type in (BERT_MODEL_TYPE, TRANSFORMER_MODEL_TYPE)


def usage_snippet(task: Task, model_name: str, *, base_model: str | None, adapter: bool, max_seq_length: int = 128,
                  model_type: str | None = None, multi_label: bool = False, revision: str | None = None,
                  base_revision: str | None = None) -> str:
    """Python that loads the model for its task: ``pipeline()`` where the task names its input
    (``{max_seq_length}`` in that input becomes the run's ``data.max_seq_length``). ``model_type``: the saved
    model's; bertpipe's own (``bertpipe_*``) loads only once bertpipe's ``models`` package has registered it.
    ``multi_label``: the saved model scores each label (``pipeline()``'s default shows the best one only).
    ``revision``: the branch the model is pushed to; ``base_revision``: the base checkpoint's an adapter was
    trained on (without them the code loaded the main branches: another model, or another base)."""
    snippet = _usage_snippet(task, model_name, base_model=base_model, adapter=adapter, max_seq_length=max_seq_length,
                             multi_label=multi_label, revision=revision, base_revision=base_revision)
    if model_type is not None and _is_own_model_type(model_type):
        return f"import models  # bertpipe's models/ package (on the path): registers {model_type} with the Auto classes\n" + snippet
    return snippet


def _usage_snippet(task: Task, model_name: str, *, base_model: str | None, adapter: bool, max_seq_length: int,
                   multi_label: bool, revision: str | None, base_revision: str | None) -> str:
    auto_class = task.auto_model_class.__name__
    at = f', revision="{revision}"' if revision else ""
    base_at = f', revision="{base_revision}"' if base_revision else ""
    if adapter:
        # transformers' own adapter loading builds the base from the base checkpoint's config,
        # which lacks the trained head's label maps: load the base under this repo's config.
        # A generating model's beam and length settings are the run's (its generation_config.json), not the base's.
        generates = "Seq2Seq" in auto_class or "CausalLM" in auto_class
        imported = "GenerationConfig, " if generates else ""
        generation = (f'base.generation_config = GenerationConfig.from_pretrained("{model_name}"{at})  # the run\'s beam settings\n'
                      if generates else "")
        load = f"""from peft import PeftModel
from transformers import AutoConfig, AutoTokenizer, {imported}{auto_class}

config = AutoConfig.from_pretrained("{model_name}"{at})  # the trained head's label maps
base = {auto_class}.from_pretrained("{base_model or 'BASE_MODEL'}", config=config{base_at})
{generation}model = PeftModel.from_pretrained(base, "{model_name}"{at}).merge_and_unload()  # or keep the PeftModel
tokenizer = AutoTokenizer.from_pretrained("{model_name}"{at})
"""
        model_argument = "model=model, tokenizer=tokenizer"
    else:
        load = f"""from transformers import AutoTokenizer, {auto_class}

model = {auto_class}.from_pretrained("{model_name}"{at})
tokenizer = AutoTokenizer.from_pretrained("{model_name}"{at})
"""
        model_argument = f'model="{model_name}"{at}'
    if task.card_pipeline_input is not None:
        # pipeline()'s default top_k=1 shows one label of a multi-label model; predict scores each label.
        shown = task.card_pipeline_input.replace("{max_seq_length}", str(max_seq_length)) + (", top_k=None" if multi_label else "")
        usage = f"""from transformers import pipeline

predictor = pipeline("{task.pipeline_tag}", {model_argument})
print(predictor({shown}))"""
        return usage if not adapter else load + "\n" + usage
    return load + "\n" + (task.card_model_usage or _GENERIC_MODEL_USAGE)


def build_model_card(
    config: RunConfig, task: Task, metrics: dict[str, Any], *, model_name: str, adapter: bool | None = None,
    saved_config: dict[str, Any] | None = None, revision: str | None = None,
) -> ModelCard:
    """The card for a run; ``adapter`` (default: the run used ``model.peft``) selects the peft variant;
    ``saved_config`` is the saved model's ``config.json`` (:func:`saved_model_config`: its model and problem
    types); ``revision`` the branch the card's repository is pushed to."""
    saved_config = saved_config or {}
    adapter = config.model.peft is not None if adapter is None else adapter
    source = config.model.name_or_path
    base_model = source if source and not is_local_path(source) else None
    hub_dataset_id = hub_dataset(config)
    tags = ["bertpipe", config.task, *config.hub.tags]
    if adapter:
        tags += ["peft", config.model.peft.method]
    card_data = ModelCardData(
        model_name=model_name,
        base_model=base_model,
        datasets=[hub_dataset_id] if hub_dataset_id else None,
        language=config.hub.language,
        license=config.hub.license,
        library_name="peft" if adapter else "transformers",
        pipeline_tag=task.pipeline_tag,
        tags=list(dict.fromkeys(tags)),
        eval_results=eval_results(config, task.pipeline_tag, metrics) or None,
    )
    hyperparameters = "\n".join(
        f"- {key}: {value}" for key, value in config.train.model_dump().items() if value not in (None, [], {})
    )
    if config.model.peft is not None:
        hyperparameters += "\n" + "\n".join(
            f"- peft.{key}: {value}" for key, value in config.model.peft.model_dump().items() if value is not None
        )
    # Model settings that change what was trained: the base's revision, a dropout override, input embeddings kept as loaded.
    hyperparameters += "".join(
        f"\n- model.{key}: {value}" for key, value in (("revision", config.model.revision), ("dropout", config.model.dropout),
                                                     ("freeze_input_embeddings", config.model.freeze_input_embeddings or None))
        if value is not None
    )
    # A distilled run learned from a teacher: without these the student read as the teacher run fine-tuned.
    if config.distill is not None:
        hyperparameters += "".join(
            f"\n- distill.{key}: {value}" for key, value in config.distill.model_dump().items() if value not in (None, [], {})
        )
    # The task's own settings decide what its outputs mean (a multi-label threshold, QA's max_answer_length).
    hyperparameters += "".join(
        f"\n- {config.task}.{key}: {value}" for key, value in config.task_options.model_dump().items() if value not in (None, [], {})
    )
    metric_rows = "\n".join(
        f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |" for key, value in metrics.items()
    )
    origin = f"`{source}`" if source else "a randomly initialised model"
    if config.distill is not None:
        student = "the teacher's own layers" if config.distill.init == "teacher" else origin
        origin = f"the teacher `{config.distill.teacher}` by knowledge distillation, into a student of {student},"
    data = f"`{config.data.path}`" + (f" ({config.data.name})" if config.data.name else "") if hub_dataset_id else "local files"
    adapter_note = (
        f"\nThis repository holds a {config.model.peft.method.upper()} adapter (plus the trained task head), "
        f"not a full model: load it on top of `{base_model or source}` with peft as shown below.\n"
        if adapter else ""
    )
    snippet = usage_snippet(
        task, model_name, base_model=base_model or source, adapter=adapter, max_seq_length=config.data.max_seq_length,
        model_type=saved_config.get("model_type"), multi_label=saved_config.get("problem_type") == "multi_label_classification",
        revision=revision, base_revision=config.model.revision if base_model else None,
    )
    body = f"""
# {model_name}

Trained with bertpipe (`task: {config.task}`) from {origin} on {data}.
{adapter_note}
## Results ({config.data.eval_split} split)

| metric | value |
| --- | --- |
{metric_rows}

## Usage

```python
{snippet}
```

## Training hyperparameters

- seed: {config.seed}
{hyperparameters}

## Framework versions

{_versions(adapter)}
"""
    return ModelCard.from_template(card_data, template_str="---\n{{ card_data }}\n---\n" + body)


def saved_model_config(run_dir: str | Path) -> dict[str, Any]:
    """The ``config.json`` of the model saved in ``run_dir``; ``{}`` where there is none to read."""
    try:
        saved = json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def saved_model_type(run_dir: str | Path) -> str | None:
    """``model_type`` of the model saved in ``run_dir``, None where there is none to read."""
    return saved_model_config(run_dir).get("model_type")


def write_model_card(run_dir: str | Path, config: RunConfig, task: Task, metrics: dict[str, Any]) -> Path:
    card = build_model_card(config, task, metrics, model_name=Path(run_dir).resolve().name, saved_config=saved_model_config(run_dir))
    path = Path(run_dir) / "README.md"
    # Not card.save(), which writes in place: a resumed finished run rewrites the card, and a kill
    # mid-write left a truncated one that publish uploads.
    write_text_atomically(path, str(card))
    return path
