"""PEFT adapters: wrapping a task model, loading and merging adapter runs.

In:  a task model and the ``model.peft`` settings; or an adapter run directory (``adapter_config.json`` +
     ``adapter_model.safetensors`` + the task model's ``config.json`` with its label maps).
Out: :func:`apply_peft` wraps the model in a ``PeftModel`` (LoRA or IA3) whose peft task type is the
     task's ``peft_task_type`` and whose adapter targets and fully trained modules default per
     architecture. :func:`load_adapter_model` loads a run back: base weights from the base id and revision
     the adapter records (resolved through the mirror), then the adapter through peft;
     :func:`enable_adapter_runs_in_pipeline` lets ``pipeline()`` load it the same way.
     :func:`merged_adapter_run` and :func:`save_merged_model` fold the adapter into the base weights
     (a plain transformers model), which a training run started from an adapter run begins with.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.utils import GENERATION_CONFIG_NAME

import models  # noqa: F401  registers bertpipe's own BERT/Transformer, which an adapter's base may be
from pipelines.config import ConfigError, ModelConfig, PeftConfig
from pipelines.errors import ModelError
from pipelines.heads import head_kinds, head_labels_differ, label_list
from pipelines.hub import resolve_model

ADAPTER_CONFIG_FILE = "adapter_config.json"
MERGED_DIR = "merged"

# What peft adapts in a model type its own tables do not list: every linear layer of the model but the
# output layer (peft resolves the name against the model itself).
ALL_LINEAR = "all-linear"

_ADAPTER_HEADS = {"SEQ_CLS": "ForSequenceClassification", "TOKEN_CLS": "ForTokenClassification", "QUESTION_ANS": "ForQuestionAnswering"}
"""The head kind of an adapter run, by the peft task type its adapter_config.json records."""


def peft_task_type(name: str | None):
    """The peft ``TaskType`` a task names (its ``peft_task_type``); None stays None (a plain ``PeftModel``)."""
    from peft import TaskType

    if name is None:
        return None
    if name not in TaskType.__members__:
        raise ModelError(f"no peft task type {name!r}; peft knows: {', '.join(TaskType.__members__)}")
    return TaskType[name]


def _component_types(config: PretrainedConfig) -> list[str]:
    """model_type of the model, or of both halves of an ``EncoderDecoderModel``."""
    if config.model_type == "encoder-decoder":
        return [config.encoder.model_type, config.decoder.model_type]
    return [config.model_type]


def default_target_modules(config: PretrainedConfig, method: str = "lora") -> list[str] | str:
    """Module-name suffixes that get adapters, from peft's own per-model-type table.

    peft lists the attention projections of the model types it knows (BERT/RoBERTa/ELECTRA/XLM-R:
    ``query``/``value``; DeBERTa-v2: ``query_proj``/``value_proj``; T5: ``q``/``v``; BART: ``q_proj``/
    ``v_proj``). Suffix matching reaches every copy: for an encoder-decoder, the self-attention on
    both sides and the decoder's cross-attention. A model type peft does not list (DistilBERT,
    ALBERT, ModernBERT, Marian, mBART, ... or a BERT2BERT half) gets ``"all-linear"``: peft's own
    choice of the model's linear layers, every one but the output layer, so any architecture takes
    an adapter without a hand-kept table of module names.
    """
    from peft.utils.constants import (
        TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING,
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING,
    )

    table = {"lora": TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, "ia3": TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING}[method]
    targets: list[str] = []
    for model_type in _component_types(config):
        found = table.get(model_type)
        if found is None:
            return ALL_LINEAR
        targets += [name for name in found if name not in targets]
    return targets


def default_feedforward_modules(config: PretrainedConfig) -> list[str]:
    """IA3 scales the input (not the output) of these: the feed-forward output projections peft lists."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING

    if default_target_modules(config, "ia3") == ALL_LINEAR:
        return []
    found: list[str] = []
    for model_type in _component_types(config):
        found += TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING.get(model_type, [])
    return list(dict.fromkeys(found))


