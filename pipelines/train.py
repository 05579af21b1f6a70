"""The one training loop, task-agnostic, readable top to bottom.

In:  a validated :class:`~pipelines.config.RunConfig` and the task object built from it.
Out: the run directory (model + tokenizer in safetensors, ``config.yaml``, ``log.jsonl``,
     ``training_curves.png``, ``README.md`` card, ``metrics.json`` last) and the final metrics.
     With ``model.peft`` the model is the adapter (``adapter_config.json`` +
     ``adapter_model.safetensors`` + the task model's ``config.json``), and ``merged/`` the full
     model when ``model.peft.merge`` is set. With ``hub.push`` the run is published last. With
     ``distill`` the model trained is the student (pipelines/distill.py), saved as a normal run.

accelerator -> data (main process first) -> tokenizer/model -> loaders -> optimizer/schedule ->
prepare -> resume -> for each batch: accumulate, loss, backward, clip, step -> log / evaluate /
checkpoint on schedule -> final evaluation -> save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate.utils import set_seed
from datasets import Dataset
from tqdm.auto import tqdm

from pipelines import outputs
from pipelines.adapters import MERGED_DIR, apply_peft, base_model_id, is_peft_model, save_adapter_run, save_merged_model
from pipelines.atomic_writes import replacing_files, replacing_folder, write_json
from pipelines.autocast_safety import make_autocast_safe
from pipelines.batching import eval_dataloader, exact_eval_batch_size, feature_lengths, train_dataloader
from pipelines.card import write_model_card
from pipelines.checkpoint import (
    SOURCES_FILE, CheckpointError, TrainerState, check_resume_config, complete_checkpoints, find_checkpoint, load_checkpoint,
    save_checkpoint, source_digests,
)
from pipelines.config import ConfigError, RunConfig, is_model_option
from pipelines.data import PreparedData, features_digest, prepare_data, split_source, split_where
from pipelines.distill import build_distillation_model, student_of, student_state_dict
from pipelines.dropout import draw_cheap_attention_dropout_masks, draw_cheap_dropout_masks
from pipelines.errors import OutputDirError, RunStopped, TrainingDiverged, failures_named
from pipelines.evaluation import evaluate
from pipelines.first_position import last_layer_at_first_position
from pipelines.labelled_positions import head_at_labelled_positions
from pipelines.modeling import (
    WEIGHTS_DTYPE, check_sequence_lengths, check_vocabulary, count_parameters, freeze_input_embeddings, parameter_shapes_digest,
)
from pipelines.optim import LossWeighting, build_optimizer, build_scheduler, clip_gradients, plan_steps
from pipelines.packing import PackingCollator, check_packing_is_exact, count_samples_and_tokens, packing_probe, position_offset
from pipelines.preemption import StopNow, StopSignals, stopping_at_once
from pipelines.runtime import (
    build_accelerator, check_compile_backend, check_trackers, end_run, refuse_processes_that_differ, resolve_mixed_precision,
    wrap_model_layers_for_fsdp,
)
from pipelines.task import Task

logger = logging.getLogger(__name__)

BEST_MODEL_DIR = "best_model"


def _is_better(value: float, best: float | None, greater_is_better: bool) -> bool:
    """A NaN (Pearson of constant predictions) is never the best, and any number beats a NaN best: NaN
    loses every comparison, so a first NaN evaluation stayed the best model, reloaded at the end."""
    if math.isnan(value):
        return False
    return best is None or math.isnan(best) or (value > best if greater_is_better else value < best)


def _flat_config(config: RunConfig) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            flat[prefix] = node if isinstance(node, (int, float, str, bool)) else str(node)

    walk("", config.to_yaml_dict())
    return flat


def train(
    config: RunConfig, task: Task, *, on_start: Callable[[Path], None] | None = None,
    on_evaluate: Callable[[int, dict[str, float]], bool] | None = None,
    on_final_metrics: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``config`` with ``task``; returns the final metrics (also written to ``metrics.json``).

    ``on_start(run_dir)`` is called on the main process once the run directory is set up (validated,
    an old run replaced, ``config.yaml`` written), so a caller can add its own record of the run.
    ``on_evaluate(step, metrics)`` is called after each scheduled evaluation (not the final one);
    returning True stops training there, as early stopping does. It is how a caller watches a run
    without the loop knowing why, e.g. a hyperparameter search pruning a hopeless trial.
    ``on_final_metrics(metrics)`` is called once the final metrics are known, before the model and the run's
    files are saved: a benchmark times the run's evaluation there, not its writing.
    """
    # Everything that can refuse the run is checked before anything in output_dir changes: the folder
    # rules, the resume settings, then data, tokenizer, model, sequence length and the checkpoint's
    # tensors. Only then is an old run set aside (overwrite=true: deleted once this run has finished) and
    # the new config written.
    # Resolved once: a resume compares it with the precision its checkpoint trained in.
    mixed_precision = resolve_mixed_precision(config.train.mixed_precision)
    replace_old_run, resume_folder = _check_run_settings(config, task, mixed_precision)
    finished = Path(config.output_dir) / outputs.METRICS_FILE
    if config.train.resume_from_checkpoint and finished.is_file():
        # A resume of a finished run ends where it ended, after rewriting its config and log and adding a checkpoint:
        # interrupted, it left a "finished" run whose files had changed. A requeued job resumes whatever it finds, so
        # this is no error: the run's own metrics, nothing written.
        logger.warning("%s holds a finished run (%s): nothing to resume", config.output_dir, outputs.METRICS_FILE)
        return json.loads(finished.read_text(encoding="utf-8"))
    if resume_folder is not None and config.train.load_best_model_at_end:
        _check_best_model_kept(resume_folder, Path(config.output_dir) / BEST_MODEL_DIR)
    accelerator = build_accelerator(config, mixed_precision=mixed_precision)
    try:
        summary = _run(accelerator, config, task, replace_old_run=replace_old_run, resume_folder=resume_folder,
                       on_start=on_start, on_evaluate=on_evaluate, on_final_metrics=on_final_metrics)
    except RunStopped as stopped:
        # A stop every process agreed on (at the same step): each ends the run as a finished one does,
        # once the traceback's frames no longer hold the prepared model.
        traceback.clear_frames(stopped.__traceback__)
        end_run(accelerator)
        raise
    end_run(accelerator)  # _run has returned: nothing holds the prepared model now
    if config.hub.push and accelerator.is_main_process:
        from pipelines.publish import publish_run

        publish_run(Path(config.output_dir), config, task, repo_id=config.hub.repo_id, private=config.hub.private,
                    revision=config.hub.revision)
    return summary


