"""Per-document scores of a run, read back from the samples files lm-eval wrote.

A run folder keeps, per task, `lm_eval/samples_<task>.jsonl`: one line per document (and filter),
with `doc_id`, `doc_hash` (lm-eval's hash of the document), the raw responses `resps`, the gold
`target`, and the document's own value of each metric (`avg@4`, `pass@1`, lm-eval's `exact_match`
...). A document is known by (doc_id, doc_hash): two runs hold the same documents when these sets
are equal, whatever model answered them. A document with no value for the task's metric (no
sample of it could be scored) has score None, never 0.0.

`pass_counts` re-scores each sample's answer with the task's own scorer (the spec in the run's
`tasks/<task>.yaml`, through metrics.py, as the run scored it) for pass@k at every k: the samples
file keeps each document's mean, not which of its samples passed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import load_yaml_text
from rufus_data.folders.run_folder import RESULTS_JSON

RUFUS_FILTER = "rufus"  # the one filter of a Rufus-defined task (tasks.py)


@dataclass
class TaskDocuments:
    """One task of one run, document by document: score per document key, and the samples lines."""

    run: str
    task: str
    metric: str
    scores: dict[tuple[int, str], float | None]
    samples: dict[tuple[int, str], dict]


def run_folder(record_path: str | Path) -> Path:
    path = Path(record_path)
    return path.parent if path.name == RESULTS_JSON else path


def samples_path(folder: Path, task_name: str, task: dict) -> Path:
    """The task's samples file: in the run folder (it may have moved since), else where the run recorded it."""
    here = folder / "lm_eval" / f"samples_{task_name}.jsonl"
    if here.exists() or not task.get("samples_file"):
        return here
    return Path(task["samples_file"])


def task_documents(folder: Path, record: dict, task_name: str) -> TaskDocuments:
    """The per-document scores of a task that ran, checked against the run's reported value."""
    task = record["tasks"][task_name]
    path = samples_path(folder, task_name, task)
    if not path.exists():
        raise RufusError(f"run {record['run']}, task {task_name}: its samples file {path} is not here, so its "
                         "per-document scores are unknown: compare needs the run folder as the run wrote it")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    wanted = task.get("filter") or (RUFUS_FILTER if task.get("kind", "rufus") == "rufus" else None)
    filters = {line.get("filter") for line in lines}
    if wanted is None and len(filters) == 1:
        wanted = filters.pop()
    if wanted is None:
        raise RufusError(f"run {record['run']}, task {task_name}: the samples hold filters {sorted(map(str, filters))} "
                         "and results.json does not say which one is the task's number: re-run the task")
    samples: dict[tuple[int, str], dict] = {}
    for line in lines:
        if line.get("filter") == wanted:
            samples[(int(line["doc_id"]), str(line["doc_hash"]))] = line
    metric = task["metric"]
    scores = {key: _number(line.get(metric)) for key, line in samples.items()}
    _check_against_record(record, task_name, task, scores)
    return TaskDocuments(record["run"], task_name, metric, scores, samples)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not math.isnan(value) else None


def _check_against_record(record: dict, task_name: str, task: dict, scores: dict) -> None:
    """A Rufus task's value is the mean of its documents' values: a samples file that disagrees is not this run's."""
    scored = [s for s in scores.values() if s is not None]
    if task.get("kind", "rufus") != "rufus" or task.get("value") is None or not scored:
        return
    mean = sum(scored) / len(scored)
    if abs(mean - task["value"]) > 1e-6:
        raise RufusError(f"run {record['run']}, task {task_name}: its samples file's documents average {mean:.6f}, but "
                         f"results.json says {task['value']:.6f}: the samples file is not this run's (was the folder "
                         "copied or edited?)")


def task_scorer(folder: Path, task_name: str) -> tuple[dict | str, str] | None:
    """(scorer spec, think_end_token) of a Rufus task from the config the run wrote; None when there is none."""
    config_path = folder / "tasks" / f"{task_name}.yaml"
    if not config_path.exists():
        return None
    config = load_yaml_text(config_path.read_text(encoding="utf-8"), str(config_path))
    metrics = config.get("metric_list") or [{}]
    filters = (config.get("filter_list") or [{}])[0].get("filter") or [{}]
    scorer = metrics[0].get("scorer")
    if scorer is None:
        return None
    return scorer, filters[0].get("think_end_token", "</think>")


def pass_counts(folder: Path, documents: TaskDocuments) -> tuple[dict[tuple[int, str], tuple[int, int]] | None, str]:
    """({document: (samples scored, samples passed)}, why not) for pass@k: each sample's raw
    response re-scored by the task's scorer (a sample passes with score 1, as pass@k's metric
    counts it); None with the reason for tasks whose samples cannot be re-scored here."""
    found = task_scorer(folder, documents.task)
    if found is None:
        return None, "not a Rufus-scored task (lm-eval's own metric scores it): no per-sample scores"
    scorer, think_end_token = found
    name = scorer if isinstance(scorer, str) else scorer.get("name")
    if name == "llm_judge":
        return None, "a judged task: re-scoring its samples would ask the judge again"
    from rufus_eval.metrics import answer_of, scored_samples  # heavy: lm-eval and the rewards

    counts = {}
    for key, line in documents.samples.items():
        responses = line["resps"][0] if line.get("resps") else []
        answers = [answer_of(r, think_end_token) for r in responses]
        if not answers:
            continue
        _, scores, _ = scored_samples([answers], [line["target"]], scorer)
        scored = [s for s in scores if s is not None]
        counts[key] = (len(scored), sum(s >= 1.0 for s in scored))
    return counts, ""
