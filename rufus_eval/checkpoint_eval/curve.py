"""The checkpoint evaluation's results, as one curve: each finished evaluation's `results.json`
becomes a point of `eval/<task>` on the `eval/step` axis, with `train/global_step` = the step,
logged into the training log (`state.log_history`), `<output_dir>/eval_logs/metrics.jsonl` and the
trackers (trackers.py). Each step after the step-0 baseline also gets its paired delta against
it on the same documents (`eval/<task>/delta`, `eval/<task>/delta_se`: paired.py, as `rufus-eval
compare` computes it), and the end of training prints the curve as a table (`report`).

The process supervisor's thread queues a result when its evaluation ends; the trainer's thread
logs it (`drain`): trackers and log_history are not thread-safe. A resumed run keeps the curve up
to its step (`resume`)."""

from __future__ import annotations

import json
import queue
from pathlib import Path

from rich.table import Table

from rufus_data.base.console import console, print_whole
from rufus_data.base.errors import RufusError
from rufus_data.base.paths import atomic_file
from rufus_data.folders.run_folder import EVAL_LOG, EVAL_LOGS, METRICS, RESULTS_JSON, eval_step_dirs
from rufus_eval.checkpoint_eval.trackers import Trackers
from rufus_eval.paired import number_text, paired_rows, verdict


class EvalCurve:
    """The eval/step curve of one training run."""

    def __init__(self, trackers: Trackers):
        self.trackers = trackers
        self.finished: queue.Queue = queue.Queue()  # (step, results record), from the supervisor's thread
        self.logged: list[dict] = []
        self.metrics_file: Path | None = None
        self.folders: dict[int, Path] = {}  # step -> its finished evaluation's run folder
        self.paired: dict[int, list[dict]] = {}  # step -> its paired rows against step 0
        self.reported = 0  # entries in the last report

    def open(self, output_dir: str | Path) -> None:
        self.metrics_file = Path(output_dir) / EVAL_LOGS / METRICS
        self.metrics_file.parent.mkdir(parents=True, exist_ok=True)

    def evaluation_ended(self, step: int, out: Path, code: int | None) -> None:
        """Queue the results of a finished evaluation, or say why there are none (the log's tail)."""
        if code == 0 and (out / RESULTS_JSON).exists():
            self.folders[step] = out
            self.finished.put((step, json.loads((out / RESULTS_JSON).read_text())))
            return
        log = out / EVAL_LOG
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        console.print(f"[red]eval:[/] evaluation of step {step} failed (exit {code}); log {log}:\n{tail}")

    def drain(self, state) -> None:
        """Log the finished evaluations (the trainer's thread only)."""
        while True:
            try:
                step, record = self.finished.get_nowait()
            except queue.Empty:
                return
            entry = {f"eval/{task}": t["value"] for task, t in record["tasks"].items() if t["value"] is not None}
            for row in self._against_baseline(step, record):
                entry[f"eval/{row['task']}/delta"], entry[f"eval/{row['task']}/delta_se"] = row["delta"], row["delta_se"]
            entry.update({"eval/step": step, "train/global_step": step})
            self.logged.append(entry)
            state.log_history.append({**entry, "step": state.global_step})
            self.trackers.log(entry)
            scores = ", ".join(f"{k.removeprefix('eval/')}={v:.4f}" for k, v in entry.items()
                               if k.startswith("eval/") and k != "eval/step" and not k.endswith("_se"))
            console.print(f"eval: step {step}: {scores}")
            if self.metrics_file is not None:
                with open(self.metrics_file, "a") as fh:
                    fh.write(json.dumps(entry) + "\n")

    def resume(self, output_dir: str | Path, step: int) -> None:
        """A run resumed at `step`: metrics.jsonl keeps the evaluations up to it and drops those
        after it (the run reaches and evaluates those steps again); an evaluation up to `step`
        that the stopped job finished but never logged is queued now."""
        logged = self._keep_up_to(step)
        for done, folder in eval_step_dirs(output_dir):
            if not (done <= step and (folder / RESULTS_JSON).exists()):
                continue
            self.folders[done] = folder
            if done not in logged:
                self.finished.put((done, json.loads((folder / RESULTS_JSON).read_text())))

    def _keep_up_to(self, step: int) -> set[int]:
        """Drop the metrics.jsonl lines of steps after `step`; the steps of the lines kept."""
        if self.metrics_file is None or not self.metrics_file.exists():
            return set()
        entries = [json.loads(line) for line in self.metrics_file.read_text().splitlines() if line.strip()]
        kept = [entry for entry in entries if entry.get("eval/step", 0) <= step]
        if len(kept) < len(entries):
            with atomic_file(self.metrics_file) as tmp:
                tmp.write_text("".join(json.dumps(entry) + "\n" for entry in kept))
        return {entry["eval/step"] for entry in kept if "eval/step" in entry}

    def _against_baseline(self, step: int, record: dict) -> list[dict]:
        """The paired rows of `step` against step 0 (the tasks with a delta), kept for the report;
        none without a baseline, and a note when the two cannot be paired."""
        base = self.folders.get(0)
        if step == 0 or base is None or step not in self.folders:
            return []
        try:
            rows = paired_rows(base, json.loads((base / RESULTS_JSON).read_text()), self.folders[step], record,
                               pass_at=False)
        except (RufusError, OSError, ValueError, KeyError) as err:
            console.print(f"eval: step {step}: no paired delta against step 0 ({err})", highlight=False, markup=False,
                          soft_wrap=True)
            return []
        self.paired[step] = [row for row in rows if row.get("delta") is not None]
        return self.paired[step]

    def report(self) -> None:
        """The curve as a table: each step's score per task and, after step 0, its paired delta against it."""
        if len(self.logged) in (0, self.reported):  # nothing new since the last report (_finish runs twice)
            return
        self.reported = len(self.logged)
        tasks = list(dict.fromkeys(k.removeprefix("eval/") for e in self.logged for k in e
                                   if k.startswith("eval/") and k.count("/") == 1 and k != "eval/step"))
        table = Table(title="checkpoint evaluation: score, and B - A against step 0 (paired, ± SE)")
        table.add_column("step")
        for task in tasks:
            table.add_column(task)
        for entry in sorted(self.logged, key=lambda e: e["eval/step"]):
            rows = {r["task"]: r for r in self.paired.get(entry["eval/step"], [])}
            cells = []
            for task in tasks:
                value, row = entry.get(f"eval/{task}"), rows.get(task)
                text = "-" if value is None else f"{value:.4f}"
                if row is not None:
                    text += (f"\n{number_text(row['delta'], row['delta_se'], signed=True)}"
                             f"\n{verdict(row['delta'], row['delta_se'], row['paired_docs'])}")
                cells.append(text)
            table.add_row(str(entry["eval/step"]), *cells)
        print_whole(console, table)  # a training log is often a file: whole cells there
