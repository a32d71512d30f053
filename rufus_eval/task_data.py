"""Where a suite task's rows come from, and what to do when they are not here.

A task names a registry benchmark (catalogs/benchmarks.yaml), read by rufus_data.benchmarks
(path -> local -> hub, converted; BFCL from the bfcl-eval wheel); a suite of your own may give
its data inline. Data that is not here (offline, gated, not pulled) raises `TaskDataMissing`: the
runner skips that task and names the command that fetches it,
`rufus-eval data pull SUITE --tasks TASK --to DIR`.

RULER (an lm-eval native task) fetches its haystacks while it runs; `local_haystacks` points
lm-eval's RULER readers at the copies `data pull` keeps under $RUFUS_DATA_ROOT."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from rufus_data.base.jsonl import read_jsonl
from rufus_data.benchmarks.registry import BenchmarkSpec, benchmark_spec
from rufus_data.benchmarks.rows import haystack_files, task_source_rows
from rufus_data.benchmarks.suite import Task
from rufus_data.models.hub import hub_unreachable, offline_mode
from rufus_data.sources.dataset_source import DatasetUnavailable


class TaskDataMissing(DatasetUnavailable):
    """A task's data is not here; `fetch` is the command that gets it."""

    def __init__(self, reason: str, fetch: str):
        super().__init__(reason)
        self.reason = reason
        self.fetch = fetch


def fetch_command(suite_name: str, task_name: str) -> str:
    target = "$RUFUS_DATA_ROOT" if os.environ.get("RUFUS_DATA_ROOT") else "DIR"
    return f"rufus-eval data pull {suite_name} --tasks {task_name} --to {target}"


def source_rows(task: Task, suite_name: str = "SUITE") -> tuple[list[dict], list[str]]:
    """(rows, their ids) of a Rufus task; TaskDataMissing (with the fetch command) when they are not here."""
    try:
        return task_source_rows(task)
    except DatasetUnavailable as err:
        fetch = fetch_command(suite_name, task.name) if task.benchmark else "give the task's `data:` a file that exists"
        raise TaskDataMissing(str(err), fetch) from None


# ---------------------------------------------------------------- lm-eval native tasks (RULER)


def check_native_ready(task: Task, suite_name: str = "SUITE") -> None:
    """TaskDataMissing when an lm-eval task cannot run here: its packages are missing, or it would
    download what is not here (a named lm-eval task reads its data from the hub; RULER its haystacks,
    unless `data pull` kept them). A task YAML of your own says itself where its data is."""
    if task.lm_eval_task == "ruler" or task.benchmark == "ruler":
        missing = [m for m in ("wonderwords", "nltk") if importlib.util.find_spec(m) is None]
        if missing:
            raise TaskDataMissing(f"task {task.name}: lm-eval's RULER needs the packages {', '.join(missing)}, "
                                  "which are not installed", "pip install 'lm_eval[ruler]'")
    if Path(task.lm_eval_task).suffix in (".yaml", ".yml"):
        return
    spec = benchmark_spec(task.benchmark)[0] if task.benchmark else None
    absent = sorted(set(spec.haystacks) - set(haystack_files(spec))) if spec and spec.haystacks else None
    if absent == []:
        return
    unreachable = "HF_HUB_OFFLINE is set" if offline_mode() else hub_unreachable()
    if unreachable:
        what = f"its haystacks {absent} are not under $RUFUS_DATA_ROOT and" if absent else "lm-eval downloads its data, which"
        fetch = fetch_command(suite_name, task.name) if absent else "run it where the hub is reachable"
        raise TaskDataMissing(f"task {task.name}: {what} cannot be downloaded here ({unreachable})", fetch)


@contextlib.contextmanager
def local_haystacks(spec: BenchmarkSpec) -> Iterator[None]:
    """While lm-eval builds RULER's documents, its readers of the essays (hub dataset) and of the
    SQuAD and HotpotQA files (URLs) read the local copies instead (lm-eval has no setting for it)."""
    files = haystack_files(spec)
    if not files:
        yield
        return
    # lm-eval's RULER modules: heavy (transformers, nltk, wonderwords), and only for a RULER run
    from lm_eval.tasks.ruler import niah_utils, prepare_niah, qa_utils

    by_url = {h.url: files[name] for name, h in spec.haystacks.items() if h.url and name in files}
    essays = files.get("essays")
    original_json, original_haystack = qa_utils.download_json, prepare_niah.get_haystack

    def download_json(url):
        return json.loads(by_url[url].read_text(encoding="utf-8")) if url in by_url else original_json(url)

    def get_haystack(type_haystack):
        if type_haystack != "essay" or essays is None:
            return original_haystack(type_haystack)
        text = " ".join(row["text"] for row in read_jsonl(essays, "RULER essays"))
        return re.sub(r"\s+", " ", text).split(" ")

    patched = [(qa_utils, "download_json", download_json), (prepare_niah, "get_haystack", get_haystack),
               (niah_utils, "get_haystack", get_haystack)]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patched]
    for module, attr, value in patched:
        setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
