"""Score responses generated elsewhere (a paper's released outputs, a benchmark's gold solutions)
through a suite task's own lm-eval config, end to end through `lm_eval.simple_evaluate`: the task
YAML `write_task` writes, lm-eval's requests and `repeats`, the `rufus_strip_reasoning` filter, the
`rufus_*` metric and the task's scorer, the same path as a `rufus-eval suite` run of that task.
Only the model is replaced, by one that answers each document with the responses given for its
`rufus_id`. The reference checks of docs/eval.md go through here, so they show what a user's run
computes."""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

import rufus_eval.metrics  # noqa: F401 - registers the rufus filter and metrics with lm-eval
from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import Suite, Task
from rufus_eval.tasks import evaluate_task, lm_eval_task_name, metric_name, write_task


class ReplayLM(LM):
    """An lm-eval model answering each document with the responses given for its `rufus_id` (the
    i-th of the k samples of a document gets its i-th response)."""

    def __init__(self, responses: Mapping[object, str | Sequence[str]]):
        super().__init__()
        self.responses = {str(key): [value] if isinstance(value, str) else list(value) for key, value in responses.items()}

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        served: Counter = Counter()
        out = []
        for request in requests:
            key = str(request.doc["rufus_id"])
            answers = self.responses.get(key)
            if not answers:
                raise RufusError(f"no response given for document {key!r} of task {request.task_name}: "
                                 "pass one (or k) per rufus_id of the task's rows")
            out.append(answers[served[key] % len(answers)])
            served[key] += 1
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise RufusError("replayed responses have no log-likelihoods: only generative tasks can be replayed")

    loglikelihood_rolling = loglikelihood


@dataclass
class ReplayResult:
    """The task's headline number as a run reports it, and lm-eval's per-document samples."""

    metric: str
    value: float | None
    stderr: float | None
    samples: list[dict]

    def per_document(self) -> list[float | None]:
        """Each document's score under the headline metric (None: unscored), in document order."""
        return [s.get(self.metric) for s in sorted(self.samples, key=lambda s: s["doc_id"])]


def score_responses(suite: Suite, task: Task, responses: Mapping[object, str | Sequence[str]]) -> ReplayResult:
    """Score `responses` (rufus_id -> one response, or k) as `rufus-eval suite` would score the task."""
    if task.kind != "rufus":
        raise RufusError(f"task {task.name}: only Rufus-defined tasks can be replayed (this one is {task.kind})")
    name = lm_eval_task_name(suite, task)
    metric = metric_name(suite, task)
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="rufus-replay-") as folder:
        write_task(suite, task, Path(folder))
        output = evaluate_task(ReplayLM(responses), name, TaskManager(include_path=folder, include_defaults=False),
                               suite.seed, bootstrap_iters=0)
    results = output["results"][name]
    value, stderr = results.get(f"{metric},rufus"), results.get(f"{metric}_stderr,rufus")
    return ReplayResult(
        metric=metric,
        value=float(value) if isinstance(value, (int, float)) else None,
        stderr=float(stderr) if isinstance(stderr, (int, float)) else None,
        samples=output["samples"][name],
    )
