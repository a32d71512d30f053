"""`rufus-data dedup`'s run: the MinHash stages over every split of a shard folder, the optional
semantic stage, the share report, and the clean shards written without the dropped rows (the
package's __init__ maps the steps)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rufus_data.base.engines import RowGroupTask, auto_workers, plan_row_groups
from rufus_data.base.yaml_config import settings_model
from rufus_data.dedup.clusters import Drops
from rufus_data.dedup.config import RUN_ONLY, DedupConfig
from rufus_data.dedup.pipeline import MinHashOutcome, MinHashStages
from rufus_data.dedup.report import (
    CLUSTER_SCHEMA,
    DedupResult,
    dedup_report,
    share_shifts,
    source_tokens,
)
from rufus_data.dedup.rows import ids_at, rows_at, shard_copier, task_of
from rufus_data.dedup.work import remove_work, work_folder, work_key
from rufus_data.folders.output_step import OutputStep
from rufus_data.folders.shards import read_manifest, shard_row_counts, split_files
from rufus_data.similarity.ngram_hash import distinct
from rufus_data.sources.inputs import shard_folder

if TYPE_CHECKING:
    from rufus_data.dedup.semantic import SemanticPair

def dedup(inputs: str | Path, out: str | Path | None = None, settings: DedupConfig | dict | str | Path | None = None,
          *, overwrite: bool = False, report_only: bool = False, show_progress: bool = False) -> DedupResult:
    """Drop near-duplicate rows of a shard folder (`inputs`), keeping the first of each cluster;
    `settings`: DedupConfig, or a dict or YAML file of its fields. Writes the clean shards and
    clusters.parquet to `out`, unless `report_only` (every stage runs, nothing is written)."""
    config = settings_model(DedupConfig, settings)
    shards = shard_folder(inputs, "rufus-data dedup")
    by_split = split_files(shards)
    files = [path for paths in by_split.values() for path in paths]
    step = OutputStep("rufus-data dedup", out, overwrite=overwrite, report_only=report_only)
    counts = shard_row_counts(files)
    rows_in = sum(counts)
    tasks, _ = plan_row_groups(files, config.batch_rows)
    share_column = token_column(shards)
    train_paths = frozenset(str(p) for p in by_split["train"])
    workers = auto_workers(config.workers, rows_in, len(tasks))
    key = work_key(files, config.model_dump(exclude=RUN_ONLY))
    with work_folder(None if report_only else step.out, key) as folder:
        minhash = MinHashStages(config, tasks, rows_in, folder, train_paths, share_column, workers, show_progress).run()
        semantic: list[SemanticPair] = []
        clusters = _cluster_table(tasks, by_split, minhash.drops, config.measure)
        if config.semantic:
            semantic, drops, pair_of = _semantic(tasks, minhash, config)
            clusters = pa.concat_tables([clusters, _cluster_table(tasks, by_split, drops, "cosine", (semantic, pair_of))])
            clusters = clusters.sort_by("duplicate_row")
        dropped = clusters.column("duplicate_row").to_numpy()
        result = DedupResult(out=None, rows_in=rows_in, rows_out=rows_in - len(dropped), clusters=clusters,
                             dropped=dropped, semantic_pairs=semantic)
        result.counts = {"rows_in": rows_in, "rows_out": result.rows_out, "rows_dropped": len(dropped),
                         "clusters": result.n_clusters}
        result.shares, result.warnings = _shares(tasks, train_paths, minhash, dropped, share_column)
        result.nothing_removed = None if len(dropped) else _why_nothing_removed(minhash, rows_in, config)
        if not report_only:
            result.manifest = step.write_without_rows(
                shards, files, rows_in, dropped, why=("clusters.parquet", clusters), config=config.model_dump(),
                versions=("datasketch", "pyarrow", "numpy", *(("wordllama", "sentence-transformers") if config.semantic else ())),
                report=dedup_report(result, config), counts={"clusters": result.n_clusters},
                splits={split: [p.name for p in paths] for split, paths in by_split.items()},
                shares=result.shares, share_warnings=result.warnings,
                copy=shard_copier(counts, workers, config.engine),
            )
            result.out = step.out
            remove_work(folder)  # the output is in place: nothing left to resume
    result.seconds = step.seconds
    return result


def _semantic(tasks: list[RowGroupTask], minhash: MinHashOutcome, config: DedupConfig) -> tuple[list[SemanticPair], Drops, np.ndarray]:
    """The second stage over the rows MinHash kept (with words, no repeats): its pairs, the rows
    it drops (each duplicate and the repeats of it, which go with it) and the pair of each."""
    from rufus_data.dedup.semantic import semantic_stage  # heavy: the decontam package, the embedder

    compared = minhash.has_words.copy()
    compared[minhash.drops.rows] = False
    repeat_rows, repeat_first = minhash.repeats
    compared[repeat_rows] = False
    stage_rows, pairs = semantic_stage(tasks, compared, config)
    rows = stage_rows[np.asarray([p.duplicate for p in pairs], dtype=np.int64)]
    kept = stage_rows[np.asarray([p.kept for p in pairs], dtype=np.int64)]
    follows = np.isin(repeat_first, rows)
    order = np.argsort(rows)
    pair_of = np.concatenate((np.arange(len(pairs)), order[np.searchsorted(rows[order], repeat_first[follows])]))
    dropped = np.concatenate((rows, repeat_rows[follows]))
    unmeasured = np.full(len(dropped), np.nan)
    return pairs, Drops(dropped, kept[pair_of], unmeasured, unmeasured), pair_of


def _cluster_table(tasks: list[RowGroupTask], by_split: dict[str, list[Path]], drops: Drops, measure: str,
                   semantic: tuple[list[SemanticPair], np.ndarray] | None = None) -> pa.Table:
    """clusters.parquet's rows for these drops, by dropped row: MinHash's, or with `semantic`
    (its pairs, the pair of each dropped row) the semantic stage's."""
    method = "minhash" if semantic is None else "semantic"
    order = np.argsort(drops.rows, kind="stable")
    rows, kept = drops.rows[order], drops.kept[order]
    ids = ids_at(tasks, distinct(np.concatenate((rows, kept))))
    split_of = {str(p): split for split, paths in by_split.items() for p in paths}
    splits = np.asarray([split_of[t.path] for t in tasks], dtype=object)
    columns = {
        "kept_id": [ids[r] for r in kept.tolist()], "kept_row": kept, "duplicate_id": [ids[r] for r in rows.tolist()],
        "duplicate_row": rows, "jaccard": None, "kept_split": splits[task_of(tasks, kept)].tolist(),
        "duplicate_split": splits[task_of(tasks, rows)].tolist(), "method": [method] * len(rows),
        "similarity": None, "word_share": None, "shared_quantities": None, "measure": [measure] * len(rows), "value": None,
    }
    if semantic is None:
        columns["jaccard"] = np.round(drops.jaccard[order], 4)
        columns["value"] = np.round(drops.value[order], 4)
    else:
        pairs, pair_of = semantic
        chosen = [pairs[i] for i in pair_of[order].tolist()]
        columns["similarity"] = [p.similarity for p in chosen]
        columns["value"] = columns["similarity"]
        columns["word_share"] = [p.word_share for p in chosen]
        columns["shared_quantities"] = [p.quantities for p in chosen]
    return pa.table({f.name: pa.nulls(len(rows), f.type) if columns[f.name] is None else pa.array(columns[f.name], f.type)
                     for f in CLUSTER_SCHEMA}, schema=CLUSTER_SCHEMA)


