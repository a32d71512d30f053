"""`rufus-data dedup`: the MinHash machinery of decontam turned inward. Near-duplicate rows
inside one mix skew token shares as surely as a bad catalog, so each cluster of near
duplicates keeps only its first row (input order: shard by shard, row by row) and the report
lists the clusters.

Every split of the folder is read, train first: a holdout row that duplicates a train row is
dropped from the holdout (it would measure memorisation, not generalisation).

A mix's own repeats (an upsampled source's copies of one row, which share an `origin_id`) are no
duplicates: every copy follows its first one, kept or dropped, and is never compared. Dedup
still moves token shares when the near duplicates sit unevenly in the sources, so the report
and manifest give each source's share of the train tokens before and after and warn when one
moves more than a percentage point: dedup belongs before mixing (dedup each source, then mix;
docs/data.md), and on a mix it is a check that says how far the shares moved.

Each row's text (all its text fields, normalised as in decontam) becomes a set of word
shingles; signatures come from datasketch's `MinHash.bulk` and are stored as `LeanMinHash`;
a datasketch `MinHashLSH` finds candidates among the rows kept so far, and a candidate counts
only if the exact Jaccard similarity of the two shingle sets reaches the threshold."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import MinHashLSH
from pydantic import Field
from rich.table import Table

from rufus_data.console import console, print_result, progress
from rufus_data.minhash_lsh import lean, signatures
from rufus_data.ngram_hash import TokenHasher, batch_gram_hashes, fold32, gram_hashes, tokenize_batch
from rufus_data.output_step import OutputStep
from rufus_data.report import markdown_table
from rufus_data.shards import ORIGIN_COLUMN, read_manifest, shard_row_counts, split_files
from rufus_data.text_fields import text_fields
from rufus_data.yaml_config import StrictModel

CLUSTER_SCHEMA = pa.schema([
    ("kept_id", pa.string()), ("kept_row", pa.int64()), ("duplicate_id", pa.string()), ("duplicate_row", pa.int64()),
    ("jaccard", pa.float64()), ("kept_split", pa.string()), ("duplicate_split", pa.string()),
])


class DedupConfig(StrictModel):
    """Every knob of dedup (settable with `rufus-data dedup --config FILE.yaml`)."""

    threshold: float = Field(0.8, gt=0, le=1, description="exact Jaccard of shingle sets to call two rows duplicates")
    shingle: int = Field(3, ge=1, description="word shingle length")
    num_perm: int = Field(128, ge=16)
    batch_rows: int = Field(5000, ge=1)
    seed: int = 1


SHARE_SHIFT_PP = 1.0  # a source whose token share moves more than this (percentage points) is warned about


@dataclass
class DedupResult:
    rows_in: int
    rows_out: int
    clusters: pa.Table  # kept row id, duplicate row id, jaccard
    dropped: set[int]
    seconds: float
    out: Path | None = None
    shares: list[dict] = field(default_factory=list)  # per source: train token share before and after
    warnings: list[str] = field(default_factory=list)


def _row_shingles(table: pa.Table, shingle: int, hasher: TokenHasher) -> list[np.ndarray]:
    """One sorted shingle set per row: all text fields of the row (fields are shingled apart)."""
    texts, row_of, _ = text_fields(table)
    sets: list[list[np.ndarray]] = [[] for _ in range(table.num_rows)]
    if texts:
        _, ids, offsets = tokenize_batch(texts, hasher)
        grams, owner = batch_gram_hashes(ids, offsets, shingle)
        shingles = fold32(grams)
        lengths = np.diff(offsets)
        for t in np.flatnonzero((lengths > 0) & (lengths < shingle)).tolist():
            piece = ids[offsets[t] : offsets[t + 1]]  # shorter than a shingle: one shingle of all its words
            sets[int(row_of[t])].append(fold32(gram_hashes(piece, len(piece))))
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(len(texts) + 1))
        for t in range(len(texts)):
            sets[int(row_of[t])].append(shingles[order[bounds[t]:bounds[t + 1]]])
    return [np.unique(np.concatenate(s)) if s else np.empty(0, np.uint32) for s in sets]


def deduplicate(shards: str | Path, out: str | Path | None = None, *, dry_run: bool = False, overwrite: bool = False,
                config: DedupConfig | None = None, show_progress: bool = True) -> DedupResult:
    """Drop near-duplicate rows (keep the first of each cluster); write clean shards + clusters.parquet."""
    config = config or DedupConfig()
    by_split = split_files(shards)
    files = [path for paths in by_split.values() for path in paths]
    step = OutputStep("rufus-data dedup", out, overwrite=overwrite, dry_run=dry_run)
    rows_in = sum(shard_row_counts(files))
    hasher = TokenHasher()
    # the LSH looks for candidates below the threshold, so pairs just above it are not missed;
    # the exact Jaccard re-check decides
    lsh = MinHashLSH(threshold=max(0.1, config.threshold - 0.15), num_perm=config.num_perm, weights=(0.3, 0.7))
    kept_sets: dict[int, np.ndarray] = {}
    kept_ids: dict[int, str] = {}
    kept_split: dict[int, str] = {}
    split_of = {path: split for split, paths in by_split.items() for path in paths}
    pairs: list[dict] = []
    dropped: set[int] = set()
    first_copy: dict[str, dict | None] = {}  # origin id -> the pair that dropped its first copy (None: kept)
    token_column = _token_column(shards)
    train_tokens: list[tuple[str, int]] = []  # (source, tokens) of every train row, in row order
    row = 0
    with progress("rows") as bar:
        job = bar.add_task("dedup", total=rows_in) if show_progress else None
        for path in files:
            table = pq.read_table(path)
            ids = table.column("id").to_pylist() if "id" in table.column_names else [str(row + i) for i in range(table.num_rows)]
            origins = table.column(ORIGIN_COLUMN).to_pylist() if ORIGIN_COLUMN in table.column_names else None
            if split_of[path] == "train":
                train_tokens += _row_tokens(table, token_column)
            for start in range(0, table.num_rows, config.batch_rows):
                part = table.slice(start, config.batch_rows)
                sets = _row_shingles(part, config.shingle, hasher)
                sigs = lean(signatures(sets, config.num_perm, config.seed))
                for j, (shingles, sig) in enumerate(zip(sets, sigs)):
                    global_row = row + start + j
                    origin = None if origins is None or origins[start + j] is None else str(origins[start + j])
                    if origin is not None and origin in first_copy:  # a mix's repeat: as its first copy
                        if first_copy[origin] is not None:
                            dropped.add(global_row)
                            pairs.append({**first_copy[origin], "duplicate_id": str(ids[start + j]),
                                          "duplicate_row": global_row, "duplicate_split": split_of[path]})
                        continue
                    best, best_score = None, 0.0
                    if len(shingles):
                        for other in lsh.query(sig):
                            ref = kept_sets[other]
                            inter = len(np.intersect1d(shingles, ref, assume_unique=True))
                            score = inter / (len(shingles) + len(ref) - inter)
                            if score >= config.threshold and (score > best_score or (score == best_score and other < best)):
                                best, best_score = other, score
                    if origin is not None:
                        first_copy[origin] = None
                    if best is not None:
                        dropped.add(global_row)
                        pairs.append({"kept_id": kept_ids[best], "kept_row": best, "duplicate_id": str(ids[start + j]),
                                      "duplicate_row": global_row, "jaccard": round(best_score, 4),
                                      "kept_split": kept_split[best], "duplicate_split": split_of[path]})
                        if origin is not None:
                            first_copy[origin] = pairs[-1]
                    elif len(shingles):
                        lsh.insert(global_row, sig, check_duplication=False)
                        kept_sets[global_row] = shingles
                        kept_ids[global_row] = str(ids[start + j])
                        kept_split[global_row] = split_of[path]
                if job is not None:
                    bar.advance(job, part.num_rows)
            row += table.num_rows
    clusters = pa.Table.from_pylist(pairs, schema=CLUSTER_SCHEMA)
    n_clusters = len(set(clusters.column("kept_row").to_pylist()))
    result = DedupResult(rows_in, rows_in - len(dropped), clusters, dropped, 0.0)
    result.shares, result.warnings = share_shifts(train_tokens, dropped, token_column)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    if not dry_run:
        step.write_without_rows(
            shards, files, rows_in, dropped, why=("clusters.parquet", clusters), config=config.model_dump(), versions=("datasketch",),
            report=dedup_report(result, config), counts={"clusters": n_clusters},
            splits={split: [p.name for p in paths] for split, paths in by_split.items()},
            shares=result.shares, share_warnings=result.warnings,
        )
        result.out = step.out
    result.seconds = step.seconds
    if show_progress:
        table = Table(title="dedup")
        for col in ("rows in", "rows out", "dropped", "clusters", "rows/s"):
            table.add_column(col, justify="right")
        table.add_row(f"{rows_in:,}", f"{result.rows_out:,}", f"{len(dropped):,}", f"{n_clusters:,}",
                      f"{rows_in / max(result.seconds, 1e-9):,.0f}")
        print_result(table)
    return result


def _token_column(folder: str | Path) -> str:
    """The column a mix's shares count (its manifest's `basis`), else num_tokens (rows are counted
    where the shards have no such column)."""
    basis = read_manifest(folder).get("basis")
    return "num_trainable_tokens" if basis == "trainable" else "num_tokens"


def _row_tokens(table: pa.Table, column: str | None) -> list[tuple[str, int]]:
    sources = table.column("source").to_pylist() if "source" in table.column_names else ["?"] * table.num_rows
    if column not in table.column_names:
        return [(str(s), 1) for s in sources]
    return [(str(s), int(t or 0)) for s, t in zip(sources, table.column(column).to_pylist(), strict=True)]


def share_shifts(train_tokens: list[tuple[str, int]], dropped: set[int], column: str) -> tuple[list[dict], list[str]]:
    """Each source's share of the train tokens (rows without a token column) before and after
    dropping, and a warning for each that moved more than SHARE_SHIFT_PP points."""
    before, after = Counter(), Counter()
    for index, (source, tokens) in enumerate(train_tokens):  # train rows come first in global row order
        before[source] += tokens
        if index not in dropped:
            after[source] += tokens
    total_before, total_after = sum(before.values()) or 1, sum(after.values()) or 1
    unit = column if train_tokens and column else "rows"
    shares, warnings = [], []
    for source in sorted(before):
        old, new = before[source] / total_before, after[source] / total_after
        shift = 100 * (new - old)
        shares.append({"source": source, "before": round(old, 6), "after": round(new, 6), "shift_pp": round(shift, 4),
                       "unit": unit})
        if abs(shift) > SHARE_SHIFT_PP:
            warnings.append(f"dedup moved source {source!r} from {old:.1%} to {new:.1%} of the train {unit} "
                            f"({shift:+.1f} pp): the near duplicates were not spread evenly over the sources, so the "
                            "mix no longer has its token shares. Dedup belongs before mixing: dedup each source, then "
                            "mix (docs/data.md)")
    return shares, warnings


def dedup_report(result: DedupResult, config: DedupConfig) -> str:
    """The text of report.md: the counts and the largest clusters."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for pair in result.clusters.to_pylist():
        groups.setdefault(pair["kept_id"], []).append((pair["duplicate_id"], pair["jaccard"]))
    lines = ["# dedup report", "",
             (f"{result.rows_in:,} rows in, **{len(result.dropped):,} near duplicates dropped**, {result.rows_out:,} kept, "
              f"in {len(groups):,} clusters (Jaccard of {config.shingle}-word shingle sets >= {config.threshold}; "
              "the first row of each cluster in input order is kept)."), "",
             "## Largest clusters", "", "| kept row id | duplicates | their ids (Jaccard) |", "| --- | ---: | --- |"]
    for kept, dups in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:30]:
        lines.append(f"| {kept} | {len(dups)} | " + ", ".join(f"{d} ({j:.2f})" for d, j in dups[:5]) + " |")
    lines += ["", "clusters.parquet lists every dropped row with the kept row it duplicates.", ""]
    if result.shares:
        lines += ["## Token shares per source (train)", "",
                  markdown_table(["source", "before", "after", "change (pp)"],
                                 [[s["source"], f"{s['before']:.4f}", f"{s['after']:.4f}", f"{s['shift_pp']:+.2f}"]
                                  for s in result.shares]),
                  *(f"- **warning:** {w}" for w in result.warnings or
                    [f"every source is within {SHARE_SHIFT_PP:g} pp of its share before dedup"]), ""]
    return "\n".join(lines)