def _run(
    accelerator, config: RunConfig, task: Task, *, replace_old_run: bool, resume_folder: Path | None,
    on_start: Callable[[Path], None] | None, on_evaluate: Callable[[int, dict[str, float]], bool] | None,
    on_final_metrics: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """The run itself, from data to saved model: :func:`train` without the checks before it and the end after it."""
    run_dir = Path(config.output_dir)
    set_seed(config.seed)
    # The contents of the files the run reads, digested as it reads them: at the first checkpoint, a file
    # edited meanwhile was recorded as the one trained on, and a multi-GB one was read inside a SIGTERM's grace.
    sources = source_digests(config.to_yaml_dict()) if accelerator.is_main_process else None

    # Data: the main process tokenises first and fills the datasets cache; the others read it.
    with accelerator.main_process_first():
        data = prepare_data(task, config)
    train_features, eval_features = data.train_features, data.eval_features
    model = _build_model(config, task, data)
    train_data = features_digest(train_features)
    if accelerator.num_processes > 1:
        # Before DDP compares the processes' parameter shapes (a raw traceback when they differ) and before the loop
        # trains each process on data the others do not have.
        refuse_processes_that_differ(accelerator, {
            "training data": (train_data, split_source(config.data, config.data.train_split)),
            "evaluation data": (features_digest(eval_features), split_source(config.data, config.data.eval_split)),
            "model": (parameter_shapes_digest(model), f"model.name_or_path={config.model.name_or_path}" if config.model.name_or_path else "model.architecture"),
        })
    make_autocast_safe(model)  # a family whose transformers code fails under bf16/fp16 autocast (DeBERTa v1)
    if accelerator.device.type == "cpu":
        # torch's CPU dropout draws a double per mask element, serially (pipelines/dropout.py).
        draw_cheap_dropout_masks(model)
        draw_cheap_attention_dropout_masks(model)
    if not config.train.pack_sequences:
        # A packed row holds several examples, each with its own first position.
        last_layer_at_first_position(model)
    # A masked-LM or seq2seq vocabulary head computes the positions the loss reads only (pipelines/labelled_positions.py).
    head_at_labelled_positions(model)
    trainable_params, total_params = count_parameters(model)
    if config.train.compile:
        # In place (nn.Module.compile): the module keeps its class and state_dict keys, so unwrapping,
        # saving and best-model reloading work unchanged. Shapes vary per batch: after the first
        # recompile torch marks them dynamic instead of compiling every new length.
        model.compile(backend=config.train.compile_backend)
    eval_batch_size = exact_eval_batch_size(task.predict_step, model, task.collator(train=False), eval_features,
                                            config.train.eval_batch_size_or_default, where=f"output_dir {run_dir}",
                                            accelerator=accelerator)
    train_loader, train_sampler = train_dataloader(
        train_features, _train_collator(config, task, model, train_features), config.train.batch_size,
        seed=config.seed, group_by_length=config.train.group_by_length and not config.train.pack_sequences,
        length_group_batches=config.train.length_group_batches, num_workers=config.train.dataloader_num_workers,
    )
    eval_loader, eval_sampler = eval_dataloader(
        eval_features, task.collator(train=False), eval_batch_size, num_workers=config.train.dataloader_num_workers
    )

    wrap_model_layers_for_fsdp(accelerator, model)
    optimizer = build_optimizer(model, config.train)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    plan = plan_steps(config.train, len(train_loader))
    scheduler = accelerator.prepare(build_scheduler(optimizer, config.train, plan, accelerator.num_processes))

    state = TrainerState(train_data=train_data)
    if resume_folder is not None:
        state = load_checkpoint(accelerator, resume_folder, train_data=train_data, plan=plan)
        accelerator.print(
            f"resumed from {resume_folder} at step {state.global_step} (epoch {state.epoch}, batch {state.batches_in_epoch})"
        )

    best = BestModel.from_config(config, task, data.eval_examples)  # before the run folder is written: it may refuse the metric's name
    step_log = _open_run_dir(accelerator, config, state, data.tokenizer, sources, replace_old_run=replace_old_run, on_start=on_start)

    def log(record: dict[str, Any]) -> None:
        record = {"step": state.global_step, "epoch": round(state.epoch + state.batches_in_epoch / plan.batches_per_epoch, 4), **record}
        state.log_history.append(record)
        if step_log is not None:
            step_log.write(record)
        accelerator.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=state.global_step)

    # The last evaluation's predictions, step and metrics: one that ends the run (early stopping) is its final one.
    last_evaluation: dict[str, Any] = {}

    def require_finite(loss: float) -> None:
        """A loss that is no longer a finite number ends the run (exit status 2), before a model of NaNs is
        evaluated or saved: argmax over NaN logits is label 0, and such a run reported a believable accuracy."""
        if not math.isfinite(loss):
            raise _diverged(config, state.global_step, f"the training loss became {loss}", run_dir)

    def run_evaluation() -> dict[str, float]:
        if interval_batches:  # what the last logged loss does not cover (a collective: every process calls it)
            require_finite(accelerator.reduce(interval_loss.clone(), reduction="mean").item())
        started = time.perf_counter()
        predictions, metrics = evaluate(accelerator, model, eval_loader, task, eval_features, data.eval_examples, order=eval_sampler.order)
        metrics["eval_runtime"] = round(time.perf_counter() - started, 3)
        model.train()
        last_evaluation.update(step=state.global_step, predictions=predictions, metrics=metrics)
        return predictions, metrics

    progress = tqdm(total=plan.total_updates, initial=state.global_step, desc="train", disable=not accelerator.is_local_main_process)
    # Tensors, not ints: int(mask.sum()) every step would force a device sync on accelerators.
    samples_seen = torch.zeros((), dtype=torch.int64, device=accelerator.device)
    tokens_seen = torch.zeros((), dtype=torch.int64, device=accelerator.device)
    interval_loss = torch.full((), float(state.interval_loss), device=accelerator.device)
    interval_batches = state.interval_batches
    loss_weighting = LossWeighting(accelerator)
    if config.train.eval_on_start and state.global_step == 0:
        log(run_evaluation()[1])
    train_started = time.perf_counter()
    # What earlier segments of a resumed run trained on; this segment's counts are added to them.
    earlier_samples, earlier_tokens, earlier_runtime = state.train_samples, state.train_tokens, state.train_runtime

    def update_totals() -> None:
        """Whole-run totals over all processes, and the loss not yet logged, into ``state`` (a
        collective: every process calls it)."""
        state.train_samples = earlier_samples + int(accelerator.reduce(samples_seen.clone(), reduction="sum").item())
        state.train_tokens = earlier_tokens + int(accelerator.reduce(tokens_seen.clone(), reduction="sum").item())
        state.train_runtime = earlier_runtime + (time.perf_counter() - train_started)
        # The mean over processes of the per-process sums: logging takes the mean of (sum / batches),
        # which is linear, so every process restarting from this value logs what it would have.
        state.interval_loss = accelerator.reduce(interval_loss.clone(), reduction="mean").item()
        state.interval_batches = interval_batches

    def log_training_loss() -> None:
        """The mean loss since the last logged step, logged and added to the run's ``train_loss``."""
        nonlocal interval_batches
        mean_loss = accelerator.reduce(interval_loss / interval_batches, reduction="mean").item()
        require_finite(mean_loss)
        state.train_loss_sum += mean_loss * interval_batches
        state.train_loss_count += interval_batches
        log({"loss": round(mean_loss, 6), "learning_rate": scheduler.get_last_lr()[0]})
        progress.set_postfix(loss=f"{mean_loss:.4f}")
        interval_loss.zero_()
        interval_batches = 0

    def write_checkpoint() -> Path:
        return save_checkpoint(accelerator, run_dir, state, config.train.save_total_limit, config=config.to_yaml_dict(),
                               sources=sources)

    def checkpoint() -> Path:
        update_totals()
        require_finite(state.interval_loss)
        return write_checkpoint()

    model.train()
    with StopSignals() as stop_signals:
        while state.epoch < plan.num_epochs and state.global_step < plan.total_updates and not state.stopped_early:
            # Both calls matter: the sampler may sit under Accelerate's shard wrapper, and the prepared
            # loader re-applies its own epoch counter to the sampler each time it is iterated.
            train_sampler.set_epoch(state.epoch)
            train_loader.set_epoch(state.epoch)
            batches = train_loader
            if state.batches_in_epoch:
                batches = accelerator.skip_first_batches(train_loader, state.batches_in_epoch)
                batches.set_epoch(state.epoch)
            for batch in batches:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss_weighting.weigh(loss, batch))
                    if accelerator.sync_gradients:
                        loss_weighting.finish_window(model.parameters())
                        if config.train.max_grad_norm:
                            clip_gradients(accelerator, model.parameters(), config.train.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                interval_loss += loss.detach()
                interval_batches += 1
                state.batches_in_epoch += 1
                batch_samples, batch_tokens = count_samples_and_tokens(batch)
                samples_seen += batch_samples
                tokens_seen += batch_tokens
                if not accelerator.sync_gradients:
                    continue

                state.global_step += 1
                progress.update(1)
                if state.global_step % config.train.logging_steps == 0 or state.global_step == plan.total_updates:
                    log_training_loss()

                # The last step's evaluation is the final one, after the loop.
                if config.train.eval_steps and state.global_step % config.train.eval_steps == 0 and state.global_step < plan.total_updates:
                    _, metrics = run_evaluation()
                    log(metrics)
                    if best.metric_name and best.update(metrics, state, save=lambda folder: _save_model(accelerator, model, folder)):
                        accelerator.print(f"early stopping: {best.metric_name} has not improved for {best.patience} evaluations")
                        state.stopped_early = True
                    if on_evaluate is not None and on_evaluate(state.global_step, metrics):
                        state.stopped_early = True
                folder = checkpoint() if config.train.save_steps and state.global_step % config.train.save_steps == 0 else None
                # Last in the step, after its evaluation and checkpoint: the resume starts with the next step,
                # so it skips nothing the uninterrupted run does at this one.
                if (received := stop_signals.agreed()) is not None:
                    progress.close()
                    raise RunStopped(received, state.global_step, plan.total_updates, folder or checkpoint())
                if state.global_step >= plan.total_updates or state.stopped_early:
                    break
            else:
                state.epoch += 1
                state.batches_in_epoch = 0
    if interval_batches:
        # Stopped early between logging steps: the batches since the last logged loss count too.
        log_training_loss()
    progress.close()
    update_totals()
    # The last update comes after the last loss: it may be the one that overflowed.
    nonfinite = torch.tensor([float(any(not torch.isfinite(p).all() for p in model.parameters()))], device=accelerator.device)
    if accelerator.reduce(nonfinite, reduction="sum").item():
        raise _diverged(config, state.global_step, "the weights stopped being finite numbers at the last update", run_dir)

    def final_evaluation() -> tuple[Any, dict[str, float]]:
        try:
            # With several processes a signal may reach one alone, which would wait at the checkpoint for the
            # others, still evaluating: those keep the signals' usual effect.
            with stopping_at_once() if accelerator.num_processes == 1 else contextlib.nullcontext():
                return run_evaluation()
        except StopNow as stop:
            raise RunStopped(stop.signal, state.global_step, plan.total_updates, _final_checkpoint(
                run_dir, state, stop.signal,
                write_checkpoint,  # not checkpoint(): its totals would count the evaluation's seconds as training time
            )) from None

    # The last model is evaluated once: an evaluation that stopped the run early already did (evaluated again,
    # the step was logged twice), as did a resumed run's before its interruption (its record is in the log).
    if not _evaluated_at(state.log_history, state.global_step):
        final_evaluation()
        log(last_evaluation["metrics"])
        if best.metric_name:  # a candidate too: never compared, the last model lost to an earlier, worse best
            best.update(last_evaluation["metrics"], state, save=lambda folder: None)  # kept in memory, saved below
    if best.folder is not None and state.best_step not in (None, state.global_step) and best.folder.is_dir():
        accelerator.print(f"loading the best model (step {state.best_step}, {best.metric_name}={state.best_metric:.4f})")
        _load_best_model(student_of(accelerator.unwrap_model(model)), best.folder)
        predictions, final_metrics = final_evaluation()  # the saved model's own predictions; its step's record holds the metrics
    elif last_evaluation.get("step") == state.global_step:
        predictions, final_metrics = last_evaluation["predictions"], last_evaluation["metrics"]
    else:  # resumed after the last step's evaluation, which is logged already
        predictions, final_metrics = final_evaluation()
    if on_final_metrics is not None:
        on_final_metrics(final_metrics)
    summary = _summary(final_metrics, state, accelerator, epoch=round(state.epoch + state.batches_in_epoch / plan.batches_per_epoch, 4),
                       trainable_params=trainable_params, total_params=total_params)
    _finish_run(accelerator, config, task, model, data, predictions, summary, state.log_history, step_log)
    return summary


def _diverged(config: RunConfig, step: int, what: str, run_dir: Path) -> TrainingDiverged:
    causes = [f"train.learning_rate={config.train.learning_rate:g} too high"]
    if not config.train.max_grad_norm:
        causes.append("no gradient clipping (train.max_grad_norm)")
    if config.distill is not None:
        causes.append(f"distill.temperature={config.distill.temperature:g} (logits divided by it overflow when it is tiny)")
    causes.append("a data row the model cannot score")
    return TrainingDiverged(
        f"training diverged by step {step}: {what}, so the model's weights are no longer numbers (look for "
        f"{', '.join(causes)}). The unfinished run in {run_dir} and its checkpoints cannot be resumed into a good "
        "model: train again, with the cause changed and overwrite=true."
    )


def _evaluated_at(log_history: list[dict[str, Any]], step: int) -> bool:
    """Whether the log holds an evaluation of the model at ``step``."""
    return any(record["step"] == step and any(key.startswith("eval_") for key in record) for record in log_history)


def _final_checkpoint(run_dir: Path, state: TrainerState, received: signal.Signals, checkpoint: Callable[[], Path]) -> Path:
    """The last step's checkpoint, for a run stopped during its final evaluation: the one
    ``train.save_steps`` wrote at that step, else a new one. A second signal while it is written stops
    at once, as in the loop (the partial checkpoint is discarded)."""
    written = complete_checkpoints(run_dir)
    if written and TrainerState.read(written[-1]).global_step == state.global_step:
        return written[-1]
    guard = StopSignals()
    guard.received = received  # noted already: the next one is the second
    with guard:
        return checkpoint()


# ----- set-up -------------------------------------------------------------------------------
def _check_run_settings(config: RunConfig, task: Task, mixed_precision: str) -> tuple[bool, Path | None]:
    """The output folder rules, the resume settings and the settings the task cannot honour, before
    anything is loaded or written: (whether an old run will be replaced, the checkpoint to resume from)."""
    if config.train.pack_sequences and not task.packable:
        raise ConfigError(f"train.pack_sequences: the {task.name} task's batches cannot be packed (only per-token tasks such as ner pack)")
    if config.train.pack_sequences and config.distill is not None:
        raise ConfigError("train.pack_sequences: not with distill (the teacher would need packed inputs too)")
    task_models = [value for name, value in config.task_options.model_dump().items() if is_model_option(name)]
    if config.model.freeze_input_embeddings and config.model.name_or_path is None and not any(task_models):
        raise ConfigError("model.freeze_input_embeddings: the model starts from scratch (model.name_or_path is unset), so "
                          "its input embeddings are random and would never be trained")
    if config.train.compile:
        check_compile_backend(config.train.compile_backend)
    check_trackers(config.train.report_to)
    replace_old_run = outputs.check_output_dir(config)
    resume_folder = None
    if config.train.resume_from_checkpoint:
        try:
            resume_folder = find_checkpoint(config.train.resume_from_checkpoint, Path(config.output_dir))
        except CheckpointError:
            # A finished run that kept no checkpoint (save_steps unset, the default): a requeued job's resume of it
            # is no error either (train() says the run is finished), where it was refused as "nothing to resume".
            if config.train.resume_from_checkpoint == "latest" and (Path(config.output_dir) / outputs.METRICS_FILE).is_file():
                return replace_old_run, None
            raise
        check_resume_config(resume_folder, config.to_yaml_dict(), mixed_precision=mixed_precision)
    return replace_old_run, resume_folder


def _check_best_model_kept(resume_folder: Path, best_folder: Path) -> None:
    """Refuse a resume whose checkpoint names a best model that is no longer saved: the run would end
    silently with the last weights under the best step's name (a finished run removes ``best_model/``)."""
    try:
        best_step = TrainerState.read(resume_folder).best_step
    except (OSError, ValueError, TypeError):  # load_checkpoint() reports an unreadable checkpoint by its path
        return
    if best_step is not None and not best_folder.is_dir():
        raise CheckpointError(
            f"train.resume_from_checkpoint={resume_folder}: its best model (step {best_step}), to be reloaded at the end "
            f"under train.load_best_model_at_end, was saved in {best_folder}, which no longer exists (a finished run "
            "removes it after reloading it). Start a new run instead (another output_dir, or overwrite=true)."
        )


def _build_model(config: RunConfig, task: Task, data: PreparedData) -> torch.nn.Module:
    """The task's model (wrapped by peft when ``model.peft`` is set; as the student of a distillation
    wrapper when ``distill`` is), checked against both splits' sequence lengths."""
    model = apply_peft(task.build_model(data.raw), config.model.peft, task.peft_task_type,
                       base_model_name_or_path=base_model_id(config.model), base_model_revision=config.model.revision)
    check_vocabulary(model, data.tokenizer, config.model)
    for split, features in ((config.data.train_split, data.train_features), (config.data.eval_split, data.eval_features)):
        check_sequence_lengths(model.config, features, where=split_where(config.data, split))
    if config.distill is not None:
        # The student inside a wrapper whose forward returns the distillation loss as .loss; the
        # loop does not change, and student_of() unwraps it wherever the model is saved.
        model = build_distillation_model(model, config, task)
        # The teacher reads every training batch too, and a student of its own (init: model) may
        # have more positions than it: say so before step 1, not at the first long batch.
        check_sequence_lengths(model.teacher.config, data.train_features,
                               where=f"split {config.data.train_split!r} ({split_source(config.data, config.data.train_split)}), read by the teacher")
    if config.model.freeze_input_embeddings:
        # Once the student has its final shape: a student of the teacher's layers is a new model.
        freeze_input_embeddings(student_of(model))
    return model


def _train_collator(config: RunConfig, task: Task, model: torch.nn.Module, train_features) -> Callable:
    """The task's training collator, packed under ``train.pack_sequences`` once packing is shown exact for this model."""
    collate = task.collator(train=True)
    if not config.train.pack_sequences:
        return collate
    packing = PackingCollator(collate, pad_token_id=task.tokenizer.pad_token_id, position_offset=position_offset(model))
    # A handful of real features of different lengths, so rows hold several examples and padding.
    probe = packing_probe(feature_lengths(train_features))
    if probe is not None:
        check_packing_is_exact(model, collate, packing, [train_features[index] for index in probe], family=model.config.model_type)
    return packing


def _open_run_dir(
    accelerator, config: RunConfig, state: TrainerState, tokenizer, sources: dict[str, str] | None, *, replace_old_run: bool,
    on_start: Callable[[Path], None] | None,
) -> outputs.StepLog | None:
    """Set an old run aside (overwrite=true), write ``config.yaml``, the digests of the files it names
    (``sources.json``: what ``evaluate`` carves a held-out split from again) and the tokenizer, start the
    trackers and the step log (the main process's; None on the others)."""
    run_dir = Path(config.output_dir)
    if accelerator.is_main_process:
        with failures_named(OutputDirError, f"output_dir {run_dir}"):
            if replace_old_run:
                aside = outputs.set_aside_run_dir(run_dir)
                logger.warning("overwrite=true: the run this one replaces is kept in %s until this one has finished", aside)
            run_dir.mkdir(parents=True, exist_ok=True)
            outputs.save_config(config, run_dir)
            # From the start, not only with the model: a resume must read the tokenizer this run
            # trained (MLM from scratch), as the trainer may not retrain the same one.
            outputs.save_tokenizer(tokenizer, run_dir)
            write_json(run_dir / SOURCES_FILE, sources)
        if on_start is not None:
            on_start(run_dir)
    accelerator.wait_for_everyone()

    if config.train.report_to:
        accelerator.init_trackers(run_dir.name, config=_flat_config(config))
    if not accelerator.is_main_process:
        return None
    # Rewritten from the checkpoint's history: records an interrupted run wrote after its last
    # checkpoint would otherwise appear twice.
    return outputs.StepLog(run_dir, state.log_history)


# ----- finish -------------------------------------------------------------------------------
def _summary(
    final_metrics: dict[str, float], state: TrainerState, accelerator, *, epoch: float, trainable_params: int, total_params: int,
) -> dict[str, Any]:
    """``metrics.json``: the final evaluation and the whole run's training figures."""
    total_samples, total_tokens, train_runtime = state.train_samples, state.train_tokens, state.train_runtime
    summary = {
        **final_metrics,
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "global_step": state.global_step,
        "epoch": epoch,
        "train_loss": state.train_loss_sum / max(state.train_loss_count, 1),
        "train_runtime": round(train_runtime, 3),
        "train_samples": total_samples,
        "train_tokens": total_tokens,
        "train_samples_per_second": round(total_samples / train_runtime, 3) if train_runtime else 0.0,
        "train_tokens_per_second": round(total_tokens / train_runtime, 3) if train_runtime else 0.0,
        "trainable_params": trainable_params,
        "total_params": total_params,
    }
    if state.best_step is not None:
        summary.update(best_step=state.best_step, best_metric=state.best_metric)
    return summary


def _finish_run(
    accelerator, config: RunConfig, task: Task, model, data: PreparedData, predictions: Any, summary: dict[str, Any],
    log_history: list[dict], step_log: outputs.StepLog | None,
) -> None:
    """Save the model (or adapter; ``merged/`` when asked), tokenizer, the task's artifacts, the curves,
    the card and ``metrics.json`` (last: it marks a finished run)."""
    run_dir = Path(config.output_dir)
    accelerator.wait_for_everyone()
    unwrapped = student_of(accelerator.unwrap_model(model))
    # A full disk reaches safetensors as a SafetensorError and torch.save as a RuntimeError, neither
    # an OSError: without this the run ended in a traceback. metrics.json is not written, so the run
    # stays unfinished and resumable.
    with failures_named(OutputDirError, f"output_dir {run_dir}: the trained run could not be saved (free space, then run "
                        "the same command with train.resume_from_checkpoint=latest, or overwrite=true without a checkpoint)"):
        _save_model(accelerator, model, run_dir)
        if accelerator.is_main_process:
            outputs.save_tokenizer(data.tokenizer, run_dir)
            if config.model.peft is not None and config.model.peft.merge:
                with replacing_folder(run_dir / MERGED_DIR, label="merged model folder") as staging:
                    save_merged_model(unwrapped, data.tokenizer, staging)
            task.save_artifacts(predictions, data.eval_examples, str(run_dir))
            outputs.plot_training_curves(log_history, run_dir / outputs.PLOT_FILE)
            write_model_card(run_dir, config, task, summary)
            write_json(run_dir / outputs.METRICS_FILE, summary)
            # After metrics.json: a resume of a run that failed before it reloads the best model from here,
            # and the run it replaces (overwrite=true) is kept until this one is complete.
            shutil.rmtree(run_dir / BEST_MODEL_DIR, ignore_errors=True)
            outputs.drop_replaced_run(run_dir)
            step_log.close()
    accelerator.wait_for_everyone()


def _save_model(accelerator, model, folder: Path) -> None:
    """A full model through transformers, or (for a PeftModel) only the adapter and the head; each file
    whole or not replaced (a resumed finished run and each new best model write over a saved model)."""
    wrapper = accelerator.unwrap_model(model)
    unwrapped = student_of(wrapper)
    # Every process takes part in gathering a sharded model's weights; the main process alone writes them.
    state_dict = None if is_peft_model(unwrapped) else student_state_dict(wrapper, accelerator.get_state_dict(model))
    if not accelerator.is_main_process:
        return
    with replacing_files(folder, "model") as staging:
        if state_dict is None:
            save_adapter_run(unwrapped, staging)
            # peft's stub card would replace the run's own card until the run has rewritten it.
            (staging / "README.md").unlink(missing_ok=True)
        else:
            unwrapped.save_pretrained(staging, state_dict=state_dict)


def _load_best_model(model, folder: Path) -> None:
    if is_peft_model(model):
        from peft import load_peft_weights, set_peft_model_state_dict

        set_peft_model_state_dict(model, load_peft_weights(str(folder)))
        return
    best = type(model).from_pretrained(folder, dtype=WEIGHTS_DTYPE)
    model.load_state_dict(best.state_dict())


@dataclass(frozen=True)
class BestModel:
    """Best-model tracking and early stopping, as configured; the record itself (best metric and step,
    evaluations without improvement) lives in :class:`TrainerState`, so a checkpoint carries it."""

    metric_name: str | None
    greater_is_better: bool
    folder: Path | None
    """Where the best model is saved, to be reloaded at the end (``load_best_model_at_end``); else None."""
    patience: int | None

    @classmethod
    def from_config(cls, config: RunConfig, task: Task, eval_examples: Dataset | None = None) -> "BestModel":
        metric_name = config.train.metric_for_best_model
        reported = [f"eval_{name}" for name in task.metric_names()]
        if metric_name and metric_name not in reported:
            raise ConfigError(f"train.metric_for_best_model={metric_name!r} is not a metric the {task.name} task reports with "
                              f"these settings; it reports {', '.join(reported)}")
        absent = task.metrics_absent_from(eval_examples) if metric_name and eval_examples is not None else {}
        if metric_name and (why := absent.get(metric_name.removeprefix("eval_"))):
            always = ", ".join(name for name in reported if name.removeprefix("eval_") not in absent)
            raise ConfigError(f"train.metric_for_best_model={metric_name!r} is not reported on this run's eval split: {why}. "
                              f"Choose one it reports at every evaluation ({always}), or an eval split that holds it")
        greater_is_better = config.train.metric_greater_is_better(metric_name, task.higher_is_better)
        folder = Path(config.output_dir) / BEST_MODEL_DIR if config.train.load_best_model_at_end else None
        return cls(metric_name, greater_is_better, folder, config.train.early_stopping_patience)

    def update(self, metrics: dict[str, float], state: TrainerState, *, save: Callable[[Path], None]) -> bool:
        """Record an evaluation in ``state``, ``save``-ing the model to :attr:`folder` when it is the new
        best and will be reloaded; True when the patience has run out (stop early)."""
        if self.metric_name not in metrics:
            raise ConfigError(f"train.metric_for_best_model={self.metric_name!r} is not among the eval metrics {sorted(metrics)}")
        value = metrics[self.metric_name]
        if _is_better(value, state.best_metric, self.greater_is_better):
            state.best_metric, state.best_step = value, state.global_step
            state.evaluations_without_improvement = 0
            if self.folder is not None:
                save(self.folder)
        else:
            state.evaluations_without_improvement += 1
        return bool(self.patience and state.evaluations_without_improvement >= self.patience)
