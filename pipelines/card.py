"""Model card (``README.md`` in the run directory), built with huggingface_hub's ``ModelCard``.

In:  the run directory, the resolved config, the task (for its pipeline tag) and the final metrics.
Out: ``README.md`` with YAML metadata the Hub parses (base model, datasets, tags, pipeline tag and a
     ``model-index`` of the final ``eval_*`` metrics) and a body with the hyperparameters, the
     metrics table, framework versions and a ``pipeline()`` usage snippet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from pipelines.config import RunConfig

_SKIPPED_METRICS = {"eval_samples", "eval_runtime"}


def eval_results(config: RunConfig, task_tag: str, metrics: dict[str, Any]) -> list[EvalResult]:
    dataset = config.data.path or "local files"
    return [
        EvalResult(
            task_type=task_tag,
            dataset_type=dataset,
            dataset_name=dataset,
            dataset_config=config.data.name,
            dataset_split=config.data.eval_split,
            metric_type=key.removeprefix("eval_"),
            metric_name=key.removeprefix("eval_"),
            metric_value=float(value),
        )
        for key, value in metrics.items()
        if key.startswith("eval_") and key not in _SKIPPED_METRICS and isinstance(value, (int, float))
    ]


def _versions() -> str:
    import accelerate
    import datasets
    import torch
    import transformers

    return "\n".join(
        f"- {name} {module.__version__}" for name, module in
        [("transformers", transformers), ("torch", torch), ("datasets", datasets), ("accelerate", accelerate)]
    )


def build_model_card(config: RunConfig, task_tag: str, metrics: dict[str, Any], *, model_name: str) -> ModelCard:
    card_data = ModelCardData(
        model_name=model_name,
        base_model=config.model.name_or_path,
        datasets=[config.data.path] if config.data.path else None,
        library_name="transformers",
        pipeline_tag=task_tag,
        tags=["bertpipe", config.task],
        eval_results=eval_results(config, task_tag, metrics) or None,
    )
    hyperparameters = "\n".join(f"- {key}: {value}" for key, value in config.train.model_dump().items() if value not in (None, [], {}))
    metric_rows = "\n".join(f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |" for key, value in metrics.items())
    body = f"""
# {model_name}

Trained with bertpipe (`task: {config.task}`) from
{f"`{config.model.name_or_path}`" if config.model.name_or_path else "a randomly initialised model"}
on {f"`{config.data.path}`" + (f" ({config.data.name})" if config.data.name else "") if config.data.path else "local files"}.

## Results ({config.data.eval_split} split)

| metric | value |
| --- | --- |
{metric_rows}

## Usage

```python
from transformers import pipeline

predictor = pipeline("{task_tag}", model="{model_name}")
```

## Training hyperparameters

- seed: {config.seed}
{hyperparameters}

## Framework versions

{_versions()}
"""
    return ModelCard.from_template(card_data, template_str="---\n{{ card_data }}\n---\n" + body)


def write_model_card(run_dir: str | Path, config: RunConfig, task, metrics: dict[str, Any]) -> Path:
    card = build_model_card(config, task.pipeline_tag, metrics, model_name=Path(run_dir).resolve().name)
    path = Path(run_dir) / "README.md"
    card.save(path)
    return path