def _why_nothing_removed(minhash: MinHashOutcome, rows_in: int, config: DedupConfig) -> str:
    """No row dropped: what the stages measured, so that 0 reads as a finding, not as success."""
    repeats = len(minhash.repeats[0])
    return (f"no row was removed: of {rows_in:,} rows ({repeats:,} of them the mix's repeats of a row, which go "
            f"with it), LSH put {minhash.candidate_rows:,} beside a similar row, and {minhash.verified_pairs:,} pairs met "
            f"{config.measure} >= {config.threshold:g} with the same numbers. At these settings the rows are "
            "distinct; for looser copies lower --threshold or add --semantic (reworded rows)")


def _shares(tasks: list[RowGroupTask], train_paths: frozenset[str], minhash: MinHashOutcome, dropped: np.ndarray,
            column: str) -> tuple[list[dict], list[str]]:
    """Each source's share of the train tokens before and after (the dropped train rows read again)."""
    before = minhash.train_tokens
    after = dict(before)
    train = np.asarray([t.path in train_paths for t in tasks])
    dropped_train = np.sort(dropped[train[task_of(tasks, dropped)]]) if len(dropped) else dropped
    for _, table in rows_at(tasks, dropped_train, ["source", column]):
        for source, count in source_tokens(table, column).items():
            after[source] -= count
    unit = column if minhash.token_column_seen else "rows"
    return share_shifts(before, after, unit) if before else ([], [])


def token_column(folder: str | Path) -> str:
    """The column a mix's shares count (its manifest's `basis`), else num_tokens (rows are counted
    where the shards have no such column)."""
    basis = read_manifest(folder).get("basis")
    return "num_trainable_tokens" if basis == "trainable" else "num_tokens"
