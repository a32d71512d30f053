"""`rufus-eval suite`: run a suite's tasks through lm-evaluation-harness and record the results.

The model is created once; tasks run one after the other under a rich progress bar. Each run
folder holds `tasks/` (the lm-eval configs and data Rufus wrote), `lm_eval/` (lm-eval's results
and samples, as lm-eval produced them), `results.json` and `report.md` (`rufus-eval results`
queries every run's). A run is written in its work folder first (resume.py): killed, it keeps the
tasks it finished, and the same command continues. Each task says whether the model's training
data was checked against its benchmark (data_check.py). How a run starts (the request resolved,
the model's source, each task's data) is plan.py's, which `--dry-run` prints without running."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
from pathlib import Path

from lm_eval import evaluator as lm_eval_evaluator
from lm_eval.api.registry import get_model  # finds the model classes lm_eval_models registers
from lm_eval.tasks import TaskManager
from lm_eval.utils import handle_non_serializable

from rufus_data.base.console import console, progress
from rufus_data.base.errors import RufusError
from rufus_data.base.redaction import redact
from rufus_data.benchmarks.registry import benchmark_spec
from rufus_data.benchmarks.suite import Suite, Task
from rufus_data.folders.output_lock import OutputLock
from rufus_data.folders.shards import package_versions, refuse_existing_output
from rufus_data.models.merged_model import plain_folder
from rufus_data.models.reference import ModelRef
from rufus_eval.data_check import task_data_checks
from rufus_eval.judge import pin_judge
from rufus_eval.lm_eval_models import model_chat, open_backend
from rufus_eval.metrics import answer_of
from rufus_eval.native import write_native
from rufus_eval.plan import left_out, model_source, refuse_unrunnable, resolve
from rufus_eval.request import EvalRequest
from rufus_eval.results import default_runs_root, print_summary, write_report, write_results
from rufus_eval.resume import SuiteWork, request_key, suite_work
from rufus_eval.suite_trackers import SuiteTrackers, suite_trackers
from rufus_eval.task_data import local_haystacks
from rufus_eval.tasks import evaluate_task, lm_eval_task_name, metric_name, task_data, write_task


def git_describe_quietly() -> str | None:
    """`git describe --always` of the working folder, as lm-eval records it in its results, with
    git's stderr kept: outside a git checkout lm-eval's own call printed `fatal: not a git
    repository` once per task of every run."""
    try:
        found = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


lm_eval_evaluator.get_git_commit_hash = git_describe_quietly  # simple_evaluate looks the name up at call time


def prepare_tasks(suite: Suite, tasks: list[Task], folder: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """Write every task's lm-eval config into `folder`: ({task: lm-eval name}, {task: why skipped,
    fetch command}), each task's data found by `task_data`, as --dry-run finds it."""
    lm_names: dict[str, str] = {}
    skipped: dict[str, dict] = {}
    for task in tasks:
        rows, skip = task_data(suite, task)
        if skip:
            skipped[task.name] = skip
        elif task.kind == "rufus":
            write_task(suite, task, folder, rows)
            lm_names[task.name] = lm_eval_task_name(suite, task)
        else:
            lm_names[task.name] = write_native(suite, task, folder)
    return lm_names, skipped


def local_model(model: ModelRef) -> str:
    """A folder lm-eval/vLLM can load (a built-in converted, a LoRA run's adapter merged into its
    one merged copy, shared with `rufus-train export`, so the checkpoint evaluated is the trained
    one); refused before anything is written when the model can come from nowhere."""
    model_source(model)
    return plain_folder(model)


def run_suite(req: EvalRequest, fmt: str = "table") -> dict:
    """Run the suite; returns the results record (also written to results.json), its summary
    printed on stdout as a table, or CSV / JSON (`fmt`).

    Everything is written into the request's work folder (resume.py), renamed into place as the
    run folder at the end: a run that fails leaves no half-written run folder (and a re-run with
    `overwrite` replaces an old one only then; without, an existing one is refused before any
    work), and the tasks it finished stay in the work folder, so running
    the same command again continues after them. A task whose data is not here is skipped
    (recorded with the reason and the command that fetches it), or, with `strict`, refused before
    the model loads."""
    resolved = resolve(req)  # the backend decided, the suite and its tasks, the step (plan.py)
    req, suite, tasks = resolved.request, resolved.suite, resolved.tasks
    default_name = resolved.default_name()
    # hf and vllm load a folder; a server knows the model by the name given as the checkpoint
    model = local_model(resolved.model) if resolved.model else req.checkpoint
    training_run, data_checks = task_data_checks(tasks, req.checkpoint)
    key = request_key(suite.model_dump_json(), [t.name for t in tasks], model, req.model_dump(mode="json"))
    parent = Path(req.out).parent if req.out else default_runs_root()
    refuse_existing_output(Path(req.out or parent / default_name), req.overwrite)  # before a work folder
    with suite_work(parent, key, default_name) as work:
        out = Path(req.out or default_runs_root() / work.run_name)
        try:
            with OutputLock(out, "rufus-eval suite"):  # one writer per run folder, before any task runs
                refuse_existing_output(out, req.overwrite)
                record = _new_record(resolved, work, training_run)
                _run_tasks(suite, tasks, model, req, record, work, out)
                record["tasks"] = {t.name: {**record["tasks"][t.name], "data_check": data_checks[t.name].as_dict()}
                                   for t in tasks}  # suite order
                _repoint(work.run / "tasks", work.run, out)
                write_results(record, work.run)
                write_report(record, work.run)
                work.finish(out, req.overwrite)
        except BaseException as err:
            done = len(work.done())
            if not done:  # nothing to continue from: no work folder left behind
                shutil.rmtree(work.folder, ignore_errors=True)
            elif not isinstance(err, RufusError):
                console.print(f"stopped ({type(err).__name__}): {done} finished task(s) are kept in {work.folder}; "
                              "run the same command again to continue", style="yellow", highlight=False, markup=False,
                              soft_wrap=True)
            raise
    print_summary(record, fmt)
    console.print(f"run folder: {out}  (compare runs with `rufus-eval compare {out} OTHER_RUN...`)", highlight=False,
                  markup=False, soft_wrap=True)
    return record