def default_modules_to_save(model: torch.nn.Module) -> list[str]:
    """The task head: every module outside the base model whose weights the base does not share.

    BERT: ``classifier`` (sequence/token classification), ``qa_outputs`` (QA),
    ``cls.predictions.transform`` (MLM: the vocabulary projection is tied to the input embeddings,
    so it stays frozen and tied rather than being copied and untied). A BERT2BERT
    ``EncoderDecoderModel`` (a finished run: a warm start from two encoders is refused, its new cross-attention
    existing in no checkpoint) returns ``crossattention``, trained in full. Pretrained seq2seq models
    (T5, BART, Marian) have no new head: nothing. Modules whose weights the checkpoint lacked
    (recorded by :func:`pipelines.modeling.load_model`, e.g. ``bert.pooler.dense`` under an MLM checkpoint) are added, and
    so are norms that keep running statistics (BatchNorm).
    """
    if model.config.model_type == "encoder-decoder":
        has_cross_attention = any(name.endswith(".crossattention") for name, _ in model.named_modules())
        return ["crossattention"] if has_cross_attention else []
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or base is model:
        return []
    shared = {id(parameter) for parameter in base.parameters()}
    heads: list[str] = []

    def visit(name: str, module: torch.nn.Module) -> None:
        parameters = list(module.parameters())
        if not parameters:
            return
        if not any(id(parameter) in shared for parameter in parameters):
            heads.append(name)
            return
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}", child)

    for name, child in model.named_children():
        if child is not base:
            visit(name, child)
    return heads + modules_a_base_cannot_restore(model, heads)


def modules_a_base_cannot_restore(model: torch.nn.Module, heads: list[str] | None = None) -> list[str]:
    """Modules an adapter must save whole whatever ``model.peft.modules_to_save`` names: weights the checkpoint did
    not provide (random on every load, see :func:`pipelines.modeling.load_model`) and norms with running statistics.
    ``heads``: modules already saved whole (a module inside one is left out)."""
    heads = list(heads or [])
    found: list[str] = []
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if base is None or base is model or model.config.model_type == "encoder-decoder":
        return found
    shared = {id(parameter) for parameter in base.parameters()}
    # Base weights the checkpoint did not provide (see pipelines.modeling.load_model) are random: train and save them too.
    base_modules = {id(module) for module in base.modules()}
    for key in getattr(model, "bertpipe_initialized_keys", ()):
        module_name = key.rsplit(".", 1)[0]
        if _inside_one_of(module_name, heads + found):
            continue
        # A module holding a weight tied to the base (the vocabulary projection of an MLM head, missing
        # from a checkpoint saved without one, e.g. a sentence-transformers encoder) cannot be copied
        # whole: a copy unties it, and as a parent of a head already listed ("cls.predictions" over
        # "cls.predictions.transform") peft saves an adapter it cannot load back. What such a module
        # lacks is its output bias, which transformers zero-initialises on every load: it stays frozen.
        module = model.get_submodule(module_name)
        if id(module) not in base_modules and any(id(parameter) in shared for parameter in module.parameters()):
            continue
        found.append(module_name)
    # Norms with running statistics (bertpipe's own BERT with norm: batch) change in training although the
    # base is frozen, and an adapter holds only what it names: reloaded onto the base's old statistics,
    # the run would predict otherwise than it evaluated.
    for name, module in base.named_modules():
        if isinstance(getattr(module, "running_mean", None), torch.Tensor) and not _inside_one_of(f"{model.base_model_prefix}.{name}", heads):
            found.append(f"{model.base_model_prefix}.{name}")
    return found


def _inside_one_of(module_name: str, names: list[str]) -> bool:
    """Whether ``module_name`` or a module holding it is one that ``names`` reaches, as peft matches a
    ``modules_to_save`` name: a module whose name ends with it (``pooler`` reaches ``bert.pooler`` and so
    ``bert.pooler.dense``)."""
    parts = module_name.split(".")
    holders = [".".join(parts[: index + 1]) for index in range(len(parts))]
    return any(holder.endswith(name) for holder in holders for name in names)


