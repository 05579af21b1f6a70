"""Side-by-side speed benchmark: bertpipe against the transformers ``Trainer`` on the same job.

In:  a run config (YAML + ``key=value`` overrides), the task registry lookup (handed in by the CLI;
     ``pipelines/`` never imports ``tasks/``), the settings to compare and a number of seeds.
Out: one table (printed, and written as ``benchmark.md`` + ``benchmark.json`` in the output folder)
     with, per setting: train samples/s, non-padding tokens/s, train and wall time, peak RSS, the
     task's main validation metric (mean and range over seeds), achieved useful FLOP/s as a share
     of this machine's measured matmul peak, and the ratios bertpipe / each Trainer setting.

Settings (the same model, data, examples, epochs, batch size, learning rate, schedule, warmup and
max length everywhere; only the machinery differs):

- ``bertpipe``: ``pipelines.train.train`` on the config as given.
- ``trainer_default``: the transformers docs recipe (AutoTokenizer, ``Dataset.map`` tokenisation,
  the task's collator — ``DataCollatorWithPadding`` for classification,
  ``DataCollatorForTokenClassification`` for NER —, ``TrainingArguments``, ``Trainer.train``,
  ``Trainer.predict``) in fp32 with random batches.
- ``trainer_best``: the same with length-grouped batches and bf16 — where bf16 is native. On CPUs
  without AVX-512 BF16/AMX bf16 is emulated and many times slower than fp32, so "best" stays fp32
  there; the table says which precision every row used.

Both sides are scored by the task's own ``postprocess`` and ``compute_metrics`` (the Trainer's
``predict`` logits go through them), so the metric column compares like with like. Every run is
a fresh spawned process: peak RSS is that run's own (``VmHWM`` in the child), and no run
inherits another's warm caches or allocator state. The datasets cache is filled once before the
timed runs so that no setting pays for tokenisation the others get for free; the order of the
settings rotates from seed to seed so that slow drift in machine load is spread over all of them.

Every kind writes into a staging folder that becomes ``--output-dir`` when it has finished (``output``): a new or
empty folder, or an earlier benchmark's with ``--overwrite``; a refusal, a failure or a stop leaves it as it was.

The package, by seam: ``job`` (the config and ``TrainingArguments`` every setting gets), ``measure``
(matmul peak, parameters, peak RSS, trained samples/tokens), ``trainer`` (the Trainer reference),
``report`` (statistics and the table), ``runner`` (the settings x seeds loop, one spawned child per run),
``output`` (the output folder), ``predict`` (``bertpipe predict`` against ``transformers.pipeline()``) and ``to_accuracy`` (wall time for the
config as shipped to reach the Trainer default recipe's final metric).
"""

from __future__ import annotations

from pipelines.benchmark.job import (
    SETTINGS,
    BenchmarkError,
    TaskLookup,
    benchmark_config_tree,
    run_config,
    setting_precision,
    setting_sampler,
    trainer_arguments,
    warmup_updates,
)
from pipelines.benchmark.measure import (
    FLOPS_PER_TOKEN_PER_PARAMETER,
    MatmulPeak,
    TrainingCounter,
    matmul_flops,
    measure_matmul_peak,
    non_embedding_parameters,
)
from pipelines.benchmark.output import benchmark_folder, check_benchmark_folder
from pipelines.benchmark.predict import (
    PREDICT_SETTINGS,
    PredictSpec,
    compare_predictions,
    predict_one,
    run_predict_benchmark,
)
from pipelines.benchmark.report import (
    COLUMNS,
    PREDICT_JSON,
    PREDICT_MARKDOWN,
    RESULT_FILES,
    RESULTS_JSON,
    RESULTS_MARKDOWN,
    TO_ACCURACY_JSON,
    TO_ACCURACY_MARKDOWN,
    format_table,
    summarize,
)
from pipelines.benchmark.runner import RunSpec, default_metric, parse_settings, prepare_job, run_benchmark, run_in_child, run_one
from pipelines.benchmark.trainer import predict_in_dataset_order, trainer_predictions
from pipelines.process_memory import peak_rss_mb

__all__ = [
    "COLUMNS", "FLOPS_PER_TOKEN_PER_PARAMETER", "PREDICT_JSON", "PREDICT_MARKDOWN", "PREDICT_SETTINGS", "RESULT_FILES",
    "RESULTS_JSON", "RESULTS_MARKDOWN", "SETTINGS", "TO_ACCURACY_JSON", "TO_ACCURACY_MARKDOWN", "BenchmarkError", "MatmulPeak",
    "PredictSpec", "RunSpec", "TaskLookup", "TrainingCounter", "benchmark_config_tree", "benchmark_folder",
    "check_benchmark_folder", "compare_predictions", "default_metric", "format_table", "matmul_flops", "measure_matmul_peak",
    "non_embedding_parameters", "parse_settings", "peak_rss_mb", "predict_in_dataset_order", "predict_one", "prepare_job", "run_benchmark",
    "run_predict_benchmark",
    "run_config", "run_in_child", "run_one", "setting_precision", "setting_sampler", "summarize", "trainer_arguments",
    "trainer_predictions", "warmup_updates",
]
