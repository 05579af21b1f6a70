"""``transformers.pipeline("question-answering")`` on bertpipe's windows and decoding.

In:  a run directory (model, tokenizer, and the run's QA defaults in
     ``config.task_specific_params["question-answering"]``); questions and contexts at call time.
Out: ``{score, start, end, answer}`` per question (a list for ``top_k > 1``), as transformers 4's
     question-answering pipeline answered. Windows come from :mod:`tasks.qa.windows` and answers
     from :mod:`tasks.qa.decoding`, the same code evaluation and ``bertpipe predict`` use.

Importing this module registers :class:`ExtractiveQuestionAnsweringPipeline` as the
``question-answering`` task of ``transformers.pipeline`` (transformers 5 removed its own).
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForQuestionAnswering, Pipeline

from pipelines.batching import undo_rewrites_after_each_call
from pipelines.graphemes import is_blank
from tasks.qa.decoding import postprocess_qa_predictions
from tasks.qa.windows import check_question_lengths, prepare_features

PIPELINE_TASK = "question-answering"


class ExtractiveQuestionAnsweringPipeline(Pipeline):
    """``pipeline("question-answering", model=RUN_DIR)``: the transformers 4 interface on bertpipe's windows.

    ``qa(question=..., context=...)`` -> ``{score, start, end, answer}``; lists of questions and
    contexts (or of ``{"question", "context"}`` dicts) give a list; ``top_k > 1`` gives a list of
    answers per question. Keyword options: ``top_k``, ``doc_stride``, ``max_seq_len``,
    ``max_answer_len``, ``n_best_size``, ``handle_impossible_answer``, ``null_score_diff_threshold``;
    their defaults come from the run (``config.task_specific_params["question-answering"]``).
    ``score`` is the answer's probability among the n-best candidates (not transformers 4's
    product of start and end probabilities).
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    _DEFAULTS = {"max_seq_len": 384, "doc_stride": 128, "max_answer_len": 30, "n_best_size": 20,
                 "handle_impossible_answer": False, "null_score_diff_threshold": 0.0, "top_k": 1}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Each forward pass runs on the model as loaded, as predict runs it: BigBird switches itself to full
        # attention for good on its first input too short for blocks (a context's short last window), and
        # the windows and questions after it then ran otherwise.
        undo_rewrites_after_each_call(self.model)

    def _run_defaults(self) -> dict[str, Any]:
        saved = (getattr(self.model.config, "task_specific_params", None) or {}).get(PIPELINE_TASK, {})
        defaults = dict(self._DEFAULTS)
        # transformers 4's rule for a checkpoint that is not a bertpipe run: windows no longer than the
        # tokenizer's model_max_length (384 would overrun a model with fewer positions: an index error),
        # and a stride that leaves each window room for context.
        model_max_length = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(model_max_length, int) and 0 < model_max_length < defaults["max_seq_len"]:
            defaults["max_seq_len"] = model_max_length
            defaults["doc_stride"] = min(defaults["doc_stride"], model_max_length // 2)
        return {**defaults, **{key: value for key, value in saved.items() if key in self._DEFAULTS}}

    def _sanitize_parameters(self, top_k=None, doc_stride=None, max_seq_len=None, max_answer_len=None, n_best_size=None,
                             handle_impossible_answer=None, null_score_diff_threshold=None, **unused):
        # Only what the caller gave: call-time values then override construction-time ones, and
        # the run's defaults fill the rest in preprocess/postprocess.
        if unused:
            raise TypeError(f"unknown question-answering pipeline option(s): {sorted(unused)}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        given = lambda **values: {key: value for key, value in values.items() if value is not None}  # noqa: E731
        return (
            given(doc_stride=doc_stride, max_seq_len=max_seq_len),
            {},
            given(top_k=top_k, max_answer_len=max_answer_len, n_best_size=n_best_size,
                  handle_impossible_answer=handle_impossible_answer, null_score_diff_threshold=null_score_diff_threshold),
        )

    def __call__(self, *args, question=None, context=None, **kwargs):
        if question is not None or context is not None:
            if question is None or context is None:
                raise ValueError("give both question= and context=")
            if isinstance(question, str) and isinstance(context, str):
                inputs: Any = {"question": question, "context": context}
            else:
                questions = [question] * len(context) if isinstance(question, str) else list(question)
                contexts = [context] * len(questions) if isinstance(context, str) else list(context)
                if len(questions) != len(contexts):
                    raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts")
                inputs = [{"question": q, "context": c} for q, c in zip(questions, contexts)]
        elif len(args) == 1:
            inputs = args[0]
        elif len(args) == 2 and all(isinstance(arg, str) for arg in args):
            inputs = {"question": args[0], "context": args[1]}
        else:
            raise ValueError("call with question=..., context=... or with {'question': ..., 'context': ...} (or a list)")
        # One example's windows already form one forward batch; batching examples would mix them.
        kwargs.pop("batch_size", None)
        return super().__call__(inputs, batch_size=1, **kwargs)

    def preprocess(self, example: dict[str, str], **options) -> dict[str, Any]:
        options = {**self._run_defaults(), **options}
        doc_stride, max_seq_len = options["doc_stride"], options["max_seq_len"]
        if not isinstance(example, dict) or not {"question", "context"} <= set(example):
            raise ValueError(f"a question-answering input needs 'question' and 'context', got {example!r}")
        question, context = example["question"], example["context"]
        if is_blank(context):
            raise ValueError(f"the context is empty (question {question[:80]!r})")
        if is_blank(question):
            raise ValueError(f"the question is blank ({question!r}; context {context[:80]!r})")
        check_question_lengths(self.tokenizer, [question], ["input"], max_length=max_seq_len, doc_stride=doc_stride)
        features = prepare_features(
            {"question": [question], "context": [context]}, [0], tokenizer=self.tokenizer,
            max_length=max_seq_len, doc_stride=doc_stride, train=False,
        )
        # Windows of one length run together, unpadded: most encoders mask padding out exactly, but not all
        # (Funnel pools neighbouring positions, BigBird lays its blocks out over the padded length), and
        # predict gives such a model's windows what each has alone. Padded to the longest window, a long
        # context's short last window changed the answer.
        lengths = [len(ids) for ids in features["input_ids"]]
        names = [name for name in self.tokenizer.model_input_names if name in features]
        groups = []
        for length in sorted(set(lengths)):
            rows = [index for index, window_length in enumerate(lengths) if window_length == length]
            encoded = self.tokenizer.pad({name: [features[name][row] for row in rows] for name in names}, return_tensors="pt")
            groups.append({"rows": rows, "model_inputs": dict(encoded)})
        return {"window_groups": groups, "context": context, "offset_mapping": features["offset_mapping"], "cls_index": features["cls_index"]}

    def _forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        windows = len(inputs["offset_mapping"])
        start_logits: list[Any] = [None] * windows
        end_logits: list[Any] = [None] * windows
        for group in inputs["window_groups"]:
            outputs = self.model(**group["model_inputs"])
            for position, row in enumerate(group["rows"]):
                start_logits[row], end_logits[row] = outputs.start_logits[position], outputs.end_logits[position]
        return {**inputs, "window_groups": None, "start_logits": start_logits, "end_logits": end_logits}

    def postprocess(self, outputs: dict[str, Any], **options):
        options = {**self._run_defaults(), **options}
        top_k, max_answer_len = options["top_k"], options["max_answer_len"]
        n_best_size = max(options["n_best_size"], top_k)
        handle_impossible_answer, null_score_diff_threshold = options["handle_impossible_answer"], options["null_score_diff_threshold"]
        starts = [logits.float().numpy() for logits in outputs["start_logits"]]
        ends = [logits.float().numpy() for logits in outputs["end_logits"]]
        (result,) = postprocess_qa_predictions(
            [outputs["context"]], [0] * len(starts), outputs["offset_mapping"], starts, ends, outputs["cls_index"],
            n_best_size=n_best_size, max_answer_length=max_answer_len,
            version_2_with_negative=handle_impossible_answer, null_score_diff_threshold=null_score_diff_threshold,
        )
        best = {"score": result["score"], "start": result["start"], "end": result["end"], "answer": result["prediction_text"]}
        if top_k == 1:
            return best
        others = [
            {"score": c["probability"], "start": c["start"], "end": c["end"], "answer": c["text"]}
            for c in result["nbest"] if (c["start"], c["end"], c["text"]) != (best["start"], best["end"], best["answer"])
        ]
        return ([best] + others)[:top_k]


def register_qa_pipeline() -> None:
    """Make ``pipeline("question-answering")`` build :class:`ExtractiveQuestionAnsweringPipeline` (idempotent).

    transformers 5 lists the task in ``REMOVED_TASKS``, which ``pipeline()`` checks (and raises on)
    before it consults ``PIPELINE_REGISTRY``; so the entry is removed as well as the task registered.
    """
    from transformers import pipelines as hf_pipelines

    registered = hf_pipelines.PIPELINE_REGISTRY.supported_tasks.get(PIPELINE_TASK)
    hf_pipelines.REMOVED_TASKS.pop(PIPELINE_TASK, None)
    if registered is not None and registered.get("impl") is ExtractiveQuestionAnsweringPipeline:
        return
    hf_pipelines.PIPELINE_REGISTRY.register_pipeline(
        PIPELINE_TASK, pipeline_class=ExtractiveQuestionAnsweringPipeline, pt_model=AutoModelForQuestionAnswering, type="text",
    )


register_qa_pipeline()