def base_model_id(model: ModelConfig) -> str | None:
    """What an adapter records as its base: the Hub id (not a mirror path), or an absolute local folder."""
    if model.name_or_path is None:
        return None
    local = Path(model.name_or_path).expanduser()
    return str(local.resolve()) if local.exists() else model.name_or_path


def build_peft_config(model: PreTrainedModel, peft: PeftConfig, task_type: str | None, *, base_model_name_or_path: str | None):
    """The peft ``LoraConfig``/``IA3Config`` for ``model`` under ``peft`` settings and the task's peft task type."""
    from peft import IA3Config, LoraConfig

    _refuse_names_matching_no_module(model, "model.peft.target_modules", peft.target_modules)
    _refuse_names_matching_no_module(model, "model.peft.modules_to_save", peft.modules_to_save)
    target_modules = peft.target_modules if peft.target_modules is not None else default_target_modules(model.config, peft.method)
    if peft.modules_to_save is None:
        modules_to_save = default_modules_to_save(model)
    else:  # a head named by hand: modules the checkpoint lacked are still random on every reload unless saved
        modules_to_save = list(peft.modules_to_save) + modules_a_base_cannot_restore(model, list(peft.modules_to_save))
    common = {
        "task_type": peft_task_type(task_type),
        "target_modules": target_modules,
        # peft's task-type wrappers add their own head names on top (SEQ_CLS/TOKEN_CLS: classifier,
        # score; QUESTION_ANS: qa_outputs); names a model lacks are ignored.
        "modules_to_save": list(modules_to_save),
        "base_model_name_or_path": base_model_name_or_path,
    }
    if peft.method == "ia3":
        feedforward = [name for name in default_feedforward_modules(model.config) if peft.target_modules is None]
        return IA3Config(feedforward_modules=feedforward, **common)
    return LoraConfig(r=peft.r, lora_alpha=peft.alpha, lora_dropout=peft.dropout, **common)


def _refuse_names_matching_no_module(model: torch.nn.Module, key: str, names: list[str] | str | None) -> None:
    """A listed name that matches no module as peft matches it (``target_modules``: the whole module name or its last
    dotted parts; ``modules_to_save``: the end of a module name): peft refuses only a list of which nothing matches,
    and adapted or saved the rest without a word (``qurey``)."""
    if not isinstance(names, list):  # unset, or one regular expression peft matches whole names against
        return
    module_names = [name for name, _ in model.named_modules()]
    if key.endswith("modules_to_save"):
        unmatched = [name for name in names if not any(module.endswith(name) for module in module_names)]
    else:
        unmatched = [name for name in names if not any(module == name or module.endswith("." + name) for module in module_names)]
    if unmatched:
        suffixes = sorted({module.rsplit(".", 1)[-1] for module in module_names if module and not module.rsplit(".", 1)[-1].isdigit()})
        raise ModelError(f"{key}: {unmatched} name no module of {type(model).__name__}; its module names end in {suffixes[:40]}")


def apply_peft(model: PreTrainedModel, peft: PeftConfig | None, task_type: str | None, *, base_model_name_or_path: str | None = None,
               base_model_revision: str | None = None):
    """Wrap ``model`` for parameter-efficient training; returns it unchanged when ``peft`` is None.

    ``task_type`` is the task's ``peft_task_type`` (``SEQ_CLS``, ...; None for a plain ``PeftModel``).
    Only the adapters and ``modules_to_save`` keep ``requires_grad``; the base weights are frozen.
    The adapter records its base by id and revision (``model.revision``), which reloading it reads back.
    """
    if peft is None:
        return model
    if base_model_name_or_path is None:
        raise ModelError("model.peft adapts a pretrained model: set model.name_or_path (a Hub id or folder)")
    if is_adapter_dir(base_model_name_or_path):
        # The new adapter would record the adapter run as its base, which no loader can rebuild a model from: the
        # run trained, saved, and then never loaded again.
        raise ConfigError(
            f"model.name_or_path={base_model_name_or_path} is an adapter run, and a new adapter needs a full model as its "
            f"base: set model.name_or_path={Path(base_model_name_or_path) / MERGED_DIR} (the run merged; `bertpipe merge "
            f"{base_model_name_or_path}` writes it if it is missing)"
        )
    from peft import get_peft_model

    config = build_peft_config(model, peft, task_type, base_model_name_or_path=base_model_name_or_path)
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as error:  # e.g. "Target modules {...} not found in the base model"
        raise ModelError(f"model.peft: {error}") from error
    _refuse_adapting_tied_input_embeddings(wrapped)
    _pass_segments_through(wrapped)
    # get_peft_model records the folder the weights came from (a mirror path); the run records the base id.
    wrapped.peft_config["default"].base_model_name_or_path = base_model_name_or_path
    # Without it the adapter trained on a tagged base would be reloaded on the base's newest weights.
    wrapped.peft_config["default"].revision = base_model_revision
    return wrapped


