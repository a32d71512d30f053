"""`rufus-data decontam`'s run: the eval index (cached), every split of the shard folder scanned
by every stage, the final rules, the optional judge, and the clean shards written with their
provenance (the package's __init__ maps the steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from rufus_data.base.console import progress
from rufus_data.base.engines import auto_workers
from rufus_data.base.errors import RufusError
from rufus_data.base.yaml_config import settings_model
from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam.config import DecontamConfig, check_judge
from rufus_data.decontam.engines import ScanTask, plan_scan, scan_local, scan_ray
from rufus_data.decontam.hits_page import HITS_PAGE, hits_page
from rufus_data.decontam.index import EvalIndex, cached_eval_index
from rufus_data.decontam.report import (
    DecontamResult,
    decontam_report,
    rows_removed_by_benchmark,
)
from rufus_data.decontam.rules import finalise
from rufus_data.decontam.semantic_judge import judge_candidates
from rufus_data.folders.output_step import OutputStep
from rufus_data.folders.shards import shard_row_counts, split_files
from rufus_data.sources.inputs import shard_folder


def decontam(inputs: str | Path, out: str | Path | None = None, settings: DecontamConfig | dict | str | Path | None = None,
             *, overwrite: bool = False, report_only: bool = False, show_progress: bool = False) -> DecontamResult:
    """Scan every split of a shard folder (`inputs`) against the benchmarks, sets and eval suites of
    `settings` (DecontamConfig, or a dict or YAML file of its fields: `against`, `against_suite`
    and every knob); write the clean shards and their provenance to `out`, unless `report_only`
    (every stage runs and the result is returned, nothing is written)."""
    config = settings_model(DecontamConfig, settings)
    check_judge(config)
    shards = shard_folder(inputs, "rufus-data decontam")
    by_split = split_files(shards)
    files = [path for paths in by_split.values() for path in paths]
    step = OutputStep("rufus-data decontam", out, overwrite=overwrite, report_only=report_only)
    shard_row_counts(files)  # an unreadable shard is refused before the benchmarks load
    loaded = load_benchmarks(config.against, config.benchmarks, config.skip_missing, config.against_suite)
    asked = [*config.against, *(f"suite:{s}" for s in config.against_suite)]
    if not loaded.items:
        raise RufusError(f"no eval items loaded for {' '.join(asked)} (missing: {', '.join(loaded.missing) or 'none'})")
    index = cached_eval_index(loaded, config)
    tasks, rows_in = plan_scan(files, config.batch_rows)
    cands = _scan(tasks, index, rows_in, config, show_progress)
    hits, boiler = finalise(cands, index, rows_in)
    verdicts = {}
    if config.judge_url:  # the judge reads the pairs that only the semantic stage found, then the rules run again
        verdicts = judge_candidates(cands, index, _flagged_by_text(hits, index))
        hits, boiler = finalise(cands, index, rows_in)
    hits, splits = _with_splits(hits, by_split, tasks)
    flagged = set(hits.column("row").to_pylist())
    result = DecontamResult(
        out=None, counts={"rows_in": rows_in, "rows_out": rows_in - len(flagged), "rows_dropped": len(flagged),
                          "hits": hits.num_rows},
        hits=hits, rows_in=rows_in, rows_out=rows_in - len(flagged), flagged_rows=flagged, missing=loaded.missing,
        benchmarks=loaded.sources, boilerplate_train_grams=boiler, index_stats=index.stats(),
        not_decontaminable=loaded.not_decontaminable, splits=splits, judge=verdicts)
    if not report_only:
        result.manifest = step.write_without_rows(
            shards, files, rows_in, flagged, why=("contaminated.parquet", hits), config=config.model_dump(mode="json"),
            versions=("datasketch", "pyarrow", "numpy", *(("wordllama", "sentence-transformers") if config.semantic else ())),
            report=decontam_report(result, asked, config), counts={"hits": hits.num_rows},
            pages={HITS_PAGE: hits_page(hits, files, index.items, config)},
            against=config.against, against_suites=loaded.suites, not_decontaminable=loaded.not_decontaminable,
            splits=splits, benchmarks=loaded.sources, skipped_benchmarks=loaded.missing, index=result.index_stats,
            rows_dropped_by_benchmark=rows_removed_by_benchmark(result),
            boilerplate_train_grams=boiler[:100], judge=verdicts,
        )
        result.out = step.out
    result.seconds = step.seconds
    return result


def _scan(tasks: list[ScanTask], index: EvalIndex, rows_in: int, config: DecontamConfig, show_progress: bool) -> list:
    """Every task through every stage, in processes or on Ray: the candidates, with a bar when asked."""
    workers = auto_workers(config.workers, rows_in, len(tasks))
    with progress("rows") as bar:
        job = bar.add_task("decontam", total=rows_in) if show_progress else None

        def done(task: ScanTask) -> None:
            if job is not None:
                bar.advance(job, task.rows)

        if config.engine == "ray":
            return scan_ray(tasks, index, done)
        return scan_local(tasks, index, workers, done)


def _flagged_by_text(hits: pa.Table, index: EvalIndex) -> set[tuple[int, int]]:
    """(row, item index) of the hits of the exact and MinHash stages."""
    item_of = {(it.benchmark, it.item_id): i for i, it in enumerate(index.items)}
    return {(row, item_of[(bench, item)])
            for row, bench, item, method in zip(*(hits.column(c).to_pylist() for c in ("row", "benchmark", "eval_item_id", "method")))
            if method != "semantic"}


def _with_splits(hits: pa.Table, by_split: dict[str, list[Path]], tasks: list[ScanTask]) -> tuple[pa.Table, dict]:
    """Name each hit's split (from its global row number) and count rows and flagged rows per split."""
    split_of = {str(path): split for split, paths in by_split.items() for path in paths}
    starts = np.asarray([t.first_row for t in tasks], dtype=np.int64)
    task_split = [split_of[t.path] for t in tasks]
    rows = hits.column("row").to_numpy()
    names = [task_split[i] for i in (np.searchsorted(starts, rows, side="right") - 1).tolist()]
    splits = {split: {"rows": 0, "flagged": 0} for split in by_split}
    for task in tasks:
        splits[split_of[task.path]]["rows"] += task.rows
    for _, name in set(zip(rows.tolist(), names)):  # rows, not hits: a row can hit several items
        splits[name]["flagged"] += 1
    return hits.append_column("split", pa.array(names, pa.string())), splits

