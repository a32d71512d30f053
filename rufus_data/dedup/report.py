"""What dedup reports: the result, clusters.parquet's schema, each source's share of the train
tokens before and after, the summary table and report.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from rufus_data.base.catalog_files import docs_page
from rufus_data.base.report import markdown_table
from rufus_data.dedup.config import DedupConfig
from rufus_data.folders.output_step import StepResult

if TYPE_CHECKING:
    from rufus_data.dedup.semantic import SemanticPair

CLUSTER_SCHEMA = pa.schema([
    ("kept_id", pa.string()), ("kept_row", pa.int64()), ("duplicate_id", pa.string()), ("duplicate_row", pa.int64()),
    ("jaccard", pa.float64()), ("kept_split", pa.string()), ("duplicate_split", pa.string()),
    ("method", pa.string()),  # the stage that dropped the row: minhash or semantic
    ("similarity", pa.float64()), ("word_share", pa.float64()), ("shared_quantities", pa.int64()),  # semantic only
    ("measure", pa.string()), ("value", pa.float64()),  # what decided the drop: containment / jaccard / cosine, its value
])
MEASURE_TEXT = {"containment": "containment of a row's own word shingles in the other row",
                "jaccard": "Jaccard of word shingle sets"}
SHARE_SHIFT_PP = 1.0  # a source whose token share moves more than this (percentage points) is warned about


@dataclass(kw_only=True)
class DedupResult(StepResult):
    """A dedup run: the StepResult (counts: rows in, out, dropped, clusters) and what it found."""

    rows_in: int
    rows_out: int
    clusters: pa.Table  # per dropped row: the kept row it duplicates, their Jaccard, the stage (CLUSTER_SCHEMA)
    dropped: np.ndarray  # global row numbers, sorted
    seconds: float = 0.0
    shares: list[dict] = field(default_factory=list)  # per source: train token share before and after
    warnings: list[str] = field(default_factory=list)
    nothing_removed: str | None = None  # why no row was dropped, measured (None: some were)
    semantic_pairs: list[SemanticPair] = field(default_factory=list)  # what the semantic stage found (with --semantic)

    @property
    def n_clusters(self) -> int:
        return len(pc.unique(self.clusters.column("kept_row")))


def source_tokens(table: pa.Table, column: str) -> dict[str, int]:
    """Each source's tokens in these rows (`column`; one a row where the rows have no such column)."""
    n = table.num_rows
    sources = (pc.cast(table.column("source"), pa.large_string()).fill_null("None") if "source" in table.column_names
               else pa.array(["?"] * n, pa.large_string()))
    tokens = (pc.cast(table.column(column), pa.int64()).fill_null(0) if column in table.column_names
              else pa.array(np.ones(n, np.int64)))
    sums = pa.table({"source": sources, "tokens": tokens}).group_by("source").aggregate([("tokens", "sum")])
    return dict(zip(sums.column("source").to_pylist(), sums.column("tokens_sum").to_pylist()))


def share_shifts(before: dict[str, int], after: dict[str, int], unit: str) -> tuple[list[dict], list[str]]:
    """Each source's share of the train tokens before and after dropping, and a warning for each
    that moved more than SHARE_SHIFT_PP points."""
    total_before, total_after = sum(before.values()) or 1, sum(after.values()) or 1
    shares, warnings = [], []
    for source in sorted(before):
        old, new = before[source] / total_before, after.get(source, 0) / total_after
        shift = 100 * (new - old)
        shares.append({"source": source, "before": round(old, 6), "after": round(new, 6), "shift_pp": round(shift, 4),
                       "unit": unit})
        if abs(shift) > SHARE_SHIFT_PP:
            warnings.append(f"dedup moved source {source!r} from {old:.1%} to {new:.1%} of the train {unit} "
                            f"({shift:+.1f} pp): the near duplicates were not spread evenly over the sources, so the "
                            "mix no longer has its token shares. Dedup belongs before mixing: dedup each source, then "
                            f"mix ({docs_page('data.md')})")
    return shares, warnings


