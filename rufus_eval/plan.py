"""What a suite run will do, decided before a model loads; `rufus-eval suite --dry-run` prints it
and stops.

`resolve` is how every run starts: the backend decided (`auto`: rufus_data's one policy), the
trackers' packages checked, the suite loaded with the request's overrides, its tasks selected
and the training step found. The dry run adds what the run learns next, without loading or
writing anything: where the model comes from (a built-in is not converted, an adapter not
merged, a hub model not downloaded) and, per task, the documents here or why the run will skip
it, decided by the run's own `task_data` (rufus_eval/tasks.py), so a skipped task reads the
same reason and fetch command as in results.json. The hub is asked for no data: a task whose
rows only the hub has is listed as downloaded when the run starts.

One meaning of --dry-run everywhere (rufus_data/base/cli_options.py): no model loads, lm-eval
evaluates nothing, and no run folder, work folder or lock is made."""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from rufus_data.base.console import console, print_result, print_rows
from rufus_data.base.errors import RufusError
from rufus_data.benchmarks.registry import benchmark_spec
from rufus_data.benchmarks.suite import Suite, Task, load_suite, suite_path
from rufus_data.folders.run_folder import MERGED_DIR, RUN_JSON, checkpoint_step_of, run_step
from rufus_data.folders.shards import refuse_existing_output
from rufus_data.generate.backend_config import ModelAccess
from rufus_data.models.builtin import is_cached
from rufus_data.models.hub import hub_unreachable, offline_mode
from rufus_data.models.reference import ModelRef, require_loadable
from rufus_data.models.thinking import model_thinking
from rufus_eval.request import EvalRequest, apply_sampling_overrides
from rufus_eval.results import default_runs_root, print_left_out
from rufus_eval.suite_trackers import check_trackers
from rufus_eval.tasks import metric_name, task_data


def checkpoint_step(checkpoint: str) -> tuple[int, str]:
    """(training step, where it was read): `checkpoint-N` in the name, else a run folder's run.json
    `global_step`, else 0 (a base model: a built-in, a hub id, a folder that is no run)."""
    step = checkpoint_step_of(checkpoint)
    if step is not None:
        return step, "checkpoint folder name"
    step = run_step(Path(checkpoint).expanduser())
    if step is not None:
        return step, f"{RUN_JSON} global_step"
    return 0, f"base model (no {RUN_JSON})"


def selected_tasks(suite: Suite, req: EvalRequest) -> list[Task]:
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
    return tasks


def left_out(suite: Suite, tasks: list[Task], final: bool) -> dict[str, str]:
    """Each task of the suite the run does not evaluate, with why, so a run never hides a task:
    a test task without --final, or one --tasks left out."""
    chosen = {t.name for t in tasks}
    return {t.name: ("a test task: it runs with --final" if t.role == "test" and not final else "not in --tasks")
            for t in suite.tasks if t.name not in chosen}


@dataclass
class Resolved:
    """A request made concrete: what a run starts from, and what its plan shows."""

    request: EvalRequest  # `auto` decided
    suite: Suite  # the request's overrides applied
    tasks: list[Task]  # the tasks the run evaluates, in suite order
    step: int
    step_from: str
    model: ModelRef | None  # the checkpoint resolved once (hf, vllm); None: a server's name for its model

    def default_name(self) -> str:
        return self.request.run_name or \
            f"{self.suite.name}-{Path(self.request.checkpoint).name}-{dt.datetime.now():%Y%m%d-%H%M%S}"


def resolve(req: EvalRequest, say: bool = True) -> Resolved:
    """The request resolved (the backend said on the console with why, unless `say` is off); a
    RufusError for one that cannot run, before anything loads."""
    req = req.resolved(say)  # `auto` decided here, for every caller (rufus_eval/request.py)
    check_trackers(req.report_to)
    suite = load_suite(req.suite)
    apply_sampling_overrides(suite, req)
    tasks = selected_tasks(suite, req)
    if say and req.limit:
        say_limit_samples(suite, tasks, req.limit)
    step, step_from = (req.step, "--step") if req.step is not None else checkpoint_step(req.checkpoint)
    model = ModelRef.of(req.checkpoint) if req.backend in ("hf", "vllm") else None  # a file or missing folder refused
    check_thinking(req, suite, model)
    return Resolved(req, suite, tasks, step, step_from, model)