def _refuse_adapting_tied_input_embeddings(wrapped) -> None:
    """An adapter on input word embeddings whose matrix the output projection shares (a masked-LM decoder, a seq2seq
    LM head) changes the input side alone: a merged model, one shared matrix, cannot hold that, and ``bertpipe merge``
    gave a model predicting otherwise (top fillers changed, logits 10 apart), without a word."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    base = wrapped.get_base_model()
    projection = base.get_output_embeddings()  # a BERT2BERT's is its decoder's, tied to the decoder's embeddings
    if projection is None:
        return
    for name, module in base.named_modules():
        if isinstance(module, BaseTunerLayer) and getattr(module.get_base_layer(), "weight", None) is projection.weight:
            raise ConfigError(
                f"model.peft.target_modules adapts {name}, the input word embeddings, whose matrix the model's output "
                "projection shares: the adapter would change the input side alone, which no merged model (one shared "
                "matrix) can hold. Leave the word embeddings out of target_modules"
            )


def is_peft_model(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG_FILE).is_file()


def adapter_base_model(run_dir: str | Path) -> str:
    """The base model id an adapter run directory records."""
    recorded = json.loads((Path(run_dir) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not recorded:
        raise ModelError(f"{run_dir}/{ADAPTER_CONFIG_FILE} names no base_model_name_or_path; cannot rebuild the base model")
    return recorded


def adapter_base_revision(run_dir: str | Path) -> str | None:
    """The base model revision an adapter run directory records (peft's ``revision``; None: the default branch)."""
    return json.loads((Path(run_dir) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8")).get("revision")


def load_adapter_model(auto_class: Any, run_dir: str | Path, *, is_trainable: bool = False):
    """Base weights (resolved through the mirror) at the revision the adapter records, under the run's
    own config, then the adapter.

    The run's ``config.json`` carries the head's label maps; the base checkpoint's config does not.
    The base revision is the adapter's record, not a revision asked for the adapter itself
    (``model.revision`` names a revision of ``model.name_or_path``, the adapter's repository).
    """
    from peft import PeftModel

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ModelError(f"{run_dir} holds an adapter but no config.json (the task model's config with its label maps)")
    config = AutoConfig.from_pretrained(run_dir)
    recorded = adapter_base_model(run_dir)
    if Path(recorded).is_absolute() and not Path(recorded).exists():
        # A local base is recorded by its absolute path (base_model_id); a Hub id never is one. Left to
        # resolve_model, a moved folder would be looked up as a Hub id in the mirror and on the Hub.
        raise ModelError(
            f"{run_dir / ADAPTER_CONFIG_FILE} records its base model as the local folder {recorded} "
            "(base_model_name_or_path), which no longer exists: put the base model back there, or set "
            "base_model_name_or_path in that file to the folder it is in now"
        )
    if Path(recorded).is_absolute():
        _refuse_a_base_changed_since_training(run_dir, recorded)
    base_location = resolve_model(recorded)
    revision = adapter_base_revision(run_dir)
    base_config = AutoConfig.from_pretrained(base_location, revision=revision)
    wanted = {"id2label": config.id2label} if hasattr(config, "id2label") else {}
    base = auto_class.from_pretrained(
        base_location, config=config, revision=revision, dtype=torch.float32,  # as pipelines.modeling.WEIGHTS_DTYPE
        ignore_mismatched_sizes=head_labels_differ(head_kinds(base_config), label_list(base_config.id2label), wanted),
    )
    if (run_dir / GENERATION_CONFIG_NAME).is_file():
        # The run's beam and length settings (save_adapter_run writes them): from_pretrained read the base checkpoint's,
        # and pipeline() on the run generated with those (transformers' 20-token default, greedy).
        base.generation_config = GenerationConfig.from_pretrained(run_dir)
    return _pass_segments_through(PeftModel.from_pretrained(base, run_dir, is_trainable=is_trainable))


def _refuse_a_base_changed_since_training(run_dir: Path, base: str) -> None:
    """An adapter holds differences from its base's weights: on a local base folder trained again in place
    (``overwrite=true``) or replaced, it served other predictions without a word. The run's ``sources.json`` holds the
    digest of the base's weights and config files it trained on (other files written there since change nothing; runs
    from before it, and Hub bases, are not compared)."""
    from pipelines.checkpoint import MODEL_FILES_KEY, SOURCES_FILE, model_files_digest

    try:
        recorded = json.loads((run_dir / SOURCES_FILE).read_text(encoding="utf-8")).get(MODEL_FILES_KEY)
    except (OSError, ValueError, AttributeError):
        return
    if recorded is None or model_files_digest(base) == recorded:
        return
    raise ModelError(
        f"{run_dir / ADAPTER_CONFIG_FILE} adapts the base model in {base}, whose weights or config changed since the "
        f"adapter was trained (their digest is not the one {run_dir / SOURCES_FILE} records): the adapter would be applied "
        "to other weights. Put back the base it was trained on, or train the adapter again on this one"
    )


def _pass_segments_through(model):
    """``model`` with peft's question-answering wrapper made to hand ``token_type_ids`` and ``position_ids`` on.

    peft's ``PeftModelForQuestionAnswering.forward`` takes both and, for LoRA and IA3, calls the base model without
    them: a QA adapter trained, evaluated and predicted with every context token in segment A, and its merged
    model (``bertpipe merge``, export, a distillation teacher), given the segments, answered otherwise. The
    wrappers of the other heads pass them on; so does the plain ``PeftModel.forward`` this falls back to.
    """
    from peft import PeftModelForQuestionAnswering

    if type(model) is PeftModelForQuestionAnswering:
        model.__class__ = _question_answering_with_segments()
    return model


@functools.cache
def _question_answering_with_segments() -> type:
    from peft import PeftModel, PeftModelForQuestionAnswering

    class QuestionAnsweringWithSegments(PeftModelForQuestionAnswering):
        def forward(self, *args, **kwargs):
            if self.active_peft_config.is_prompt_learning:
                return super().forward(*args, **kwargs)
            return PeftModel.forward(self, *args, **kwargs)

    return QuestionAnsweringWithSegments


def is_adapter_only_dir(path: Any) -> bool:
    """A local adapter run directory: adapter + task config, but no full weights of its own.

    transformers' ``from_pretrained`` reads a folder holding both ``config.json`` and
    ``adapter_config.json`` as a full model with an embedded adapter and looks for its weights there.
    """
    if not isinstance(path, (str, Path)) or not Path(path).is_dir():
        return False
    folder = Path(path)
    has_full_weights = any(folder.glob("model*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return is_adapter_dir(folder) and (folder / "config.json").is_file() and not has_full_weights


def _adapter_run_loader(auto_classes: tuple[type, ...]) -> type:
    """A model class for ``PIPELINE_REGISTRY`` that loads adapter run directories through peft.

    ``pipeline()`` tries its model classes in order and moves on when one raises ``OSError``/``ValueError``,
    so anything that is not an adapter-only run directory is left to the task's own Auto classes.
    """

    class AdapterRunLoader:
        bertpipe_adapter_loader = True

        @classmethod
        def from_pretrained(cls, path: Any, *args: Any, revision: str | None = None, **kwargs: Any):
            if not is_adapter_only_dir(path):
                raise OSError(f"{path} is not an adapter-only run directory")
            failures = []
            # pipeline(..., dtype=torch.bfloat16) passes it here; a dtype it does not name stays fp32.
            dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
            for auto_class in auto_classes:
                try:
                    model = load_adapter_model(auto_class, path).eval()
                except ValueError as error:  # the Auto class does not map this config type
                    failures.append(f"{auto_class.__name__}: {error}")
                    continue
                return model.to(dtype) if isinstance(dtype, torch.dtype) else model
            raise ValueError(f"no model class of this pipeline task loads the adapter run {path}: {'; '.join(failures)}")

    return AdapterRunLoader


def enable_adapter_runs_in_pipeline(pipeline_task: str) -> None:
    """Let ``pipeline(pipeline_task, model=RUN_DIR)`` load an adapter-only run directory (idempotent).

    Without this, transformers 5 looks for full weights in the run directory (it holds ``config.json``
    with the task's label maps, which the base model's config lacks) and fails.
    """
    from transformers.pipelines import PIPELINE_REGISTRY

    entry = PIPELINE_REGISTRY.supported_tasks[pipeline_task]
    model_classes = tuple(entry.get("pt", ()))
    if any(getattr(model_class, "bertpipe_adapter_loader", False) for model_class in model_classes):
        return
    entry["pt"] = (_adapter_run_loader(model_classes),) + model_classes


def save_adapter_run(model, run_dir: str | Path, *, is_main_process: bool = True) -> None:
    """Adapter weights + adapter config + the task model's config (label maps, generation config)."""
    if not is_main_process:
        return
    run_dir = Path(run_dir)
    model.save_pretrained(run_dir)
    base = model.get_base_model()
    base.config.save_pretrained(run_dir)
    if getattr(base, "generation_config", None) is not None and base.can_generate():
        base.generation_config.save_pretrained(run_dir)
    # peft writes its own README.md stub; the run's model card replaces it afterwards.


def merge_adapter(model) -> PreTrainedModel:
    """``model.merge_and_unload()``: the plain transformers model with the adapter folded in and the
    trained copies of ``modules_to_save`` in place of the originals (in place: ``model`` is used up)."""
    from peft.utils.other import ModulesToSaveWrapper

    # peft's generic unload (IA3's, unlike LoRA's) copies `.weight` from the old module onto the
    # new one, which fails for a head kept whole that is not one layer (RoBERTa/ELECTRA/XLM-R's
    # classifier.dense + out_proj, DeBERTa's pooler, ModernBERT's head). Put the trained copies in
    # place first; what is left to unload are the adapter layers themselves.
    base = model.get_base_model()
    wrapped = [(name, module) for name, module in base.named_modules() if isinstance(module, ModulesToSaveWrapper)]
    for name, module in wrapped:
        parent_name, _, child_name = name.rpartition(".")
        trained = module.unload_and_optionally_merge_module(merge=True, safe_merge=False, adapter_names=None)
        setattr(base.get_submodule(parent_name) if parent_name else base, child_name, trained)
    return model.merge_and_unload()


def save_merged_model(model, tokenizer, out_dir: str | Path) -> Path:
    """Fold the adapter into the base weights and save a plain transformers model (+ tokenizer).

    Merges in place: ``model`` must not be trained further afterwards.
    """
    out_dir = Path(out_dir)
    merged = merge_adapter(model)
    merged.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def merged_adapter_run(auto_class, location: str) -> PreTrainedModel:
    """An adapter run's model with the adapter folded in, its head of the kind the run trained.

    The adapter's peft task type names that head (the run's config.json may still name the base's
    architecture). It is loaded as its own kind, as evaluating the run does: loaded into a head of
    another kind, peft fails on head weights it cannot place (RoBERTa's classifier.dense/out_proj
    against a token classifier's single layer). An adapter without a head kind (MLM, translation)
    is loaded as ``auto_class``.
    """
    import transformers

    kind = _ADAPTER_HEADS.get(json.loads((Path(location) / ADAPTER_CONFIG_FILE).read_text(encoding="utf-8")).get("task_type"))
    merged = merge_adapter(load_adapter_model(getattr(transformers, f"AutoModel{kind}") if kind else auto_class, location))
    if kind is not None:
        merged.config.architectures = [type(merged).__name__]
    return merged
