"""What decontam tells a person: the result of a run, the summary table printed at the end, and
report.md (rows flagged per source x benchmark and per split, what was skipped, the first hits)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from rich.table import Table

from rufus_data.decontam.config import DecontamConfig


@dataclass
class DecontamResult:
    hits: pa.Table  # rules.HIT_SCHEMA plus `split`
    rows_in: int
    rows_out: int
    flagged_rows: set[int]
    missing: dict[str, str]
    benchmarks: dict[str, dict]
    boilerplate_train_grams: list[str]
    index_stats: dict
    seconds: float
    out: Path | None = None
    not_decontaminable: dict[str, str] = field(default_factory=dict)  # suite/task -> why (--against-suite)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> {"rows", "flagged"}


def source_benchmark_counts(result: DecontamResult) -> dict[tuple[str, str], set[int]]:
    """(source, benchmark) -> the flagged rows."""
    counts: dict[tuple[str, str], set[int]] = defaultdict(set)
    for src, bench, row in zip(*(result.hits.column(c).to_pylist() for c in ("source", "benchmark", "row"))):
        counts[(src, bench)].add(row)
    return counts


def summary_table(result: DecontamResult) -> Table:
    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts}) or ["-"]
    table = Table(title=f"decontam: {len(result.flagged_rows):,} of {result.rows_in:,} rows flagged "
                        f"({result.rows_in / max(result.seconds, 1e-9):,.0f} rows/s)")
    table.add_column("source")
    for b in benches:
        table.add_column(b, justify="right")
    for src in sorted({s for s, _ in counts}):
        table.add_row(src or "-", *(str(len(counts.get((src, b), ()))) for b in benches))
    return table


def render_report(result: DecontamResult, against: list[str], config: DecontamConfig) -> str:
    counts = source_benchmark_counts(result)
    benches = sorted({b for _, b in counts})
    methods = defaultdict(int)
    for m in result.hits.column("method").to_pylist():
        methods[m] += 1
    lines = [
        "# decontam report", "",
        (f"Checked {result.rows_in:,} rows against {', '.join(against)} "
         f"({result.index_stats['eval_items']:,} eval items from {', '.join(result.benchmarks)})."),
        (f"**{len(result.flagged_rows):,} rows flagged and dropped** ({len(result.flagged_rows) / max(1, result.rows_in):.2%}); "
         f"{result.rows_out:,} rows kept. Hits: {result.hits.num_rows:,} "
         f"(exact {methods['exact']:,}, minhash {methods['minhash']:,})."), "",
        (f"Settings: n={config.ngram}-word grams, MinHash over {config.shingle}-word shingles with {config.num_perm} "
         f"permutations, containment >= {config.containment}, windows of {config.window} shingles."), "",
        "## Rows flagged, by source x benchmark", "",
    ]
    if benches:
        lines += ["| source | " + " | ".join(benches) + " |", "| --- |" + " ---: |" * len(benches)]
        for src in sorted({s for s, _ in counts}):
            lines.append(f"| {src or '-'} | " + " | ".join(str(len(counts.get((src, b), ()))) for b in benches) + " |")
    else:
        lines.append("No hits.")
    if len(result.splits) > 1:
        lines += ["", "## Rows flagged, by split", "", "| split | rows | flagged |", "| --- | ---: | ---: |"]
        lines += [f"| {split} | {n['rows']:,} | {n['flagged']:,} |" for split, n in result.splits.items()]
    if result.missing:
        lines += ["", "## Benchmarks skipped (--skip-missing)", ""]
        lines += [f"- `{name}`: {why}" for name, why in result.missing.items()]
    if result.not_decontaminable:
        lines += ["", "## Suite tasks not checked (no problem text in the registry)", ""]
        lines += [f"- `{task}`: {why}" for task, why in result.not_decontaminable.items()]
    if result.boilerplate_train_grams:
        lines += ["", "## n-grams ignored as training-side boilerplate", ""]
        lines += [f"- `{g}`" for g in result.boilerplate_train_grams[:30]]
    lines += ["", "## First hits", "", "| row id | benchmark | item | method | containment | field | matched |",
              "| --- | --- | --- | --- | ---: | --- | --- |"]
    for hit in result.hits.slice(0, 30).to_pylist():
        grams = "; ".join(hit["matched_ngrams"][:2]).replace("|", "\\|")
        lines.append(f"| {hit['row_id']} | {hit['benchmark']} | {hit['eval_item_id']} | {hit['method']} | "
                     f"{hit['containment']:.2f} | {', '.join(hit['fields'][:2])} | {grams[:120]} |")
    lines += ["", ("contaminated.parquet holds every hit (one row per training row x eval item); "
                   "docs/decontam.md explains the columns and the thresholds."), ""]
    return "\n".join(lines)