def check_thinking(req: EvalRequest, suite: Suite, model: ModelRef | None) -> None:
    """A suite's `thinking:` mode that the model's template cannot take is refused here, in
    --dry-run and before a run writes anything. A built-in not converted yet is left to the run
    (its own template has the switch): reading it would convert it."""
    if suite.thinking == "default" or (model is not None and model.kind == "builtin" and not is_cached(model.portable)):
        return
    model_thinking(model if model is not None else (req.tokenizer or req.checkpoint), suite.thinking)


def say_limit_samples(suite: Suite, tasks: list[Task], limit: int) -> None:
    """`--limit N` picks questions; each is answered k times: said before anything runs (16
    generations for `--limit 4` at k=4 surprised a user as 3 minutes)."""
    sampled = {task.name: suite.k(task) for task in tasks if suite.k(task) > 1}
    if not sampled:
        return
    each = ", ".join(f"{name} {limit} x {k} = {limit * k}" for name, k in sampled.items())
    console.print(f"note: --limit {limit} picks {limit} questions per task, each answered k times: {each} generations "
                  "(--repeats 1 for one answer each)", style="yellow", highlight=False, markup=False, soft_wrap=True)


def model_source(model: ModelRef) -> str:
    """Where a model the run loads (hf, vllm) comes from, in words, found without converting,
    downloading or merging anything; a RufusError, before anything is written, when it can come
    from nowhere."""
    if model.kind == "builtin":
        return f"{model.describe()}: " + (model.path if is_cached(model.portable) else
                                          f"converted into {model.path} when the run starts")
    if model.is_adapter:
        return f"{model.describe()}: merged into {Path(model.path) / MERGED_DIR} when the run starts (kept for reuse)"
    if model.kind != "hub":
        return model.describe()
    require_loadable(model)  # a typo of a built-in, or a hub id that is neither cached nor reachable
    return f"{model.describe()}: downloaded when the run starts"


def refuse_unrunnable(suite: Suite, runnable: int, skipped: dict[str, dict], strict: bool) -> None:
    """A run that evaluates nothing is no result, and `strict` wants every task: said before the
    model loads, with each skipped task's reason and fetch command."""
    if skipped and (strict or not runnable):
        raise RufusError(("--strict: " if strict else f"no task of suite {suite.name} can run here: ") + "; ".join(
            f"{name}: {why['reason']}; fetch it with `{why['fetch']}`" for name, why in skipped.items()))


@dataclass
class TaskPlan:
    """One task as the run will take it."""

    task: str
    kind: str
    metric: str
    k: int
    max_tokens: int | None  # None: lm-eval's own task config says
    temperature: float | None
    docs: int | None  # documents here; None: lm-eval's task, or the hub's rows, read when the run starts
    skip: dict | None  # {reason, fetch}: skipped, as the run records it
    note: str = ""  # where uncounted documents come from

    def why(self) -> str:
        """The table's short word: the command that fetches a skipped task's data (the reason in
        full is listed under the table), or where uncounted documents come from."""
        return f"data not here: {self.skip['fetch']}" if self.skip else self.note


def plan_tasks(suite: Suite, tasks: list[Task]) -> list[TaskPlan]:
    """Each task's plan; its data is looked for as the run looks, with no data asked of the hub."""
    hub_open = not offline_mode() and hub_unreachable() is None
    plans = []
    for task in tasks:
        with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"} if hub_open else {}):
            rows, skip = task_data(suite, task)
        note = "lm-eval's own task: it reads its documents when the run starts" if task.kind == "lm_eval" else ""
        if skip and hub_open and _from_hub(task):  # the run would download it: no skip
            skip, note = None, "not here; the run downloads it from the hub"
        rufus = task.kind == "rufus"
        sampling = suite.sampling_for(task) if rufus else None
        plans.append(TaskPlan(task.name, task.kind, metric_name(suite, task), suite.k(task) if rufus else 1,
                              sampling.max_tokens if sampling else None, sampling.temperature if sampling else None,
                              len(rows) if rows is not None else None, skip, note))
    return plans