def _new_record(resolved, work: SuiteWork, training_run: Path | None) -> dict:
    """results.json before any task ran: what runs, on what, and what the suite leaves out."""
    req, suite = resolved.request, resolved.suite
    return {
        "run": work.run_name,
        "suite": suite.name,
        "checkpoint": str(req.checkpoint),
        "step": resolved.step,
        "step_from": resolved.step_from,
        "final": req.final,
        "not_run": left_out(suite, resolved.tasks, req.final),  # the suite's tasks left out, with why
        "limit": req.limit,
        "created": work.created,
        "versions": package_versions("lm_eval", "transformers", "torch"),  # rufus's names the commit
        "system_prompt": suite.system_prompt,
        "training_run": str(training_run) if training_run else None,  # whose data lineage data_check reads
        "tasks": {},
        "judges": {},
    }


def _run_tasks(suite: Suite, tasks: list[Task], model: str, req: EvalRequest, record: dict, work: SuiteWork,
               out: Path) -> None:
    """Every task not done by an earlier attempt, each kept in the work folder once it is done."""
    prepared = work.prepared()
    if prepared is None:  # the first attempt writes the task configs and data, and every attempt scores them
        shutil.rmtree(work.run / "tasks", ignore_errors=True)
        prepared = dict(zip(("lm_names", "skipped"), prepare_tasks(suite, tasks, work.run / "tasks")))
        work.save_prepared(prepared["lm_names"], prepared["skipped"])
    lm_names, skipped = prepared["lm_names"], prepared["skipped"]
    refuse_unrunnable(suite, len(lm_names), skipped, req.strict)
    done = work.done()
    for name, finished in done.items():
        record["tasks"][name] = finished["record"]
        if finished.get("judge"):
            record["judges"][name] = finished["judge"]
    to_run = [t for t in tasks if t.name in lm_names and t.name not in done]
    if done:
        console.print(f"resuming {record['run']}: {len(done)} of {len(lm_names)} task(s) done by an earlier attempt "
                      f"({', '.join(done)}); running {', '.join(t.name for t in to_run) or 'none'}", highlight=False,
                      markup=False, soft_wrap=True)
    for task in to_run:  # judged tasks: the judge is asked what it serves before any answer is generated
        if task.scorer and task.scorer.name == "llm_judge":
            task.scorer, record["judges"][task.name] = pin_judge(task.scorer, f"suite {suite.name}, task {task.name}")
            write_task(suite, task, work.run / "tasks")  # the config the metric reads names the pinned judge
    if to_run:
        (work.run / "lm_eval").mkdir(exist_ok=True)
        with suite_trackers(req.report_to, record["run"], {"suite": suite.name, "checkpoint": str(req.checkpoint),
                                                          "step": record["step"]}) as trackers:
            _run_through_lm_eval(suite, to_run, lm_names, model, req, record, work, out, trackers)
    for task in tasks:
        if task.name in skipped:
            record["tasks"][task.name] = _skipped_record(suite, task, skipped[task.name])


