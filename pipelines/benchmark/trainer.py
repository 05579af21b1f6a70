"""The Trainer reference: the transformers docs recipe run on the benchmark's job, scored by the task's code.

In:  a ``RunConfig``, the task built from it and a Trainer setting (``trainer_default``/``trainer_best``).
Out: train samples, non-padding tokens and runtime as the Trainer trained them, and the task's validation
     metrics from its ``postprocess``/``compute_metrics`` applied to the Trainer-trained model's outputs
     (``Trainer.predict`` in dataset order where those are forward outputs, bertpipe's ``predict_step`` else).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from pipelines.autocast_safety import make_autocast_safe
from pipelines.benchmark.job import BenchmarkError, setting_precision, trainer_arguments, warmup_updates
from pipelines.benchmark.measure import TrainingCounter
from pipelines.config import RunConfig
from pipelines.data import prepare_data
from pipelines.modeling import freeze_input_embeddings
from pipelines.runtime import without_autocast


def trainer_predictions(predictions: np.ndarray | tuple, output_names: Sequence[str], wanted: Sequence[str]) -> dict[str, np.ndarray]:
    """``Trainer.predict(...).predictions`` (one array, or a tuple in model-output order) -> the
    task's ``predict_step`` keys, which name model outputs (``logits``, ``start_logits``...)."""
    arrays = (predictions,) if isinstance(predictions, np.ndarray) else tuple(predictions)
    if len(arrays) != len(output_names):
        raise BenchmarkError(f"Trainer returned {len(arrays)} prediction arrays for model outputs {list(output_names)}")
    by_name = dict(zip(output_names, arrays))
    missing = [key for key in wanted if key not in by_name]
    if missing:
        raise BenchmarkError(
            f"the task's predict_step returns {missing}, which are not model outputs {list(output_names)}: "
            "the Trainer reference can only score tasks whose predictions are the model's forward outputs"
        )
    return {key: by_name[key] for key in wanted}


def _model_output_names(task, model, features) -> tuple[list[str], list[str]]:
    """(forward output names in Trainer.predict's order, the keys the task's predict_step returns)."""
    batch = task.collator(train=False)([features[i] for i in range(min(2, len(features)))])
    model.eval()
    with torch.no_grad():
        outputs = model(**batch)
        wanted = list(task.predict_step(model, batch))
    ignored = set(getattr(model.config, "keys_to_ignore_at_inference", None) or [])
    return [key for key in outputs.keys() if key != "loss" and key not in ignored], wanted



def predict_in_dataset_order(trainer, features):
    """``trainer.predict`` with one prediction per feature, in the features' order.

    Under ``train_sampling_strategy="group_by_length"`` transformers 5's Trainer also length-groups
    the *evaluation* batches (``_get_eval_sampler``: a LengthGroupedSampler with shuffled megabatches),
    so predictions would come back in another order than the examples they are scored against.
    """
    strategy = trainer.args.train_sampling_strategy
    trainer.args.train_sampling_strategy = "random"
    try:
        return trainer.predict(features)
    finally:
        trainer.args.train_sampling_strategy = strategy


def _trainer_model_outputs(trainer, task, eval_features) -> dict[str, np.ndarray]:
    """What the task's ``predict_step`` returns, for every eval feature in order, from the Trainer's model.

    ``Trainer.predict`` (the docs recipe) when those are the model's forward outputs (classification
    logits, QA start/end logits). A task that reduces them inside ``predict_step`` (NER's per-token
    argmax and its probability, translation's ``generate``) is predicted through bertpipe's own
    evaluation code on the Trainer-trained model, so both sides are still scored by the same code.
    """
    output_names, wanted = _model_output_names(task, trainer.model, eval_features)
    if set(wanted) <= set(output_names):
        predicted = predict_in_dataset_order(trainer, eval_features)
        return trainer_predictions(predicted.predictions, output_names, wanted)
    from torch.utils.data import DataLoader

    from pipelines.evaluation import concat_padded

    # A plain loop, not run_predictions: the Trainer's Accelerator still holds its training loader's
    # end-of-data state, which gather_for_metrics would use to truncate these batches.
    loader = DataLoader(eval_features, batch_size=trainer.args.per_device_eval_batch_size, collate_fn=task.collator(train=False))
    collected: dict[str, list[np.ndarray]] = {}
    trainer.model.eval()
    with torch.no_grad():
        for batch in loader:
            batch = {key: value.to(trainer.model.device) for key, value in batch.items()}
            for key, tensor in task.predict_step(trainer.model, batch).items():
                collected.setdefault(key, []).append(tensor.float().cpu().numpy() if tensor.is_floating_point() else tensor.cpu().numpy())
    return {key: concat_padded(chunks, task.output_pad_values.get(key, -100)) for key, chunks in collected.items()}


def _run_trainer(config: RunConfig, task, setting: str) -> dict[str, Any]:
    """The docs recipe; every task-specific step is the task's own method, as in bertpipe."""
    from transformers import Trainer, TrainingArguments, set_seed

    # Seeded before the model is built, as the docs' run_glue.py does and as bertpipe's train() does:
    # otherwise the new head's initialisation is unseeded and a run cannot be repeated.
    set_seed(config.seed)
    if config.train.torch_num_threads:
        # As bertpipe's build_accelerator sets them: the Trainer ran on every core against bertpipe's N threads.
        torch.set_num_threads(config.train.torch_num_threads)
    data = prepare_data(task, config)  # bertpipe's own raw splits, tokenizer and features: the same job
    tokenizer, train_features, eval_features = data.tokenizer, data.train_features, data.eval_features
    model = task.build_model(data.raw)
    make_autocast_safe(model)  # bertpipe's mend of a family transformers cannot run in bf16: the same model code
    if config.model.freeze_input_embeddings:
        # The same job on both sides: the Trainer's optimizer takes the parameters that require a gradient.
        freeze_input_embeddings(model)
    collator = task.collator(train=True)
    arguments = trainer_arguments(
        config, setting, config.output_dir, warmup_steps=warmup_updates(config, len(train_features)),
        bf16=setting_precision(config, setting) == "bf16",
    )
    trainer = Trainer(
        model=model, args=TrainingArguments(**arguments), train_dataset=train_features,
        data_collator=collator, processing_class=tokenizer,
    )
    counter = TrainingCounter(trainer.model)
    result = trainer.train()
    samples, tokens = counter.remove()
    trainer.data_collator = task.collator(train=False)
    # Scored in fp32, as bertpipe's evaluations score its model: with bf16 the Trainer's Accelerator has wrapped the
    # model's forward in autocast, predict included, and the metric column would compare two precisions of scoring.
    with without_autocast(trainer.accelerator, trainer.model):
        outputs = _trainer_model_outputs(trainer, task, eval_features)
    predictions = task.postprocess(outputs, eval_features, data.eval_examples)
    metrics = {name: float(value) for name, value in task.compute_metrics(predictions, data.eval_examples).items()}
    trainer.save_model()
    return {"train_samples": samples, "train_tokens": tokens, "train_runtime": result.metrics["train_runtime"], "metrics": metrics}