def _from_hub(task: Task) -> bool:
    """The task's rows may come from the hub (its benchmark's `hub`, or its inline `data: {hub}`)."""
    if task.benchmark:
        return benchmark_spec(task.benchmark)[0].hub is not None
    return task.data is not None and task.data.hub is not None


PLAN_COLUMNS = ["task", "metric", "k", "max_tokens", "temperature", "limit", "docs", "plan", "why"]


def dry_run(req: EvalRequest, fmt: str = "table") -> dict:
    """`rufus-eval suite --dry-run`: the plan on stdout (a table, CSV of its rows, or one JSON
    object); returns it. A request the run would refuse is refused here too, after the plan."""
    why = req.backend_choice()[1]
    resolved = resolve(req, say=False)
    if req.limit:
        say_limit_samples(resolved.suite, resolved.tasks, req.limit)
    req, suite = resolved.request, resolved.suite
    model = model_source(resolved.model) if resolved.model else \
        f"{req.checkpoint}, as {', '.join(req.base_urls)} serves it"
    tasks = plan_tasks(suite, resolved.tasks)
    out = Path(req.out or default_runs_root() / resolved.default_name())
    plan = {
        "suite": suite.name, "suite_file": str(suite_path(req.suite)), "model": model, "backend": req.backend,
        "backend_why": why, "step": resolved.step, "step_from": resolved.step_from, "out": str(out),
        "tasks": [{"task": t.task, "kind": t.kind, "metric": t.metric, "k": t.k, "max_tokens": t.max_tokens,
                   "temperature": t.temperature, "limit": req.limit, "docs": t.docs, "run": t.skip is None,
                   "reason": t.skip and t.skip["reason"], "fetch": t.skip and t.skip["fetch"], "note": t.note}
                  for t in tasks],
        # what is evaluated first, then how the model is reached
        "request": dict(sorted(req.model_dump(mode="json").items(), key=lambda item: item[0] in ModelAccess.model_fields)),
    }
    plan["not_run"] = left_out(suite, resolved.tasks, req.final)
    _print_plan(plan, tasks, fmt)
    if fmt != "json":
        print_left_out(plan["not_run"])
    refuse_unrunnable(suite, sum(t.skip is None for t in tasks), {t.task: t.skip for t in tasks if t.skip}, req.strict)
    refuse_existing_output(out, req.overwrite)
    return plan


def _print_plan(plan: dict, tasks: list[TaskPlan], fmt: str) -> None:
    if fmt == "json":
        print_result(json.dumps(plan, indent=2), markup=False, highlight=False)
        return
    lines = [f"suite: {plan['suite']} ({plan['suite_file']})", f"model: {plan['model']}",
             f"backend: {plan['backend']} ({plan['backend_why']})", f"step: {plan['step']} ({plan['step_from']})",
             f"run folder: {plan['out']} (not written: a dry run)"]
    rows = [(t.task, t.metric, t.k, _or_dash(t.max_tokens), _or_dash(t.temperature), plan["request"]["limit"] or "all",
             _or_dash(t.docs), "skip" if t.skip else "run", t.why()) for t in tasks]
    if fmt == "csv":  # the table for a file or pipe; the rest, for people, on stderr
        console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
        print_rows(PLAN_COLUMNS, rows, fmt)
        return
    print_result("\n".join(lines), markup=False, highlight=False)
    print_rows(PLAN_COLUMNS, rows, fmt, title=f"rufus-eval suite {plan['suite']} --dry-run: nothing loaded or written")
    for t in tasks:
        if t.skip:
            print_result(f"skip {t.task}: {t.skip['reason']}\n  to get it: {t.skip['fetch']}", markup=False,
                         highlight=False)
    print_result("request (`rufus-eval suite --request FILE` reads it):\n" + json.dumps(plan["request"], indent=2),
                 markup=False, highlight=False)


def _or_dash(value) -> object:
    return "-" if value is None else value
