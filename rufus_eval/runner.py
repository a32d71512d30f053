"""`rufus-eval suite`: run a suite's tasks through lm-evaluation-harness and record the results.

The model is created once; tasks run one after the other under a rich progress bar. Each run
folder holds `tasks/` (the lm-eval configs and data Rufus wrote), `lm_eval/` (lm-eval's results
and samples, as lm-eval produced them), and `results.json`; the run is also added to the DuckDB
file of all runs."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from rufus_data.console import console, progress
from rufus_data.errors import RufusError
from rufus_data.generate import BackendConfig
from rufus_data.merged_model import is_adapter_folder, merged_model
from rufus_data.models import resolve_model
from rufus_eval.backends import CONCURRENCY, open_backend
from rufus_eval.results import store_run, write_results
from rufus_eval.suite import load_suite
from rufus_eval.tasks import lm_eval_task_name, metric_name, write_task

STEP_RE = re.compile(r"checkpoint-(\d+)$")


@dataclass
class RunRequest:
    suite: str
    checkpoint: str
    backend: BackendConfig = field(default_factory=lambda: BackendConfig(concurrency=CONCURRENCY))
    limit: int | None = None
    out: Path | None = None
    final: bool = False
    step: int | None = None
    run_name: str | None = None
    db_path: Path | None = None
    samples: int | None = None  # override every task's k (quick experiments, tests)
    max_tokens: int | None = None  # override every task's max_tokens
    tasks: list[str] | None = None  # run only these tasks of the suite (default: all selected)


def checkpoint_step(checkpoint: str) -> int | None:
    match = STEP_RE.search(str(checkpoint).rstrip("/"))
    return int(match.group(1)) if match else None


def prepare_model(checkpoint: str) -> str:
    """A model folder lm-eval/vLLM can load: built-ins resolved, a LoRA run's adapter merged into
    its one merged copy (`<checkpoint>/merged`, shared with `rufus-train export`), so the
    checkpoint evaluated is the trained one."""
    path = Path(resolve_model(checkpoint))
    if not is_adapter_folder(path):
        return str(path)
    return str(merged_model(path))


def run_suite(req: RunRequest) -> dict:
    """Run the suite; returns the results record (also written to results.json and DuckDB)."""
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    import rufus_eval.metrics  # noqa: F401 - registers the filter and metrics

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    suite = load_suite(req.suite)
    if req.samples or req.max_tokens:
        for task in suite.tasks:
            if req.samples:
                task.samples = req.samples
                at = task.metric.split("@")[-1]
                if task.kind == "rufus" and at != "k" and int(at) > req.samples:
                    task.metric = task.metric.split("@")[0] + "@k"
            if req.max_tokens:
                task.sampling = (task.sampling or suite.sampling).model_copy(update={"max_tokens": req.max_tokens})
    tasks = suite.selected(req.final)
    if req.tasks:
        unknown = sorted(set(req.tasks) - {t.name for t in suite.tasks})
        if unknown:
            raise RufusError(f"suite {suite.name} has no task(s) {unknown}: use some of {', '.join(t.name for t in suite.tasks)}")
        tasks = [t for t in tasks if t.name in req.tasks]
        if not tasks:
            raise RufusError(f"tasks {req.tasks} of suite {suite.name} are test tasks: pass --final to run them")
    if not tasks:
        raise RufusError(f"suite {suite.name} has only test tasks: pass --final to run them")
    judges = {}  # judged tasks: the judge is asked what it serves before any answer is generated
    for task in tasks:
        if task.scorer and task.scorer.name == "llm_judge":
            from rufus_eval.judge import pin_judge

            task.scorer, judges[task.name] = pin_judge(task.scorer, f"suite {suite.name}, task {task.name}")
    step = req.step if req.step is not None else checkpoint_step(req.checkpoint)
    run_name = req.run_name or f"{suite.name}-{Path(req.checkpoint).name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out = Path(req.out or Path("outputs/eval") / run_name)
    (out / "lm_eval").mkdir(parents=True, exist_ok=True)

    lm_names = {}
    for task in tasks:
        if task.kind == "rufus":
            write_task(suite, task, out / "tasks")
            lm_names[task.name] = lm_eval_task_name(suite, task)
        else:
            lm_names[task.name] = task.lm_eval_task
    manager = TaskManager(
        include_path=str(out / "tasks") if (out / "tasks").exists() else None,
        include_defaults=any(t.kind == "lm_eval" for t in tasks),
    )

    # hf and vllm load a folder; a server knows the model by the name given as the checkpoint
    model = prepare_model(req.checkpoint) if req.backend.backend in ("hf", "vllm") else req.checkpoint

    record = {
        "run": run_name,
        "suite": suite.name,
        "checkpoint": str(req.checkpoint),
        "step": step,
        "final": req.final,
        "limit": req.limit,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "system_prompt": suite.system_prompt,
        "tasks": {},
        "judges": judges,
    }
    with open_backend(model, req.backend, seed=suite.seed) as (model_name, model_args, facts):
        record.update({k: facts.get(k) for k in ("backend", "server_version", "server_pgid")})
        lm = get_model(model_name).create_from_arg_obj(model_args)
        with progress("tasks") as bar:
            job = bar.add_task(f"suite {suite.name}", total=len(tasks))
            for task in tasks:
                bar.update(job, description=f"{suite.name}: {task.name}")
                output = lm_eval.simple_evaluate(
                    model=lm,
                    tasks=[lm_names[task.name]],
                    task_manager=manager,
                    limit=req.limit,
                    apply_chat_template=True,
                    system_instruction=suite.system_prompt,
                    log_samples=True,
                    random_seed=suite.seed,
                    numpy_random_seed=suite.seed,
                    torch_random_seed=suite.seed,
                    bootstrap_iters=1000,
                    confirm_run_unsafe_code=True,
                )
                record["tasks"][task.name] = _task_record(suite, task, lm_names[task.name], output, out)
                bar.advance(job)
    results_path = write_results(record, out)
    store_run(record, results_path, req.db_path)
    _print_summary(record)
    return record


def _task_record(suite, task, lm_name: str, output: dict, out: Path) -> dict:
    """Save lm-eval's results and samples for the task; pull out the headline number."""
    from lm_eval.utils import handle_non_serializable

    results = output["results"][lm_name]
    (out / "lm_eval" / f"results_{task.name}.json").write_text(
        json.dumps({k: v for k, v in output.items() if k != "samples"}, indent=2, default=handle_non_serializable)
    )
    # a native lm-eval group (global_mmlu_en, ruler) logs samples under its subtasks
    samples = [s for name in sorted(output["samples"]) for s in output["samples"][name]]
    with open(out / "lm_eval" / f"samples_{task.name}.jsonl", "w") as fh:
        fh.writelines(json.dumps(s, default=handle_non_serializable, ensure_ascii=False) + "\n" for s in samples)
    metric = metric_name(suite, task)
    if task.kind == "rufus":
        key = f"{metric},rufus"
    elif "," in metric:
        key = metric
    else:
        key = next((k for k in results if k.startswith(f"{metric},") and "_stderr" not in k), f"{metric},none")
    value = results.get(key)
    name, filter_key = key.split(",", 1)
    unscored = results.get(f"unscored,{filter_key}")
    # a Rufus task whose every sample went unscored (say, a judge that never wrote a parsable score)
    # has no number: value null with `unscored` saying why, never 0.0 (rufus_eval/metrics.py)
    if not isinstance(value, (int, float)) and not (task.kind == "rufus" and unscored is not None):
        raise RufusError(f"task {task.name}: lm-eval reported no {key} (keys: {sorted(results)})")
    stderr = results.get(f"{name}_stderr,{filter_key}")
    return {
        "metric": name,
        "value": float(value) if isinstance(value, (int, float)) else None,
        "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        "k": suite.k(task) if task.kind == "rufus" else 1,
        "docs": len(samples),
        "scored_docs": sum(name in s for s in samples),
        "unscored": unscored,
        "unclosed_think": results.get(f"unclosed_think,{filter_key}"),
        "role": task.role,
        "kind": task.kind,
        "samples_file": str(out / "lm_eval" / f"samples_{task.name}.jsonl"),
    }


def _print_summary(record: dict) -> None:
    from rich.table import Table

    table = Table(title=f"{record['suite']} on {record['checkpoint']} (step {record['step']})")
    for col in ("task", "metric", "value", "stderr", "k", "docs", "unclosed", "unscored"):
        table.add_column(col)
    for name, t in record["tasks"].items():
        value = "none scored" if t["value"] is None else f"{t['value']:.4f}"
        stderr = "-" if t["stderr"] is None else f"{t['stderr']:.4f}"
        unclosed = "-" if t["unclosed_think"] is None else f"{t['unclosed_think']:.2f}"
        unscored = "-" if t.get("unscored") is None else f"{t['unscored']:.2f}"
        table.add_row(name, t["metric"], value, stderr, str(t["k"]), str(t["docs"]), unclosed, unscored)
    console.print(table)
