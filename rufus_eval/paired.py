"""`rufus-eval compare A B`: two runs over the same documents, task by task: each run's score with
its standard error, the paired difference B - A with its standard error, a verdict (beyond two
standard errors or not), and pass@k for k = 1, 2, 4, ... up to the samples taken.

The difference is paired: the mean and standard error of the per-document differences
(stats.paired_difference), which is what tells a gain from noise when both runs saw the same
documents. Runs over other documents (another --limit, another suite version) are refused, with
how many documents they share. The checkpoint evaluation's curve reports each step against its
baseline with the same rows (`paired_rows(..., pass_at=False)`)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from rufus_data.base.console import console, print_result
from rufus_data.base.errors import RufusError
from rufus_eval.data_check import check_of
from rufus_eval.documents import pass_counts, run_folder, task_documents
from rufus_eval.stats import beyond_noise, mean_and_se, paired_difference, pass_at_k, pass_at_ks

SIGMAS = 2.0


def paired_rows(a_path: str | Path, a: dict, b_path: str | Path, b: dict, pass_at: bool = True) -> list[dict]:
    """One row per task of either run: scores, the paired delta, the verdict and pass@k (empty
    dicts when `pass_at` is off or the task cannot be re-scored); refused when a task that ran in
    both holds other documents in each."""
    folders = run_folder(a_path), run_folder(b_path)
    tasks = list(dict.fromkeys([*a["tasks"], *b["tasks"]]))
    rows, documents, mismatched = [], {}, []
    for task in tasks:  # every task's documents first: runs over other documents are refused before any re-scoring
        ta, tb = a["tasks"].get(task), b["tasks"].get(task)
        metrics = list(dict.fromkeys(t["metric"] for t in (ta, tb) if t is not None))  # avg@4 vs avg@8: said
        rows.append({"task": task, "metric": " vs ".join(metrics), "a_run": a["run"], "b_run": b["run"]})
        ran = [t is not None and t.get("status", "ran") == "ran" for t in (ta, tb)]
        if not all(ran):
            why = " and ".join(f"{'not in' if t is None else 'skipped in'} {r['run']}"
                               for t, r, ok in zip((ta, tb), (a, b), ran) if not ok)
            rows[-1]["verdict"] = f"no comparison: {why}"
            continue
        docs = documents[task] = task_documents(folders[0], a, task), task_documents(folders[1], b, task)
        if set(docs[0].scores) != set(docs[1].scores):
            shared = len(set(docs[0].scores) & set(docs[1].scores))
            mismatched.append(f"{task}: {a['run']} has {len(docs[0].scores)} documents, {b['run']} has "
                              f"{len(docs[1].scores)}, {shared} shared")
    if mismatched:
        raise RufusError("the runs were not scored on the same documents, so no paired difference exists: "
                         + "; ".join(mismatched) + ". Compare runs of one suite with the same --limit (and data)")
    for row in rows:
        if row["task"] not in documents:
            continue
        docs = documents[row["task"]]
        row.update(_scored_row(*docs))
        for side, record in zip("ab", (a, b)):  # the training data never checked against the task's benchmark
            check = check_of(record["tasks"][row["task"]])
            row[f"{side}_not_checked"] = bool(check is not None and check.flagged)
        if pass_at:
            for side, folder, record, side_docs in zip("ab", folders, (a, b), docs):
                row[f"{side}_pass_at_k"], why = pass_at_k_row(folder, side_docs, record["tasks"][row["task"]].get("k") or 1)
                if why:
                    row["pass_at_k_note"] = why
    return rows


def _scored_row(docs_a, docs_b) -> dict:
    """Scores, standard errors and the paired delta over the documents both runs scored."""
    both = [key for key in docs_a.scores if docs_a.scores[key] is not None and docs_b.scores[key] is not None]
    row: dict = {"docs": len(docs_a.scores), "paired_docs": len(both)}
    if not both:
        return {**row, "verdict": "no document scored in both runs"}
    xs, ys = [docs_a.scores[k] for k in both], [docs_b.scores[k] for k in both]
    (row["a_value"], row["a_se"]), (row["b_value"], row["b_se"]) = mean_and_se(xs), mean_and_se(ys)
    row["delta"], row["delta_se"] = paired_difference(xs, ys)
    row["verdict"] = verdict(row["delta"], row["delta_se"], len(both))
    return row


def verdict(delta: float, se: float, n: int) -> str:
    beyond = beyond_noise(delta, se, SIGMAS)
    if beyond is None:
        return f"{n} document: no standard error, no verdict"
    if not beyond:
        return f"no difference shown (|delta| <= {SIGMAS:g} SE)"
    return f"B {'higher' if delta > 0 else 'lower'} (beyond {SIGMAS:g} SE)"


def pass_at_k_row(folder: Path, docs, samples: int) -> tuple[dict[str, float], str]:
    """{"pass@1": ..., "pass@2": ...} over the documents with at least k scored samples, and why not."""
    counts, why = pass_counts(folder, docs)
    if counts is None:
        return {}, why
    out = {}
    for k in pass_at_ks(samples):
        values = [pass_at_k(n, c, k) for n, c in counts.values() if n >= k]
        if values:
            out[f"pass@{k}"] = sum(values) / len(values)
    return out, ""


def number_text(value: float | None, se: float | None = None, signed: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:+.4f}" if signed else f"{value:.4f}"
    return text if se is None else text + (" ± n/a" if math.isnan(se) else f" ± {se:.4f}")


def score_cell(row: dict, side: str) -> Text:
    """A run's score ± SE, with NOT CHECKED under it when its training data was never checked against the benchmark."""
    text = Text(number_text(row.get(f"{side}_value"), row.get(f"{side}_se")))
    if row.get(f"{side}_not_checked"):
        text.append("\nNOT CHECKED", style="bold red")
    return text