def summary_table(result: DedupResult) -> Table:
    table = Table(title="dedup")
    for col in ("rows in", "rows out", "dropped", "clusters", "rows/s"):
        table.add_column(col, justify="right")
    table.add_row(f"{result.rows_in:,}", f"{result.rows_out:,}", f"{len(result.dropped):,}", f"{result.n_clusters:,}",
                  f"{result.rows_in / max(result.seconds, 1e-9):,.0f}")
    return table


def dedup_report(result: DedupResult, config: DedupConfig) -> str:
    """The text of report.md: the counts and the largest clusters."""
    clusters = result.clusters
    by_stage = dict(zip(*(c.to_pylist() for c in pc.value_counts(clusters.column("method")).flatten())))
    n_clusters = len(pc.unique(clusters.column("kept_id")))
    semantic = (f"; with --semantic, rows that restate an earlier row in other words (cosine >= {config.semantic_min_cosine} "
                "and the same quantities, rufus_data/dedup/semantic.py)") if config.semantic else ""
    lines = ["# dedup report", "",
             (f"{result.rows_in:,} rows in, **{len(result.dropped):,} near duplicates dropped**, {result.rows_out:,} kept, "
              f"in {n_clusters:,} clusters ({MEASURE_TEXT[config.measure]} >= {config.threshold}"
              f"{', holding the same numbers' if config.numbers_must_match else ''}{semantic}; "
              "rows linked by such pairs are one cluster; it keeps a train row before a holdout row, then of the rows "
              "with the fewest shingles of their own (give or take one) the first in input order, and drops the rows that are "
              "duplicates of that row)."), "",
             "## Rows dropped, by stage", "", markdown_table(["stage", "rows dropped"], [
                 [stage, f"{by_stage.get(stage, 0):,}"] for stage in ("minhash", *(("semantic",) if config.semantic else ()))]), ""]
    if result.semantic_pairs:
        lines += ["Examples (semantic):", ""]
        for pair in result.semantic_pairs[:10]:
            lines.append(f"- cos {pair.similarity:.3f}, {pair.quantities} quantities shared, word Jaccard {pair.word_share:.2f} "
                         f"({', '.join(pair.shared_words[:4])})\n  kept: {pair.kept_text!r}\n  dropped: {pair.duplicate_text!r}")
        lines.append("")
    lines += ["## Largest clusters", "", "| kept row id | duplicates | their ids (the measure's value, or cosine) |", "| --- | ---: | --- |"]
    for kept, dups in _largest_clusters(clusters, 30):
        lines.append(f"| {kept} | {len(dups)} | " + ", ".join(f"{d} ({score})" for d, score in dups[:5]) + " |")
    lines += ["", "clusters.parquet lists every dropped row with the kept row it duplicates, the stage (`method`) that dropped it and the measure and value that decided it.", ""]
    if result.shares:
        lines += ["## Token shares per source (train)", "",
                  markdown_table(["source", "before", "after", "change (pp)"],
                                 [[s["source"], f"{s['before']:.4f}", f"{s['after']:.4f}", f"{s['shift_pp']:+.2f}"]
                                  for s in result.shares]),
                  *(f"- **warning:** {w}" for w in result.warnings or
                    [f"every source is within {SHARE_SHIFT_PP:g} pp of its share before dedup"]), ""]
    return "\n".join(lines)


def _largest_clusters(clusters: pa.Table, top: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """The `top` clusters with the most dropped rows (then by kept id), each with its dropped rows
    in input order: counted in Arrow, so only those clusters become Python objects."""
    if not clusters.num_rows:
        return []
    counts = clusters.group_by("kept_id").aggregate([("duplicate_row", "count")])
    largest = counts.sort_by([("duplicate_row_count", "descending"), ("kept_id", "ascending")]).slice(0, top)
    kept_ids = largest.column("kept_id").to_pylist()
    rows = clusters.filter(pc.is_in(clusters.column("kept_id"), pa.array(kept_ids, pa.string())))
    groups: dict[str, list[tuple[str, str]]] = {k: [] for k in kept_ids}
    for pair in rows.to_pylist():
        score = f"{pair['measure']} {pair['value']:.2f}"
        groups[pair["kept_id"]].append((pair["duplicate_id"], score))
    return list(groups.items())
