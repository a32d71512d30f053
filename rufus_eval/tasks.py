"""Turn a suite's Rufus tasks into lm-eval task configs over local JSON data.

For each task Rufus reads the source rows (rufus_eval/task_data.py: the registry benchmark it
names, or its inline data), drops the rows the task skips, renders the prompt and packs the gold
fields (the scorer reward's dataset columns) into one JSON string (`gold`), and writes
`data.jsonl` plus an lm-eval YAML config that reads it with `dataset_path: json`. The config names
Rufus's filter and metric (rufus_eval/metrics.py). `evaluate_task` runs one such config through
`lm_eval.simple_evaluate` as every caller does (a suite run, a replay)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.suite import Suite, Task
from rufus_eval.task_data import TaskDataMissing, check_native_ready, source_rows


def lm_eval_task_name(suite: Suite, task: Task) -> str:
    return f"rufus_{suite.name}_{task.name}".replace("-", "_")


def task_rows(task: Task, suite_name: str = "SUITE") -> list[dict]:
    """Rows as lm-eval will see them: `rufus_id` (the row's id, as decontam names the item), `prompt`
    (the user turn) and `gold` (JSON)."""
    out = []
    rows, ids = source_rows(task, suite_name)
    for index, (row, row_id) in enumerate(zip(rows, ids)):
        if any(str(row.get(field)) in values for field, values in task.skip_rows.items()):
            continue
        try:
            prompt = task.prompt.format_map(row)
        except (KeyError, IndexError, ValueError) as err:
            raise RufusError(
                f"task {task.name}: prompt template needs field {err} that row {index} lacks "
                f"(row fields: {sorted(row)}); fix `prompt` (literal braces are written {{{{ }}}})"
            ) from None
        missing = [f for f in task.gold_fields if f not in row]
        if missing:
            raise RufusError(f"task {task.name}: row {index} has no gold field(s) {missing} (fields: {sorted(row)})")
        gold = {field: row[field] for field in task.gold_fields}
        gold["rufus_prompt"] = prompt
        out.append({"rufus_id": row_id, "prompt": prompt, "gold": json.dumps(gold, ensure_ascii=False)})
    if not out:
        raise RufusError(f"task {task.name}: no rows left after skip_rows {task.skip_rows}")
    return out


def task_data(suite: Suite, task: Task) -> tuple[list[dict] | None, dict | None]:
    """Whether a task can run here, as the run and `--dry-run` both decide it: (its rows, None) for a
    Rufus task; (None, None) for lm-eval's own task that can run (it reads its data itself); (None,
    {reason, fetch}) when its data is not here: the run records that as a skipped task."""
    try:
        if task.kind == "rufus":
            return task_rows(task, suite.name), None
        check_native_ready(task, suite.name)
        return None, None
    except TaskDataMissing as err:
        return None, {"reason": err.reason, "fetch": err.fetch}


def write_task(suite: Suite, task: Task, folder: Path, rows: list[dict] | None = None) -> dict:
    """Write data.jsonl and the lm-eval YAML of one Rufus task (its `rows` when already read);
    return the config dict."""
    rows = task_rows(task, suite.name) if rows is None else rows
    folder.mkdir(parents=True, exist_ok=True)
    data_file = folder / f"{task.name}.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    data_file.write_text(text, encoding="utf-8")
    sampling = suite.sampling_for(task)
    kind, at = suite.metric_at(task)
    k = suite.k(task)
    config = {
        "task": lm_eval_task_name(suite, task),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file.resolve())}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "prompt",
        "doc_to_target": "gold",
        "repeats": k,
        "generation_kwargs": {
            "until": [],
            "do_sample": sampling.temperature > 0,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_gen_toks": sampling.max_tokens,
        },
        "filter_list": [
            {"name": "rufus", "filter": [{"function": "rufus_strip_reasoning", "think_end_token": suite.think_end_token}]}
        ],
        "metric_list": [
            {
                "metric": f"rufus_{kind}",
                "aggregation": "mean",
                "higher_is_better": True,
                "scorer": task.scorer.spec,
                "k": k,
                "at": at,
                **({"also": task.also_scored_by.spec} if task.also_scored_by else {}),
            }
        ],
        "metadata": {
            "version": 1,
            "rufus_suite": suite.name,
            "rufus_task": task.name,
            "data_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "rows": len(rows),
        },
    }
    (folder / f"{task.name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return config


def metric_name(suite: Suite, task: Task) -> str:
    """The key of the task's headline number in lm-eval's results (`avg@4`, `pass@1`, ...)."""
    if task.kind == "lm_eval":
        return task.metric_key
    kind, at = suite.metric_at(task)
    return f"{kind}@{at}"


def evaluate_task(model, task_name: str, manager, seed: int, **options) -> dict:
    """`lm_eval.simple_evaluate` of one task, its samples logged, lm-eval's three seeds all the
    suite's one: a suite run and a replay of the task seed it alike. `options`: the rest of
    simple_evaluate's arguments (limit, chat template, bootstrap_iters)."""
    import lm_eval  # heavy: only when a task runs, not for `--dry-run`'s plan

    return lm_eval.simple_evaluate(model=model, tasks=[task_name], task_manager=manager, log_samples=True,
                                   random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                   confirm_run_unsafe_code=True, **options)