def pass_text(values: dict | None) -> str:
    return "  ".join(f"{k}={v:.3f}" for k, v in (values or {}).items()) or "-"


FLAT_COLUMNS = ("task", "metric", "docs", "paired_docs", "a_run", "a_value", "a_se", "a_not_checked", "b_run",
                "b_value", "b_se", "b_not_checked", "delta", "delta_se", "verdict")


def flat_rows(rows: list[dict]) -> tuple[list[str], list[tuple]]:
    """The rows as CSV columns: pass@k of each run as a_pass@1, b_pass@1, ..."""
    ks = list(dict.fromkeys(k for r in rows for side in "ab" for k in r.get(f"{side}_pass_at_k", {})))
    columns = [*FLAT_COLUMNS, *(f"{side}_{k}" for side in "ab" for k in ks)]
    out = [tuple(r.get(c) for c in FLAT_COLUMNS) + tuple(r.get(f"{side}_pass_at_k", {}).get(k)
                                                          for side in "ab" for k in ks) for r in rows]
    return columns, out


def print_paired(rows: list[dict], a: dict, b: dict, fmt: str = "table") -> None:
    """The rows as a table (stdout), or CSV / JSON for files and pipes; notes on stderr."""
    if fmt != "table":
        from rufus_data.base.console import rows_as_text

        text = json.dumps(rows, indent=2, default=str) + "\n" if fmt == "json" else rows_as_text(*flat_rows(rows), fmt)
        sys.stdout.write(text)
    else:
        table = Table(title=f"A = {a['run']} (step {a.get('step')})  vs  B = {b['run']} (step {b.get('step')})")
        for col in ("task", "metric", "docs", "A", "B", "B - A (paired)", "verdict", "pass@k A", "pass@k B"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["task"], r["metric"], str(r.get("docs", "-")),
                          score_cell(r, "a"), score_cell(r, "b"),
                          number_text(r.get("delta"), r.get("delta_se"), signed=True), r["verdict"],
                          pass_text(r.get("a_pass_at_k")), pass_text(r.get("b_pass_at_k")))
        print_result(table)
    for r in rows:
        if r.get("paired_docs") is not None and r["paired_docs"] < r["docs"]:
            console.print(f"{r['task']}: {r['docs'] - r['paired_docs']} of {r['docs']} documents have no score in one "
                          "run (none of their samples could be scored): left out of the pairs", highlight=False,
                          markup=False, soft_wrap=True)
        if r.get("pass_at_k_note"):
            console.print(f"{r['task']}: no pass@k: {r['pass_at_k_note']}", highlight=False, markup=False,
                          soft_wrap=True)