def _run_through_lm_eval(suite: Suite, tasks: list[Task], lm_names: dict[str, str], model: str,
                         req: EvalRequest, record: dict, work: SuiteWork, out: Path,
                         trackers: SuiteTrackers) -> None:
    """Create the model once and run each task through lm-eval, writing into the work folder's run
    (paths recorded under `out`); each task is marked done there as it finishes."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    thinking, ends = model_chat(model, req.access(), suite.thinking)  # a mode the template cannot take: refused here
    record.update(thinking=thinking.record(), end_tokens=ends.record() if ends else None)
    with open_backend(model, req.access(), seed=suite.seed, batch_size=req.batch_size, thinking=thinking,
                      ends=ends) as (model_name, model_args, facts):
        record.update({k: facts.get(k) for k in ("backend", "server_version", "server_pgid")})
        # RULER builds its documents with the model's tokenizer, at the lengths the task reports
        metadata = None
        if any(t.kind == "lm_eval" for t in tasks):
            metadata = {"pretrained": model_args.get("pretrained") or model_args.get("tokenizer")}
            lengths = [int(t.metric_key) for t in tasks if t.kind == "lm_eval" and str(t.metric_key).isdigit()]
            if lengths:
                metadata["max_seq_lengths"] = sorted(set(lengths))
        manager = TaskManager(include_path=str(work.run / "tasks"), include_defaults=False, metadata=metadata)
        lm = get_model(model_name).create_from_arg_obj(model_args)
        with progress("tasks") as bar:
            job = bar.add_task(f"suite {suite.name}", total=len(tasks))
            for task in tasks:
                bar.update(job, description=f"{suite.name}: {task.name}")
                with _task_context(task):
                    output = evaluate_task(lm, lm_names[task.name], manager, suite.seed, limit=req.limit,
                                           apply_chat_template=True,
                                           system_instruction=thinking.system_instruction(suite.system_prompt),
                                           bootstrap_iters=1000)
                record["tasks"][task.name] = _task_record(suite, task, lm_names[task.name], output, work.run, out)
                work.task_done(task.name, record["tasks"][task.name], record["judges"].get(task.name))
                trackers.log(output)
                bar.advance(job)


def _task_context(task: Task):
    """RULER reads the haystacks `data pull` kept; every other task needs nothing around it."""
    if task.kind == "lm_eval" and task.benchmark:
        return local_haystacks(benchmark_spec(task.benchmark)[0])
    return contextlib.nullcontext()


def _repoint(folder: Path, work: Path, out: Path) -> None:
    """The task configs name their data files by absolute path: point them at the final folder."""
    if not folder.is_dir():
        return
    old, new = str(work.resolve()), str(out.resolve())
    for config in folder.glob("*.yaml"):
        text = config.read_text(encoding="utf-8")
        if old in text:
            config.write_text(text.replace(old, new), encoding="utf-8")


def _skipped_record(suite: Suite, task: Task, why: dict) -> dict:
    """A task that did not run: no value (never 0.0), the reason and the command that fetches its data."""
    return {
        "status": "skipped",
        "metric": metric_name(suite, task),
        "value": None,
        "stderr": None,
        "k": suite.k(task) if task.kind == "rufus" else 1,
        "docs": 0,
        "role": task.role,
        "kind": task.kind,
        "reason": why["reason"],
        "fetch": why["fetch"],
    }


def unclosed_fraction(samples: list[dict], think_end_token: str) -> float | None:
    """The fraction of generated responses whose reasoning never closed (None: nothing was generated)."""
    texts = [r for s in samples for resp in s.get("resps", []) for r in (resp if isinstance(resp, list) else [resp])
             if isinstance(r, str)]
    if not texts:
        return None
    return sum(not answer_of(t, think_end_token).closed for t in texts) / len(texts)


def _task_record(suite: Suite, task: Task, lm_name: str, output: dict, work: Path, out: Path) -> dict:
    """Save lm-eval's results and samples for the task; pull out the headline number."""
    results = output["results"][lm_name]
    (work / "lm_eval" / f"results_{task.name}.json").write_text(
        json.dumps(redact({k: v for k, v in output.items() if k != "samples"}), indent=2, default=handle_non_serializable)
    )
    # a native lm-eval group (global_mmlu_en, ruler) logs samples under its subtasks
    samples = [s for name in sorted(output["samples"]) for s in output["samples"][name]]
    with open(work / "lm_eval" / f"samples_{task.name}.jsonl", "w") as fh:
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
    unclosed = results.get(f"unclosed_think,{filter_key}") if task.kind == "rufus" else \
        unclosed_fraction(samples, suite.think_end_token)
    also = None
    if task.kind == "rufus" and task.also_scored_by is not None:  # the same answers under a second reward
        also_value = results.get(f"also_{name},{filter_key}")
        also = {"scorer": task.also_scored_by.spec, "metric": name,
                "value": float(also_value) if isinstance(also_value, (int, float)) else None}
    return {
        "status": "ran",
        "metric": name,
        "value": float(value) if isinstance(value, (int, float)) else None,
        "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
        "k": suite.k(task) if task.kind == "rufus" else 1,
        "docs": len(samples),
        "scored_docs": sum(name in s for s in samples),
        "unscored": unscored,
        "unclosed_think": unclosed,
        "role": task.role,
        "kind": task.kind,
        "filter": filter_key,  # which lines of the samples file hold the number (documents.py)
        "samples_file": str(out / "lm_eval" / f"samples_{task.name}.jsonl"),
        **({"also": also} if also else {}),
    }
